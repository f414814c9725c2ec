//! Property-based fuzzing of everything that reads untrusted input: the
//! plugin config (with its `ipam` section), `CNI_ARGS`, `prevResult`, the
//! GC attachment list, identities, and result conversion to every version.
//! Properties: no panic, and every error is a CNI error with a known code
//! and a message, rendered as valid error JSON in every version.
//!
//! CI runs a bounded number of cases; run longer by hand with
//! `STICKY_FUZZ_CASES=200000 cargo test --release -p sticky-macvlan --test fuzz`.

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use sticky_ipam::config::IpamConfig;
use sticky_macvlan::cni::{self, CniError, CniOutput, CniVersion};
use sticky_macvlan::netconf::NetConf;

fn cases() -> u32 {
    std::env::var("STICKY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500)
}

/// A CNI error as a runtime would read it: known code, a message, and
/// error JSON that serialises in every version.
fn assert_valid_error(e: &CniError, input: &str) {
    assert!(
        sticky_macvlan::cni::code::is_known(e.code),
        "unknown code {} for {input:?}: {}",
        e.code,
        e.msg
    );
    assert!(!e.msg.trim().is_empty(), "empty message for {input:?}");
    for v in cni::version::SUPPORTED_VERSIONS {
        let version = CniVersion::parse(v).unwrap_or(CniVersion::LATEST);
        let rendered = e.to_json(version);
        let text = serde_json::to_string(&rendered).expect("error JSON serialises");
        let back: Value = serde_json::from_str(&text).expect("error JSON parses");
        assert_eq!(back["code"], json!(e.code));
        assert!(back["msg"].is_string() && back["cniVersion"].is_string());
    }
}

/// Any JSON value, weighted towards the shapes configs hold: odd numbers,
/// hostile strings (NUL, `..`, `/`, unicode, 10 KB), nesting.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)),
        Just(json!(u64::MAX)),
        ".{0,40}".prop_map(Value::String),
        prop_oneof![
            Just("../../etc/passwd".to_string()),
            Just("a/b".to_string()),
            Just("nul\0inside".to_string()),
            Just("ünïcødé/名前".to_string()),
            Just("x".repeat(10 * 1024)),
            Just("10.0.0.0/8".to_string()),
            Just("fd00::/129".to_string()),
            Just("255.255.255.255".to_string()),
            Just("".to_string()),
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

const PLUGIN_KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "master",
    "mode",
    "mtu",
    "mac",
    "linkInContainer",
    "bcqueuelen",
    "stickyMac",
    "gatewayCheck",
    "probe",
    "runtimeConfig",
    "args",
    "prevResult",
    "dns",
    "logFile",
    "logLevel",
    "ipam",
];
const IPAM_KEYS: &[&str] = &[
    "type",
    "subnet",
    "rangeStart",
    "rangeEnd",
    "gateway",
    "ranges",
    "routes",
    "dataDir",
    "identity",
    "identityPolicy",
    "exclude",
    "reserved",
    "store",
    "nodeName",
    "maxScan",
    "resolvConf",
    "dns",
];

fn valid_conf() -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "net", "type": "sticky-macvlan", "master": "uplink0",
        "ipam": {"type": "sticky-ipam", "subnet": "10.1.0.0/16", "gateway": "10.1.0.1",
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "/tmp/never-written"},
    })
}

/// A valid config with up to four keys (of the plugin or its ipam
/// section) replaced by arbitrary values or removed.
fn mutated_conf() -> impl Strategy<Value = Value> {
    let edit = (
        any::<bool>(),
        any::<prop::sample::Index>(),
        prop::option::of(any_json()),
    );
    prop::collection::vec(edit, 0..4).prop_map(|edits| {
        let mut conf = valid_conf();
        for (in_ipam, key, value) in edits {
            let (target, keys) = if in_ipam {
                (&mut conf["ipam"], IPAM_KEYS)
            } else {
                (&mut conf, PLUGIN_KEYS)
            };
            let key = keys[key.index(keys.len())];
            if let Some(obj) = target.as_object_mut() {
                match value {
                    Some(v) => {
                        obj.insert(key.to_string(), v);
                    }
                    None => {
                        obj.remove(key);
                    }
                }
            }
        }
        conf
    })
}

fn check_conf(bytes: &[u8]) {
    let shown = String::from_utf8_lossy(bytes)
        .chars()
        .take(200)
        .collect::<String>();
    match NetConf::parse(bytes) {
        Err(e) => assert_valid_error(&e, &shown),
        Ok(conf) => {
            if let Some(ipam) = &conf.common.ipam {
                if ipam.plugin_type == "sticky-ipam" {
                    if let Err(e) = IpamConfig::parse(&conf.common.name, &ipam.raw) {
                        assert_valid_error(&e, &shown);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn config_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_conf(&bytes);
    }

    #[test]
    fn mutated_configs_fail_with_cni_errors(conf in mutated_conf()) {
        check_conf(conf.to_string().as_bytes());
    }

    #[test]
    fn cni_args_never_panic(raw in ".{0,300}", pairs in prop::collection::vec(("[A-Za-z_]{0,20}", ".{0,40}"), 0..6)) {
        for input in [raw.clone(), pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";")] {
            if let Err(e) = cni::CniArgs::parse(&input) {
                assert_valid_error(&e, &input);
            }
        }
    }

    #[test]
    fn prev_results_convert_or_fail_cleanly(value in any_json(), v in 0usize..7) {
        let version = CniVersion::parse(cni::version::SUPPORTED_VERSIONS[v]).unwrap_or(CniVersion::LATEST);
        let shown = value.to_string().chars().take(200).collect::<String>();
        match CniOutput::from_json(&value, version, "prevResult") {
            Err(e) => assert_valid_error(&e, &shown),
            Ok(out) => {
                for target in cni::version::SUPPORTED_VERSIONS {
                    let target = CniVersion::parse(target).unwrap_or(CniVersion::LATEST);
                    if let Err(e) = out.to_json(target) {
                        assert_valid_error(&e, &shown);
                    }
                }
            }
        }
    }

    #[test]
    fn gc_attachment_lists_never_panic(value in any_json(), bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut conf = valid_conf();
        conf["cni.dev/valid-attachments"] = value;
        for input in [conf.to_string().into_bytes(), bytes] {
            let shown = String::from_utf8_lossy(&input).chars().take(200).collect::<String>();
            if let Err(e) = cni::conf::gc_attachments(&input) {
                assert_valid_error(&e, &shown);
            }
        }
    }

    #[test]
    fn identities_are_validated_never_trusted(id in prop_oneof![".{0,80}".boxed(), any_json().prop_map(|v| v.to_string()).boxed()]) {
        if let Err(why) = sticky_ipam::claim::validate_identity(&id) {
            assert!(!why.is_empty());
        } else {
            // What passes has no path tricks and no control characters.
            assert!(!id.contains('\0') && !id.chars().any(char::is_control), "{id:?}");
        }
    }
}
