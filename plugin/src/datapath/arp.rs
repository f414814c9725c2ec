//! IPv4 address conflict detection (RFC 5227) and announcement, for an
//! address taken over from another holder: before binding it, ARP probes
//! (sender IP 0.0.0.0) ask whether anyone still uses it; any ARP from
//! another MAC that claims it (a reply, its own announcement, or a probe
//! for the same address) means the old holder may be alive. After the
//! address is up, gratuitous ARPs move peers' caches to the new MAC.
//!
//! Packets are built and judged by pure functions; `probe_here` and
//! `announce_here` do the socket work on the calling thread, which must be
//! in the pod netns (the `NsWorker`).

use std::io;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::Mac;

const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IP: u16 = 0x0800;
const BROADCAST: Mac = [0xff; 6];

/// How hard to look before taking an address over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeSpec {
    /// Probes sent; 0 turns probing off.
    pub count: u32,
    /// Between probes, and how long to listen after the last one.
    pub interval: Duration,
}

impl Default for ProbeSpec {
    /// 3 probes 100 ms apart and 100 ms of listening after the last:
    /// 300 ms added to a takeover, well inside an RTT on a LAN segment
    /// even for a busy host (RFC 5227's 1-2 s spacing is for hosts that
    /// have no other evidence; ours comes after the store judged the old
    /// holder dead).
    fn default() -> ProbeSpec {
        ProbeSpec {
            count: 3,
            interval: Duration::from_millis(100),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpMessage {
    pub op: u16,
    pub sender_mac: Mac,
    pub sender_ip: Ipv4Addr,
    pub target_mac: Mac,
    pub target_ip: Ipv4Addr,
}

impl ArpMessage {
    /// An RFC 5227 probe: "who has `ip`?", from nobody (0.0.0.0).
    pub fn probe(mac: Mac, ip: Ipv4Addr) -> ArpMessage {
        ArpMessage {
            op: ARP_REQUEST,
            sender_mac: mac,
            sender_ip: Ipv4Addr::UNSPECIFIED,
            target_mac: [0; 6],
            target_ip: ip,
        }
    }

    /// A gratuitous ARP announcing that `ip` is at `mac`.
    pub fn announcement(mac: Mac, ip: Ipv4Addr) -> ArpMessage {
        ArpMessage {
            op: ARP_REQUEST,
            sender_mac: mac,
            sender_ip: ip,
            target_mac: [0; 6],
            target_ip: ip,
        }
    }

    /// The 28-byte ARP payload for Ethernet/IPv4.
    pub fn encode(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[0..2].copy_from_slice(&1u16.to_be_bytes());
        b[2..4].copy_from_slice(&ETH_P_IP.to_be_bytes());
        b[4] = 6;
        b[5] = 4;
        b[6..8].copy_from_slice(&self.op.to_be_bytes());
        b[8..14].copy_from_slice(&self.sender_mac);
        b[14..18].copy_from_slice(&self.sender_ip.octets());
        b[18..24].copy_from_slice(&self.target_mac);
        b[24..28].copy_from_slice(&self.target_ip.octets());
        b
    }

    pub fn decode(b: &[u8]) -> Option<ArpMessage> {
        if b.len() < 28
            || b[0..2] != 1u16.to_be_bytes()
            || b[2..4] != ETH_P_IP.to_be_bytes()
            || b[4] != 6
            || b[5] != 4
        {
            return None;
        }
        let mac = |r: std::ops::Range<usize>| -> Mac {
            let mut m = [0u8; 6];
            m.copy_from_slice(&b[r]);
            m
        };
        let ip = |at: usize| Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]);
        Some(ArpMessage {
            op: u16::from_be_bytes([b[6], b[7]]),
            sender_mac: mac(8..14),
            sender_ip: ip(14),
            target_mac: mac(18..24),
            target_ip: ip(24),
        })
    }
}

/// The MAC of the host that `msg`, received from the wire, shows using or
/// wanting `ip` (RFC 5227 section 2.1.1), if any. The sender's MAC may be
/// ours: with `stickyMac` the old holder has the same one, which is why
/// our own frames are told apart by packet type, not by MAC.
pub fn conflicting_mac(msg: &ArpMessage, ip: Ipv4Addr) -> Option<Mac> {
    let claims_it = msg.sender_ip == ip && (msg.op == ARP_REPLY || msg.op == ARP_REQUEST);
    let probes_it =
        msg.op == ARP_REQUEST && msg.sender_ip == Ipv4Addr::UNSPECIFIED && msg.target_ip == ip;
    (claims_it || probes_it).then_some(msg.sender_mac)
}

/// The MAC `msg` gives for `target`, if it is `target`'s reply.
pub fn answer_from(msg: &ArpMessage, target: Ipv4Addr) -> Option<Mac> {
    (msg.op == ARP_REPLY && msg.sender_ip == target).then_some(msg.sender_mac)
}

/// Waits until `fd` has something to read (true) or `until` passes
/// (false); shared by the ARP and neighbour-discovery sockets.
pub(super) fn readable_before(fd: &std::os::fd::OwnedFd, until: Instant) -> io::Result<bool> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(fd),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
        // SAFETY: poll(2) on one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(rc > 0);
    }
}

