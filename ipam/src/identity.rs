//! Which workload an ADD is for (README, "Identity"). The first source
//! that applies wins: `args.cni.identity`, `ipam.identity`, the pod's
//! identity annotation, a StatefulSet owner (both need the pod from the
//! API), the pod-name policy, else a dynamic key from the container and
//! interface.

use cni::{CniArgs, CniError, CniResult};
use serde_json::{Map, Value};

use crate::claim::{validate_identity, Owner};
use crate::config::{IdentityPolicy, IpamConfig};
use crate::pod::{PodFacts, IDENTITY_ANNOTATION};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentitySource {
    ArgsCni,
    Config,
    PodName,
    Annotation,
    StatefulSet,
    Container,
}

impl IdentitySource {
    pub fn as_str(self) -> &'static str {
        match self {
            IdentitySource::ArgsCni => "args.cni.identity",
            IdentitySource::Config => "ipam.identity",
            IdentitySource::PodName => "pod name (identityPolicy podName)",
            IdentitySource::Annotation => "pod annotation sticky-macvlan.io/identity",
            IdentitySource::StatefulSet => "StatefulSet pod name",
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

/// Whether `key` names one attachment (a dynamic identity): only the ADDs
/// of that container, on its node, ever claim for it, so no other node's
/// claim needs looking for. A configured identity of the same shape is
/// still safe: the kubernetes store's claim create is the check.
pub fn is_attachment_scoped(key: &str) -> bool {
    key.starts_with(DYNAMIC_PREFIX)
}

pub fn resolve(
    conf: &IpamConfig,
    args_cni: &Map<String, Value>,
    args: &CniArgs,
    container_id: &str,
    ifname: &str,
    pod: Option<&PodFacts>,
) -> CniResult<Identity> {
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
    if let Some((set_name, set_uid)) = pod.and_then(|p| p.stateful_set.as_ref()) {
        if let Some(key) = pod_key()? {
            return Ok(Identity {
                key,
                sticky: true,
                source: IdentitySource::StatefulSet,
                owner: Some(Owner {
                    kind: "StatefulSet".into(),
                    namespace: args.pod_namespace.clone().unwrap_or_default(),
                    name: set_name.clone(),
                    uid: set_uid.clone(),
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
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(extra: Value) -> IpamConfig {
        let mut v = json!({"subnet": "10.0.0.0/24"});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        IpamConfig::parse("n", &v).unwrap()
    }

    fn args_cni(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn k8s() -> CniArgs {
        CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAMESPACE=bgp;K8S_POD_NAME=rs0-0;K8S_POD_UID=u1")
            .unwrap()
    }

    #[test]
    fn precedence_table() {
        struct Case {
            conf: Value,
            args_cni: Value,
            args: CniArgs,
            pod: Option<PodFacts>,
            want: (&'static str, bool, IdentitySource),
        }
        let stateful = PodFacts {
            uid: "u1".into(),
            stateful_set: Some(("rs0".into(), "ss-uid".into())),
            ..PodFacts::default()
        };
        let annotated = PodFacts {
            identity_annotation: Some("peer-b".into()),
            ..stateful.clone()
        };
        let cases = [
            Case {
                conf: json!({"identity": "fixed", "identityPolicy": "podName"}),
                args_cni: json!({"identity": "peer-a"}),
                args: k8s(),
                pod: None,
                want: ("peer-a", true, IdentitySource::ArgsCni),
            },
            Case {
                conf: json!({"identity": "fixed", "identityPolicy": "podName"}),
                args_cni: json!({}),
                args: k8s(),
                pod: None,
                want: ("fixed", true, IdentitySource::Config),
            },
            Case {
                conf: json!({"identityPolicy": "podName"}),
                args_cni: json!({"identity": null}),
                args: k8s(),
                pod: None,
                want: ("bgp/rs0-0", true, IdentitySource::PodName),
            },
            Case {
                conf: json!({"identity": "fixed"}),
                args_cni: json!({}),
                args: k8s(),
                pod: Some(annotated.clone()),
                want: ("fixed", true, IdentitySource::Config),
            },
            Case {
                conf: json!({"identityPolicy": "podName"}),
                args_cni: json!({}),
                args: k8s(),
                pod: Some(annotated),
                want: ("peer-b", true, IdentitySource::Annotation),
            },
            Case {
                conf: json!({}),
                args_cni: json!({}),
                args: k8s(),
                pod: Some(stateful.clone()),
                want: ("bgp/rs0-0", true, IdentitySource::StatefulSet),
            },
            Case {
                conf: json!({}),
                args_cni: json!({}),
                args: CniArgs::default(),
                pod: Some(stateful),
                want: ("container:c1/net1", false, IdentitySource::Container),
            },
            Case {
                conf: json!({}),
                args_cni: json!({}),
                args: k8s(),
                pod: Some(PodFacts::default()),
                want: ("container:c1/net1", false, IdentitySource::Container),
            },
            Case {
                conf: json!({}),
                args_cni: json!({}),
                args: k8s(),
                pod: None,
                want: ("container:c1/net1", false, IdentitySource::Container),
            },
        ];
        for c in cases {
            let id = resolve(
                &conf(c.conf),
                &args_cni(c.args_cni),
                &c.args,
                "c1",
                "net1",
                c.pod.as_ref(),
            )
            .unwrap();
            assert_eq!((id.key.as_str(), id.sticky, id.source), c.want);
            assert_eq!(id.owner.is_some(), c.want.2 == IdentitySource::StatefulSet);
        }
    }

    #[test]
    fn untrusted_identities_are_bounded() {
        let c = conf(json!({}));
        let long = "x".repeat(10_000);
        for (bad, want) in [
            (json!({"identity": ""}), "is empty"),
            (json!({"identity": long}), "at most 320 bytes"),
            (json!({"identity": "a\u{0}b"}), "control character"),
            (json!({"identity": "a\nb"}), "control character"),
            (json!({"identity": 5}), "must be a string"),
        ] {
            let e = resolve(&c, &args_cni(bad), &CniArgs::default(), "c", "i", None).unwrap_err();
            assert_eq!(e.code, cni::code::INVALID_CONFIG);
            assert!(
                e.msg.contains("args.cni.identity") && e.msg.contains(want),
                "{}",
                e.msg
            );
        }
        // Path-like and unicode identities are fine: they are hashed, never used as paths.
        for ok in ["../../etc/passwd", "bgp/peer-a", "ピア-1", "/"] {
            let id = resolve(
                &c,
                &args_cni(json!({"identity": ok})),
                &CniArgs::default(),
                "c",
                "i",
                None,
            )
            .unwrap();
            assert_eq!(id.key, ok);
        }
    }

    #[test]
    fn pod_name_policy_needs_the_pod_args() {
        let e = resolve(
            &conf(json!({"identityPolicy": "podName"})),
            &Map::new(),
            &CniArgs::default(),
            "c",
            "i",
            None,
        )
        .unwrap_err();
        assert_eq!(e.code, cni::code::INVALID_ENV);
        assert!(e.msg.contains("K8S_POD_NAME"));
    }
}
