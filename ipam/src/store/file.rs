//! The embedded store: one directory per network, readable by a person.
//!
//! ```text
//! <dir>/<network>/lock                 flock: one writer per network
//! <dir>/<network>/claims/<ip>          the claim (JSON): the source of truth
//! <dir>/<network>/identities/<hash>    identity -> its addresses (index)
//! <dir>/<network>/holders/<hash>       containerID/ifname -> addresses (index)
//! <dir>/<network>/cursor.<set>         next-fit position per range set
//! ```
//!
//! Crash safety: every record is written to a temporary file, fsynced and
//! renamed over the old one, so a record is old or new, never torn. Index
//! entries are made durable *before* the claim they point to, and every
//! index read is checked against the claims, so an index may be stale but
//! never missing a claim: that is what keeps one address per identity
//! (I2) across a crash without scanning all claims on each ADD.
//! Which fsyncs and why: a grant (a new claim or a new holder) fsyncs its
//! identity entry and that directory, then the claim and its directory,
//! before ADD answers: stickiness must survive a power loss. Holder entries
//! are not fsynced: a power loss is the only way to lose one, and every
//! holder it could name is then from an earlier boot, dead to liveness.
//! A release (DEL, GC) does not: if a power loss undoes it, the claim comes
//! back naming a holder from an earlier boot, which liveness finds dead.
//! Cursors are never fsynced: they only spread allocations.
//! Identities and container IDs are untrusted; they only reach the file
//! system as SHA-256 hashes. Files are 0600, directories 0700, and no
//! record is opened through a symlink.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{StoreError, StoreResult};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::fsio::{
    damaged, decode, encode, fsync_dir, io_err, make_dir, read_file, remove_file, write_atomic,
};
use super::{ClaimStore, Damaged, Listing, Plan};
use crate::claim::Claim;

/// How long an ADD waits for another process holding the network's lock.
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

