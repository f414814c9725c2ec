//! Address conflict detection for all of an ADD's addresses at once: an
//! ARP probe (RFC 5227) for each IPv4 address and duplicate address
//! detection (RFC 4862) for each IPv6 one, sent in the same rounds and
//! heard on one poll(2), so a dual-stack takeover waits for one schedule,
//! not one per family.
//!
//! Each address has its own packet socket, so a frame is only ever judged
//! against the address whose socket heard it (`judge`); the packet judges
//! themselves are `arp::conflicting_mac` and `ndp::dad_conflict`.
//! `probe_all_here` does the socket work on the calling thread, which must
//! be in the pod netns (the `NsWorker`), or in the benchmark's prober netns.

use std::io;
use std::net::IpAddr;
use std::time::Instant;

use super::arp::{conflicting_mac, ArpMessage, ProbeSpec, ETH_P_ARP};
use super::ndp::{dad_conflict, dad_solicitation, multicast_mac, solicited_node, ETH_P_IPV6};
use super::packet::{readable_any_before, PacketSocket};
use super::Mac;

const BROADCAST: Mac = [0xff; 6];

/// When `probe_all_here` may stop listening before its rounds are over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// At the first address a host answers for: ADD refuses on it, so the
    /// rest need not wait (what the plugin ships).
    FirstConflict,
    /// Once every address was answered for: each address's own verdict,
    /// for the benchmark that counts a schedule's misses per address.
    EveryAddress,
}

/// The ethertype a socket for `ip` listens to.
pub fn ethertype(ip: IpAddr) -> u16 {
    match ip {
        IpAddr::V4(_) => ETH_P_ARP,
        IpAddr::V6(_) => ETH_P_IPV6,
    }
}

/// Whether `frame` (the payload after the Ethernet header, from `sender`),
/// heard on the socket probing `ip`, shows another host using `ip`: its
/// MAC. An ARP socket only judges ARP, an IPv6 socket only IPv6, so a v6
/// frame never counts against a v4 address.
pub fn judge(ip: IpAddr, frame: &[u8], sender: Mac) -> Option<Mac> {
    match ip {
        IpAddr::V4(v4) => ArpMessage::decode(frame).and_then(|m| conflicting_mac(&m, v4)),
        IpAddr::V6(v6) => dad_conflict(frame, v6, sender),
    }
}

/// The first address, in the order given, that another host answered for,
/// and its MAC: ADD names that one, whichever socket heard first.
pub fn first_conflict(ips: &[IpAddr], heard: &[Option<Mac>]) -> Option<(IpAddr, Mac)> {
    ips.iter()
        .zip(heard)
        .find_map(|(ip, mac)| mac.map(|m| (*ip, m)))
}

/// Whether `until` is reached with the answers `heard` so far.
pub fn done(until: Until, heard: &[Option<Mac>]) -> bool {
    match until {
        Until::FirstConflict => heard.iter().any(Option::is_some),
        Until::EveryAddress => !heard.is_empty() && heard.iter().all(Option::is_some),
    }
}

/// One address's probe: its socket and the frame it sends each round.
struct Probe {
    ip: IpAddr,
    sock: PacketSocket,
    packet: Vec<u8>,
    to: Mac,
}

impl Probe {
    fn open(ifindex: u32, ours: Mac, ip: IpAddr) -> io::Result<Probe> {
        let sock = PacketSocket::open(ifindex, ethertype(ip))?;
        let (packet, to) = match ip {
            IpAddr::V4(v4) => (ArpMessage::probe(ours, v4).encode().to_vec(), BROADCAST),
            IpAddr::V6(v6) => {
                // Advertisements go to all-nodes and other hosts' probes
                // to the solicited-node group: the socket must hear both.
                sock.receive_all_multicast()?;
                (
                    dad_solicitation(v6).to_vec(),
                    multicast_mac(solicited_node(v6)),
                )
            }
        };
        Ok(Probe {
            ip,
            sock,
            packet,
            to,
        })
    }

    fn send(&self) -> io::Result<()> {
        let what = if self.ip.is_ipv4() {
            "send an ARP probe"
        } else {
            "send a DAD neighbour solicitation"
        };
        self.sock.send(&self.packet, &self.to, what)
    }

    /// Every frame queued on the socket, judged: the conflicting MAC of
    /// the first that shows the address in use.
    fn drain(&self, buf: &mut [u8]) -> io::Result<Option<Mac>> {
        while let Some((len, sender)) = self.sock.try_receive(buf)? {
            if let Some(mac) = judge(self.ip, &buf[..len], sender) {
                return Ok(Some(mac));
            }
        }
        Ok(None)
    }
}

/// Probes every address in `ips` from the up, address-less interface
/// `ifindex` at once: `spec.count` rounds `spec.interval` apart, each
/// round one probe per address not yet answered for, then one poll on all
/// sockets until the round's deadline. An answer to an earlier round still
/// counts in a later one. Returns, per address, the MAC of a host using
/// it (None: nothing heard), stopping early as `until` says. A count of 0
/// probes nothing.
pub fn probe_all_here(
    ifindex: u32,
    ours: Mac,
    ips: &[IpAddr],
    spec: ProbeSpec,
    until: Until,
) -> io::Result<Vec<Option<Mac>>> {
    let mut heard: Vec<Option<Mac>> = vec![None; ips.len()];
    if spec.count == 0 || ips.is_empty() {
        return Ok(heard);
    }
    let probes = ips
        .iter()
        .map(|ip| Probe::open(ifindex, ours, *ip))
        .collect::<io::Result<Vec<_>>>()?;
    let listened = listen(&probes, &mut heard, spec, until);
    close_later(probes);
    listened.map(|()| heard)
}

/// Closing a packet socket waits out an RCU grace period (8-30 ms
/// measured here, each): the verdict is known, so the sockets are closed
/// on a thread of their own while ADD goes on (if no thread can be had,
/// dropping the closure closes them here).
fn close_later(probes: Vec<Probe>) {
    let _ = std::thread::Builder::new()
        .name("close-probes".into())
        .spawn(move || drop(probes));
}

/// The rounds: each sends every unanswered address's probe, then polls
/// all their sockets until the round's deadline.
fn listen(
    probes: &[Probe],
    heard: &mut [Option<Mac>],
    spec: ProbeSpec,
    until: Until,
) -> io::Result<()> {
    let mut buf = [0u8; 1500];
    for _ in 0..spec.count {
        for (p, h) in probes.iter().zip(heard.iter()) {
            if h.is_none() {
                p.send()?;
            }
        }
        let deadline = Instant::now() + spec.interval;
        loop {
            let waiting: Vec<usize> = (0..probes.len()).filter(|i| heard[*i].is_none()).collect();
            let fds: Vec<i32> = waiting.iter().map(|i| probes[*i].sock.raw_fd()).collect();
            let ready = readable_any_before(&fds, deadline)?;
            if !ready.iter().any(|r| *r) {
                break;
            }
            for (i, r) in waiting.iter().zip(ready) {
                if r {
                    heard[*i] = probes[*i].drain(&mut buf)?;
                }
            }
            if done(until, heard) {
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "conflict_tests.rs"]
mod tests;
