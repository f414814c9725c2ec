//! Creating, configuring, checking and removing the pod's macvlan, on any
//! `Netlink`. No I/O of its own, so every rollback path is unit-tested
//! against the fake.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::MacvlanMode;
use super::{format_mac, LinkState, Mac, Netlink, NewMacvlan, NewRoute, NlError, Ns};
use crate::cni::{code, CniError, CniResult, IpConfig, Route};
use crate::log;
use cni::fault;

/// Attempts at a free temporary name before giving up (names are random,
/// so a clash twice in a row means something is very wrong).
const TMP_NAME_ATTEMPTS: usize = 5;
/// How long an IPv6 address may stay tentative (DAD) before routes via a
/// gateway are added anyway; matches the reference plugin's wait.
const DAD_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
const DAD_POLL_INTERVAL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    pub name: String,
    pub index: u32,
    pub mtu: u32,
    pub ns: Ns,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub mode: MacvlanMode,
    /// 0 inherits the master's MTU.
    pub mtu: u32,
    pub mac: Option<Mac>,
    pub bc_queue_len: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedLink {
    pub index: u32,
    pub name: String,
    pub mac: Option<Mac>,
}

impl CreatedLink {
    pub fn mac_string(&self) -> Option<String> {
        self.mac.as_ref().map(format_mac)
    }
}

fn datapath(e: NlError) -> CniError {
    CniError::datapath(e.to_string())
}

/// Finds the master (configured, or the interface of the default route) and
/// validates the requested MTU against it. `link_in_container` looks in the
/// pod netns instead of the node's.
pub fn resolve_master(
    nl: &mut dyn Netlink,
    master: Option<&str>,
    link_in_container: bool,
    mtu: u32,
) -> CniResult<Master> {
    let ns = if link_in_container { Ns::Pod } else { Ns::Node };
    let name = match master {
        Some(m) => m.to_string(),
        None => nl.default_route_link(ns).map_err(datapath)?.ok_or_else(|| {
            CniError::invalid_config(format!(
                "no \"master\" is configured and the {ns} has no default route to take it from: set \"master\" to the uplink interface"
            ))
        })?,
    };
    let link = nl.link_by_name(ns, &name).map_err(datapath)?.ok_or_else(|| {
        CniError::invalid_config(format!(
            "master interface {name:?} not found in the {ns}: set \"master\" to an existing interface"
        ))
    })?;
    if mtu > link.mtu {
        return Err(CniError::invalid_config(format!(
            "mtu {mtu} is invalid: it must be between 0 and the MTU of master {name:?} ({})",
            link.mtu
        )));
    }
    Ok(Master {
        name,
        index: link.index,
        mtu: link.mtu,
        ns,
    })
}