pub(super) const CLAIMS: &str = "claims";
const IDENTITIES: &str = "identities";
const HOLDERS: &str = "holders";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct IdentityIndex {
    identity: String,
    ips: Vec<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct HolderIndex {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
    ips: Vec<IpAddr>,
}

pub(super) fn hash_name(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(p.as_bytes());
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The claim file name for an address (`10.0.0.5`, `fd00::5`).
pub fn claim_file_name(ip: IpAddr) -> String {
    ip.to_string()
}

/// One network's directory, held under its lock for the life of the value.
pub struct FileStore {
    root: PathBuf,
    _lock: File,
    /// false only for bulk loads that end with `sync`: import, bench seeding.
    durable: bool,
}

impl FileStore {
    /// Opens (creating if needed) `dir/network` and takes its lock.
    pub fn open(dir: &Path, network: &str) -> StoreResult<FileStore> {
        let root = dir.join(network);
        if let Ok(meta) = std::fs::symlink_metadata(&root) {
            if meta.file_type().is_symlink() {
                return Err(StoreError::Io(format!(
                    "store directory {} is a symlink: sticky-ipam does not follow symlinks out of its state directory; replace it with a directory",
                    root.display()
                )));
            }
        }
        for sub in [CLAIMS, IDENTITIES, HOLDERS] {
            make_dir(&root.join(sub))?;
        }
        let lock = lock_file(
            &root.join("lock"),
            &format!("the claim store of network {network:?}"),
        )?;
        Ok(FileStore {
            root,
            _lock: lock,
            durable: true,
        })
    }

    /// Networks that have a directory under `dir`.
    pub fn networks(dir: &Path) -> StoreResult<Vec<String>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(io_err("list", dir, e)),
        };
        let mut out: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().join(CLAIMS).is_dir())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        out.sort();
        Ok(out)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Without durability, records are still written atomically (temp +
    /// rename) but not fsynced: for bulk loads that `sync` once at the end,
    /// and for releases, which a power loss may undo harmlessly. A kill -9
    /// loses nothing either way (the page cache survives the process).
    pub fn set_durable(&mut self, durable: bool) {
        self.durable = durable;
    }

    /// Flushes the file system holding the store (after a bulk load).
    pub fn sync(&self) -> StoreResult<()> {
        let dir = File::open(&self.root).map_err(|e| io_err("open", &self.root, e))?;
        // SAFETY: syncfs on a descriptor we own.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(io_err("sync", &self.root, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn claim_path(&self, ip: IpAddr) -> PathBuf {
        self.root.join(CLAIMS).join(claim_file_name(ip))
    }

    fn identity_path(&self, identity: &str) -> PathBuf {
        self.root.join(IDENTITIES).join(hash_name(&[identity]))
    }

    fn holder_path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.root
            .join(HOLDERS)
            .join(hash_name(&[container_id, ifname]))
    }

    fn cursor_path(&self, set: usize) -> PathBuf {
        self.root.join(format!("cursor.{set}"))
    }

    fn read_claim(&self, path: &Path, ip: IpAddr) -> StoreResult<Option<Claim>> {
        let Some(bytes) = read_file(path)? else {
            return Ok(None);
        };
        let claim: Claim = decode(path, &bytes)?;
        if claim.ip != ip {
            return Err(damaged(
                path,
                format!("it names {} but is stored as {ip}", claim.ip),
            ));
        }
        Ok(Some(claim))
    }

    fn read_identity_index(&self, identity: &str) -> StoreResult<IdentityIndex> {
        let path = self.identity_path(identity);
        let Some(bytes) = read_file(&path)? else {
            return Ok(IdentityIndex {
                identity: identity.into(),
                ips: vec![],
            });
        };
        let index: IdentityIndex = decode(&path, &bytes)?;
        if index.identity != identity {
            return Err(damaged(
                &path,
                format!("it indexes identity {:?}", index.identity),
            ));
        }
        Ok(index)
    }

    fn read_holder_index(&self, container_id: &str, ifname: &str) -> StoreResult<HolderIndex> {
        let path = self.holder_path(container_id, ifname);
        let empty = HolderIndex {
            container_id: container_id.into(),
            ifname: ifname.into(),
            ips: vec![],
        };
        let Some(bytes) = read_file(&path)? else {
            return Ok(empty);
        };
        let index: HolderIndex = decode(&path, &bytes)?;
        if index.container_id != container_id || index.ifname != ifname {
            return Err(damaged(&path, "it indexes another attachment"));
        }
        Ok(index)
    }

    fn update_identity(
        &self,
        identity: &str,
        add: &BTreeSet<IpAddr>,
        remove: &BTreeSet<IpAddr>,
        durable: bool,
    ) -> StoreResult<bool> {
        let index = self.read_identity_index(identity)?;
        let path = self.identity_path(identity);
        edit_index(&path, index, |i| &mut i.ips, add, remove, durable)
    }

    fn update_holder(
        &self,
        holder: &(String, String),
        add: &BTreeSet<IpAddr>,
        remove: &BTreeSet<IpAddr>,
        durable: bool,
    ) -> StoreResult<bool> {
        let index = self.read_holder_index(&holder.0, &holder.1)?;
        let path = self.holder_path(&holder.0, &holder.1);
        edit_index(&path, index, |i| &mut i.ips, add, remove, durable)
    }

    /// Rewrites every index from the claims (after damage or an import).
    pub fn rebuild_indexes(&mut self) -> StoreResult<Listing> {
        let listing = self.list()?;
        for sub in [IDENTITIES, HOLDERS] {
            let dir = self.root.join(sub);
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.filter_map(Result::ok) {
                    remove_file(&e.path())?;
                }
            }
        }
        let mut by_identity: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
        let mut by_holder: BTreeMap<(String, String), BTreeSet<IpAddr>> = BTreeMap::new();
        for c in &listing.claims {
            by_identity.entry(&c.identity).or_default().insert(c.ip);
            if let Some(h) = &c.holder {
                by_holder
                    .entry((h.container_id.clone(), h.ifname.clone()))
                    .or_default()
                    .insert(c.ip);
            }
        }
        let none = BTreeSet::new();
        for (id, ips) in &by_identity {
            self.update_identity(id, ips, &none, true)?;
        }
        for (h, ips) in &by_holder {
            self.update_holder(h, ips, &none, true)?;
        }
        fsync_dir(&self.root.join(IDENTITIES))?;
        fsync_dir(&self.root.join(HOLDERS))?;
        Ok(listing)
    }

    /// Removes a damaged or foreign file from the claims directory.
    /// Removes one record by the name a damage report gave: a claim's
    /// file name, or `identities/NAME` / `holders/NAME` for an index.
    pub fn remove_record(&mut self, name: &str) -> StoreResult<()> {
        let (dir, file) = match name.split_once('/') {
            None => (CLAIMS, name),
            Some((dir, file)) if [CLAIMS, IDENTITIES, HOLDERS].contains(&dir) => (dir, file),
            Some(_) => ("", ""),
        };
        if file.is_empty() || file.contains('/') || file.starts_with('.') {
            return Err(StoreError::Invalid(format!(
                "{name:?} is not a record of this store: give a claim's file name (an address) or identities/NAME or holders/NAME, as `sticky-macvlan claims` and the damage report name it"
            )));
        }
        let is_claim = dir == CLAIMS;
        let dir = self.root.join(dir);
        let path = dir.join(file);
        if read_file(&path)?.is_none() {
            return Err(StoreError::Invalid(format!(
                "there is no record {name:?} in {}",
                self.root.display()
            )));
        }
        if let Some(ip) = file.parse::<IpAddr>().ok().filter(|_| is_claim) {
            // Only a damaged claim is this command's: a readable one has a
            // holder or identity whose release is a judgement (I7).
            if let Ok(Some(claim)) = self.read_claim(&path, ip) {
                return Err(StoreError::Invalid(format!(
                    "record {name:?} is a readable claim of identity {:?}, not a damaged one: release it with `sticky-macvlan release --ip {ip}`, which checks its holder and keeps its address probed before it is bound again",
                    claim.identity
                )));
            }
            // Its holder is unknown: the address stays, marked, as a
            // tombstone an exhausted pool reclaims with a probe.
            let now = crate::claim::now_secs();
            let stone = Claim {
                ip,
                identity: format!("damaged:{ip}"),
                sticky: false,
                holder: None,
                owner: None,
                namespace: None,
                created: now,
                updated: now,
                unconfirmed: Some(crate::claim::Unconfirmed {
                    since: now,
                    why: "its damaged record was removed by `release --file`, with its holder unknown".into(),
                }),
            };
            return write_atomic(&path, &encode(&stone), true);
        }
        remove_file(&path)?;
        fsync_dir(&dir)
    }
}

