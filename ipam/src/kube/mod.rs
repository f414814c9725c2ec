//! The Kubernetes side of sticky-ipam (docs/src/concepts/kubernetes-store.md): claims
//! as `IPClaim` objects, liveness from pods and nodes. Everything that
//! talks HTTP sits behind `KubeApi`: `client::KubeClient` is the real one
//! (the `kube` crate), `fake::FakeApi` records calls for the unit tests.

pub mod client;
pub mod crd;
pub mod fake;
pub mod inspector;

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
    /// 401: the API server no longer takes these credentials (the token
    /// expired, or what it is bound to is gone: a node-bound token names
    /// its Node's UID, which a deleted and re-registered Node changes).
    /// Not an RBAC matter: nothing was authorized or refused yet.
    Unauthorized(String),
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
            ApiError::Unauthorized(m) => write!(f, "credentials rejected: {m}"),
            ApiError::Client(m) => write!(f, "no client: {m}"),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// An `IPClaim` as the store sees it: the claim plus the object's version.
/// One object per (network, identity, family), named by `claim_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimObject {
    pub network: String,
    pub claim: Claim,
    /// None for an object not yet created.
    pub resource_version: Option<String>,
    /// The UID of the `IPLock` on `claim.ip` this claim was made under, so
    /// a release deletes exactly that lock and never a later one.
    pub lock_uid: Option<String>,
}

/// An `IPLock`: one object per (network, IP), named by `lock_name`. Its
/// create-if-absent is what makes an address one identity's (I1). It is
/// created before the claim that names its address and deleted after it;
/// its address never changes, and its identity only by a re-key
/// (`KubeApi::rekey_lock`) when the address goes to another identity, so
/// the address is never unlocked while it changes hands. Its node changes
/// only when a node writes it naming itself (a re-key, an adoption), and a
/// write that takes another node's lock over marks it (`unconfirmed`), as
/// does every re-key: a node never deletes a marked lock nor another
/// node's, and never drops a mark (I14). An ADD that adopts it (its
/// identity's, no claim names it) writes it before its claim, so the
/// orphan sweep, which deletes at the resourceVersion it read, cannot miss
/// the adoption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockObject {
    pub network: String,
    pub ip: std::net::IpAddr,
    pub identity: String,
    /// Seconds since the epoch. Read: when the API server made it, by its
    /// own clock (`metadata.creationTimestamp`), since a node's clock may
    /// be minutes off. Written: the writer's clock, as `spec.created`
    /// (informative only).
    pub created: u64,
    /// None for an object not yet created.
    pub uid: Option<String>,
    /// The node whose plugin made it, or last wrote it naming itself: the
    /// node-scope policy lets only that node delete it, and only unmarked.
    /// None on locks made before 0.2.0 and by the CLI's operator commands.
    pub node: Option<String>,
    /// Set when the address changed hands on a judgement (a re-key) or
    /// another node took the lock over: the lock outlives its claim as a
    /// tombstone whose address is probed before it is bound again, and no
    /// node may delete it (so renaming oneself onto a lock frees nothing).
    /// Only reconcile clears it, once the claim naming the address carries
    /// no mark.
    pub unconfirmed: Option<crate::claim::Unconfirmed>,
    /// None for an object not yet created.
    pub resource_version: Option<String>,
    /// How often an ADD adopted it (`spec.adoptions`): every adoption
    /// changes the object, so a delete at an earlier resourceVersion fails.
    pub adoptions: u64,
    /// When the API server last changed it, by its own clock (the latest
    /// `metadata.managedFields[].time`): an adoption is as young as this.
    /// None when the server sent no managed fields.
    pub written: Option<u64>,
}

impl LockObject {
    /// Seconds since the API server last made or changed the lock, at
    /// `now`: what the orphan sweep compares with its grace.
    pub fn age(&self, now: u64) -> u64 {
        now.saturating_sub(self.created.max(self.written.unwrap_or(0)))
    }

