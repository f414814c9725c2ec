//! Claim stores. A `ClaimStore` is one network's claims: reads, then one
//! `commit` of a `Plan`. The engine never sees files or objects:
//! `file::FileStore` is the embedded store (a lock per network),
//! `ipclaim::KubeStore` the cluster-wide one (`IPClaim` objects,
//! conditional writes), `memory` the test one. Failures are typed
//! (`error::StoreError`) and become CNI codes at one edge.

pub mod error;
pub mod file;
mod fsio;
pub mod ipclaim;
pub mod memory;
pub mod retry;

pub use error::{api_unreachable, PlanError, PlanResult, StoreError, StoreResult};

use std::net::IpAddr;
use std::path::PathBuf;

use crate::claim::Claim;

/// One claim's change: `before` as read, `after` as it must become
/// (None: deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub before: Option<Claim>,
    pub after: Option<Claim>,
}

impl Change {
    pub fn ip(&self) -> Option<IpAddr> {
        self.after.as_ref().or(self.before.as_ref()).map(|c| c.ip)
    }

    /// The change that undoes this one.
    pub fn inverse(&self) -> Change {
        Change {
            before: self.after.clone(),
            after: self.before.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// (range set, last address handed out) for next-fit.
    pub cursors: Vec<(usize, IpAddr)>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.cursors.is_empty()
    }

    /// Every address a change of the plan names, before or after.
    pub fn addresses(&self) -> std::collections::BTreeSet<IpAddr> {
        self.changes
            .iter()
            .flat_map(|c| [c.before.as_ref(), c.after.as_ref()])
            .flatten()
            .map(|c| c.ip)
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damaged {
    pub path: PathBuf,
    pub why: String,
}

#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub claims: Vec<Claim>,
    pub damaged: Vec<Damaged>,
}

pub trait ClaimStore {
    /// The claim on `ip`; an unreadable record is `StoreError::Damaged`
    /// naming it.
    fn claim(&mut self, ip: IpAddr) -> StoreResult<Option<Claim>>;
    /// Whether a next-fit candidate is taken. A store whose writes are
    /// conditional may answer "free" without looking: its commit checks.
    fn candidate_taken(&mut self, ip: IpAddr) -> StoreResult<bool> {
        self.claim(ip).map(|c| c.is_some())
    }
    /// Claims whose identity is `identity` (found through an index, checked
    /// against the claims themselves).
    fn claims_of_identity(&mut self, identity: &str) -> StoreResult<Vec<Claim>>;
    /// Claims whose holder is this attachment.
    fn claims_of_holder(&mut self, container_id: &str, ifname: &str) -> StoreResult<Vec<Claim>>;
    /// Every claim (the slow path: exhaustion, GC, reconcile, the CLI).
    fn list(&mut self) -> StoreResult<Listing>;
    fn cursor(&mut self, set: usize) -> StoreResult<Option<IpAddr>>;
    /// Applies a plan durably before returning. A store without a lock
    /// fails with `StoreError::Conflict` when it lost a race; nothing of
    /// the plan is then left applied.
    fn commit(&mut self, plan: &Plan) -> StoreResult<()>;
    /// Called after a conflict, before planning again.
    fn conflicted(&mut self) -> StoreResult<()> {
        Ok(())
    }
}
