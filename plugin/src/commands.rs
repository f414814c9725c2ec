//! The CNI verbs. Each one parses and validates everything first, then
//! touches the kernel and the IPAM through the `Netlink` and `Ipam` seams,
//! and on failure undoes what it did (invariant: a failed ADD leaves
//! nothing behind).

use std::path::Path;

use serde_json::Value;

use crate::cni::conf::gc_attachments;
use crate::cni::skel::{log_outcome, require_verb, start_log};
use crate::cni::{code, CniArgs, CniEnv, CniError, CniOutput, CniResult, Command, Interface};
use crate::config::NetConf;
use crate::datapath::macvlan::{self, CreatedLink, Expected, LinkSpec};
use crate::datapath::netns::{open_netns, OpenNetnsError};
use crate::datapath::rtnl::RtnlClient;
use crate::datapath::{parse_mac, Mac, Netlink, Ns};
use crate::ipam::Ipam;
use crate::log;

/// What the process prints on success (None: print nothing).
pub type Output = Option<Value>;

/// Entry point after the environment is read: dispatches on the verb.
pub fn run(env: &CniEnv, stdin: &[u8]) -> CniResult<Output> {
    if env.command == Command::Version {
        return Ok(Some(crate::cni::version::version_info()));
    }
    let conf = NetConf::parse(stdin)?;
    start_log("sticky-macvlan", &conf.common, env);
    let mut ipam = match &conf.common.ipam {
        None => None,
        Some(section) => Some(crate::ipam::for_section(section, env, &conf, stdin)?),
    };
    let ipam_dyn = ipam.as_mut().map(|i| i.as_mut() as &mut dyn Ipam);
    let result = match env.command {
        Command::Add => {
            let mut nl = connect(Some(&env.netns))?;
            let out = add(env, &conf, &mut nl, ipam_dyn).map(Some);
            cni::fault::point(cni::fault::ADD_DONE);
            out
        }
        Command::Del => del_with_netns(env, ipam_dyn).map(|()| None),
        Command::Check => {
            require_verb(Command::Check, conf.common.cni_version)?;
            let mut nl = connect(Some(&env.netns))?;
            check(env, &conf, &mut nl, ipam_dyn).map(|()| None)
        }
        Command::Status => {
            require_verb(Command::Status, conf.common.cni_version)?;
            let mut nl = connect(None)?;
            status(&conf, &mut nl, ipam_dyn).map(|()| None)
        }
        Command::Gc => {
            require_verb(Command::Gc, conf.common.cni_version)?;
            gc(stdin, ipam_dyn).map(|()| None)
        }
        // Answered above, before the config is read.
        Command::Version => Ok(Some(crate::cni::version::version_info())),
    };
    log_outcome(env.command, &result);
    result
}

pub(crate) fn connect(netns: Option<&str>) -> CniResult<RtnlClient> {
    let fd = match netns {
        None => None,
        Some(path) => Some(open_netns(Path::new(path)).map_err(|e| match e {
            OpenNetnsError::Gone => {
                CniError::invalid_env(format!("CNI_NETNS {path:?} does not exist"))
            }
            OpenNetnsError::Other(e) => {
                CniError::io(format!("cannot open CNI_NETNS {path:?}: {e}"))
            }
        })?),
    };
    RtnlClient::new(fd).map_err(|e| {
        if netns.is_some() && e.errno == Some(libc::EINVAL) {
            CniError::invalid_env(format!(
                "CNI_NETNS {:?} is not a network namespace",
                netns.unwrap_or_default()
            ))
        } else {
            CniError::datapath(e.to_string())
        }
    })
}

/// Config `mac` < `CNI_ARGS` `MAC` < `runtimeConfig.mac`, as the reference.
pub fn resolve_mac(conf: &NetConf, args: &CniArgs) -> CniResult<Option<Mac>> {
    let chosen = [
        (conf.common.runtime_mac.as_deref(), "runtimeConfig.mac"),
        (args.mac.as_deref(), "CNI_ARGS MAC"),
        (conf.mac.as_deref(), "\"mac\" in the config"),
    ]
    .into_iter()
    .find_map(|(v, source)| v.map(|v| (v, source)));
    match chosen {
        None => Ok(None),
        Some((s, source)) => parse_mac(s).map(Some).map_err(|why| {
            CniError::invalid_config(format!("invalid MAC address {s:?} from {source}: {why}"))
        }),
    }
}

