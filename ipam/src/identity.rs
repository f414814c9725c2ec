//! Which workload an ADD is for (docs/src/concepts/identity.md). The first source
//! that applies wins: `args.cni.identity`, `ipam.identity`, the pod's
//! identity annotation, a StatefulSet owner (both need the pod from the
//! API), the pod-name policy, else a dynamic key from the container and
//! interface.

use cni::{CniArgs, CniError, CniResult};
use serde_json::{Map, Value};

use crate::claim::{validate_identity, Owner};
use crate::config::{IdentityFrom, IdentityPolicy, IpamConfig};
use crate::pod::{PodFacts, IDENTITY_ANNOTATION};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentitySource {
    ArgsCni,
    Config,
    PodName,
    Annotation,
    /// The pod label or annotation `ipam.identityFrom` names.
    PodKey,
    StatefulSet,
    /// The IPAMClaim the pod's network selection element references.
    IpamClaim,
    Container,
}

impl IdentitySource {
    pub fn as_str(self) -> &'static str {
        match self {
            IdentitySource::ArgsCni => "args.cni.identity",
            IdentitySource::Config => "ipam.identity",
            IdentitySource::PodName => "pod name (identityPolicy podName)",
            IdentitySource::Annotation => "pod annotation sticky-macvlan.io/identity",
            IdentitySource::PodKey => "pod label or annotation of ipam.identityFrom",
            IdentitySource::StatefulSet => "StatefulSet pod name",
            IdentitySource::IpamClaim => "IPAMClaim (ipam-claim-reference)",
            IdentitySource::Container => "container ID and ifname (dynamic)",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub key: String,
    pub sticky: bool,
    pub source: IdentitySource,
    /// The StatefulSet a StatefulSet pod's identity belongs to.
    pub owner: Option<Owner>,
}

const DYNAMIC_PREFIX: &str = "container:";

pub fn dynamic_key(container_id: &str, ifname: &str) -> String {
    format!("{DYNAMIC_PREFIX}{container_id}/{ifname}")
}

/// The identity of the tombstone an identity leaves on an address it moves
/// away from while that address is unconfirmed (its holder only judged
/// dead): the identity's own name goes with it to its new address, and the
/// old one must still be probed before it is bound again. No pod claims
/// it; an exhausted pool reclaims it like any tombstone.
pub fn displaced_key(key: &str, ip: std::net::IpAddr) -> String {
    format!("moved:{key}@{ip}")
}

/// Whether `key` names one attachment (a dynamic identity): only the ADDs
/// of that container, on its node, ever claim for it, so no other node's
/// claim needs looking for. A configured identity of the same shape is
/// still safe: the kubernetes store's claim create is the check.
pub fn is_attachment_scoped(key: &str) -> bool {
    key.starts_with(DYNAMIC_PREFIX)
}

/// The `args.cni` keys sticky-ipam reads.
pub const ARGS_CNI_KEYS: [&str; 2] = ["identity", "ips"];

/// `args.cni` is shared with every plugin of a chain, so a key that is not
/// ours is theirs; but one a typo away from ours (`identiy`) would cost the
/// pod its sticky identity without a word: refused, naming the key meant.
/// Keys shorter than 4 characters are left alone (`ip` is another
/// plugin's, not a typo of `ips`).
pub fn refuse_misspelt_args_cni(args_cni: &Map<String, Value>) -> CniResult<()> {
    for key in args_cni.keys().filter(|k| k.chars().count() >= 4) {
        if let Some(meant) = cni::keys::closest(key, &ARGS_CNI_KEYS).filter(|m| m != key) {
            return Err(CniError::new(
                cni::code::UNSUPPORTED_FIELD,
                format!(
                    "args.cni key {key:?} is not one sticky-ipam reads: did you mean {meant:?}? (the pod's \"cni-args\" in its network selection; as written, the pod would not get what {meant:?} asks for)"
                ),
            ));
        }
    }
    Ok(())
}

/// The identity of IPAMClaim `claim` in `namespace`, which the pod's
/// network selection element references and the pod was shown to be
/// allowed to use (`ipamclaim::may_use`). It outranks every other source,
/// but a `cni-args` identity in the same element contradicts it.
pub fn for_ipam_claim(
    args_cni: &Map<String, Value>,
    namespace: &str,
    claim: &crate::ipamclaim::ClaimFacts,
) -> CniResult<Identity> {
    refuse_misspelt_args_cni(args_cni)?;
    if let Some(named) = args_cni.get("identity").filter(|v| !v.is_null()) {
        return Err(CniError::invalid_config(format!(
            "the pod's network selection element names IPAMClaim {namespace}/{} ({}) and also identity {named} in its cni-args: remove one of the two",
            claim.name,
            crate::ipamclaim::CLAIM_REFERENCE_KEY
        )));
    }
    let key = crate::ipamclaim::identity_key(namespace, &claim.name);
    validate_identity(&key).map_err(|why| {
        CniError::invalid_config(format!(
            "the identity of IPAMClaim {namespace}/{} {why}",
            claim.name
        ))
    })?;
    Ok(Identity {
        key,
        sticky: true,
        source: IdentitySource::IpamClaim,
        owner: Some(crate::ipamclaim::owner(namespace, claim)),
    })
}

pub fn resolve(
    conf: &IpamConfig,
    args_cni: &Map<String, Value>,
    args: &CniArgs,
    container_id: &str,
    ifname: &str,
    pod: Option<&PodFacts>,
) -> CniResult<Identity> {
    refuse_misspelt_args_cni(args_cni)?;
    match args_cni.get("identity") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) => {
            validate_identity(id)
                .map_err(|why| CniError::invalid_config(format!("args.cni.identity {why}")))?;
            return Ok(Identity {
                key: id.clone(),
                sticky: true,
                source: IdentitySource::ArgsCni,
                owner: None,
            });
        }
        Some(other) => {
            return Err(CniError::invalid_config(format!(
                "args.cni.identity must be a string, not {other}"
            )))
        }
    }
    if let Some(id) = &conf.identity {
        return Ok(Identity {
            key: id.clone(),
            sticky: true,
            source: IdentitySource::Config,
            owner: None,
        });
    }
    if let Some(id) = pod.and_then(|p| p.identity_annotation.as_ref()) {
        validate_identity(id).map_err(|why| {
            CniError::invalid_config(format!(
                "pod annotation {IDENTITY_ANNOTATION} {why}: fix the pod template"
            ))
        })?;
        return Ok(Identity {
            key: id.clone(),
            sticky: true,
            source: IdentitySource::Annotation,
            owner: None,
        });
    }
    let pod_key = || -> CniResult<Option<String>> {
        let (Some(ns), Some(name)) = (args.pod_namespace.as_deref(), args.pod_name.as_deref())
        else {
            return Ok(None);
        };
        let key = format!("{ns}/{name}");
        validate_identity(&key).map_err(|why| {
            CniError::invalid_env(format!(
                "pod identity from K8S_POD_NAMESPACE/K8S_POD_NAME {why}"
            ))
        })?;
        Ok(Some(key))
    };
    if let (Some(from), Some(pod), Some(ns)) = (&conf.identity_from, pod, &args.pod_namespace) {
        let (what, key, value) = match from {
            IdentityFrom::Label(k) => ("label", k, pod.labels.get(k)),
            IdentityFrom::Annotation(k) => ("annotation", k, pod.annotations.get(k)),
        };
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            // Namespaced: a pod can only ever name an identity of its own
            // namespace this way, whatever label it is given.
            let id = format!("{ns}/{value}");
            validate_identity(&id).map_err(|why| {
                CniError::invalid_config(format!(
                    "pod {what} {key} (ipam.identityFrom) gives identity {why}: fix the pod template"
                ))
            })?;
            return Ok(Identity {
                key: id,
                sticky: true,
                source: IdentitySource::PodKey,
                owner: None,
            });
        }
    }
    if let Some(owner) = pod.and_then(|p| p.stateful_set.as_ref()) {
        if let Some(key) = pod_key()? {
            return Ok(Identity {
                key,
                sticky: true,
                source: IdentitySource::StatefulSet,
                owner: Some(Owner {
                    kind: owner.kind.into(),
                    namespace: args.pod_namespace.clone().unwrap_or_default(),
                    name: owner.name.clone(),
                    uid: owner.uid.clone(),
                    retention: conf.retention,
                }),
            });
        }
    }
    if conf.policy == IdentityPolicy::PodName {
        let Some(key) = pod_key()? else {
            return Err(CniError::invalid_env(
                "identityPolicy podName needs K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS (kubelet and Multus send them): run the plugin under Kubernetes or set args.cni.identity",
            ));
        };
        return Ok(Identity {
            key,
            sticky: true,
            source: IdentitySource::PodName,
            owner: None,
        });
    }
    Ok(Identity {
        key: dynamic_key(container_id, ifname),
        sticky: false,
        source: IdentitySource::Container,
        owner: None,
    })
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
