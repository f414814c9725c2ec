//! `CNI_ARGS`: `K=V;K=V` pairs, as runtimes and Multus send them.

use super::error::{CniError, CniResult};

/// Keys we understand. Anything else is refused unless `IgnoreUnknown` is
/// set, exactly like libcni's `LoadArgs`.
const KNOWN_KEYS: [&str; 7] = [
    "IgnoreUnknown",
    "MAC",
    "IP",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub ignore_unknown: bool,
    pub mac: Option<String>,
    /// `IP=` may carry several addresses separated by commas.
    pub ips: Vec<String>,
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_infra_container_id: Option<String>,
    pub pod_uid: Option<String>,
}

fn is_true(v: &str) -> bool {
    v == "1" || v.eq_ignore_ascii_case("true")
}

impl CniArgs {
    pub fn parse(raw: &str) -> CniResult<CniArgs> {
        let mut args = CniArgs::default();
        if raw.is_empty() {
            return Ok(args);
        }
        let mut unknown = Vec::new();
        for pair in raw.split(';') {
            let mut parts = pair.split('=');
            let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(CniError::invalid_env(format!(
                    "CNI_ARGS pair {pair:?} is invalid: expected KEY=VALUE separated by ';'"
                )));
            };
            // Later repeats win: Multus sends IgnoreUnknown twice.
            let value = value.to_string();
            let non_empty = || {
                if value.is_empty() {
                    None
                } else {
                    Some(value.clone())
                }
            };
            match key {
                "IgnoreUnknown" => args.ignore_unknown = is_true(&value),
                "MAC" => args.mac = non_empty(),
                "IP" => {
                    args.ips = value
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                }
                "K8S_POD_NAMESPACE" => args.pod_namespace = non_empty(),
                "K8S_POD_NAME" => args.pod_name = non_empty(),
                "K8S_POD_INFRA_CONTAINER_ID" => args.pod_infra_container_id = non_empty(),
                "K8S_POD_UID" => args.pod_uid = non_empty(),
                other => {
                    debug_assert!(!KNOWN_KEYS.contains(&other));
                    unknown.push(other.to_string());
                }
            }
        }
        if !unknown.is_empty() && !args.ignore_unknown {
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS has unknown keys {}: known keys are {}; add IgnoreUnknown=1 to accept others",
                unknown.join(", "),
                KNOWN_KEYS.join(", ")
            )));
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;

    #[test]
    fn empty_is_nothing() {
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }

    #[test]
    fn multus_style_args_with_repeated_keys() {
        let a = CniArgs::parse(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=db;K8S_POD_NAME=pg-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1;IgnoreUnknown=1;MAC=02:00:00:00:00:01;IP=10.0.0.5/24",
        )
        .unwrap();
        assert!(a.ignore_unknown);
        assert_eq!(a.pod_namespace.as_deref(), Some("db"));
        assert_eq!(a.pod_name.as_deref(), Some("pg-0"));
        assert_eq!(a.pod_uid.as_deref(), Some("u-1"));
        assert_eq!(a.pod_infra_container_id.as_deref(), Some("abc"));
        assert_eq!(a.mac.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(a.ips, vec!["10.0.0.5/24"]);
    }

    #[test]
    fn later_repeat_wins() {
        let a = CniArgs::parse("MAC=02:00:00:00:00:01;MAC=02:00:00:00:00:02").unwrap();
        assert_eq!(a.mac.as_deref(), Some("02:00:00:00:00:02"));
    }

    #[test]
    fn unknown_keys_refused_without_ignore_unknown() {
        let e = CniArgs::parse("FOO=bar;K8S_POD_NAME=x").unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.msg.contains("FOO"), "{}", e.msg);
        assert!(CniArgs::parse("FOO=bar;IgnoreUnknown=1").is_ok());
        assert!(CniArgs::parse("IgnoreUnknown=TRUE;FOO=bar").is_ok());
        assert!(CniArgs::parse("IgnoreUnknown=0;FOO=bar").is_err());
    }

    #[test]
    fn malformed_pairs() {
        for raw in ["FOO", "A=b=c", "K8S_POD_NAME=x;;", "=;"] {
            let r = CniArgs::parse(raw);
            if raw == "=;" {
                // "=" is an (unknown) empty key, then "" is a malformed pair.
                assert!(r.is_err());
                continue;
            }
            let e = r.unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{raw}");
        }
    }

    #[test]
    fn several_ips() {
        let a = CniArgs::parse("IP=10.0.0.5/24,fd00::5/64").unwrap();
        assert_eq!(a.ips, vec!["10.0.0.5/24", "fd00::5/64"]);
    }
}
