//! IPv4 address conflict detection (RFC 5227) and announcement, for an
//! address taken over from another holder: before binding it, ARP probes
//! (sender IP 0.0.0.0) ask whether anyone still uses it; any ARP from
//! another MAC that claims it (a reply, its own announcement, or a probe
//! for the same address) means the old holder may be alive. After the
//! address is up, gratuitous ARPs move peers' caches to the new MAC.
//!
//! Packets are built and judged by pure functions; `conflict::probe_all_here`
//! (the probe, for all of an ADD's addresses at once), `resolve_here` and
//! `announce_here` do the socket work on the calling thread, which must be
//! in the pod netns (the `NsWorker`).

use std::io;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::packet::PacketSocket;
use super::Mac;

const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;
pub(super) const ETH_P_ARP: u16 = 0x0806;
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
    /// 6 probes 20 ms apart, listening 20 ms after the last: 120 ms for
    /// all of an ADD's addresses at once, chosen from
    /// BENCHMARKS.md section 9 (a live holder behind
    /// a relay that drops each frame, each way, and delays it; at 5 % loss
    /// and 0-2 ms, 0 misses in 42,240 trials per family, the same as 7
    /// probes, and the 20 ms a seventh costs is what keeps a takeover's ADD
    /// under 150 ms). A holder is
    /// missed when every round loses its probe or its answer, 1 - (1 - p)^2
    /// per round, so the count decides the miss rate and the spacing only
    /// needs to exceed the round trip: at 5 % loss 3 probes miss about 1 in
    /// 1,000 however far apart (RFC 5227's 1-2 s spacing buys nothing on a
    /// LAN), 6 about 1 in 10^6 by that model, and 4 of the 6 are still
    /// answered in time at a 40 ms round trip (measured there: 6 misses in
    /// 42,240, which is why such a fabric is told to raise the interval). A slower or lossier fabric
    /// raises `probe.count`/`probe.intervalMs`.
    fn default() -> ProbeSpec {
        ProbeSpec {
            count: 6,
            interval: Duration::from_millis(20),
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

/// A packet socket for ARP bound to `ifindex`, in this thread's netns.
struct ArpSocket(PacketSocket);

impl ArpSocket {
    fn open(ifindex: u32) -> io::Result<ArpSocket> {
        PacketSocket::open(ifindex, ETH_P_ARP).map(ArpSocket)
    }

    fn send(&self, msg: &ArpMessage) -> io::Result<()> {
        self.0.send(&msg.encode(), &BROADCAST, "send an ARP packet")
    }

    /// The next ARP message from the wire, or None once `until` has passed.
    fn receive(&self, until: Instant) -> io::Result<Option<ArpMessage>> {
        let mut buf = [0u8; 128];
        while let Some((len, _)) = self.0.receive(&mut buf, until)? {
            if let Some(msg) = ArpMessage::decode(&buf[..len]) {
                return Ok(Some(msg));
            }
        }
        Ok(None)
    }
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
#[path = "arp_tests.rs"]
mod tests;
