use super::*;
use crate::cni::{code, IpConfig, Route};
use crate::datapath::fake::FakeNetlink;
use crate::datapath::{LinkState, Netlink, NewMacvlan, Ns};
use link::is_our_leftover;

fn fake() -> FakeNetlink {
    FakeNetlink::new()
        .with_device(Ns::Node, "uplink0", 1500)
        .with_default_route(Ns::Node, "uplink0")
}

#[test]
fn del_removes_the_interface_and_leftovers_of_a_killed_add_only() {
    let mut nl = fake().with_device(Ns::Pod, "eth0", 1500);
    let master = resolve_master(&mut nl, Some("uplink0"), false, 0).unwrap();
    create_link(&mut nl, "net1", "t", &master, &spec()).unwrap();
    // An ADD killed between create and rename left its temporary name.
    let leftover = NewMacvlan {
        tmp_name: tmp_name(),
        master_index: master.index,
        master_ns: master.ns,
        mode: MacvlanMode::Bridge,
        mtu: None,
        mac: None,
        bc_queue_len: None,
    };
    nl.create_macvlan(&leftover).unwrap();
    remove_link(&mut nl, "net1").unwrap();
    assert!(nl.link(Ns::Pod, "net1").is_none());
    assert!(nl.link(Ns::Pod, &leftover.tmp_name).is_none());
    assert!(nl.link(Ns::Pod, "eth0").is_some());
    // Idempotent: nothing left to remove is not an error.
    remove_link(&mut nl, "net1").unwrap();
}

#[test]
fn a_retried_add_replaces_only_its_own_interface() {
    let mut nl = fake();
    let master = resolve_master(&mut nl, Some("uplink0"), false, 0).unwrap();
    let mine = owner_alias("c1", "net1");
    let first = create_link(&mut nl, "net1", &mine, &master, &spec()).unwrap();
    // Another attachment's retry leaves it alone, and is refused.
    replace_own_leftover(&mut nl, "net1", &owner_alias("c2", "net1")).unwrap();
    assert!(create_link(&mut nl, "net1", "other", &master, &spec()).is_err());
    assert_eq!(nl.link(Ns::Pod, "net1").unwrap().state.index, first.index);
    // The same attachment's retry replaces it.
    replace_own_leftover(&mut nl, "net1", &mine).unwrap();
    let again = create_link(&mut nl, "net1", &mine, &master, &spec()).unwrap();
    assert_ne!(again.index, first.index);
    assert_eq!(owner_alias(&"x".repeat(400), "net1").len(), 255);
}

#[test]
fn only_our_temporary_names_count_as_leftovers() {
    let state = |name: &str, kind: Option<&str>| LinkState {
        index: 1,
        name: name.into(),
        mtu: 1500,
        mac: None,
        kind: kind.map(String::from),
        macvlan_mode: None,
        up: false,
        alias: None,
        port_kind: None,
    };
    assert!(is_our_leftover(&state("smv0a1b2c3d", Some("macvlan"))));
    for (name, kind) in [
        ("smv0a1b2c3d", Some("veth")),
        ("smv0a1b2c3d", None),
        ("smv0a1b2c3", Some("macvlan")),
        ("smvzzzzzzzz", Some("macvlan")),
        ("net1", Some("macvlan")),
    ] {
        assert!(!is_our_leftover(&state(name, kind)), "{name} {kind:?}");
    }
}

fn spec() -> LinkSpec {
    LinkSpec {
        mode: MacvlanMode::Bridge,
        mtu: 0,
        mac: None,
        bc_queue_len: None,
    }
}

fn ip(s: &str, gw: Option<&str>) -> IpConfig {
    IpConfig {
        interface: Some(0),
        address: s.parse().unwrap(),
        gateway: gw.map(|g| g.parse().unwrap()),
    }
}

#[test]
fn sticky_macs_are_local_unicast_and_follow_the_address() {
    let a = sticky_mac("fabric", "172.31.59.2".parse().unwrap());
    assert_eq!(a[0] & 0x03, 0x02, "locally administered, unicast");
    assert_eq!(&a[2..], &[172, 31, 59, 2]);
    assert_eq!(a, sticky_mac("fabric", "172.31.59.2".parse().unwrap()));
    assert_ne!(a, sticky_mac("fabric", "172.31.59.3".parse().unwrap()));
    assert_ne!(a, sticky_mac("other", "172.31.59.2".parse().unwrap()));
    let v6 = sticky_mac("fabric", "fd00::1:2".parse().unwrap());
    assert_eq!(&v6[2..], &[0, 1, 0, 2]);
}