fn random_suffix() -> u32 {
    let mut buf = [0u8; 4];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == buf.len() as isize {
        return u32::from_ne_bytes(buf);
    }
    // getrandom cannot fail for 4 bytes on a booted kernel; stay unique anyway.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

pub fn tmp_name() -> String {
    format!("{TMP_PREFIX}{:08x}", random_suffix())
}

const TMP_PREFIX: &str = "smv";

/// A macvlan only we name this way: created, never renamed, because the
/// ADD died in between (kill -9, a node crash).
fn is_our_leftover(link: &LinkState) -> bool {
    link.kind.as_deref() == Some("macvlan")
        && link.name.len() == TMP_PREFIX.len() + 8
        && link
            .name
            .strip_prefix(TMP_PREFIX)
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Creates the macvlan in the pod netns under a temporary name (a name
/// clash with the node's interfaces is impossible that way, and a clash in
/// the pod is retried) and renames it to `ifname`. On any failure nothing
/// is left behind.
/// The alias our links carry: which attachment made them, so a retried
/// ADD of that same attachment knows a link it finds is its own.
pub fn owner_alias(container_id: &str, ifname: &str) -> String {
    // IFALIASZ is 256 bytes with the NUL; container IDs are 64 hex digits.
    let mut alias = format!("sticky-macvlan {container_id}/{ifname}");
    alias.truncate(alias.floor_char_boundary(255));
    alias
}

/// An ADD of this attachment that was killed after the rename left its
/// interface behind: the runtime's retry replaces it instead of failing on
/// "already exists". A link of that name made by anyone else is left
/// alone, and the create below refuses.
pub fn replace_own_leftover(nl: &mut dyn Netlink, ifname: &str, alias: &str) -> CniResult<()> {
    let Some(link) = nl.link_by_name(Ns::Pod, ifname).map_err(datapath)? else {
        return Ok(());
    };
    if link.kind.as_deref() != Some("macvlan") || link.alias.as_deref() != Some(alias) {
        return Ok(());
    }
    log::info(&format!(
        "{ifname:?} in the pod netns is left from an earlier, interrupted ADD of this attachment: replacing it"
    ));
    remove_by_index(nl, link.index, ifname)
}

pub fn create_link(
    nl: &mut dyn Netlink,
    ifname: &str,
    alias: &str,
    master: &Master,
    spec: &LinkSpec,
) -> CniResult<CreatedLink> {
    let mut created = None;
    for _ in 0..TMP_NAME_ATTEMPTS {
        let req = NewMacvlan {
            tmp_name: tmp_name(),
            master_index: master.index,
            master_ns: master.ns,
            mode: spec.mode,
            mtu: (spec.mtu != 0).then_some(spec.mtu),
            mac: spec.mac,
            bc_queue_len: spec.bc_queue_len,
        };
        match nl.create_macvlan(&req) {
            Ok(()) => {
                created = Some(req.tmp_name);
                break;
            }
            Err(e) if e.is_exists() => {
                if let Some(mac) = spec.mac {
                    // EEXIST also means another macvlan on this master uses the MAC.
                    if nl
                        .link_by_name(Ns::Pod, &req.tmp_name)
                        .map_err(datapath)?
                        .is_none()
                    {
                        return Err(CniError::datapath(format!(
                            "cannot create macvlan on master {:?}: MAC {} is already used by another macvlan on it; choose another \"mac\"",
                            master.name,
                            format_mac(&mac)
                        )));
                    }
                }
                continue;
            }
            Err(e) => {
                return Err(CniError::datapath(format!(
                    "cannot create macvlan on master {:?}: {e}",
                    master.name
                )));
            }
        }
    }
    fault::point(fault::ADD_LINK_CREATED);
    let tmp = created.ok_or_else(|| {
        CniError::datapath(format!("cannot create macvlan on master {:?}: {TMP_NAME_ATTEMPTS} temporary names were all taken", master.name))
    })?;
    let link = match nl.link_by_name(Ns::Pod, &tmp) {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Err(CniError::datapath(format!(
                "macvlan {tmp:?} vanished from the pod netns right after creation"
            )))
        }
        Err(e) => return Err(datapath(e)),
    };
    if let Err(e) = nl.rename_link(Ns::Pod, link.index, ifname, alias) {
        let err = if e.is_exists() {
            CniError::datapath(format!(
                "interface {ifname:?} already exists in the pod netns: each attachment needs its own CNI_IFNAME"
            ))
        } else {
            CniError::datapath(format!("cannot rename macvlan {tmp:?} to {ifname:?}: {e}"))
        };
        return Err(with_cleanup(err, remove_by_index(nl, link.index, &tmp)));
    }
    fault::point(fault::ADD_LINK_RENAMED);
    Ok(CreatedLink {
        index: link.index,
        name: ifname.to_string(),
        mac: link.mac,
    })
}

fn remove_by_index(nl: &mut dyn Netlink, index: u32, name: &str) -> CniResult<()> {
    match nl.delete_link(Ns::Pod, index) {
        Ok(()) => Ok(()),
        Err(e) if e.is_no_device() => Ok(()),
        Err(e) => Err(CniError::datapath(format!(
            "cannot remove macvlan {name:?} after a failed ADD: {e}"
        ))),
    }
}

/// Appends a cleanup failure to the error that caused the cleanup.
pub fn with_cleanup(err: CniError, cleanup: CniResult<()>) -> CniError {
    match cleanup {
        Ok(()) => err,
        Err(c) => {
            CniError::combine(vec![err, c]).unwrap_or_else(|| CniError::datapath("unreachable"))
        }
    }
}

/// Rolls back a created link (for failures after `create_link`).
pub fn discard_link(nl: &mut dyn Netlink, link: &CreatedLink) -> CniResult<()> {
    remove_by_index(nl, link.index, &link.name)
}

fn best_effort_sysctl(nl: &mut dyn Netlink, key: &str, value: &str) {
    if let Err(e) = nl.write_sysctl(Ns::Pod, key, value) {
        log::debug(&format!("ignoring: {e}"));
    }
}

/// L2-only: just bring the link up.
pub fn configure_l2(nl: &mut dyn Netlink, link: &CreatedLink) -> CniResult<()> {
    nl.set_link_up(Ns::Pod, link.index).map_err(datapath)
}

/// The gateway a route without one falls back to: the first gateway among
/// the addresses of the same family (the reference plugins' rule).
pub fn fallback_gateways(ips: &[IpConfig]) -> (Option<IpAddr>, Option<IpAddr>) {
    let v4 = ips.iter().filter_map(|i| i.gateway).find(IpAddr::is_ipv4);
    let v6 = ips.iter().filter_map(|i| i.gateway).find(IpAddr::is_ipv6);
    (v4, v6)
}

/// Addresses, up, announcements, routes: what the IPAM result asks for.
pub fn configure_l3(
    nl: &mut dyn Netlink,
    link: &CreatedLink,
    ips: &[IpConfig],
    routes: &[Route],
) -> CniResult<()> {
    let ifname = &link.name;
    // Let the kernel announce the address (gratuitous ARP / unsolicited NA)
    // when the link comes up, so peers' caches move to the new MAC at once
    // (what makes a takeover reachable without waiting out ARP timeouts).
    best_effort_sysctl(nl, &format!("net/ipv4/conf/{ifname}/arp_notify"), "1");
    best_effort_sysctl(nl, &format!("net/ipv6/conf/{ifname}/ndisc_notify"), "1");

    if ips.iter().any(|i| i.address.addr().is_ipv6()) {
        for dev in ["lo", ifname.as_str()] {
            let key = format!("net/ipv6/conf/{dev}/disable_ipv6");
            match nl.read_sysctl(Ns::Pod, &key) {
                Ok(Some(v)) if v != "0" => nl.write_sysctl(Ns::Pod, &key, "0").map_err(|e| {
                    CniError::datapath(format!(
                        "cannot enable IPv6 on {dev:?} for an IPv6 address: {e}"
                    ))
                })?,
                Ok(_) => {}
                Err(e) => log::debug(&format!("ignoring: {e}")),
            }
        }
    }

    for ip in ips {
        nl.add_address(Ns::Pod, link.index, ip.address)
            .map_err(|e| {
                CniError::datapath(format!(
                    "cannot add address {} to {ifname:?}: {e}",
                    ip.address
                ))
            })?;
    }

    fault::point(fault::ADD_ADDRESS_SET);
    // Up only once the addresses are on: arp_notify announces the addresses
    // present at NETDEV_UP, not ones added later.
    nl.set_link_up(Ns::Pod, link.index).map_err(datapath)?;

    let (v4gw, v6gw) = fallback_gateways(ips);
    if v6gw.is_some() {
        settle_addresses(nl, link, false)?;
    }

    for r in routes {
        let gw = r.gw.or(if r.dst.addr().is_ipv4() { v4gw } else { v6gw });
        let route = NewRoute {
            dst: r.dst.trunc(),
            gw,
            oif: link.index,
            mtu: r.mtu,
            adv_mss: r.adv_mss,
            priority: r.priority,
            table: r.table,
            scope: r.scope,
        };
        nl.add_route(Ns::Pod, &route).map_err(|e| {
            let via = gw.map(|g| format!(" via {g}")).unwrap_or_default();
            CniError::datapath(format!("cannot add route {}{via} dev {ifname}: {e}", r.dst))
        })?;
    }
    fault::point(fault::ADD_ROUTES_SET);
    Ok(())
}

/// Waits until no IPv6 address on the link is tentative (DAD done).
/// `strict`: a still tentative address after the timeout fails the ADD
/// (an address that had to be proven free on the wire); otherwise the ADD
/// goes on without it settled.
fn settle_addresses(nl: &mut dyn Netlink, link: &CreatedLink, strict: bool) -> CniResult<()> {
    let deadline = Instant::now() + DAD_SETTLE_TIMEOUT;
    loop {
        let addrs = nl.addresses(Ns::Pod, link.index).map_err(datapath)?;
        if let Some(failed) = addrs.iter().find(|a| a.dad_failed) {
            return Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!("address {} on {:?} failed duplicate address detection: another host on the segment uses it", failed.addr, link.name),
            ));
        }
        if !addrs.iter().any(|a| a.tentative) {
            return Ok(());
        }
        if Instant::now() >= deadline && strict {
            return Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!("IPv6 addresses on {:?} are still tentative after {DAD_SETTLE_TIMEOUT:?}: duplicate address detection did not finish, so the address is not known to be free; kubelet retries this ADD", link.name),
            ));
        }
        if Instant::now() >= deadline {
            log::warn(&format!("IPv6 addresses on {:?} still tentative after {DAD_SETTLE_TIMEOUT:?}; adding routes anyway", link.name));
            return Ok(());
        }
        std::thread::sleep(DAD_POLL_INTERVAL);
    }
}

