//! A userspace frame relay that plays netem's part: this kernel has no
//! netem (`CONFIG_NET_SCH_NETEM` is not set: `tc qdisc add dev X root
//! netem loss 5%` answers `Error: Specified qdisc kind is unknown.`) and
//! no gact either, so loss and delay are made here. One thread, entered
//! into the relay netns, reads every frame arriving on either veth of a
//! pair with an AF_PACKET socket and sends it out of the other after
//! `delay`, dropping each frame (in both directions, independently) with
//! probability `loss`. Bounded: it stops when told or at `max_run`.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the link does to each frame, each way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairment {
    /// Probability in [0, 1] that a frame is dropped.
    pub loss: f64,
    /// One-way delay added to every frame kept.
    pub delay: Duration,
}

/// What a relay did, for the table's honesty column: frames the kernel
/// dropped on our sockets (overflow) would be loss we did not choose.
#[derive(Debug, Default, Clone, Copy)]
pub struct RelayStats {
    pub forwarded: u64,
    pub dropped: u64,
    pub socket_drops: u64,
}

pub struct Relay {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<RelayStats, String>>>,
}

impl Relay {
    /// Starts relaying between each pair of interfaces in `netns`.
    pub fn start(
        netns: &str,
        pairs: &[(String, String)],
        link: Impairment,
        seed: u64,
        max_run: Duration,
    ) -> Relay {
        let stop = Arc::new(AtomicBool::new(false));
        let (netns, pairs, flag) = (netns.to_string(), pairs.to_vec(), stop.clone());
        // The thread reports whether its sockets opened before it relays.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            sticky_e2e::enter_netns(&netns);
            let sockets = open_pairs(&pairs);
            let _ = ready_tx.send(sockets.as_ref().map(|_| ()).map_err(Clone::clone));
            run(&sockets?, link, seed, &flag, Instant::now() + max_run)
        });
        // Frames sent before the sockets exist would be lost unmeasured.
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("the relay cannot start: {e}"),
            Err(_) => panic!("the relay thread died before it was ready"),
        }
        Relay {
            stop,
            handle: Some(handle),
        }
    }

    pub fn stop(mut self) -> RelayStats {
        self.stop.store(true, Ordering::SeqCst);
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(Ok(stats))) => stats,
            Some(Ok(Err(e))) => panic!("the relay failed: {e}"),
            _ => panic!("the relay thread panicked"),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// splitmix64: a tiny, seeded generator, so every frame's fate is
/// independent and a run can be repeated.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

fn os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// A raw packet socket on `ifname` (in this thread's netns) that sees
/// every frame, with a large receive buffer so a burst is not lost in it.
fn open_raw(ifname: &str) -> Result<OwnedFd, String> {
    let name = std::ffi::CString::new(ifname).map_err(|e| e.to_string())?;
    // SAFETY: if_nametoindex reads a NUL-terminated string we own.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(os_error(&format!("find interface {ifname}")));
    }
    let all = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); the fd is owned right away.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(all)) };
    if raw < 0 {
        return Err(os_error("open a raw packet socket"));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size: i32 = 8 << 20;
    // SAFETY: setsockopt(2) with a c_int of the right size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            std::ptr::addr_of!(size).cast(),
            4,
        )
    };
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = all;
    addr.sll_ifindex = i32::try_from(index).map_err(|e| e.to_string())?;
    // SAFETY: bind(2) with a sockaddr_ll of the right size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(os_error(&format!("bind a packet socket to {ifname}")));
    }
    Ok(fd)
}

/// Both ends of every pair; socket 2k and 2k+1 relay to each other.
fn open_pairs(pairs: &[(String, String)]) -> Result<Vec<OwnedFd>, String> {
    let mut out = Vec::new();
    for (a, b) in pairs {
        out.push(open_raw(a)?);
        out.push(open_raw(b)?);
    }
    Ok(out)
}

/// Frames the kernel dropped on `fd` for want of buffer space.
fn kernel_drops(fd: &OwnedFd) -> u64 {
    // SAFETY: tpacket_stats is plain old data; all-zero is valid.
    let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: getsockopt(2) into a struct of the stated size.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            std::ptr::addr_of_mut!(st).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        u64::from(st.tp_drops)
    } else {
        0
    }
}

fn run(
    sockets: &[OwnedFd],
    link: Impairment,
    seed: u64,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<RelayStats, String> {
    let mut rng = Rng(seed);
    let mut stats = RelayStats::default();
    // (when due, the socket to send on, the frame): one delay for all,
    // so the queue is in order of due time.
    let mut queue: VecDeque<(Instant, usize, Vec<u8>)> = VecDeque::new();
    let mut pfds: Vec<libc::pollfd> = sockets
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        let wait = queue
            .front()
            .map(|(due, _, _)| due.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_millis(20))
            .min(Duration::from_millis(20));
        let ms = i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(20);
        // SAFETY: poll(2) on our pollfds, of the stated length.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(os_error("poll the relay's sockets"));
        }
        for (i, p) in pfds.iter_mut().enumerate() {
            if p.revents == 0 {
                continue;
            }
            p.revents = 0;
            loop {
                // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
                let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                // SAFETY: recvfrom(2) into buffers we own, of the stated lengths.
                let n = unsafe {
                    libc::recvfrom(
                        p.fd,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                        std::ptr::addr_of_mut!(from).cast(),
                        &mut len,
                    )
                };
                let Ok(n) = usize::try_from(n) else { break };
                // Our own sends on this port come back as outgoing: not
                // frames from the wire.
                if from.sll_pkttype == libc::PACKET_OUTGOING {
                    continue;
                }
                if rng.chance(link.loss) {
                    stats.dropped += 1;
                    continue;
                }
                queue.push_back((Instant::now() + link.delay, i ^ 1, buf[..n].to_vec()));
            }
        }
        let now = Instant::now();
        while queue.front().is_some_and(|(due, _, _)| *due <= now) {
            let Some((_, to, frame)) = queue.pop_front() else {
                break;
            };
            // SAFETY: send(2) of a buffer we own on a bound packet socket.
            let rc = unsafe { libc::send(pfds[to].fd, frame.as_ptr().cast(), frame.len(), 0) };
            if rc < 0 {
                return Err(os_error("send a relayed frame"));
            }
            stats.forwarded += 1;
        }
    }
    stats.socket_drops = sockets.iter().map(kernel_drops).sum();
    Ok(stats)
}
