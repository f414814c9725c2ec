//! The wire: probes before an address the IPAM cannot prove free is
//! bound, announcements after, the sticky MAC, the gateway check.

use std::net::IpAddr;

use super::{datapath, CreatedLink};
use crate::cni::{code, CniError, CniResult, IpConfig, Refusal};
use crate::datapath::{format_mac, Mac, Netlink, Ns};
use crate::log;

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
/// link up without them and asks the wire for all of them at once (ARP
/// probe, RFC 5227; duplicate address detection, RFC 4862), so a
/// dual-stack ADD waits for one probe schedule, not one per family. An
/// answer from another MAC means a live host still uses the address,
/// whatever the store concluded: code 11 naming that address, and the
/// caller undoes the ADD.
pub fn probe_addresses(
    nl: &mut dyn Netlink,
    link: &CreatedLink,
    ips: &[IpAddr],
    spec: crate::datapath::arp::ProbeSpec,
) -> CniResult<()> {
    let Some(mac) = link.mac else {
        return Err(CniError::datapath(format!(
            "cannot probe from {:?}: its MAC is unknown",
            link.name
        )));
    };
    nl.set_link_up(Ns::Pod, link.index).map_err(datapath)?;
    match nl.probe_addresses(link.index, mac, ips, spec) {
        Ok(None) => Ok(()),
        Ok(Some((ip, other))) => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "{ip} is still answered on the wire by MAC {} ({} from {:?}): a live host uses it (for example the identity's pod on another node, or a partitioned node whose pod was deleted), so the address was not bound and no claim changed; kubelet retries this ADD, which succeeds once that host is gone",
                format_mac(&other),
                how(ip),
                link.name
            ),
        )
        .refused_as(Refusal::AnsweredOnWire)),
        Err(e) => Err(CniError::datapath(format!(
            "cannot run the {} from {:?}: {e}",
            ips.iter()
                .map(|ip| format!("{} for {ip}", how(*ip)))
                .collect::<Vec<_>>()
                .join(" and the "),
            link.name
        ))),
    }
}

/// What the wire check for `ip` is called in messages.
fn how(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "ARP probe"
    } else {
        "duplicate address detection"
    }
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
    spec: crate::datapath::arp::ProbeSpec,
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
