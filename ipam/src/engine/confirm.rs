//! After the wire confirmed an ADD's addresses (its probes heard nobody):
//! the `unconfirmed` marks on the claims it holds are cleared, so that
//! their next release by the holder's own DEL proves them free again (I7).

use std::net::IpAddr;

use crate::claim::Claim;
use crate::store::{Change, ClaimStore, Plan, PlanResult};

/// Clears the mark on each of `ips` whose claim is still held by this
/// attachment; a claim someone else changed since is left as it is. The
/// attachment's claims are read as DEL reads them (on the kubernetes store
/// from the node-local cache the ADD just wrote), so the confirmation costs
/// its one write and no read; a stale entry fails that write's
/// precondition and the plan is made again.
pub fn plan_confirm(
    store: &mut dyn ClaimStore,
    ips: &[IpAddr],
    container_id: &str,
    ifname: &str,
) -> PlanResult<Plan> {
    let mut plan = Plan::default();
    for claim in store.claims_of_holder(container_id, ifname)? {
        if claim.unconfirmed.is_none() || !ips.contains(&claim.ip) {
            continue;
        }
        plan.changes.push(Change {
            after: Some(Claim {
                unconfirmed: None,
                ..claim.clone()
            }),
            before: Some(claim),
        });
    }
    Ok(plan)
}

#[cfg(test)]
#[path = "confirm_tests.rs"]
mod tests;
