//! The custom resources. `IPClaim`: one cluster-scoped object per
//! (network, identity, family), naming the identity's address and holder.
//! The holder lives in `.status` but the CRD has no status subresource, so
//! one PUT with a resourceVersion precondition moves an address and its
//! holder together. `IPLock`: one per (network, IP), the lock on an
//! address; created before the claim that names it, deleted after.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    claim_name, family_label, holder_label, identity_label, lock_name, slug, ClaimObject,
    LockObject, LABEL_FAMILY, LABEL_HOLDER, LABEL_IDENTITY, LABEL_NETWORK,
};
use crate::addr::Family;
use crate::claim::{Claim, Holder, Owner, Unconfirmed};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "sticky-macvlan.io",
    version = "v1alpha1",
    kind = "IPClaim",
    plural = "ipclaims",
    shortname = "ipc",
    status = "IPClaimStatus",
    printcolumn = r#"{"name":"Network","type":"string","jsonPath":".spec.network"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".spec.ip"}"#,
    printcolumn = r#"{"name":"Identity","type":"string","jsonPath":".spec.identity"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".status.pod"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Sticky","type":"boolean","jsonPath":".spec.sticky","priority":1}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.namespace","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPClaimSpec {
    /// The CNI network name (the NAD's config `name`).
    pub network: String,
    pub ip: String,
    pub identity: String,
    /// Sticky claims stay reserved to their identity when released.
    pub sticky: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// The namespace the identity belongs to: pods of other namespaces may
    /// not take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub created: u64,
    /// The UID of the IPLock on `ip` this claim was made under.
    #[serde(default, rename = "lockUID", skip_serializing_if = "Option::is_none")]
    pub lock_uid: Option<String>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "sticky-macvlan.io",
    version = "v1alpha1",
    kind = "IPLock",
    plural = "iplocks",
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".spec.ip"}"#,
    printcolumn = r#"{"name":"Identity","type":"string","jsonPath":".spec.identity"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.node"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPLockSpec {
    /// The CNI network name (the NAD's config `name`).
    pub network: String,
    pub ip: String,
    /// The identity whose IPClaim may name this address.
    pub identity: String,
    /// When the writer made it, by its own clock (informative: how old a
    /// lock is comes from metadata.creationTimestamp, the API server's).
    pub created: u64,
    /// The node whose plugin made the lock or took it over; under the
    /// node-scope policy only that node's plugin may delete it. Absent on
    /// locks made before 0.2.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// How many times an ADD of the identity adopted the lock after the
    /// ADD that made it left no IPClaim: each adoption changes the object
    /// before its claim is made, so reconcile's sweep of locks no claim
    /// names cannot delete it from an earlier read.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub adoptions: u64,
    /// Set when the address changed identity on a judgement (a holder
    /// judged dead, a tombstone reclaimed) or another node took the lock
    /// over: its address is probed before it is bound again, and under the
    /// node-scope policy no node may delete the lock or clear this; the
    /// reconcile Deployment clears it once the IPClaim naming the address
    /// carries no mark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unconfirmed: Option<Unconfirmed>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn unix_secs(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> u64 {
    u64::try_from(t.0.as_second()).unwrap_or(0)
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPClaimStatus {
    /// Bound (a holder uses the address), Reserved (sticky, no holder) or
    /// Released (a holder released by a judgement; the address is probed
    /// on the wire before it is bound again).
    pub phase: String,
    /// namespace/name of the holder's pod, for `kubectl get ipclaims`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    pub updated: u64,
    /// Set while the wire has not confirmed the address since a holder was
    /// released or taken over on a judgement: its next grant is probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unconfirmed: Option<Unconfirmed>,
    /// Held (an attachment uses the address) and, for a sticky claim,
    /// Reserved (the address is kept for its identity while none does).
    // Derived from the claim and written in the same PUT as it, so they
    // cost no request; readers ignore them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ClaimCondition>,
}

/// A condition in the shape of metav1.Condition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimCondition {
    /// Held: an attachment uses the address; Reserved: the address is kept
    /// for a sticky identity with no holder.
    #[serde(rename = "type")]
    pub type_: String,
    /// "True" or "False".
    pub status: String,
    pub reason: String,
    pub message: String,
    /// When the holder last changed (RFC 3339).
    pub last_transition_time: String,
}

