//! The node-local record the kubernetes store keeps beside the API: the
//! claims for degraded mode and a cache of their objects' versions and
//! lock UIDs (`api/<ip>`), written after each commit and read on a re-ADD
//! or DEL of the same node.
//!
//! The record's flock is taken only around each read or write of it,
//! never across an API round trip: one node's ADDs of a network used to
//! take turns for the whole of each other's requests. What the lock held
//! across the requests gave is kept by `inflight` (one writer per address
//! on this node, candidates spread among concurrent ADDs).

use std::path::Path;

use super::*;

/// Where one network's node-local record lives; each use opens it.
#[derive(Debug, Clone)]
pub struct LocalRecord {
    dir: PathBuf,
    network: String,
}

impl LocalRecord {
    pub fn new(dir: &Path, network: &str) -> LocalRecord {
        LocalRecord {
            dir: dir.to_path_buf(),
            network: network.to_string(),
        }
    }

    /// The record under its flock, until the value is dropped: keep it
    /// only for file work, never while a request is out.
    pub fn open(&self) -> StoreResult<FileStore> {
        FileStore::open(&self.dir, &self.network)
    }

    /// The record's directory (`FileStore::root` of what `open` gives).
    pub(super) fn root(&self) -> PathBuf {
        self.dir.join(&self.network)
    }

    /// Holds these addresses against this node's other writers of them.
    /// Taken before the record's flock, never while it is held.
    pub fn hold(&self, ips: &BTreeSet<IpAddr>) -> StoreResult<Holds> {
        Holds::take(&self.root(), &self.network, ips)
    }

    /// Holds one attachment (`container_id`/`ifname`) against this node's
    /// other commands on it, for a whole command: a DEL that finds nothing
    /// while the same attachment's ADD is between its reads and its writes
    /// would otherwise answer done and leave the ADD's claim behind.
    /// Taken first, before any address hold.
    pub fn hold_attachment(&self, container_id: &str, ifname: &str) -> StoreResult<Holds> {
        Holds::attachment(&self.root(), &self.network, container_id, ifname)
    }

    /// Plans on the record alone (degraded mode, a DEL's mirror) and
    /// commits, holding every address the plan writes, as a commit through
    /// the API does: planned once to learn them, the holds taken with the
    /// record closed, planned again and committed under them.
    pub fn commit_held<T, E: From<StoreError>>(
        &self,
        mut plan: impl FnMut(&mut FileStore) -> Result<(Plan, T), E>,
    ) -> Result<(Plan, T), E> {
        let first = plan(&mut self.open()?)?.0.addresses();
        let _holds = self.hold(&first)?;
        let mut open = self.open()?;
        let (planned, out) = plan(&mut open)?;
        if !planned.addresses().is_subset(&first) {
            return Err(StoreError::Conflict(format!(
                "the node-local record of network {:?} changed while this command planned: try again",
                self.network
            ))
            .into());
        }
        open.commit(&planned).map_err(E::from)?;
        Ok((planned, out))
    }
}

