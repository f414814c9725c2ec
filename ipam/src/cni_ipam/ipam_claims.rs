//! The I/O of IPAMClaims on the ADD path (the decisions are
//! `crate::ipamclaim`'s): the claim this attachment's network selection
//! element references and the VMI of its VM are read, the pod is checked
//! against them, and the claim's status is written once the ADD is over.

use cni::{CniArgs, CniError, CniResult};
use serde_json::Value;

use super::StickyIpam;
use crate::claim::now_secs;
use crate::config::{IpamConfig, StoreKind};
use crate::ipamclaim::{self, ClaimFacts, Outcome, NETWORKS_ANNOTATION};
use crate::kube::{ApiError, KubeApi};
use crate::pod::PodFacts;
use crate::store::StoreError;

/// An IPAMClaim the pod was shown to be allowed to use: only then is its
/// status ever written, so a pod that merely names a claim cannot change
/// what the VM's claim says.
#[derive(Debug, Clone)]
pub struct AdmittedClaim {
    pub namespace: String,
    pub facts: ClaimFacts,
    /// The object as last read: its status is rewritten from it.
    object: Value,
}

/// The pod the ADD is for, as far as IPAMClaims care.
pub struct ClaimingPod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// kubelet's `K8S_POD_UID` for this sandbox, else the API's.
    pub uid: &'a str,
    pub facts: &'a PodFacts,
}

fn api_error(e: ApiError) -> CniError {
    StoreError::from(e).into()
}

/// The IPAMClaim this attachment (`ifname` on `network`) is bound to:
/// None when the pod's element references none; a refusal when the claim
/// is missing or the pod may not use it (`ipamclaim::may_use`).
pub fn bind(
    api: &dyn KubeApi,
    network: &str,
    ifname: &str,
    pod: &ClaimingPod<'_>,
) -> CniResult<Option<AdmittedClaim>> {
    let Some(networks) = pod.facts.annotations.get(NETWORKS_ANNOTATION) else {
        return Ok(None);
    };
    let Some(name) = ipamclaim::claim_reference(networks, ifname)
        .map_err(|why| CniError::invalid_config(format!("{why}: fix the pod's networks")))?
    else {
        return Ok(None);
    };
    let who = format!("{}/{}", pod.namespace, pod.name);
    let object = api
        .get_ipam_claim(pod.namespace, &name)
        .map_err(api_error)?
        .ok_or_else(|| ipamclaim::missing(pod.namespace, &name, &who))?;
    let facts = ClaimFacts::parse(&object).map_err(CniError::invalid_config)?;
    let vmi = match &facts.vm {
        Some(vm) => api.get_vmi(pod.namespace, vm).map_err(api_error)?,
        None => None,
    };
    ipamclaim::may_use(&facts, network, vmi.as_ref(), pod.name, pod.uid)?;
    Ok(Some(AdmittedClaim {
        namespace: pod.namespace.to_string(),
        facts,
        object,
    }))
}

/// `allowPersistentIPs` makes the pod's IPAMClaim its identity: only the
/// kubernetes store can read it, and a configured identity for every pod
/// of the network would contradict one per VM.
pub fn refuse_persistent_ips_without_claims(conf: &IpamConfig) -> CniResult<()> {
    let network = &conf.network;
    if !matches!(conf.store, StoreKind::Kubernetes { .. }) {
        return Err(CniError::invalid_config(format!(
            "network {network:?} has \"allowPersistentIPs\": true, but its IPAM uses the file store: IPAMClaims live in the kubernetes API, so set ipam.store.type to \"kubernetes\" (or remove allowPersistentIPs)"
        )));
    }
    if let Some(id) = &conf.identity {
        return Err(CniError::invalid_config(format!(
            "network {network:?} has \"allowPersistentIPs\": true and ipam.identity {id:?}: each VM's IPAMClaim is its identity, so remove ipam.identity"
        )));
    }
    Ok(())
}

