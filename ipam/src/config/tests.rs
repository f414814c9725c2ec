use super::*;
use crate::addr::Family;
use serde_json::json;

fn parse(v: Value) -> CniResult<IpamConfig> {
    IpamConfig::parse("net", &v)
}

fn err(v: Value) -> String {
    let e = parse(v).unwrap_err();
    assert_eq!(e.code, cni::code::INVALID_CONFIG, "{}", e.msg);
    e.msg
}

#[test]
fn host_local_single_subnet_defaults() {
    let c = parse(json!({"type": "sticky-ipam", "subnet": "10.0.0.0/24"})).unwrap();
    let r = &c.range_sets[0].ranges[0];
    assert_eq!(r.start.to_string(), "10.0.0.1");
    assert_eq!(r.end.to_string(), "10.0.0.254");
    assert_eq!(r.gateway.unwrap().to_string(), "10.0.0.1");
    assert_eq!(c.store_dir, PathBuf::from(DEFAULT_STORE_DIR));
    assert_eq!(c.policy, IdentityPolicy::Dynamic);
}

#[test]
fn dual_stack_ranges_and_data_dir() {
    let c = parse(json!({
        "ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.20"}],
                   [{"subnet": "fd00::/64"}]],
        "dataDir": "/tmp/x",
        "reservations": {"peer-a": ["10.0.0.12", "fd00::12"]},
    }))
    .unwrap();
    assert_eq!(c.range_sets.len(), 2);
    assert_eq!(c.range_sets[1].family(), Family::V6);
    assert_eq!(c.store_dir, PathBuf::from("/tmp/x"));
    assert_eq!(c.reserved_for("fd00::12".parse().unwrap()), Some("peer-a"));
    assert_eq!(c.set_of("fd00::ffff".parse().unwrap()), Some(1));
    assert_eq!(c.store, StoreKind::File);
}

#[test]
fn kubernetes_store_defaults() {
    let c = parse(json!({"subnet": "10.0.0.0/24", "store": {"type": "kubernetes"}})).unwrap();
    assert_eq!(
        c.store,
        StoreKind::Kubernetes {
            kubeconfig: PathBuf::from(DEFAULT_KUBECONFIG),
            timeout: std::time::Duration::from_millis(DEFAULT_KUBE_TIMEOUT_MS),
        }
    );
    assert_eq!(c.store_dir, PathBuf::from(DEFAULT_STORE_DIR));
}

#[test]
fn a_single_address_range_is_valid() {
    let c = parse(json!({"subnet": "172.31.59.0/24", "rangeStart": "172.31.59.2", "rangeEnd": "172.31.59.2", "gateway": "172.31.59.1"})).unwrap();
    assert_eq!(c.range_sets[0].describe(), "172.31.59.2-172.31.59.2");
}

#[test]
fn huge_v6_ranges_are_accepted_without_enumeration() {
    let c = parse(json!({"subnet": "fd00::/48"})).unwrap();
    assert_eq!(c.range_sets[0].ranges[0].span().count(), (1u128 << 80) - 1);
}

#[test]
fn invalid_configs_name_the_field_and_reason() {
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "no ranges"),
        (
            json!({"subnet": "nope"}),
            "ipam.subnet \"nope\" is not a CIDR",
        ),
        (json!({"subnet": "10.0.0.5/24"}), "host bits"),
        (json!({"subnet": "10.0.0.0/31"}), "too small"),
        (
            json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"}),
            "rangeStart 10.0.1.5 is outside",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.5"}),
            "after rangeEnd",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "rangeEnd": "x"}),
            "rangeEnd \"x\" is not an IP",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}),
            "gateway 10.0.1.1 is outside its subnet",
        ),
        (
            json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/25"}]]}),
            "overlap",
        ),
        (
            json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}),
            "mixes address families",
        ),
        (json!({"ranges": [[]]}), "empty range set"),
        (
            json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.1", "rangeEnd": "10.0.0.1"}),
            "no allocatable address",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.4", "rangeEnd": "10.0.0.7", "exclude": ["10.0.0.4/30"]}),
            "no allocatable address",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "exclude": ["zz"]}),
            "exclude entry \"zz\"",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "reservations": {"a": "10.0.1.2"}}),
            "outside every configured range",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "reservations": {"a": "10.0.0.1"}}),
            "gateway",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "reservations": {"a": "10.0.0.2", "b": "10.0.0.2"}}),
            "gives 10.0.0.2 to both",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "reservations": {"a": ["10.0.0.2", "10.0.0.3"]}}),
            "same range set",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "reservations": {"": "10.0.0.2"}}),
            "reservations key",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "identity": "a\u{0}b"}),
            "ipam.identity",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "identityPolicy": "magic"}),
            "identityPolicy \"magic\"",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "store": {"type": "etcd"}}),
            "ipam.store.type \"etcd\"",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "store": {"type": "kubernetes", "kubeconfig": "kc"}}),
            "ipam.store.kubeconfig kc",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "store": {"type": "kubernetes", "timeoutMs": 5}}),
            "ipam.store.timeoutMs 5",
        ),
        (
            json!({"subnet": "10.0.0.0/24", "dataDir": "relative/dir"}),
            "absolute",
        ),
        (json!({"subnet": 5}), "ipam.subnet is invalid"),
        (json!({"subnet": "10.0.0.0/24", "maxScan": 0}), "maxScan"),
    ];
    for (input, want) in cases {
        let msg = err(input.clone());
        assert!(msg.contains(want), "{input}: {msg:?} lacks {want:?}");
    }
}