/// A workload's MAC that follows its address across reschedules (the
/// `stickyMac` option): locally administered and unicast, 14 bits from the
/// network's name and the 32 bits of the IPv4 address (for IPv6, its low
/// 32 bits). Addresses are unique in a network, so within one network (and
/// a v6 range under 2^32 addresses) no two claims share a MAC.
pub fn sticky_mac(network: &str, ip: std::net::IpAddr) -> Mac {
    // FNV-1a: stable across releases and platforms, no key needed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in network.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let net = h.to_be_bytes();
    let low: [u8; 4] = match ip {
        std::net::IpAddr::V4(v4) => v4.octets(),
        std::net::IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [
        (net[0] & 0xfc) | 0x02,
        net[1],
        low[0],
        low[1],
        low[2],
        low[3],
    ]
}

/// Before addresses the store cannot prove free are bound: brings the
/// link up without them and asks the wire for each (ARP probe, RFC 5227;
/// duplicate address detection, RFC 4862). An answer from another MAC means
/// a live host still uses the address, whatever the store concluded: code
/// 11, and the caller undoes the ADD.
pub fn probe_addresses(
    nl: &mut dyn Netlink,
    link: &CreatedLink,
    ips: &[IpAddr],
    spec: super::arp::ProbeSpec,
) -> CniResult<()> {
    let Some(mac) = link.mac else {
        return Err(CniError::datapath(format!(
            "cannot probe from {:?}: its MAC is unknown",
            link.name
        )));
    };
    nl.set_link_up(Ns::Pod, link.index).map_err(datapath)?;
    for ip in ips {
        let how = if ip.is_ipv4() {
            "ARP probe"
        } else {
            "duplicate address detection"
        };
        match nl.probe_address(link.index, mac, *ip, spec) {
            Ok(None) => {}
            Ok(Some(other)) => {
                return Err(CniError::new(
                    code::TRY_AGAIN_LATER,
                    format!(
                        "{ip} is still answered on the wire by MAC {} ({how} from {:?}): a live host uses it (for example the identity's pod on another node, or a partitioned node whose pod was deleted), so the address was not bound and no claim changed; kubelet retries this ADD, which succeeds once that host is gone",
                        format_mac(&other),
                        link.name
                    ),
                ))
            }
            Err(e) => {
                return Err(CniError::datapath(format!(
                    "cannot run the {how} for {ip} from {:?}: {e}",
                    link.name
                )))
            }
        }
    }
    Ok(())
}

/// After probed addresses are bound: gratuitous ARPs, so peers move to the
/// new MAC now (the link was already up when they were added, so the
/// kernel's arp_notify did not announce them). Best effort.
pub fn announce_addresses(nl: &mut dyn Netlink, link: &CreatedLink, ips: &[std::net::Ipv4Addr]) {
    let Some(mac) = link.mac else { return };
    for ip in ips {
        if let Err(e) = nl.arp_announce(link.index, mac, *ip) {
            log::warn(&format!("could not announce {ip} on {:?}: {e}", link.name));
        }
    }
}

/// The `gatewayCheck` option: each gateway must answer from the new link
/// (ARP for IPv4, a neighbour solicitation for IPv6), or the ADD fails
/// (code 11) saying so, instead of the pod starting on a network it cannot
/// leave.
pub fn check_gateways(
    nl: &mut dyn Netlink,
    link: &CreatedLink,
    ips: &[IpConfig],
    spec: super::arp::ProbeSpec,
) -> CniResult<()> {
    let Some(mac) = link.mac else { return Ok(()) };
    for ip in ips {
        let Some(gw) = ip.gateway else { continue };
        let answered = match (ip.address.addr(), gw) {
            (IpAddr::V4(ours), IpAddr::V4(gw4)) => nl
                .arp_resolve(link.index, mac, ours, gw4, spec)
                .map(|m| m.is_some()),
            (IpAddr::V6(_), IpAddr::V6(gw6)) => nl
                .ndp_resolve(link.index, mac, gw6, spec)
                .map(|m| m.is_some()),
            _ => continue,
        }
        .map_err(|e| {
            CniError::datapath(format!(
                "cannot check gateway {gw} from {:?}: {e}",
                link.name
            ))
        })?;
        if !answered {
            return Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!(
                    "gateway {gw} did not answer {} from {:?} ({}) within {} ms: check the master interface's VLAN, cabling and the gateway itself, or set \"gatewayCheck\": false",
                    if gw.is_ipv4() { "ARP" } else { "neighbour solicitation" },
                    link.name,
                    ip.address.addr(),
                    spec.interval.as_millis() * u128::from(spec.count.max(1))
                ),
            ));
        }
    }
    Ok(())
}

