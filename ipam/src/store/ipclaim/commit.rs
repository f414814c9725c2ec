//! A plan's changes as API writes, in the order that keeps a claim's
//! address locked for it (lock before claim, claim before unlock), undone
//! as far as they went when one fails.

use super::*;

impl KubeStore<'_> {
    pub(super) fn object(&self, claim: &Claim, resource_version: Option<String>) -> ClaimObject {
        ClaimObject {
            network: self.network.clone(),
            claim: claim.clone(),
            resource_version,
            lock_uid: self.locks_seen.get(&claim.ip).map(|s| s.uid.clone()),
        }
    }

    /// Lock, then claim. A claim create that loses (the identity has a
    /// claim in this family already) takes its lock back. An orphan lock
    /// of the identity is adopted: written first (`KubeApi::adopt_lock`, at
    /// the resourceVersion read), so a sweep that read it before fails its
    /// delete and one that reads it after finds it freshly written.
    pub(super) fn create(&mut self, after: &Claim) -> StoreResult<()> {
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
        self.saw_lock(lock);
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
                    self.unlock(after);
                }
                Err(e.into())
            }
        }
    }

    /// The lock as a read or write of this command, or the node-local
    /// record, last saw it: its UID and resourceVersion are the
    /// preconditions of what this node writes to it next.
    pub(super) fn saw_lock(&mut self, lock: LockObject) {
        let ip = lock.ip;
        match &lock.uid {
            Some(uid) => self.locks_seen.insert(
                ip,
                SeenLock {
                    uid: uid.clone(),
                    resource_version: lock.resource_version.clone(),
                    adoptions: lock.adoptions,
                },
            ),
            None => self.locks_seen.remove(&ip),
        };
        self.locks_read.insert(ip, lock);
    }

    /// Deletes the lock on `ip` if it is `identity`'s, at the UID and
    /// resourceVersion last seen (its create, or a read): once its claim is
    /// deleted the lock is an orphan, and an old one, which another ADD may
    /// adopt or re-key in place (same UID) for its own claim. A delete by
    /// UID alone would then unlock that claim's address for a third
    /// identity to lock and claim: one address on two claims. So a lock
    /// changed since it was seen is left, whoever changed it.
    ///
    /// Best effort: a lock left behind is an orphan, which keeps the address
    /// taken until reconcile removes it (or an exhausted pool reclaims it
    /// with a probe), never hands it out twice. A lock another node made,
    /// or one marked (I14), is not this node's to delete under the
    /// node-scope policy: it stays, an orphan whose address next-fit skips
    /// (a marked one is a tombstone probed before it is bound again).
    pub(super) fn unlock(&mut self, claim: &Claim) {
        let ip = claim.ip;
        let name = lock_name(&self.network, ip);
        self.locks_read.remove(&ip);
        self.orphans.remove(&ip);
        let seen = self.locks_seen.remove(&ip);
        if let Some(SeenLock {
            uid,
            resource_version: Some(rv),
            ..
        }) = &seen
        {
            match self.api.delete_lock(&name, uid, Some(rv)) {
                // Changed since it was seen: by reconcile clearing its mark
                // (it is still ours), or by another ADD's adoption or re-key
                // (it is theirs now). Read it to tell which.
                Err(ApiError::Conflict(_)) => {}
                done => return self.unlocked(&name, done),
            }
        }
        // Only the claim's record of its lock's UID, or nothing, or a lock
        // changed since: read it (one request more, on claims this node did
        // not make, or on the rare lock changed under its claim).
        let lock = match self.api.get_lock(&name) {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                return cni::log::warn(&format!(
                    "could not read iplock {name}: {e}; reconcile removes it once no claim names it"
                ))
            }
        };
        let ours = lock.identity == claim.identity
            && seen.is_none_or(|s| {
                lock.uid.as_ref() == Some(&s.uid)
                    && (s.resource_version.is_none() || s.adoptions == lock.adoptions)
            })
            && lock.unconfirmed.is_none()
            && (lock.node.is_none() || lock.node.as_deref() == claim.holder_node());
        match (ours, lock.uid, lock.resource_version) {
            (true, Some(uid), Some(rv)) => {
                let done = self.api.delete_lock(&name, &uid, Some(&rv));
                self.unlocked(&name, done)
            }
            _ => cni::log::info(&format!(
                "iplock {name} is left to reconcile: it changed since this node wrote it (adopted, re-keyed or marked)"
            )),
        }
    }

    /// Logs what became of `unlock`'s delete.
    fn unlocked(&self, name: &str, done: Result<(), ApiError>) {
        match done {
            Ok(()) => {}
            // Gone already, or another lock since, or changed again: not
            // ours to delete.
            Err(ApiError::Conflict(why)) => cni::log::info(&format!(
                "iplock {name} is left to reconcile: it changed since this node wrote it ({why})"
            )),
            Err(ApiError::Refused(why)) => {
                cni::log::info(&format!("iplock {name} stays as an orphan: {why}"))
            }
            Err(e) => cni::log::warn(&format!(
                "could not delete iplock {name}: {e}; reconcile removes it once no claim names it"
            )),
        }
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
    pub(super) fn lock_read(&self, before: &Claim) -> StoreResult<LockObject> {
        let ip = before.ip;
        self.locks_read
            .get(&ip)
            .cloned()
            .or_else(|| {
                self.locks_seen.get(&ip).map(|seen| LockObject {
                    network: self.network.clone(),
                    ip,
                    identity: before.identity.clone(),
                    created: before.created,
                    uid: Some(seen.uid.clone()),
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
    pub(super) fn follow_takeover(&mut self, before: &Claim, after: &Claim) -> StoreResult<()> {
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
        self.saw_lock(taken);
        Ok(())
    }

    pub(super) fn rekey(
        &mut self,
        before: &Claim,
        after: &Claim,
        node: Option<&str>,
    ) -> StoreResult<()> {
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
        self.saw_lock(rekeyed.clone());
        if let Some(rv) = rv {
            let name = claim_name(&self.network, &before.identity, Family::of(ip));
            if let Err(e) = self.api.delete_claim(&name, &rv) {
                match self
                    .api
                    .rekey_lock(&rekeyed, &before.identity, node, &judged)
                {
                    Ok(back) => self.saw_lock(back),
                    Err(back) => {
                        self.locks_read.remove(&ip);
                        if let Some(seen) = self.locks_seen.get_mut(&ip) {
                            seen.resource_version = None;
                        }
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

    pub(super) fn remove(&mut self, before: &Claim) -> StoreResult<()> {
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
        self.unlock(before);
        Ok(())
    }

    pub(super) fn apply(&mut self, change: &Change) -> StoreResult<()> {
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
    pub(super) fn roll_back(&mut self, applied: &[Change]) {
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
    pub(super) fn confirm_untouched(&mut self, plan: &Plan) -> StoreResult<()> {
        let touched: BTreeSet<IpAddr> = plan
            .changes
            .iter()
            .filter_map(|c| c.before.as_ref().map(|b| b.ip))
            .collect();
        // As the plan read them, not as the record says now.
        let unconfirmed: Vec<(IpAddr, Claim)> = self
            .from_cache
            .iter()
            .filter(|(ip, _)| !touched.contains(ip))
            .map(|(ip, c)| (*ip, c.clone()))
            .collect();
        for (ip, cached) in unconfirmed {
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

    /// The claims a plan gives a holder.
    pub(super) fn grants(plan: &Plan) -> Vec<Claim> {
        plan.changes
            .iter()
            .filter_map(|c| c.after.clone().filter(|a| a.holder.is_some()))
            .collect()
    }
}
