//! The Kubernetes side of sticky-ipam (README, "The kubernetes store"): claims
//! as `IPClaim` objects, liveness from pods and nodes. Everything that
//! talks HTTP sits behind `KubeApi`: `client::KubeClient` is the real one
//! (the `kube` crate), `fake::FakeApi` records calls for the unit tests.

pub mod client;
pub mod crd;
pub mod fake;
pub mod liveness;

use std::fmt;

use sha2::{Digest, Sha256};

use crate::claim::Claim;
use crate::pod::PodFacts;

pub const GROUP: &str = "sticky-macvlan.io";
pub const LABEL_NETWORK: &str = "sticky-macvlan.io/network";
pub const LABEL_IDENTITY: &str = "sticky-macvlan.io/identity";
pub const LABEL_HOLDER: &str = "sticky-macvlan.io/holder";
pub const LABEL_FAMILY: &str = "sticky-macvlan.io/family";
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// 409: AlreadyExists on create, Conflict on a resourceVersion
    /// precondition; also 404 on a write that expected the object.
    Conflict(String),
    /// No answer in time, connection refused, 5xx, 429: nothing can be
    /// concluded about the cluster.
    Unreachable(String),
    /// Any other refusal by the API server (403, 422).
    Refused(String),
    /// No client could be built (a missing or unreadable kubeconfig, no
    /// in-cluster configuration): no request was made.
    Client(String),
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Conflict(m) => write!(f, "conflict: {m}"),
            ApiError::Unreachable(m) => write!(f, "unreachable: {m}"),
            ApiError::Refused(m) => write!(f, "refused: {m}"),
            ApiError::Client(m) => write!(f, "no client: {m}"),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// An `IPClaim` as the store sees it: the claim plus the object's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimObject {
    pub network: String,
    pub claim: Claim,
    /// None for an object not yet created.
    pub resource_version: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterNode {
    pub out_of_service: bool,
    pub ready: Option<bool>,
}

/// The narrow seam to the API server. Lookups answer `Ok(None)` for 404.
pub trait KubeApi {
    fn get_claim(&self, name: &str) -> ApiResult<Option<ClaimObject>>;
    fn list_claims(&self, selector: &str) -> ApiResult<Vec<ClaimObject>>;
    /// The addresses of the selected claims and nothing else (the real
    /// client pages through them, so memory does not grow with the pool).
    fn taken_addresses(
        &self,
        selector: &str,
    ) -> ApiResult<std::collections::BTreeSet<std::net::IpAddr>> {
        Ok(self
            .list_claims(selector)?
            .into_iter()
            .map(|o| o.claim.ip)
            .collect())
    }
    fn create_claim(&self, obj: &ClaimObject) -> ApiResult<ClaimObject>;
    /// Replaces with `obj.resource_version` as the precondition.
    fn replace_claim(&self, obj: &ClaimObject) -> ApiResult<ClaimObject>;
    /// Deletes with the resourceVersion precondition.
    fn delete_claim(&self, name: &str, resource_version: &str) -> ApiResult<()>;
    fn get_pod(&self, namespace: &str, name: &str) -> ApiResult<Option<PodFacts>>;
    fn get_node(&self, name: &str) -> ApiResult<Option<ClusterNode>>;
    /// The UID of a StatefulSet, None when it no longer exists.
    fn get_stateful_set(&self, namespace: &str, name: &str) -> ApiResult<Option<String>>;
}

fn hex(bytes: &[u8], n: usize) -> String {
    bytes
        .iter()
        .take(n)
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

/// A label value or name part for `s`: itself when it is a valid DNS label
/// (so `kubectl get ipclaims` stays readable), else a hash.
pub fn slug(s: &str) -> String {
    let valid = !s.is_empty()
        && s.len() <= 40
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if valid {
        s.to_string()
    } else {
        format!("h-{}", hex(&Sha256::digest(s.as_bytes()), 8))
    }
}

/// Identities are untrusted strings: only their hash reaches a label.
pub fn identity_label(identity: &str) -> String {
    hex(&Sha256::digest(identity.as_bytes()), 24)
}

pub fn holder_label(container_id: &str, ifname: &str) -> String {
    let mut h = Sha256::new();
    h.update(container_id.as_bytes());
    h.update([0]);
    h.update(ifname.as_bytes());
    hex(&h.finalize(), 24)
}

/// `<network>.<ip>`: one object per (network, IP), so create-if-absent is
/// the lock on an address (I1). IPv6 colons become dashes.
pub fn object_name(network: &str, ip: std::net::IpAddr) -> String {
    let ip = match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => v6
            .segments()
            .iter()
            .map(|s| format!("{s:x}"))
            .collect::<Vec<_>>()
            .join("-"),
    };
    format!("{}.{ip}", slug(network))
}

pub fn network_selector(network: &str) -> String {
    format!("{LABEL_NETWORK}={}", slug(network))
}

pub fn identity_selector(network: &str, identity: &str) -> String {
    format!(
        "{},{LABEL_IDENTITY}={}",
        network_selector(network),
        identity_label(identity)
    )
}

pub fn holder_selector(network: &str, container_id: &str, ifname: &str) -> String {
    format!(
        "{},{LABEL_HOLDER}={}",
        network_selector(network),
        holder_label(container_id, ifname)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_dns_subdomains() {
        let cases = [
            ("macnet", "172.31.59.2", "macnet.172.31.59.2"),
            ("macnet", "fd00::5", "macnet.fd00-0-0-0-0-0-0-5"),
        ];
        for (net, ip, want) in cases {
            assert_eq!(object_name(net, ip.parse().unwrap()), want);
        }
        for odd in ["Mac_Net", "", "-x", "a/b", &"n".repeat(64)] {
            let s = slug(odd);
            assert!(s.starts_with("h-") && s.len() == 18, "{odd:?} -> {s}");
        }
        assert_ne!(slug("Mac_Net"), slug("mac_net"));
        assert_eq!(identity_label("bgp/peer").len(), 48);
        assert_ne!(holder_label("ab", "c"), holder_label("a", "bc"));
    }
}
