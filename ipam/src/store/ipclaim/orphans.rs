//! Locks no claim names: what an ADD that died between its lock and its
//! claim leaves, how the engine sees one, and reconcile's sweep of them.

use super::*;

/// How long ago the API server must have made or last changed a lock no
/// claim names before reconcile removes it: far longer than an ADD can
/// spend between its lock (made or adopted) and its claim (two requests,
/// each bounded by the client's timeout), with room for clock skew
/// between the API server and the reconcile pod.
pub const ORPHAN_LOCK_GRACE_SECS: u64 = 600;

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
pub(super) fn orphan_claim(lock: &LockObject, now: u64) -> Claim {
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

impl KubeStore<'_> {
    /// Deletes an orphan lock exactly as it was read: an ADD that adopted
    /// it since changed it, and the plan is made again (a conflict) rather
    /// than free an address a claim is about to name. One the node-scope
    /// policy keeps from this node (another node's, or marked) stays, as
    /// in `unlock`.
    pub(super) fn delete_orphan(&mut self, lock: &LockObject) -> StoreResult<()> {
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
        self.locks_seen.remove(&lock.ip);
        self.locks_read.remove(&lock.ip);
        Ok(())
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
