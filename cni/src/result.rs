//! CNI results: one canonical (1.x) model, read from and written to every
//! spec version's wire shape.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::error::{code, CniError, CniResult};
use super::version::{CniVersion, ResultShape};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    #[serde(
        default,
        rename = "socketPath",
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, rename = "advmss", skip_serializing_if = "Option::is_none")]
    pub adv_mss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            adv_mss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self == &Dns::default()
    }
}

/// The result of an ADD, independent of the version it travels in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniOutput {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

/// The 0.1.0/0.2.0 `ip4`/`ip6` object.
#[derive(Debug, Serialize, Deserialize)]
struct LegacyIpConfig {
    ip: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
}

fn bad_result(what: &str, err: impl std::fmt::Display) -> CniError {
    CniError::new(code::DECODE_FAILURE, format!("cannot parse {what}: {err}"))
}

fn field<T: for<'de> Deserialize<'de>>(
    obj: &Map<String, Value>,
    key: &str,
    what: &str,
) -> CniResult<Option<T>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| bad_result(what, format!("field {key:?}: {e}"))),
    }
}

impl CniOutput {
    /// Reads a result in whatever version it declares (its own `cniVersion`
    /// wins over `fallback`, as libcni does). `what` names it in errors.
    pub fn from_json(value: &Value, fallback: CniVersion, what: &str) -> CniResult<CniOutput> {
        let obj = value
            .as_object()
            .ok_or_else(|| bad_result(what, "it is not a JSON object"))?;
        let version = match obj.get("cniVersion") {
            Some(Value::String(s)) => CniVersion::parse(s).ok_or_else(|| {
                CniError::new(
                    code::INCOMPATIBLE_VERSION,
                    format!("cannot parse {what}: unknown cniVersion {s:?}"),
                )
            })?,
            _ => fallback,
        };
        let dns: Dns = field(obj, "dns", what)?.unwrap_or_default();
        match version.result_shape() {
            ResultShape::Legacy => {
                let mut out = CniOutput {
                    dns,
                    ..CniOutput::default()
                };
                for key in ["ip4", "ip6"] {
                    if let Some(legacy) = field::<LegacyIpConfig>(obj, key, what)? {
                        out.ips.push(IpConfig {
                            interface: None,
                            address: legacy.ip,
                            gateway: legacy.gateway,
                        });
                        out.routes.extend(legacy.routes);
                    }
                }
                Ok(out)
            }
            ResultShape::Versioned | ResultShape::Current => {
                // The 0.3/0.4 "version" key is implied by the address; ignore it.
                let ips: Vec<Map<String, Value>> = field(obj, "ips", what)?.unwrap_or_default();
                let ips = ips
                    .into_iter()
                    .map(|mut ip| {
                        ip.remove("version");
                        serde_json::from_value::<IpConfig>(Value::Object(ip))
                            .map_err(|e| bad_result(what, format!("ips: {e}")))
                    })
                    .collect::<CniResult<Vec<_>>>()?;
                let out = CniOutput {
                    interfaces: field(obj, "interfaces", what)?.unwrap_or_default(),
                    ips,
                    routes: field(obj, "routes", what)?.unwrap_or_default(),
                    dns,
                };
                for ip in &out.ips {
                    if let Some(i) = ip.interface {
                        if i >= out.interfaces.len() {
                            return Err(bad_result(
                                what,
                                format!(
                                    "ip {} names interface {i}, but there are {}",
                                    ip.address,
                                    out.interfaces.len()
                                ),
                            ));
                        }
                    }
                }
                Ok(out)
            }
        }
    }

