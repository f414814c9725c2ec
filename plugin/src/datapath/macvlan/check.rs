//! CHECK: the link against what ADD built (prevResult).

use ipnet::IpNet;

use super::datapath;
use crate::cni::{code, CniError, CniResult, Route};
use crate::datapath::MacvlanMode;
use crate::datapath::{format_mac, Netlink, Ns};

fn mismatch(msg: String) -> CniError {
    CniError::new(code::CHECK_MISMATCH, msg)
}

/// What CHECK expects to find, from prevResult and the config.
pub struct Expected<'a> {
    pub ifname: &'a str,
    pub mode: MacvlanMode,
    pub mac: Option<&'a str>,
    pub ips: Vec<IpNet>,
    pub routes: &'a [Route],
}

pub fn check_link(nl: &mut dyn Netlink, want: &Expected<'_>) -> CniResult<()> {
    let ifname = want.ifname;
    let link = nl
        .link_by_name(Ns::Pod, ifname)
        .map_err(datapath)?
        .ok_or_else(|| {
            mismatch(format!(
                "interface {ifname:?} from prevResult is not in the pod netns"
            ))
        })?;
    if link.kind.as_deref() != Some("macvlan") {
        return Err(mismatch(format!(
            "interface {ifname:?} is a {} link, not a macvlan",
            link.kind.as_deref().unwrap_or("plain")
        )));
    }
    if link.macvlan_mode != Some(want.mode) {
        let actual = link
            .macvlan_mode
            .map(MacvlanMode::as_str)
            .unwrap_or("unknown");
        return Err(mismatch(format!(
            "macvlan {ifname:?} is in mode {actual}, the config says {}",
            want.mode.as_str()
        )));
    }
    if let Some(mac) = want.mac {
        let actual = link.mac.as_ref().map(format_mac).unwrap_or_default();
        if !actual.eq_ignore_ascii_case(mac) {
            return Err(mismatch(format!(
                "macvlan {ifname:?} has MAC {actual}, prevResult says {mac}"
            )));
        }
    }
    let addrs = nl.addresses(Ns::Pod, link.index).map_err(datapath)?;
    for ip in &want.ips {
        if !addrs.iter().any(|a| a.addr == *ip) {
            return Err(mismatch(format!(
                "address {ip} from prevResult is missing on {ifname:?}"
            )));
        }
    }
    let routes = nl.routes(Ns::Pod).map_err(datapath)?;
    for r in want.routes {
        let dst = r.dst.trunc();
        let found = routes
            .iter()
            .any(|have| have.dst == dst && (r.gw.is_none() || have.gw == r.gw));
        if !found {
            let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
            return Err(mismatch(format!(
                "route {}{via} from prevResult is missing in the pod netns",
                r.dst
            )));
        }
    }
    Ok(())
}
