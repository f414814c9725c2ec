//! What DEL, GC, reconcile, retirement, an operator's release and a
//! failed ADD's undo change.
//!
//! Only a holder's own DEL of a confirmed grant proves its address free
//! (I7): every other way out of a claim (a verdict, CNI GC, an operator,
//! retirement) leaves the claim's `unconfirmed` mark, so that the next
//! grant of the address is probed on the wire, and never deletes a claim
//! that still has to be confirmed (`free`).

use std::collections::BTreeSet;
use std::net::IpAddr;

use cni::{code, CniError};

use crate::claim::{Claim, Unconfirmed};
use crate::liveness::{Inspector, Verdict};
use crate::store::{Change, ClaimStore, Plan, PlanResult};

/// How a holder leaves its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release<'a> {
    /// The holder's own DEL: proof that it left the wire, unless its own
    /// grant was never confirmed there.
    OwnDel,
    /// A judgement that it is gone, by whom and why ("reconcile: pod
    /// db/db-0 no longer exists"), which may be wrong.
    Judged(&'a str),
}

/// The mark a judgement leaves on `claim`, or the one it already had.
fn mark_after(claim: &Claim, now: u64, how: Release) -> Option<Unconfirmed> {
    match (how, &claim.holder) {
        (Release::Judged(why), Some(h)) => Some(Unconfirmed {
            since: now,
            why: format!("{} was released by {why}", h.describe()),
        }),
        _ => claim.unconfirmed.clone(),
    }
}

/// The change that releases a claim's holder: a sticky claim stays
/// reserved to its identity; a dynamic one frees its address, or, when
/// the wire has not confirmed it, stays as a tombstone (`Claim::is_tombstone`).
pub fn release_holder(claim: &Claim, now: u64, how: Release) -> Change {
    let unconfirmed = mark_after(claim, now, how);
    let after = (claim.sticky || unconfirmed.is_some()).then(|| Claim {
        holder: None,
        updated: now,
        unconfirmed,
        ..claim.clone()
    });
    Change {
        before: Some(claim.clone()),
        after,
    }
}

/// The change that ends a claim for its identity (an operator's release,
/// retirement): deleted when its address is proven free; otherwise a
/// tombstone that reserves nothing and binds no owner (its namespace stays
/// as a record; tenancy ignores it) and keeps the address until a grant's
/// probe confirms it.
pub fn free(claim: &Claim, now: u64, how: Release) -> Change {
    let unconfirmed = mark_after(claim, now, how);
    let after = unconfirmed.is_some().then(|| Claim {
        holder: None,
        sticky: false,
        owner: None,
        updated: now,
        unconfirmed,
        ..claim.clone()
    });
    Change {
        before: Some(claim.clone()),
        after,
    }
}