/// Adds and removes addresses in one index file (removing the file once it
/// lists none); returns whether anything was written.
fn edit_index<T: Serialize>(
    path: &Path,
    mut index: T,
    ips: fn(&mut T) -> &mut Vec<IpAddr>,
    add: &BTreeSet<IpAddr>,
    remove: &BTreeSet<IpAddr>,
    durable: bool,
) -> StoreResult<bool> {
    let list = ips(&mut index);
    let before = list.clone();
    list.retain(|ip| !remove.contains(ip));
    list.extend(add.iter().filter(|ip| !before.contains(ip)));
    if *list == before {
        return Ok(false);
    }
    if list.is_empty() {
        remove_file(path)?;
    } else {
        write_atomic(path, &encode(&index), durable)?;
    }
    Ok(true)
}

fn try_lock(lock: &File, path: &Path) -> StoreResult<bool> {
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) || err.kind() == ErrorKind::Interrupted {
        return Ok(false);
    }
    Err(io_err("lock", path, err))
}

/// Opens (creating, never through a symlink) the lock file at `path` and
/// takes its flock, held until the file is closed: `what` names what it
/// guards in the error an operator sees.
pub(super) fn lock_file(path: &Path, what: &str) -> StoreResult<File> {
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io_err("open lock file", path, e))?;
    lock_exclusive(&lock, path, what)?;
    Ok(lock)
}