/// Waits out the kernel's IPv6 duplicate address detection on the bound
/// addresses; dadfailed is code 11.
pub fn settle_ipv6(nl: &mut dyn Netlink, link: &CreatedLink) -> CniResult<()> {
    settle_addresses(nl, link, true)
}

/// DEL: removes `ifname` from the pod netns; already gone is success.
/// DEL's link work: the interface, and any macvlan an ADD that died
/// between creating and renaming it left under a temporary name (such a
/// link would otherwise stay in a live pod until its netns goes).
pub fn remove_link(nl: &mut dyn Netlink, ifname: &str) -> CniResult<()> {
    let mut doomed: Vec<LinkState> = nl
        .links(Ns::Pod)
        .map_err(datapath)?
        .into_iter()
        .filter(|l| l.name == ifname || is_our_leftover(l))
        .collect();
    // The interface first: it is what the caller is waiting for.
    doomed.sort_by_key(|l| l.name != ifname);
    let mut errors = Vec::new();
    for link in doomed {
        match nl.delete_link(Ns::Pod, link.index) {
            Ok(()) => {}
            Err(e) if e.is_no_device() => {}
            Err(e) => errors.push(CniError::datapath(format!(
                "cannot delete {:?} from the pod netns: {e}",
                link.name
            ))),
        }
    }
    CniError::combine(errors).map_or(Ok(()), Err)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::fake::FakeNetlink;

    fn fake() -> FakeNetlink {
        FakeNetlink::new()
            .with_device(Ns::Node, "uplink0", 1500)
            .with_default_route(Ns::Node, "uplink0")
    }

    #[test]
    fn del_removes_the_interface_and_leftovers_of_a_killed_add_only() {
        let mut nl = fake().with_device(Ns::Pod, "eth0", 1500);
        let master = resolve_master(&mut nl, Some("uplink0"), false, 0).unwrap();
        create_link(&mut nl, "net1", "t", &master, &spec()).unwrap();
        // An ADD killed between create and rename left its temporary name.
        let leftover = NewMacvlan {
            tmp_name: tmp_name(),
            master_index: master.index,
            master_ns: master.ns,
            mode: MacvlanMode::Bridge,
            mtu: None,
            mac: None,
            bc_queue_len: None,
        };
        nl.create_macvlan(&leftover).unwrap();
        remove_link(&mut nl, "net1").unwrap();
        assert!(nl.link(Ns::Pod, "net1").is_none());
        assert!(nl.link(Ns::Pod, &leftover.tmp_name).is_none());
        assert!(nl.link(Ns::Pod, "eth0").is_some());
        // Idempotent: nothing left to remove is not an error.
        remove_link(&mut nl, "net1").unwrap();
    }

    #[test]
    fn a_retried_add_replaces_only_its_own_interface() {
        let mut nl = fake();
        let master = resolve_master(&mut nl, Some("uplink0"), false, 0).unwrap();
        let mine = owner_alias("c1", "net1");
        let first = create_link(&mut nl, "net1", &mine, &master, &spec()).unwrap();
        // Another attachment's retry leaves it alone, and is refused.
        replace_own_leftover(&mut nl, "net1", &owner_alias("c2", "net1")).unwrap();
        assert!(create_link(&mut nl, "net1", "other", &master, &spec()).is_err());
        assert_eq!(nl.link(Ns::Pod, "net1").unwrap().state.index, first.index);
        // The same attachment's retry replaces it.
        replace_own_leftover(&mut nl, "net1", &mine).unwrap();
        let again = create_link(&mut nl, "net1", &mine, &master, &spec()).unwrap();
        assert_ne!(again.index, first.index);
        assert_eq!(owner_alias(&"x".repeat(400), "net1").len(), 255);
    }

    #[test]
    fn only_our_temporary_names_count_as_leftovers() {
        let state = |name: &str, kind: Option<&str>| LinkState {
            index: 1,
            name: name.into(),
            mtu: 1500,
            mac: None,
            kind: kind.map(String::from),
            macvlan_mode: None,
            up: false,
            alias: None,
        };
        assert!(is_our_leftover(&state("smv0a1b2c3d", Some("macvlan"))));
        for (name, kind) in [
            ("smv0a1b2c3d", Some("veth")),
            ("smv0a1b2c3d", None),
            ("smv0a1b2c3", Some("macvlan")),
            ("smvzzzzzzzz", Some("macvlan")),
            ("net1", Some("macvlan")),
        ] {
            assert!(!is_our_leftover(&state(name, kind)), "{name} {kind:?}");
        }
    }

    fn spec() -> LinkSpec {
        LinkSpec {
            mode: MacvlanMode::Bridge,
            mtu: 0,
            mac: None,
            bc_queue_len: None,
        }
    }

    fn ip(s: &str, gw: Option<&str>) -> IpConfig {
        IpConfig {
            interface: Some(0),
            address: s.parse().unwrap(),
            gateway: gw.map(|g| g.parse().unwrap()),
        }
    }

    #[test]
    fn sticky_macs_are_local_unicast_and_follow_the_address() {
        let a = sticky_mac("fabric", "172.31.59.2".parse().unwrap());
        assert_eq!(a[0] & 0x03, 0x02, "locally administered, unicast");
        assert_eq!(&a[2..], &[172, 31, 59, 2]);
        assert_eq!(a, sticky_mac("fabric", "172.31.59.2".parse().unwrap()));
        assert_ne!(a, sticky_mac("fabric", "172.31.59.3".parse().unwrap()));
        assert_ne!(a, sticky_mac("other", "172.31.59.2".parse().unwrap()));
        let v6 = sticky_mac("fabric", "fd00::1:2".parse().unwrap());
        assert_eq!(&v6[2..], &[0, 1, 0, 2]);
    }

    #[test]
    fn master_from_config_or_default_route() {
        let mut nl = fake();
        assert_eq!(
            resolve_master(&mut nl, Some("uplink0"), false, 0)
                .unwrap()
                .name,
            "uplink0"
        );
        assert_eq!(
            resolve_master(&mut nl, None, false, 1500).unwrap().name,
            "uplink0"
        );
    }

    #[test]
    fn master_errors_are_config_errors_naming_the_master() {
        let mut nl = fake();
        let e = resolve_master(&mut nl, Some("nope0"), false, 0).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("\"nope0\""));
        let e = resolve_master(&mut nl, Some("uplink0"), false, 1501).unwrap_err();
        assert!(
            e.msg.contains("1501") && e.msg.contains("1500"),
            "{}",
            e.msg
        );
        let e = resolve_master(&mut nl, None, true, 0).unwrap_err();
        assert!(e.msg.contains("default route"), "{}", e.msg);
    }

    #[test]
    fn link_in_container_looks_in_the_pod() {
        let mut nl = FakeNetlink::new().with_device(Ns::Pod, "podup", 9000);
        let m = resolve_master(&mut nl, Some("podup"), true, 9000).unwrap();
        assert_eq!(m.ns, Ns::Pod);
        assert!(resolve_master(&mut nl, Some("podup"), false, 0).is_err());
    }

    #[test]
    fn create_renames_into_place() {
        let mut nl = fake();
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        assert_eq!(nl.link_names(Ns::Pod), vec!["net1"]);
        assert_eq!(link.name, "net1");
        let l = nl.link(Ns::Pod, "net1").unwrap();
        assert_eq!(l.state.mtu, 1500);
        assert!(!l.state.up, "a new link stays down until configured");
    }

    #[test]
    fn temp_name_clash_is_retried() {
        let mut nl = fake().fail("create_macvlan", libc::EEXIST);
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        let creates = nl
            .calls
            .iter()
            .filter(|c| c.starts_with("create_macvlan"))
            .count();
        assert_eq!(creates, 2);
    }

    #[test]
    fn existing_ifname_fails_and_leaves_nothing() {
        let mut nl = fake().with_device(Ns::Pod, "net1", 1500);
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let e = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap_err();
        assert!(e.msg.contains("already exists"), "{}", e.msg);
        assert_eq!(
            nl.link_names(Ns::Pod),
            vec!["net1"],
            "the temporary link is removed"
        );
    }

    #[test]
    fn create_failure_is_reported_with_master() {
        let mut nl = fake().fail("create_macvlan", libc::EPERM);
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let e = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap_err();
        assert_eq!(e.code, code::DATAPATH);
        assert!(e.msg.contains("uplink0"));
        assert!(nl.link_names(Ns::Pod).is_empty());
    }

    #[test]
    fn l3_config_uses_gateway_fallback_per_family() {
        let mut nl = fake();
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        let ips = [
            ip("10.0.0.5/24", Some("10.0.0.1")),
            ip("fd00::5/64", Some("fd00::1")),
        ];
        let routes = [
            Route::new("0.0.0.0/0".parse().unwrap(), None),
            Route::new(
                "10.9.0.0/16".parse().unwrap(),
                Some("10.0.0.254".parse().unwrap()),
            ),
            Route::new("::/0".parse().unwrap(), None),
        ];
        configure_l3(&mut nl, &link, &ips, &routes).unwrap();
        let added: Vec<_> = nl
            .calls
            .iter()
            .filter(|c| c.starts_with("add_route"))
            .cloned()
            .collect();
        assert_eq!(
            added,
            vec![
                format!("add_route Pod 0.0.0.0/0 via 10.0.0.1 dev {}", link.index),
                format!(
                    "add_route Pod 10.9.0.0/16 via 10.0.0.254 dev {}",
                    link.index
                ),
                format!("add_route Pod ::/0 via fd00::1 dev {}", link.index),
            ]
        );
        assert!(nl.link(Ns::Pod, "net1").unwrap().state.up);
        assert_eq!(
            nl.sysctls
                .get(&(Ns::Pod, "net/ipv4/conf/net1/arp_notify".into()))
                .map(String::as_str),
            Some("1")
        );
    }

    #[test]
    fn route_without_any_gateway_is_on_link() {
        let mut nl = fake();
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        configure_l3(
            &mut nl,
            &link,
            &[ip("10.0.0.5/24", None)],
            &[Route::new("10.8.0.0/16".parse().unwrap(), None)],
        )
        .unwrap();
        assert!(nl
            .calls
            .contains(&format!("add_route Pod 10.8.0.0/16 dev {}", link.index)));
    }

    #[test]
    fn ipv6_is_enabled_when_disabled() {
        let mut nl = fake();
        nl.sysctls.insert(
            (Ns::Pod, "net/ipv6/conf/lo/disable_ipv6".into()),
            "1".into(),
        );
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        configure_l3(&mut nl, &link, &[ip("fd00::5/64", None)], &[]).unwrap();
        assert_eq!(
            nl.sysctls[&(Ns::Pod, "net/ipv6/conf/lo/disable_ipv6".into())],
            "0"
        );
    }

    #[test]
    fn sysctl_failures_do_not_fail_the_add() {
        let mut nl = fake().fail("write_sysctl", libc::EACCES);
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        configure_l3(&mut nl, &link, &[ip("10.0.0.5/24", None)], &[]).unwrap();
    }

    #[test]
    fn address_failure_is_named_and_discard_removes_link() {
        let mut nl = fake().fail("add_address", libc::EINVAL);
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        let e = configure_l3(&mut nl, &link, &[ip("10.0.0.5/24", None)], &[]).unwrap_err();
        assert!(e.msg.contains("10.0.0.5/24"), "{}", e.msg);
        discard_link(&mut nl, &link).unwrap();
        assert!(nl.link_names(Ns::Pod).is_empty());
    }

    #[test]
    fn remove_is_idempotent() {
        let mut nl = fake();
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        remove_link(&mut nl, "net1").unwrap();
        remove_link(&mut nl, "net1").unwrap();
        assert!(nl.link_names(Ns::Pod).is_empty());
    }

    #[test]
    fn remove_reports_real_failures() {
        let mut nl = fake();
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        let mut nl = nl.fail("delete_link", libc::EBUSY);
        let e = remove_link(&mut nl, "net1").unwrap_err();
        assert!(e.msg.contains("net1"));
    }

    fn configured() -> (FakeNetlink, CreatedLink, Vec<Route>) {
        let mut nl = fake();
        let m = resolve_master(&mut nl, None, false, 0).unwrap();
        let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
        let routes = vec![Route::new("0.0.0.0/0".parse().unwrap(), None)];
        configure_l3(
            &mut nl,
            &link,
            &[ip("10.0.0.5/24", Some("10.0.0.1"))],
            &routes,
        )
        .unwrap();
        (nl, link, routes)
    }

    #[test]
    fn check_passes_on_what_add_built() {
        let (mut nl, link, routes) = configured();
        let mac = link.mac_string();
        let want = Expected {
            ifname: "net1",
            mode: MacvlanMode::Bridge,
            mac: mac.as_deref(),
            ips: vec!["10.0.0.5/24".parse().unwrap()],
            routes: &routes,
        };
        check_link(&mut nl, &want).unwrap();
    }

    #[test]
    fn check_catches_each_kind_of_drift() {
        let (mut nl, link, routes) = configured();
        let mac = link.mac_string();
        let base = || Expected {
            ifname: "net1",
            mode: MacvlanMode::Bridge,
            mac: mac.as_deref(),
            ips: vec!["10.0.0.5/24".parse().unwrap()],
            routes: &routes,
        };
        let other_routes = [Route::new("10.7.0.0/16".parse().unwrap(), None)];
        let cases: Vec<(Expected, &str)> = vec![
            (
                Expected {
                    ifname: "net9",
                    ..base()
                },
                "not in the pod netns",
            ),
            (
                Expected {
                    mode: MacvlanMode::Vepa,
                    ..base()
                },
                "mode bridge",
            ),
            (
                Expected {
                    mac: Some("02:00:00:00:00:99"),
                    ..base()
                },
                "has MAC",
            ),
            (
                Expected {
                    ips: vec!["10.0.0.6/24".parse().unwrap()],
                    ..base()
                },
                "10.0.0.6/24",
            ),
            (
                Expected {
                    routes: &other_routes,
                    ..base()
                },
                "10.7.0.0/16",
            ),
        ];
        for (want, needle) in cases {
            let e = check_link(&mut nl, &want).unwrap_err();
            assert_eq!(e.code, code::CHECK_MISMATCH);
            assert!(e.msg.contains(needle), "{} lacks {needle}", e.msg);
        }
    }
}
