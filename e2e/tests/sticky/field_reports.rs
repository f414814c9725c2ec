//! The field reports and the stickiness they ask for, on the file store.

use super::*;

/// Field report A: the only IP of a BGP speaker survives a node crash with
/// sticky-ipam, and does not with host-local (shown in the same run).
#[test]
fn field_report_a_bgp_peer_ip_survives_node_crash() {
    let mut topo = Topology::new(4);
    let router = topo.router.clone();
    sticky_e2e::ip(&[
        "-n",
        &router,
        "addr",
        "add",
        "172.31.59.1/24",
        "dev",
        "eth0",
    ]);
    let single = json!({"subnet": "172.31.59.0/24", "rangeStart": "172.31.59.2", "rangeEnd": "172.31.59.2", "gateway": "172.31.59.1"});

    // The reference: macvlan + host-local, rangeStart == rangeEnd.
    let mut hl = single.clone();
    hl["type"] = json!("host-local");
    hl["dataDir"] = json!(topo.file("host-local"));
    let reference = configs::macvlan(configs::REF_TYPE, "1.0.0", "uplink0", hl);
    let ref_call = |topo: &Topology, node: usize, cid: &str, pod: &Pod| {
        CniCall::new(
            &reference_plugin("macvlan"),
            &topo.node(node).netns,
            "ADD",
            reference.clone(),
        )
        .container(cid)
        .netns(&pod.path)
        .args(&default_pod_args("speaker-0", cid))
        .run()
    };
    let ref_old = topo.add_pod("ref-old");
    assert_eq!(
        ref_call(&topo, 0, "ref-old", &ref_old).first_address(),
        "172.31.59.2"
    );
    topo.crash_node(0, &[&ref_old]);
    let ref_new = topo.add_pod("ref-new");
    let refused = ref_call(&topo, 1, "ref-new", &ref_new);
    assert!(!refused.success, "host-local handed out its only IP twice");
    assert!(
        refused
            .msg()
            .contains("no IP addresses available in range set"),
        "reference said: {}",
        refused.stdout
    );

    // Ours: same network, the identity is the BGP peer's.
    let mut ipam = single.clone();
    ipam["dataDir"] = json!(topo.file("sticky"));
    let mut ours = configs::macvlan(configs::OUR_TYPE, "1.0.0", "uplink0", ipam);
    ours["ipam"]["type"] = json!("sticky-ipam");
    ours["args"] = json!({"cni": {"identity": "bgp-peer-a"}});
    let old = topo.add_pod("old");
    assert_eq!(
        call(
            &topo,
            2,
            "ADD",
            &ours,
            "old",
            &old,
            &default_pod_args("speaker-0", "uid-old")
        )
        .first_address(),
        "172.31.59.2"
    );
    assert!(topo.ping_eventually(&router, "172.31.59.2", 3));
    topo.crash_node(2, &[&old]);
    let new = topo.add_pod("new");
    let start = Instant::now();
    let reply = call(
        &topo,
        3,
        "ADD",
        &ours,
        "new",
        &new,
        &default_pod_args("speaker-0", "uid-new"),
    );
    assert_eq!(reply.first_address(), "172.31.59.2", "{}", reply.stderr);
    eprintln!("takeover ADD answered in {:?}", start.elapsed());
    assert!(
        topo.ping_eventually(&router, "172.31.59.2", 3),
        "the router cannot reach the new holder"
    );
    assert_eq!(
        holder_of(&topo.file("sticky"), NET, "bgp-peer-a").as_deref(),
        Some("new")
    );
}

/// Field report B: 10 IPs for 10 replicas; a node with 4 of them crashes;
/// 4 replacements come up with no manual step and no duplicate.
#[test]
fn field_report_b_replacements_after_node_crash_need_no_cleanup() {
    let mut topo = Topology::new(2);
    let store = topo.file("store");
    let conf = configs::sticky(
        "uplink0",
        &store,
        json!({"rangeStart": format!("{SUBNET_PREFIX}.10"), "rangeEnd": format!("{SUBNET_PREFIX}.19")}),
    );
    let mut on_node1 = Vec::new();
    let mut ips = BTreeSet::new();
    for i in 0..10 {
        let name = format!("web-{i}");
        let pod = topo.add_pod(&name);
        let node = usize::from(i >= 4);
        let reply = call(
            &topo,
            node,
            "ADD",
            &conf,
            &format!("c-{name}"),
            &pod,
            &default_pod_args(&name, &name),
        );
        assert!(ips.insert(reply.first_address()));
        if node == 0 {
            on_node1.push(pod);
        }
    }
    let extra = topo.add_pod("web-extra");
    let full = call(
        &topo,
        1,
        "ADD",
        &conf,
        "c-extra",
        &extra,
        &default_pod_args("web-extra", "x"),
    );
    full.expect_refused(11, &["10.213.0.10-10.213.0.19", NET]);

    let refs: Vec<&Pod> = on_node1.iter().collect();
    topo.crash_node(0, &refs);
    let mut replacement_ips = BTreeSet::new();
    for i in 0..4 {
        let name = format!("web-new-{i}");
        let pod = topo.add_pod(&name);
        let reply = call(
            &topo,
            1,
            "ADD",
            &conf,
            &format!("c-{name}"),
            &pod,
            &default_pod_args(&name, &name),
        );
        replacement_ips.insert(reply.first_address());
    }
    assert_eq!(replacement_ips.len(), 4);
    assert!(
        replacement_ips.is_subset(&ips),
        "replacements reuse the dead pods' addresses"
    );
    let held = assert_invariants(&store, NET);
    assert_eq!(held.len(), 10);
    let distinct: BTreeSet<_> = held.values().collect();
    assert_eq!(distinct.len(), 10, "no duplicate IPs");
}