/// Takes the lock of `what` (a network's store, one of its addresses),
/// waiting at most `LOCK_WAIT`. Uncontended, it is one non-blocking flock. Contended, a helper thread blocks in flock
/// on a duplicate of the descriptor (the lock belongs to the shared open
/// file, so it is ours once taken), and the kernel wakes waiters in turn:
/// polling with sleeps made 100 parallel ADDs queue up behind the sleeps.
fn lock_exclusive(lock: &File, path: &Path, what: &str) -> StoreResult<()> {
    if try_lock(lock, path)? {
        return Ok(());
    }
    let waiter = lock.try_clone().map_err(|e| io_err("lock", path, e))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || loop {
        // SAFETY: flock on a descriptor this thread owns.
        let rc = unsafe { libc::flock(waiter.as_raw_fd(), libc::LOCK_EX) };
        let err = std::io::Error::last_os_error();
        if rc == 0 || err.kind() != ErrorKind::Interrupted {
            // Closed before the answer: the lock stays with the store's
            // descriptor, and the store's drop alone releases it.
            drop(waiter);
            let _ = tx.send(if rc == 0 { Ok(()) } else { Err(err) });
            return;
        }
    });
    match rx.recv_timeout(LOCK_WAIT) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(io_err("lock", path, e)),
        // The helper stays blocked; the lock it may still take dies with
        // this short-lived process.
        Err(_) => Err(StoreError::Busy(format!(
            "{what} ({}) has been locked by another process for {} s: retry; if it persists, look for a hung sticky-ipam process",
            path.display(),
            LOCK_WAIT.as_secs()
        ))),
    }
}

impl ClaimStore for FileStore {
    fn claim(&mut self, ip: IpAddr) -> StoreResult<Option<Claim>> {
        self.read_claim(&self.claim_path(ip), ip)
    }

    fn claims_of_identity(&mut self, identity: &str) -> StoreResult<Vec<Claim>> {
        let index = self.read_identity_index(identity)?;
        let mut out = Vec::new();
        for ip in index.ips {
            if let Some(c) = self.claim(ip)? {
                if c.identity == identity {
                    out.push(c);
                }
            }
        }
        Ok(out)
    }

    fn claims_of_holder(&mut self, container_id: &str, ifname: &str) -> StoreResult<Vec<Claim>> {
        let index = self.read_holder_index(container_id, ifname)?;
        let mut out = Vec::new();
        for ip in index.ips {
            if let Some(c) = self.claim(ip)? {
                if c.held_by(container_id, ifname) {
                    out.push(c);
                }
            }
        }
        Ok(out)
    }

    fn list(&mut self) -> StoreResult<Listing> {
        let dir = self.root.join(CLAIMS);
        let entries = std::fs::read_dir(&dir).map_err(|e| io_err("list", &dir, e))?;
        let mut listing = Listing::default();
        for entry in entries {
            let entry = entry.map_err(|e| io_err("list", &dir, e))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let Ok(ip) = name.parse::<IpAddr>() else {
                listing.damaged.push(Damaged {
                    path,
                    why: "not a claim: its name is not an IP address".into(),
                });
                continue;
            };
            match self.read_claim(&path, ip) {
                Ok(Some(c)) => listing.claims.push(c),
                Ok(None) => {}
                Err(e) => listing.damaged.push(Damaged {
                    path,
                    why: e.message().to_string(),
                }),
            }
        }
        listing.claims.sort_by_key(|c| c.ip);
        Ok(listing)
    }

