use super::import::{check_host_local_dir, is_host_local_entry, parse_host_local};
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