    /// The lock as a write by NODE leaves it, naming IDENTITY: NODE named
    /// (when given), and the mark it has kept, else JUDGED's (a re-key),
    /// else a new one when NODE takes another node's lock over (I14).
    pub fn rewritten(
        &self,
        identity: &str,
        node: Option<&str>,
        judged: Option<&crate::claim::Unconfirmed>,
    ) -> LockObject {
        let taken_from = self
            .node
            .as_deref()
            .filter(|theirs| node.is_some_and(|mine| mine != *theirs));
        let unconfirmed = self
            .unconfirmed
            .clone()
            .or_else(|| judged.cloned())
            .or_else(|| {
                taken_from.map(|theirs| crate::claim::Unconfirmed {
                    since: crate::claim::now_secs(),
                    why: format!(
                        "node {} took over the lock node {theirs} made",
                        node.unwrap_or_default()
                    ),
                })
            });
        LockObject {
            identity: identity.to_string(),
            node: node.map(str::to_string).or_else(|| self.node.clone()),
            unconfirmed,
            ..self.clone()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterNode {
    pub out_of_service: bool,
    pub ready: Option<bool>,
    /// `status.nodeInfo.bootID` as kubelet reports it; None when empty.
    pub boot_id: Option<String>,
}

/// The narrow seam to the API server. Lookups answer `Ok(None)` for 404.
/// The ADD and DEL paths only use requests by object name; the listings
/// (paged by the real client) are for reconcile, GC, exhaustion and the CLI.
pub trait KubeApi {
    fn get_claim(&self, name: &str) -> ApiResult<Option<ClaimObject>>;
    fn list_claims(&self, selector: &str) -> ApiResult<Vec<ClaimObject>>;
    fn create_claim(&self, obj: &ClaimObject) -> ApiResult<ClaimObject>;
    /// Replaces with `obj.resource_version` as the precondition.
    fn replace_claim(&self, obj: &ClaimObject) -> ApiResult<ClaimObject>;
    /// Deletes with the resourceVersion precondition.
    fn delete_claim(&self, name: &str, resource_version: &str) -> ApiResult<()>;
    fn get_lock(&self, name: &str) -> ApiResult<Option<LockObject>>;
    fn list_locks(&self, selector: &str) -> ApiResult<Vec<LockObject>>;
    /// The locked addresses and nothing else (the real client pages
    /// through them, so memory does not grow with the pool).
    fn taken_addresses(
        &self,
        selector: &str,
    ) -> ApiResult<std::collections::BTreeSet<std::net::IpAddr>> {
        Ok(self
            .list_locks(selector)?
            .into_iter()
            .map(|l| l.ip)
            .collect())
    }
    /// Create-if-absent: 409 when the address is locked already.
    fn create_lock(&self, lock: &LockObject) -> ApiResult<LockObject>;
    /// Deletes with the UID precondition, and the resourceVersion one when
    /// given (the orphan sweep's: any write since its read stops it).
    fn delete_lock(&self, name: &str, uid: &str, resource_version: Option<&str>) -> ApiResult<()>;
    /// An ADD of the lock's identity adopts it (no claim names it): one
    /// PUT at `lock.resource_version` that counts the adoption and names
    /// NODE (when given) its node (`LockObject::rewritten`). A conflict
    /// when it changed since.
    fn adopt_lock(&self, lock: &LockObject, node: Option<&str>) -> ApiResult<LockObject>;
    /// Gives the address to another identity without ever unlocking it:
    /// one PUT of the lock with `lock.uid`, at `lock.resource_version`
    /// (when None, at the version a GET reads), naming IDENTITY and NODE
    /// (when given) its node, and marked with JUDGED unless it is marked
    /// already (`LockObject::rewritten`). A conflict when it is gone,
    /// another lock, or changed since. The node-scope policy allows it
    /// only to a node naming itself.
    fn rekey_lock(
        &self,
        lock: &LockObject,
        identity: &str,
        node: Option<&str>,
        judged: &crate::claim::Unconfirmed,
    ) -> ApiResult<LockObject>;
    /// Clears the lock's mark (reconcile's, never a node's: the claim
    /// naming its address carries no mark), at `lock.resource_version`.
    fn clear_lock_mark(&self, lock: &LockObject) -> ApiResult<LockObject>;
    fn get_pod(&self, namespace: &str, name: &str) -> ApiResult<Option<PodFacts>>;
    fn get_node(&self, name: &str) -> ApiResult<Option<ClusterNode>>;
    /// What retention needs of a StatefulSet, None when it no longer
    /// exists.
    fn get_stateful_set(
        &self,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Option<crate::retention::StatefulSetFacts>>;
    /// Posts an Event on the pod; best effort, so the real client bounds it
    /// by its own short deadline rather than the store's timeout.
    fn post_event(&self, event: &crate::events::PodEvent) -> ApiResult<()>;
    /// The `IPAMClaim` object as the API gave it (its status is rewritten
    /// from it, so it is kept whole), None when there is none (or no CRD).
    fn get_ipam_claim(&self, namespace: &str, name: &str) -> ApiResult<Option<serde_json::Value>>;
    /// Replaces the `IPAMClaim`'s status subresource with `claim`'s, at its
    /// `metadata.resourceVersion`: a conflict when it changed since.
    fn replace_ipam_claim_status(
        &self,
        namespace: &str,
        claim: &serde_json::Value,
    ) -> ApiResult<()>;
    /// What the IPAM reads of KubeVirt's VirtualMachineInstance, None when
    /// there is none (or no CRD).
    fn get_vmi(&self, namespace: &str, name: &str)
        -> ApiResult<Option<crate::ipamclaim::VmiFacts>>;
}

/// One thing the plugin asks of the API server: what deploy/20-rbac.yaml
/// grants the node's ClusterRole, and what `doctor` asks the server about
/// with a SelfSubjectAccessReview. The examples test holds this list, the
/// ClusterRole and the client's calls equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permission {
    /// "" for the core group.
    pub group: &'static str,
    pub resource: &'static str,
    pub verb: &'static str,
}

impl Permission {
    /// "delete iplocks.sticky-macvlan.io", "get pods".
    pub fn describe(&self) -> String {
        if self.group.is_empty() {
            format!("{} {}", self.verb, self.resource)
        } else {
            format!("{} {}.{}", self.verb, self.resource, self.group)
        }
    }
}

const fn grant(group: &'static str, resource: &'static str, verb: &'static str) -> Permission {
    Permission {
        group,
        resource,
        verb,
    }
}

/// Every permission of the node's ClusterRole `sticky-macvlan`.
pub const PLUGIN_ACCESS: &[Permission] = &[
    grant(GROUP, "ipclaims", "get"),
    grant(GROUP, "ipclaims", "list"),
    grant(GROUP, "ipclaims", "create"),
    grant(GROUP, "ipclaims", "update"),
    grant(GROUP, "ipclaims", "delete"),
    grant(GROUP, "iplocks", "get"),
    grant(GROUP, "iplocks", "list"),
    grant(GROUP, "iplocks", "create"),
    grant(GROUP, "iplocks", "update"),
    grant(GROUP, "iplocks", "delete"),
    grant("", "pods", "get"),
    grant("", "nodes", "get"),
    grant("", "events", "create"),
    grant("", "events", "get"),
    grant("", "events", "patch"),
    grant("apps", "statefulsets", "get"),
    grant(crate::ipamclaim::GROUP, crate::ipamclaim::PLURAL, "get"),
    grant(crate::ipamclaim::GROUP, "ipamclaims/status", "update"),
    grant(
        crate::ipamclaim::VMI_GROUP,
        crate::ipamclaim::VMI_PLURAL,
        "get",
    ),
];

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

pub fn family_label(family: crate::addr::Family) -> &'static str {
    match family {
        crate::addr::Family::V4 => "v4",
        crate::addr::Family::V6 => "v6",
    }
}

/// `<network>.<sha256(identity), 48 hex>.<v4|v6>`: the IPClaim of an
/// identity in a family. One name per (network, identity, family), so
/// create-if-absent keeps one address per identity and family (I2) with
/// no listing. Identities are untrusted strings of any shape: only their
/// hash is in the name, which no two identities share (192 bits).
pub fn claim_name(network: &str, identity: &str, family: crate::addr::Family) -> String {
    format!(
        "{}.{}.{}",
        slug(network),
        identity_label(identity),
        family_label(family)
    )
}

/// `<network>.<ip>`: the IPLock of an address, so create-if-absent is the
/// lock on it (I1). IPv6 colons become dashes; a hex IPv6 group is never a
/// 48-character label, so lock and claim names never meet.
pub fn lock_name(network: &str, ip: std::net::IpAddr) -> String {
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
            assert_eq!(lock_name(net, ip.parse().unwrap()), want);
        }
        for odd in ["Mac_Net", "", "-x", "a/b", &"n".repeat(64)] {
            let s = slug(odd);
            assert!(s.starts_with("h-") && s.len() == 18, "{odd:?} -> {s}");
        }
        assert_ne!(slug("Mac_Net"), slug("mac_net"));
        assert_eq!(identity_label("bgp/peer").len(), 48);
        let v4 = claim_name("macnet", "bgp/peer", crate::addr::Family::V4);
        assert!(
            v4.starts_with("macnet.") && v4.ends_with(".v4") && v4.len() == 58,
            "{v4}"
        );
        assert_ne!(
            v4,
            claim_name("macnet", "bgp/peer", crate::addr::Family::V6)
        );
        assert_ne!(holder_label("ab", "c"), holder_label("a", "bc"));
    }

    #[test]
    fn a_locks_age_is_the_api_servers_not_the_nodes() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let lock = LockObject {
            network: "macnet".into(),
            ip: "10.0.0.13".parse().unwrap(),
            identity: "peer".into(),
            // The node's clock, ten minutes behind the API server's.
            created: 1_700_000_000 - 600,
            uid: Some("u1".into()),
            node: Some("node1".into()),
            unconfirmed: None,
            resource_version: Some("5".into()),
            adoptions: 0,
            written: None,
        };
        let mut o = crd::to_lock(&lock);
        let server = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
        o.metadata.creation_timestamp = Some(Time(server));
        assert_eq!(crd::from_lock(&o).unwrap().created, 1_700_000_000);
    }
}
