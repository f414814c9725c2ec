//! The decisions: which address an ADD gets, what DEL, GC and reconcile
//! release, and what a failed ADD must undo. Each `plan_*` reads through
//! `ClaimStore` and asks `Inspector` for liveness verdicts, and returns a
//! `Plan`; nothing is written until the caller commits the whole plan, so a
//! refusal in any range set changes nothing (invariant 5).

use std::collections::BTreeSet;
use std::net::IpAddr;

use cni::{code, CniError, CniResult};

use crate::addr::{from_u128, to_u128, Family};
use crate::claim::{Claim, Holder};
use crate::config::{IpamConfig, Range, RangeSet};
use crate::identity::Identity;
use crate::liveness::{Caller, Verdict};
use crate::store::{Change, ClaimStore, Plan, STORE_DAMAGED};
use crate::tenancy;
use crate::wire::Origin;

/// The liveness seam: the real one looks at netns paths, tests script it.
pub trait Inspector {
    fn verdict(&self, holder: &Holder, caller: Option<&Caller>) -> Verdict;
    /// Whether a sticky identity's owner (a StatefulSet) was deleted, so
    /// its reserved address may go back to the pool. Without the API
    /// nothing is known, so nothing retires.
    fn owner_retired(&self, _owner: &crate::claim::Owner) -> bool {
        false
    }
}

#[derive(Debug, Clone)]
pub struct AddRequest {
    pub identity: Identity,
    /// The attachment asking, as it will be recorded.
    pub holder: Holder,
    pub caller: Caller,
    /// Addresses asked for by runtimeConfig.ips, `CNI_ARGS` IP= or args.cni.ips.
    pub requested: Vec<IpAddr>,
    pub now: u64,
}

/// One address handed out by an ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub ip: IpAddr,
    pub range: Range,
    /// Set when the address was taken from another holder: who and why.
    pub took_over: Option<String>,
    /// The holder the address was taken from (judged dead), if any.
    pub displaced: Option<Holder>,
    /// Where the address came from: what decides whether the wire must
    /// confirm it (`wire::needs_wire_check`).
    pub origin: Origin,
}

struct Planner<'a> {
    conf: &'a IpamConfig,
    store: &'a mut dyn ClaimStore,
    inspector: &'a dyn Inspector,
    req: &'a AddRequest,
    plan: Plan,
}

fn refuse(msg: String) -> CniError {
    CniError::new(code::TRY_AGAIN_LATER, msg)
}

