//! An in-memory `ClaimStore` for the engine's unit tests.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::{ClaimStore, Listing, Plan, StoreError, StoreResult};
use crate::claim::Claim;

#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    pub claims: BTreeMap<IpAddr, Claim>,
    pub cursors: BTreeMap<usize, IpAddr>,
    /// Addresses whose record reads as damaged.
    pub damaged: Vec<IpAddr>,
    pub commits: usize,
}

impl ClaimStore for MemoryStore {
    fn claim(&mut self, ip: IpAddr) -> StoreResult<Option<Claim>> {
        if self.damaged.contains(&ip) {
            return Err(StoreError::Damaged(format!(
                "claim record for {ip} is damaged"
            )));
        }
        Ok(self.claims.get(&ip).cloned())
    }

    fn claims_of_identity(&mut self, identity: &str) -> StoreResult<Vec<Claim>> {
        Ok(self
            .claims
            .values()
            .filter(|c| c.identity == identity)
            .cloned()
            .collect())
    }

    fn claims_of_holder(&mut self, container_id: &str, ifname: &str) -> StoreResult<Vec<Claim>> {
        Ok(self
            .claims
            .values()
            .filter(|c| c.held_by(container_id, ifname))
            .cloned()
            .collect())
    }

    fn list(&mut self) -> StoreResult<Listing> {
        Ok(Listing {
            claims: self.claims.values().cloned().collect(),
            damaged: vec![],
        })
    }

    fn cursor(&mut self, set: usize) -> StoreResult<Option<IpAddr>> {
        Ok(self.cursors.get(&set).copied())
    }

    fn commit(&mut self, plan: &Plan) -> StoreResult<()> {
        for change in &plan.changes {
            if let Some(before) = &change.before {
                self.claims.remove(&before.ip);
            }
            if let Some(after) = &change.after {
                self.claims.insert(after.ip, after.clone());
            }
        }
        for (set, ip) in &plan.cursors {
            self.cursors.insert(*set, *ip);
        }
        self.commits += 1;
        Ok(())
    }
}