/// ADD: validate, create the link, allocate, configure, answer. Any step
/// failing after the link exists removes it and releases the IPAM.
pub fn add(
    env: &CniEnv,
    conf: &NetConf,
    nl: &mut dyn Netlink,
    ipam: Option<&mut dyn Ipam>,
) -> CniResult<Value> {
    let args = CniArgs::parse(&env.args)?;
    let mac = resolve_mac(conf, &args)?;
    let prev = match &conf.common.prev_result {
        Some(v) => Some(CniOutput::from_json(
            v,
            conf.common.cni_version,
            "prevResult",
        )?),
        None => None,
    };
    let mut ipam = ipam;
    if let Some(ipam) = ipam.as_deref_mut() {
        ipam.prepare_add()?;
    }
    let master =
        macvlan::resolve_master(nl, conf.master.as_deref(), conf.link_in_container, conf.mtu)?;
    let spec = LinkSpec {
        mode: conf.mode,
        mtu: conf.mtu,
        mac,
        bc_queue_len: conf.bc_queue_len,
    };
    let alias = macvlan::owner_alias(&env.container_id, &env.ifname);
    macvlan::replace_own_leftover(nl, &env.ifname, &alias)?;
    let link = macvlan::create_link(nl, &env.ifname, &alias, &master, &spec)?;

    let result = match ipam {
        None => finish_l2(env, conf, nl, &link, prev),
        Some(ipam) => ipam.add().and_then(|allocated| {
            cni::fault::point(cni::fault::ADD_CLAIM_WRITTEN);
            let unproven = ipam.must_confirm(conf.probe.fresh, &allocated);
            finish_l3(
                env,
                conf,
                nl,
                &link,
                mac.is_none(),
                allocated,
                &unproven,
                prev,
            )
            .map_err(|e| {
                let release = ipam
                    .undo_add()
                    .map_err(|r| r.context("cannot release the IPAM after a failed ADD"));
                macvlan::with_cleanup(e, release)
            })
        }),
    };
    result.map_err(|e| macvlan::with_cleanup(e, macvlan::discard_link(nl, &link)))
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

fn finish_l2(
    env: &CniEnv,
    conf: &NetConf,
    nl: &mut dyn Netlink,
    link: &CreatedLink,
    prev: Option<CniOutput>,
) -> CniResult<Value> {
    macvlan::configure_l2(nl, link)?;
    let (mut out, _) = merge_interface(prev, our_interface(env, link));
    if !conf.common.dns.is_empty() {
        out.dns = conf.common.dns.clone();
    }
    out.to_json(conf.common.cni_version)
}

#[allow(clippy::too_many_arguments)]
fn finish_l3(
    env: &CniEnv,
    conf: &NetConf,
    nl: &mut dyn Netlink,
    link: &CreatedLink,
    no_mac_given: bool,
    allocated: CniOutput,
    unproven: &[std::net::IpAddr],
    prev: Option<CniOutput>,
) -> CniResult<Value> {
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

fn del_with_netns(env: &CniEnv, ipam: Option<&mut dyn Ipam>) -> CniResult<()> {
    let mut errors = Vec::new();
    // Release the IPAM first, like the reference: the address must not stay
    // allocated because the netns is already gone.
    if let Some(ipam) = ipam {
        if let Err(e) = ipam.del() {
            errors.push(e);
        }
        cni::fault::point(cni::fault::DEL_CLAIM_RELEASED);
    }
    if !env.netns.is_empty() {
        match open_netns(Path::new(&env.netns)) {
            Err(OpenNetnsError::Gone) => log::debug("netns already gone; nothing to remove"),
            Err(OpenNetnsError::Other(e)) => errors.push(CniError::io(format!(
                "cannot open CNI_NETNS {:?}: {e}",
                env.netns
            ))),
            Ok(fd) => match RtnlClient::new(Some(fd)) {
                // A path that is no longer a netns (the bind mount was
                // unmounted but the file left) means the netns is gone.
                Err(e) if e.errno == Some(libc::EINVAL) => {
                    log::debug("CNI_NETNS is no longer a netns")
                }
                Err(e) => errors.push(CniError::datapath(e.to_string())),
                Ok(mut nl) => {
                    if let Err(e) = macvlan::remove_link(&mut nl, &env.ifname) {
                        errors.push(e);
                    }
                    cni::fault::point(cni::fault::DEL_LINK_REMOVED);
                }
            },
        }
    }
    CniError::combine(errors).map_or(Ok(()), Err)
}

/// CHECK: the IPAM's own check, then the link against prevResult.
pub fn check(
    env: &CniEnv,
    conf: &NetConf,
    nl: &mut dyn Netlink,
    ipam: Option<&mut dyn Ipam>,
) -> CniResult<()> {
    let prev_raw = conf.common.prev_result.as_ref().ok_or_else(|| {
        CniError::invalid_config("CHECK needs prevResult in the network config (the runtime passes the cached ADD result)")
    })?;
    let prev = CniOutput::from_json(prev_raw, conf.common.cni_version, "prevResult")?;
    if let Some(ipam) = ipam {
        ipam.check()?;
    }
    let (index, iface) = prev
        .interfaces
        .iter()
        .enumerate()
        .find(|(_, i)| i.name == env.ifname && i.sandbox.as_deref() == Some(env.netns.as_str()))
        .ok_or_else(|| {
            CniError::new(
                code::CHECK_MISMATCH,
                format!(
                    "prevResult has no interface {:?} in sandbox {:?}",
                    env.ifname, env.netns
                ),
            )
        })?;
    let ns = if conf.link_in_container {
        Ns::Pod
    } else {
        Ns::Node
    };
    if let Some(master) = &conf.master {
        if nl
            .link_by_name(ns, master)
            .map_err(|e| CniError::datapath(e.to_string()))?
            .is_none()
        {
            return Err(CniError::new(
                code::CHECK_MISMATCH,
                format!("master interface {master:?} is gone from the {ns}"),
            ));
        }
    }
    let want = Expected {
        ifname: &env.ifname,
        mode: conf.mode,
        mac: iface.mac.as_deref(),
        ips: prev
            .ips
            .iter()
            .filter(|ip| ip.interface.is_none_or(|i| i == index))
            .map(|ip| ip.address)
            .collect(),
        routes: &prev.routes,
    };
    macvlan::check_link(nl, &want)
}

/// STATUS: can this node serve an ADD right now?
pub fn status(conf: &NetConf, nl: &mut dyn Netlink, ipam: Option<&mut dyn Ipam>) -> CniResult<()> {
    if !conf.link_in_container {
        if let Some(master) = &conf.master {
            let found = nl
                .link_by_name(Ns::Node, master)
                .map_err(|e| CniError::datapath(e.to_string()))?;
            if found.is_none() {
                return Err(CniError::new(
                    code::STATUS_UNAVAILABLE,
                    format!("master interface {master:?} is not present on this node: ADD would fail until it exists"),
                ));
            }
        }
    }
    match ipam {
        Some(ipam) => ipam.status(),
        None => Ok(()),
    }
}

/// GC: the macvlan itself holds no state outside pod netns (which die with
/// their pods); the IPAM's leftovers are its to collect.
pub fn gc(stdin: &[u8], ipam: Option<&mut dyn Ipam>) -> CniResult<()> {
    let keep = gc_attachments(stdin)?;
    log::debug(&format!("GC keeping {} attachments", keep.len()));
    match ipam {
        Some(ipam) => ipam.gc(&keep),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::IpConfig;
    use crate::datapath::fake::FakeNetlink;
    use serde_json::json;

    #[derive(Default)]
    struct FakeIpam {
        fail_prepare: bool,
        fail_add: bool,
        adds: usize,
        dels: usize,
        result: Option<CniOutput>,
        taken: Vec<std::net::IpAddr>,
    }

    impl Ipam for FakeIpam {
        fn prepare_add(&mut self) -> CniResult<()> {
            if self.fail_prepare {
                return Err(CniError::invalid_config("args.cni.identity is empty"));
            }
            Ok(())
        }
        fn add(&mut self) -> CniResult<CniOutput> {
            self.adds += 1;
            if self.fail_add {
                return Err(CniError::new(code::TRY_AGAIN_LATER, "pool busy"));
            }
            Ok(self.result.clone().unwrap_or(CniOutput {
                ips: vec![IpConfig {
                    interface: None,
                    address: "10.0.0.5/24".parse().unwrap(),
                    gateway: Some("10.0.0.1".parse().unwrap()),
                }],
                routes: vec![crate::cni::Route::new("0.0.0.0/0".parse().unwrap(), None)],
                ..CniOutput::default()
            }))
        }
        fn must_confirm(&self, probe_fresh: bool, allocated: &CniOutput) -> Vec<std::net::IpAddr> {
            if probe_fresh {
                return allocated.ips.iter().map(|i| i.address.addr()).collect();
            }
            self.taken.clone()
        }
        fn del(&mut self) -> CniResult<()> {
            self.dels += 1;
            Ok(())
        }
        fn check(&mut self) -> CniResult<()> {
            Ok(())
        }
        fn status(&mut self) -> CniResult<()> {
            Ok(())
        }
        fn gc(&mut self, _keep: &[(String, String)]) -> CniResult<()> {
            Ok(())
        }
    }

    fn env() -> CniEnv {
        CniEnv {
            command: Command::Add,
            container_id: "c1".into(),
            netns: "/run/netns/p1".into(),
            ifname: "net1".into(),
            args: String::new(),
            path: "/opt/cni/bin".into(),
        }
    }

    fn conf(version: &str, extra: Value) -> NetConf {
        let mut base = json!({"cniVersion": version, "name": "n", "type": "sticky-macvlan", "master": "uplink0"});
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        NetConf::parse(base.to_string().as_bytes()).unwrap()
    }

    fn nl() -> FakeNetlink {
        FakeNetlink::new().with_device(Ns::Node, "uplink0", 1500)
    }

    #[test]
    fn l3_add_wires_everything_and_answers_in_version() {
        let mut nl = nl();
        let mut ipam = FakeIpam::default();
        let out = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap();
        assert_eq!(out["interfaces"][0]["name"], "net1");
        assert_eq!(out["interfaces"][0]["sandbox"], "/run/netns/p1");
        assert_eq!(out["ips"][0]["interface"], 0);
        assert_eq!(out["ips"][0]["address"], "10.0.0.5/24");
        assert_eq!(nl.link(Ns::Pod, "net1").unwrap().addrs.len(), 1);
    }

    #[test]
    fn a_taken_over_address_is_probed_refused_when_answered_and_announced_when_not() {
        let taken = FakeIpam {
            taken: vec!["10.0.0.5".parse().unwrap()],
            ..FakeIpam::default()
        };
        // Fresh allocation: no probe, no announcement (arp_notify does it).
        let mut quiet = nl();
        add(
            &env(),
            &conf("1.0.0", json!({})),
            &mut quiet,
            Some(&mut FakeIpam::default()),
        )
        .unwrap();
        assert!(
            !quiet
                .calls
                .iter()
                .any(|c| c.starts_with("arp_") || c.starts_with("probe_")),
            "{:?}",
            quiet.calls
        );
        // Taken over, nobody answers: probed before the address, announced after.
        let mut free = nl();
        let mut ipam = FakeIpam {
            taken: taken.taken.clone(),
            ..FakeIpam::default()
        };
        add(
            &env(),
            &conf("1.0.0", json!({})),
            &mut free,
            Some(&mut ipam),
        )
        .unwrap();
        let pos = |nl: &FakeNetlink, p: &str| nl.calls.iter().position(|c| c.starts_with(p));
        let probe = pos(&free, "probe_address").expect("probed");
        let addr = pos(&free, "add_address").expect("address added");
        let announce = pos(&free, "arp_announce").expect("announced");
        assert!(probe < addr && addr < announce, "{:?}", free.calls);
        // Taken over, the old holder answers: 11 naming its MAC, undone.
        let mut busy = nl();
        busy.arp_owners
            .insert("10.0.0.5".parse().unwrap(), [2, 0, 0, 0, 0, 0x42]);
        let mut ipam = FakeIpam {
            taken: taken.taken.clone(),
            ..FakeIpam::default()
        };
        let e = add(
            &env(),
            &conf("1.0.0", json!({})),
            &mut busy,
            Some(&mut ipam),
        )
        .unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("02:00:00:00:00:42") && e.msg.contains("10.0.0.5"),
            "{}",
            e.msg
        );
        assert!(busy.link_names(Ns::Pod).is_empty());
        assert_eq!(ipam.dels, 1, "the IPAM's ADD is undone");
        assert!(pos(&busy, "add_address").is_none());
        // Probing off: no probe even on a takeover.
        let mut off = nl();
        off.arp_owners
            .insert("10.0.0.5".parse().unwrap(), [2, 0, 0, 0, 0, 0x42]);
        let mut ipam = FakeIpam {
            taken: taken.taken.clone(),
            ..FakeIpam::default()
        };
        add(
            &env(),
            &conf("1.0.0", json!({"probe": {"riskDuplicateAddresses": true}})),
            &mut off,
            Some(&mut ipam),
        )
        .unwrap();
        assert!(pos(&off, "probe_address").is_none(), "{:?}", off.calls);
        // probe.fresh: fresh allocations are probed too.
        let mut fresh = nl();
        add(
            &env(),
            &conf("1.0.0", json!({"probe": {"fresh": true}})),
            &mut fresh,
            Some(&mut FakeIpam::default()),
        )
        .unwrap();
        assert!(pos(&fresh, "probe_address").is_some());
    }

    #[test]
    fn an_unproven_ipv6_address_is_probed_by_dad_and_refused_naming_the_mac() {
        let v6 = || CniOutput {
            ips: vec![IpConfig {
                interface: None,
                address: "fd00:59::2/64".parse().unwrap(),
                gateway: None,
            }],
            ..CniOutput::default()
        };
        let unproven = vec!["fd00:59::2".parse().unwrap()];
        let mut busy = nl();
        busy.ndp_owners
            .insert("fd00:59::2".parse().unwrap(), [2, 0, 0, 0, 0, 0x66]);
        let mut ipam = FakeIpam {
            result: Some(v6()),
            taken: unproven.clone(),
            ..FakeIpam::default()
        };
        let e = add(
            &env(),
            &conf("1.0.0", json!({})),
            &mut busy,
            Some(&mut ipam),
        )
        .unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("02:00:00:00:00:66") && e.msg.contains("duplicate address detection"),
            "{}",
            e.msg
        );
        assert!(busy.link_names(Ns::Pod).is_empty());
        assert!(!busy.calls.iter().any(|c| c.starts_with("add_address")));
        // Nobody answers: probed before the address is added, then bound.
        let mut free = nl();
        let mut ipam = FakeIpam {
            result: Some(v6()),
            taken: unproven,
            ..FakeIpam::default()
        };
        add(
            &env(),
            &conf("1.0.0", json!({})),
            &mut free,
            Some(&mut ipam),
        )
        .unwrap();
        let pos = |p: &str| free.calls.iter().position(|c| c.starts_with(p));
        assert!(pos("probe_address").unwrap() < pos("add_address").unwrap());
    }

    #[test]
    fn sticky_mac_follows_the_address_unless_a_mac_is_given() {
        let mut n = nl();
        let out = add(
            &env(),
            &conf("1.0.0", json!({"stickyMac": true})),
            &mut n,
            Some(&mut FakeIpam::default()),
        )
        .unwrap();
        let want =
            crate::datapath::format_mac(&macvlan::sticky_mac("n", "10.0.0.5".parse().unwrap()));
        assert_eq!(out["interfaces"][0]["mac"], want.as_str());
        let set = n
            .calls
            .iter()
            .position(|c| c.starts_with("set_link_mac"))
            .expect("MAC set");
        let up = n
            .calls
            .iter()
            .position(|c| c.starts_with("set_link_up"))
            .expect("link up");
        assert!(
            set < up,
            "the MAC is set while the link is down: {:?}",
            n.calls
        );
        let mut given = nl();
        let out = add(
            &env(),
            &conf(
                "1.0.0",
                json!({"stickyMac": true, "mac": "02:aa:bb:cc:dd:ee"}),
            ),
            &mut given,
            Some(&mut FakeIpam::default()),
        )
        .unwrap();
        assert_eq!(out["interfaces"][0]["mac"], "02:aa:bb:cc:dd:ee");
        assert!(!given.calls.iter().any(|c| c.starts_with("set_link_mac")));
    }

    #[test]
    fn gateway_check_fails_the_add_when_the_gateway_is_silent() {
        let mut silent = nl();
        let mut ipam = FakeIpam::default();
        let e = add(
            &env(),
            &conf("1.0.0", json!({"gatewayCheck": true})),
            &mut silent,
            Some(&mut ipam),
        )
        .unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("gateway 10.0.0.1 did not answer"),
            "{}",
            e.msg
        );
        assert!(silent.link_names(Ns::Pod).is_empty());
        assert_eq!(ipam.dels, 1);
        let mut answered = nl();
        answered
            .arp_owners
            .insert("10.0.0.1".parse().unwrap(), [2, 0, 0, 0, 0, 1]);
        add(
            &env(),
            &conf("1.0.0", json!({"gatewayCheck": true})),
            &mut answered,
            Some(&mut FakeIpam::default()),
        )
        .unwrap();
        let mut off = nl();
        add(
            &env(),
            &conf("1.0.0", json!({})),
            &mut off,
            Some(&mut FakeIpam::default()),
        )
        .unwrap();
        assert!(!off.calls.iter().any(|c| c.starts_with("arp_resolve")));
    }

    #[test]
    fn ipam_failure_removes_the_link_and_keeps_the_code() {
        let mut nl = nl();
        let mut ipam = FakeIpam {
            fail_add: true,
            ..FakeIpam::default()
        };
        let e = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(nl.link_names(Ns::Pod).is_empty());
        assert_eq!(
            ipam.dels, 0,
            "nothing was allocated, so nothing is released"
        );
    }

    #[test]
    fn an_invalid_ipam_request_fails_before_the_link_exists() {
        let mut nl = nl();
        let mut ipam = FakeIpam {
            fail_prepare: true,
            ..FakeIpam::default()
        };
        let e = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(!nl.calls.iter().any(|c| c.starts_with("create_macvlan")));
        assert_eq!(ipam.adds, 0);
    }

    #[test]
    fn configure_failure_releases_ipam_and_removes_link() {
        let mut nl = nl().fail("add_route", libc::ENETUNREACH);
        let mut ipam = FakeIpam::default();
        let e = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap_err();
        assert!(e.msg.contains("0.0.0.0/0"), "{}", e.msg);
        assert!(nl.link_names(Ns::Pod).is_empty());
        assert_eq!(ipam.dels, 1);
    }

    #[test]
    fn l2_with_legacy_version_fails_cleanly() {
        for v in ["0.1.0", "0.2.0"] {
            let mut nl = nl();
            let e = add(&env(), &conf(v, json!({})), &mut nl, None).unwrap_err();
            assert!(
                e.msg.starts_with("cannot convert: no valid IP addresses"),
                "{}",
                e.msg
            );
            assert!(
                nl.link_names(Ns::Pod).is_empty(),
                "{v}: the link is rolled back"
            );
        }
    }

    #[test]
    fn l2_add_is_up_without_addresses() {
        let mut nl = nl();
        let out = add(
            &env(),
            &conf("0.3.1", json!({"dns": {"nameservers": ["10.0.0.53"]}})),
            &mut nl,
            None,
        )
        .unwrap();
        assert!(out.get("ips").is_none());
        assert_eq!(out["dns"]["nameservers"][0], "10.0.0.53");
        assert!(nl.link(Ns::Pod, "net1").unwrap().state.up);
    }

    #[test]
    fn mac_precedence() {
        let c = conf(
            "1.0.0",
            json!({"mac": "02:00:00:00:00:01", "runtimeConfig": {"mac": "02:00:00:00:00:03"}}),
        );
        let args = CniArgs::parse("MAC=02:00:00:00:00:02").unwrap();
        assert_eq!(resolve_mac(&c, &args).unwrap(), Some([2, 0, 0, 0, 0, 3]));
        let c = conf("1.0.0", json!({"mac": "02:00:00:00:00:01"}));
        assert_eq!(resolve_mac(&c, &args).unwrap(), Some([2, 0, 0, 0, 0, 2]));
        assert_eq!(
            resolve_mac(&c, &CniArgs::default()).unwrap(),
            Some([2, 0, 0, 0, 0, 1])
        );
        let bad = conf("1.0.0", json!({"mac": "nope"}));
        let e = resolve_mac(&bad, &CniArgs::default()).unwrap_err();
        assert!(
            e.msg.contains("\"nope\"") && e.msg.contains("\"mac\""),
            "{}",
            e.msg
        );
    }

    #[test]
    fn bad_mac_fails_before_anything_is_created() {
        let mut nl = nl();
        let mut e = env();
        e.args = "MAC=zz".into();
        let err = add(&e, &conf("1.0.0", json!({})), &mut nl, None).unwrap_err();
        assert_eq!(err.code, code::INVALID_CONFIG);
        assert!(!nl.calls.iter().any(|c| c.starts_with("create_macvlan")));
    }

    #[test]
    fn prev_result_is_extended() {
        let mut nl = nl();
        let mut ipam = FakeIpam::default();
        let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/run/netns/p1"}],
            "ips": [{"interface": 0, "address": "192.168.0.2/24"}]});
        let out = add(
            &env(),
            &conf("1.0.0", json!({"prevResult": prev})),
            &mut nl,
            Some(&mut ipam),
        )
        .unwrap();
        assert_eq!(out["interfaces"].as_array().unwrap().len(), 2);
        assert_eq!(out["ips"][0]["address"], "192.168.0.2/24");
        assert_eq!(out["ips"][1]["interface"], 1);
    }

    #[test]
    fn check_needs_prev_result() {
        let mut nl = nl();
        let e = check(&env(), &conf("1.0.0", json!({})), &mut nl, None).unwrap_err();
        assert!(e.msg.contains("prevResult"));
    }

    #[test]
    fn check_after_add_passes_and_detects_a_removed_address() {
        let mut nl = nl();
        let mut ipam = FakeIpam::default();
        let out = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap();
        let c = conf("1.0.0", json!({"prevResult": out}));
        check(&env(), &c, &mut nl, Some(&mut ipam)).unwrap();
        let idx = nl.link(Ns::Pod, "net1").unwrap().state.index;
        for links in nl.links.values_mut() {
            for l in links.iter_mut().filter(|l| l.state.index == idx) {
                l.addrs.clear();
            }
        }
        let e = check(&env(), &c, &mut nl, Some(&mut ipam)).unwrap_err();
        assert!(e.msg.contains("10.0.0.5/24"), "{}", e.msg);
    }

    #[test]
    fn status_reports_missing_master_as_unavailable() {
        let mut nl = FakeNetlink::new();
        let e = status(&conf("1.1.0", json!({})), &mut nl, None).unwrap_err();
        assert_eq!(e.code, code::STATUS_UNAVAILABLE);
        let mut nl = self::nl();
        status(&conf("1.1.0", json!({})), &mut nl, None).unwrap();
    }
}
