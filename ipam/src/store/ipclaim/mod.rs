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

mod commit;
mod inflight;
mod local_record;
mod orphans;

use inflight::{farther_along, Reservations};
pub use inflight::{Holds, RESERVATION_TTL};
use local_record::noted;
pub use local_record::{confirmed_locally, LocalRecord};
use orphans::orphan_claim;
pub use orphans::{LockSweep, ORPHAN_LOCK_GRACE_SECS};

/// The lock on an address as this node last saw it, from a read or write
/// of this command or from the node-local record: its UID, and, when known,
/// its resourceVersion with the adoption count it had then (any adoption
/// raises it). Its delete's preconditions (see `unlock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SeenLock {
    uid: String,
    resource_version: Option<String>,
    adoptions: u64,
}

pub struct KubeStore<'a> {
    api: &'a dyn KubeApi,
    network: String,
    /// The families of the network's range sets (both when unknown).
    families: Vec<Family>,
    /// resourceVersion of the claim on each address, as last read or written.
    versions: BTreeMap<IpAddr, String>,
    /// The lock on each address, as last read or written.
    locks_seen: BTreeMap<IpAddr, SeenLock>,
    /// The lock on each address as last read or written (its
    /// resourceVersion is a re-key's precondition).
    locks_read: BTreeMap<IpAddr, LockObject>,
    /// Locks no claim names, by address.
    orphans: BTreeMap<IpAddr, LockObject>,
    /// Claims answered from the node-local cache, not the API, as the
    /// plan read them.
    from_cache: BTreeMap<IpAddr, Claim>,
    /// Whether reads may come from the node-local cache: until a conflict.
    trust_cache: bool,
    /// Whether the last conflict was a lock create that found its address taken.
    collided: bool,
    /// The pool, once something needed it (exhaustion, GC, the CLI).
    pool: Option<BTreeMap<IpAddr, Claim>>,
    /// The network's locked addresses, loaded after a collision.
    taken: Option<BTreeSet<IpAddr>>,
    /// Node-local record and next-fit cursors (no API request).
    local: Option<LocalRecord>,
    /// The next-fit candidates this ADD tries, kept from this node's others.
    reservations: Option<Reservations>,
    /// Where each set's next-fit started, as `cursor` answered.
    cursors_read: BTreeMap<usize, Option<IpAddr>>,
    /// Whether this plan's walk passed an address another ADD reserved.
    skipped_reserved: bool,
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

impl<'a> KubeStore<'a> {
    pub fn new(
        api: &'a dyn KubeApi,
        network: &str,
        local: Option<LocalRecord>,
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
            locks_seen: BTreeMap::new(),
            locks_read: BTreeMap::new(),
            orphans: BTreeMap::new(),
            from_cache: BTreeMap::new(),
            trust_cache: true,
            collided: false,
            pool: None,
            taken: None,
            reservations: local.as_ref().map(|l| Reservations::new(&l.root())),
            cursors_read: BTreeMap::new(),
            skipped_reserved: false,
            local,
            prior: Vec::new(),
            first_cursors,
            writer: None,
        }
    }
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
        self.saw_lock(lock.clone());
        match self.fetch(&lock.identity, Family::of(ip))? {
            Some(c) if c.ip == ip => Ok(Some(c)),
            _ => {
                let orphan = orphan_claim(&lock, now_secs());
                self.orphans.insert(ip, lock);
                Ok(Some(orphan))
            }
        }
    }

    /// What was loaded after a collision, and the node's other ADDs'
    /// reservations: the lock create is the check. A walk on a listed
    /// pool (reclaim, the CLI) skips no reservation: it must find every
    /// address that is free; a walk that passed only reserved ones plans
    /// again (`list`) rather than reclaim or call the pool full.
    fn candidate_taken(&mut self, ip: IpAddr) -> StoreResult<bool> {
        Ok(match (&self.taken, &self.pool) {
            (Some(taken), _) => taken.contains(&ip) || self.reserved_by_another(ip),
            (None, Some(pool)) => pool.contains_key(&ip),
            (None, None) => self.reserved_by_another(ip),
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
            let local = self.read_local(|l| l.claims_of_identity(identity).map(|c| noted(l, c)))?;
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
        if self.local.is_none() {
            let objs = self
                .api
                .list_claims(&holder_selector(&self.network, container_id, ifname))
                .map_err(StoreError::from)?;
            return Ok(objs
                .into_iter()
                .filter_map(|o| self.remember(o))
                .filter(|c| c.held_by(container_id, ifname))
                .collect());
        }
        let hinted = self.read_local(|l| {
            l.claims_of_holder(container_id, ifname)
                .map(|c| noted(l, c))
        })?;
        let (mut held, unknown) = if self.trust_cache {
            self.cached(hinted)
        } else {
            (Vec::new(), hinted.into_iter().map(|(c, _)| c).collect())
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
        // Next-fit found nothing but passed addresses other ADDs of this
        // node are trying: the pool is not full, and reclaiming (or
        // refusing as exhausted) would be wrong. Planned again, after
        // the retry's pause, those are taken or free.
        if std::mem::take(&mut self.skipped_reserved) {
            return Err(StoreError::Conflict(format!(
                "every free address of network {:?} this ADD looked at is being tried by another ADD on this node: planning again",
                self.network
            )));
        }
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
            self.saw_lock((*lock).clone());
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
        let local = self.read_local(|l| l.cursor(set))?;
        let start = local.or_else(|| self.first_cursors.get(set).copied().flatten());
        self.cursors_read.insert(set, start);
        Ok(start)
    }

    fn commit(&mut self, plan: &Plan) -> StoreResult<()> {
        let _holds = self.hold(plan)?;
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
        self.locks_seen.clear();
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
#[path = "ipclaim_tests.rs"]
mod tests;