pub const PHASE_BOUND: &str = "Bound";
pub const PHASE_RESERVED: &str = "Reserved";
pub const PHASE_RELEASED: &str = "Released";

/// The claim's phase for `kubectl get ipclaims`.
fn phase(c: &Claim) -> &'static str {
    if c.holder.is_some() {
        PHASE_BOUND
    } else if c.is_tombstone() {
        PHASE_RELEASED
    } else {
        PHASE_RESERVED
    }
}

/// The conditions of a claim: `Held` always, `Reserved` for a sticky one,
/// `WireConfirmed` False while it carries the `unconfirmed` mark.
fn conditions(c: &Claim) -> Vec<ClaimCondition> {
    let at = cni::log::rfc3339_seconds(c.updated);
    let condition = |type_: &str, held: bool, reason: &str, message: String| ClaimCondition {
        type_: type_.into(),
        status: if held { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: at.clone(),
    };
    let mut out = vec![match &c.holder {
        Some(h) => condition(
            "Held",
            true,
            "AttachmentHolds",
            format!("{} uses {}", h.describe(), c.ip),
        ),
        None => condition(
            "Held",
            false,
            "NoHolder",
            format!("no attachment uses {}", c.ip),
        ),
    }];
    if c.sticky {
        out.push(match &c.holder {
            Some(_) => condition(
                "Reserved",
                false,
                "InUse",
                format!("{} is in use by its identity", c.ip),
            ),
            None => condition(
                "Reserved",
                true,
                "StickyIdentity",
                format!(
                    "{} is kept for identity {:?} until it comes back or is released (sticky-macvlan release --identity)",
                    c.ip, c.identity
                ),
            ),
        });
    }
    if let Some(u) = &c.unconfirmed {
        out.push(ClaimCondition {
            last_transition_time: cni::log::rfc3339_seconds(u.since),
            ..condition(
                "WireConfirmed",
                false,
                "ReleasedOnJudgement",
                format!(
                    "{}; the next grant of {} probes the wire (ARP or DAD) before binding it",
                    u.why, c.ip
                ),
            )
        });
    }
    out
}

/// The CRDs as installed: IPClaim, then IPLock.
pub fn definitions() -> Vec<serde_json::Value> {
    [
        described(
            without_status(serde_json::to_value(IPClaim::crd()).unwrap_or_default()),
            "One identity's address on a network, in one address family, and the attachment (pod sandbox, interface, node) that holds it. Written by the sticky-macvlan CNI plugin on every node; read it with kubectl get ipclaims, change it only with sticky-macvlan release.",
        ),
        described(
            serde_json::to_value(IPLock::crd()).unwrap_or_default(),
            "The lock on one address of a network: created before the IPClaim that names the address and deleted after it, so no two identities hold one address. Written by the sticky-macvlan CNI plugin; never edit it by hand.",
        ),
    ]
    .into_iter()
    .map(kept_by_helm)
    .collect()
}

/// The CRD marked so that helm never deletes it, neither on `helm
/// uninstall` nor on an upgrade whose chart leaves it out: deleting a CRD
/// deletes every claim of it, and the claims are what keeps an address
/// sticky across a reinstall. kubectl ignores the annotation.
fn kept_by_helm(mut crd: serde_json::Value) -> serde_json::Value {
    crd["metadata"]["annotations"]["helm.sh/resource-policy"] = "keep".into();
    crd
}

/// The CRD with `text` as its schema's description, instead of the one
/// kube-rs generates ("Auto-generated derived type ...").
fn described(mut crd: serde_json::Value, text: &str) -> serde_json::Value {
    if let Some(schema) = crd.pointer_mut("/spec/versions/0/schema/openAPIV3Schema") {
        schema["description"] = serde_json::Value::String(text.into());
    }
    crd
}

/// The IPClaim CRD without the status subresource (see the module doc),
/// so a real API server accepts holder changes in a plain PUT.
fn without_status(mut crd: serde_json::Value) -> serde_json::Value {
    if let Some(versions) = crd
        .pointer_mut("/spec/versions")
        .and_then(|v| v.as_array_mut())
    {
        for v in versions {
            if let Some(obj) = v.as_object_mut() {
                obj.remove("subresources");
            }
        }
    }
    crd
}

fn network_labels(network: &str, ip: std::net::IpAddr) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_NETWORK.to_string(), slug(network));
    labels.insert(
        LABEL_FAMILY.to_string(),
        family_label(Family::of(ip)).to_string(),
    );
    labels
}

