//! What one node's concurrent commands on a network tell each other
//! through its node-local record, now that its flock is not held across
//! API round trips:
//! - `Holds`: one writer per address on this node, from the intent it
//!   records to the mirror of what the API took (or the intent's undo).
//!   Without it a DEL and an ADD of one address could mirror in the
//!   reverse of the API's order, and the record would lose the holder the
//!   node's next DEL looks for.
//! - `Reservations`: a next-fit candidate another ADD on this node is
//!   trying is skipped, so 100 ADDs at once try 100 addresses, not one
//!   address 100 times. Only a hint: the lock create stays the check, and
//!   a reservation whose process is gone, or that is older than
//!   `RESERVATION_TTL`, counts for nothing.
//!
//! Both are files under the record (`holds/<ip>`, `inflight/<ip>`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::super::file::{claim_file_name, hash_name, lock_file};
use super::super::fsio::{make_dir, read_file, remove_file, write_atomic};
use super::super::StoreResult;
use crate::addr::to_u128;
use crate::claim::now_secs;

/// A reservation older than this is from a process that should have
/// finished: an ADD's requests are bounded well below it.
pub const RESERVATION_TTL: Duration = Duration::from_secs(120);

/// The flocks on the addresses a commit writes, held until dropped.
pub struct Holds {
    _files: Vec<File>,
}

impl Holds {
    /// Takes the hold on each of `ips` under `root`, in address order (so
    /// two commits wanting the same pair cannot wait for each other).
    pub fn take(root: &Path, network: &str, ips: &BTreeSet<IpAddr>) -> StoreResult<Holds> {
        let dir = root.join("holds");
        if !ips.is_empty() {
            make_dir(&dir)?;
        }
        let mut held = Vec::with_capacity(ips.len());
        for ip in ips {
            held.push(lock_file(
                &dir.join(claim_file_name(*ip)),
                &format!("address {ip} of network {network:?} on this node"),
            )?);
        }
        Ok(Holds { _files: held })
    }

    /// The hold on one attachment of this node (`holds/attachment-<hash>`).
    pub fn attachment(
        root: &Path,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> StoreResult<Holds> {
        let dir = root.join("holds");
        make_dir(&dir)?;
        let name = format!("attachment-{}", hash_name(&[container_id, ifname]));
        let file = lock_file(
            &dir.join(name),
            &format!("attachment {container_id}/{ifname} of network {network:?} on this node"),
        )?;
        Ok(Holds { _files: vec![file] })
    }
}

/// One store's reservations of next-fit candidates, removed when it is
/// dropped.
#[derive(Debug)]
pub struct Reservations {
    dir: PathBuf,
    mine: BTreeMap<IpAddr, Reservation>,
}

impl Reservations {
    pub fn new(root: &Path) -> Reservations {
        Reservations {
            dir: root.join("inflight"),
            mine: BTreeMap::new(),
        }
    }

    /// Whether another live ADD on this node is trying `ip`; if not, `ip`
    /// is reserved for this one. Call with the record's flock held, so two
    /// processes cannot both find it free.
    pub fn taken_by_another(&mut self, ip: IpAddr) -> StoreResult<bool> {
        if self.mine.contains_key(&ip) {
            return Ok(false);
        }
        let path = self.dir.join(claim_file_name(ip));
        if let Some(bytes) = read_file(&path)? {
            if let Some(other) = Reservation::decode(&bytes) {
                if other.counts(now_secs(), pid_alive) {
                    return Ok(true);
                }
            }
        }
        make_dir(&self.dir)?;
        let mine = Reservation::new();
        write_atomic(&path, mine.encode().as_bytes(), false)?;
        self.mine.insert(ip, mine);
        Ok(false)
    }
}

impl Drop for Reservations {
    /// Best effort: one left behind counts for nothing once its process
    /// is gone. A reservation another store has taken since (ours had
    /// expired) is not ours to remove.
    fn drop(&mut self) {
        for (ip, mine) in std::mem::take(&mut self.mine) {
            let path = self.dir.join(claim_file_name(ip));
            let still_ours = read_file(&path)
                .ok()
                .flatten()
                .and_then(|b| Reservation::decode(&b))
                .is_some_and(|r| r == mine);
            if still_ours {
                let _ = remove_file(&path);
            }
        }
    }
}

/// Who reserved a candidate: the process, which of its stores, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pid: u32,
    store: u64,
    since: u64,
}

impl Reservation {
    fn new() -> Reservation {
        static STORES: AtomicU64 = AtomicU64::new(0);
        Reservation {
            pid: std::process::id(),
            store: STORES.fetch_add(1, Ordering::Relaxed),
            since: now_secs(),
        }
    }

    fn encode(&self) -> String {
        format!("{} {} {}\n", self.pid, self.store, self.since)
    }

    fn decode(bytes: &[u8]) -> Option<Reservation> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut words = text.split_whitespace();
        let pid = words.next()?.parse().ok()?;
        let store = words.next()?.parse().ok()?;
        let since = words.next()?.parse().ok()?;
        Some(Reservation { pid, store, since })
    }

    /// Whether another store's reservation still keeps candidates off the
    /// address at `now`.
    fn counts(&self, now: u64, alive: impl Fn(u32) -> bool) -> bool {
        now.saturating_sub(self.since) < RESERVATION_TTL.as_secs() && alive(self.pid)
    }
}

