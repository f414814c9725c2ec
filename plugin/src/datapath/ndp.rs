//! IPv6 neighbour discovery: the gateway check (a neighbour solicitation
//! for the gateway to its solicited-node multicast group, hop limit 255,
//! our MAC as source link-layer option, and the matching advertisement),
//! and duplicate address detection before an address is bound (RFC 4862
//! section 5.4: a solicitation from the unspecified address; any
//! advertisement for the address, or another host's DAD solicitation for
//! it, means it is in use). Packets are built and read by pure functions;
//! `resolve_here` and `conflict::probe_all_here` (DAD, sent with the ARP
//! probes of the same ADD) do the socket work on the calling thread, which
//! must be in the pod netns (the `NsWorker`). A packet socket sees DAD's
//! answer whatever the kernel's IPv6 state of the link, and tells us the
//! sender; in all-multicast mode, advertisements to all-nodes and other
//! hosts' probes reach it.

use std::io;
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use super::arp::ProbeSpec;
use super::packet::{last_error, readable_before};
use super::Mac;

const NEIGHBOUR_SOLICITATION: u8 = 135;
const NEIGHBOUR_ADVERTISEMENT: u8 = 136;
const OPT_SOURCE_LLADDR: u8 = 1;
const OPT_TARGET_LLADDR: u8 = 2;

/// ff02::1:ffXX:XXXX for `target`.
pub fn solicited_node(target: Ipv6Addr) -> Ipv6Addr {
    let o = target.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The ICMPv6 message (checksum left 0: the kernel fills it in for raw
/// ICMPv6 sockets).
pub fn solicitation(ours: Mac, target: Ipv6Addr) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0] = NEIGHBOUR_SOLICITATION;
    b[8..24].copy_from_slice(&target.octets());
    b[24] = OPT_SOURCE_LLADDR;
    b[25] = 1;
    b[26..32].copy_from_slice(&ours);
    b
}

/// The MAC an advertisement gives for `target` (from its target
/// link-layer option; a bare NA still proves the target answered).
pub fn advertised(msg: &[u8], target: Ipv6Addr) -> Option<Option<Mac>> {
    if msg.len() < 24 || msg[0] != NEIGHBOUR_ADVERTISEMENT || msg[8..24] != target.octets() {
        return None;
    }
    let mut opts = &msg[24..];
    while opts.len() >= 8 {
        let len = usize::from(opts[1]) * 8;
        if len == 0 || len > opts.len() {
            break;
        }
        if opts[0] == OPT_TARGET_LLADDR && len >= 8 {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&opts[2..8]);
            return Some(Some(mac));
        }
        opts = &opts[len..];
    }
    Some(None)
}

pub(super) const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_ICMPV6: u8 = 58;
const IPV6_HEADER: usize = 40;