/// The object for `lock`; the API server sets its creationTimestamp and
/// managed fields itself (and keeps them on a PUT).
pub fn to_lock(lock: &LockObject) -> IPLock {
    IPLock {
        metadata: ObjectMeta {
            name: Some(lock_name(&lock.network, lock.ip)),
            labels: Some(network_labels(&lock.network, lock.ip)),
            uid: lock.uid.clone(),
            resource_version: lock.resource_version.clone(),
            creation_timestamp: i64::try_from(lock.created)
                .ok()
                .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
                .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
            ..ObjectMeta::default()
        },
        spec: IPLockSpec {
            network: lock.network.clone(),
            ip: lock.ip.to_string(),
            identity: lock.identity.clone(),
            created: lock.created,
            node: lock.node.clone(),
            adoptions: lock.adoptions,
            unconfirmed: lock.unconfirmed.clone(),
        },
    }
}

pub fn from_lock(o: &IPLock) -> Result<LockObject, String> {
    let name = o.metadata.name.clone().unwrap_or_default();
    let ip = o
        .spec
        .ip
        .parse()
        .map_err(|_| {
            format!(
                "IPLock {name}: spec.ip {:?} is not an address: delete the object (kubectl delete iplock {name}); no claim can name it",
                o.spec.ip
            )
        })?;
    Ok(LockObject {
        network: o.spec.network.clone(),
        ip,
        identity: o.spec.identity.clone(),
        // The API server's clock; spec.created is the writer's.
        created: o
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(o.spec.created, unix_secs),
        uid: o.metadata.uid.clone(),
        node: o.spec.node.clone(),
        unconfirmed: o.spec.unconfirmed.clone(),
        resource_version: o.metadata.resource_version.clone(),
        adoptions: o.spec.adoptions,
        written: o
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.time.as_ref().map(unix_secs))
            .max(),
    })
}

pub fn to_object(obj: &ClaimObject) -> IPClaim {
    let c = &obj.claim;
    let mut labels = network_labels(&obj.network, c.ip);
    labels.insert(LABEL_IDENTITY.to_string(), identity_label(&c.identity));
    if let Some(h) = &c.holder {
        labels.insert(
            LABEL_HOLDER.to_string(),
            holder_label(&h.container_id, &h.ifname),
        );
    }
    IPClaim {
        metadata: ObjectMeta {
            name: Some(claim_name(&obj.network, &c.identity, Family::of(c.ip))),
            labels: Some(labels),
            resource_version: obj.resource_version.clone(),
            ..ObjectMeta::default()
        },
        spec: IPClaimSpec {
            network: obj.network.clone(),
            ip: c.ip.to_string(),
            identity: c.identity.clone(),
            sticky: c.sticky,
            owner: c.owner.clone(),
            namespace: c.namespace.clone(),
            created: c.created,
            lock_uid: obj.lock_uid.clone(),
        },
        status: Some(IPClaimStatus {
            phase: phase(c).into(),
            pod: c.holder.as_ref().and_then(Holder::pod),
            node: c.holder_node().map(str::to_string),
            holder: c.holder.clone(),
            updated: c.updated,
            unconfirmed: c.unconfirmed.clone(),
            conditions: conditions(c),
        }),
    }
}

