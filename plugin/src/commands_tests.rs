use super::*;
use crate::cni::IpConfig;
use crate::datapath::fake::FakeNetlink;
use serde_json::json;

#[derive(Default)]
struct FakeIpam {
    fail_prepare: bool,
    fail_add: bool,
    adds: usize,
    dels: usize,
    result: Option<CniOutput>,
    taken: Vec<std::net::IpAddr>,
}

impl Ipam for FakeIpam {
    fn prepare_add(&mut self) -> CniResult<crate::ipam_driver::Prepared> {
        if self.fail_prepare {
            return Err(CniError::invalid_config("args.cni.identity is empty"));
        }
        Ok(crate::ipam_driver::Prepared::Nothing)
    }
    fn add(
        &mut self,
        _prepared: crate::ipam_driver::Prepared,
        probe_fresh: bool,
    ) -> CniResult<crate::ipam_driver::Allocation> {
        self.adds += 1;
        if self.fail_add {
            return Err(CniError::new(code::TRY_AGAIN_LATER, "pool busy"));
        }
        let result = self.result.clone().unwrap_or(CniOutput {
            ips: vec![IpConfig {
                interface: None,
                address: "10.0.0.5/24".parse().unwrap(),
                gateway: Some("10.0.0.1".parse().unwrap()),
            }],
            routes: vec![crate::cni::Route::new("0.0.0.0/0".parse().unwrap(), None)],
            ..CniOutput::default()
        });
        let unproven = if probe_fresh {
            result.ips.iter().map(|i| i.address.addr()).collect()
        } else {
            self.taken.clone()
        };
        Ok(crate::ipam_driver::Allocation::undone_by_del(
            result, unproven,
        ))
    }
    fn undo_add(&mut self, _allocation: crate::ipam_driver::Allocation) -> CniResult<()> {
        self.del()
    }
    fn del(&mut self) -> CniResult<()> {
        self.dels += 1;
        Ok(())
    }
    fn check(&mut self) -> CniResult<()> {
        Ok(())
    }
    fn status(&mut self) -> CniResult<()> {
        Ok(())
    }
    fn gc(&mut self, _keep: &[(String, String)]) -> CniResult<()> {
        Ok(())
    }
}

fn env() -> CniEnv {
    CniEnv {
        command: Command::Add,
        container_id: "c1".into(),
        netns: "/run/netns/p1".into(),
        ifname: "net1".into(),
        args: String::new(),
        path: "/opt/cni/bin".into(),
    }
}

fn conf(version: &str, extra: Value) -> NetConf {
    let mut base =
        json!({"cniVersion": version, "name": "n", "type": "sticky-macvlan", "master": "uplink0"});
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    NetConf::parse(base.to_string().as_bytes()).unwrap()
}

fn nl() -> FakeNetlink {
    FakeNetlink::new().with_device(Ns::Node, "uplink0", 1500)
}

#[test]
fn l3_add_wires_everything_and_answers_in_version() {
    let mut nl = nl();
    let mut ipam = FakeIpam::default();
    let out = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap();
    assert_eq!(out["interfaces"][0]["name"], "net1");
    assert_eq!(out["interfaces"][0]["sandbox"], "/run/netns/p1");
    assert_eq!(out["ips"][0]["interface"], 0);
    assert_eq!(out["ips"][0]["address"], "10.0.0.5/24");
    assert_eq!(nl.link(Ns::Pod, "net1").unwrap().addrs.len(), 1);
}