#[test]
fn retention_defaults_to_the_old_rules_and_names_a_bad_policy() {
    use crate::claim::{Retention, RetentionPolicy::*};
    let base = json!({"subnet": "10.0.0.0/24"});
    assert_eq!(parse(base.clone()).unwrap().retention, Retention::default());
    let mut v = base.clone();
    v["retention"] = json!({"whenScaled": "Delete", "whenDeleted": "Retain"});
    assert_eq!(
        parse(v).unwrap().retention,
        Retention {
            when_scaled: Delete,
            when_deleted: Retain
        }
    );
    let mut v = base.clone();
    v["retention"] = json!({"whenScaled": "Delete"});
    assert_eq!(parse(v).unwrap().retention.when_deleted, Delete);
    for (bad, says) in [
        (
            json!({"whenScaled": "delete"}),
            "ipam.retention.whenScaled is invalid",
        ),
        (json!("Delete"), "ipam.retention is invalid"),
    ] {
        let mut v = base.clone();
        v["retention"] = bad;
        let msg = err(v);
        assert!(msg.contains(says), "{msg}");
    }
    let mut v = base;
    v["retention"] = json!({"whenScaled": "Delete", "whenScaledDown": "Delete"});
    let e = parse(v).unwrap_err();
    assert_eq!(e.code, cni::code::UNSUPPORTED_FIELD, "{}", e.msg);
    assert!(e.msg.contains("whenScaledDown"), "{}", e.msg);
}

#[test]
fn the_kubernetes_store_refuses_two_range_sets_of_one_family() {
    // An IPClaim is one object per (network, identity, family): a second
    // v4 set would make every ADD fight itself for that one name.
    let two_v4 = json!([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.1.0/24"}]]);
    let msg = err(json!({"ranges": two_v4.clone(), "store": {"type": "kubernetes"}}));
    assert!(
        msg.contains("ipam.ranges") && msg.contains("ipam.ranges[1]") && msg.contains("IPv4"),
        "{msg}"
    );
    let two_v6 = json!([[{"subnet": "fd00::/120"}], [{"subnet": "fd01::/120"}]]);
    let msg = err(json!({"ranges": two_v6, "store": {"type": "kubernetes"}}));
    assert!(
        msg.contains("ipam.ranges[1]") && msg.contains("IPv6"),
        "{msg}"
    );
    // One set per family is what the kubernetes store supports; the file
    // store keys claims by address and keeps one per range set.
    let dual = json!([[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/120"}]]);
    assert!(parse(json!({"ranges": dual, "store": {"type": "kubernetes"}})).is_ok());
    // The top-level subnet is a range set too.
    let msg = err(
        json!({"subnet": "10.0.0.0/24", "ranges": [[{"subnet": "10.0.1.0/24"}]], "store": {"type": "kubernetes"}}),
    );
    assert!(
        msg.contains("ipam.ranges[0]") && msg.contains("ipam.subnet"),
        "{msg}"
    );
    assert_eq!(
        parse(json!({"ranges": two_v4})).unwrap().range_sets.len(),
        2
    );
}