/// A restarted pod (same UID, new sandbox) keeps its IP, and the old
/// sandbox's late DEL does not release it.
#[test]
fn restart_keeps_ip_and_late_del_is_a_no_op() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let conf = configs::sticky("uplink0", &store, json!({"identityPolicy": "podName"}));
    let first = topo.add_pod("sandbox1");
    let ip = call(
        &topo,
        0,
        "ADD",
        &conf,
        "sandbox1",
        &first,
        &default_pod_args("db-0", "uid-db"),
    )
    .first_address();
    let second = topo.add_pod("sandbox2");
    let again = call(
        &topo,
        0,
        "ADD",
        &conf,
        "sandbox2",
        &second,
        &default_pod_args("db-0", "uid-db"),
    );
    assert_eq!(again.first_address(), ip, "same pod, same IP");
    let late = call(
        &topo,
        0,
        "DEL",
        &conf,
        "sandbox1",
        &first,
        &default_pod_args("db-0", "uid-db"),
    );
    late.expect_ok();
    assert_eq!(
        holder_of(&store, NET, "default/db-0").as_deref(),
        Some("sandbox2")
    );
    assert!(links_in(&second.netns).contains(&"net1".to_string()));
    // DEL by the holder releases it; a second DEL is a no-op.
    call(
        &topo,
        0,
        "DEL",
        &conf,
        "sandbox2",
        &second,
        &default_pod_args("db-0", "uid-db"),
    )
    .expect_ok();
    call(
        &topo,
        0,
        "DEL",
        &conf,
        "sandbox2",
        &second,
        &default_pod_args("db-0", "uid-db"),
    )
    .expect_ok();
    assert_eq!(holder_of(&store, NET, "default/db-0"), None);
    assert_invariants(&store, NET);
}

/// Scale-down then scale-up returns the same IP, although other identities
/// allocated in between.
#[test]
fn sticky_across_scale_down_and_up() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let conf = configs::sticky("uplink0", &store, json!({"identityPolicy": "podName"}));
    let mut first = BTreeMap::new();
    for i in 0..3 {
        let name = format!("rs-{i}");
        let pod = topo.add_pod(&name);
        first.insert(
            name.clone(),
            call(
                &topo,
                0,
                "ADD",
                &conf,
                &name,
                &pod,
                &default_pod_args(&name, &format!("u-{name}")),
            )
            .first_address(),
        );
        call(
            &topo,
            0,
            "DEL",
            &conf,
            &name,
            &pod,
            &default_pod_args(&name, ""),
        )
        .expect_ok();
    }
    for i in 0..5 {
        let name = format!("other-{i}");
        let pod = topo.add_pod(&name);
        let ip = call(
            &topo,
            0,
            "ADD",
            &conf,
            &name,
            &pod,
            &default_pod_args(&name, &name),
        )
        .first_address();
        assert!(
            !first.values().any(|v| *v == ip),
            "{ip} is reserved for a scaled-down identity"
        );
    }
    for i in (0..3).rev() {
        let name = format!("rs-{i}");
        let pod = topo.add_pod(&format!("{name}-b"));
        let ip = call(
            &topo,
            0,
            "ADD",
            &conf,
            &format!("{name}-b"),
            &pod,
            &default_pod_args(&name, &format!("u2-{name}")),
        )
        .first_address();
        assert_eq!(ip, first[&name], "{name} got its address back");
    }
    assert_invariants(&store, NET);
}

/// Dual-stack sticky: one sticky address per family, both back after
/// DEL and re-ADD from a new sandbox, and both reach the router.
#[test]
fn dual_stack_identity_keeps_both_addresses() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let mut ipam = configs::host_local_dual_stack(&store);
    ipam["type"] = json!("sticky-ipam");
    ipam["identityPolicy"] = json!("podName");
    let conf = configs::macvlan(configs::OUR_TYPE, "1.0.0", "uplink0", ipam);
    let addresses = |reply: &CniReply| reply.addresses();
    let first = topo.add_pod("ds1");
    let got = addresses(&call(
        &topo,
        0,
        "ADD",
        &conf,
        "ds1",
        &first,
        &default_pod_args("ds-0", "u1"),
    ));
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(topo.ping_eventually(&first.netns, &format!("{SUBNET_PREFIX}.1"), 3));
    call(
        &topo,
        0,
        "DEL",
        &conf,
        "ds1",
        &first,
        &default_pod_args("ds-0", "u1"),
    )
    .expect_ok();
    let second = topo.add_pod("ds2");
    let again = addresses(&call(
        &topo,
        0,
        "ADD",
        &conf,
        "ds2",
        &second,
        &default_pod_args("ds-0", "u2"),
    ));
    assert_eq!(again, got);
    let v6_ok = (0..3).any(|_| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &second.netns,
                "ping",
                "-6",
                "-c",
                "1",
                "-W",
                "2",
                "fd00:213::1",
            ])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    });
    assert!(v6_ok, "the router is not reachable over IPv6");
    let held = claims(&store, NET);
    assert_eq!(held.len(), 2);
    assert!(held.iter().all(|c| c.identity == "default/ds-0"));
}
