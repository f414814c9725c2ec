//! A packet socket bound to one interface, in the calling thread's netns:
//! what the ARP probe and the IPv6 DAD probe share. Frames we send are
//! told apart from the wire's by packet type, not by MAC (a sticky MAC is
//! the old holder's too).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use super::Mac;

/// The last OS error, prefixed with what was being done.
pub(super) fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// poll(2)'s timeout for `left`, rounded up: rounded down, the deadline
/// would be met by a second, 1 ms poll that sleeps a whole timer tick.
fn poll_ms(left: std::time::Duration) -> i32 {
    i32::try_from(left.as_micros().div_ceil(1000).max(1)).unwrap_or(i32::MAX)
}

/// Waits until `fd` is readable (true) or `until` has passed (false).
pub(super) fn readable_before(fd: &OwnedFd, until: Instant) -> io::Result<bool> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
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

pub(super) struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
    /// The ethertype, host order.
    protocol: u16,
}

impl PacketSocket {
    /// A datagram packet socket for `protocol` bound to `ifindex`.
    ///
    /// Created for no protocol and given it by bind(2): a socket created
    /// with one is hooked to every interface at once, and the bind that
    /// narrows it to ours must then wait out an RCU grace period (8-30 ms
    /// measured here, per socket); hooked first at bind, it costs none, and
    /// it never sees another interface's frames.
    pub(super) fn open(ifindex: u32, protocol: u16) -> io::Result<PacketSocket> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(last_error(&format!(
                "open a packet socket for ethertype {protocol:#06x}"
            )));
        }
        // SAFETY: `raw` is a fresh, valid descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let ifindex = i32::try_from(ifindex).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "interface index too large")
        })?;
        let sock = PacketSocket {
            fd,
            ifindex,
            protocol,
        };
        let addr = sock.address(&[0; 6]);
        // SAFETY: bind(2) with a sockaddr_ll of the right size.
        let rc = unsafe {
            libc::bind(
                sock.fd.as_raw_fd(),
                std::ptr::addr_of!(addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last_error("bind the packet socket to the interface"));
        }
        Ok(sock)
    }

    /// Every multicast frame on the link reaches this socket while it is
    /// open (the interface is put in all-multicast mode for it).
    pub(super) fn receive_all_multicast(&self) -> io::Result<()> {
        // SAFETY: packet_mreq is plain old data; all-zero is valid.
        let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
        mreq.mr_ifindex = self.ifindex;
        mreq.mr_type = libc::PACKET_MR_ALLMULTI as u16;
        // SAFETY: setsockopt(2) with a packet_mreq of the right size.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                std::ptr::addr_of!(mreq).cast(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last_error("receive multicast on the interface"));
        }
        Ok(())
    }

    fn address(&self, dest: &Mac) -> libc::sockaddr_ll {
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
        let mut a: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        a.sll_family = libc::AF_PACKET as u16;
        a.sll_protocol = self.protocol.to_be();
        a.sll_ifindex = self.ifindex;
        a.sll_halen = 6;
        a.sll_addr[..6].copy_from_slice(dest);
        a
    }

    /// Sends `payload` (the frame's contents after the Ethernet header) to `dest`.
    pub(super) fn send(&self, payload: &[u8], dest: &Mac, what: &str) -> io::Result<()> {
        let to = self.address(dest);
        // SAFETY: sendto(2) with a valid buffer and sockaddr_ll.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                payload.as_ptr().cast(),
                payload.len(),
                0,
                std::ptr::addr_of!(to).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(last_error(what));
        }
        Ok(())
    }

    /// The next frame from the wire into `buf` (our own outgoing frames
    /// are skipped): its length and sender's MAC, or None once `until` has
    /// passed.
    pub(super) fn receive(
        &self,
        buf: &mut [u8],
        until: Instant,
    ) -> io::Result<Option<(usize, Mac)>> {
        loop {
            if !readable_before(&self.fd, until)? {
                return Ok(None);
            }
            if let Some(frame) = self.try_receive(buf)? {
                return Ok(Some(frame));
            }
        }
    }

    /// A frame from the wire already queued on the socket, without
    /// waiting (our own outgoing frames are skipped): its length and
    /// sender's MAC, or None when none is queued.
    pub(super) fn try_receive(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Mac)>> {
        loop {
            // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: recvfrom(2) into buffers we own, of the stated lengths.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    std::ptr::addr_of_mut!(from).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let mut sender = [0u8; 6];
            sender.copy_from_slice(&from.sll_addr[..6]);
            return Ok(Some((usize::try_from(n).unwrap_or(0), sender)));
        }
    }

    pub(super) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `until` has passed: whether
/// each is readable (all false at the deadline).
pub(super) fn readable_any_before(fds: &[i32], until: Instant) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: *fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || pfds.is_empty() {
            return Ok(vec![false; fds.len()]);
        }
        let ms = poll_ms(left);
        let n = libc::nfds_t::try_from(pfds.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: poll(2) on a slice of valid pollfds of the stated length.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), n, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(pfds.iter().map(|p| p.revents != 0).collect());
    }
}
