//! IPAMClaims as an identity (issue 30): the network plumbing working
//! group's `IPAMClaim` (`ipamclaims.k8s.cni.cncf.io/v1alpha1`, the
//! `github.com/k8snetworkplumbingwg/ipamclaims` module, v0.5.x-alpha),
//! named from a pod's network selection element as
//! `"ipam-claim-reference"`, and created for a KubeVirt VM's networks by
//! kubevirt/ipam-extensions when the NAD's config has
//! `"allowPersistentIPs": true`.
//!
//! Only the decisions live here, free of I/O: which element of the pod's
//! `k8s.v1.cni.cncf.io/networks` annotation is this attachment's, the
//! identity a claim gives, whether the pod may use the claim (the one
//! active pod of the VMI of the VM that owns it), when its address is
//! retired, and the status the standard asks for. Multus (v4.3.0) does
//! not pass the reference on to a delegate, so the IPAM reads it from the
//! pod it already GETs.
//!
//! ADD reads the claim and the VMI (`cni_ipam::ipam_claims`), reconcile frees the
//! address once the claim is gone (`retired`); see ARCHITECTURE.md,
//! "IPAMClaims".

use std::collections::BTreeSet;

use cni::{code, CniError, Refusal};
use serde_json::{json, Value};

use crate::claim::{Owner, Retention, RetentionPolicy};

/// The API group and version of `IPAMClaim` (ipamclaims v0.5.1-alpha,
/// `pkg/crd/ipamclaims/v1alpha1`).
pub const GROUP: &str = "k8s.cni.cncf.io";
pub const VERSION: &str = "v1alpha1";
pub const PLURAL: &str = "ipamclaims";
pub const KIND: &str = "IPAMClaim";
/// KubeVirt's VirtualMachineInstance (kubevirt.io/api v1.4.0, `core/v1`).
pub const VMI_GROUP: &str = "kubevirt.io";
pub const VMI_VERSION: &str = "v1";
pub const VMI_PLURAL: &str = "virtualmachineinstances";
pub const VMI_KIND: &str = "VirtualMachineInstance";
/// The `Owner::kind` of an IPAMClaim identity's claims: the address lives
/// as long as the IPAMClaim object of that UID.
pub const OWNER_KIND: &str = "IPAMClaim.k8s.cni.cncf.io";

/// The pod annotation Multus reads the additional networks from.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// The network selection element's key naming an IPAMClaim
/// (network-attachment-definition-client >= v1.6.0, `IPAMClaimReference`).
pub const CLAIM_REFERENCE_KEY: &str = "ipam-claim-reference";
/// The condition the standard's status carries (the literal OVN-Kubernetes
/// writes; the ipamclaims module defines no constant for it).
pub const IPS_ALLOCATED: &str = "IPsAllocated";

/// The reasons of `IPsAllocated`: the first four are OVN-Kubernetes'
/// (pkg/allocator/ip, the only implementation released), the last two ours
/// for refusals the standard has no word for.
pub mod reason {
    pub const SUCCESSFUL_ALLOCATION: &str = "SuccessfulAllocation";
    pub const SUBNET_EXHAUSTED: &str = "SubnetExhausted";
    pub const IP_ADDRESS_CONFLICT: &str = "IPAddressConflict";
    pub const INTERNAL_ERROR: &str = "InternalError";
    pub const HOLDER_MAY_BE_ALIVE: &str = "HolderMayBeAlive";
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
}

/// The identity an IPAMClaim gives: namespaced by construction, and of a
/// form no raw identity (cni-args, the NAD, an annotation) can take, since
/// the tenancy rule gives a raw `A/B` to namespace `A` and no namespace
/// contains ':'.
pub fn identity_key(namespace: &str, claim: &str) -> String {
    format!("ipamclaim:{namespace}/{claim}")
}

/// The owner recorded on the claims of `claim`'s identity: reconcile frees
/// them once that IPAMClaim (that UID) is gone, whatever happened to pods.
pub fn owner(namespace: &str, claim: &ClaimFacts) -> Owner {
    Owner {
        kind: OWNER_KIND.to_string(),
        namespace: namespace.to_string(),
        name: claim.name.clone(),
        uid: claim.uid.clone(),
        retention: Retention {
            when_scaled: RetentionPolicy::Retain,
            when_deleted: RetentionPolicy::Delete,
        },
    }
}

/// What the API said of the IPAMClaim an `Owner` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState<'a> {
    Present {
        uid: &'a str,
    },
    Missing,
    /// The API did not answer, or refused: nothing is freed on a guess.
    Unknown,
}

