//! Claims as Kubernetes objects (docs/src/concepts/kubernetes-store.md). No lock
//! and no pool object: every write carries a precondition, so a plan built
//! on stale reads fails with `StoreError::Conflict` and is planned again.
//!
//! Two kinds of object, both found by name (`kube::claim_name`,
//! `kube::lock_name`), never by a listing on the ADD or DEL path:
//! - `IPLock` per (network, IP): its create-if-absent makes an address one
//!   identity's (I1).
//! - `IPClaim` per (network, identity, family): the address and the holder.
//!   Its create-if-absent keeps one address per identity and family (I2);
//!   a holder change is one PUT with the resourceVersion read.
//!
//! Order: a lock is created before the claim that names its address and
//! deleted after it, so a claim's address is always locked for it and a
//! reader trusts a claim without reading its lock. A crash between the two
//! creates leaves a lock no claim names (an *orphan*): its address stays
//! taken, shown as a reservation of the lock's identity, until an ADD of
//! that identity that asks for the address adopts it (a PUT of the lock
//! at the resourceVersion read, then the claim), or reconcile removes it
//! once the API server made or changed it longer ago than any ADD can take
//! (`sweep_locks`, deleting at the resourceVersion it listed). A
//! claim create that loses keeps its lock only if the identity's winning
//! claim names the same address (it adopted the lock). An address that
//! goes to another identity is never unlocked in between: its lock is
//! re-keyed in place (`KubeStore::rekey`).
//!
//! The node-local record (a `FileStore`, kept for degraded mode) doubles as
//! a cache of the objects' resourceVersions and lock UIDs (`api/<ip>` next
//! to it): a re-ADD or DEL on the node that made the claim plans from it and
//! writes once; a stale entry fails that write's precondition and the plan
//! is made again from the API. A claim read from that cache that the plan
//! leaves untouched is checked with a GET before commit returns, so nothing
//! is handed out on the cache's word alone.
//!
//! Next-fit candidates are not read first: the lock create is the check,
//! and a collision loads the network's locked addresses once for the retry
//! (paged, addresses only: memory stays flat however many claims there are).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::file::{claim_file_name, FileStore};
use super::fsio::{make_dir, read_file, remove_file, write_atomic};
use super::{Change, ClaimStore, Damaged, Listing, Plan, StoreError, StoreResult};
use crate::addr::Family;
use crate::claim::{now_secs, Claim, Holder, Unconfirmed};
use crate::identity::is_attachment_scoped;
use crate::kube::{
    claim_name, holder_selector, lock_name, network_selector, ApiError, ClaimObject, KubeApi,
    LockObject,
};

/// How long ago the API server must have made or last changed a lock no
/// claim names before reconcile removes it: far longer than an ADD can
/// spend between its lock (made or adopted) and its claim (two requests,
/// each bounded by the client's timeout), with room for clock skew
/// between the API server and the reconcile pod.
pub const ORPHAN_LOCK_GRACE_SECS: u64 = 600;

/// What the node-local cache keeps of a claim's objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ApiNote {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "lockUID", skip_serializing_if = "Option::is_none")]
    lock_uid: Option<String>,
}

pub struct KubeStore<'a> {
    api: &'a dyn KubeApi,
    network: String,
    /// The families of the network's range sets (both when unknown).
    families: Vec<Family>,
    /// resourceVersion of the claim on each address, as last read or written.
    versions: BTreeMap<IpAddr, String>,
    /// UID of the lock on each address, as last read or written.
    lock_uids: BTreeMap<IpAddr, String>,
    /// The lock on each address as last read or written (its
    /// resourceVersion is a re-key's precondition).
    locks_read: BTreeMap<IpAddr, LockObject>,
    /// Locks no claim names, by address.
    orphans: BTreeMap<IpAddr, LockObject>,
    /// Claims answered from the node-local cache, not the API.
    from_cache: BTreeSet<IpAddr>,
    /// Whether reads may come from the node-local cache: until a conflict.
    trust_cache: bool,
    /// Whether the last conflict was a lock create that found its address taken.
    collided: bool,
    /// The pool, once something needed it (exhaustion, GC, the CLI).
    pool: Option<BTreeMap<IpAddr, Claim>>,
    /// The network's locked addresses, loaded after a collision.
    taken: Option<BTreeSet<IpAddr>>,
    /// Node-local record and next-fit cursors (no API request).
    local: Option<FileStore>,
    /// What the node-local record said before this commit's intent.
    prior: Vec<(IpAddr, Option<Claim>)>,
    /// Where next-fit starts on this node before it has a cursor, so
    /// nodes do not all race for the same first address.
    first_cursors: Vec<Option<IpAddr>>,
    /// The holder the plan being committed grants to: its node is the one
    /// that writes (None for DEL, GC, reconcile and the CLI, whose writes
    /// name the released holder's node or none).
    writer: Option<Holder>,
}

/// A lock no claim names, as the claim the engine plans with. A young
/// one is a reservation of the lock's identity (an ADD between its lock
/// and its claim), so the address is neither handed to another identity
/// nor reclaimed. One older than `ORPHAN_LOCK_GRACE_SECS` by the API
/// server's clock was left by an ADD that died in between: a tombstone,
/// which an exhausted pool reclaims on the spot (its address probed first,
/// since that ADD's claim may have been written unseen), so no orphan
/// outlives the pool's need for it even without the reconcile Deployment.
/// A marked lock (I14) passes its mark on whatever its age: its address
/// changed hands on a judgement, or its claim was deleted by a node that
/// could not delete the lock, and is probed before it is bound again.
fn orphan_claim(lock: &LockObject, now: u64) -> Claim {
    let age = lock.age(now);
    let old = age > ORPHAN_LOCK_GRACE_SECS;
    let tombstone = old.then(|| Unconfirmed {
        since: now,
        why: format!(
            "an ADD of identity {:?} left its lock and no claim {age} s ago",
            lock.identity
        ),
    });
    Claim {
        ip: lock.ip,
        identity: lock.identity.clone(),
        sticky: !old,
        holder: None,
        owner: None,
        namespace: None,
        created: lock.created,
        updated: lock.created,
        unconfirmed: lock.unconfirmed.clone().or(tombstone),
    }
}