/// Which of two next-fit positions is farther along the walk that
/// started after `base` (None: from the start): the cursor a commit
/// leaves. ADDs that ran at once finish in any order, and one that
/// finished last must not move the cursor back onto addresses the others
/// just took (the next ADD would collide on each).
pub fn farther_along(base: Option<IpAddr>, a: IpAddr, b: IpAddr) -> IpAddr {
    let start = base.map_or(0, |ip| to_u128(ip).wrapping_add(1));
    let gone = |ip: IpAddr| to_u128(ip).wrapping_sub(start);
    if gone(b) > gone(a) {
        b
    } else {
        a
    }
}

/// Whether a process with this pid exists in our pid namespace. One in
/// another namespace looks gone: its reservation is ignored, which costs a
/// lock collision, never a duplicate.
fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_counts_only_while_its_process_lives_and_it_is_recent() {
        let r = Reservation {
            pid: 7,
            store: 0,
            since: 1_000,
        };
        let ttl = RESERVATION_TTL.as_secs();
        let cases = [
            ("a live process, just now", 1_000, true, true),
            ("its process is gone", 1_000, false, false),
            ("older than the ttl", 1_000 + ttl, true, false),
            ("just under the ttl", 1_000 + ttl - 1, true, true),
            ("a clock that went back", 900, true, true),
        ];
        for (what, now, alive, want) in cases {
            assert_eq!(r.counts(now, |_| alive), want, "{what}");
        }
    }

    #[test]
    fn the_cursor_left_is_the_one_farthest_along_the_walk() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let cases = [
            (
                "both after the base",
                Some("10.0.0.10"),
                "10.0.0.12",
                "10.0.0.11",
                "10.0.0.12",
            ),
            (
                "the other order",
                Some("10.0.0.10"),
                "10.0.0.11",
                "10.0.0.12",
                "10.0.0.12",
            ),
            (
                "one wrapped round",
                Some("10.0.0.18"),
                "10.0.0.19",
                "10.0.0.10",
                "10.0.0.10",
            ),
            (
                "both wrapped",
                Some("10.0.0.18"),
                "10.0.0.11",
                "10.0.0.10",
                "10.0.0.11",
            ),
            ("no base yet", None, "10.0.0.3", "10.0.0.9", "10.0.0.9"),
            (
                "the same",
                Some("10.0.0.1"),
                "10.0.0.5",
                "10.0.0.5",
                "10.0.0.5",
            ),
            ("v6", Some("fd00::ff"), "fd00::1", "fd00::100", "fd00::1"),
        ];
        for (what, base, a, b, want) in cases {
            assert_eq!(
                farther_along(base.map(ip), ip(a), ip(b)),
                ip(want),
                "{what}"
            );
        }
    }

    #[test]
    fn a_reservation_reads_back_and_garbage_is_none() {
        let r = Reservation {
            pid: 42,
            store: 3,
            since: 1_700_000_000,
        };
        assert_eq!(Reservation::decode(r.encode().as_bytes()), Some(r));
        for bad in ["", "42", "42 3", "x 1 2", "42 y 2", "42 3 z", "\u{0}"] {
            assert_eq!(Reservation::decode(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn two_stores_never_reserve_one_candidate_and_drop_frees_it() {
        let root = std::env::temp_dir().join(format!("sticky-inflight-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        let (mut ours, mut theirs) = (Reservations::new(&root), Reservations::new(&root));
        assert!(!ours.taken_by_another(ip).unwrap());
        assert!(!ours.taken_by_another(ip).unwrap(), "our own reservation");
        assert!(theirs.taken_by_another(ip).unwrap(), "another store's");
        // A reservation whose process is gone counts for nothing.
        let dead = Reservation {
            pid: u32::MAX,
            store: 0,
            since: now_secs(),
        };
        let next: IpAddr = "10.0.0.10".parse().unwrap();
        let next_path = root.join("inflight").join("10.0.0.10");
        write_atomic(&next_path, dead.encode().as_bytes(), false).unwrap();
        assert!(!theirs.taken_by_another(next).unwrap());
        drop(ours);
        assert!(!root.join("inflight").join("10.0.0.9").exists(), "dropped");
        assert!(!theirs.taken_by_another(ip).unwrap(), "free once dropped");
        assert!(next_path.exists(), "still theirs");
        drop(theirs);
        assert!(!next_path.exists() && !root.join("inflight/10.0.0.9").exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    /// FIRST is held; a second taker (`take` in another thread) must wait
    /// until FIRST is dropped, then get its hold.
    fn second_waits_for(first: Holds, take: impl FnOnce() -> StoreResult<Holds> + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _ = tx.send(take().map(|_| ()));
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "the second went ahead while the first held"
        );
        drop(first);
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("handed over");
        assert!(got.is_ok(), "{got:?}");
        waiter.join().unwrap();
    }

    #[test]
    fn a_hold_waits_for_the_writer_before_it() {
        let root = std::env::temp_dir().join(format!("sticky-holds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pair: BTreeSet<IpAddr> = ["10.0.0.1", "fd00::1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let first = Holds::take(&root, "net", &pair).unwrap();
        let r = root.clone();
        second_waits_for(first, move || Holds::take(&r, "net", &pair));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn one_command_at_a_time_per_attachment_and_none_between_two() {
        let root = std::env::temp_dir().join(format!("sticky-attach-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let add = Holds::attachment(&root, "net", "c1", "net1").unwrap();
        // Another attachment of the node is not kept waiting.
        drop(Holds::attachment(&root, "net", "c2", "net1").unwrap());
        let r = root.clone();
        second_waits_for(add, move || Holds::attachment(&r, "net", "c1", "net1"));
        let _ = std::fs::remove_dir_all(&root);
    }
}