    /// Writes the result in `version`'s shape.
    pub fn to_json(&self, version: CniVersion) -> CniResult<Value> {
        let mut obj = Map::new();
        obj.insert("cniVersion".into(), json!(version.as_str()));
        match version.result_shape() {
            ResultShape::Legacy => {
                // 0.2.0 holds one address per family: the first of each.
                let first = |v4: bool| self.ips.iter().find(|ip| ip.address.addr().is_ipv4() == v4);
                let mut any = false;
                for (key, v4) in [("ip4", true), ("ip6", false)] {
                    if let Some(ip) = first(v4) {
                        any = true;
                        let routes = self
                            .routes
                            .iter()
                            .filter(|r| r.dst.addr().is_ipv4() == v4)
                            .cloned()
                            .collect();
                        let legacy = LegacyIpConfig {
                            ip: ip.address,
                            gateway: ip.gateway,
                            routes,
                        };
                        obj.insert(key.into(), to_value(&legacy)?);
                    }
                }
                if !any {
                    return Err(CniError::new(
                        code::INCOMPATIBLE_VERSION,
                        format!(
                            "cannot convert: no valid IP addresses: a cniVersion {version} result must carry an IP; use cniVersion 0.3.0 or later for an L2-only attachment"
                        ),
                    ));
                }
            }
            shape @ (ResultShape::Versioned | ResultShape::Current) => {
                if !self.interfaces.is_empty() {
                    obj.insert("interfaces".into(), to_value(&self.interfaces)?);
                }
                if !self.ips.is_empty() {
                    let mut ips = Vec::with_capacity(self.ips.len());
                    for ip in &self.ips {
                        let mut v = to_value(ip)?;
                        if shape == ResultShape::Versioned {
                            let family = if ip.address.addr().is_ipv4() {
                                "4"
                            } else {
                                "6"
                            };
                            v["version"] = json!(family);
                        }
                        ips.push(v);
                    }
                    obj.insert("ips".into(), Value::Array(ips));
                }
                if !self.routes.is_empty() {
                    obj.insert("routes".into(), to_value(&self.routes)?);
                }
            }
        }
        if !self.dns.is_empty() {
            obj.insert("dns".into(), to_value(&self.dns)?);
        }
        Ok(Value::Object(obj))
    }
}