impl Planner<'_> {
    /// Whether `claim` may move to the caller: free, already the caller's,
    /// or its holder is confirmed dead. Returns the takeover note.
    fn takeable(&self, claim: &Claim) -> CniResult<Option<String>> {
        let Some(holder) = &claim.holder else {
            return Ok(None);
        };
        if holder.is(&self.req.holder.container_id, &self.req.holder.ifname) {
            return Ok(None);
        }
        match self.inspector.verdict(holder, Some(&self.req.caller)) {
            Verdict::Dead(why) => Ok(Some(format!(
                "took {} over from {}: {why}",
                claim.ip,
                holder.describe()
            ))),
            Verdict::Alive(why) => Err(refuse(format!(
                "{} on network {:?} (identity {:?}) is held by {}, which is considered alive: {why}; the address is handed over as soon as that holder is confirmed dead, and kubelet retries this ADD",
                claim.ip,
                self.conf.network,
                claim.identity,
                holder.describe()
            ))),
        }
    }

    fn new_claim(&self, ip: IpAddr) -> Claim {
        Claim {
            ip,
            identity: self.req.identity.key.clone(),
            sticky: self.req.identity.sticky,
            holder: Some(self.req.holder.clone()),
            owner: self.req.identity.owner.clone(),
            namespace: self.req.holder.pod_namespace.clone(),
            created: self.req.now,
            updated: self.req.now,
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
    fn keep(&mut self, set: &RangeSet, claim: &Claim) -> CniResult<Grant> {
        let took_over = self.takeable(claim)?;
        // A retried ADD by the same attachment writes nothing.
        // A claim stored before namespaces were recorded binds now.
        let namespace = claim
            .namespace
            .clone()
            .or_else(|| self.req.holder.pod_namespace.clone());
        let unchanged = claim.held_by(&self.req.holder.container_id, &self.req.holder.ifname)
            && claim.holder.as_ref().map(|h| &h.netns) == Some(&self.req.holder.netns)
            && claim.sticky == self.req.identity.sticky
            && claim.owner == self.req.identity.owner
            && claim.namespace == namespace;
        if !unchanged {
            self.plan.changes.push(Change {
                before: Some(claim.clone()),
                after: Some(Claim {
                    holder: Some(self.req.holder.clone()),
                    sticky: self.req.identity.sticky,
                    owner: self.req.identity.owner.clone(),
                    namespace,
                    updated: self.req.now,
                    ..claim.clone()
                }),
            });
        }
        Ok(Grant {
            ip: claim.ip,
            range: self.range_of(set, claim.ip),
            displaced: took_over.as_ref().and(claim.holder.clone()),
            origin: self.origin_of(claim.holder.as_ref()),
            took_over,
        })
    }

    /// A specific address (requested or reserved) for the identity.
    fn claim_specific(&mut self, set: &RangeSet, ip: IpAddr, reserved: bool) -> CniResult<Grant> {
        let existing = self.store.claim(ip)?;
        let mut took_over = None;
        if let Some(other) = &existing {
            if other.identity == self.req.identity.key {
                return self.keep(set, other);
            }
            if other.sticky && !reserved {
                return Err(refuse(format!(
                    "requested address {ip} on network {:?} is reserved by sticky identity {:?}: request another address, or release it with `sticky-macvlan release --ip {ip}`",
                    self.conf.network, other.identity
                )));
            }
            took_over = self.takeable(other)?;
        }
        let displaced = existing.as_ref().and_then(|c| c.holder.clone());
        let origin = match &existing {
            None => Origin::Fresh,
            Some(c) => self.origin_of(c.holder.as_ref()),
        };
        self.plan.changes.push(Change {
            before: existing,
            after: Some(self.new_claim(ip)),
        });
        Ok(Grant {
            ip,
            range: self.range_of(set, ip),
            displaced: took_over.as_ref().and(displaced),
            took_over,
            origin,
        })
    }

    fn is_allocatable(&self, range: &Range, ip: IpAddr) -> bool {
        !range.is_special(ip)
            && !self.conf.is_excluded(ip)
            && self.conf.reserved_for(ip).is_none()
            && !self.planned(ip)
    }

    /// Next-fit from the set's cursor: a freed address is not handed out
    /// again until the walk comes round (stale ARP/conntrack on peers).
    fn next_fit(&mut self, index: usize, set: &RangeSet) -> CniResult<Grant> {
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
                        after: Some(self.new_claim(ip)),
                    });
                    self.plan.cursors.push((index, ip));
                    return Ok(Grant {
                        ip,
                        range: range.clone(),
                        took_over: None,
                        displaced: None,
                        origin: Origin::Fresh,
                    });
                }
                Ok(true) => {}
                // Never hand out an address whose record cannot be read.
                Err(e) if e.code == STORE_DAMAGED => cni::log::warn(&e.msg),
                Err(e) => return Err(e),
            }
        }
        self.reclaim(index, set, scanned)
    }

    /// The pool is full: take the address of a dynamic claim whose holder is
    /// confirmed dead (no cron job, no human). Sticky claims stay reserved,
    /// unless their StatefulSet was deleted and nobody holds them.
    fn reclaim(&mut self, index: usize, set: &RangeSet, scanned: u128) -> CniResult<Grant> {
        let listing = self.store.list()?;
        let mut live = 0usize;
        let mut idle_sticky = Vec::new();
        let mut claimed = 0usize;
        for claim in listing.claims.iter().filter(|c| set.contains(c.ip)) {
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
                .is_some_and(|o| self.inspector.owner_retired(o));
            if claim.sticky && !retired {
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
            let took_over =
                Some(match (&claim.holder, &verdict) {
                    _ if retired => {
                        format!(
                    "reclaimed {} of identity {:?} (pool exhausted): its {} {}/{} was deleted",
                    claim.ip,
                    claim.identity,
                    claim.owner.as_ref().map(|o| o.kind.as_str()).unwrap_or_default(),
                    claim.owner.as_ref().map(|o| o.namespace.as_str()).unwrap_or_default(),
                    claim.owner.as_ref().map(|o| o.name.as_str()).unwrap_or_default()
                )
                    }
                    (Some(h), Some(v)) => format!(
                        "reclaimed {} from {} (pool exhausted): {}",
                        claim.ip,
                        h.describe(),
                        v.reason()
                    ),
                    _ => format!("reclaimed {} (pool exhausted): it had no holder", claim.ip),
                });
            self.plan.changes.push(Change {
                before: Some(claim.clone()),
                after: Some(self.new_claim(claim.ip)),
            });
            self.plan.cursors.push((index, claim.ip));
            return Ok(Grant {
                ip: claim.ip,
                range,
                took_over,
                displaced: claim.holder.clone(),
                origin: self.origin_of(claim.holder.as_ref()),
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
        Err(refuse(format!(
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
) -> CniResult<(Plan, Vec<Grant>)> {
    let mut requested: Vec<(usize, IpAddr)> = Vec::new();
    for ip in &req.requested {
        let Some(set) = conf.set_of(*ip) else {
            return Err(CniError::invalid_config(format!(
                "requested address {ip} is outside every range of network {:?}",
                conf.network
            )));
        };
        if requested.iter().any(|(s, _)| *s == set) {
            return Err(CniError::invalid_config(format!(
                "two requested addresses fall in range set {}: request one address per range set",
                conf.range_sets[set].describe()
            )));
        }
        let range = conf.range_sets[set].range_of(*ip);
        if range.is_some_and(|r| r.is_special(*ip)) || conf.is_excluded(*ip) {
            return Err(CniError::invalid_config(format!(
                "requested address {ip} is the gateway, network or broadcast address or excluded on network {:?}",
                conf.network
            )));
        }
        if let Some(owner) = conf.reserved_for(*ip) {
            if owner != req.identity.key {
                return Err(CniError::invalid_config(format!(
                    "requested address {ip} is reserved for identity {owner:?} in ipam.reservations"
                )));
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
            planner.takeable(extra)?;
            planner.plan.changes.push(Change {
                before: Some((*extra).clone()),
                after: None,
            });
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
            planner.takeable(claim)?;
            planner.plan.changes.push(Change {
                before: Some(claim.clone()),
                after: None,
            });
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
        planner.takeable(claim)?;
        planner.plan.changes.push(Change {
            before: Some(claim.clone()),
            after: None,
        });
    }
    Ok((planner.plan, grants))
}

/// The change that releases a claim's holder: a sticky claim stays
/// reserved to its identity, a dynamic one frees its address.
pub fn release_holder(claim: &Claim, now: u64) -> Change {
    let after = claim.sticky.then(|| Claim {
        holder: None,
        updated: now,
        ..claim.clone()
    });
    Change {
        before: Some(claim.clone()),
        after,
    }
}

/// DEL: releases what this attachment holds; anyone else's DEL is a no-op
/// (invariant 3), and a second DEL finds nothing (invariant 4).
pub fn plan_del(
    store: &mut dyn ClaimStore,
    container_id: &str,
    ifname: &str,
    now: u64,
) -> CniResult<Plan> {
    let held = store.claims_of_holder(container_id, ifname)?;
    Ok(Plan {
        changes: held.iter().map(|c| release_holder(c, now)).collect(),
        cursors: vec![],
    })
}

/// GC: releases holders on this node that are not among the runtime's
/// valid attachments.
pub fn plan_gc(
    store: &mut dyn ClaimStore,
    node: &str,
    keep: &BTreeSet<(String, String)>,
    now: u64,
) -> CniResult<Plan> {
    let listing = store.list()?;
    let changes = listing
        .claims
        .iter()
        .filter(|c| {
            c.holder.as_ref().is_some_and(|h| {
                h.node == node && !keep.contains(&(h.container_id.clone(), h.ifname.clone()))
            })
        })
        .map(|c| release_holder(c, now))
        .collect();
    Ok(Plan {
        changes,
        cursors: vec![],
    })
}

/// One released holder, for reconcile's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub ip: IpAddr,
    pub identity: String,
    pub why: String,
}

/// reconcile: releases every holder confirmed dead.
pub fn plan_reconcile(
    store: &mut dyn ClaimStore,
    inspector: &dyn Inspector,
    now: u64,
) -> CniResult<(Plan, Vec<Released>, usize)> {
    let listing = store.list()?;
    let mut plan = Plan::default();
    let mut released = Vec::new();
    let mut alive = 0;
    for claim in &listing.claims {
        let Some(holder) = &claim.holder else {
            if !claim.sticky {
                plan.changes.push(release_holder(claim, now));
                released.push(Released {
                    ip: claim.ip,
                    identity: claim.identity.clone(),
                    why: "dynamic claim without a holder".into(),
                });
            }
            continue;
        };
        match inspector.verdict(holder, None) {
            Verdict::Dead(why) => {
                plan.changes.push(release_holder(claim, now));
                released.push(Released {
                    ip: claim.ip,
                    identity: claim.identity.clone(),
                    why: format!("{}: {why}", holder.describe()),
                });
            }
            Verdict::Alive(_) => alive += 1,
        }
    }
    Ok((plan, released, alive))
}

/// Retires the sticky claims of identities whose owner (a StatefulSet)
/// was deleted (`Inspector::owner_retired`): their address goes back to
/// the pool once no live holder uses it.
pub fn plan_retire(
    store: &mut dyn ClaimStore,
    inspector: &dyn Inspector,
) -> CniResult<(Plan, Vec<Released>)> {
    let listing = store.list()?;
    let mut plan = Plan::default();
    let mut out = Vec::new();
    for claim in &listing.claims {
        let Some(owner) = claim.owner.as_ref().filter(|o| inspector.owner_retired(o)) else {
            continue;
        };
        if let Some(h) = &claim.holder {
            if !inspector.verdict(h, None).is_dead() {
                continue;
            }
        }
        plan.changes.push(Change {
            before: Some(claim.clone()),
            after: None,
        });
        out.push(Released {
            ip: claim.ip,
            identity: claim.identity.clone(),
            why: format!(
                "{} {}/{} was deleted",
                owner.kind, owner.namespace, owner.name
            ),
        });
    }
    Ok((plan, out))
}

/// Undoes a committed ADD plan after the rest of the ADD failed, claim by
/// claim, only where nobody changed the claim since (invariant 5).
pub fn plan_undo(store: &mut dyn ClaimStore, done: &Plan) -> CniResult<Plan> {
    let mut undo = Plan::default();
    for change in done.changes.iter().rev() {
        let Some(ip) = change.ip() else { continue };
        let current = store.claim(ip)?;
        if current == change.after {
            undo.changes.push(change.inverse());
        }
    }
    Ok(undo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::IdentitySource;
    use crate::store::memory::MemoryStore;
    use serde_json::json;
    use std::collections::BTreeMap;

    /// Scripted liveness: container IDs listed are alive.
    struct Alive(Vec<&'static str>);

    impl Inspector for Alive {
        fn verdict(&self, h: &Holder, caller: Option<&Caller>) -> Verdict {
            if caller.and_then(|c| c.pod_uid.as_ref()).is_some()
                && caller.and_then(|c| c.pod_uid.as_ref()) == h.pod_uid.as_ref()
            {
                return Verdict::Dead("same pod".into());
            }
            if self.0.contains(&h.container_id.as_str()) {
                Verdict::Alive("its netns still exists".into())
            } else {
                Verdict::Dead("its netns no longer exists".into())
            }
        }
    }

    fn conf(v: serde_json::Value) -> IpamConfig {
        IpamConfig::parse("net", &v).unwrap()
    }

    fn small() -> IpamConfig {
        conf(
            json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.13", "gateway": "10.0.0.1"}),
        )
    }

    fn holder(cid: &str) -> Holder {
        Holder {
            container_id: cid.into(),
            ifname: "net1".into(),
            netns: format!("/run/netns/{cid}"),
            netns_id: None,
            pod_namespace: Some("ns".into()),
            pod_name: Some(cid.into()),
            pod_uid: Some(format!("uid-{cid}")),
            node: "n1".into(),
            boot_id: "b".into(),
            since: 0,
        }
    }

    fn req(id: &str, sticky: bool, cid: &str) -> AddRequest {
        AddRequest {
            identity: Identity {
                key: id.into(),
                sticky,
                source: if sticky {
                    IdentitySource::ArgsCni
                } else {
                    IdentitySource::Container
                },
                owner: None,
            },
            holder: holder(cid),
            caller: Caller {
                pod_uid: Some(format!("uid-{cid}")),
            },
            requested: vec![],
            now: 100,
        }
    }

    fn add(
        conf: &IpamConfig,
        s: &mut MemoryStore,
        alive: &dyn Inspector,
        r: &AddRequest,
    ) -> CniResult<Vec<Grant>> {
        let (plan, grants) = plan_add(conf, s, alive, r)?;
        s.commit(&plan)?;
        Ok(grants)
    }

    fn ips(g: &[Grant]) -> Vec<String> {
        g.iter().map(|g| g.ip.to_string()).collect()
    }

    fn del(s: &mut MemoryStore, cid: &str) {
        let plan = plan_del(s, cid, "net1", 200).unwrap();
        s.commit(&plan).unwrap();
    }

    /// Every invariant of DESIGN.md section 3 that a store can show.
    fn assert_invariants(s: &MemoryStore) {
        let mut per_identity: BTreeMap<(&str, Family), usize> = BTreeMap::new();
        for c in s.claims.values() {
            *per_identity
                .entry((&c.identity, Family::of(c.ip)))
                .or_default() += 1;
            assert!(
                c.sticky || c.holder.is_some(),
                "dynamic claim without holder: {c:?}"
            );
        }
        assert!(per_identity.values().all(|n| *n == 1), "{per_identity:?}");
    }

    #[test]
    fn an_exhausted_pool_reclaims_sticky_claims_of_deleted_owners() {
        struct Retired;
        impl Inspector for Retired {
            fn verdict(&self, h: &Holder, _c: Option<&Caller>) -> Verdict {
                if h.container_id == "e" {
                    Verdict::Alive("running".into())
                } else {
                    Verdict::Dead("gone".into())
                }
            }
            fn owner_retired(&self, o: &crate::claim::Owner) -> bool {
                o.name == "old"
            }
        }
        let c = small(); // four addresses
        let mut s = MemoryStore::default();
        let alive = Alive(vec!["a", "b", "c", "d"]);
        for (i, set) in ["keep", "keep", "old", "keep"].iter().enumerate() {
            let mut r = req(&format!("ns/db-{i}"), true, &format!("c{i}"));
            r.identity.owner = Some(crate::claim::Owner {
                kind: "StatefulSet".into(),
                namespace: "ns".into(),
                name: (*set).into(),
                uid: "u".into(),
            });
            add(&c, &mut s, &alive, &r).unwrap();
            del(&mut s, &format!("c{i}"));
        }
        let g = add(&c, &mut s, &Retired, &req("new", false, "e")).unwrap();
        assert_eq!(ips(&g), ["10.0.0.12"]);
        let note = g[0].took_over.as_deref().unwrap_or_default();
        assert!(note.contains("StatefulSet ns/old was deleted"), "{note}");
        // With only live owners left, the sticky claims stay reserved.
        let e = add(&c, &mut s, &Retired, &req("new2", false, "f")).unwrap_err();
        assert!(e.msg.contains("reserved by sticky identities"), "{}", e.msg);
    }

    #[test]
    fn a_full_pool_names_the_reservation_that_holds_an_address_back() {
        let c = conf(json!({
            "subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.12",
            "reservations": {"peer-b": "10.0.0.12"}
        }));
        let mut s = MemoryStore::default();
        let alive = Alive(vec!["a", "b", "c"]);
        add(&c, &mut s, &alive, &req("a", false, "a")).unwrap();
        add(&c, &mut s, &alive, &req("b", false, "b")).unwrap();
        let e = add(&c, &mut s, &alive, &req("c", false, "c")).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("2 claimed, 2 by live holders")
                && e.msg
                    .contains("1 held back by ipam.reservations (10.0.0.12 for \"peer-b\")"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn a_second_claim_of_one_identity_is_dropped_on_its_next_add() {
        let c = conf(json!({"subnet": "10.0.0.0/24"}));
        let mut s = MemoryStore::default();
        let twin = |s: &mut MemoryStore, ip: &str, cid: &str| {
            let mut claim = Claim {
                ip: ip.parse().unwrap(),
                identity: "peer".into(),
                sticky: true,
                holder: Some(holder(cid)),
                owner: None,
                namespace: None,
                created: 1,
                updated: 1,
            };
            if cid.is_empty() {
                claim.holder = None;
            }
            s.claims.insert(claim.ip, claim);
        };
        twin(&mut s, "10.0.0.5", "old");
        twin(&mut s, "10.0.0.9", "");
        let alive = Alive(vec!["new"]);
        let g = add(&c, &mut s, &alive, &req("peer", true, "new")).unwrap();
        assert_eq!(ips(&g), ["10.0.0.5"]);
        assert_eq!(s.claims.len(), 1);
        assert_invariants(&s);
        // A live holder of the extra claim is not robbed: refused instead.
        twin(&mut s, "10.0.0.9", "other");
        let alive = Alive(vec!["new", "other"]);
        let e = add(&c, &mut s, &alive, &req("peer", true, "new")).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert_eq!(s.claims.len(), 2);
    }

    #[test]
    fn grants_say_whom_they_displaced() {
        let c = small();
        let mut s = MemoryStore::default();
        add(&c, &mut s, &Alive(vec![]), &req("peer", true, "a")).unwrap();
        // Another pod takes it over (a is dead): displaced, from another pod.
        let g = add(&c, &mut s, &Alive(vec![]), &req("peer", true, "b")).unwrap();
        assert_eq!(
            g[0].displaced.as_ref().map(|h| h.container_id.as_str()),
            Some("a")
        );
        assert_eq!(g[0].origin, Origin::TakenOver);
        // The same pod's new sandbox: displaced, but not another pod.
        let mut same = req("peer", true, "b2");
        same.caller.pod_uid = Some("uid-b".into());
        same.holder.pod_uid = Some("uid-b".into());
        let g = add(&c, &mut s, &Alive(vec!["b"]), &same).unwrap();
        assert!(g[0].displaced.is_some());
        assert_eq!(g[0].origin, Origin::SamePod { node: "n1".into() });
        // A retried ADD by the holder displaces nobody.
        let g = add(&c, &mut s, &Alive(vec!["b2"]), &same).unwrap();
        assert!(g[0].displaced.is_none());
        assert_eq!(g[0].origin, Origin::SameAttachment);
        // After its DEL the sticky claim is unheld; a fresh identity is fresh.
        let del = plan_del(&mut s, "b2", "net1", 200).unwrap();
        crate::store::ClaimStore::commit(&mut s, &del).unwrap();
        let g = add(&c, &mut s, &Alive(vec![]), &same).unwrap();
        assert_eq!(g[0].origin, Origin::Unheld);
        let g = add(&c, &mut s, &Alive(vec![]), &req("other", true, "z")).unwrap();
        assert_eq!(g[0].origin, Origin::Fresh);
    }

    #[test]
    fn retired_owners_free_their_sticky_claims_once_unheld() {
        /// Containers listed are alive; the StatefulSet "db" was deleted.
        struct DbGone(Alive);
        impl Inspector for DbGone {
            fn verdict(&self, h: &Holder, c: Option<&Caller>) -> Verdict {
                self.0.verdict(h, c)
            }
            fn owner_retired(&self, o: &crate::claim::Owner) -> bool {
                o.name == "db"
            }
        }
        let c = small();
        let mut s = MemoryStore::default();
        let alive = DbGone(Alive(vec!["a"]));
        let owner = |name: &str| crate::claim::Owner {
            kind: "StatefulSet".into(),
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        };
        for (id, cid, set) in [
            ("ns/db-0", "a", "db"),
            ("ns/db-1", "b", "db"),
            ("ns/web-0", "c", "web"),
        ] {
            let mut r = req(id, true, cid);
            r.identity.owner = Some(owner(set));
            add(&c, &mut s, &alive, &r).unwrap();
        }
        let (plan, out) = plan_retire(&mut s, &alive).unwrap();
        // db-0's holder is alive: kept until it goes; db-1's is dead.
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].identity, "ns/db-1");
        assert!(out[0].why.contains("StatefulSet ns/db was deleted"));
        s.commit(&plan).unwrap();
        assert_eq!(s.claims.len(), 2);
    }

    #[test]
    fn next_fit_walks_on_and_skips_gateway_and_taken() {
        let c = conf(json!({"subnet": "10.0.0.0/29"}));
        let mut s = MemoryStore::default();
        let a = Alive(vec!["a", "b", "c", "d", "e", "f"]);
        let got: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|cid| {
                ips(&add(&c, &mut s, &a, &req(&format!("id-{cid}"), false, cid)).unwrap())[0]
                    .clone()
            })
            .collect();
        // .0 network, .1 gateway (host-local default), .7 broadcast.
        assert_eq!(got, ["10.0.0.2", "10.0.0.3", "10.0.0.4"]);
        // A freed address is not handed straight back out.
        del(&mut s, "a");
        let next = add(&c, &mut s, &a, &req("id-d", false, "d")).unwrap();
        assert_eq!(ips(&next), ["10.0.0.5"]);
        let next = add(&c, &mut s, &a, &req("id-e", false, "e")).unwrap();
        assert_eq!(ips(&next), ["10.0.0.6"]);
        let wrapped = add(&c, &mut s, &a, &req("id-f", false, "f")).unwrap();
        assert_eq!(
            ips(&wrapped),
            ["10.0.0.2"],
            "wraps to the freed address last"
        );
        assert_invariants(&s);
    }

    #[test]
    fn sticky_identity_keeps_its_address_across_del_and_others() {
        let c = small();
        let mut s = MemoryStore::default();
        let a = Alive(vec!["p1", "x", "y"]);
        let first = add(&c, &mut s, &a, &req("db-0", true, "p1")).unwrap();
        del(&mut s, "p1");
        assert!(
            s.claims.values().all(|c| c.holder.is_none()),
            "released, still reserved"
        );
        add(&c, &mut s, &a, &req("other-1", true, "x")).unwrap();
        add(&c, &mut s, &a, &req("other-2", false, "y")).unwrap();
        let again = add(&c, &mut s, &a, &req("db-0", true, "p2")).unwrap();
        assert_eq!(ips(&first), ips(&again));
        assert_invariants(&s);
    }

    #[test]
    fn a_retried_add_is_idempotent_and_writes_nothing() {
        let c = small();
        let mut s = MemoryStore::default();
        let a = Alive(vec!["p1"]);
        let r = req("db-0", true, "p1");
        let one = add(&c, &mut s, &a, &r).unwrap();
        let (plan, two) = plan_add(&c, &mut s, &a, &r).unwrap();
        assert!(plan.is_empty(), "{plan:?}");
        assert_eq!(one[0].origin, Origin::Fresh);
        // The same grant, now known to be this attachment's own.
        let mut same = one.clone();
        same[0].origin = Origin::SameAttachment;
        assert_eq!(same, two);
    }

    #[test]
    fn live_holder_refuses_with_code_11_and_changes_nothing() {
        let c = small();
        let mut s = MemoryStore::default();
        let a = Alive(vec!["p1", "p2"]);
        add(&c, &mut s, &a, &req("peer-a", true, "p1")).unwrap();
        let before = s.claims.clone();
        let e = add(&c, &mut s, &a, &req("peer-a", true, "p2")).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("10.0.0.10")
                && e.msg.contains("pod ns/p1")
                && e.msg.contains("still exists"),
            "{}",
            e.msg
        );
        assert_eq!(s.claims, before);
    }

    #[test]
    fn dead_holder_or_same_pod_is_taken_over_and_its_late_del_is_a_no_op() {
        let c = small();
        let mut s = MemoryStore::default();
        add(&c, &mut s, &Alive(vec![]), &req("peer-a", true, "old")).unwrap();
        let g = add(&c, &mut s, &Alive(vec![]), &req("peer-a", true, "new")).unwrap();
        assert!(g[0]
            .took_over
            .as_deref()
            .unwrap()
            .contains("no longer exists"));
        del(&mut s, "old");
        assert_eq!(
            s.claims
                .values()
                .next()
                .unwrap()
                .holder
                .as_ref()
                .unwrap()
                .container_id,
            "new"
        );
        // Same pod UID, new sandbox: taken over even though the old netns lives.
        let mut r = req("peer-a", true, "newer");
        r.caller.pod_uid = Some("uid-new".into());
        let g = add(&c, &mut s, &Alive(vec!["new"]), &r).unwrap();
        assert!(g[0].took_over.as_deref().unwrap().contains("same pod"));
    }

    #[test]
    fn exhausted_pool_reclaims_dead_dynamic_claims_only() {
        let c = small();
        let mut s = MemoryStore::default();
        let everyone = Alive(vec!["a", "b", "c", "d"]);
        add(&c, &mut s, &everyone, &req("sticky-a", true, "a")).unwrap();
        for cid in ["b", "c", "d"] {
            add(
                &c,
                &mut s,
                &everyone,
                &req(&format!("dyn-{cid}"), false, cid),
            )
            .unwrap();
        }
        let e = add(&c, &mut s, &everyone, &req("dyn-e", false, "e")).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("10.0.0.10-10.0.0.13")
                && e.msg.contains("\"net\"")
                && e.msg.contains("4 by live holders"),
            "{}",
            e.msg
        );
        // a (sticky) and c (dynamic) die: only c's address is reclaimed.
        let some_dead = Alive(vec!["b", "d"]);
        let g = add(&c, &mut s, &some_dead, &req("dyn-e", false, "e")).unwrap();
        assert_eq!(ips(&g), ["10.0.0.12"]);
        assert!(g[0]
            .took_over
            .as_deref()
            .unwrap()
            .contains("pool exhausted"));
        let e = add(
            &c,
            &mut s,
            &Alive(vec!["b", "d", "e"]),
            &req("dyn-f", false, "f"),
        )
        .unwrap_err();
        assert!(
            e.msg
                .contains("1 reserved by sticky identities without a live holder (sticky-a)"),
            "{}",
            e.msg
        );
        assert_invariants(&s);
    }

    #[test]
    fn reservations_and_requests() {
        let c = conf(
            json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.20",
                            "reservations": {"peer-a": "10.0.0.15"}}),
        );
        let mut s = MemoryStore::default();
        let a = Alive(vec!["p1", "p2", "p3"]);
        assert_eq!(
            ips(&add(&c, &mut s, &a, &req("peer-a", true, "p1")).unwrap()),
            ["10.0.0.15"]
        );
        let mut r = req("web", false, "p2");
        r.requested = vec!["10.0.0.18".parse().unwrap()];
        assert_eq!(ips(&add(&c, &mut s, &a, &r).unwrap()), ["10.0.0.18"]);
        // Reserved addresses are never handed to others by next-fit.
        let mut s2 = MemoryStore::default();
        s2.cursors.insert(0, "10.0.0.14".parse().unwrap());
        assert_eq!(
            ips(&add(&c, &mut s2, &a, &req("x", false, "p3")).unwrap()),
            ["10.0.0.16"]
        );
        for (ip, want) in [
            ("10.0.0.15", "reserved for identity \"peer-a\""),
            ("10.0.1.5", "outside every range"),
            ("10.0.0.18", "held by"),
        ] {
            let mut r = req("y", false, "p3");
            r.requested = vec![ip.parse().unwrap()];
            let e = plan_add(&c, &mut s, &a, &r).unwrap_err();
            assert!(e.msg.contains(want), "{ip}: {}", e.msg);
        }
    }

    #[test]
    fn a_requested_address_moves_the_identity() {
        let c = small();
        let mut s = MemoryStore::default();
        let a = Alive(vec!["p1"]);
        add(&c, &mut s, &a, &req("db", true, "p1")).unwrap();
        let mut r = req("db", true, "p1");
        r.requested = vec!["10.0.0.12".parse().unwrap()];
        assert_eq!(ips(&add(&c, &mut s, &a, &r).unwrap()), ["10.0.0.12"]);
        assert_eq!(s.claims.len(), 1);
        assert_invariants(&s);
    }

    #[test]
    fn dual_stack_is_all_or_nothing() {
        let c = conf(json!({"ranges": [
            [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.11"}],
            [{"subnet": "fd00::/64", "rangeStart": "fd00::10", "rangeEnd": "fd00::10"}]]}));
        let mut s = MemoryStore::default();
        let a = Alive(vec!["p1", "p2"]);
        assert_eq!(
            ips(&add(&c, &mut s, &a, &req("a", true, "p1")).unwrap()),
            ["10.0.0.10", "fd00::10"]
        );
        let before = s.claims.clone();
        let e = add(&c, &mut s, &a, &req("b", true, "p2")).unwrap_err();
        assert!(e.msg.contains("fd00::10-fd00::10"), "{}", e.msg);
        assert_eq!(s.claims, before, "the v4 address was not taken either");
    }

    #[test]
    fn huge_v6_range_allocates_without_enumerating() {
        let c = conf(json!({"subnet": "fd00::/48"}));
        let mut s = MemoryStore::default();
        let a = Alive(vec![]);
        assert_eq!(
            ips(&add(&c, &mut s, &a, &req("a", false, "p1")).unwrap()),
            ["fd00::2"]
        );
    }

    #[test]
    fn damaged_records_are_skipped_by_next_fit() {
        let c = small();
        let mut s = MemoryStore {
            damaged: vec!["10.0.0.10".parse().unwrap()],
            ..MemoryStore::default()
        };
        assert_eq!(
            ips(&add(&c, &mut s, &Alive(vec![]), &req("a", false, "p1")).unwrap()),
            ["10.0.0.11"]
        );
    }

    #[test]
    fn del_gc_reconcile_and_undo() {
        let c = small();
        let mut s = MemoryStore::default();
        let a = Alive(vec!["p1", "p2", "p3"]);
        add(&c, &mut s, &a, &req("sticky", true, "p1")).unwrap();
        add(&c, &mut s, &a, &req("dyn", false, "p2")).unwrap();
        // DEL by a stranger is a no-op.
        assert!(plan_del(&mut s, "stranger", "net1", 1).unwrap().is_empty());
        // GC keeps p1 only: p2's dynamic claim goes.
        let keep: BTreeSet<(String, String)> = [("p1".to_string(), "net1".to_string())].into();
        let gc = plan_gc(&mut s, "n1", &keep, 1).unwrap();
        s.commit(&gc).unwrap();
        assert_eq!(s.claims.len(), 1);
        // GC for another node touches nothing.
        assert!(plan_gc(&mut s, "n2", &BTreeSet::new(), 1)
            .unwrap()
            .is_empty());
        // Reconcile: p1 dies -> released but still reserved to "sticky".
        let (plan, released, alive) = plan_reconcile(&mut s, &Alive(vec![]), 1).unwrap();
        assert_eq!((released.len(), alive), (1, 0));
        s.commit(&plan).unwrap();
        assert!(s.claims.values().next().unwrap().holder.is_none());
        // Undo of a takeover restores the old holder exactly.
        let before = s.claims.clone();
        let (plan, _) = plan_add(&c, &mut s, &a, &req("sticky", true, "p3")).unwrap();
        s.commit(&plan).unwrap();
        let undo = plan_undo(&mut s, &plan).unwrap();
        s.commit(&undo).unwrap();
        assert_eq!(s.claims, before);
    }
}
