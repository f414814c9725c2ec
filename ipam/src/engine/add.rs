//! ADD: one address per range set for the request's identity.

use std::net::IpAddr;

use cni::{code, CniError, Refusal};

use super::{AddRequest, Grant};
use crate::addr::{from_u128, to_u128, Family};
use crate::claim::{Claim, Holder, Unconfirmed};
use crate::config::{IpamConfig, Range, RangeSet};
use crate::identity::displaced_key;
use crate::liveness::{Inspector, Verdict};
use crate::probe_policy::Origin;
use crate::store::{Change, ClaimStore, Plan, PlanError, PlanResult, StoreError};
use crate::tenancy;

struct Planner<'a> {
    conf: &'a IpamConfig,
    store: &'a mut dyn ClaimStore,
    inspector: &'a dyn Inspector,
    req: &'a AddRequest,
    plan: Plan,
}

fn refuse(refusal: Refusal, msg: String) -> PlanError {
    PlanError::Refused(CniError::new(code::TRY_AGAIN_LATER, msg).refused_as(refusal))
}

impl Planner<'_> {
    /// Whether `claim` may move to the caller: free, already the caller's,
    /// or its holder is confirmed dead. Returns the takeover note.
    fn takeable(&self, claim: &Claim) -> PlanResult<Option<String>> {
        let Some(holder) = &claim.holder else {
            return Ok(None);
        };
        if holder.is(&self.req.holder.container_id, &self.req.holder.ifname) {
            return Ok(None);
        }
        // The same sandbox on another interface is alive by definition: it
        // is the caller's own pod, attaching this network a second time.
        if holder.container_id == self.req.holder.container_id {
            return Err(PlanError::Refused(CniError::invalid_config(format!(
                "{} on network {:?} is already held by interface {} of this pod sandbox for identity {:?}: an identity has one address per family on a network, so the network cannot be attached twice under one identity; give the second attachment its own identity (\"cni-args\": {{\"identity\": \"...\"}} in the pod's network selection) or attach the network once",
                claim.ip, self.conf.network, holder.ifname, claim.identity
            ))));
        }
        match self.inspector.verdict(holder, Some(&self.req.caller)) {
            Verdict::Dead(why) => Ok(Some(format!(
                "took {} over from {}: {why}",
                claim.ip,
                holder.describe()
            ))),
            Verdict::Alive(why) => Err(refuse(Refusal::HolderAlive, format!(
                "{} on network {:?} (identity {:?}) is held by {}, which is considered alive: {why}; the address is handed over as soon as that holder is confirmed dead, and kubelet retries this ADD",
                claim.ip,
                self.conf.network,
                claim.identity,
                holder.describe()
            ))),
        }
    }

    /// The identity leaves `claim`'s address (it moves, or the address is
    /// outside the ranges now): freed when its last holder released it or
    /// is the caller; else (its holder judged dead, or a mark not yet
    /// confirmed) kept as a tombstone under `displaced_key`, so the address
    /// is probed before it is bound again (I7).
    fn leave(&mut self, claim: &Claim) -> PlanResult<()> {
        let took_over = self.takeable(claim)?;
        let unconfirmed = took_over
            .map(|note| Unconfirmed {
                since: self.req.now,
                why: note,
            })
            .or_else(|| claim.unconfirmed.clone());
        let after = unconfirmed.map(|unconfirmed| Claim {
            identity: displaced_key(&claim.identity, claim.ip),
            sticky: false,
            holder: None,
            owner: None,
            updated: self.req.now,
            unconfirmed: Some(unconfirmed),
            ..claim.clone()
        });
        self.plan.changes.push(Change {
            before: Some(claim.clone()),
            after,
        });
        Ok(())
    }

    fn new_claim(&self, ip: IpAddr, unconfirmed: Option<Unconfirmed>) -> Claim {
        Claim {
            ip,
            identity: self.req.identity.key.clone(),
            sticky: self.req.identity.sticky,
            holder: Some(self.req.holder.clone()),
            owner: self.req.identity.owner.clone(),
            namespace: self.req.holder.pod_namespace.clone(),
            created: self.req.now,
            updated: self.req.now,
            unconfirmed,
        }
    }

    /// What the claim granted from `previous` records about the wire: a
    /// takeover from another pod's holder is a judgement the probe has yet
    /// to confirm; otherwise the previous claim's own mark carries over
    /// until a probe clears it (`plan_confirm`).
    fn mark(
        &self,
        previous: &Claim,
        origin: &Origin,
        took_over: Option<&String>,
    ) -> Option<Unconfirmed> {
        match (origin, took_over) {
            (Origin::TakenOver, Some(note)) => Some(Unconfirmed {
                since: self.req.now,
                why: note.clone(),
            }),
            _ => previous.unconfirmed.clone(),
        }
    }

    fn origin_of(&self, previous: Option<&Holder>) -> Origin {
        Origin::from_holder(
            previous,
            &self.req.holder,
            self.req.caller.pod_uid.as_deref(),
        )
    }

    fn planned(&self, ip: IpAddr) -> bool {
        self.plan
            .changes
            .iter()
            .any(|c| c.after.as_ref().is_some_and(|a| a.ip == ip))
    }

    fn range_of(&self, set: &RangeSet, ip: IpAddr) -> Range {
        // Callers only pass addresses of `set`.
        set.range_of(ip)
            .cloned()
            .unwrap_or_else(|| set.ranges[0].clone())
    }

    /// The identity's existing claim in a set: rebind it to the caller.
    fn keep(&mut self, set: &RangeSet, claim: &Claim) -> PlanResult<Grant> {
        let took_over = self.takeable(claim)?;
        let origin = self.origin_of(claim.holder.as_ref());
        let unconfirmed = self.mark(claim, &origin, took_over.as_ref());
        // A retried ADD by the same attachment writes nothing.
        // A claim stored before namespaces were recorded binds now, and
        // so does a tombstone (its old namespace is only a record).
        let namespace = claim
            .namespace
            .clone()
            .filter(|_| !claim.is_tombstone())
            .or_else(|| self.req.holder.pod_namespace.clone());
        let unchanged = claim.held_by(&self.req.holder.container_id, &self.req.holder.ifname)
            && claim.holder.as_ref().map(|h| &h.netns) == Some(&self.req.holder.netns)
            && claim.sticky == self.req.identity.sticky
            && claim.owner == self.req.identity.owner
            && claim.namespace == namespace
            && claim.unconfirmed == unconfirmed;
        if !unchanged {
            self.plan.changes.push(Change {
                before: Some(claim.clone()),
                after: Some(Claim {
                    holder: Some(self.req.holder.clone()),
                    sticky: self.req.identity.sticky,
                    owner: self.req.identity.owner.clone(),
                    namespace,
                    updated: self.req.now,
                    unconfirmed: unconfirmed.clone(),
                    ..claim.clone()
                }),
            });
        }
        Ok(Grant {
            reclaimed: false,
            ip: claim.ip,
            range: self.range_of(set, claim.ip),
            displaced: took_over.as_ref().and(claim.holder.clone()),
            origin,
            took_over,
            unconfirmed: unconfirmed.is_some(),
        })
    }

    /// A specific address (requested or reserved) for the identity.
    fn claim_specific(&mut self, set: &RangeSet, ip: IpAddr, reserved: bool) -> PlanResult<Grant> {
        let existing = self.store.claim(ip)?;
        let mut took_over = None;
        if let Some(other) = &existing {
            if other.identity == self.req.identity.key {
                return self.keep(set, other);
            }
            if other.sticky && !reserved {
                return Err(refuse(Refusal::AddressReserved, format!(
                    "requested address {ip} on network {:?} is reserved by sticky identity {:?}: request another address, or release it with `sticky-macvlan release --ip {ip}`",
                    self.conf.network, other.identity
                )));
            }
            took_over = self.takeable(other)?;
        }
        let displaced = existing.as_ref().and_then(|c| c.holder.clone());
        let (origin, unconfirmed) = match &existing {
            None => (Origin::Fresh, None),
            Some(c) => {
                let origin = self.origin_of(c.holder.as_ref());
                let mark = self.mark(c, &origin, took_over.as_ref());
                (origin, mark)
            }
        };
        let grant = Grant {
            reclaimed: false,
            ip,
            range: self.range_of(set, ip),
            displaced: took_over.as_ref().and(displaced),
            took_over,
            origin,
            unconfirmed: unconfirmed.is_some(),
        };
        self.plan.changes.push(Change {
            before: existing,
            after: Some(self.new_claim(ip, unconfirmed)),
        });
        Ok(grant)
    }

    fn is_allocatable(&self, range: &Range, ip: IpAddr) -> bool {
        !range.is_special(ip)
            && !self.conf.is_excluded(ip)
            && self.conf.reserved_for(ip).is_none()
            && !self.planned(ip)
    }

    /// Next-fit from the set's cursor: a freed address is not handed out
    /// again until the walk comes round (stale ARP/conntrack on peers).
    fn next_fit(&mut self, index: usize, set: &RangeSet) -> PlanResult<Grant> {
        let cursor = self.store.cursor(index)?;
        let mut scanned: u128 = 0;
        for (range, ip) in ring(set, cursor) {
            if scanned >= self.conf.max_scan {
                break;
            }
            scanned += 1;
            if !self.is_allocatable(range, ip) {
                continue;
            }
            match self.store.candidate_taken(ip) {
                Ok(false) => {
                    self.plan.changes.push(Change {
                        before: None,
                        after: Some(self.new_claim(ip, None)),
                    });
                    self.plan.cursors.push((index, ip));
                    return Ok(Grant {
                        reclaimed: false,
                        ip,
                        range: range.clone(),
                        took_over: None,
                        displaced: None,
                        origin: Origin::Fresh,
                        unconfirmed: false,
                    });
                }
                Ok(true) => {}
                // Never hand out an address whose record cannot be read.
                Err(StoreError::Damaged(why)) => cni::log::warn(&why),
                Err(e) => return Err(e.into()),
            }
        }
        self.reclaim(index, set, scanned)
    }

    /// The pool is full: take the address of a dynamic claim whose holder is
    /// confirmed dead (no cron job, no human). Sticky claims stay reserved,
    /// unless their StatefulSet was deleted and nobody holds them.
    fn reclaim(&mut self, index: usize, set: &RangeSet, scanned: u128) -> PlanResult<Grant> {
        let listing = self.store.list()?;
        // From the cursor on, as next-fit walks: an address whose probe was
        // answered (the ADD undone, the cursor left on it) is not the first
        // candidate again, so one live squatter cannot block the pool.
        let cursor = self.store.cursor(index)?.map(to_u128);
        let mut candidates: Vec<&Claim> = listing
            .claims
            .iter()
            .filter(|c| set.contains(c.ip))
            .collect();
        candidates.sort_by_key(|c| {
            let n = to_u128(c.ip);
            (cursor.is_some_and(|at| n <= at), n)
        });
        let mut live = 0usize;
        let mut idle_sticky = Vec::new();
        let mut claimed = 0usize;
        for claim in candidates {
            claimed += 1;
            if self.planned(claim.ip) {
                continue;
            }
            let verdict = claim
                .holder
                .as_ref()
                .map(|h| self.inspector.verdict(h, Some(&self.req.caller)));
            let dead = verdict.as_ref().is_none_or(Verdict::is_dead);
            let retired = claim
                .owner
                .as_ref()
                .filter(|_| claim.sticky && dead)
                .and_then(|o| self.inspector.owner_retired(o, &claim.identity));
            if claim.sticky && retired.is_none() {
                if dead {
                    idle_sticky.push(claim.identity.clone());
                } else {
                    live += 1;
                }
                continue;
            }
            if !dead {
                live += 1;
                continue;
            }
            let range = self.range_of(set, claim.ip);
            if !self.is_allocatable(&range, claim.ip) {
                continue;
            }
            let took_over = Some(match (&claim.holder, &verdict) {
                _ if retired.is_some() => format!(
                    "reclaimed {} of identity {:?} (pool exhausted): {}",
                    claim.ip,
                    claim.identity,
                    retired.as_deref().unwrap_or_default()
                ),
                (Some(h), Some(v)) => format!(
                    "reclaimed {} from {} (pool exhausted): {}",
                    claim.ip,
                    h.describe(),
                    v.reason()
                ),
                _ => match &claim.unconfirmed {
                    Some(u) => format!(
                        "reclaimed {} (pool exhausted), to be confirmed on the wire: {}",
                        claim.ip, u.why
                    ),
                    None => format!("reclaimed {} (pool exhausted): it had no holder", claim.ip),
                },
            });
            let origin = self.origin_of(claim.holder.as_ref());
            let unconfirmed = self.mark(claim, &origin, took_over.as_ref());
            self.plan.changes.push(Change {
                before: Some(claim.clone()),
                after: Some(self.new_claim(claim.ip, unconfirmed.clone())),
            });
            self.plan.cursors.push((index, claim.ip));
            return Ok(Grant {
                reclaimed: true,
                ip: claim.ip,
                range,
                took_over,
                displaced: claim.holder.clone(),
                origin,
                unconfirmed: unconfirmed.is_some(),
            });
        }
        let size = set.size();
        let scope = if scanned < size {
            format!(" among the {scanned} addresses scanned (ipam.maxScan)")
        } else {
            String::new()
        };
        idle_sticky.sort();
        let sample: Vec<&str> = idle_sticky.iter().take(5).map(String::as_str).collect();
        let sticky_note = if idle_sticky.is_empty() {
            String::new()
        } else {
            format!(
                ", {} reserved by sticky identities without a live holder ({}{})",
                idle_sticky.len(),
                sample.join(", "),
                if idle_sticky.len() > sample.len() {
                    ", ..."
                } else {
                    ""
                }
            )
        };
        // Reserved addresses nobody claimed yet are never handed out either.
        let mut held_back: Vec<String> = self
            .conf
            .reservations
            .iter()
            .flat_map(|(id, ips)| ips.iter().map(move |ip| (id, ip)))
            .filter(|(_, ip)| set.contains(**ip))
            .filter(|(_, ip)| !listing.claims.iter().any(|c| c.ip == **ip))
            .map(|(id, ip)| format!("{ip} for {id:?}"))
            .collect();
        held_back.sort();
        let reserved_note = if held_back.is_empty() {
            String::new()
        } else {
            format!(
                ", {} held back by ipam.reservations ({})",
                held_back.len(),
                held_back.join(", ")
            )
        };
        let damaged = listing.damaged.len();
        let damaged_note = if damaged > 0 {
            format!(", {damaged} damaged records (see `sticky-macvlan claims`)")
        } else {
            String::new()
        };
        Err(refuse(Refusal::PoolExhausted, format!(
            "no free address in range set {} of network {:?}{scope}: {claimed} claimed, {live} by live holders{sticky_note}{reserved_note}{damaged_note}; widen the range, scale down, or release a sticky identity with `sticky-macvlan release --identity ID`",
            set.describe(),
            self.conf.network
        )))
    }
}