#[test]
fn a_taken_over_address_is_probed_refused_when_answered_and_announced_when_not() {
    let taken = FakeIpam {
        taken: vec!["10.0.0.5".parse().unwrap()],
        ..FakeIpam::default()
    };
    // Fresh allocation: no probe, no announcement (arp_notify does it).
    let mut quiet = nl();
    add(
        &env(),
        &conf("1.0.0", json!({})),
        &mut quiet,
        Some(&mut FakeIpam::default()),
    )
    .unwrap();
    assert!(
        !quiet
            .calls
            .iter()
            .any(|c| c.starts_with("arp_") || c.starts_with("probe_")),
        "{:?}",
        quiet.calls
    );
    // Taken over, nobody answers: probed before the address, announced after.
    let mut free = nl();
    let mut ipam = FakeIpam {
        taken: taken.taken.clone(),
        ..FakeIpam::default()
    };
    add(
        &env(),
        &conf("1.0.0", json!({})),
        &mut free,
        Some(&mut ipam),
    )
    .unwrap();
    let pos = |nl: &FakeNetlink, p: &str| nl.calls.iter().position(|c| c.starts_with(p));
    let probe = pos(&free, "probe_addresses").expect("probed");
    let addr = pos(&free, "add_address").expect("address added");
    let announce = pos(&free, "arp_announce").expect("announced");
    assert!(probe < addr && addr < announce, "{:?}", free.calls);
    // Taken over, the old holder answers: 11 naming its MAC, undone.
    let mut busy = nl();
    busy.arp_owners
        .insert("10.0.0.5".parse().unwrap(), [2, 0, 0, 0, 0, 0x42]);
    let mut ipam = FakeIpam {
        taken: taken.taken.clone(),
        ..FakeIpam::default()
    };
    let e = add(
        &env(),
        &conf("1.0.0", json!({})),
        &mut busy,
        Some(&mut ipam),
    )
    .unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(
        e.msg.contains("02:00:00:00:00:42") && e.msg.contains("10.0.0.5"),
        "{}",
        e.msg
    );
    assert!(busy.link_names(Ns::Pod).is_empty());
    assert_eq!(ipam.dels, 1, "the IPAM's ADD is undone");
    assert!(pos(&busy, "add_address").is_none());
    // Probing off: no probe even on a takeover.
    let mut off = nl();
    off.arp_owners
        .insert("10.0.0.5".parse().unwrap(), [2, 0, 0, 0, 0, 0x42]);
    let mut ipam = FakeIpam {
        taken: taken.taken.clone(),
        ..FakeIpam::default()
    };
    add(
        &env(),
        &conf("1.0.0", json!({"probe": {"riskDuplicateAddresses": true}})),
        &mut off,
        Some(&mut ipam),
    )
    .unwrap();
    assert!(pos(&off, "probe_addresses").is_none(), "{:?}", off.calls);
    // probe.fresh: fresh allocations are probed too.
    let mut fresh = nl();
    add(
        &env(),
        &conf("1.0.0", json!({"probe": {"fresh": true}})),
        &mut fresh,
        Some(&mut FakeIpam::default()),
    )
    .unwrap();
    assert!(pos(&fresh, "probe_addresses").is_some());
}

#[test]
fn an_unproven_ipv6_address_is_probed_by_dad_and_refused_naming_the_mac() {
    let v6 = || CniOutput {
        ips: vec![IpConfig {
            interface: None,
            address: "fd00:59::2/64".parse().unwrap(),
            gateway: None,
        }],
        ..CniOutput::default()
    };
    let unproven = vec!["fd00:59::2".parse().unwrap()];
    let mut busy = nl();
    busy.ndp_owners
        .insert("fd00:59::2".parse().unwrap(), [2, 0, 0, 0, 0, 0x66]);
    let mut ipam = FakeIpam {
        result: Some(v6()),
        taken: unproven.clone(),
        ..FakeIpam::default()
    };
    let e = add(
        &env(),
        &conf("1.0.0", json!({})),
        &mut busy,
        Some(&mut ipam),
    )
    .unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(
        e.msg.contains("02:00:00:00:00:66") && e.msg.contains("duplicate address detection"),
        "{}",
        e.msg
    );
    assert!(busy.link_names(Ns::Pod).is_empty());
    assert!(!busy.calls.iter().any(|c| c.starts_with("add_address")));
    // Nobody answers: probed before the address is added, then bound.
    let mut free = nl();
    let mut ipam = FakeIpam {
        result: Some(v6()),
        taken: unproven,
        ..FakeIpam::default()
    };
    add(
        &env(),
        &conf("1.0.0", json!({})),
        &mut free,
        Some(&mut ipam),
    )
    .unwrap();
    let pos = |p: &str| free.calls.iter().position(|c| c.starts_with(p));
    assert!(pos("probe_addresses").unwrap() < pos("add_address").unwrap());
}

#[test]
fn sticky_mac_follows_the_address_unless_a_mac_is_given() {
    let mut n = nl();
    let out = add(
        &env(),
        &conf("1.0.0", json!({"stickyMac": true})),
        &mut n,
        Some(&mut FakeIpam::default()),
    )
    .unwrap();
    let want = crate::datapath::format_mac(&macvlan::sticky_mac("n", "10.0.0.5".parse().unwrap()));
    assert_eq!(out["interfaces"][0]["mac"], want.as_str());
    let set = n
        .calls
        .iter()
        .position(|c| c.starts_with("set_link_mac"))
        .expect("MAC set");
    let up = n
        .calls
        .iter()
        .position(|c| c.starts_with("set_link_up"))
        .expect("link up");
    assert!(
        set < up,
        "the MAC is set while the link is down: {:?}",
        n.calls
    );
    let mut given = nl();
    let out = add(
        &env(),
        &conf(
            "1.0.0",
            json!({"stickyMac": true, "mac": "02:aa:bb:cc:dd:ee"}),
        ),
        &mut given,
        Some(&mut FakeIpam::default()),
    )
    .unwrap();
    assert_eq!(out["interfaces"][0]["mac"], "02:aa:bb:cc:dd:ee");
    assert!(!given.calls.iter().any(|c| c.starts_with("set_link_mac")));
}