/// The MAC an IPv6 multicast group is sent to (RFC 2464 section 7).
pub fn multicast_mac(group: Ipv6Addr) -> Mac {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// The ICMPv6 checksum over the pseudo-header and `msg` (RFC 4443).
fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let hi = u32::from(pair[0]) << 8;
            let lo = pair.get(1).map_or(0, |b| u32::from(*b));
            sum += hi | lo;
        }
    };
    add(&src.octets());
    add(&dst.octets());
    let len = u32::try_from(msg.len()).unwrap_or(u32::MAX);
    add(&len.to_be_bytes());
    add(&[0, 0, 0, IPPROTO_ICMPV6]);
    add(msg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A DAD probe: the whole IPv6 packet of a neighbour solicitation for
/// `target` from the unspecified address to its solicited-node group,
/// without a source link-layer option (RFC 4861 section 4.3 forbids one
/// from ::).
pub fn dad_solicitation(target: Ipv6Addr) -> [u8; IPV6_HEADER + 24] {
    let dst = solicited_node(target);
    let mut icmp = [0u8; 24];
    icmp[0] = NEIGHBOUR_SOLICITATION;
    icmp[8..24].copy_from_slice(&target.octets());
    let sum = icmpv6_checksum(Ipv6Addr::UNSPECIFIED, dst, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut p = [0u8; IPV6_HEADER + 24];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&24u16.to_be_bytes());
    p[6] = IPPROTO_ICMPV6;
    p[7] = 255;
    // Source :: stays zero.
    p[24..40].copy_from_slice(&dst.octets());
    p[IPV6_HEADER..].copy_from_slice(&icmp);
    p
}

/// Whether an IPv6 packet from the wire says `target` is in use: an
/// advertisement for it, or another host's DAD solicitation for it (both
/// of us probing at once). Returns the MAC it names, falling back to the
/// frame's sender `from`.
pub fn dad_conflict(packet: &[u8], target: Ipv6Addr, from: Mac) -> Option<Mac> {
    if packet.len() < IPV6_HEADER + 24 || packet[0] >> 4 != 6 || packet[6] != IPPROTO_ICMPV6 {
        return None;
    }
    let icmp = &packet[IPV6_HEADER..];
    match icmp[0] {
        NEIGHBOUR_ADVERTISEMENT => advertised(icmp, target).map(|mac| mac.unwrap_or(from)),
        NEIGHBOUR_SOLICITATION => {
            let from_unspecified = packet[8..24].iter().all(|b| *b == 0);
            (from_unspecified && icmp[8..24] == target.octets()).then_some(from)
        }
        _ => None,
    }
}

fn set_int(fd: &OwnedFd, level: i32, name: i32, value: i32, what: &str) -> io::Result<()> {
    // SAFETY: setsockopt(2) with a c_int option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(last_error(what));
    }
    Ok(())
}

/// Solicits `target` from interface `ifindex` up to `spec.count` times
/// `spec.interval` apart: whether it answered, and with which MAC.
pub fn resolve_here(
    ifindex: u32,
    ours: Mac,
    target: Ipv6Addr,
    spec: ProbeSpec,
) -> io::Result<Option<Option<Mac>>> {
    // SAFETY: plain socket(2); the fd is owned right away.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET6,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMPV6,
        )
    };
    if raw < 0 {
        return Err(last_error("open an ICMPv6 socket"));
    }
    // SAFETY: `raw` is a fresh, valid descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let index = i32::try_from(ifindex)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index too large"))?;
    // Neighbour discovery demands hop limit 255 (RFC 4861 section 7.1).
    set_int(
        &fd,
        libc::IPPROTO_IPV6,
        libc::IPV6_MULTICAST_HOPS,
        255,
        "set the hop limit",
    )?;
    set_int(
        &fd,
        libc::IPPROTO_IPV6,
        libc::IPV6_UNICAST_HOPS,
        255,
        "set the hop limit",
    )?;
    set_int(
        &fd,
        libc::IPPROTO_IPV6,
        libc::IPV6_MULTICAST_IF,
        index,
        "choose the interface",
    )?;
    // SAFETY: sockaddr_in6 is plain old data; all-zero is valid.
    let mut to: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    to.sin6_family = libc::AF_INET6 as u16;
    to.sin6_addr.s6_addr = solicited_node(target).octets();
    to.sin6_scope_id = ifindex;
    let ns = solicitation(ours, target);
    for _ in 0..spec.count.max(1) {
        // SAFETY: sendto(2) with a valid buffer and sockaddr_in6.
        let rc = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                ns.as_ptr().cast(),
                ns.len(),
                0,
                std::ptr::addr_of!(to).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(last_error("send a neighbour solicitation"));
        }
        let until = Instant::now() + spec.interval;
        while readable_before(&fd, until)? {
            let mut buf = [0u8; 256];
            // SAFETY: recv(2) into a buffer we own, of the stated length.
            let n = unsafe {
                libc::recv(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            let Ok(len) = usize::try_from(n) else {
                continue;
            };
            if let Some(mac) = advertised(&buf[..len], target) {
                return Ok(Some(mac));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
#[path = "ndp_tests.rs"]
mod tests;