/// Why the address of an IPAMClaim identity may go back to the pool: its
/// IPAMClaim was deleted, or deleted and re-created (a new UID: another VM
/// of the same name; if its launcher's ADD comes first, it takes the
/// identity's address over, once the old holder is dead, and records the
/// new UID). None while the claim exists, even while it is being deleted:
/// ipam-extensions' finalizer holds it until the VM is gone, and the
/// address is kept that long.
pub fn retired(owner: &Owner, state: ClaimState<'_>) -> Option<String> {
    if owner.kind != OWNER_KIND {
        return None;
    }
    let what = format!("IPAMClaim {}/{}", owner.namespace, owner.name);
    match state {
        ClaimState::Unknown => None,
        ClaimState::Missing => Some(format!("its {what} was deleted")),
        ClaimState::Present { uid } if !owner.uid.is_empty() && uid != owner.uid => {
            Some(format!("its {what} was deleted and re-created"))
        }
        ClaimState::Present { .. } => None,
    }
}

/// The refusal for a reference to an IPAMClaim the API does not have:
/// ipam-extensions creates it with the VM, so kubelet's retry may find it.
pub fn missing(namespace: &str, name: &str, pod: &str) -> CniError {
    CniError::new(
        code::TRY_AGAIN_LATER,
        format!("pod {pod:?} references IPAMClaim {namespace}/{name} ({CLAIM_REFERENCE_KEY}), which does not exist: kubelet retries; if it stays missing, check that kubevirt/ipam-extensions runs and that the NAD has \"allowPersistentIPs\": true"),
    )
}

/// The IPAMClaim this attachment's element of the pod's networks
/// annotation references, if any. The element is the one whose
/// `interface` is `ifname`, or, without one, whose position gives Multus'
/// default name (`net1` for the first element; the cluster network is
/// `net0`'s place). The comma-separated short form cannot carry a
/// reference. `Err` says what is wrong with the annotation.
pub fn claim_reference(networks: &str, ifname: &str) -> Result<Option<String>, String> {
    let text = networks.trim();
    if !text.starts_with('[') {
        return Ok(None);
    }
    let elements: Vec<Value> = serde_json::from_str(text).map_err(|e| {
        format!("pod annotation {NETWORKS_ANNOTATION} is not a JSON list of network selection elements: {e}")
    })?;
    let mine = elements.iter().enumerate().find(|(i, el)| {
        let named = el.get("interface").and_then(Value::as_str);
        named.map_or_else(|| format!("net{}", i + 1) == ifname, |n| n == ifname)
    });
    let Some((_, element)) = mine else {
        return Ok(None);
    };
    match element.get(CLAIM_REFERENCE_KEY) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if is_object_name(name) => Ok(Some(name.clone())),
        Some(other) => Err(format!(
            "the {ifname} element of pod annotation {NETWORKS_ANNOTATION} has {CLAIM_REFERENCE_KEY} {other}, which is not an IPAMClaim's name (a DNS subdomain: lower-case letters, digits, '-' and '.', at most 253)"
        )),
    }
}

/// A Kubernetes object name (RFC 1123 subdomain).
fn is_object_name(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(crate::config::is_dns_label)
}

/// What the IPAM needs of an IPAMClaim object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFacts {
    pub name: String,
    pub uid: String,
    /// `spec.network`: the NAD config's `name`.
    pub network: String,
    pub deleting: bool,
    /// The KubeVirt object the claim belongs to, from its controller owner
    /// reference: the VM's name, which is its VMI's.
    pub vm: Option<String>,
}

impl ClaimFacts {
    pub fn parse(obj: &Value) -> Result<ClaimFacts, String> {
        let meta = &obj["metadata"];
        let name = meta["name"].as_str().unwrap_or_default().to_string();
        let network = obj["spec"]["network"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("IPAMClaim {name:?} has no spec.network"))?
            .to_string();
        let vm = meta["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["controller"].as_bool() == Some(true))
            .find(|r| {
                let group = r["apiVersion"].as_str().and_then(|v| v.split_once('/'));
                let kind = r["kind"].as_str().unwrap_or_default();
                group.is_some_and(|(g, _)| g == "kubevirt.io")
                    && matches!(kind, "VirtualMachine" | "VirtualMachineInstance")
            })
            .and_then(|r| r["name"].as_str())
            .map(str::to_string);
        Ok(ClaimFacts {
            uid: meta["uid"].as_str().unwrap_or_default().to_string(),
            deleting: !meta["deletionTimestamp"].is_null(),
            name,
            network,
            vm,
        })
    }
}

/// What the IPAM needs of a VirtualMachineInstance: the pods
/// virt-controller counts as the VMI's (`status.activePods`, pod UID to
/// node).
///
/// virt-controller counts every pod of the namespace whose controller
/// owner reference is the VMI (kubevirt v1.4.0, `setActivePods`), and a
/// pod author can write that reference; and it names a migration's target
/// pod (`status.migrationState.targetPod`) only at the hand-off, after
/// that pod is Ready, so after its CNI ADD. So a pod is taken for the
/// launcher only while it is the one active pod: a pod posing as the VM's
/// while its launcher runs is refused, and so is a migration target, whose
/// sharing is not built. The namespace stays the boundary no pod author
/// can cross (the claim is read from the pod's own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmiFacts {
    pub name: String,
    pub active_pods: BTreeSet<String>,
}

