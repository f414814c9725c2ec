//! Addresses, up, routes, and the wait for IPv6 duplicate address
//! detection.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::{datapath, CreatedLink};
use crate::cni::{code, CniError, CniResult, IpConfig, Route};
use crate::datapath::{Netlink, NewRoute, Ns};
use crate::log;
use cni::fault;

/// How long an IPv6 address may stay tentative (DAD) before routes via a
/// gateway are added anyway; matches the reference plugin's wait.
const DAD_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
const DAD_POLL_INTERVAL: Duration = Duration::from_millis(20);

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

/// Waits out the kernel's IPv6 duplicate address detection on the bound
/// addresses; dadfailed is code 11.
pub fn settle_ipv6(nl: &mut dyn Netlink, link: &CreatedLink) -> CniResult<()> {
    settle_addresses(nl, link, true)
}