/// Every address of a set once, starting after `cursor` and wrapping.
fn ring(set: &RangeSet, cursor: Option<IpAddr>) -> impl Iterator<Item = (&Range, IpAddr)> + '_ {
    let start = cursor.and_then(|c| {
        set.ranges
            .iter()
            .position(|r| r.contains(c))
            .map(|i| (i, to_u128(c)))
    });
    let n = set.ranges.len();
    let mut segments: Vec<(usize, u128, u128)> = Vec::new();
    match start {
        None => {
            for i in 0..n {
                let s = set.ranges[i].span();
                segments.push((i, s.first, s.last));
            }
        }
        Some((i, at)) => {
            let s = set.ranges[i].span();
            if at < s.last {
                segments.push((i, at + 1, s.last));
            }
            for k in 1..n {
                let j = (i + k) % n;
                let sj = set.ranges[j].span();
                segments.push((j, sj.first, sj.last));
            }
            segments.push((i, s.first, at));
        }
    }
    segments.into_iter().flat_map(move |(i, first, last)| {
        let range = &set.ranges[i];
        let family: Family = range.family();
        (first..=last).map(move |n| (range, from_u128(family, n)))
    })
}

/// Plans an ADD: one address per range set for the request's identity.
pub fn plan_add(
    conf: &IpamConfig,
    store: &mut dyn ClaimStore,
    inspector: &dyn Inspector,
    req: &AddRequest,
) -> PlanResult<(Plan, Vec<Grant>)> {
    let mut requested: Vec<(usize, IpAddr)> = Vec::new();
    for ip in &req.requested {
        let Some(set) = conf.set_of(*ip) else {
            return Err(CniError::invalid_config(format!(
                "requested address {ip} is outside every range of network {:?}",
                conf.network
            ))
            .into());
        };
        if requested.iter().any(|(s, _)| *s == set) {
            return Err(CniError::invalid_config(format!(
                "two requested addresses fall in range set {}: request one address per range set",
                conf.range_sets[set].describe()
            ))
            .into());
        }
        let range = conf.range_sets[set].range_of(*ip);
        if range.is_some_and(|r| r.is_special(*ip)) || conf.is_excluded(*ip) {
            return Err(CniError::invalid_config(format!(
                "requested address {ip} is the gateway, network or broadcast address or excluded on network {:?}",
                conf.network
            ))
            .into());
        }
        if let Some(owner) = conf.reserved_for(*ip) {
            if owner != req.identity.key {
                return Err(CniError::invalid_config(format!(
                    "requested address {ip} is reserved for identity {owner:?} in ipam.reservations"
                ))
                .into());
            }
        }
        requested.push((set, *ip));
    }

    let mine = store.claims_of_identity(&req.identity.key)?;
    tenancy::check(
        conf,
        &req.identity,
        &mine,
        req.holder.pod_namespace.as_deref(),
    )?;
    let mut planner = Planner {
        conf,
        store,
        inspector,
        req,
        plan: Plan::default(),
    };
    let mut grants = Vec::new();
    for (index, set) in conf.range_sets.iter().enumerate() {
        let in_set: Vec<&Claim> = mine.iter().filter(|c| set.contains(c.ip)).collect();
        // Normally at most one; two are left only by a crash between a
        // racing create and its back-out (kubernetes store). Keep the
        // caller's (else the first) and drop the rest where takeable.
        let current = in_set
            .iter()
            .copied()
            .find(|c| c.held_by(&req.holder.container_id, &req.holder.ifname))
            .or(in_set.first().copied());
        for extra in in_set
            .iter()
            .filter(|c| current.is_some_and(|k| k.ip != c.ip))
        {
            planner.leave(extra)?;
        }
        let reserved = conf
            .reservations
            .get(&req.identity.key)
            .and_then(|ips| ips.iter().copied().find(|ip| set.contains(*ip)));
        let asked = requested
            .iter()
            .find(|(s, _)| *s == index)
            .map(|(_, ip)| *ip);
        let target = asked.or(reserved);
        if let Some(claim) = current {
            if target.is_none_or(|t| t == claim.ip) {
                grants.push(planner.keep(set, claim)?);
                continue;
            }
            // The identity moves to the address now asked for.
            planner.leave(claim)?;
        }
        let grant = match target {
            Some(ip) => planner.claim_specific(set, ip, asked.is_none())?,
            None => planner.next_fit(index, set)?,
        };
        grants.push(grant);
    }
    // Claims left in no configured range (the ranges changed) would be a
    // second address for the identity: drop them.
    for claim in mine.iter().filter(|c| conf.set_of(c.ip).is_none()) {
        planner.leave(claim)?;
    }
    Ok((planner.plan, grants))
}

#[cfg(test)]
#[path = "add_tests.rs"]
mod tests;