impl VmiFacts {
    pub fn parse(obj: &Value) -> VmiFacts {
        VmiFacts {
            name: obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            active_pods: obj["status"]["activePods"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

/// Whether the pod (`pod_uid`, named `pod` in the claim's namespace) may use IPAMClaim `claim` on
/// network `network`: the claim must be for this network, not being
/// deleted, owned by a KubeVirt VM, and the pod one of that VM's VMI's
/// active pods. `vmi` is the VMI of the claim's owner, `None` if the API
/// has none. Every refusal is worth a retry by kubelet except a claim of
/// another network or one with no VM, which need the operator.
pub fn may_use(
    claim: &ClaimFacts,
    network: &str,
    vmi: Option<&VmiFacts>,
    pod: &str,
    pod_uid: &str,
) -> Result<(), CniError> {
    let name = &claim.name;
    if claim.network != network {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!(
                "IPAMClaim {name:?} is for network {:?}, but pod {pod:?} references it on network {network:?}: fix the pod's {CLAIM_REFERENCE_KEY} or the claim's spec.network",
                claim.network
            ),
        ));
    }
    if claim.deleting {
        return Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("IPAMClaim {name:?} is being deleted, and its address with it: pod {pod:?} cannot take it (its VM is going away)"),
        ));
    }
    let Some(vm) = &claim.vm else {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!("IPAMClaim {name:?} has no KubeVirt VM as its controller owner: only a VM's launcher pods may use a claim, and pod {pod:?} cannot be shown to be one"),
        ));
    };
    let Some(vmi) = vmi else {
        return Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("IPAMClaim {name:?} belongs to VM {vm:?}, which has no VirtualMachineInstance now: pod {pod:?} is not its launcher"),
        ));
    };
    if !vmi.active_pods.contains(pod_uid) {
        return Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("pod {pod:?} is not (or not yet) one of VirtualMachineInstance {vm:?}'s active pods (its status.activePods, written by virt-controller), so it may not use IPAMClaim {name:?}: only that VM's launcher pods may"),
        ));
    }
    let others = vmi.active_pods.len() - 1;
    if others > 0 {
        return Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("VirtualMachineInstance {vm:?} has {others} active pod(s) besides pod {pod:?} (a live migration's other pod, a pod of KubeVirt's that has not gone yet, or a pod that names the VMI as its controller), so pod {pod:?} is not taken for the launcher that may use IPAMClaim {name:?}: sharing a VM's address during a live migration is not supported yet; kubelet retries once the VMI has one active pod"),
        ));
    }
    Ok(())
}

/// The `IPsAllocated` reason for a failed ADD.
pub fn failure_reason(e: &CniError) -> &'static str {
    match e.refusal {
        Some(Refusal::PoolExhausted) => reason::SUBNET_EXHAUSTED,
        Some(Refusal::AnsweredOnWire | Refusal::AddressReserved) => reason::IP_ADDRESS_CONFLICT,
        Some(Refusal::HolderAlive) => reason::HOLDER_MAY_BE_ALIVE,
        Some(Refusal::NamespaceNotAllowed) => reason::NAMESPACE_NOT_ALLOWED,
        None => reason::INTERNAL_ERROR,
    }
}

/// What an ADD ended with, for the claim's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The addresses, in CIDR notation, and the pod that has them.
    Allocated { ips: Vec<String>, pod: String },
    Failed {
        reason: &'static str,
        message: String,
    },
}

/// The status to write for `outcome` over the claim's `current` status: a
/// success sets `ips` and `ownerPod`; a failure keeps them and only turns
/// the condition False. `lastTransitionTime` moves only when the
/// condition's status changes (metav1.Condition's rule).
pub fn status(current: &Value, outcome: &Outcome, generation: i64, now: &str) -> Value {
    let mut status = match current {
        Value::Object(_) => current.clone(),
        _ => json!({}),
    };
    let (cond_status, why, message) = match outcome {
        Outcome::Allocated { ips, pod } => {
            status["ips"] = json!(ips);
            status["ownerPod"] = json!({ "name": pod });
            (
                "True",
                reason::SUCCESSFUL_ALLOCATION,
                format!("{} allocated to pod {pod}", ips.join(", ")),
            )
        }
        Outcome::Failed { reason, message } => ("False", *reason, message.clone()),
    };
    let mut conditions: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    let old = conditions
        .iter()
        .position(|c| c["type"] == IPS_ALLOCATED)
        .map(|i| conditions.remove(i));
    let since = old
        .as_ref()
        .filter(|c| c["status"] == cond_status)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or(now)
        .to_string();
    conditions.push(json!({
        "type": IPS_ALLOCATED,
        "status": cond_status,
        "reason": why,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }));
    status["conditions"] = Value::Array(conditions);
    status
}

#[cfg(test)]
#[path = "ipamclaim_tests.rs"]
mod tests;
