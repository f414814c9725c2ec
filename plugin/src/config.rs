//! The network config (stdin), parsed and validated before anything is
//! touched. Unknown keys are accepted: CNI configs are shared between
//! plugins in a chain.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::cni::env::is_valid_name;
use crate::cni::log::LogLevel;
use crate::cni::version::{IMPLICIT_VERSION, SUPPORTED_VERSIONS};
use crate::cni::{code, CniError, CniResult, CniVersion, Dns};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacvlanMode {
    Bridge,
    Private,
    Vepa,
    Passthru,
}

impl MacvlanMode {
    pub fn parse(s: &str) -> CniResult<MacvlanMode> {
        Ok(match s {
            "" | "bridge" => MacvlanMode::Bridge,
            "private" => MacvlanMode::Private,
            "vepa" => MacvlanMode::Vepa,
            "passthru" => MacvlanMode::Passthru,
            other => {
                return Err(CniError::invalid_config(format!(
                "unknown macvlan mode {other:?}: set \"mode\" to bridge, private, vepa or passthru"
            )))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MacvlanMode::Bridge => "bridge",
            MacvlanMode::Private => "private",
            MacvlanMode::Vepa => "vepa",
            MacvlanMode::Passthru => "passthru",
        }
    }
}

/// The `ipam` section. `{}` (or no section) means an L2-only attachment.
#[derive(Debug, Clone, PartialEq)]
pub struct IpamSection {
    pub plugin_type: String,
    pub raw: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
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
    pub master: Option<String>,
    pub mode: MacvlanMode,
    pub mtu: u32,
    pub mac: Option<String>,
    pub link_in_container: bool,
    pub bc_queue_len: Option<u32>,
    pub log_file: Option<PathBuf>,
    pub log_level: LogLevel,
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
    master: Option<String>,
    mode: Option<String>,
    mtu: Option<i64>,
    mac: Option<String>,
    link_in_container: Option<bool>,
    bcqueuelen: Option<u32>,
    log_file: Option<String>,
    log_level: Option<String>,
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

impl NetConf {
    pub fn parse(stdin: &[u8]) -> CniResult<NetConf> {
        let value: Value = serde_json::from_slice(stdin)
            .map_err(|e| CniError::decode(format!("cannot parse network config: {e}")))?;
        if !value.is_object() {
            return Err(CniError::decode(
                "cannot parse network config: it is not a JSON object",
            ));
        }
        let raw: RawConf = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            CniError::invalid_config(format!(
                "network config field {path:?} is invalid: {}",
                e.into_inner()
            ))
        })?;

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
                "network {name:?} has no \"type\": set it to \"sticky-macvlan\""
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
                Some(Value::String(t)) if is_plain_plugin_name(t) => {
                    Some(IpamSection { plugin_type: t.clone(), raw: Value::Object(map.clone()) })
                }
                Some(other) => {
                    return Err(CniError::invalid_config(format!(
                        "ipam.type {other} is invalid: it must be the plain name of a plugin binary on CNI_PATH"
                    )))
                }
            },
        };

        let mtu = match raw.mtu.unwrap_or(0) {
            m if (0..=i64::from(u32::MAX)).contains(&m) => m as u32,
            m => {
                return Err(CniError::invalid_config(format!(
                "invalid MTU {m}: it must be between 0 (inherit the master's) and the master's MTU"
            )))
            }
        };

