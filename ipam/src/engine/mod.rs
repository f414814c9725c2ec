//! The decisions: which address an ADD gets (`add`: the identity's claim,
//! a reservation, a requested address, next-fit, reclaim on exhaustion;
//! degraded mode's same-pod re-ADD), and what DEL, GC, reconcile,
//! retirement, an operator's release and a failed ADD's undo change
//! (`release`). Each `plan_*` reads through `ClaimStore` and asks
//! `Inspector` for liveness verdicts, and returns a `Plan`; nothing is
//! written until the caller commits the whole plan, so a refusal in any
//! range set changes nothing (I5 in ARCHITECTURE.md).

use std::net::IpAddr;

use crate::claim::Holder;
use crate::config::Range;
use crate::identity::Identity;
use crate::liveness::Caller;
use crate::probe_policy::Origin;

mod add;
mod confirm;
mod degraded;
mod release;
#[cfg(test)]
mod test_support;

pub use add::plan_add;
pub use confirm::plan_confirm;
pub use degraded::plan_degraded;
pub use release::{
    free, plan_del, plan_gc, plan_reconcile, plan_release, plan_retire, plan_undo, release_holder,
    Release, ReleaseTarget, Released,
};

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
    /// Set when the address was another identity's, reclaimed because the
    /// pool was exhausted (its holder dead, or its owner deleted).
    pub reclaimed: bool,
    /// The holder the address was taken from (judged dead), if any.
    pub displaced: Option<Holder>,
    /// Where the address came from: what decides whether the wire must
    /// confirm it (`probe_policy::needs_wire_check`).
    pub origin: Origin,
    /// The claim carries the `unconfirmed` mark: the address was freed or
    /// taken on a judgement the wire has not confirmed, so it is probed
    /// whatever its origin.
    pub unconfirmed: bool,
}
