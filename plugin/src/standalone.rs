//! The wire check of the standalone `sticky-ipam`, behind another main
//! plugin (the reference macvlan or ipvlan). Those create the pod's
//! interface before they call their IPAM, so the addresses the IPAM cannot
//! prove free are probed from that interface, exactly as sticky-macvlan
//! probes from its own link, before the main plugin binds them.

use std::net::IpAddr;

use crate::cni::{CniEnv, CniError, CniResult};
use crate::commands::connect;
use crate::datapath::macvlan::{self, CreatedLink};
use crate::datapath::{Netlink, Ns};
use crate::netconf::ProbeConf;

/// Probes `ips` from `CNI_IFNAME` in `CNI_NETNS`; an answer is code 11.
pub fn confirm_on_wire(env: &CniEnv, probe: &ProbeConf, ips: &[IpAddr]) -> CniResult<()> {
    if ips.is_empty() || !probe.enabled() {
        return Ok(());
    }
    let mut nl = connect(Some(&env.netns))?;
    confirm_with(&mut nl, env, probe, ips)
}

fn confirm_with(
    nl: &mut dyn Netlink,
    env: &CniEnv,
    probe: &ProbeConf,
    ips: &[IpAddr],
) -> CniResult<()> {
    let link = nl
        .link_by_name(Ns::Pod, &env.ifname)
        .map_err(|e| CniError::datapath(e.to_string()))?
        .ok_or_else(|| {
            CniError::invalid_config(format!(
                "cannot confirm {} free on the wire: interface {:?} does not exist in the pod netns when sticky-ipam runs; use a main plugin that creates it before calling its IPAM (macvlan, ipvlan), or set \"probe\": {{\"riskDuplicateAddresses\": true}}",
                ips.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(", "),
                env.ifname
            ))
        })?;
    let created = CreatedLink {
        index: link.index,
        name: link.name.clone(),
        mac: link.mac,
    };
    macvlan::probe_addresses(nl, &created, ips, probe.spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::{code, Command};
    use crate::datapath::fake::FakeNetlink;

    fn env() -> CniEnv {
        CniEnv {
            command: Command::Add,
            container_id: "c1".into(),
            netns: "/run/netns/p1".into(),
            ifname: "net1".into(),
            args: String::new(),
            path: String::new(),
        }
    }

    #[test]
    fn probes_from_the_main_plugins_interface() {
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let probe = ProbeConf::default();
        let mut nl = FakeNetlink::new().with_device(Ns::Pod, "net1", 1500);
        confirm_with(&mut nl, &env(), &probe, &[ip]).unwrap();
        assert!(
            nl.calls.iter().any(|c| c.starts_with("probe_addresses")),
            "{:?}",
            nl.calls
        );
        nl.arp_owners
            .insert("10.0.0.2".parse().unwrap(), [2, 0, 0, 0, 0, 9]);
        let e = confirm_with(&mut nl, &env(), &probe, &[ip]).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(e.msg.contains("02:00:00:00:00:09"), "{}", e.msg);
        let mut empty = FakeNetlink::new();
        let e = confirm_with(&mut empty, &env(), &probe, &[ip]).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("riskDuplicateAddresses"), "{}", e.msg);
    }
}
