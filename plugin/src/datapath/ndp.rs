//! IPv6 neighbour discovery for the gateway check: a neighbour
//! solicitation for the gateway (to its solicited-node multicast group,
//! hop limit 255, our MAC as source link-layer option) and the matching
//! advertisement. Packets are built and read by pure functions;
//! `resolve_here` does the socket work on the calling thread, which must
//! be in the pod netns (the `NsWorker`).

use std::io;
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use super::arp::{last_error, ProbeSpec};
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
        while super::arp::readable_before(&fd, until)? {
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
mod tests {
    use super::*;

    #[test]
    fn solicitations_and_advertisements() {
        let gw: Ipv6Addr = "fd00:213::1".parse().unwrap();
        assert_eq!(
            solicited_node(gw),
            "ff02::1:ff00:1".parse::<Ipv6Addr>().unwrap()
        );
        let odd: Ipv6Addr = "fd00::ab:cdef".parse().unwrap();
        assert_eq!(
            solicited_node(odd),
            "ff02::1:ffab:cdef".parse::<Ipv6Addr>().unwrap()
        );
        let ns = solicitation([2, 0, 0, 0, 0, 1], gw);
        assert_eq!(ns[0], 135);
        assert_eq!(&ns[8..24], &gw.octets());
        assert_eq!(&ns[24..32], &[1, 1, 2, 0, 0, 0, 0, 1]);
        let mut na = [0u8; 32];
        na[0] = 136;
        na[4] = 0x60; // solicited, override
        na[8..24].copy_from_slice(&gw.octets());
        na[24] = 2;
        na[25] = 1;
        na[26..32].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        assert_eq!(advertised(&na, gw), Some(Some([2, 0, 0, 0, 0, 9])));
        assert_eq!(
            advertised(&na[..24], gw),
            Some(None),
            "an NA without the option still answers"
        );
        assert_eq!(advertised(&na, "fd00:213::2".parse().unwrap()), None);
        assert_eq!(advertised(&ns, gw), None, "a solicitation is not an answer");
        let mut bad = na;
        bad[25] = 0; // a zero-length option must not loop
        assert_eq!(advertised(&bad, gw), Some(None));
    }
}