/// Reads an object back; one whose spec cannot be a claim is reported by
/// name rather than guessed at.
pub fn from_object(o: &IPClaim) -> Result<ClaimObject, String> {
    let name = o.metadata.name.clone().unwrap_or_default();
    let ip = o
        .spec
        .ip
        .parse()
        .map_err(|_| format!("IPClaim {name}: spec.ip {:?} is not an address", o.spec.ip))?;
    let status = o.status.as_ref();
    Ok(ClaimObject {
        network: o.spec.network.clone(),
        resource_version: o.metadata.resource_version.clone(),
        lock_uid: o.spec.lock_uid.clone(),
        claim: Claim {
            ip,
            identity: o.spec.identity.clone(),
            sticky: o.spec.sticky,
            holder: status.and_then(|s| s.holder.clone()),
            owner: o.spec.owner.clone(),
            namespace: o.spec.namespace.clone(),
            created: o.spec.created,
            updated: status.map(|s| s.updated).unwrap_or(o.spec.created),
            unconfirmed: status.and_then(|s| s.unconfirmed.clone()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_definition() {
        let obj = ClaimObject {
            network: "macnet".into(),
            resource_version: Some("7".into()),
            lock_uid: Some("lock-uid".into()),
            claim: Claim {
                ip: "fd00::5".parse().unwrap(),
                identity: "bgp/rs0-0".into(),
                sticky: true,
                holder: None,
                owner: Some(Owner {
                    kind: "StatefulSet".into(),
                    namespace: "bgp".into(),
                    name: "rs0".into(),
                    uid: "u".into(),
                    retention: Default::default(),
                }),
                namespace: Some("bgp".into()),
                created: 1,
                updated: 2,
                unconfirmed: None,
            },
        };
        let o = to_object(&obj);
        assert_eq!(o.status.as_ref().unwrap().phase, PHASE_RESERVED);
        assert_eq!(o.metadata.labels.as_ref().unwrap()[LABEL_FAMILY], "v6");
        assert_eq!(from_object(&o).unwrap(), obj);
        let lock = LockObject {
            network: "macnet".into(),
            ip: "fd00::5".parse().unwrap(),
            identity: "bgp/rs0-0".into(),
            created: 3,
            uid: Some("u1".into()),
            node: Some("node1".into()),
            unconfirmed: None,
            resource_version: Some("9".into()),
            adoptions: 1,
            written: None,
        };
        assert_eq!(from_lock(&to_lock(&lock)).unwrap(), lock);
        let crds = definitions();
        assert_eq!(crds[1]["spec"]["names"]["kind"], "IPLock");
        assert_eq!(crds[1]["spec"]["scope"], "Cluster");
        let crd = &crds[0];
        assert_eq!(crd["spec"]["scope"], "Cluster");
        assert_eq!(crd["spec"]["names"]["kind"], "IPClaim");
        assert!(crd["spec"]["versions"][0].get("subresources").is_none());
        let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap();
        let names: Vec<&str> = columns.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "Network",
                "IP",
                "Identity",
                "Pod",
                "Node",
                "State",
                "Age",
                "Sticky",
                "Namespace"
            ]
        );
        for crd in &crds {
            let d = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
                .as_str()
                .unwrap_or_default();
            assert!(!d.is_empty() && !d.contains("Auto-generated"), "{d}");
        }
    }

    #[test]
    fn conditions_say_who_holds_the_address_and_for_whom_it_is_kept() {
        let holder = Holder {
            container_id: "abc".into(),
            ifname: "net1".into(),
            netns: String::new(),
            netns_id: None,
            pod_namespace: Some("db".into()),
            pod_name: Some("db-0".into()),
            pod_uid: Some("u".into()),
            node: "node1".into(),
            boot_id: String::new(),
            since: 5,
        };
        let claim = |sticky: bool, holder: Option<Holder>| Claim {
            ip: "10.0.0.5".parse().unwrap(),
            identity: "db/db-0".into(),
            sticky,
            holder,
            owner: None,
            namespace: None,
            created: 1,
            updated: 1_700_000_000,
            unconfirmed: None,
        };
        let brief = |c: &Claim| -> Vec<(String, String, String)> {
            conditions(c)
                .into_iter()
                .map(|k| (k.type_, k.status, k.reason))
                .collect()
        };
        let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            brief(&claim(true, Some(holder.clone()))),
            [
                s("Held", "True", "AttachmentHolds"),
                s("Reserved", "False", "InUse")
            ]
        );
        assert_eq!(
            brief(&claim(true, None)),
            [
                s("Held", "False", "NoHolder"),
                s("Reserved", "True", "StickyIdentity")
            ]
        );
        assert_eq!(
            brief(&claim(false, Some(holder))),
            [s("Held", "True", "AttachmentHolds")]
        );
        let c = conditions(&claim(false, None));
        assert_eq!(c[0].last_transition_time, "2023-11-14T22:13:20Z");
        assert!(conditions(&claim(true, None))[1]
            .message
            .contains("db/db-0"));
    }
}
