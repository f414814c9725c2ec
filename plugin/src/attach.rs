//! The attachment once its link exists: addresses the wire must confirm
//! are probed, the sticky MAC set, the link configured (L2 only, or the
//! IPAM's addresses and routes), the gateway checked, and the result built
//! in the caller's version. `commands::add` calls it and undoes everything
//! if it fails.

use std::net::IpAddr;

use serde_json::Value;

use crate::cni::{CniEnv, CniError, CniOutput, CniResult, Interface};
use crate::datapath::macvlan::{self, CreatedLink};
use crate::datapath::{Netlink, Ns};
use crate::netconf::NetConf;

/// What the setup needs to know of the ADD.
pub struct Attach<'a> {
    pub env: &'a CniEnv,
    pub conf: &'a NetConf,
    pub link: CreatedLink,
    /// No MAC came from the config, CNI_ARGS or runtimeConfig, so the
    /// sticky MAC (if configured) applies.
    pub no_mac_given: bool,
    pub prev: Option<CniOutput>,
}

/// `gatewayCheck`: three ARP requests 200 ms apart (0.6 s at most).
const GATEWAY_CHECK: crate::datapath::arp::ProbeSpec = crate::datapath::arp::ProbeSpec {
    count: 3,
    interval: std::time::Duration::from_millis(200),
};

/// The workload's MAC under `stickyMac`: derived from its first IPv4
/// address, else its first address.
fn sticky_mac_for(conf: &NetConf, allocated: &CniOutput) -> Option<crate::datapath::Mac> {
    let first = allocated
        .ips
        .iter()
        .map(|i| i.address.addr())
        .find(|a| a.is_ipv4())
        .or_else(|| allocated.ips.first().map(|i| i.address.addr()))?;
    Some(macvlan::sticky_mac(&conf.common.name, first))
}

/// The link takes the workload's sticky MAC (after any probe, which must
/// use the link's own random MAC), so peers see the same MAC wherever the
/// workload runs.
fn set_sticky_mac(
    nl: &mut dyn Netlink,
    link: &CreatedLink,
    mac: crate::datapath::Mac,
) -> CniResult<CreatedLink> {
    nl.set_link_mac(Ns::Pod, link.index, mac).map_err(|e| {
        CniError::datapath(format!(
            "cannot set the sticky MAC {} on {:?}: {e}",
            crate::datapath::format_mac(&mac),
            link.name
        ))
    })?;
    Ok(CreatedLink {
        mac: Some(mac),
        ..link.clone()
    })
}

fn our_interface(env: &CniEnv, link: &CreatedLink) -> Interface {
    Interface {
        name: link.name.clone(),
        mac: link.mac_string(),
        sandbox: Some(env.netns.clone()),
        ..Interface::default()
    }
}

/// Our interface appended to prevResult's (or alone), index returned.
fn merge_interface(prev: Option<CniOutput>, iface: Interface) -> (CniOutput, usize) {
    let mut out = prev.unwrap_or_default();
    out.interfaces.push(iface);
    let index = out.interfaces.len() - 1;
    (out, index)
}

impl Attach<'_> {
    /// L2 only: the link up, no address.
    pub fn l2(self, nl: &mut dyn Netlink) -> CniResult<Value> {
        let Attach {
            env,
            conf,
            link,
            prev,
            ..
        } = self;
        let link = &link;
        macvlan::configure_l2(nl, link)?;
        let (mut out, _) = merge_interface(prev, our_interface(env, link));
        if !conf.common.dns.is_empty() {
            out.dns = conf.common.dns.clone();
        }
        out.to_json(conf.common.cni_version)
    }

    /// L3: the IPAM's addresses, `unproven` ones confirmed on the wire first.
    pub fn l3(
        self,
        nl: &mut dyn Netlink,
        allocated: CniOutput,
        unproven: &[IpAddr],
    ) -> CniResult<Value> {
        let Attach {
            env,
            conf,
            link,
            no_mac_given,
            prev,
        } = self;
        let link = &link;
        let mut ips = allocated.ips.clone();
        let sticky = if conf.sticky_mac && no_mac_given {
            sticky_mac_for(conf, &allocated)
        } else {
            None
        };
        // The interface is reported with the MAC it ends up with.
        let reported = CreatedLink {
            mac: sticky.or(link.mac),
            ..link.clone()
        };
        let (mut out, index) = merge_interface(prev, our_interface(env, &reported));
        for ip in &mut ips {
            ip.interface = Some(index);
        }
        // Convert before configuring: a result the caller's version cannot
        // carry must fail before the pod is wired, not after.
        let mut trial = out.clone();
        trial.ips.extend(ips.iter().cloned());
        trial.to_json(conf.common.cni_version)?;

        // Addresses the IPAM cannot prove free are confirmed on the wire first.
        let probed: Vec<std::net::IpAddr> = if conf.probe.enabled() {
            ips.iter()
                .map(|i| i.address.addr())
                .filter(|a| unproven.contains(a))
                .collect()
        } else {
            Vec::new()
        };
        if !probed.is_empty() {
            // With the link's own random MAC: a sticky MAC is the old holder's
            // too, and its reply to that MAC would never leave its node.
            macvlan::probe_addresses(nl, link, &probed, conf.probe.spec)?;
        }
        cni::fault::point(cni::fault::ADD_PROBED);
        let link = &match sticky {
            Some(mac) => set_sticky_mac(nl, link, mac)?,
            None => link.clone(),
        };
        macvlan::configure_l3(nl, link, &ips, &allocated.routes)?;
        let probed_v4: Vec<std::net::Ipv4Addr> = probed
            .iter()
            .filter_map(|a| match a {
                std::net::IpAddr::V4(v4) => Some(*v4),
                std::net::IpAddr::V6(_) => None,
            })
            .collect();
        macvlan::announce_addresses(nl, link, &probed_v4);
        if conf.gateway_check {
            macvlan::check_gateways(nl, link, &ips, GATEWAY_CHECK)?;
        }
        // An unproven IPv6 address is bound only once the kernel's own DAD
        // (run again with the link's final MAC) has finished without conflict.
        if probed.iter().any(|a| a.is_ipv6()) {
            macvlan::settle_ipv6(nl, link)?;
        }
        out.ips.extend(ips);
        out.routes.extend(allocated.routes);
        // The config's dns, not the IPAM's, as the reference macvlan does.
        if !conf.common.dns.is_empty() {
            out.dns = conf.common.dns.clone();
        }
        out.to_json(conf.common.cni_version)
    }
}
