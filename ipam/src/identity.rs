//! Which workload an ADD is for (DESIGN.md section 3). The first source
//! that applies wins: `args.cni.identity`, `ipam.identity`, the pod-name
//! policy, else a dynamic key from the container and interface.

use cni::{CniArgs, CniError, CniResult};
use serde_json::{Map, Value};

use crate::config::{IdentityPolicy, IpamConfig};

/// Longer identities are refused: a namespace (63) + '/' + a pod name
/// (253) fits, a 10 KB blob does not.
pub const MAX_IDENTITY_LEN: usize = 320;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentitySource {
    ArgsCni,
    Config,
    PodName,
    Container,
}

impl IdentitySource {
    pub fn as_str(self) -> &'static str {
        match self {
            IdentitySource::ArgsCni => "args.cni.identity",
            IdentitySource::Config => "ipam.identity",
            IdentitySource::PodName => "pod name (identityPolicy podName)",
            IdentitySource::Container => "container ID and ifname (dynamic)",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub key: String,
    pub sticky: bool,
    pub source: IdentitySource,
}

/// Identity strings come from users and runtimes; they are hashed before
/// they touch a path, and bounded and printable here.
pub fn validate_identity(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("is empty: an identity needs at least one character".into());
    }
    if id.len() > MAX_IDENTITY_LEN {
        return Err(format!(
            "is {} bytes long: identities are at most {MAX_IDENTITY_LEN} bytes",
            id.len()
        ));
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{:.40?} contains the control character {c:?}: identities must be printable",
            id
        ));
    }
    Ok(())
}

pub fn dynamic_key(container_id: &str, ifname: &str) -> String {
    format!("container:{container_id}/{ifname}")
}

pub fn resolve(
    conf: &IpamConfig,
    args_cni: &Map<String, Value>,
    args: &CniArgs,
    container_id: &str,
    ifname: &str,
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
        });
    }
    if conf.policy == IdentityPolicy::PodName {
        let (Some(ns), Some(name)) = (args.pod_namespace.as_deref(), args.pod_name.as_deref())
        else {
            return Err(CniError::invalid_env(
                "identityPolicy podName needs K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS (kubelet and Multus send them): run the plugin under Kubernetes or set args.cni.identity",
            ));
        };
        let key = format!("{ns}/{name}");
        validate_identity(&key).map_err(|why| {
            CniError::invalid_env(format!(
                "pod identity from K8S_POD_NAMESPACE/K8S_POD_NAME {why}"
            ))
        })?;
        return Ok(Identity {
            key,
            sticky: true,
            source: IdentitySource::PodName,
        });
    }
    Ok(Identity {
        key: dynamic_key(container_id, ifname),
        sticky: false,
        source: IdentitySource::Container,
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
            want: (&'static str, bool, IdentitySource),
        }
        let cases = [
            Case {
                conf: json!({"identity": "fixed", "identityPolicy": "podName"}),
                args_cni: json!({"identity": "peer-a"}),
                args: k8s(),
                want: ("peer-a", true, IdentitySource::ArgsCni),
            },
            Case {
                conf: json!({"identity": "fixed", "identityPolicy": "podName"}),
                args_cni: json!({}),
                args: k8s(),
                want: ("fixed", true, IdentitySource::Config),
            },
            Case {
                conf: json!({"identityPolicy": "podName"}),
                args_cni: json!({"identity": null}),
                args: k8s(),
                want: ("bgp/rs0-0", true, IdentitySource::PodName),
            },
            Case {
                conf: json!({}),
                args_cni: json!({}),
                args: k8s(),
                want: ("container:c1/net1", false, IdentitySource::Container),
            },
        ];
        for c in cases {
            let id = resolve(&conf(c.conf), &args_cni(c.args_cni), &c.args, "c1", "net1").unwrap();
            assert_eq!((id.key.as_str(), id.sticky, id.source), c.want);
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
            let e = resolve(&c, &args_cni(bad), &CniArgs::default(), "c", "i").unwrap_err();
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
        )
        .unwrap_err();
        assert_eq!(e.code, cni::code::INVALID_ENV);
        assert!(e.msg.contains("K8S_POD_NAME"));
    }
}
