//! The CNI verbs. Each one parses and validates everything first, then
//! touches the kernel and the IPAM through the `Netlink` and `Ipam` seams,
//! and on failure undoes what it did (invariant: a failed ADD leaves
//! nothing behind).

use std::path::Path;

use serde_json::Value;

use crate::attach::Attach;
use crate::cni::conf::gc_attachments;
use crate::cni::skel::{log_outcome, require_verb, start_log};
use crate::cni::{code, CniArgs, CniEnv, CniError, CniOutput, CniResult, Command};
use crate::datapath::macvlan::{self, Expected, LinkSpec};
use crate::datapath::netns::{open_netns, OpenNetnsError};
use crate::datapath::rtnl::RtnlClient;
use crate::datapath::{parse_mac, Mac, Netlink, Ns};
use crate::ipam_driver::{add_and_bind, Ipam};
use crate::log;
use crate::netconf::NetConf;

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
        Some(section) => Some(crate::ipam_driver::for_section(section, env, &conf, stdin)?),
    };
    let ipam_dyn = ipam.as_mut().map(|i| i.as_mut() as &mut dyn Ipam);
    let result = match env.command {
        Command::Add => {
            let mut nl = connect(Some(&env.netns))?;
            let out = add(env, &conf, &mut nl, ipam_dyn).map(Some);
            cni::fault::point(cni::fault::ADD_DONE);
            out
        }
        Command::Del => {
            // Opened first (it changes nothing), used after the IPAM's DEL.
            let mut pod = match env.netns.as_str() {
                "" => Ok(None),
                path => open_pod_netns(path),
            };
            let pod = pod
                .as_mut()
                .map(|nl| nl.as_mut().map(|nl| nl.as_mut() as &mut dyn Netlink))
                .map_err(|e| e.clone());
            del(env, ipam_dyn, pod).map(|()| None)
        }
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
    let prepared = match ipam.as_deref_mut() {
        Some(ipam) => Some(ipam.prepare_add()?),
        None => None,
    };
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

    let attach = Attach {
        env,
        conf,
        link: link.clone(),
        no_mac_given: mac.is_none(),
        prev,
    };
    let result = match (ipam, prepared) {
        (Some(ipam), Some(prepared)) => {
            add_and_bind(ipam, prepared, conf.probe.fresh, |allocation| {
                cni::fault::point(cni::fault::ADD_CLAIM_WRITTEN);
                attach.l3(nl, allocation.result.clone(), &allocation.unproven)
            })
        }
        _ => attach.l2(nl),
    };
    result.map_err(|e| macvlan::with_cleanup(e, macvlan::discard_link(nl, &link)))
}

/// A netlink socket inside the pod's netns for DEL: None when it is gone
/// (a missing path, or a path that is no longer a netns mount), which DEL
/// takes as success.
fn open_pod_netns(path: &str) -> CniResult<Option<Box<dyn Netlink>>> {
    match open_netns(Path::new(path)) {
        Err(OpenNetnsError::Gone) => {
            log::debug("netns already gone; nothing to remove");
            Ok(None)
        }
        Err(OpenNetnsError::Other(e)) => {
            Err(CniError::io(format!("cannot open CNI_NETNS {path:?}: {e}")))
        }
        Ok(fd) => match RtnlClient::new(Some(fd)) {
            // The bind mount was unmounted but the file left.
            Err(e) if e.errno == Some(libc::EINVAL) => {
                log::debug("CNI_NETNS is no longer a netns");
                Ok(None)
            }
            Err(e) => Err(CniError::datapath(e.to_string())),
            Ok(nl) => Ok(Some(Box::new(nl))),
        },
    }
}

/// DEL: the IPAM first, like the reference (the address must not stay
/// allocated because the netns is already gone), then the link in `pod`
/// (None: the netns is gone); both are always attempted and every failure
/// is reported.
pub fn del(
    env: &CniEnv,
    ipam: Option<&mut dyn Ipam>,
    pod: CniResult<Option<&mut dyn Netlink>>,
) -> CniResult<()> {
    let mut errors = Vec::new();
    if let Some(ipam) = ipam {
        if let Err(e) = ipam.del() {
            errors.push(e);
        }
        cni::fault::point(cni::fault::DEL_CLAIM_RELEASED);
    }
    match pod {
        Ok(None) => {}
        Ok(Some(nl)) => {
            if let Err(e) = macvlan::remove_link(nl, &env.ifname) {
                errors.push(e);
            }
            cni::fault::point(cni::fault::DEL_LINK_REMOVED);
        }
        Err(e) => errors.push(e),
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
#[path = "commands_tests.rs"]
mod tests;