impl<'a> KubeStore<'a> {
    pub fn new(
        api: &'a dyn KubeApi,
        network: &str,
        local: Option<FileStore>,
        first_cursors: Vec<Option<IpAddr>>,
    ) -> KubeStore<'a> {
        let mut families: Vec<Family> = first_cursors
            .iter()
            .flatten()
            .map(|ip| Family::of(*ip))
            .collect();
        families.dedup();
        if families.is_empty() {
            families = vec![Family::V4, Family::V6];
        }
        KubeStore {
            api,
            network: network.to_string(),
            families,
            versions: BTreeMap::new(),
            lock_uids: BTreeMap::new(),
            locks_read: BTreeMap::new(),
            orphans: BTreeMap::new(),
            from_cache: BTreeSet::new(),
            trust_cache: true,
            collided: false,
            pool: None,
            taken: None,
            local,
            prior: Vec::new(),
            first_cursors,
            writer: None,
        }
    }

    pub fn into_local(self) -> Option<FileStore> {
        self.local
    }

    fn remember(&mut self, obj: ClaimObject) -> Option<Claim> {
        if obj.network != self.network {
            return None;
        }
        if let Some(rv) = obj.resource_version {
            self.versions.insert(obj.claim.ip, rv);
        }
        match obj.lock_uid {
            Some(uid) => self.lock_uids.insert(obj.claim.ip, uid),
            None => self.lock_uids.remove(&obj.claim.ip),
        };
        self.from_cache.remove(&obj.claim.ip);
        Some(obj.claim)
    }

    /// The claim of `identity` in `family`, from the API.
    fn fetch(&mut self, identity: &str, family: Family) -> StoreResult<Option<Claim>> {
        let got = self
            .api
            .get_claim(&claim_name(&self.network, identity, family))
            .map_err(StoreError::from)?;
        Ok(got
            .and_then(|o| self.remember(o))
            .filter(|c| c.identity == identity && Family::of(c.ip) == family))
    }

    fn note_path(&self, ip: IpAddr) -> Option<PathBuf> {
        self.local.as_ref().map(|local| note_path(local, ip))
    }

    fn note(&self, ip: IpAddr) -> Option<ApiNote> {
        let bytes = read_file(&self.note_path(ip)?).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Cache entries only save requests; one that cannot be written is a
    /// later GET.
    fn set_note(&self, ip: IpAddr, note: Option<ApiNote>) {
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

    /// Local claims that the cache can vouch for: their versions become
    /// the writes' preconditions.
    fn cached(&mut self, claims: Vec<Claim>) -> (Vec<Claim>, Vec<Claim>) {
        let mut vouched = Vec::new();
        let mut unknown = Vec::new();
        for c in claims {
            match self.note(c.ip) {
                Some(note) => {
                    self.versions.insert(c.ip, note.resource_version);
                    if let Some(uid) = note.lock_uid {
                        self.lock_uids.insert(c.ip, uid);
                    }
                    self.from_cache.insert(c.ip);
                    vouched.push(c);
                }
                None => unknown.push(c),
            }
        }
        (vouched, unknown)
    }

    fn version_of(&self, ip: IpAddr) -> StoreResult<String> {
        self.versions.get(&ip).cloned().ok_or_else(|| {
            StoreError::Conflict(format!("no resourceVersion read for {ip}: planning again"))
        })
    }

    fn object(&self, claim: &Claim, resource_version: Option<String>) -> ClaimObject {
        ClaimObject {
            network: self.network.clone(),
            claim: claim.clone(),
            resource_version,
            lock_uid: self.lock_uids.get(&claim.ip).cloned(),
        }
    }

    /// Lock, then claim. A claim create that loses (the identity has a
    /// claim in this family already) takes its lock back. An orphan lock
    /// of the identity is adopted: written first (`KubeApi::adopt_lock`, at
    /// the resourceVersion read), so a sweep that read it before fails its
    /// delete and one that reads it after finds it freshly written.
    fn create(&mut self, after: &Claim) -> StoreResult<()> {
        let ip = after.ip;
        let orphan = self
            .orphans
            .get(&ip)
            .filter(|l| l.identity == after.identity)
            .cloned();
        let lock = match orphan {
            Some(orphan) => self
                .api
                .adopt_lock(&orphan, after.holder_node())
                .map_err(StoreError::from)?,
            None => self
                .api
                .create_lock(&LockObject {
                    network: self.network.clone(),
                    ip,
                    identity: after.identity.clone(),
                    created: now_secs(),
                    uid: None,
                    node: after.holder_node().map(str::to_string),
                    unconfirmed: None,
                    resource_version: None,
                    adoptions: 0,
                    written: None,
                })
                .map_err(|e| {
                    if matches!(e, ApiError::Conflict(_)) {
                        self.collided = true;
                    }
                    StoreError::from(e)
                })?,
        };
        if let Some(uid) = &lock.uid {
            self.lock_uids.insert(ip, uid.clone());
        }
        self.locks_read.insert(ip, lock);
        let adopted = self.orphans.remove(&ip).is_some();
        match self.api.create_claim(&self.object(after, None)) {
            Ok(obj) => {
                self.remember(obj);
                Ok(())
            }
            Err(e) => {
                // The identity has a claim in this family already. If it
                // names this address, another ADD of the identity adopted
                // our lock: it is that claim's now.
                // No answer: the claim may have been made, so its lock stays
                // (an orphan, if not, that reconcile removes).
                let maybe_made = matches!(e, ApiError::Unreachable(_));
                let adopted_by_other = matches!(e, ApiError::Conflict(_))
                    && !adopted
                    && self
                        .api
                        .get_claim(&claim_name(&self.network, &after.identity, Family::of(ip)))
                        .ok()
                        .flatten()
                        .is_some_and(|o| o.claim.ip == ip);
                if !adopted && !adopted_by_other && !maybe_made {
                    self.unlock(ip, &after.identity);
                }
                Err(e.into())
            }
        }
    }

    /// Deletes the lock on `ip` if it is `identity`'s; best effort: a lock
    /// left behind is an orphan, which keeps the address taken until
    /// reconcile removes it, never hands it out twice. A lock another node
    /// made, or one marked (I14), is not this node's to delete under the
    /// node-scope policy: it stays, an orphan whose address next-fit skips
    /// (a marked one is a tombstone probed before it is bound again).
    fn unlock(&mut self, ip: IpAddr, identity: &str) {
        let name = lock_name(&self.network, ip);
        self.locks_read.remove(&ip);
        let uid = match self.lock_uids.remove(&ip) {
            Some(uid) => Some(uid),
            None => match self.api.get_lock(&name) {
                Ok(Some(l)) if l.identity == identity => l.uid,
                Ok(_) => return,
                Err(e) => {
                    cni::log::warn(&format!("could not read iplock {name}: {e}; reconcile removes it once no claim names it"));
                    return;
                }
            },
        };
        let Some(uid) = uid else { return };
        match self.api.delete_lock(&name, &uid, None) {
            Ok(()) => {}
            // Gone already, or another lock since: not ours to delete.
            Err(ApiError::Conflict(_)) => {}
            Err(ApiError::Refused(why)) => {
                cni::log::info(&format!("iplock {name} stays as an orphan: {why}"))
            }
            Err(e) => cni::log::warn(&format!(
                "could not delete iplock {name}: {e}; reconcile removes it once no claim names it"
            )),
        }
        self.orphans.remove(&ip);
    }

    /// Deletes an orphan lock exactly as it was read: an ADD that adopted
    /// it since changed it, and the plan is made again (a conflict) rather
    /// than free an address a claim is about to name. One the node-scope
    /// policy keeps from this node (another node's, or marked) stays, as
    /// in `unlock`.
    fn delete_orphan(&mut self, lock: &LockObject) -> StoreResult<()> {
        let name = lock_name(&self.network, lock.ip);
        let Some(uid) = lock.uid.as_deref() else {
            return Ok(());
        };
        match self
            .api
            .delete_lock(&name, uid, lock.resource_version.as_deref())
        {
            Ok(()) => {}
            Err(ApiError::Refused(why)) => {
                cni::log::info(&format!("iplock {name} stays as an orphan: {why}"))
            }
            Err(e) => return Err(e.into()),
        }
        self.orphans.remove(&lock.ip);
        self.lock_uids.remove(&lock.ip);
        self.locks_read.remove(&lock.ip);
        Ok(())
    }

    /// Gives BEFORE's address to AFTER's identity without ever unlocking
    /// it (I1): another node's next-fit must never find the address free
    /// while it changes hands, since it was freed on a judgement (or a
    /// probe just heard it answer) and must be probed before anyone binds
    /// it. One conditional PUT re-keys the lock (at the UID and
    /// resourceVersion read) to AFTER's identity and NODE, marked (I14: the
    /// lock outlives a claim that never comes as a tombstone), then BEFORE's
    /// claim is deleted at its resourceVersion (an orphan lock has none),
    /// then AFTER's claim is created. Every failure leaves the address
    /// locked:
    /// - the re-key fails: nothing changed;
    /// - the claim delete fails (BEFORE's claim changed, or no answer):
    ///   the lock is re-keyed back, best effort; if that fails too, the
    ///   address stays locked for AFTER's identity with BEFORE's claim
    ///   naming it (shown as damaged, which next-fit skips);
    /// - the claim create fails: the lock stays, an orphan of AFTER's
    ///   identity, young (a reservation), then old (a marked tombstone an
    ///   exhausted pool reclaims with a probe, see `orphan_claim`).
    ///
    /// The error is returned and the plan made again.
    /// The lock on BEFORE's address as last read, or as much of it as the
    /// node-local cache knows (its UID: the client then reads the version
    /// to write at); a conflict when none of BEFORE's identity is known.
    fn lock_read(&self, before: &Claim) -> StoreResult<LockObject> {
        let ip = before.ip;
        self.locks_read
            .get(&ip)
            .cloned()
            .or_else(|| {
                self.lock_uids.get(&ip).map(|uid| LockObject {
                    network: self.network.clone(),
                    ip,
                    identity: before.identity.clone(),
                    created: before.created,
                    uid: Some(uid.clone()),
                    node: None,
                    unconfirmed: None,
                    resource_version: None,
                    adoptions: 0,
                    written: None,
                })
            })
            .filter(|l| l.identity == before.identity && l.ip == ip)
            .ok_or_else(|| {
                StoreError::Conflict(format!(
                    "no lock of identity {:?} read on {ip}: planning again",
                    before.identity
                ))
            })
    }

    /// A takeover of another node's claim at the same address takes its
    /// lock first (one re-key to the same identity, naming this node,
    /// marked): a lock left naming the old node, unmarked, would be that
    /// node's to delete under the live claim (I14). Before the claim, so
    /// a failure leaves the old holder's claim under a marked lock.
    fn follow_takeover(&mut self, before: &Claim, after: &Claim) -> StoreResult<()> {
        let (Some(theirs), Some(mine)) = (before.holder_node(), after.holder_node()) else {
            return Ok(());
        };
        let Some(judged) = after.unconfirmed.as_ref().filter(|_| theirs != mine) else {
            return Ok(());
        };
        let read = match self.lock_read(before) {
            Ok(read) => read,
            // A claim made before locks named their claims' UIDs.
            Err(_) => match self
                .api
                .get_lock(&lock_name(&self.network, before.ip))
                .map_err(StoreError::from)?
            {
                Some(l) if l.identity == before.identity => l,
                _ => return Ok(()),
            },
        };
        if read.node.as_deref() == Some(mine) && read.unconfirmed.is_some() {
            return Ok(());
        }
        let taken = self
            .api
            .rekey_lock(&read, &before.identity, Some(mine), judged)
            .map_err(StoreError::from)?;
        if let Some(uid) = &taken.uid {
            self.lock_uids.insert(before.ip, uid.clone());
        }
        self.locks_read.insert(before.ip, taken);
        Ok(())
    }

    fn rekey(&mut self, before: &Claim, after: &Claim, node: Option<&str>) -> StoreResult<()> {
        let ip = before.ip;
        let orphan = self.orphans.get(&ip).cloned();
        let rv = match orphan {
            Some(_) => None,
            None => Some(self.version_of(ip)?),
        };
        let read = match orphan {
            Some(orphan) => orphan,
            None => self.lock_read(before)?,
        };
        let judged = after
            .unconfirmed
            .clone()
            .or_else(|| before.unconfirmed.clone())
            .unwrap_or_else(|| Unconfirmed {
                since: now_secs(),
                why: format!(
                    "{ip} went from identity {:?} to {:?}",
                    before.identity, after.identity
                ),
            });
        let rekeyed = self
            .api
            .rekey_lock(&read, &after.identity, node, &judged)
            .map_err(StoreError::from)?;
        self.orphans.remove(&ip);
        if let Some(uid) = &rekeyed.uid {
            self.lock_uids.insert(ip, uid.clone());
        }
        self.locks_read.insert(ip, rekeyed.clone());
        if let Some(rv) = rv {
            let name = claim_name(&self.network, &before.identity, Family::of(ip));
            if let Err(e) = self.api.delete_claim(&name, &rv) {
                match self
                    .api
                    .rekey_lock(&rekeyed, &before.identity, node, &judged)
                {
                    Ok(back) => {
                        self.locks_read.insert(ip, back);
                    }
                    Err(back) => {
                        self.locks_read.remove(&ip);
                        cni::log::warn(&format!(
                            "could not give iplock {} back to identity {:?} after ipclaim {name} could not be deleted ({e}): {back}; the address stays locked for identity {:?}",
                            lock_name(&self.network, ip),
                            before.identity,
                            after.identity
                        ));
                    }
                }
                return Err(e.into());
            }
            self.versions.remove(&ip);
        }
        // A failed create leaves the lock: never unlocked in between.
        let obj = self
            .api
            .create_claim(&self.object(after, None))
            .map_err(StoreError::from)?;
        self.remember(obj);
        Ok(())
    }

    fn remove(&mut self, before: &Claim) -> StoreResult<()> {
        if let Some(orphan) = self.orphans.get(&before.ip).cloned() {
            return self.delete_orphan(&orphan);
        }
        let rv = self.version_of(before.ip)?;
        self.api
            .delete_claim(
                &claim_name(&self.network, &before.identity, Family::of(before.ip)),
                &rv,
            )
            .map_err(StoreError::from)?;
        self.versions.remove(&before.ip);
        self.unlock(before.ip, &before.identity);
        Ok(())
    }

    fn apply(&mut self, change: &Change) -> StoreResult<()> {
        match (&change.before, &change.after) {
            (None, Some(after)) => self.create(after),
            (Some(before), Some(after))
                if before.ip == after.ip && before.identity == after.identity =>
            {
                if self.orphans.contains_key(&before.ip) {
                    return self.create(after);
                }
                let rv = self.version_of(before.ip)?;
                self.follow_takeover(before, after)?;
                let obj = self
                    .api
                    .replace_claim(&self.object(after, Some(rv)))
                    .map_err(StoreError::from)?;
                self.remember(obj);
                Ok(())
            }
            (Some(before), after) => {
                // A claim another node holds is this node's to delete only
                // once it has taken it over (the node-scope admission
                // policy, deploy/30-node-scope-policy.yaml): a reclaim from
                // a dead holder elsewhere is an update, then the delete.
                // The takeover carries the grant's unconfirmed mark, as
                // every takeover must under that policy. A tombstone left
                // where an identity moves away has no holder: the plan's
                // grantee writes it.
                let adopter = after
                    .as_ref()
                    .and_then(|a| a.holder.clone())
                    .or_else(|| self.writer.clone());
                if let (Some(theirs), Some(mine)) = (before.holder.as_ref(), adopter.as_ref()) {
                    if theirs.node != mine.node && !self.orphans.contains_key(&before.ip) {
                        let rv = self.version_of(before.ip)?;
                        let unconfirmed = after
                            .as_ref()
                            .and_then(|a| a.unconfirmed.clone())
                            .or_else(|| before.unconfirmed.clone())
                            .or_else(|| {
                                Some(Unconfirmed {
                                    since: now_secs(),
                                    why: format!(
                                        "{} was taken over to be reclaimed",
                                        theirs.describe()
                                    ),
                                })
                            });
                        let taken = Claim {
                            holder: Some(mine.clone()),
                            unconfirmed,
                            ..before.clone()
                        };
                        let obj = self
                            .api
                            .replace_claim(&self.object(&taken, Some(rv)))
                            .map_err(StoreError::from)?;
                        self.remember(obj);
                    }
                }
                let node = adopter
                    .as_ref()
                    .map(|h| h.node.clone())
                    .or_else(|| before.holder_node().map(str::to_string));
                if let Some(after) = after.as_ref().filter(|a| a.ip == before.ip) {
                    return self.rekey(before, after, node.as_deref());
                }
                self.remove(before)?;
                match after {
                    Some(after) => self.create(after),
                    None => Ok(()),
                }
            }
            (None, None) => Ok(()),
        }
    }

    /// Best effort: puts back what this commit wrote before it lost a race.
    fn roll_back(&mut self, applied: &[Change]) {
        for change in applied.iter().rev() {
            if let Err(e) = self.apply(&change.inverse()) {
                cni::log::warn(&format!(
                    "could not roll back the claim on {}: {}; a later ADD, DEL or reconcile settles it by liveness",
                    change.ip().map(|ip| ip.to_string()).unwrap_or_default(),
                    e
                ));
            }
        }
    }

    /// A claim the plan relies on but does not write was read from the
    /// node-local cache: the API must still say the same.
    fn confirm_untouched(&mut self, plan: &Plan) -> StoreResult<()> {
        let touched: BTreeSet<IpAddr> = plan
            .changes
            .iter()
            .filter_map(|c| c.before.as_ref().map(|b| b.ip))
            .collect();
        let unconfirmed: Vec<IpAddr> = self.from_cache.difference(&touched).copied().collect();
        for ip in unconfirmed {
            let Some(local) = self.local.as_mut() else {
                continue;
            };
            let Ok(Some(cached)) = local.claim(ip) else {
                continue;
            };
            let want = self.versions.get(&ip).cloned();
            let got = self
                .api
                .get_claim(&claim_name(&self.network, &cached.identity, Family::of(ip)))
                .map_err(StoreError::from)?;
            let same = got
                .as_ref()
                .is_some_and(|o| o.resource_version == want && o.claim == cached);
            if !same {
                return Err(StoreError::Conflict(format!(
                    "the node-local record of {ip} is stale: planning again from the API"
                )));
            }
            self.from_cache.remove(&ip);
        }
        Ok(())
    }

    /// Sets the node-local record's claims on these addresses (None:
    /// none); best effort, the API is the truth.
    fn record_locally(&mut self, targets: &[(IpAddr, Option<Claim>)], cursors: &[(usize, IpAddr)]) {
        let Some(local) = self.local.as_mut() else {
            return;
        };
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
        let plan = Plan {
            changes,
            cursors: cursors.to_vec(),
        };
        if let Err(e) = local.commit(&plan) {
            cni::log::warn(&format!(
                "node-local record of network {:?} not updated: {e}",
                self.network
            ));
        }
    }

    /// The claims a plan gives a holder.
    fn grants(plan: &Plan) -> Vec<Claim> {
        plan.changes
            .iter()
            .filter_map(|c| c.after.clone().filter(|a| a.holder.is_some()))
            .collect()
    }

    /// Before the API is written: every claim the plan gives a holder is
    /// recorded on the node first, without its cache entry, so a crash
    /// after the API's answer still leaves the node's DEL something to
    /// release (it asks the API by name, there being no cache entry).
    fn record_intent(&mut self, plan: &Plan) {
        self.prior.clear();
        let Some(local) = self.local.as_mut() else {
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
            self.record_locally(&targets, &[]);
        }
    }

    /// The API refused the plan: the node's record goes back to what it
    /// was (its cache entries stay gone: the next ADD asks the API).
    fn forget_intent(&mut self) {
        let prior = std::mem::take(&mut self.prior);
        if !prior.is_empty() {
            self.record_locally(&prior, &[]);
        }
    }

    /// After the API took the plan: the node-local record (for degraded
    /// mode and as the cache) says what the API now says.
    fn mirror(&mut self, plan: &Plan) {
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
        self.record_locally(&targets, &plan.cursors);
        for (ip, after) in targets {
            let note = after
                .and_then(|_| self.versions.get(&ip).cloned())
                .map(|rv| ApiNote {
                    resource_version: rv,
                    lock_uid: self.lock_uids.get(&ip).cloned(),
                });
            self.set_note(ip, note);
        }
    }

    /// Reconcile's care of the locks (docs/src/concepts/kubernetes-store.md):
    /// removes the locks no claim names that the API server made or last
    /// changed more than `grace_secs` ago (an ADD between its lock and its
    /// claim, or between its adoption of a lock and its claim, is younger),
    /// and clears the mark of a lock whose claim carries none (I14).
    /// Ages are the API server's clock (`LockObject::age`): a node's may
    /// be minutes off. Each write is made at the resourceVersion listed, so
    /// an adoption since (which writes the lock before its claim) makes it
    /// fail. A marked orphan is never removed: its address changed hands on
    /// a judgement, or its claim was deleted by a node the policy kept from
    /// deleting it, so it stays a tombstone that an exhausted pool reclaims
    /// with a probe.
    pub fn sweep_locks(&mut self, grace_secs: u64) -> StoreResult<LockSweep> {
        let listing = self.list()?;
        let now = now_secs();
        let old: Vec<LockObject> = self
            .orphans
            .values()
            .filter(|l| l.age(now) > grace_secs && l.unconfirmed.is_none())
            .cloned()
            .collect();
        let mut swept = LockSweep::default();
        for lock in old {
            let (Some(uid), Some(rv)) = (lock.uid.as_deref(), lock.resource_version.as_deref())
            else {
                continue;
            };
            // An ADD may have adopted it and made its claim since the
            // listing; one that adopted it and has not yet made its claim
            // changed the lock, which fails the delete.
            let name = claim_name(&self.network, &lock.identity, Family::of(lock.ip));
            if self
                .api
                .get_claim(&name)
                .map_err(StoreError::from)?
                .is_some_and(|o| o.claim.ip == lock.ip)
            {
                continue;
            }
            match self
                .api
                .delete_lock(&lock_name(&self.network, lock.ip), uid, Some(rv))
            {
                Ok(()) => swept.freed.push(lock.ip),
                Err(ApiError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // A mark is stale once the claim naming the address is confirmed
        // and held on the node the lock names: a lock another node renamed
        // itself onto keeps its mark, so that node can never delete it.
        let confirmed = |c: &Claim, l: &LockObject| {
            c.unconfirmed.is_none()
                && c.ip == l.ip
                && c.identity == l.identity
                && c.holder_node().is_some()
                && c.holder_node() == l.node.as_deref()
        };
        let stale: Vec<LockObject> = listing
            .claims
            .iter()
            .filter(|c| !self.orphans.contains_key(&c.ip))
            .filter_map(|c| {
                self.locks_read
                    .get(&c.ip)
                    .filter(|l| l.unconfirmed.is_some() && confirmed(c, l))
                    .cloned()
            })
            .collect();
        for lock in stale {
            // The claim as it is now, not as listed: a takeover since marks it.
            let name = claim_name(&self.network, &lock.identity, Family::of(lock.ip));
            let now = self.api.get_claim(&name).map_err(StoreError::from)?;
            if !now.is_some_and(|o| confirmed(&o.claim, &lock)) {
                continue;
            }
            match self.api.clear_lock_mark(&lock) {
                Ok(_) => swept.cleared.push(lock.ip),
                Err(ApiError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(swept)
    }
}

/// What `KubeStore::sweep_locks` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LockSweep {
    /// Orphan locks removed: their addresses are free.
    pub freed: Vec<IpAddr>,
    /// Locks whose mark was cleared: their claims carry none.
    pub cleared: Vec<IpAddr>,
}

impl ClaimStore for KubeStore<'_> {
    fn claim(&mut self, ip: IpAddr) -> StoreResult<Option<Claim>> {
        if let Some(pool) = &self.pool {
            return Ok(pool.get(&ip).cloned());
        }
        let name = lock_name(&self.network, ip);
        let Some(lock) = self.api.get_lock(&name).map_err(StoreError::from)? else {
            return Ok(None);
        };
        if lock.network != self.network {
            return Err(StoreError::Damaged(format!(
                "iplock {name} belongs to network {:?}, not {:?}: two networks' names share a prefix; rename one of them",
                lock.network, self.network
            )));
        }
        if let Some(uid) = &lock.uid {
            self.lock_uids.insert(ip, uid.clone());
        }
        self.locks_read.insert(ip, lock.clone());
        match self.fetch(&lock.identity, Family::of(ip))? {
            Some(c) if c.ip == ip => Ok(Some(c)),
            _ => {
                let orphan = orphan_claim(&lock, now_secs());
                self.orphans.insert(ip, lock);
                Ok(Some(orphan))
            }
        }
    }

    fn candidate_taken(&mut self, ip: IpAddr) -> StoreResult<bool> {
        Ok(match (&self.taken, &self.pool) {
            (Some(taken), _) => taken.contains(&ip),
            (None, Some(pool)) => pool.contains_key(&ip),
            (None, None) => false,
        })
    }

    /// From the node-local cache first; families it does not vouch for are
    /// one GET each, except for an attachment-scoped (dynamic) identity,
    /// which only this node's ADDs ever claim: its claim create is the check.
    fn claims_of_identity(&mut self, identity: &str) -> StoreResult<Vec<Claim>> {
        if let Some(pool) = &self.pool {
            return Ok(pool
                .values()
                .filter(|c| c.identity == identity)
                .cloned()
                .collect());
        }
        let mut found = Vec::new();
        if self.trust_cache {
            let local = match self.local.as_mut() {
                Some(local) => local.claims_of_identity(identity).unwrap_or_default(),
                None => Vec::new(),
            };
            found = self.cached(local).0;
            if is_attachment_scoped(identity) {
                return Ok(found);
            }
        }
        let missing: Vec<Family> = self
            .families
            .iter()
            .copied()
            .filter(|f| !found.iter().any(|c| Family::of(c.ip) == *f))
            .collect();
        for family in missing {
            found.extend(self.fetch(identity, family)?);
        }
        Ok(found)
    }

    /// The node-local record says which claims this node's attachment
    /// holds (only this node's ADDs give it any); the cache or a GET by
    /// name confirms each. Without a local record: one paged listing.
    fn claims_of_holder(&mut self, container_id: &str, ifname: &str) -> StoreResult<Vec<Claim>> {
        if let Some(pool) = &self.pool {
            return Ok(pool
                .values()
                .filter(|c| c.held_by(container_id, ifname))
                .cloned()
                .collect());
        }
        let Some(local) = self.local.as_mut() else {
            let objs = self
                .api
                .list_claims(&holder_selector(&self.network, container_id, ifname))
                .map_err(StoreError::from)?;
            return Ok(objs
                .into_iter()
                .filter_map(|o| self.remember(o))
                .filter(|c| c.held_by(container_id, ifname))
                .collect());
        };
        let hinted = local
            .claims_of_holder(container_id, ifname)
            .unwrap_or_default();
        let (mut held, unknown) = if self.trust_cache {
            self.cached(hinted)
        } else {
            (Vec::new(), hinted)
        };
        for c in unknown {
            if let Some(now) = self.fetch(&c.identity, Family::of(c.ip))? {
                if now.ip == c.ip && now.held_by(container_id, ifname) {
                    held.push(now);
                }
            }
        }
        Ok(held)
    }

    fn list(&mut self) -> StoreResult<Listing> {
        let selector = network_selector(&self.network);
        let objs = self.api.list_claims(&selector).map_err(StoreError::from)?;
        let locks = self.api.list_locks(&selector).map_err(StoreError::from)?;
        let mut claims: Vec<Claim> = objs.into_iter().filter_map(|o| self.remember(o)).collect();
        let mut damaged = Vec::new();
        let by_ip: BTreeMap<IpAddr, &LockObject> = locks
            .iter()
            .filter(|l| l.network == self.network)
            .map(|l| (l.ip, l))
            .collect();
        for c in &claims {
            match by_ip.get(&c.ip) {
                Some(l) if l.identity == c.identity => {}
                other => damaged.push(Damaged {
                    path: PathBuf::from(format!(
                        "ipclaims/{}",
                        claim_name(&self.network, &c.identity, Family::of(c.ip))
                    )),
                    why: match other {
                        Some(l) => format!(
                            "names {} but iplock {} is identity {:?}'s: delete the claim that should not exist",
                            c.ip,
                            lock_name(&self.network, c.ip),
                            l.identity
                        ),
                        None => format!(
                            "names {} but iplock {} is missing: re-create it or delete the claim",
                            c.ip,
                            lock_name(&self.network, c.ip)
                        ),
                    },
                }),
            }
        }
        self.orphans.clear();
        for lock in by_ip.values() {
            if let Some(uid) = &lock.uid {
                self.lock_uids.insert(lock.ip, uid.clone());
            }
            self.locks_read.insert(lock.ip, (*lock).clone());
            if !claims
                .iter()
                .any(|c| c.ip == lock.ip && c.identity == lock.identity)
            {
                claims.push(orphan_claim(lock, now_secs()));
                self.orphans.insert(lock.ip, (*lock).clone());
            }
        }
        claims.sort_by_key(|c| c.ip);
        self.pool = Some(claims.iter().map(|c| (c.ip, c.clone())).collect());
        self.taken = None;
        self.from_cache.clear();
        Ok(Listing { claims, damaged })
    }

    fn cursor(&mut self, set: usize) -> StoreResult<Option<IpAddr>> {
        let local = match self.local.as_mut() {
            Some(local) => local.cursor(set).unwrap_or(None),
            None => None,
        };
        Ok(local.or_else(|| self.first_cursors.get(set).copied().flatten()))
    }

    fn commit(&mut self, plan: &Plan) -> StoreResult<()> {
        self.writer = Self::grants(plan).into_iter().find_map(|c| c.holder);
        self.confirm_untouched(plan)?;
        self.record_intent(plan);
        let mut applied = Vec::new();
        for change in &plan.changes {
            if let Err(e) = self.apply(change) {
                self.roll_back(&applied);
                // An answer that never came may hide a write that was
                // made: the record keeps the intent, and the node's DEL
                // asks the API by name.
                if !matches!(e, StoreError::Unreachable(_)) {
                    self.forget_intent();
                }
                return Err(e);
            }
            applied.push(change.clone());
        }
        if plan.changes.iter().any(|c| c.before.is_none()) {
            cni::fault::point(cni::fault::ADD_IDENTITY_RECORDED);
        }
        self.mirror(plan);
        Ok(())
    }

    /// After a lost race the plan is made again from the API alone. Only
    /// a lost lock create (a taken candidate) needs to know which addresses
    /// are taken: a paged listing of the addresses alone keeps this path's
    /// memory flat at 60,000 claims.
    fn conflicted(&mut self) -> StoreResult<()> {
        self.versions.clear();
        self.lock_uids.clear();
        self.locks_read.clear();
        self.orphans.clear();
        self.from_cache.clear();
        self.trust_cache = false;
        self.pool = None;
        if std::mem::take(&mut self.collided) {
            let taken = self
                .api
                .taken_addresses(&network_selector(&self.network))
                .map_err(StoreError::from)?;
            self.taken = Some(taken);
        }
        Ok(())
    }
}

/// Whether the node-local record's claim on `ip` is one the API confirmed
/// (it has a cache entry), not an intent recorded before an ADD the API
/// may never have seen: degraded mode serves only confirmed ones.
pub fn confirmed_locally(local: &FileStore, ip: IpAddr) -> bool {
    note_path(local, ip).is_file()
}

fn note_path(local: &FileStore, ip: IpAddr) -> PathBuf {
    local.root().join("api").join(claim_file_name(ip))
}

/// Where this node's next-fit starts in a range set of `size` addresses
/// beginning at `first`: spread by the node name's hash.
pub fn node_offset(node: &str, size: u128) -> u128 {
    use sha2::{Digest, Sha256};
    if size == 0 {
        return 0;
    }
    let d = Sha256::digest(node.as_bytes());
    let mut n = [0u8; 16];
    n.copy_from_slice(&d[..16]);
    u128::from_be_bytes(n) % size
}

/// The node-local record's directory for the kube store.
pub fn local_dir(store_dir: &std::path::Path) -> PathBuf {
    store_dir.join("kubernetes-local")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::Holder;
    use crate::config::IpamConfig;
    use crate::engine::{plan_add, plan_del, AddRequest};
    use crate::identity::{dynamic_key, Identity, IdentitySource};
    use crate::kube::fake::FakeApi;
    use crate::kube::inspector::KubeInspector;
    use crate::liveness::{Caller, NodeFacts};
    use crate::pod::PodFacts;
    use cni::{code, CniError};
    use serde_json::json;

    fn conf() -> IpamConfig {
        IpamConfig::parse(
            "macnet",
            &json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.19"}),
        )
        .unwrap()
    }

    fn req(identity: &str, sticky: bool, pod: &str, node: &str) -> AddRequest {
        AddRequest {
            identity: Identity {
                key: identity.into(),
                sticky,
                source: if sticky {
                    IdentitySource::ArgsCni
                } else {
                    IdentitySource::Container
                },
                owner: None,
            },
            holder: Holder {
                container_id: format!("c-{pod}"),
                ifname: "net1".into(),
                netns: String::new(),
                netns_id: None,
                pod_namespace: Some("ns".into()),
                pod_name: Some(pod.into()),
                pod_uid: Some(format!("uid-{pod}")),
                node: node.into(),
                boot_id: "b".into(),
                since: 1,
            },
            caller: Caller {
                pod_uid: Some(format!("uid-{pod}")),
            },
            requested: vec![],
            now: 1,
        }
    }

    fn running(api: &FakeApi, pod: &str, node: &str) {
        api.pods.borrow_mut().insert(
            format!("ns/{pod}"),
            PodFacts {
                uid: format!("uid-{pod}"),
                node: Some(node.into()),
                phase: Some("Running".into()),
                ..PodFacts::default()
            },
        );
    }

    fn node(name: &str) -> NodeFacts {
        NodeFacts {
            node: name.into(),
            boot_id: "b".into(),
        }
    }

    /// A node's local directory (the node-local record and its cache),
    /// removed on drop.
    struct Node {
        dir: PathBuf,
    }

    impl Node {
        fn new() -> Node {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "sticky-ipam-kube-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            Node { dir }
        }

        fn store<'a>(&self, api: &'a FakeApi) -> KubeStore<'a> {
            store_in(&self.dir, api)
        }
    }

    /// The store of the node whose directory is DIR.
    fn store_in<'a>(dir: &std::path::Path, api: &'a FakeApi) -> KubeStore<'a> {
        let local = FileStore::open(dir, "macnet").unwrap();
        KubeStore::new(
            api,
            "macnet",
            Some(local),
            vec![Some("10.0.0.12".parse().unwrap())],
        )
    }

    impl Node {}

    /// ADD as cni_ipam does it, with its retries.
    fn add(
        api: &FakeApi,
        on: Option<&Node>,
        r: &AddRequest,
    ) -> crate::store::PlanResult<Vec<IpAddr>> {
        let mut store = match on {
            Some(n) => n.store(api),
            None => KubeStore::new(api, "macnet", None, vec![None]),
        };
        let inspector = KubeInspector::new(api, node(&r.holder.node));
        let (_, grants) = crate::store::retry::with_retries(&mut store, "ADD", |s| {
            plan_add(&conf(), s, &inspector, r)
        })?;
        Ok(grants.iter().map(|g| g.ip).collect())
    }

    fn del(api: &FakeApi, on: &Node, cid: &str) {
        let mut store = on.store(api);
        crate::store::retry::with_retries(&mut store, "DEL", |s| {
            plan_del(s, cid, "net1", 2).map(|p| (p, ()))
        })
        .unwrap();
    }

    /// How many requests `f` makes, and which.
    fn counted<T>(api: &FakeApi, f: impl FnOnce() -> T) -> (T, Vec<String>) {
        api.calls.borrow_mut().clear();
        let out = f();
        (out, api.calls.borrow().clone())
    }

    fn per_identity(api: &FakeApi) -> BTreeMap<String, usize> {
        let mut n = BTreeMap::new();
        for o in api.claims.borrow().values() {
            *n.entry(o.claim.identity.clone()).or_default() += 1;
        }
        n
    }

    /// Every claim's address is locked for its identity, and every lock
    /// is named by a claim (no orphans after a clean run).
    fn locks_match(api: &FakeApi) {
        let claims = api.claims.borrow();
        let locks = api.locks.borrow();
        assert_eq!(claims.len(), locks.len(), "{claims:?} {locks:?}");
        for o in claims.values() {
            let lock = &locks[&lock_name("macnet", o.claim.ip)];
            assert_eq!(lock.identity, o.claim.identity);
            assert_eq!(o.lock_uid, lock.uid);
        }
    }

    #[test]
    fn a_reclaim_of_another_nodes_dead_claim_takes_it_over_before_deleting_it() {
        let api = FakeApi::default();
        // The pool (10 addresses) filled by node n2's pods, which are then
        // gone (their node crashed, their DELs never came).
        for i in 0..10 {
            let pod = format!("old-{i}");
            running(&api, &pod, "n2");
            let key = dynamic_key(&format!("c-{pod}"), "net1");
            add(&api, None, &req(&key, false, &pod, "n2")).unwrap();
        }
        api.pods.borrow_mut().clear();
        assert!(
            api.locks
                .borrow()
                .values()
                .all(|l| l.node.as_deref() == Some("n2")),
            "a lock names the node that made it"
        );
        // n1 answers to the node-scope policy: n2's locks are not its to delete.
        *api.node_scope.borrow_mut() = Some("n1".into());
        running(&api, "new", "n1");
        let key = dynamic_key("c-new", "net1");
        let (got, calls) = counted(&api, || add(&api, None, &req(&key, false, "new", "n1")));
        let ip = got.unwrap()[0];
        let writes: Vec<&str> = calls
            .iter()
            .map(String::as_str)
            .filter(|c| !c.starts_with("get") && !c.starts_with("list"))
            .collect();
        // The old claim is n1's before its delete: a node deletes only
        // claims it holds (the admission policy's rule).
        let old = writes
            .iter()
            .find_map(|c| c.strip_prefix("delete macnet."))
            .expect("the reclaimed claim is deleted");
        let at = |w: &str| writes.iter().position(|c| *c == w);
        assert!(
            matches!(
                (at(&format!("replace macnet.{old}")), at(&format!("delete macnet.{old}"))),
                (Some(taken), Some(deleted)) if taken < deleted
            ),
            "{writes:?}"
        );
        // Its lock is never deleted: after the create that found it taken
        // (which started the reclaim), one re-key gives it to the new
        // identity, naming n1, before the old claim's delete.
        let lock = lock_name("macnet", ip);
        let lock_writes: Vec<&str> = writes
            .iter()
            .copied()
            .filter(|w| w.ends_with(&format!(" lock {lock}")))
            .collect();
        assert_eq!(
            lock_writes,
            [format!("create lock {lock}"), format!("rekey lock {lock}")],
            "{writes:?}"
        );
        assert!(
            writes
                .iter()
                .position(|w| *w == format!("rekey lock {lock}"))
                < at(&format!("delete macnet.{old}")),
            "{writes:?}"
        );
        let stored = api.claims.borrow();
        let mine = stored.values().find(|o| o.claim.ip == ip).unwrap();
        assert_eq!(mine.claim.identity, key);
        assert_eq!(mine.claim.holder.as_ref().unwrap().node, "n1");
        drop(stored);
        assert_eq!(api.locks.borrow()[&lock].node.as_deref(), Some("n1"));
        locks_match(&api);
    }

    /// Whether the plugin probes `g` before binding it (kubernetes store).
    fn probed(g: &crate::engine::Grant, r: &AddRequest) -> bool {
        crate::probe_policy::needs_wire_check(
            &g.origin,
            g.unconfirmed,
            &r.identity,
            crate::probe_policy::StoreScope::Cluster,
            &r.holder.node,
            false,
        )
    }

    /// ADD as cni_ipam does it, returning the grants.
    fn grants(api: &FakeApi, on: &Node, r: &AddRequest) -> Vec<crate::engine::Grant> {
        let mut store = on.store(api);
        let inspector = KubeInspector::new(api, node(&r.holder.node));
        let (_, grants) = crate::store::retry::with_retries(&mut store, "ADD", |s| {
            plan_add(&conf(), s, &inspector, r)
        })
        .unwrap();
        grants
    }

    /// reconcile's sweep of the network, from a pod on no node of ours.
    fn reconcile(api: &FakeApi) -> usize {
        let mut store = KubeStore::new(api, "macnet", None, vec![]);
        let inspector = KubeInspector::new(api, node("reconcile-pod"));
        let (_, released) = crate::store::retry::with_retries(&mut store, "reconcile", |s| {
            crate::engine::plan_reconcile(s, &inspector, 5).map(|(p, r, _)| (p, r))
        })
        .unwrap();
        released.len()
    }

    /// The same pod name, re-created with a new UID on `node`.
    fn recreated(identity: &str, pod: &str, node: &str) -> AddRequest {
        let mut r = req(identity, true, pod, node);
        r.holder.container_id = format!("c-{pod}-new");
        r.holder.pod_uid = Some(format!("uid-{pod}-new"));
        r.caller.pod_uid = r.holder.pod_uid.clone();
        r
    }

    #[test]
    fn a_claim_reconcile_released_is_probed_when_the_recreated_pod_takes_it() {
        // Issue 26 item 1: db-0 runs on n1, whose API link is cut while its
        // fabric link is up; db-0 is force-deleted and re-created on n2,
        // whose takeover the probe refuses; reconcile then judges the old
        // holder dead ("no longer exists") and releases the claim.
        let api = FakeApi::default();
        let (n1, n2) = (Node::new(), Node::new());
        running(&api, "db-0", "n1");
        let mut r = req("ns/db-0", true, "db-0", "n1");
        r.identity.source = IdentitySource::StatefulSet;
        let first = grants(&api, &n1, &r);
        api.pods.borrow_mut().remove("ns/db-0");
        assert_eq!(reconcile(&api), 1);
        // kubelet's next retry on n2 finds the claim unheld: it must still
        // be probed, the old db-0 may answer on the fabric.
        let mut again = recreated("ns/db-0", "db-0", "n2");
        again.identity.source = IdentitySource::StatefulSet;
        api.pods.borrow_mut().insert(
            "ns/db-0".into(),
            PodFacts {
                uid: "uid-db-0-new".into(),
                node: Some("n2".into()),
                phase: Some("Running".into()),
                ..PodFacts::default()
            },
        );
        let g = grants(&api, &n2, &again);
        assert_eq!(g[0].ip, first[0].ip);
        assert!(probed(&g[0], &again), "{g:?}");
    }

    #[test]
    fn a_dynamic_address_reconcile_released_is_probed_when_it_is_handed_out_again() {
        let api = FakeApi::default();
        let (n1, n2) = (Node::new(), Node::new());
        // The pool (10 addresses) held by n2's Deployment pods, whose node
        // is cut from the API; they are force-deleted, reconcile frees them.
        let mut held = Vec::new();
        for i in 0..10 {
            let pod = format!("web-{i}");
            running(&api, &pod, "n2");
            let key = dynamic_key(&format!("c-{pod}"), "net1");
            held.extend(grants(&api, &n2, &req(&key, false, &pod, "n2")));
            api.pods.borrow_mut().remove(&format!("ns/{pod}"));
        }
        assert_eq!(reconcile(&api), 10);
        running(&api, "new", "n1");
        let key = dynamic_key("c-new", "net1");
        let r = req(&key, false, "new", "n1");
        let g = grants(&api, &n1, &r);
        assert!(held.iter().any(|h| h.ip == g[0].ip));
        assert!(probed(&g[0], &r), "{g:?}");
    }

    /// A lock an ADD on `node` made at `ip` for `identity`, `age` seconds
    /// ago by the API server's clock, whose claim never followed.
    fn orphan(api: &FakeApi, ip: &str, identity: &str, node: &str, age: u64) -> LockObject {
        api.clock.set(Some(now_secs() - age));
        let lock = api
            .create_lock(&LockObject {
                network: "macnet".into(),
                ip: ip.parse().unwrap(),
                identity: identity.into(),
                created: 0,
                uid: None,
                node: Some(node.into()),
                unconfirmed: None,
                resource_version: None,
                adoptions: 0,
                written: None,
            })
            .unwrap();
        api.clock.set(None);
        lock
    }

    /// The pool's tenth address (10.0.0.19) locked by an ADD of n2's that
    /// never made its claim, `age` seconds ago; the other nine held by live
    /// pods on n2. The caller answers to the node-scope policy as n1.
    fn full_but_an_orphan(api: &FakeApi, n2: &Node, age: u64) -> String {
        let crashed = dynamic_key("c-crashed", "net1");
        orphan(api, "10.0.0.19", &crashed, "n2", age);
        *api.node_scope.borrow_mut() = Some("n2".into());
        for i in 0..9 {
            let pod = format!("live-{i}");
            running(api, &pod, "n2");
            let key = dynamic_key(&format!("c-{pod}"), "net1");
            grants(api, n2, &req(&key, false, &pod, "n2"));
        }
        *api.node_scope.borrow_mut() = Some("n1".into());
        crashed
    }

    /// A new Deployment pod's ADD on n1, with its retries.
    fn add_new_pod(
        api: &FakeApi,
        n1: &Node,
    ) -> (AddRequest, Result<Vec<crate::engine::Grant>, CniError>) {
        running(api, "new", "n1");
        let r = req(&dynamic_key("c-new", "net1"), false, "new", "n1");
        let mut store = n1.store(api);
        let inspector = KubeInspector::new(api, node("n1"));
        let got = crate::store::retry::with_retries(&mut store, "ADD", |s| {
            plan_add(&conf(), s, &inspector, &r)
        })
        .map(|(_, g)| g)
        .map_err(CniError::from);
        (r, got)
    }

    #[test]
    fn an_exhausted_pool_reclaims_an_old_orphan_lock_probed_and_keeps_a_young_one() {
        // Issue 26 item 10: without the reconcile Deployment nothing removed
        // a lock an ADD left behind, and the exhaustion hint named a command
        // that cannot remove one.
        let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
        // 30 s old: an ADD may be between its lock and its claim.
        full_but_an_orphan(&api, &n2, 30);
        let e = add_new_pod(&api, &n1).1.unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
        assert_eq!(api.locks.borrow().len(), 10);
        // Past the grace, the ADD that made it is long dead: the pool takes
        // the address back, takes n2's lock over (node scope) and probes the
        // address, since that ADD may have bound it unseen.
        let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
        full_but_an_orphan(&api, &n2, ORPHAN_LOCK_GRACE_SECS + 60);
        let (r, got) = add_new_pod(&api, &n1);
        let g = got.unwrap();
        assert_eq!(g[0].ip.to_string(), "10.0.0.19");
        assert!(g[0].reclaimed && probed(&g[0], &r), "{g:?}");
        let lock = api.locks.borrow()[&lock_name("macnet", g[0].ip)].clone();
        assert_eq!(lock.identity, r.identity.key);
        assert_eq!(lock.node.as_deref(), Some("n1"));
    }

    #[test]
    fn a_reclaim_of_an_orphan_lock_an_add_adopts_meanwhile_plans_again() {
        let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
        let crashed = full_but_an_orphan(&api, &n2, ORPHAN_LOCK_GRACE_SECS + 60);
        // Between the reclaim's listing and its re-key, the crashed ADD's
        // retry adopts the lock (and is about to write its claim).
        *api.before.borrow_mut() = Some((
            "rekey lock".into(),
            Box::new(|api: &FakeApi| {
                let name = lock_name("macnet", "10.0.0.19".parse().unwrap());
                let lock = api.locks.borrow()[&name].clone();
                // n2's ADD, answering to the policy as n2.
                let caller = api.node_scope.replace(Some("n2".into()));
                api.adopt_lock(&lock, Some("n2")).unwrap();
                *api.node_scope.borrow_mut() = caller;
            }),
        ));
        // The adopted lock is young again: the pool is full.
        let e = add_new_pod(&api, &n1).1.unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
        let name = lock_name("macnet", "10.0.0.19".parse().unwrap());
        assert_eq!(
            api.locks.borrow()[&name].identity,
            crashed,
            "the adopted lock stays"
        );
    }

    #[test]
    fn a_takeover_from_another_node_and_its_confirmation_cost_five_requests() {
        // Found by review: the confirmation read the claim through its lock
        // (two GETs) instead of the cache the ADD had just written. The
        // lock is taken along (I14), before the claim: one request more.
        let api = FakeApi::default();
        let (n1, n2) = (Node::new(), Node::new());
        running(&api, "rs0-0", "n1");
        add(&api, Some(&n1), &req("peer-a", true, "rs0-0", "n1")).unwrap();
        api.pods.borrow_mut().clear();
        running(&api, "rs0-1", "n2");
        let r = req("peer-a", true, "rs0-1", "n2");
        let (g, mut calls) = counted(&api, || grants(&api, &n2, &r));
        assert!(g[0].unconfirmed);
        let (_, confirm) = counted(&api, || {
            let mut store = n2.store(&api);
            crate::store::retry::with_retries(&mut store, "confirm", |s| {
                crate::engine::plan_confirm(s, &[g[0].ip], &r.holder.container_id, "net1")
                    .map(|p| (p, ()))
            })
            .unwrap()
        });
        assert_eq!(confirm.len(), 1, "one write: {confirm:?}");
        calls.extend(confirm);
        assert_eq!(calls.len(), 5, "{calls:?}");
        assert!(
            calls[2].starts_with("rekey lock ") && calls[3].starts_with("replace "),
            "{calls:?}"
        );
        let held = api.claims.borrow().values().next().unwrap().claim.clone();
        assert!(held.unconfirmed.is_none() && held.held_by(&r.holder.container_id, "net1"));
    }

    // ---- an address changing identity on the kubernetes store ----

    /// A one-address network.
    fn one_conf() -> IpamConfig {
        IpamConfig::parse(
            "macnet",
            &json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.10"}),
        )
        .unwrap()
    }

    /// ADD on the one-address network, with its retries.
    fn grants_one(
        api: &FakeApi,
        dir: &std::path::Path,
        r: &AddRequest,
    ) -> crate::store::PlanResult<Vec<crate::engine::Grant>> {
        let mut store = store_in(dir, api);
        let inspector = KubeInspector::new(api, node(&r.holder.node));
        crate::store::retry::with_retries(&mut store, "ADD", |s| {
            plan_add(&one_conf(), s, &inspector, r)
        })
        .map(|(_, g)| g)
    }

    /// Runs RACE just before the first request that follows a write of
    /// the existing lock LOCK (a delete, a re-key, a takeover; not a
    /// create, which a collision makes before any reclaim): another
    /// client's requests landing between two of the caller's.
    fn after_lock_write(api: &FakeApi, lock: String, race: crate::kube::fake::Race) {
        *api.before.borrow_mut() = Some((
            String::new(),
            Box::new(move |api: &FakeApi| {
                let last = api.calls.borrow().last().cloned().unwrap_or_default();
                let wrote = ["delete", "rekey", "adopt", "take"]
                    .iter()
                    .any(|verb| last == format!("{verb} lock {lock}"));
                if wrote {
                    race(api)
                } else {
                    after_lock_write(api, lock, race)
                }
            }),
        ));
    }

    /// web-0 on n3 had the one address; reconcile judged it dead and left
    /// a tombstone. Returns the address.
    fn tombstone_on_the_only_address(api: &FakeApi, n3: &Node) -> IpAddr {
        running(api, "web-0", "n3");
        let k0 = dynamic_key("c-web-0", "net1");
        let first = grants_one(api, &n3.dir, &req(&k0, false, "web-0", "n3")).unwrap();
        api.pods.borrow_mut().remove("ns/web-0");
        assert_eq!(reconcile(api), 1);
        let ip = first[0].ip;
        let lock = &api.locks.borrow()[&lock_name("macnet", ip)];
        assert_eq!(lock.identity, k0, "the tombstone keeps its lock");
        ip
    }

    /// The ADD another node (n2) makes in the middle of n1's writes: it
    /// must not get the address unprobed. Returns whether it ran.
    type Stolen = std::rc::Rc<
        std::cell::RefCell<Option<crate::store::PlanResult<Vec<crate::engine::Grant>>>>,
    >;

    fn n2s_add(n2dir: PathBuf, out: Stolen) -> crate::kube::fake::Race {
        Box::new(move |api: &FakeApi| {
            let r2 = req(&dynamic_key("c-new2", "net1"), false, "new2", "n2");
            *out.borrow_mut() = Some(grants_one(api, &n2dir, &r2));
        })
    }

    fn never_unprobed(stolen: &Stolen, ip: IpAddr) {
        let r2 = req(&dynamic_key("c-new2", "net1"), false, "new2", "n2");
        match stolen.borrow().as_ref().expect("n2's ADD ran") {
            Ok(g2) => {
                assert_eq!(g2[0].ip, ip);
                assert!(probed(&g2[0], &r2), "{ip} went to n2 unprobed: {g2:?}");
            }
            Err(e) => eprintln!("n2's ADD, in the middle: {e:?}"),
        }
    }

    /// n1's ADD reclaims the tombstone (exhausted pool: identity changes
    /// at one IP); n2's next-fit lands right after n1's first write of
    /// the lock. The address is never unlocked, so n2 finds it taken (or
    /// gets it probed), never fresh.
    #[test]
    fn a_tombstone_reclaim_never_lets_another_nodes_next_fit_take_the_address_fresh() {
        let api = FakeApi::default();
        let (n1, n2, n3) = (Node::new(), Node::new(), Node::new());
        let ip = tombstone_on_the_only_address(&api, &n3);
        running(&api, "new1", "n1");
        running(&api, "new2", "n2");
        // n1 answers to the node-scope policy: n3's lock is re-keyed
        // naming n1.
        *api.node_scope.borrow_mut() = Some("n1".into());
        let stolen: Stolen = Default::default();
        after_lock_write(
            &api,
            lock_name("macnet", ip),
            n2s_add(n2.dir.clone(), stolen.clone()),
        );
        let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
        let g1 = grants_one(&api, &n1.dir, &r1);
        never_unprobed(&stolen, ip);
        let g1 = g1.unwrap();
        assert_eq!(g1[0].ip, ip);
        assert!(probed(&g1[0], &r1), "{g1:?}");
        locks_match(&api);
    }

    /// The same reclaim with the API gone after n1's first write of the
    /// lock (and, second case, at the new claim's create): the address
    /// stays locked; the next ADD elsewhere does not get it unprobed.
    #[test]
    fn a_timeout_in_the_middle_of_a_reclaim_leaves_the_address_locked() {
        for at_create in [false, true] {
            let api = FakeApi::default();
            let (n1, n2, n3) = (Node::new(), Node::new(), Node::new());
            let ip = tombstone_on_the_only_address(&api, &n3);
            running(&api, "new1", "n1");
            running(&api, "new2", "n2");
            let gone: crate::kube::fake::Race = Box::new(|api: &FakeApi| api.unreachable.set(true));
            if at_create {
                let name = claim_name("macnet", &dynamic_key("c-new1", "net1"), Family::V4);
                *api.before.borrow_mut() = Some((format!("create {name}"), gone));
            } else {
                after_lock_write(&api, lock_name("macnet", ip), gone);
            }
            let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
            assert!(grants_one(&api, &n1.dir, &r1).is_err());
            api.unreachable.set(false);
            assert!(
                api.locks.borrow().contains_key(&lock_name("macnet", ip)),
                "at_create {at_create}: {ip} was unlocked"
            );
            let r2 = req(&dynamic_key("c-new2", "net1"), false, "new2", "n2");
            if let Ok(g2) = grants_one(&api, &n2.dir, &r2) {
                assert_eq!(g2[0].ip, ip);
                assert!(
                    probed(&g2[0], &r2),
                    "at_create {at_create}: {ip} went to n2 unprobed: {g2:?}"
                );
            }
        }
    }

    /// n1 reclaims the tombstone and its probe hears web-0 answer: the
    /// undo gives the address back to the tombstone. n2's next-fit lands
    /// right after the undo's first write of the lock: it must not get
    /// the address a probe has just heard answer, unprobed.
    #[test]
    fn an_undo_after_an_answered_probe_never_hands_the_address_out_fresh() {
        let api = FakeApi::default();
        let (n1, n2, n3) = (Node::new(), Node::new(), Node::new());
        let ip = tombstone_on_the_only_address(&api, &n3);
        running(&api, "new1", "n1");
        running(&api, "new2", "n2");
        let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
        let (done, g1) = {
            let mut store = n1.store(&api);
            let inspector = KubeInspector::new(&api, node("n1"));
            crate::store::retry::with_retries(&mut store, "ADD", |s| {
                plan_add(&one_conf(), s, &inspector, &r1)
            })
            .unwrap()
        };
        assert!(probed(&g1[0], &r1));
        // n1 answers to the node-scope policy: its re-key back names itself.
        *api.node_scope.borrow_mut() = Some("n1".into());
        let stolen: Stolen = Default::default();
        after_lock_write(
            &api,
            lock_name("macnet", ip),
            n2s_add(n2.dir.clone(), stolen.clone()),
        );
        let mut store = n1.store(&api);
        crate::store::retry::with_retries(&mut store, "undo", |s| {
            crate::engine::plan_undo(s, &done).map(|p| (p, ()))
        })
        .unwrap();
        never_unprobed(&stolen, ip);
        // The tombstone is back, marked, and its lock names it.
        let k0 = dynamic_key("c-web-0", "net1");
        let back = api.claims.borrow()[&claim_name("macnet", &k0, Family::V4)]
            .claim
            .clone();
        assert!(
            back.unconfirmed.is_some() && back.holder.is_none(),
            "{back:?}"
        );
        locks_match(&api);
    }

    /// The reclaim's failure points past its re-key: a claim delete that
    /// fails gives the lock back to the tombstone (and the plan is made
    /// again); a claim create that fails leaves the lock to the new
    /// identity (an orphan: a reservation), never unlocked.
    #[test]
    fn a_reclaim_that_fails_after_its_rekey_keeps_the_address_locked() {
        let api = FakeApi::default();
        let (n1, n3) = (Node::new(), Node::new());
        let ip = tombstone_on_the_only_address(&api, &n3);
        let lock = lock_name("macnet", ip);
        let k0 = dynamic_key("c-web-0", "net1");
        running(&api, "new1", "n1");
        let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
        // The old claim's delete answers 409 once: the lock goes back to
        // the tombstone, and the retry reclaims it again.
        let old = claim_name("macnet", &k0, Family::V4);
        *api.before.borrow_mut() = Some((
            format!("delete {old}"),
            Box::new(|api: &FakeApi| api.inject_conflicts.set(1)),
        ));
        let (g1, calls) = counted(&api, || grants_one(&api, &n1.dir, &r1));
        assert!(probed(&g1.unwrap()[0], &r1));
        let lock_writes: Vec<&String> = calls
            .iter()
            .filter(|c| *c == &format!("rekey lock {lock}") || c.starts_with("delete "))
            .collect();
        assert_eq!(
            lock_writes,
            [
                &format!("rekey lock {lock}"),
                &format!("delete {old}"),
                &format!("rekey lock {lock}"),
                &format!("rekey lock {lock}"),
                &format!("delete {old}"),
            ],
            "{calls:?}"
        );
        assert!(
            !calls.iter().any(|c| c.starts_with("delete lock")),
            "{calls:?}"
        );
        locks_match(&api);

        // Undo it, with the tombstone's create refused: the lock stays,
        // the tombstone's identity's, and n1's claim is gone.
        let api = FakeApi::default();
        let (n1, n3) = (Node::new(), Node::new());
        let ip = tombstone_on_the_only_address(&api, &n3);
        running(&api, "new1", "n1");
        let (done, _) = {
            let mut store = n1.store(&api);
            let inspector = KubeInspector::new(&api, node("n1"));
            crate::store::retry::with_retries(&mut store, "ADD", |s| {
                plan_add(&one_conf(), s, &inspector, &r1)
            })
            .unwrap()
        };
        *api.before.borrow_mut() = Some((
            format!("create {old}"),
            Box::new(|api: &FakeApi| api.unreachable.set(true)),
        ));
        let mut store = n1.store(&api);
        let undone = crate::engine::plan_undo(&mut store, &done)
            .and_then(|p| store.commit(&p).map_err(crate::store::PlanError::from));
        api.unreachable.set(false);
        assert!(undone.is_err());
        let mut locks = api.locks.borrow_mut();
        let left = locks.get_mut(&lock_name("macnet", ip)).unwrap();
        assert_eq!(left.identity, k0, "{left:?}");
        assert!(api.claims.borrow().is_empty());
        // Issue 26 (left by the re-key): that orphan was re-keyed on a
        // judgement, so it is marked, and reconcile's sweep keeps it long
        // past the grace: a tombstone probed before its address is bound.
        assert!(left.unconfirmed.is_some(), "{left:?}");
        left.created = now_secs() - 3600;
        left.written = Some(left.created);
        drop(locks);
        let mut sweeper = KubeStore::new(&api, "macnet", None, vec![None]);
        let swept = sweeper.sweep_locks(ORPHAN_LOCK_GRACE_SECS).unwrap();
        assert_eq!(swept, LockSweep::default());
        let stone = sweeper.claim(ip).unwrap().unwrap();
        assert!(stone.is_tombstone(), "{stone:?}");
    }

    /// Issue 26 (the review of I7): a sticky identity whose holder on n1
    /// is judged dead moves to an address its ADD on n2 asks for: n2 takes
    /// the old claim over and leaves a tombstone on its address (a re-key,
    /// under the node-scope policy), never a free address.
    #[test]
    fn an_identity_moving_from_a_dead_holder_elsewhere_leaves_a_tombstone() {
        let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
        *api.node_scope.borrow_mut() = Some("n1".into());
        running(&api, "db-0", "n1");
        let old = add(&api, Some(&n1), &req("db", true, "db-0", "n1")).unwrap()[0];
        // db-0 is re-created on n2 and asks for another address.
        *api.node_scope.borrow_mut() = Some("n2".into());
        let mut moved = req("db", true, "db-0b", "n2");
        moved.requested = vec!["10.0.0.15".parse().unwrap()];
        running(&api, "db-0b", "n2");
        api.pods.borrow_mut().remove("ns/db-0");
        let got = add(&api, Some(&n2), &moved).unwrap();
        assert_eq!(got, vec!["10.0.0.15".parse::<IpAddr>().unwrap()]);
        let mut store = KubeStore::new(&api, "macnet", None, vec![None]);
        let stone = store.claim(old).unwrap().unwrap();
        assert!(stone.is_tombstone(), "{stone:?}");
        assert_eq!(stone.identity, crate::identity::displaced_key("db", old));
        let lock = api.locks.borrow()[&lock_name("macnet", old)].clone();
        assert!(
            lock.unconfirmed.is_some() && lock.node.as_deref() == Some("n2"),
            "{lock:?}"
        );
        locks_match(&api);
    }

    /// Issue 26 item 6, found by the review of its fix: a node that
    /// renames itself onto the lock of another node's live claim keeps it
    /// marked through reconcile (the mark clears only for the node holding
    /// the claim), and a sticky identity taken over on another node takes
    /// its lock along, so the old node never has an unmarked lock to delete.
    #[test]
    fn no_node_is_left_a_deletable_lock_under_another_nodes_live_claim() {
        let (api, n2) = (FakeApi::default(), Node::new());
        *api.node_scope.borrow_mut() = Some("n2".into());
        running(&api, "db-0", "n2");
        let ip = add(&api, Some(&n2), &req("db", true, "db-0", "n2")).unwrap()[0];
        let name = lock_name("macnet", ip);
        // n1 renames itself onto n2's lock (allowed only marked).
        *api.node_scope.borrow_mut() = Some("n1".into());
        let theirs = api.locks.borrow()[&name].clone();
        let renamed = api.adopt_lock(&theirs, Some("n1")).unwrap();
        assert!(renamed.unconfirmed.is_some(), "{renamed:?}");
        *api.node_scope.borrow_mut() = None;
        let mut sweeper = KubeStore::new(&api, "macnet", None, vec![None]);
        let swept = sweeper.sweep_locks(ORPHAN_LOCK_GRACE_SECS).unwrap();
        assert_eq!(
            swept,
            LockSweep::default(),
            "reconcile cleared the renamer's mark"
        );
        *api.node_scope.borrow_mut() = Some("n1".into());
        let uid = renamed.uid.clone().unwrap();
        let e = api.delete_lock(&name, &uid, None).unwrap_err();
        assert!(matches!(e, ApiError::Refused(_)), "{e:?}");

        // db-0 moves to n1 (its pod on n2 gone): n1's takeover takes the
        // lock along, marked, so n2 has nothing of its own to delete.
        let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
        *api.node_scope.borrow_mut() = Some("n2".into());
        running(&api, "db-0", "n2");
        let ip = add(&api, Some(&n2), &req("db", true, "db-0", "n2")).unwrap()[0];
        api.pods.borrow_mut().clear();
        *api.node_scope.borrow_mut() = Some("n1".into());
        running(&api, "db-0b", "n1");
        assert_eq!(
            add(&api, Some(&n1), &req("db", true, "db-0b", "n1")).unwrap(),
            vec![ip]
        );
        let lock = api.locks.borrow()[&lock_name("macnet", ip)].clone();
        assert_eq!(lock.node.as_deref(), Some("n1"), "{lock:?}");
        assert!(lock.unconfirmed.is_some(), "{lock:?}");
        *api.node_scope.borrow_mut() = Some("n2".into());
        let e = api
            .delete_lock(&lock_name("macnet", ip), lock.uid.as_deref().unwrap(), None)
            .unwrap_err();
        assert!(matches!(e, ApiError::Refused(_)), "{e:?}");
        locks_match(&api);
    }

    /// Issue 26 item 6, closed in the data model: a lock that changed
    /// hands from another node is marked, no node may delete a marked
    /// lock, so its claim's own DEL leaves it a tombstone (no other node's
    /// next-fit binds its address fresh) until reconcile, seeing the claim
    /// confirmed, clears the mark.
    #[test]
    fn a_lock_taken_from_another_node_outlives_its_claim_until_reconcile_clears_it() {
        for reconcile_first in [false, true] {
            let api = FakeApi::default();
            let (n1, n3) = (Node::new(), Node::new());
            *api.node_scope.borrow_mut() = Some("n3".into());
            let ip = tombstone_on_the_only_address(&api, &n3);
            *api.node_scope.borrow_mut() = Some("n1".into());
            running(&api, "new1", "n1");
            let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
            let g = grants_one(&api, &n1.dir, &r1).unwrap();
            assert_eq!(g[0].ip, ip);
            let name = lock_name("macnet", ip);
            let taken = api.locks.borrow()[&name].clone();
            assert_eq!(taken.node.as_deref(), Some("n1"));
            assert!(taken.unconfirmed.is_some(), "{taken:?}");
            // Its probe heard nobody: the plugin's confirmation.
            let mut store = n1.store(&api);
            let plan = crate::engine::plan_confirm(&mut store, &[ip], "c-new1", "net1").unwrap();
            store.commit(&plan).unwrap();
            drop(store);
            if reconcile_first {
                *api.node_scope.borrow_mut() = None;
                let mut sweeper = KubeStore::new(&api, "macnet", None, vec![None]);
                let swept = sweeper.sweep_locks(ORPHAN_LOCK_GRACE_SECS).unwrap();
                assert_eq!(swept.cleared, vec![ip]);
                *api.node_scope.borrow_mut() = Some("n1".into());
            }
            del(&api, &n1, "c-new1");
            assert!(api.claims.borrow().is_empty(), "the DEL freed its claim");
            let left = api.locks.borrow().get(&name).cloned();
            if reconcile_first {
                assert_eq!(left, None, "a confirmed lock is freed by its DEL");
                continue;
            }
            let left = left.expect("a marked lock outlives its claim");
            assert!(left.unconfirmed.is_some(), "{left:?}");
            // Until it is older than an ADD can take it reserves the
            // address for its identity (an ADD between a re-key and its
            // claim looks the same); say the pod ran for an hour.
            if let Some(l) = api.locks.borrow_mut().get_mut(&name) {
                l.written = Some(now_secs() - 3600);
                l.created = now_secs() - 3600;
            }
            // Another node's next ADD finds the address taken, and its
            // exhausted pool's reclaim probes it.
            let n2 = Node::new();
            *api.node_scope.borrow_mut() = Some("n2".into());
            running(&api, "new2", "n2");
            let r2 = req(&dynamic_key("c-new2", "net1"), false, "new2", "n2");
            let g = grants_one(&api, &n2.dir, &r2).unwrap();
            assert_eq!(g[0].ip, ip);
            assert!(probed(&g[0], &r2), "{g:?}");
        }
    }

    /// Under the node-scope policy a re-key names the node that writes it.
    #[test]
    fn a_rekey_naming_another_node_is_refused_under_node_scope() {
        let api = FakeApi::default();
        let n3 = Node::new();
        let ip = tombstone_on_the_only_address(&api, &n3);
        let read = api.locks.borrow()[&lock_name("macnet", ip)].clone();
        *api.node_scope.borrow_mut() = Some("n1".into());
        let judged = Unconfirmed {
            since: 1,
            why: "test".into(),
        };
        let e = api
            .rekey_lock(&read, "other", Some("n2"), &judged)
            .unwrap_err();
        assert!(matches!(e, ApiError::Refused(_)), "{e:?}");
        let got = api.rekey_lock(&read, "other", Some("n1"), &judged).unwrap();
        assert_eq!(
            (got.identity.as_str(), got.node.as_deref()),
            ("other", Some("n1"))
        );
        assert!(got.unconfirmed.is_some(), "a re-key marks the lock");
        // At the version read, once: the next one conflicts.
        let e = api
            .rekey_lock(&read, "third", Some("n1"), &judged)
            .unwrap_err();
        assert!(matches!(e, ApiError::Conflict(_)), "{e:?}");
    }

    #[test]
    fn request_counts_on_the_common_paths() {
        let api = FakeApi::default();
        let n1 = Node::new();
        running(&api, "rs0-0", "n1");
        // Sticky, first ADD ever: look for the identity's claim, lock, claim.
        let (first, calls) = counted(&api, || {
            add(&api, Some(&n1), &req("peer-a", true, "rs0-0", "n1")).unwrap()
        });
        assert_eq!(calls.len(), 3, "{calls:?}");
        // Same pod, new sandbox: one write, on the cached resourceVersion.
        let mut again = req("peer-a", true, "rs0-0", "n1");
        again.holder.container_id = "c-new".into();
        let (second, calls) = counted(&api, || add(&api, Some(&n1), &again).unwrap());
        assert_eq!(second, first);
        assert_eq!(
            calls,
            vec![format!(
                "replace {}",
                claim_name("macnet", "peer-a", Family::V4)
            )]
        );
        // DEL: one write (sticky: reserved).
        let ((), calls) = counted(&api, || del(&api, &n1, "c-new"));
        assert_eq!(calls.len(), 1, "{calls:?}");
        let stored = api.claims.borrow().values().next().cloned().unwrap();
        assert!(stored.claim.holder.is_none() && stored.claim.sticky);
        // A second DEL of the same attachment: nothing to ask.
        let ((), calls) = counted(&api, || del(&api, &n1, "c-new"));
        assert!(calls.is_empty(), "{calls:?}");
        // Dynamic: lock and claim; its DEL deletes both.
        let key = dynamic_key("c-web", "net1");
        let (_, calls) = counted(&api, || {
            add(&api, Some(&n1), &req(&key, false, "web", "n1")).unwrap()
        });
        assert_eq!(calls.len(), 2, "{calls:?}");
        let ((), calls) = counted(&api, || del(&api, &n1, "c-web"));
        assert_eq!(calls.len(), 2, "{calls:?}");
        // Takeover on another node, old pod gone: the claim, the old pod, one write.
        api.pods.borrow_mut().clear();
        running(&api, "rs0-1", "n2");
        let n2 = Node::new();
        let (moved, calls) = counted(&api, || {
            add(&api, Some(&n2), &req("peer-a", true, "rs0-1", "n2")).unwrap()
        });
        assert_eq!(moved, first);
        assert_eq!(
            calls.len(),
            2,
            "the claim is reserved, so no pod lookup: {calls:?}"
        );
        locks_match(&api);
        // No listing anywhere on these paths.
        assert_eq!(api.count("list"), 0);
    }

    #[test]
    fn a_stale_node_local_cache_is_caught_by_the_precondition() {
        let api = FakeApi::default();
        let (n1, n2) = (Node::new(), Node::new());
        running(&api, "a", "n1");
        let first = add(&api, Some(&n1), &req("peer", true, "a", "n1")).unwrap();
        // The pod moves to n2 (its pod on n1 is gone), n2 takes the claim over.
        api.pods.borrow_mut().clear();
        running(&api, "b", "n2");
        assert_eq!(
            add(&api, Some(&n2), &req("peer", true, "b", "n2")).unwrap(),
            first
        );
        // n1's cache still says the claim is its pod's: its re-ADD for the
        // old pod must not be served from it.
        let e = add(&api, Some(&n1), &req("peer", true, "a", "n1")).unwrap_err();
        let e = cni::CniError::from(e);
        assert_eq!(e.code, cni::code::TRY_AGAIN_LATER, "{}", e.msg);
        assert!(e.msg.contains("ns/b"), "{}", e.msg);
        // And a retried ADD of the very attachment n1 recorded (the plan
        // writes nothing) is checked against the API too.
        let mut retried = req("peer", true, "a", "n1");
        retried.holder.container_id = "c-a".into();
        let e = cni::CniError::from(add(&api, Some(&n1), &retried).unwrap_err());
        assert_eq!(e.code, cni::code::TRY_AGAIN_LATER, "{}", e.msg);
        // n1's DEL of its old sandbox leaves n2's claim alone.
        del(&api, &n1, "c-a");
        let stored = api.claims.borrow().values().next().cloned().unwrap();
        assert_eq!(stored.claim.holder.unwrap().node, "n2");
    }

    /// Issue 26 (the review of I7): a confirmation whose write gets no
    /// answer keeps the node-local cache entry, so the pod's next re-ADD
    /// while the API is away is still served (probed) in degraded mode.
    #[test]
    fn a_confirmation_that_times_out_keeps_the_node_local_cache_entry() {
        let (api, n1) = (FakeApi::default(), Node::new());
        running(&api, "a", "n1");
        let ip = add(&api, Some(&n1), &req("peer", true, "a", "n1")).unwrap()[0];
        api.pods.borrow_mut().clear();
        running(&api, "b", "n1");
        add(&api, Some(&n1), &req("peer", true, "b", "n1")).unwrap();
        let mut store = n1.store(&api);
        let plan = crate::engine::plan_confirm(&mut store, &[ip], "c-b", "net1").unwrap();
        assert_eq!(plan.changes.len(), 1, "the takeover is marked: {plan:?}");
        *api.before.borrow_mut() = Some((
            "replace".into(),
            Box::new(|api: &FakeApi| api.unreachable.set(true)),
        ));
        let e = store.commit(&plan).unwrap_err();
        assert!(matches!(e, StoreError::Unreachable(_)), "{e:?}");
        let local = store.into_local().unwrap();
        assert!(confirmed_locally(&local, ip), "the cache entry was dropped");
    }

    #[test]
    fn concurrent_adds_of_one_identity_leave_one_claim() {
        let api = FakeApi::default();
        running(&api, "a", "n1");
        running(&api, "b", "n2");
        let ra = req("shared", true, "a", "n1");
        let rb = req("shared", true, "b", "n2");
        // n1 plans on an empty store, then n2 completes first.
        let mut store_a = KubeStore::new(
            &api,
            "macnet",
            None,
            vec![Some("10.0.0.14".parse().unwrap())],
        );
        let insp_a = KubeInspector::new(&api, node("n1"));
        let (plan_a, _) = plan_add(&conf(), &mut store_a, &insp_a, &ra).unwrap();
        let got_b = add(&api, None, &rb).unwrap();
        let e = store_a.commit(&plan_a).unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
        assert_eq!(per_identity(&api)["shared"], 1);
        assert_eq!(
            api.claims.borrow().values().next().unwrap().claim.ip,
            got_b[0]
        );
        // n1's lock on the address it planned is gone again.
        locks_match(&api);
        // Planned again, n1 finds the identity held by a running pod: 11.
        store_a.conflicted().unwrap();
        let e = cni::CniError::from(plan_add(&conf(), &mut store_a, &insp_a, &ra).unwrap_err());
        assert_eq!(e.code, cni::code::TRY_AGAIN_LATER);
        assert!(e.msg.contains("ns/b") && e.msg.contains("n2"), "{}", e.msg);
    }

    #[test]
    fn a_lost_race_mid_plan_is_rolled_back() {
        let api = FakeApi::default();
        let conf = IpamConfig::parse(
            "macnet",
            &json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/120"}]]}),
        )
        .unwrap();
        let r = req("dual", true, "p", "n1");
        let mut store = KubeStore::new(&api, "macnet", None, vec![None, None]);
        let insp = KubeInspector::new(&api, node("n1"));
        let (plan, _) = plan_add(&conf, &mut store, &insp, &r).unwrap();
        assert_eq!(plan.changes.len(), 2);
        // The v6 address is locked by someone else between planning and commit.
        let v6 = plan.changes[1].after.clone().unwrap();
        api.create_lock(&LockObject {
            network: "macnet".into(),
            ip: v6.ip,
            identity: "someone-else".into(),
            created: 1,
            uid: None,
            node: None,
            unconfirmed: None,
            resource_version: None,
            adoptions: 0,
            written: None,
        })
        .unwrap();
        let e = store.commit(&plan).unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
        // The v4 claim and lock it had created are gone again: nothing half-done.
        assert!(api.claims.borrow().is_empty());
        assert_eq!(api.locks.borrow().len(), 1);
        // The replan knows which addresses are taken and succeeds.
        store.conflicted().unwrap();
        let (plan, grants) = plan_add(&conf, &mut store, &insp, &r).unwrap();
        store.commit(&plan).unwrap();
        assert!(grants.iter().all(|g| g.ip != v6.ip));
        assert_eq!(per_identity(&api)["dual"], 2);
    }

    #[test]
    fn an_orphan_lock_keeps_its_address_until_reconcile_sweeps_it() {
        let api = FakeApi::default();
        let n1 = Node::new();
        // An ADD that crashed between its lock and its claim, long ago by
        // the API server's clock.
        let ip = old_orphan(&api, "crashed");
        // Next-fit from .12 skips the locked .13.
        running(&api, "x", "n1");
        running(&api, "y", "n1");
        let a = add(&api, Some(&n1), &req("x", true, "x", "n1")).unwrap();
        let b = add(&api, Some(&n1), &req("y", true, "y", "n1")).unwrap();
        assert!(!a.contains(&ip) && !b.contains(&ip), "{a:?} {b:?}");
        let mut store = n1.store(&api);
        let listing = store.list().unwrap();
        assert!(listing
            .claims
            .iter()
            .any(|c| c.ip == ip && c.identity == "crashed" && c.holder.is_none()));
        // A fresh lock survives the sweep, an old one does not.
        assert_eq!(
            store.sweep_locks(now_secs()).unwrap().freed,
            Vec::<IpAddr>::new()
        );
        assert_eq!(store.sweep_locks(60).unwrap().freed, vec![ip]);
        locks_match(&api);
    }

    /// An ADD that crashed between its lock and its claim, long ago: the
    /// orphan the sweep removes unless its identity's ADD adopts it.
    fn old_orphan(api: &FakeApi, identity: &str) -> IpAddr {
        // Made at second 1 of the API server's clock.
        orphan(api, "10.0.0.13", identity, "n1", now_secs() - 1).ip
    }

    /// The ADD that adopts the orphan on IP: its identity asks for it.
    fn adopt(api: &FakeApi, dir: &std::path::Path, identity: &str, ip: IpAddr) -> Vec<IpAddr> {
        running(api, "adopter", "n1");
        let mut r = req(identity, true, "adopter", "n1");
        r.requested = vec![ip];
        let mut store = store_in(dir, api);
        let inspector = KubeInspector::new(api, node("n1"));
        let (_, grants) = crate::store::retry::with_retries(&mut store, "ADD", |s| {
            plan_add(&conf(), s, &inspector, &r)
        })
        .unwrap();
        grants.iter().map(|g| g.ip).collect()
    }

    /// The lock on IP is still there, the identity's claim names IP.
    fn adopted_and_locked(api: &FakeApi, identity: &str, ip: IpAddr) {
        let claims = api.claims.borrow();
        let claim = claims
            .get(&claim_name("macnet", identity, Family::V4))
            .expect("the adopting ADD made its claim");
        assert_eq!(claim.claim.ip, ip);
        let locks = api.locks.borrow();
        let lock = locks.get(&lock_name("macnet", ip));
        assert!(
            lock.is_some_and(|l| l.identity == identity),
            "the claim on {ip} lost its lock: the address is free for a second identity ({locks:?})"
        );
    }

    #[test]
    fn an_adoption_between_the_sweeps_read_and_its_delete_keeps_the_lock() {
        let api = FakeApi::default();
        let n1 = Node::new();
        let ip = old_orphan(&api, "peer");
        // The sweep lists the locks and finds no claim of "peer"; the
        // adopting ADD runs before the sweep's delete.
        let lock = lock_name("macnet", ip);
        let adopted = std::rc::Rc::new(std::cell::Cell::new(Vec::new()));
        let (seen, dir) = (adopted.clone(), n1.dir.clone());
        let hook = Box::new(move |api: &FakeApi| seen.set(adopt(api, &dir, "peer", ip)));
        *api.before.borrow_mut() = Some((format!("delete lock {lock}"), hook));
        // The sweep is reconcile's: no node-local record.
        let mut sweeper = KubeStore::new(&api, "macnet", None, vec![None]);
        let freed = sweeper.sweep_locks(60).unwrap().freed;
        assert_eq!(adopted.take(), vec![ip], "the ADD adopted the orphan");
        assert_eq!(freed, Vec::<IpAddr>::new(), "the sweep missed the adoption");
        adopted_and_locked(&api, "peer", ip);
        locks_match(&api);
    }

    #[test]
    fn a_sweep_between_an_adoptions_lock_write_and_its_claim_keeps_the_lock() {
        let api = FakeApi::default();
        let n1 = Node::new();
        let ip = old_orphan(&api, "peer");
        // The whole sweep runs between the adopting ADD's write of the
        // lock (if any) and its claim create.
        let freed = std::rc::Rc::new(std::cell::Cell::new(Vec::new()));
        let seen = freed.clone();
        let hook = Box::new(move |api: &FakeApi| {
            let mut sweeper = KubeStore::new(api, "macnet", None, vec![None]);
            seen.set(sweeper.sweep_locks(60).unwrap().freed);
        });
        let claim = claim_name("macnet", "peer", Family::V4);
        *api.before.borrow_mut() = Some((format!("create {claim}"), hook));
        assert_eq!(adopt(&api, &n1.dir, "peer", ip), vec![ip]);
        assert_eq!(
            freed.take(),
            Vec::<IpAddr>::new(),
            "the sweep took an adopted lock"
        );
        adopted_and_locked(&api, "peer", ip);
        locks_match(&api);
    }

    #[test]
    fn a_lock_made_by_a_node_whose_clock_is_behind_is_not_old() {
        let api = FakeApi::default();
        let n1 = Node::new();
        // A node an hour behind: its lock says it was made an hour ago,
        // the API server made it just now.
        api.create_lock(&LockObject {
            network: "macnet".into(),
            ip: "10.0.0.13".parse().unwrap(),
            identity: "in-flight".into(),
            created: now_secs() - 3600,
            uid: None,
            node: Some("n1".into()),
            unconfirmed: None,
            resource_version: None,
            adoptions: 0,
            written: None,
        })
        .unwrap();
        let freed = n1
            .store(&api)
            .sweep_locks(ORPHAN_LOCK_GRACE_SECS)
            .unwrap()
            .freed;
        assert_eq!(freed, Vec::<IpAddr>::new(), "a fresh lock was swept");
        assert_eq!(api.locks.borrow().len(), 1);
    }

    #[test]
    fn injected_conflicts_keep_the_invariants() {
        let api = FakeApi::default();
        for i in 0..10 {
            api.inject_conflicts.set(i % 3);
            let r = req(&format!("id-{i}"), false, &format!("p{i}"), "n1");
            assert!(add(&api, None, &r).is_ok(), "ADD {i} never committed");
        }
        assert_eq!(api.claims.borrow().len(), 10);
        assert!(per_identity(&api).values().all(|n| *n == 1));
        locks_match(&api);
    }

    impl Drop for Node {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn node_offsets_spread() {
        let a = node_offset("node1", 250);
        let b = node_offset("node2", 250);
        assert!(a < 250 && b < 250 && a != b);
        assert_eq!(node_offset("x", 0), 0);
    }
}