        let runtime = raw.runtime_config;
        Ok(NetConf {
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
            master: raw.master.filter(|m| !m.is_empty()),
            mode: MacvlanMode::parse(raw.mode.as_deref().unwrap_or(""))?,
            mtu,
            mac: raw.mac.filter(|m| !m.is_empty()),
            link_in_container: raw.link_in_container.unwrap_or(false),
            bc_queue_len: raw.bcqueuelen,
            log_file: raw.log_file.filter(|f| !f.is_empty()).map(PathBuf::from),
            log_level: LogLevel::parse(raw.log_level.as_deref().unwrap_or("info"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> CniResult<NetConf> {
        NetConf::parse(v.to_string().as_bytes())
    }

    fn base() -> Value {
        json!({"cniVersion": "1.0.0", "name": "macnet", "type": "sticky-macvlan", "master": "uplink0"})
    }

    fn with(key: &str, value: Value) -> Value {
        let mut b = base();
        b[key] = value;
        b
    }

    #[test]
    fn minimal_config_is_l2_bridge() {
        let c = parse(base()).unwrap();
        assert_eq!(c.cni_version, CniVersion::V1_0_0);
        assert_eq!(c.mode, MacvlanMode::Bridge);
        assert_eq!(c.ipam, None);
        assert_eq!(c.mtu, 0);
        assert!(!c.link_in_container);
    }

    #[test]
    fn missing_version_means_0_1_0() {
        let mut b = base();
        b.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(parse(b).unwrap().cni_version, CniVersion::V0_1_0);
        assert_eq!(
            parse(with("cniVersion", json!(""))).unwrap().cni_version,
            CniVersion::V0_1_0
        );
    }

    #[test]
    fn error_cases_name_the_problem() {
        let cases: Vec<(Value, u32, &str)> = vec![
            (
                with("cniVersion", json!("9.9.9")),
                code::INCOMPATIBLE_VERSION,
                "9.9.9",
            ),
            (with("name", json!("")), code::INVALID_CONFIG, "name"),
            (
                with("name", json!("bad name")),
                code::INVALID_CONFIG,
                "bad name",
            ),
            (with("type", json!("")), code::INVALID_CONFIG, "type"),
            (
                with("mode", json!("source")),
                code::INVALID_CONFIG,
                "source",
            ),
            (with("mode", json!("nope")), code::INVALID_CONFIG, "nope"),
            (with("mtu", json!(-1)), code::INVALID_CONFIG, "MTU -1"),
            (with("mtu", json!("big")), code::INVALID_CONFIG, "mtu"),
            (
                with("linkInContainer", json!("yes")),
                code::INVALID_CONFIG,
                "linkInContainer",
            ),
            (
                with("ipam", json!({"type": "../evil"})),
                code::INVALID_CONFIG,
                "ipam.type",
            ),
            (
                with("ipam", json!({"type": 3})),
                code::INVALID_CONFIG,
                "ipam.type",
            ),
            (
                with("logLevel", json!("loud")),
                code::INVALID_CONFIG,
                "logLevel",
            ),
            (
                with("runtimeConfig", json!({"ips": "10.0.0.1"})),
                code::INVALID_CONFIG,
                "runtimeConfig.ips",
            ),
        ];
        for (conf, want_code, needle) in cases {
            let e = parse(conf.clone()).unwrap_err();
            assert_eq!(e.code, want_code, "{conf}: {e}");
            assert!(e.msg.contains(needle), "{conf}: {} lacks {needle}", e.msg);
        }
    }

    #[test]
    fn missing_name_and_type() {
        let mut b = base();
        b.as_object_mut().unwrap().remove("name");
        assert_eq!(parse(b).unwrap_err().code, code::INVALID_CONFIG);
        let mut b = base();
        b.as_object_mut().unwrap().remove("type");
        assert_eq!(parse(b).unwrap_err().code, code::INVALID_CONFIG);
    }

    #[test]
    fn malformed_json_is_a_decode_error() {
        for raw in ["", "{", "nope", "[1,2]", "{\"name\": }"] {
            let e = NetConf::parse(raw.as_bytes()).unwrap_err();
            assert_eq!(e.code, code::DECODE_FAILURE, "{raw:?}: {e}");
        }
    }

    #[test]
    fn empty_ipam_is_l2_and_typed_ipam_is_kept_whole() {
        assert_eq!(parse(with("ipam", json!({}))).unwrap().ipam, None);
        let c = parse(with(
            "ipam",
            json!({"type": "host-local", "subnet": "10.0.0.0/24"}),
        ))
        .unwrap();
        let ipam = c.ipam.unwrap();
        assert_eq!(ipam.plugin_type, "host-local");
        assert_eq!(ipam.raw["subnet"], "10.0.0.0/24");
    }

    #[test]
    fn runtime_config_and_args() {
        let mut b = base();
        b["runtimeConfig"] = json!({"mac": "02:00:00:00:00:09", "ips": ["10.0.0.9/24"]});
        b["args"] = json!({"cni": {"identity": "bgp-a"}});
        let c = parse(b).unwrap();
        assert_eq!(c.runtime_mac.as_deref(), Some("02:00:00:00:00:09"));
        assert_eq!(c.runtime_ips, vec!["10.0.0.9/24"]);
        assert_eq!(c.args_cni["identity"], "bgp-a");
    }

    #[test]
    fn sniffing_the_version() {
        assert_eq!(
            sniff_version(b"{\"cniVersion\":\"0.4.0\",\"mtu\":\"x\"}"),
            Some(CniVersion::V0_4_0)
        );
        assert_eq!(sniff_version(b"{}"), Some(CniVersion::V0_1_0));
        assert_eq!(sniff_version(b"{"), None);
    }
}
