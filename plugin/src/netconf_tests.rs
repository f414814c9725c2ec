use super::*;
use crate::cni::{code, CniVersion};
use serde_json::json;
use serde_json::Value;

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
fn probe_settings() {
    assert_eq!(parse(base()).unwrap().probe, ProbeConf::default());
    assert!(parse(base()).unwrap().probe.enabled());
    let c = parse(with(
        "probe",
        json!({"count": 1, "intervalMs": 50, "fresh": true}),
    ))
    .unwrap();
    assert_eq!(c.probe.spec.count, 1);
    assert_eq!(c.probe.spec.interval, std::time::Duration::from_millis(50));
    assert!(c.probe.fresh && c.probe.enabled());
    let off = parse(with("probe", json!({"riskDuplicateAddresses": true}))).unwrap();
    assert!(!off.probe.enabled());
    for (bad, want, says) in [
        (
            json!({"count": 0}),
            code::INVALID_CONFIG,
            "riskDuplicateAddresses",
        ),
        (json!({"count": 11}), code::INVALID_CONFIG, "probe.count 11"),
        (
            json!({"intervalMs": 5}),
            code::INVALID_CONFIG,
            "probe.intervalMs 5",
        ),
        (
            json!({"intervalMs": 5000}),
            code::INVALID_CONFIG,
            "probe.intervalMs 5000",
        ),
        (json!({"tries": 1}), code::UNSUPPORTED_FIELD, "tries"),
    ] {
        let e = parse(with("probe", bad)).unwrap_err();
        assert_eq!(e.code, want, "{}", e.msg);
        assert!(e.msg.contains(says), "{}", e.msg);
    }
}

fn merge(target: &mut Value, extra: &Value) {
    if let (Some(t), Some(e)) = (target.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            match (t.get_mut(k), v) {
                (Some(old @ Value::Object(_)), Value::Object(_)) => merge(old, v),
                _ => {
                    t.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// Every version we speak: a typo is refused the same way in each.
const VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

fn sticky_ipam() -> Value {
    json!({"type": "sticky-ipam", "subnet": "10.0.0.0/24"})
}

#[test]
fn typos_among_our_keys_are_refused_naming_the_key_meant() {
    // (where, the config's change, the key, the key meant)
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        ("top level", json!({"mastre": "eth1"}), "mastre", "master"),
        (
            "top level",
            json!({"stickyMAC": true}),
            "stickyMAC",
            "stickyMac",
        ),
        ("top level", json!({"moed": "bridge"}), "moed", "mode"),
        (
            "top level",
            json!({"gatewaycheck": true}),
            "gatewaycheck",
            "gatewayCheck",
        ),
        (
            "top level",
            json!({"logfile": "/tmp/x"}),
            "logfile",
            "logFile",
        ),
        (
            "top level",
            json!({"linkInContainr": true}),
            "linkInContainr",
            "linkInContainer",
        ),
        ("probe", json!({"probe": {"cuont": 3}}), "cuont", "count"),
        (
            "probe",
            json!({"probe": {"intervalMS": 50}}),
            "intervalMS",
            "intervalMs",
        ),
        (
            "dns",
            json!({"dns": {"namservers": ["10.0.0.53"]}}),
            "namservers",
            "nameservers",
        ),
    ];
    for version in VERSIONS {
        for (place, change, key, meant) in &cases {
            let mut conf = with("cniVersion", json!(version));
            conf["ipam"] = sticky_ipam();
            merge(&mut conf, change);
            let e = parse(conf).unwrap_err();
            assert_eq!(e.code, code::UNSUPPORTED_FIELD, "{version} {place}: {e}");
            assert!(
                e.msg.contains(&format!("{key:?}"))
                    && e.msg.contains(&format!("did you mean {meant:?}")),
                "{version} {place}: {}",
                e.msg
            );
        }
    }
}

#[test]
fn keys_others_add_to_our_config_stay_accepted() {
    // Each key with where it comes from.
    let foreign = json!({
        // CNI spec: plugin configuration objects.
        "capabilities": {"mac": true, "ips": true},
        "args": {"cni": {"identity": "bgp-a", "labels": []}, "other": {}},
        "dns": {"nameservers": ["10.0.0.53"], "domain": "d", "search": ["s"], "options": ["o"]},
        // libcni's InjectConf: capability args and chained results.
        "runtimeConfig": {"mac": "02:00:00:00:00:09", "portMappings": [], "bandwidth": {}},
        "prevResult": {"cniVersion": "1.0.0", "interfaces": [], "ips": []},
        // GC (spec 1.1) under both names libcni has used.
        "cni.dev/valid-attachments": [],
        "cni.dev/attachments": [],
        // Multus' delegateAddDeviceID (pkg/types/conf.go).
        "deviceID": "0000:03:00.1",
        "pciBusID": "0000:03:00.1",
        // kubevirt/ipam-extensions' pkg/config/types.go.
        "allowPersistentIPs": true,
    });
    for version in VERSIONS {
        let mut conf = with("cniVersion", json!(version));
        conf["ipam"] = json!({
            "type": "sticky-ipam",
            "subnet": "10.0.0.0/24",
            // host-local's key, accepted so a NAD converts as it is.
            "resolvConf": "/etc/resolv.conf",
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1", "mtu": 1400, "advmss": 1360, "priority": 5, "table": 100, "scope": 0}],
            "store": {"type": "file", "dir": "/tmp/x"},
            "reservations": {"a": {"ip": "10.0.0.5", "namespaces": ["ns"]}, "b": "10.0.0.6"},
        });
        merge(&mut conf, &foreign);
        let c = parse(conf).unwrap_or_else(|e| panic!("{version}: {e}"));
        let ipam = c.common.ipam.unwrap();
        sticky_ipam::config::IpamConfig::parse("macnet", &ipam.raw)
            .unwrap_or_else(|e| panic!("{version}: {e}"));
    }
    // A delegated IPAM's section is its own business.
    let mut conf = base();
    conf["ipam"] = json!({"type": "whereabouts", "range": "10.0.0.0/24", "kubernetes": {}});
    assert!(parse(conf).is_ok());
}

#[test]
fn typos_inside_our_ipam_are_refused_naming_the_key_meant() {
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"reservation": {"a": "10.0.0.5"}}),
            "reservation",
            "reservations",
        ),
        (
            json!({"rangeStrat": "10.0.0.5"}),
            "rangeStrat",
            "rangeStart",
        ),
        (json!({"stroe": {"type": "kubernetes"}}), "stroe", "store"),
        (json!({"store": {"tpye": "kubernetes"}}), "tpye", "type"),
        (
            json!({"store": {"timeoutMS": 100}}),
            "timeoutMS",
            "timeoutMs",
        ),
        (
            json!({"identityPolicey": "podName"}),
            "identityPolicey",
            "identityPolicy",
        ),
        (
            json!({"ranges": [[{"subnet": "10.0.1.0/24", "rangEnd": "10.0.1.9"}]]}),
            "rangEnd",
            "rangeEnd",
        ),
        (json!({"routes": [{"dts": "0.0.0.0/0"}]}), "dts", "dst"),
        (
            json!({"reservations": {"a": {"ip": "10.0.0.5", "namespace": ["ns"]}}}),
            "namespace",
            "namespaces",
        ),
    ];
    // The ipam section is read the same way whatever the cniVersion;
    // e2e/tests/bad_input/ runs these through the binaries in each.
    for (change, key, meant) in &cases {
        let mut ipam = sticky_ipam();
        merge(&mut ipam, change);
        let e = sticky_ipam::config::IpamConfig::parse("macnet", &ipam).unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD, "{key}: {e}");
        assert!(
            e.msg.contains(&format!("{key:?}"))
                && e.msg.contains(&format!("did you mean {meant:?}")),
            "{}",
            e.msg
        );
    }
}