/// A packet socket for ARP bound to `ifindex`, in this thread's netns.
struct ArpSocket {
    fd: std::os::fd::OwnedFd,
    ifindex: i32,
}

/// The last OS error, prefixed with what was being done.
pub(super) fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl ArpSocket {
    fn open(ifindex: u32) -> io::Result<ArpSocket> {
        use std::os::fd::FromRawFd;
        let proto = (ETH_P_ARP).to_be() as i32;
        // SAFETY: plain socket(2); the fd is owned right away.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                proto,
            )
        };
        if raw < 0 {
            return Err(last_error("open an ARP packet socket"));
        }
        // SAFETY: `raw` is a fresh, valid descriptor nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let ifindex = i32::try_from(ifindex).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "interface index too large")
        })?;
        let sock = ArpSocket { fd, ifindex };
        let addr = sock.address(&[0; 6]);
        // SAFETY: bind(2) with a sockaddr_ll of the right size.
        let rc = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&sock.fd),
                std::ptr::addr_of!(addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last_error("bind the ARP socket to the interface"));
        }
        Ok(sock)
    }

    fn address(&self, dest: &Mac) -> libc::sockaddr_ll {
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
        let mut a: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        a.sll_family = libc::AF_PACKET as u16;
        a.sll_protocol = ETH_P_ARP.to_be();
        a.sll_ifindex = self.ifindex;
        a.sll_halen = 6;
        a.sll_addr[..6].copy_from_slice(dest);
        a
    }

    fn send(&self, msg: &ArpMessage) -> io::Result<()> {
        let payload = msg.encode();
        let to = self.address(&BROADCAST);
        // SAFETY: sendto(2) with a valid buffer and sockaddr_ll.
        let rc = unsafe {
            libc::sendto(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                payload.as_ptr().cast(),
                payload.len(),
                0,
                std::ptr::addr_of!(to).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(last_error("send an ARP packet"));
        }
        Ok(())
    }

    /// The next ARP message from the wire (our own outgoing frames are
    /// skipped), or None once `until` has passed.
    fn receive(&self, until: Instant) -> io::Result<Option<ArpMessage>> {
        loop {
            if !readable_before(&self.fd, until)? {
                return Ok(None);
            }
            let mut buf = [0u8; 128];
            // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: recvfrom(2) into buffers we own, of the stated lengths.
            let n = unsafe {
                libc::recvfrom(
                    std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    std::ptr::addr_of_mut!(from).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) {
                    continue;
                }
                return Err(e);
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let len = usize::try_from(n).unwrap_or(0);
            if let Some(msg) = ArpMessage::decode(&buf[..len]) {
                return Ok(Some(msg));
            }
        }
    }
}

/// Probes `ip` from the (up, address-less) interface `ifindex`; the MAC
/// of whoever answers, or None after `spec.count` probes and one interval
/// of silence.
pub fn probe_here(
    ifindex: u32,
    ours: Mac,
    ip: Ipv4Addr,
    spec: ProbeSpec,
) -> io::Result<Option<Mac>> {
    if spec.count == 0 {
        return Ok(None);
    }
    let sock = ArpSocket::open(ifindex)?;
    let probe = ArpMessage::probe(ours, ip);
    for _ in 0..spec.count {
        sock.send(&probe)?;
        let until = Instant::now() + spec.interval;
        while let Some(msg) = sock.receive(until)? {
            if let Some(mac) = conflicting_mac(&msg, ip) {
                return Ok(Some(mac));
            }
        }
    }
    Ok(None)
}

/// Asks who has `target`, from `our_ip` at `ours`, up to `spec.count`
/// times `spec.interval` apart: the MAC that answers, or None.
pub fn resolve_here(
    ifindex: u32,
    ours: Mac,
    our_ip: Ipv4Addr,
    target: Ipv4Addr,
    spec: ProbeSpec,
) -> io::Result<Option<Mac>> {
    let sock = ArpSocket::open(ifindex)?;
    let request = ArpMessage {
        op: ARP_REQUEST,
        sender_mac: ours,
        sender_ip: our_ip,
        target_mac: [0; 6],
        target_ip: target,
    };
    for _ in 0..spec.count.max(1) {
        sock.send(&request)?;
        let until = Instant::now() + spec.interval;
        while let Some(msg) = sock.receive(until)? {
            if let Some(mac) = answer_from(&msg, target) {
                return Ok(Some(mac));
            }
        }
    }
    Ok(None)
}

/// Announces `ip` at `ours` with `count` gratuitous ARPs `interval` apart.
pub fn announce_here(
    ifindex: u32,
    ours: Mac,
    ip: Ipv4Addr,
    count: u32,
    interval: Duration,
) -> io::Result<()> {
    let sock = ArpSocket::open(ifindex)?;
    let msg = ArpMessage::announcement(ours, ip);
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(interval);
        }
        sock.send(&msg)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: Mac = [0x02, 0, 0, 0, 0, 1];
    const THEIRS: Mac = [0x02, 0, 0, 0, 0, 2];

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn packets_round_trip() {
        let p = ArpMessage::probe(OURS, ip("10.0.0.5"));
        let bytes = p.encode();
        assert_eq!(&bytes[0..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
        assert_eq!(
            &bytes[14..18],
            &[0, 0, 0, 0],
            "a probe's sender IP is 0.0.0.0"
        );
        assert_eq!(ArpMessage::decode(&bytes), Some(p));
        let a = ArpMessage::announcement(OURS, ip("10.0.0.5"));
        assert_eq!(a.sender_ip, a.target_ip);
        assert_eq!(ArpMessage::decode(&[0u8; 27]), None);
        let mut not_ipv4 = bytes;
        not_ipv4[3] = 0xdd;
        assert_eq!(ArpMessage::decode(&not_ipv4), None);
    }

    #[test]
    fn only_the_targets_reply_resolves_it() {
        let gw = ip("10.0.0.1");
        let reply = ArpMessage {
            op: ARP_REPLY,
            sender_mac: THEIRS,
            sender_ip: gw,
            target_mac: OURS,
            target_ip: ip("10.0.0.5"),
        };
        assert_eq!(answer_from(&reply, gw), Some(THEIRS));
        assert_eq!(answer_from(&reply, ip("10.0.0.2")), None);
        let request = ArpMessage {
            op: ARP_REQUEST,
            ..reply
        };
        assert_eq!(
            answer_from(&request, gw),
            None,
            "a request from the gateway is not an answer"
        );
    }

    #[test]
    fn what_counts_as_a_conflict() {
        let x = ip("10.0.0.5");
        let msg = |op, smac, sip: &str, tip: &str| ArpMessage {
            op,
            sender_mac: smac,
            sender_ip: ip(sip),
            target_mac: [0; 6],
            target_ip: ip(tip),
        };
        let cases = [
            (
                "reply from the old holder",
                msg(ARP_REPLY, THEIRS, "10.0.0.5", "0.0.0.0"),
                true,
            ),
            (
                "its own announcement",
                msg(ARP_REQUEST, THEIRS, "10.0.0.5", "10.0.0.5"),
                true,
            ),
            (
                "its request for someone else",
                msg(ARP_REQUEST, THEIRS, "10.0.0.5", "10.0.0.1"),
                true,
            ),
            (
                "another host probing the same address",
                msg(ARP_REQUEST, THEIRS, "0.0.0.0", "10.0.0.5"),
                true,
            ),
            (
                "the old holder with our (sticky) MAC",
                msg(ARP_REPLY, OURS, "10.0.0.5", "0.0.0.0"),
                true,
            ),
            (
                "someone asking for it (not using it)",
                msg(ARP_REQUEST, THEIRS, "10.0.0.9", "10.0.0.5"),
                false,
            ),
            (
                "unrelated traffic",
                msg(ARP_REPLY, THEIRS, "10.0.0.7", "10.0.0.9"),
                false,
            ),
        ];
        for (name, m, conflict) in cases {
            assert_eq!(conflicting_mac(&m, x).is_some(), conflict, "{name}");
        }
    }
}
