//! The keys every plugin of ours reads from a network config: version,
//! name, type, ipam, dns, args, runtimeConfig, prevResult and logging.
//! Plugin-specific keys are read by each plugin from the same JSON.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::env::is_valid_name;
use crate::error::{code, CniError, CniResult};
use crate::log::LogLevel;
use crate::result::Dns;
use crate::version::{CniVersion, IMPLICIT_VERSION, SUPPORTED_VERSIONS};

/// The `ipam` section. `{}` (or no section) means an L2-only attachment.
#[derive(Debug, Clone, PartialEq)]
pub struct IpamSection {
    pub plugin_type: String,
    pub raw: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CommonConf {
    pub cni_version: CniVersion,
    pub name: String,
    pub plugin_type: String,
    pub ipam: Option<IpamSection>,
    pub dns: Dns,
    /// `args.cni`, where Multus puts a selection element's `cni-args`.
    pub args_cni: Map<String, Value>,
    pub runtime_mac: Option<String>,
    pub runtime_ips: Vec<String>,
    pub prev_result: Option<Value>,
    pub log_file: Option<PathBuf>,
    pub log_level: LogLevel,
    /// The NAD's top-level `allowPersistentIPs` (kubevirt/ipam-extensions,
    /// `keys::KUBEVIRT_KEYS`): the IPAM then honours the pod's
    /// `ipam-claim-reference`.
    pub allow_persistent_ips: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    cni_version: Option<String>,
    name: Option<String>,
    #[serde(rename = "type")]
    plugin_type: Option<String>,
    ipam: Option<Map<String, Value>>,
    dns: Option<Dns>,
    args: Option<RawArgs>,
    runtime_config: Option<RawRuntimeConfig>,
    prev_result: Option<Value>,
    log_file: Option<String>,
    log_level: Option<String>,
    #[serde(rename = "allowPersistentIPs")]
    allow_persistent_ips: Option<bool>,
}

#[derive(Deserialize)]
struct RawArgs {
    cni: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
struct RawRuntimeConfig {
    mac: Option<String>,
    ips: Option<Vec<String>>,
}

/// Reads just the version, for answering errors in the caller's version
/// even when the rest of the config is broken.
pub fn sniff_version(stdin: &[u8]) -> Option<CniVersion> {
    #[derive(Deserialize)]
    struct Sniff {
        #[serde(rename = "cniVersion")]
        cni_version: Option<String>,
    }
    let sniff: Sniff = serde_json::from_slice(stdin).ok()?;
    match sniff.cni_version.as_deref() {
        None | Some("") => Some(IMPLICIT_VERSION),
        Some(s) => CniVersion::parse(s),
    }
}

/// A plugin name that can safely be looked up on CNI_PATH.
pub fn is_plain_plugin_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// Deserializes `value` into `T`, naming the offending field on failure.
pub fn typed<T: serde::de::DeserializeOwned>(value: &Value, what: &str) -> CniResult<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        CniError::invalid_config(format!(
            "{what} field {path:?} is invalid: {}",
            e.into_inner()
        ))
    })
}