#[test]
fn master_from_config_or_default_route() {
    let mut nl = fake();
    assert_eq!(
        resolve_master(&mut nl, Some("uplink0"), false, 0)
            .unwrap()
            .name,
        "uplink0"
    );
    assert_eq!(
        resolve_master(&mut nl, None, false, 1500).unwrap().name,
        "uplink0"
    );
}

#[test]
fn master_errors_are_config_errors_naming_the_master() {
    let mut nl = fake();
    let e = resolve_master(&mut nl, Some("nope0"), false, 0).unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG);
    assert!(e.msg.contains("\"nope0\""));
    let e = resolve_master(&mut nl, Some("uplink0"), false, 1501).unwrap_err();
    assert!(
        e.msg.contains("1501") && e.msg.contains("1500"),
        "{}",
        e.msg
    );
    let e = resolve_master(&mut nl, None, true, 0).unwrap_err();
    assert!(e.msg.contains("default route"), "{}", e.msg);
}

#[test]
fn link_in_container_looks_in_the_pod() {
    let mut nl = FakeNetlink::new().with_device(Ns::Pod, "podup", 9000);
    let m = resolve_master(&mut nl, Some("podup"), true, 9000).unwrap();
    assert_eq!(m.ns, Ns::Pod);
    assert!(resolve_master(&mut nl, Some("podup"), false, 0).is_err());
}

#[test]
fn create_renames_into_place() {
    let mut nl = fake();
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    assert_eq!(nl.link_names(Ns::Pod), vec!["net1"]);
    assert_eq!(link.name, "net1");
    let l = nl.link(Ns::Pod, "net1").unwrap();
    assert_eq!(l.state.mtu, 1500);
    assert!(!l.state.up, "a new link stays down until configured");
}

#[test]
fn temp_name_clash_is_retried() {
    let mut nl = fake().fail("create_macvlan", libc::EEXIST);
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    let creates = nl
        .calls
        .iter()
        .filter(|c| c.starts_with("create_macvlan"))
        .count();
    assert_eq!(creates, 2);
}

#[test]
fn existing_ifname_fails_and_leaves_nothing() {
    let mut nl = fake().with_device(Ns::Pod, "net1", 1500);
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let e = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap_err();
    assert!(e.msg.contains("already exists"), "{}", e.msg);
    assert_eq!(
        nl.link_names(Ns::Pod),
        vec!["net1"],
        "the temporary link is removed"
    );
}

#[test]
fn create_failure_is_reported_with_master() {
    let mut nl = fake().fail("create_macvlan", libc::EPERM);
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let e = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap_err();
    assert_eq!(e.code, code::DATAPATH);
    assert!(e.msg.contains("uplink0"));
    assert!(nl.link_names(Ns::Pod).is_empty());
}

#[test]
fn l3_config_uses_gateway_fallback_per_family() {
    let mut nl = fake();
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    let ips = [
        ip("10.0.0.5/24", Some("10.0.0.1")),
        ip("fd00::5/64", Some("fd00::1")),
    ];
    let routes = [
        Route::new("0.0.0.0/0".parse().unwrap(), None),
        Route::new(
            "10.9.0.0/16".parse().unwrap(),
            Some("10.0.0.254".parse().unwrap()),
        ),
        Route::new("::/0".parse().unwrap(), None),
    ];
    configure_l3(&mut nl, &link, &ips, &routes).unwrap();
    let added: Vec<_> = nl
        .calls
        .iter()
        .filter(|c| c.starts_with("add_route"))
        .cloned()
        .collect();
    assert_eq!(
        added,
        vec![
            format!("add_route Pod 0.0.0.0/0 via 10.0.0.1 dev {}", link.index),
            format!(
                "add_route Pod 10.9.0.0/16 via 10.0.0.254 dev {}",
                link.index
            ),
            format!("add_route Pod ::/0 via fd00::1 dev {}", link.index),
        ]
    );
    assert!(nl.link(Ns::Pod, "net1").unwrap().state.up);
    assert_eq!(
        nl.sysctls
            .get(&(Ns::Pod, "net/ipv4/conf/net1/arp_notify".into()))
            .map(String::as_str),
        Some("1")
    );
}