#[test]
fn minimal_config_is_l2_bridge() {
    let c = parse(base()).unwrap();
    assert_eq!(c.common.cni_version, CniVersion::V1_0_0);
    assert_eq!(c.mode, MacvlanMode::Bridge);
    assert_eq!(c.common.ipam, None);
    assert_eq!(c.mtu, 0);
    assert!(!c.link_in_container);
}

#[test]
fn missing_version_means_0_1_0() {
    let mut b = base();
    b.as_object_mut().unwrap().remove("cniVersion");
    assert_eq!(parse(b).unwrap().common.cni_version, CniVersion::V0_1_0);
    assert_eq!(
        parse(with("cniVersion", json!("")))
            .unwrap()
            .common
            .cni_version,
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
        (with("mtu", json!(-1)), code::INVALID_CONFIG, "mtu -1"),
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
    assert_eq!(parse(with("ipam", json!({}))).unwrap().common.ipam, None);
    let c = parse(with(
        "ipam",
        json!({"type": "host-local", "subnet": "10.0.0.0/24"}),
    ))
    .unwrap();
    let ipam = c.common.ipam.unwrap();
    assert_eq!(ipam.plugin_type, "host-local");
    assert_eq!(ipam.raw["subnet"], "10.0.0.0/24");
}

#[test]
fn runtime_config_and_args() {
    let mut b = base();
    b["runtimeConfig"] = json!({"mac": "02:00:00:00:00:09", "ips": ["10.0.0.9/24"]});
    b["args"] = json!({"cni": {"identity": "bgp-a"}});
    let c = parse(b).unwrap();
    assert_eq!(c.common.runtime_mac.as_deref(), Some("02:00:00:00:00:09"));
    assert_eq!(c.common.runtime_ips, vec!["10.0.0.9/24"]);
    assert_eq!(c.common.args_cni["identity"], "bgp-a");
}