impl CommonConf {
    /// Parses stdin; returns the common keys and the whole JSON for the
    /// plugin's own keys.
    pub fn parse(stdin: &[u8], expected_type: &str) -> CniResult<(CommonConf, Value)> {
        let value: Value = serde_json::from_slice(stdin)
            .map_err(|e| CniError::decode(format!("cannot parse network config: {e}")))?;
        if !value.is_object() {
            return Err(CniError::decode(
                "cannot parse network config: it is not a JSON object",
            ));
        }
        let raw: RawConf = typed(&value, "network config")?;

        let name = raw.name.unwrap_or_default();
        if name.is_empty() {
            return Err(CniError::invalid_config(
                "network config has no \"name\": every network needs one",
            ));
        }
        if !is_valid_name(&name) {
            return Err(CniError::invalid_config(format!(
                "network name {name:?} is invalid: it must start with a letter or digit and contain only letters, digits, '_', '.' and '-'"
            )));
        }
        let plugin_type = raw.plugin_type.unwrap_or_default();
        if plugin_type.is_empty() {
            return Err(CniError::invalid_config(format!(
                "network {name:?} has no \"type\": set it to \"{expected_type}\""
            )));
        }

        let cni_version = match raw.cni_version.as_deref() {
            None | Some("") => IMPLICIT_VERSION,
            Some(s) => CniVersion::parse(s).ok_or_else(|| {
                CniError::new(
                    code::INCOMPATIBLE_VERSION,
                    format!(
                        "incompatible CNI versions: network {name:?} asks for cniVersion {s:?}"
                    ),
                )
                .with_details(format!(
                    "config is {s:?}, plugin supports {SUPPORTED_VERSIONS:?}"
                ))
            })?,
        };

        let ipam = match raw.ipam {
            None => None,
            Some(map) => match map.get("type") {
                None => None,
                Some(Value::String(t)) if t.is_empty() => None,
                Some(Value::String(t)) if is_plain_plugin_name(t) => Some(IpamSection {
                    plugin_type: t.clone(),
                    raw: Value::Object(map.clone()),
                }),
                Some(other) => {
                    return Err(CniError::invalid_config(format!(
                        "ipam.type {other} is invalid: it must be the plain name of a plugin binary on CNI_PATH"
                    )))
                }
            },
        };

        let runtime = raw.runtime_config;
        let conf = CommonConf {
            cni_version,
            name,
            plugin_type,
            ipam,
            dns: raw.dns.unwrap_or_default(),
            args_cni: raw.args.and_then(|a| a.cni).unwrap_or_default(),
            runtime_mac: runtime
                .as_ref()
                .and_then(|r| r.mac.clone())
                .filter(|m| !m.is_empty()),
            runtime_ips: runtime.and_then(|r| r.ips).unwrap_or_default(),
            prev_result: raw.prev_result.filter(|v| !v.is_null()),
            log_file: raw.log_file.filter(|f| !f.is_empty()).map(PathBuf::from),
            log_level: LogLevel::parse(raw.log_level.as_deref().unwrap_or("info"))?,
            allow_persistent_ips: raw.allow_persistent_ips.unwrap_or(false),
        };
        Ok((conf, value))
    }
}

/// The attachments a GC must keep, from either key the spec has used.
pub fn gc_attachments(stdin: &[u8]) -> CniResult<Vec<(String, String)>> {
    let conf: Value = serde_json::from_slice(stdin)
        .map_err(|e| CniError::decode(format!("cannot parse network config: {e}")))?;
    let list = conf
        .get("cni.dev/valid-attachments")
        .or_else(|| conf.get("cni.dev/attachments"));
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    let items = list.as_array().ok_or_else(|| {
        CniError::invalid_config(
            "cni.dev/valid-attachments must be a list of {\"containerID\", \"ifname\"} objects",
        )
    })?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_string);
            match (field("containerID"), field("ifname")) {
                (Some(c), Some(n)) => Ok((c, n)),
                _ => Err(CniError::invalid_config(format!(
                    "cni.dev/valid-attachments entry {i} needs string \"containerID\" and \"ifname\""
                ))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gc_accepts_both_attachment_keys() {
        for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
            let stdin = json!({"cniVersion": "1.1.0", "name": "n", "type": "t", key: [{"containerID": "c", "ifname": "net1"}]});
            assert_eq!(
                gc_attachments(stdin.to_string().as_bytes()).unwrap(),
                vec![("c".into(), "net1".into())]
            );
        }
        let bad = json!({"cni.dev/valid-attachments": [{"containerID": 1}]});
        assert_eq!(
            gc_attachments(bad.to_string().as_bytes()).unwrap_err().code,
            code::INVALID_CONFIG
        );
        let bad = json!({"cni.dev/valid-attachments": "x"});
        assert!(gc_attachments(bad.to_string().as_bytes()).is_err());
    }

    #[test]
    fn sniffing_the_version() {
        assert_eq!(
            sniff_version(br#"{"cniVersion":"0.3.1"}"#),
            Some(CniVersion::V0_3_1)
        );
        assert_eq!(sniff_version(br#"{}"#), Some(IMPLICIT_VERSION));
        assert_eq!(sniff_version(b"nope"), None);
    }
}
