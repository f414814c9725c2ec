use super::import::{
    check_host_local_dir, is_host_local_entry, parse_host_local, whereabouts_allocations,
};
use super::*;

#[test]
fn only_a_host_local_network_directory_is_imported() {
    let root = std::env::temp_dir().join(format!("smv-import-{}", std::process::id()));
    let net = root.join("fabric");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.0.0.5"), "c1\r\nnet1").unwrap();
    std::fs::write(net.join("lock"), "").unwrap();
    assert!(check_host_local_dir(&net, "fabric").is_ok());
    let e = check_host_local_dir(&root, "fabric").unwrap_err();
    assert!(
        e.msg.contains("parent") && e.msg.contains("--from") && e.msg.contains("fabric"),
        "{}",
        e.msg
    );
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = check_host_local_dir(&empty, "fabric").unwrap_err();
    assert!(
        e.msg.contains("holds no host-local allocations"),
        "{}",
        e.msg
    );
    assert!(check_host_local_dir(&root.join("missing"), "fabric").is_err());
    for (name, host_local) in [
        ("10.0.0.5", true),
        ("fd00::5", true),
        ("lock", true),
        ("last_reserved_ip.0", true),
        ("fabric", false),
        ("README", false),
    ] {
        assert_eq!(is_host_local_entry(name), host_local, "{name}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn host_local_records_both_formats() {
    assert_eq!(
        parse_host_local("abc\r\nnet1"),
        Some(("abc".into(), "net1".into()))
    );
    assert_eq!(parse_host_local("abc"), Some(("abc".into(), "eth0".into())));
    assert_eq!(parse_host_local(""), None);
}

#[test]
fn options_are_checked() {
    let args: Vec<String> = ["--network", "n", "--json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let o = parse_opts(&args).unwrap();
    assert_eq!(o.network.as_deref(), Some("n"));
    assert!(o.flag("--json"));
    assert!(parse_opts(&["--bogus".to_string()]).is_err());
    assert!(parse_opts(&["--ip".to_string()]).is_err());
}

#[test]
fn ages_read_like_kubectl() {
    assert_eq!(age(0, 5), "5s");
    assert_eq!(age(0, 600), "10m");
    assert_eq!(age(0, 7200), "2h");
    assert_eq!(age(0, 3 * 86400), "3d");
}

#[test]
fn whereabouts_allocations_are_offsets_from_their_pools_range() {
    use serde_json::json;
    let pools = vec![
        json!({"metadata": {"name": "172.31.66.0-24"}, "spec": {"range": "172.31.66.0/24", "allocations": {
            "10": {"id": "c1", "podref": "db/a-0", "ifname": "net1"},
            "200": {"id": "c2", "podref": "db/a-1"}
        }}}),
        json!({"metadata": {"name": "other"}, "spec": {"range": "10.9.0.0/16", "allocations": {
            "5": {"id": "c3", "podref": "x/y"}
        }}}),
        json!({"metadata": {"name": "fd00-31-66---64"}, "spec": {"range": "fd00:31:66::/64", "allocations": {
            "4096": {"id": "c4", "podref": "db/a-0", "ifname": "net2"}
        }}}),
    ];
    let v4: ipnet::IpNet = "172.31.66.0/24".parse().unwrap();
    let got = whereabouts_allocations(&pools, &v4, "eth9").unwrap();
    let rows: Vec<(String, &str, &str, &str)> = got
        .iter()
        .map(|a| {
            (
                a.ip.to_string(),
                a.container_id.as_str(),
                a.ifname.as_str(),
                a.podref.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("172.31.66.10".to_string(), "c1", "net1", "db/a-0"),
            ("172.31.66.200".to_string(), "c2", "eth9", "db/a-1"),
        ]
    );
    let v6: ipnet::IpNet = "fd00:31:66::/64".parse().unwrap();
    let got = whereabouts_allocations(&pools, &v6, "net1").unwrap();
    assert_eq!(got[0].ip.to_string(), "fd00:31:66::1000");
    // A range with no pool adopts nothing; damaged pools are named.
    let none: ipnet::IpNet = "192.168.0.0/24".parse().unwrap();
    assert!(whereabouts_allocations(&pools, &none, "net1")
        .unwrap()
        .is_empty());
    for (bad, says) in [
        (
            json!({"metadata": {"name": "p"}, "spec": {"range": "172.31.66.0/24", "allocations": {"300": {"id": "c", "podref": "a/b"}}}}),
            "not an offset inside",
        ),
        (
            json!({"metadata": {"name": "p"}, "spec": {"range": "172.31.66.0/24", "allocations": {"x": {"id": "c", "podref": "a/b"}}}}),
            "not an offset",
        ),
        (
            json!({"metadata": {"name": "p"}, "spec": {"range": "172.31.66.0/24", "allocations": {"3": {"id": "c"}}}}),
            "lacks id or podref",
        ),
        (
            json!({"metadata": {"name": "p"}, "spec": {}}),
            "IPPool p has no valid spec.range",
        ),
    ] {
        let e = whereabouts_allocations(&[bad], &v4, "net1").unwrap_err();
        assert!(e.contains(says), "{e}");
    }
}
