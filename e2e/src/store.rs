//! Reading the sticky-ipam file store back, to check the invariants of
//! I1-I5 (ARCHITECTURE.md) from what was written, not from what the plugin said.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use sticky_ipam::claim::Claim;
use sticky_ipam::store::file::FileStore;
use sticky_ipam::store::ClaimStore;

pub fn claims(dir: &Path, network: &str) -> Vec<Claim> {
    let mut store = FileStore::open(dir, network).expect("open the claim store");
    let listing = store.list().expect("list claims");
    assert!(
        listing.damaged.is_empty(),
        "damaged records: {:?}",
        listing.damaged
    );
    listing.claims
}

/// identity -> its address (asserting one per identity and family).
#[track_caller]
pub fn assert_invariants(dir: &Path, network: &str) -> BTreeMap<String, IpAddr> {
    let claims = claims(dir, network);
    let mut by_identity: BTreeMap<String, IpAddr> = BTreeMap::new();
    for c in &claims {
        if let Some(other) = by_identity.insert(c.identity.clone(), c.ip) {
            assert_eq!(
                other.is_ipv4(),
                !c.ip.is_ipv4(),
                "identity {:?} has two addresses of one family: {other} and {}",
                c.identity,
                c.ip
            );
        }
        // A tombstone (freed on a judgement, kept until a probe) is the one
        // dynamic claim without a holder.
        assert!(
            c.sticky || c.holder.is_some() || c.is_tombstone(),
            "dynamic claim {} has no holder and no mark: it should have been freed",
            c.ip
        );
    }
    by_identity
}

pub fn holder_of(dir: &Path, network: &str, identity: &str) -> Option<String> {
    claims(dir, network)
        .into_iter()
        .find(|c| c.identity == identity)
        .and_then(|c| c.holder.map(|h| h.container_id))
}