    fn cursor(&mut self, set: usize) -> StoreResult<Option<IpAddr>> {
        // A cursor only spreads allocations; an unreadable one restarts the walk.
        Ok(read_file(&self.cursor_path(set))?
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.trim().parse().ok()))
    }

    fn commit(&mut self, plan: &Plan) -> StoreResult<()> {
        type Edits = (BTreeSet<IpAddr>, BTreeSet<IpAddr>);
        let mut identities: BTreeMap<String, Edits> = BTreeMap::new();
        let mut holders: BTreeMap<(String, String), Edits> = BTreeMap::new();
        let holder_key = |c: &Claim| {
            c.holder
                .as_ref()
                .map(|h| (h.container_id.clone(), h.ifname.clone()))
        };
        for change in &plan.changes {
            if let Some(after) = &change.after {
                identities
                    .entry(after.identity.clone())
                    .or_default()
                    .0
                    .insert(after.ip);
                if let Some(h) = holder_key(after) {
                    holders.entry(h).or_default().0.insert(after.ip);
                }
            }
            if let Some(before) = &change.before {
                let same_ip = change.after.as_ref().is_some_and(|a| a.ip == before.ip);
                if !(same_ip
                    && change.after.as_ref().map(|a| &a.identity) == Some(&before.identity))
                {
                    identities
                        .entry(before.identity.clone())
                        .or_default()
                        .1
                        .insert(before.ip);
                }
                if let Some(h) = holder_key(before) {
                    if !(same_ip && change.after.as_ref().and_then(holder_key) == Some(h.clone())) {
                        holders.entry(h).or_default().1.insert(before.ip);
                    }
                }
            }
        }
        let none = BTreeSet::new();
        // 1. Identity entries for the new state, durable before the claims.
        // Holder entries are not fsynced: only a power loss can lose one,
        // and then every holder it could name is from an earlier boot, which
        // liveness finds dead whatever the index says.
        let mut wrote = false;
        for (id, (add, _)) in identities.iter().filter(|(_, e)| !e.0.is_empty()) {
            wrote |= self.update_identity(id, add, &none, self.durable)?;
        }
        for (h, (add, _)) in holders.iter().filter(|(_, e)| !e.0.is_empty()) {
            self.update_holder(h, add, &none, false)?;
        }
        if wrote && self.durable {
            fsync_dir(&self.root.join(IDENTITIES))?;
        }
        if wrote {
            cni::fault::point(cni::fault::ADD_IDENTITY_RECORDED);
        }
        // 2. The claims themselves.
        for change in &plan.changes {
            match (&change.before, &change.after) {
                (_, Some(after)) => {
                    write_atomic(&self.claim_path(after.ip), &encode(after), self.durable)?;
                    if let Some(before) = change.before.as_ref().filter(|b| b.ip != after.ip) {
                        remove_file(&self.claim_path(before.ip))?;
                    }
                }
                (Some(before), None) => remove_file(&self.claim_path(before.ip))?,
                (None, None) => {}
            }
        }
        if !plan.changes.is_empty() && self.durable {
            fsync_dir(&self.root.join(CLAIMS))?;
        }
        // 3. Stale index entries: harmless if a crash keeps them (every
        // index read is checked against the claims), so no fsync.
        for (id, (_, remove)) in identities.iter().filter(|(_, e)| !e.1.is_empty()) {
            self.update_identity(id, &none, remove, false)?;
        }
        for (h, (_, remove)) in holders.iter().filter(|(_, e)| !e.1.is_empty()) {
            self.update_holder(h, &none, remove, false)?;
        }
        // 4. Cursors only spread allocations; losing one is harmless.
        for (set, ip) in &plan.cursors {
            write_atomic(&self.cursor_path(*set), format!("{ip}\n").as_bytes(), false)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