#[test]
fn gateway_check_fails_the_add_when_the_gateway_is_silent() {
    let mut silent = nl();
    let mut ipam = FakeIpam::default();
    let e = add(
        &env(),
        &conf("1.0.0", json!({"gatewayCheck": true})),
        &mut silent,
        Some(&mut ipam),
    )
    .unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(
        e.msg.contains("gateway 10.0.0.1 did not answer"),
        "{}",
        e.msg
    );
    assert!(silent.link_names(Ns::Pod).is_empty());
    assert_eq!(ipam.dels, 1);
    let mut answered = nl();
    answered
        .arp_owners
        .insert("10.0.0.1".parse().unwrap(), [2, 0, 0, 0, 0, 1]);
    add(
        &env(),
        &conf("1.0.0", json!({"gatewayCheck": true})),
        &mut answered,
        Some(&mut FakeIpam::default()),
    )
    .unwrap();
    let mut off = nl();
    add(
        &env(),
        &conf("1.0.0", json!({})),
        &mut off,
        Some(&mut FakeIpam::default()),
    )
    .unwrap();
    assert!(!off.calls.iter().any(|c| c.starts_with("arp_resolve")));
}

#[test]
fn ipam_failure_removes_the_link_and_keeps_the_code() {
    let mut nl = nl();
    let mut ipam = FakeIpam {
        fail_add: true,
        ..FakeIpam::default()
    };
    let e = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(nl.link_names(Ns::Pod).is_empty());
    assert_eq!(
        ipam.dels, 0,
        "nothing was allocated, so nothing is released"
    );
}

#[test]
fn an_invalid_ipam_request_fails_before_the_link_exists() {
    let mut nl = nl();
    let mut ipam = FakeIpam {
        fail_prepare: true,
        ..FakeIpam::default()
    };
    let e = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG);
    assert!(!nl.calls.iter().any(|c| c.starts_with("create_macvlan")));
    assert_eq!(ipam.adds, 0);
}

#[test]
fn configure_failure_releases_ipam_and_removes_link() {
    let mut nl = nl().fail("add_route", libc::ENETUNREACH);
    let mut ipam = FakeIpam::default();
    let e = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap_err();
    assert!(e.msg.contains("0.0.0.0/0"), "{}", e.msg);
    assert!(nl.link_names(Ns::Pod).is_empty());
    assert_eq!(ipam.dels, 1);
}

#[test]
fn l2_with_legacy_version_fails_cleanly() {
    for v in ["0.1.0", "0.2.0"] {
        let mut nl = nl();
        let e = add(&env(), &conf(v, json!({})), &mut nl, None).unwrap_err();
        assert!(
            e.msg.starts_with("cannot convert: no valid IP addresses"),
            "{}",
            e.msg
        );
        assert!(
            nl.link_names(Ns::Pod).is_empty(),
            "{v}: the link is rolled back"
        );
    }
}

#[test]
fn l2_add_is_up_without_addresses() {
    let mut nl = nl();
    let out = add(
        &env(),
        &conf("0.3.1", json!({"dns": {"nameservers": ["10.0.0.53"]}})),
        &mut nl,
        None,
    )
    .unwrap();
    assert!(out.get("ips").is_none());
    assert_eq!(out["dns"]["nameservers"][0], "10.0.0.53");
    assert!(nl.link(Ns::Pod, "net1").unwrap().state.up);
}

#[test]
fn mac_precedence() {
    let c = conf(
        "1.0.0",
        json!({"mac": "02:00:00:00:00:01", "runtimeConfig": {"mac": "02:00:00:00:00:03"}}),
    );
    let args = CniArgs::parse("MAC=02:00:00:00:00:02").unwrap();
    assert_eq!(resolve_mac(&c, &args).unwrap(), Some([2, 0, 0, 0, 0, 3]));
    let c = conf("1.0.0", json!({"mac": "02:00:00:00:00:01"}));
    assert_eq!(resolve_mac(&c, &args).unwrap(), Some([2, 0, 0, 0, 0, 2]));
    assert_eq!(
        resolve_mac(&c, &CniArgs::default()).unwrap(),
        Some([2, 0, 0, 0, 0, 1])
    );
    let bad = conf("1.0.0", json!({"mac": "nope"}));
    let e = resolve_mac(&bad, &CniArgs::default()).unwrap_err();
    assert!(
        e.msg.contains("\"nope\"") && e.msg.contains("\"mac\""),
        "{}",
        e.msg
    );
}