/// DEL: releases what this attachment holds; anyone else's DEL is a no-op
/// (I3), and a second DEL finds nothing (I4).
pub fn plan_del(
    store: &mut dyn ClaimStore,
    container_id: &str,
    ifname: &str,
    now: u64,
) -> PlanResult<Plan> {
    let held = store.claims_of_holder(container_id, ifname)?;
    Ok(Plan {
        changes: held
            .iter()
            .map(|c| release_holder(c, now, Release::OwnDel))
            .collect(),
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
) -> PlanResult<Plan> {
    let listing = store.list()?;
    let changes = listing
        .claims
        .iter()
        .filter(|c| {
            c.holder.as_ref().is_some_and(|h| {
                h.node == node && !keep.contains(&(h.container_id.clone(), h.ifname.clone()))
            })
        })
        .map(|c| {
            release_holder(
                c,
                now,
                Release::Judged("CNI GC (the runtime no longer lists the attachment)"),
            )
        })
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
) -> PlanResult<(Plan, Vec<Released>, usize)> {
    let listing = store.list()?;
    let mut plan = Plan::default();
    let mut released = Vec::new();
    let mut alive = 0;
    for claim in &listing.claims {
        let Some(holder) = &claim.holder else {
            // A tombstone stays until a probe confirms its address.
            if !claim.sticky && claim.unconfirmed.is_none() {
                plan.changes
                    .push(release_holder(claim, now, Release::OwnDel));
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
                plan.changes.push(release_holder(
                    claim,
                    now,
                    Release::Judged(&format!("reconcile ({why})")),
                ));
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

/// Retires the sticky claims whose owner (a StatefulSet) was deleted or
/// scaled below their ordinal, as their retention says
/// (`Inspector::owner_retired`): their address goes back to the pool once
/// no live holder uses it.
pub fn plan_retire(
    store: &mut dyn ClaimStore,
    inspector: &dyn Inspector,
    now: u64,
) -> PlanResult<(Plan, Vec<Released>)> {
    let listing = store.list()?;
    let mut plan = Plan::default();
    let mut out = Vec::new();
    for claim in &listing.claims {
        let Some(why) = claim
            .owner
            .as_ref()
            .and_then(|o| inspector.owner_retired(o, &claim.identity))
        else {
            continue;
        };
        if claim.is_tombstone() {
            continue;
        }
        let judged = match &claim.holder {
            None => format!("retirement ({why})"),
            Some(h) => match inspector.verdict(h, None) {
                Verdict::Dead(dead) => format!("retirement ({why}; {dead})"),
                Verdict::Alive(_) => continue,
            },
        };
        plan.changes
            .push(free(claim, now, Release::Judged(&judged)));
        out.push(Released {
            ip: claim.ip,
            identity: claim.identity.clone(),
            why,
        });
    }
    Ok((plan, out))
}

/// Undoes a committed ADD plan after the rest of the ADD failed, claim by
/// claim, only where nobody changed the claim since (I5).
pub fn plan_undo(store: &mut dyn ClaimStore, done: &Plan) -> PlanResult<Plan> {
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

/// What an operator's `release` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseTarget {
    Address(IpAddr),
    Identity(String),
}

/// The operator's release: deletes the target's claims. Refused (code 11)
/// while a holder is considered alive, unless `force`; a target with no
/// claim is an error saying so (code 7), so a mistyped address or network
/// is never a silent success.
pub fn plan_release(
    store: &mut dyn ClaimStore,
    inspector: &dyn Inspector,
    network: &str,
    target: &ReleaseTarget,
    force: bool,
    now: u64,
) -> PlanResult<(Plan, Vec<Claim>)> {
    let targets: Vec<Claim> = match target {
        ReleaseTarget::Address(ip) => store.claim(*ip)?.into_iter().collect(),
        ReleaseTarget::Identity(id) => store.claims_of_identity(id)?,
    };
    if targets.is_empty() {
        let what = match target {
            ReleaseTarget::Address(ip) => format!("no claim of network {network:?} holds {ip}"),
            ReleaseTarget::Identity(id) => {
                format!("identity {id:?} has no claim on network {network:?}")
            }
        };
        let listing = store.list()?;
        let span = match (listing.claims.first(), listing.claims.last()) {
            (Some(lo), Some(hi)) => format!("its claims run from {} to {}", lo.ip, hi.ip),
            _ => "it has no claims".to_string(),
        };
        return Err(CniError::invalid_config(format!(
            "{what}, so nothing was released ({span}): an address outside the network's ranges is never claimed; `sticky-macvlan claims --network {network}` lists what is"
        ))
        .into());
    }
    if !force {
        for c in &targets {
            let Some(h) = &c.holder else { continue };
            if let Verdict::Alive(why) = inspector.verdict(h, None) {
                return Err(CniError::new(
                    code::TRY_AGAIN_LATER,
                    format!(
                        "{} is held by {}, which is considered alive ({why}): stop it first, or pass --force if you know it is gone",
                        c.ip,
                        h.describe()
                    ),
                )
                .into());
            }
        }
    }
    let how = Release::Judged(if force {
        "an operator's release --force"
    } else {
        "an operator's release"
    });
    // A tombstone is released already: its address waits for a probe.
    let targets: Vec<Claim> = targets.into_iter().filter(|c| !c.is_tombstone()).collect();
    let plan = Plan {
        changes: targets.iter().map(|c| free(c, now, how)).collect(),
        cursors: vec![],
    };
    Ok((plan, targets))
}

#[cfg(test)]
#[path = "release_tests.rs"]
mod tests;
