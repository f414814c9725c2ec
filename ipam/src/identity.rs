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
mod tests {

    #[test]
    fn a_misspelt_args_cni_key_is_refused_naming_the_key_meant() {
        // (args.cni, refused with this key meant)
        let cases: Vec<(serde_json::Value, Option<&str>)> = vec![
            (serde_json::json!({"identiy": "peer-a"}), Some("identity")),
            (serde_json::json!({"Identity": "peer-a"}), Some("identity")),
            (serde_json::json!({"idnetity": "peer-a"}), Some("identity")),
            (serde_json::json!({"ipss": ["10.0.0.5"]}), Some("ips")),
            // Ours, another plugin's, or too short to call a typo.
            (serde_json::json!({"identity": "peer-a", "ips": []}), None),
            (
                serde_json::json!({"ip": "10.0.0.5", "mac": "x", "vlan": 5}),
                None,
            ),
            (serde_json::json!({"bandwidth": {}}), None),
        ];
        for (args, meant) in cases {
            let got = refuse_misspelt_args_cni(args.as_object().unwrap());
            match meant {
                None => assert!(got.is_ok(), "{args}: {got:?}"),
                Some(k) => {
                    let e = got.unwrap_err();
                    assert_eq!(e.code, cni::code::UNSUPPORTED_FIELD);
                    assert!(e.msg.contains(&format!("did you mean {k:?}")), "{}", e.msg);
                }
            }
        }
    }
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
            stateful_set: Some(crate::pod::StableOwner {
                kind: crate::pod::STATEFUL_SET,
                name: "rs0".into(),
                uid: "ss-uid".into(),
            }),
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

    /// `identityFrom` and other controllers than StatefulSet.
    #[test]
    fn identities_from_a_configured_key_and_other_ordinal_controllers() {
        let kube = json!({"store": {"type": "kubernetes", "kubeconfig": "/k"}});
        let with = |k: &str, v: Value| {
            let mut c = kube.clone();
            c[k] = v;
            c
        };
        let labelled = PodFacts {
            uid: "u1".into(),
            labels: [("example.com/ordinal".to_string(), "peer-3".to_string())].into(),
            annotations: [("example.com/slot".to_string(), "slot-1".to_string())].into(),
            ..PodFacts::default()
        };
        let kruise = PodFacts {
            stateful_set: Some(crate::pod::StableOwner {
                kind: crate::pod::ADVANCED_STATEFUL_SET,
                name: "rs0".into(),
                uid: "asts-uid".into(),
            }),
            ..labelled.clone()
        };
        // (ipam, pod, identity, source, owner kind)
        let cases: Vec<(Value, PodFacts, &str, IdentitySource, Option<&str>)> = vec![
            // The label's value, in the pod's own namespace.
            (
                with("identityFrom", json!({"label": "example.com/ordinal"})),
                labelled.clone(),
                "bgp/peer-3",
                IdentitySource::PodKey,
                None,
            ),
            (
                with("identityFrom", json!({"annotation": "example.com/slot"})),
                labelled.clone(),
                "bgp/slot-1",
                IdentitySource::PodKey,
                None,
            ),
            // A pod without the key falls through to the next source.
            (
                with("identityFrom", json!({"label": "example.com/absent"})),
                labelled.clone(),
                "container:c1/net1",
                IdentitySource::Container,
                None,
            ),
            (
                with("identityFrom", json!({"label": "example.com/absent"})),
                kruise.clone(),
                "bgp/rs0-0",
                IdentitySource::StatefulSet,
                Some(crate::pod::ADVANCED_STATEFUL_SET),
            ),
            // The configured key wins over the owner.
            (
                with("identityFrom", json!({"label": "example.com/ordinal"})),
                kruise.clone(),
                "bgp/peer-3",
                IdentitySource::PodKey,
                None,
            ),
            // An Advanced StatefulSet's pod is sticky by its name.
            (
                kube.clone(),
                kruise,
                "bgp/rs0-0",
                IdentitySource::StatefulSet,
                Some(crate::pod::ADVANCED_STATEFUL_SET),
            ),
        ];
        for (ipam, pod, key, source, owner) in cases {
            let id = resolve(
                &conf(ipam.clone()),
                &Map::new(),
                &k8s(),
                "c1",
                "net1",
                Some(&pod),
            )
            .unwrap_or_else(|e| panic!("{ipam}: {}", e.msg));
            assert_eq!((id.key.as_str(), id.source), (key, source), "{ipam}");
            assert_eq!(id.owner.as_ref().map(|o| o.kind.as_str()), owner, "{ipam}");
        }
        // Bad configs: not one key, an unknown kind, the file store.
        for (ipam, want) in [
            (with("identityFrom", json!({})), "takes one non-empty key"),
            (
                with("identityFrom", json!({"label": "a", "annotation": "b"})),
                "takes one non-empty key",
            ),
            (
                with("identityFrom", json!({"label": ""})),
                "takes one non-empty key",
            ),
            (
                with("identityFrom", json!({"field": "x"})),
                "identityFrom.field is unknown",
            ),
            (json!({"identityFrom": {"label": "x"}}), "needs \"store\""),
        ] {
            let mut v = json!({"subnet": "10.0.0.0/24"});
            v.as_object_mut()
                .unwrap()
                .extend(ipam.as_object().unwrap().clone());
            let e = IpamConfig::parse("n", &v).unwrap_err();
            assert!(e.msg.contains(want), "{ipam}: {}", e.msg);
        }
        // A value that is no identity is named.
        let mut bad = labelled;
        bad.labels
            .insert("example.com/ordinal".into(), "a\u{0}b".into());
        let e = resolve(
            &conf(with(
                "identityFrom",
                json!({"label": "example.com/ordinal"}),
            )),
            &Map::new(),
            &k8s(),
            "c1",
            "net1",
            Some(&bad),
        )
        .unwrap_err();
        assert!(e.msg.contains("pod label example.com/ordinal"), "{}", e.msg);
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