#[test]
fn bad_mac_fails_before_anything_is_created() {
    let mut nl = nl();
    let mut e = env();
    e.args = "MAC=zz".into();
    let err = add(&e, &conf("1.0.0", json!({})), &mut nl, None).unwrap_err();
    assert_eq!(err.code, code::INVALID_CONFIG);
    assert!(!nl.calls.iter().any(|c| c.starts_with("create_macvlan")));
}

#[test]
fn prev_result_is_extended() {
    let mut nl = nl();
    let mut ipam = FakeIpam::default();
    let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/run/netns/p1"}],
        "ips": [{"interface": 0, "address": "192.168.0.2/24"}]});
    let out = add(
        &env(),
        &conf("1.0.0", json!({"prevResult": prev})),
        &mut nl,
        Some(&mut ipam),
    )
    .unwrap();
    assert_eq!(out["interfaces"].as_array().unwrap().len(), 2);
    assert_eq!(out["ips"][0]["address"], "192.168.0.2/24");
    assert_eq!(out["ips"][1]["interface"], 1);
}

#[test]
fn check_needs_prev_result() {
    let mut nl = nl();
    let e = check(&env(), &conf("1.0.0", json!({})), &mut nl, None).unwrap_err();
    assert!(e.msg.contains("prevResult"));
}

#[test]
fn check_after_add_passes_and_detects_a_removed_address() {
    let mut nl = nl();
    let mut ipam = FakeIpam::default();
    let out = add(&env(), &conf("1.0.0", json!({})), &mut nl, Some(&mut ipam)).unwrap();
    let c = conf("1.0.0", json!({"prevResult": out}));
    check(&env(), &c, &mut nl, Some(&mut ipam)).unwrap();
    let idx = nl.link(Ns::Pod, "net1").unwrap().state.index;
    for links in nl.links.values_mut() {
        for l in links.iter_mut().filter(|l| l.state.index == idx) {
            l.addrs.clear();
        }
    }
    let e = check(&env(), &c, &mut nl, Some(&mut ipam)).unwrap_err();
    assert!(e.msg.contains("10.0.0.5/24"), "{}", e.msg);
}

#[test]
fn status_reports_missing_master_as_unavailable() {
    let mut nl = FakeNetlink::new();
    let e = status(&conf("1.1.0", json!({})), &mut nl, None).unwrap_err();
    assert_eq!(e.code, code::STATUS_UNAVAILABLE);
    let mut nl = self::nl();
    status(&conf("1.1.0", json!({})), &mut nl, None).unwrap();
}

#[test]
fn del_releases_the_ipam_first_then_the_link_and_reports_every_failure() {
    // ADD, then DEL on the same fake pod netns.
    let mut pod = nl();
    let mut ipam = FakeIpam::default();
    add(&env(), &conf("1.0.0", json!({})), &mut pod, Some(&mut ipam)).unwrap();
    assert_eq!(pod.link_names(Ns::Pod), vec!["net1".to_string()]);
    del(&env(), Some(&mut ipam), Ok(Some(&mut pod))).unwrap();
    assert_eq!(ipam.dels, 1);
    assert!(pod.link_names(Ns::Pod).is_empty());
    // Again: nothing left, still success (idempotent).
    del(&env(), Some(&mut ipam), Ok(Some(&mut pod))).unwrap();
    // The netns is gone: the IPAM is still released, DEL succeeds.
    let mut ipam = FakeIpam::default();
    del(&env(), Some(&mut ipam), Ok(None)).unwrap();
    assert_eq!(ipam.dels, 1);
    // The netns cannot be opened: the IPAM is released and the error told.
    let mut ipam = FakeIpam::default();
    let e = del(
        &env(),
        Some(&mut ipam),
        Err(CniError::io("cannot open CNI_NETNS")),
    )
    .unwrap_err();
    assert_eq!((ipam.dels, e.code), (1, code::IO_FAILURE));
    // A failing link delete is reported, after the IPAM's release.
    let mut pod = nl();
    add(
        &env(),
        &conf("1.0.0", json!({})),
        &mut pod,
        Some(&mut FakeIpam::default()),
    )
    .unwrap();
    pod.failures.push(("delete_link", libc::EBUSY));
    let mut ipam = FakeIpam::default();
    let e = del(&env(), Some(&mut ipam), Ok(Some(&mut pod))).unwrap_err();
    assert_eq!(ipam.dels, 1);
    assert!(e.msg.contains("net1"), "{}", e.msg);
}

/// The wire check of a dual-stack ADD (beside this file's one-family ones).
#[path = "commands_probe_tests.rs"]
mod probe;
