//! After the wire confirmed an ADD's addresses (its probes heard nobody):
//! the `unconfirmed` marks on the claims it holds are cleared, so that
//! their next release by the holder's own DEL proves them free again (I7).

use std::net::IpAddr;

use crate::claim::Claim;
use crate::store::{Change, ClaimStore, Plan, PlanResult};

/// Clears the mark on each of `ips` whose claim is still held by this
/// attachment; a claim someone else changed since is left as it is.
pub fn plan_confirm(
    store: &mut dyn ClaimStore,
    ips: &[IpAddr],
    container_id: &str,
    ifname: &str,
) -> PlanResult<Plan> {
    let mut plan = Plan::default();
    for ip in ips {
        let Some(claim) = store.claim(*ip)? else {
            continue;
        };
        if claim.unconfirmed.is_none() || !claim.held_by(container_id, ifname) {
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