/// What the node-local cache keeps of a claim's objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ApiNote {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "lockUID", skip_serializing_if = "Option::is_none")]
    lock_uid: Option<String>,
    /// The lock's resourceVersion as this node last wrote or read it: its
    /// delete's precondition (`KubeStore::unlock`). Absent in records
    /// written before 0.3.0: the DEL then reads the lock first.
    #[serde(
        default,
        rename = "lockResourceVersion",
        skip_serializing_if = "Option::is_none"
    )]
    lock_resource_version: Option<String>,
    /// The lock's adoption count when this node last saw it.
    #[serde(default, rename = "lockAdoptions", skip_serializing_if = "is_zero")]
    lock_adoptions: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl KubeStore<'_> {
    pub(super) fn remember(&mut self, obj: ClaimObject) -> Option<Claim> {
        if obj.network != self.network {
            return None;
        }
        if let Some(rv) = obj.resource_version {
            self.versions.insert(obj.claim.ip, rv);
        }
        let ip = obj.claim.ip;
        match obj.lock_uid {
            // The lock already seen: what is known of it stays.
            Some(uid) if self.locks_seen.get(&ip).is_some_and(|s| s.uid == uid) => {}
            // Another lock than the one seen: its version is not known.
            Some(uid) => {
                self.locks_seen.insert(
                    ip,
                    SeenLock {
                        uid,
                        resource_version: None,
                        adoptions: 0,
                    },
                );
            }
            None => {
                self.locks_seen.remove(&ip);
            }
        }
        self.from_cache.remove(&obj.claim.ip);
        Some(obj.claim)
    }

    /// The claim of `identity` in `family`, from the API.
    pub(super) fn fetch(&mut self, identity: &str, family: Family) -> StoreResult<Option<Claim>> {
        let got = self
            .api
            .get_claim(&claim_name(&self.network, identity, family))
            .map_err(StoreError::from)?;
        Ok(got
            .and_then(|o| self.remember(o))
            .filter(|c| c.identity == identity && Family::of(c.ip) == family))
    }

    pub(super) fn note_path(&self, ip: IpAddr) -> Option<PathBuf> {
        self.local
            .as_ref()
            .map(|local| note_path_in(&local.root(), ip))
    }

    /// `read` on the node-local record, under its flock for just that
    /// long. A record that cannot be opened (locked by a hung process,
    /// unwritable) fails the command, as it did when the record was opened
    /// for its whole life: a DEL must not pass for done on a record it
    /// could not read. One whose records cannot be read answers as if
    /// empty: it only saves requests and serves degraded mode.
    pub(super) fn read_local<T: Default>(
        &self,
        read: impl FnOnce(&mut FileStore) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let Some(local) = self.local.as_ref() else {
            return Ok(T::default());
        };
        let mut open = local.open()?;
        Ok(read(&mut open).unwrap_or_default())
    }

    /// Cache entries only save requests; one that cannot be written is a
    /// later GET.
    pub(super) fn set_note(&self, ip: IpAddr, note: Option<ApiNote>) {
        let Some(path) = self.note_path(ip) else {
            return;
        };
        let done = match note {
            Some(note) => path.parent().map_or(Ok(()), make_dir).and_then(|_| {
                write_atomic(&path, &serde_json::to_vec(&note).unwrap_or_default(), false)
            }),
            None => remove_file(&path),
        };
        if let Err(e) = done {
            cni::log::warn(&format!(
                "node-local cache of network {:?}: {e}",
                self.network
            ));
        }
    }

    /// This node's other commits of the plan's addresses wait until this
    /// one has mirrored what the API took, so the record ends as the API
    /// ends.
    pub(super) fn hold(&self, plan: &Plan) -> StoreResult<Option<Holds>> {
        let Some(local) = self.local.as_ref() else {
            return Ok(None);
        };
        local.hold(&plan.addresses()).map(Some)
    }

    /// Whether another ADD on this node is trying `ip` now (reserving it
    /// for this one if not). A record that cannot be read reserves
    /// nothing: the lock create still decides.
    pub(super) fn reserved_by_another(&mut self, ip: IpAddr) -> bool {
        let Some(local) = self.local.as_ref() else {
            return false;
        };
        let Some(reservations) = self.reservations.as_mut() else {
            return false;
        };
        // The record's flock makes the look and the reservation one step.
        let Ok(_open) = local.open() else {
            return false;
        };
        let reserved = reservations.taken_by_another(ip).unwrap_or(false);
        self.skipped_reserved |= reserved;
        reserved
    }

    /// Local claims that the cache can vouch for (read with their notes
    /// under one flock, by `noted`: a claim and a version from two
    /// moments could pass a stale holder's write at the current version):
    /// their versions become the writes' preconditions.
    pub(super) fn cached(
        &mut self,
        claims: Vec<(Claim, Option<ApiNote>)>,
    ) -> (Vec<Claim>, Vec<Claim>) {
        let mut vouched = Vec::new();
        let mut unknown = Vec::new();
        for (c, note) in claims {
            match note {
                Some(note) => {
                    self.versions.insert(c.ip, note.resource_version);
                    if let Some(uid) = note.lock_uid {
                        self.locks_seen.insert(
                            c.ip,
                            SeenLock {
                                uid,
                                resource_version: note.lock_resource_version,
                                adoptions: note.lock_adoptions,
                            },
                        );
                    }
                    self.from_cache.insert(c.ip, c.clone());
                    vouched.push(c);
                }
                None => unknown.push(c),
            }
        }
        (vouched, unknown)
    }

    pub(super) fn version_of(&self, ip: IpAddr) -> StoreResult<String> {
        self.versions.get(&ip).cloned().ok_or_else(|| {
            StoreError::Conflict(format!("no resourceVersion read for {ip}: planning again"))
        })
    }

    /// Sets the node-local record's claims on these addresses (None:
    /// none); best effort, the API is the truth.
    pub(super) fn record_locally(
        &self,
        targets: &[(IpAddr, Option<Claim>)],
        cursors: &[(usize, IpAddr)],
    ) {
        if let Some(mut local) = self.open_to_write() {
            self.write_local(&mut local, targets, cursors);
        }
    }

    /// The record, open for a best-effort write (the API is the truth);
    /// None, said in the log, when it cannot be opened.
    fn open_to_write(&self) -> Option<FileStore> {
        match self.local.as_ref()?.open() {
            Ok(local) => Some(local),
            Err(e) => {
                cni::log::warn(&format!(
                    "node-local record of network {:?} not updated: {e}",
                    self.network
                ));
                None
            }
        }
    }

    fn write_local(
        &self,
        local: &mut FileStore,
        targets: &[(IpAddr, Option<Claim>)],
        cursors: &[(usize, IpAddr)],
    ) {
        let mut changes = Vec::new();
        for (ip, after) in targets {
            match local.claim(*ip) {
                Ok(before) if before != *after => changes.push(Change {
                    before,
                    after: after.clone(),
                }),
                Ok(_) => {}
                // A damaged local record is replaced by the API's truth.
                Err(_) => {
                    let _ = local.remove_record(&claim_file_name(*ip));
                    changes.push(Change {
                        before: None,
                        after: after.clone(),
                    });
                }
            }
        }
        // Another ADD that started from the same cursor may have moved it
        // farther while this one's requests were out.
        let cursors = cursors
            .iter()
            .map(|&(set, ours)| {
                let base = self.cursors_read.get(&set).copied().flatten();
                match local.cursor(set) {
                    Ok(Some(now)) if Some(now) != base => (set, farther_along(base, ours, now)),
                    _ => (set, ours),
                }
            })
            .collect();
        let plan = Plan { changes, cursors };
        if let Err(e) = local.commit(&plan) {
            cni::log::warn(&format!(
                "node-local record of network {:?} not updated: {e}",
                self.network
            ));
        }
    }

    /// Before the API is written: every claim the plan gives a holder is
    /// recorded on the node first, without its cache entry, so a crash
    /// after the API's answer still leaves the node's DEL something to
    /// release (it asks the API by name, there being no cache entry).
    pub(super) fn record_intent(&mut self, plan: &Plan) {
        self.prior.clear();
        let Some(mut local) = self.open_to_write() else {
            return;
        };
        let mut targets = Vec::new();
        let mut kept = BTreeSet::new();
        for after in Self::grants(plan) {
            let prior = local.claim(after.ip).ok().flatten();
            // The same holder before and after (a confirmation, a re-ADD
            // rewriting its namespace): its DEL finds the claim either way,
            // and the entry (stale if the write lands, which its
            // precondition catches) keeps degraded mode serving the pod
            // should this write time out.
            if prior.as_ref().and_then(|p| p.holder.as_ref()) == after.holder.as_ref() {
                kept.insert(after.ip);
            }
            self.prior.push((after.ip, prior));
            targets.push((after.ip, Some(after)));
        }
        for (ip, _) in targets.iter().filter(|(ip, _)| !kept.contains(ip)) {
            self.set_note(*ip, None);
        }
        if !targets.is_empty() {
            self.write_local(&mut local, &targets, &[]);
        }
    }

    /// The API refused the plan: the node's record goes back to what it
    /// was (its cache entries stay gone: the next ADD asks the API).
    pub(super) fn forget_intent(&mut self) {
        let prior = std::mem::take(&mut self.prior);
        if !prior.is_empty() {
            self.record_locally(&prior, &[]);
        }
    }

    /// After the API took the plan: the node-local record (for degraded
    /// mode and as the cache) says what the API now says.
    pub(super) fn mirror(&mut self, plan: &Plan) {
        let mut targets = Vec::new();
        for c in &plan.changes {
            for ip in [c.before.as_ref(), c.after.as_ref()]
                .into_iter()
                .flatten()
                .map(|x| x.ip)
                .collect::<BTreeSet<_>>()
            {
                targets.push((ip, c.after.as_ref().filter(|a| a.ip == ip).cloned()));
            }
        }
        // Claims and notes under one flock: a reader never pairs the
        // new claim with the old version, or the reverse.
        let Some(mut local) = self.open_to_write() else {
            return;
        };
        self.write_local(&mut local, &targets, &plan.cursors);
        for (ip, after) in targets {
            let note = after
                .and_then(|_| self.versions.get(&ip).cloned())
                .map(|rv| {
                    let seen = self.locks_seen.get(&ip);
                    ApiNote {
                        resource_version: rv,
                        lock_uid: seen.map(|s| s.uid.clone()),
                        lock_resource_version: seen.and_then(|s| s.resource_version.clone()),
                        lock_adoptions: seen.map_or(0, |s| s.adoptions),
                    }
                });
            self.set_note(ip, note);
        }
    }
}

/// Whether the node-local record's claim on `ip` is one the API confirmed
/// (it has a cache entry), not an intent recorded before an ADD the API
/// may never have seen: degraded mode serves only confirmed ones.
pub fn confirmed_locally(local: &FileStore, ip: IpAddr) -> bool {
    note_path_in(local.root(), ip).is_file()
}

/// Each claim with its cache entry, read from the open record (so both
/// are of one moment).
pub(super) fn noted(local: &FileStore, claims: Vec<Claim>) -> Vec<(Claim, Option<ApiNote>)> {
    claims
        .into_iter()
        .map(|c| {
            let note = read_file(&note_path_in(local.root(), c.ip))
                .ok()
                .flatten()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok());
            (c, note)
        })
        .collect()
}

fn note_path_in(root: &Path, ip: IpAddr) -> PathBuf {
    root.join("api").join(claim_file_name(ip))
}