fn to_value<T: Serialize>(v: &T) -> CniResult<Value> {
    serde_json::to_value(v)
        .map_err(|e| CniError::new(code::IO_FAILURE, format!("cannot encode result: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniOutput {
        CniOutput {
            interfaces: vec![Interface {
                name: "net1".into(),
                mac: Some("02:00:00:00:00:01".into()),
                sandbox: Some("/var/run/netns/p".into()),
                ..Interface::default()
            }],
            ips: vec![
                IpConfig {
                    interface: Some(0),
                    address: "10.1.0.5/24".parse().unwrap(),
                    gateway: Some("10.1.0.1".parse().unwrap()),
                },
                IpConfig {
                    interface: Some(0),
                    address: "10.1.0.6/24".parse().unwrap(),
                    gateway: None,
                },
                IpConfig {
                    interface: Some(0),
                    address: "fd00::5/64".parse().unwrap(),
                    gateway: None,
                },
            ],
            routes: vec![
                Route::new("0.0.0.0/0".parse().unwrap(), None),
                Route::new(
                    "fd01::/64".parse().unwrap(),
                    Some("fd00::1".parse().unwrap()),
                ),
            ],
            dns: Dns::default(),
        }
    }

    #[test]
    fn current_shape_has_no_version_key_and_omits_empty_dns() {
        let j = sample().to_json(CniVersion::V1_0_0).unwrap();
        assert_eq!(j["cniVersion"], "1.0.0");
        assert_eq!(j["ips"][0]["address"], "10.1.0.5/24");
        assert_eq!(j["ips"][0]["interface"], 0);
        assert!(j["ips"][0].get("version").is_none());
        assert!(j.get("dns").is_none());
        assert_eq!(j["routes"][0], json!({"dst": "0.0.0.0/0"}));
    }

    #[test]
    fn versioned_shape_adds_family_per_ip() {
        for v in [CniVersion::V0_3_0, CniVersion::V0_3_1, CniVersion::V0_4_0] {
            let j = sample().to_json(v).unwrap();
            assert_eq!(j["ips"][0]["version"], "4");
            assert_eq!(j["ips"][2]["version"], "6");
            assert_eq!(j["cniVersion"], v.as_str());
        }
    }

    #[test]
    fn legacy_shape_keeps_first_of_each_family_and_splits_routes() {
        let j = sample().to_json(CniVersion::V0_2_0).unwrap();
        assert_eq!(j["ip4"]["ip"], "10.1.0.5/24");
        assert_eq!(j["ip4"]["gateway"], "10.1.0.1");
        assert_eq!(j["ip4"]["routes"], json!([{"dst": "0.0.0.0/0"}]));
        assert_eq!(j["ip6"]["ip"], "fd00::5/64");
        assert_eq!(
            j["ip6"]["routes"],
            json!([{"dst": "fd01::/64", "gw": "fd00::1"}])
        );
        assert!(j.get("interfaces").is_none());
    }

    #[test]
    fn legacy_without_ips_cannot_convert() {
        let l2 = CniOutput {
            interfaces: sample().interfaces,
            ..CniOutput::default()
        };
        for v in [CniVersion::V0_1_0, CniVersion::V0_2_0] {
            let e = l2.to_json(v).unwrap_err();
            assert!(
                e.msg.starts_with("cannot convert: no valid IP addresses"),
                "{}",
                e.msg
            );
        }
        assert!(l2.to_json(CniVersion::V0_3_0).is_ok());
    }

    #[test]
    fn round_trip_through_every_version() {
        let s = sample();
        for v in [
            CniVersion::V0_3_0,
            CniVersion::V0_3_1,
            CniVersion::V0_4_0,
            CniVersion::V1_0_0,
            CniVersion::V1_1_0,
        ] {
            let j = s.to_json(v).unwrap();
            assert_eq!(
                CniOutput::from_json(&j, CniVersion::V0_1_0, "t").unwrap(),
                s,
                "{v}"
            );
        }
    }

    #[test]
    fn legacy_input_becomes_ips_and_routes() {
        let j = json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24", "gateway": "10.0.0.1",
            "routes": [{"dst": "0.0.0.0/0"}]}, "dns": {"nameservers": ["10.0.0.53"]}});
        let out = CniOutput::from_json(&j, CniVersion::V1_0_0, "t").unwrap();
        assert_eq!(out.ips.len(), 1);
        assert_eq!(out.ips[0].interface, None);
        assert_eq!(out.routes.len(), 1);
        assert_eq!(out.dns.nameservers, vec!["10.0.0.53"]);
    }

    #[test]
    fn own_version_wins_over_fallback() {
        let j = json!({"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.0.0.2/24"}]});
        let out = CniOutput::from_json(&j, CniVersion::V0_2_0, "t").unwrap();
        assert_eq!(out.ips.len(), 1);
    }

    #[test]
    fn bad_results_are_decode_errors() {
        let cases = [
            json!([]),
            json!({"cniVersion": "1.0.0", "ips": [{"address": "nope"}]}),
            json!({"cniVersion": "1.0.0", "ips": "x"}),
            json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/24", "interface": 3}]}),
            json!({"cniVersion": "0.2.0", "ip4": {"ip": 5}}),
        ];
        for c in cases {
            let e = CniOutput::from_json(&c, CniVersion::V1_0_0, "prevResult").unwrap_err();
            assert_eq!(e.code, code::DECODE_FAILURE, "{c}");
            assert!(e.msg.contains("prevResult"));
        }
        let e = CniOutput::from_json(&json!({"cniVersion": "7.0.0"}), CniVersion::V1_0_0, "x")
            .unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
    }

    #[test]
    fn dns_is_kept_when_set() {
        let mut s = sample();
        s.dns.nameservers = vec!["1.1.1.1".into()];
        let j = s.to_json(CniVersion::V1_0_0).unwrap();
        assert_eq!(j["dns"], json!({"nameservers": ["1.1.1.1"]}));
    }
}