impl StickyIpam {
    /// The IPAMClaim the pod's network selection element references, on a
    /// network with `allowPersistentIPs`, read and checked
    /// (`ipam_claims::bind`).
    pub(super) fn ipam_claim(
        &self,
        args: &CniArgs,
        pod: Option<&PodFacts>,
    ) -> CniResult<Option<AdmittedClaim>> {
        let (true, Some(facts), Some(ns), Some(name)) = (
            self.at.persistent_ips,
            pod,
            args.pod_namespace.as_deref(),
            args.pod_name.as_deref(),
        ) else {
            return Ok(None);
        };
        // The annotation read is that of the pod now of this name: a pod
        // re-created under it is not the one this sandbox is for.
        if let Some(uid) = args.pod_uid.as_deref() {
            if !facts.uid.is_empty() && facts.uid != uid {
                return Err(CniError::new(
                    cni::code::TRY_AGAIN_LATER,
                    format!("pod {ns}/{name} in the API (UID {}) is not the pod this sandbox is for (K8S_POD_UID {uid}): it was re-created, so its IPAMClaim reference is not this sandbox's; kubelet retries", facts.uid),
                ));
            }
        }
        let client = self.backend.client().map_err(CniError::from)?;
        let pod = ClaimingPod {
            namespace: ns,
            name,
            uid: args.pod_uid.as_deref().unwrap_or(&facts.uid),
            facts,
        };
        bind(client, &self.conf.network, &self.at.ifname, &pod)
    }

    /// Tells the bound IPAMClaim (if any) what the ADD ended with.
    pub(super) fn write_claim_status(&mut self, outcome: &Outcome) {
        let (Some(bound), Ok(client)) = (self.claim.as_mut(), self.backend.client()) else {
            return;
        };
        let now = cni::log::rfc3339_seconds(now_secs());
        write_status(client, bound, outcome, &now);
    }
}

/// How often a status write that lost a race reads the claim again.
const STATUS_ATTEMPTS: usize = 3;

/// Writes what the ADD ended with into the claim's status (`ips`,
/// `ownerPod`, `IPsAllocated`), unless it says so already (a restart of
/// the same pod writes nothing). Best effort: the address is the ADD's
/// whatever the status says, so a failure is logged, not returned; `now`
/// is RFC 3339.
pub fn write_status(api: &dyn KubeApi, bound: &mut AdmittedClaim, outcome: &Outcome, now: &str) {
    let name = format!("{}/{}", bound.namespace, bound.facts.name);
    let mut last = None;
    for _ in 0..STATUS_ATTEMPTS {
        let generation = bound.object["metadata"]["generation"].as_i64().unwrap_or(0);
        let next = ipamclaim::status(&bound.object["status"], outcome, generation, now);
        if next == bound.object["status"] {
            return;
        }
        let mut object = bound.object.clone();
        object["status"] = next;
        match api.replace_ipam_claim_status(&bound.namespace, &object) {
            Ok(()) => {
                bound.object = object;
                return;
            }
            Err(ApiError::Conflict(why)) => {
                last = Some(why);
                match api.get_ipam_claim(&bound.namespace, &bound.facts.name) {
                    // Another claim of the same name: this pod was
                    // admitted against the old one, not this.
                    Ok(Some(fresh))
                        if fresh["metadata"]["uid"] != bound.object["metadata"]["uid"] =>
                    {
                        last = Some("it was deleted and re-created".into());
                        break;
                    }
                    Ok(Some(fresh)) => bound.object = fresh,
                    Ok(None) => {
                        last = Some("it was deleted".into());
                        break;
                    }
                    Err(e) => {
                        last = Some(e.to_string());
                        break;
                    }
                }
            }
            Err(e) => {
                last = Some(e.to_string());
                break;
            }
        }
    }
    cni::log::warn(&format!(
        "the status of IPAMClaim {name} was not written ({}): it may not show this ADD's outcome until the next one",
        last.unwrap_or_default()
    ));
}

#[cfg(test)]
#[path = "ipam_claims_tests.rs"]
mod tests;