#[test]
fn route_without_any_gateway_is_on_link() {
    let mut nl = fake();
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    configure_l3(
        &mut nl,
        &link,
        &[ip("10.0.0.5/24", None)],
        &[Route::new("10.8.0.0/16".parse().unwrap(), None)],
    )
    .unwrap();
    assert!(nl
        .calls
        .contains(&format!("add_route Pod 10.8.0.0/16 dev {}", link.index)));
}

#[test]
fn ipv6_is_enabled_when_disabled() {
    let mut nl = fake();
    nl.sysctls.insert(
        (Ns::Pod, "net/ipv6/conf/lo/disable_ipv6".into()),
        "1".into(),
    );
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    configure_l3(&mut nl, &link, &[ip("fd00::5/64", None)], &[]).unwrap();
    assert_eq!(
        nl.sysctls[&(Ns::Pod, "net/ipv6/conf/lo/disable_ipv6".into())],
        "0"
    );
}

#[test]
fn sysctl_failures_do_not_fail_the_add() {
    let mut nl = fake().fail("write_sysctl", libc::EACCES);
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    configure_l3(&mut nl, &link, &[ip("10.0.0.5/24", None)], &[]).unwrap();
}

#[test]
fn address_failure_is_named_and_discard_removes_link() {
    let mut nl = fake().fail("add_address", libc::EINVAL);
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    let e = configure_l3(&mut nl, &link, &[ip("10.0.0.5/24", None)], &[]).unwrap_err();
    assert!(e.msg.contains("10.0.0.5/24"), "{}", e.msg);
    discard_link(&mut nl, &link).unwrap();
    assert!(nl.link_names(Ns::Pod).is_empty());
}

#[test]
fn remove_is_idempotent() {
    let mut nl = fake();
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    remove_link(&mut nl, "net1").unwrap();
    remove_link(&mut nl, "net1").unwrap();
    assert!(nl.link_names(Ns::Pod).is_empty());
}

#[test]
fn remove_reports_real_failures() {
    let mut nl = fake();
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    let mut nl = nl.fail("delete_link", libc::EBUSY);
    let e = remove_link(&mut nl, "net1").unwrap_err();
    assert!(e.msg.contains("net1"));
}

fn configured() -> (FakeNetlink, CreatedLink, Vec<Route>) {
    let mut nl = fake();
    let m = resolve_master(&mut nl, None, false, 0).unwrap();
    let link = create_link(&mut nl, "net1", "t", &m, &spec()).unwrap();
    let routes = vec![Route::new("0.0.0.0/0".parse().unwrap(), None)];
    configure_l3(
        &mut nl,
        &link,
        &[ip("10.0.0.5/24", Some("10.0.0.1"))],
        &routes,
    )
    .unwrap();
    (nl, link, routes)
}

#[test]
fn check_passes_on_what_add_built() {
    let (mut nl, link, routes) = configured();
    let mac = link.mac_string();
    let want = Expected {
        ifname: "net1",
        mode: MacvlanMode::Bridge,
        mac: mac.as_deref(),
        ips: vec!["10.0.0.5/24".parse().unwrap()],
        routes: &routes,
    };
    check_link(&mut nl, &want).unwrap();
}

#[test]
fn check_catches_each_kind_of_drift() {
    let (mut nl, link, routes) = configured();
    let mac = link.mac_string();
    let base = || Expected {
        ifname: "net1",
        mode: MacvlanMode::Bridge,
        mac: mac.as_deref(),
        ips: vec!["10.0.0.5/24".parse().unwrap()],
        routes: &routes,
    };
    let other_routes = [Route::new("10.7.0.0/16".parse().unwrap(), None)];
    let cases: Vec<(Expected, &str)> = vec![
        (
            Expected {
                ifname: "net9",
                ..base()
            },
            "not in the pod netns",
        ),
        (
            Expected {
                mode: MacvlanMode::Vepa,
                ..base()
            },
            "mode bridge",
        ),
        (
            Expected {
                mac: Some("02:00:00:00:00:99"),
                ..base()
            },
            "has MAC",
        ),
        (
            Expected {
                ips: vec!["10.0.0.6/24".parse().unwrap()],
                ..base()
            },
            "10.0.0.6/24",
        ),
        (
            Expected {
                routes: &other_routes,
                ..base()
            },
            "10.7.0.0/16",
        ),
    ];
    for (want, needle) in cases {
        let e = check_link(&mut nl, &want).unwrap_err();
        assert_eq!(e.code, code::CHECK_MISMATCH);
        assert!(e.msg.contains(needle), "{} lacks {needle}", e.msg);
    }
}
