//! StatefulSet and configured identities across nodes on the kubernetes
//! store: rescheduled, shared, re-used after deletion, dual-stack, sticky MAC.

use super::*;

fn holder_node(api: &ApiServer, ip: &str) -> Option<String> {
    api.claims()
        .iter()
        .find(|c| c["spec"]["ip"] == ip)
        .and_then(|c| c["status"]["node"].as_str().map(str::to_string))
}

/// A StatefulSet pod keeps its address across a node crash: refused while
/// its old pod may be alive (running, then terminating on a node that is
/// merely unreachable), handed over once the node is tainted
/// out-of-service; and handed over at once when the old pod is removed.
#[test]
fn statefulset_pod_rescheduled_to_another_node_keeps_its_ip() {
    let (mut topo, api) = nodes_on_api(3);
    let set_uid = api.add_stateful_set(NS, "rs0");
    let uid_a = api.add_pod(NS, "rs0-0", &api.node(1), Some(("rs0", &set_uid)), None);
    let uid_b = api.add_pod(NS, "rs0-1", &api.node(1), Some(("rs0", &set_uid)), None);
    let pod_a = topo.add_pod("rs0-0-a");
    let pod_b = topo.add_pod("rs0-1-a");
    let x = add_on_node(
        &topo,
        &api,
        0,
        &pod_a,
        "ctr-a1",
        &pod_args_in_ns("rs0-0", &uid_a),
    )
    .first_address();
    let y = add_on_node(
        &topo,
        &api,
        0,
        &pod_b,
        "ctr-b1",
        &pod_args_in_ns("rs0-1", &uid_b),
    )
    .first_address();
    assert_ne!(x, y);
    let router = topo.router.clone();
    assert!(
        topo.ping_eventually(&router, &x, 3),
        "router cannot reach {x}"
    );
    let claim = api
        .claims()
        .into_iter()
        .find(|c| c["spec"]["ip"] == x.as_str())
        .expect("claim object for X");
    assert_eq!(claim["spec"]["identity"], "default/rs0-0");
    assert_eq!(claim["spec"]["owner"]["name"], "rs0");
    assert_eq!(claim["status"]["phase"], "Bound");
    assert_eq!(claim["status"]["pod"], "default/rs0-0");

    // node1 crashes; the API still shows the pods Running there.
    topo.crash_node(0, &[&pod_a, &pod_b]);
    let pod_a2 = topo.add_pod("rs0-0-b");
    let refused = add_on_node(
        &topo,
        &api,
        1,
        &pod_a2,
        "ctr-a2",
        &pod_args_in_ns("rs0-0", "uid-new-a"),
    );
    refused.expect_refused(11, &[&x, "default/rs0-0", &api.node(1), "still running"]);
    // Deleted, but node1 never confirms: Terminating on a NotReady node.
    api.delete_pod(NS, "rs0-0");
    let refused = add_on_node(
        &topo,
        &api,
        1,
        &pod_a2,
        "ctr-a2",
        &pod_args_in_ns("rs0-0", "uid-new-a"),
    );
    refused.expect_refused(11, &["terminating", "out-of-service"]);
    assert_eq!(holder_node(&api, &x), Some(api.node(1)));

    // The operator declares node1 down: the pod's address moves to node2.
    api.taint_out_of_service(&api.node(1));
    api.remove_pod(NS, "rs0-0");
    let uid_a2 = api.add_pod(NS, "rs0-0", &api.node(2), Some(("rs0", &set_uid)), None);
    let moved = add_on_node(
        &topo,
        &api,
        1,
        &pod_a2,
        "ctr-a2",
        &pod_args_in_ns("rs0-0", &uid_a2),
    );
    assert_eq!(moved.first_address(), x);
    assert_eq!(holder_node(&api, &x), Some(api.node(2)));
    assert!(
        topo.ping_eventually(&router, &x, 5),
        "router cannot reach {x} on node2"
    );

    // rs0-1's old pod object is simply gone (force-deleted): at once.
    api.remove_pod(NS, "rs0-1");
    let uid_b2 = api.add_pod(NS, "rs0-1", &api.node(3), Some(("rs0", &set_uid)), None);
    let pod_b2 = topo.add_pod("rs0-1-b");
    assert_eq!(
        add_on_node(
            &topo,
            &api,
            2,
            &pod_b2,
            "ctr-b2",
            &pod_args_in_ns("rs0-1", &uid_b2)
        )
        .first_address(),
        y
    );
    assert!(topo.ping_eventually(&router, &y, 5));
    assert_claim_invariants(&api.claims());
}

/// Two Deployment replicas annotated with one configured identity: only
/// one holds it; the other is refused until the first is gone.
#[test]
fn configured_identity_shared_by_two_replicas() {
    let (mut topo, api) = nodes_on_api(2);
    let uid1 = api.add_pod(NS, "web-7f9c-aaaaa", &api.node(1), None, Some("vip-1"));
    let uid2 = api.add_pod(NS, "web-7f9c-bbbbb", &api.node(2), None, Some("vip-1"));
    let p1 = topo.add_pod("web-a");
    let p2 = topo.add_pod("web-b");
    let ip = add_on_node(
        &topo,
        &api,
        0,
        &p1,
        "web-a",
        &pod_args_in_ns("web-7f9c-aaaaa", &uid1),
    )
    .first_address();
    let second = add_on_node(
        &topo,
        &api,
        1,
        &p2,
        "web-b",
        &pod_args_in_ns("web-7f9c-bbbbb", &uid2),
    );
    second.expect_refused(11, &["web-7f9c-aaaaa", &api.node(1)]);
    assert!(
        !sticky_e2e::ip_ok(&["-n", &p2.netns, "link", "show", "net1"]),
        "a refused ADD left its link"
    );
    // The first replica ends (DEL never runs: its node lost it).
    api.remove_pod(NS, "web-7f9c-aaaaa");
    let p1_ns = p1.netns.clone();
    topo.delete_netns(&p1_ns);
    assert_eq!(
        add_on_node(
            &topo,
            &api,
            1,
            &p2,
            "web-b",
            &pod_args_in_ns("web-7f9c-bbbbb", &uid2)
        )
        .first_address(),
        ip
    );
    let claims = api.claims();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["spec"]["identity"], "vip-1");
    assert_eq!(claims[0]["status"]["node"], api.node(2).as_str());
}

/// A full pool whose addresses are reserved by the pods of a deleted
/// StatefulSet: a new pod's ADD reclaims one on the spot (no reconcile
/// needed), while a live StatefulSet's reservations are never touched.
#[test]
fn exhausted_pool_reuses_a_deleted_statefulsets_addresses() {
    let (mut topo, api) = nodes_on_api(1);
    let small = json!({"rangeStart": "10.213.0.10", "rangeEnd": "10.213.0.12"});
    let add_small = |topo: &Topology, pod: &Pod, cid: &str, args: &str| {
        CniCall::new(
            &our_plugin(),
            &topo.node(0).netns,
            "ADD",
            conf(topo, &api, 0, small.clone()),
        )
        .container(cid)
        .netns(&pod.path)
        .args(args)
        .run()
    };
    let del_small = |topo: &Topology, pod: &Pod, cid: &str| {
        CniCall::new(
            &our_plugin(),
            &topo.node(0).netns,
            "DEL",
            conf(topo, &api, 0, small.clone()),
        )
        .container(cid)
        .netns(&pod.path)
        .run()
        .expect_ok();
    };
    let old = api.add_stateful_set(NS, "old");
    let keep = api.add_stateful_set(NS, "keep");
    for (i, (set, uid)) in [("old", &old), ("old", &old), ("keep", &keep)]
        .iter()
        .enumerate()
    {
        let name = format!("{set}-{i}");
        let pod_uid = api.add_pod(NS, &name, &api.node(1), Some((set, uid)), None);
        let pod = topo.add_pod(&name);
        add_small(&topo, &pod, &name, &pod_args_in_ns(&name, &pod_uid)).expect_ok();
        del_small(&topo, &pod, &name);
    }
    assert_eq!(api.claims().len(), 3);
    let web_uid = api.add_pod(NS, "web-1", &api.node(1), None, None);
    let web = topo.add_pod("web-1");
    // All three reserved by live StatefulSets: refused, naming them.
    let refused = add_small(&topo, &web, "web-1", &pod_args_in_ns("web-1", &web_uid));
    refused.expect_refused(11, &["reserved by sticky identities"]);
    api.delete_stateful_set(NS, "old");
    let got = add_small(&topo, &web, "web-1", &pod_args_in_ns("web-1", &web_uid));
    let ip = got.first_address();
    let claims = api.claims();
    assert_eq!(claims.len(), 3);
    let mine = claims
        .iter()
        .find(|c| c["spec"]["ip"] == ip.as_str())
        .expect("claim");
    assert!(mine["spec"]["identity"]
        .as_str()
        .unwrap_or_default()
        .starts_with("container:"));
    assert!(
        claims
            .iter()
            .any(|c| c["spec"]["identity"] == "default/keep-2"),
        "keep's reservation is untouched"
    );
    assert_claim_invariants(&claims);
}

/// Dual-stack on the kubernetes store: a StatefulSet pod holds one claim
/// per family, moves with both to another node after a crash, and the
/// router reaches both; CHECK passes where it runs.
#[test]
fn dual_stack_statefulset_pod_moves_with_both_addresses() {
    let (mut topo, api) = nodes_on_api(2);
    let ranges = json!({
        "subnet": null, "rangeStart": null, "rangeEnd": null, "gateway": null,
        "ranges": [
            [{"subnet": "10.213.0.0/24", "rangeStart": "10.213.0.10", "rangeEnd": "10.213.0.200", "gateway": "10.213.0.1"}],
            [{"subnet": "fd00:213::/64", "rangeStart": "fd00:213::10", "rangeEnd": "fd00:213::ff", "gateway": "fd00:213::1"}]
        ],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
    });
    let conf_ds = |topo: &Topology, node: usize| {
        let mut c = conf(topo, &api, node, ranges.clone());
        for key in ["subnet", "rangeStart", "rangeEnd", "gateway"] {
            c["ipam"].as_object_mut().map(|o| o.remove(key));
        }
        c
    };
    let run = |topo: &Topology, node: usize, cmd: &str, pod: &Pod, cid: &str, args: &str| {
        CniCall::new(
            &our_plugin(),
            &topo.node(node).netns,
            cmd,
            conf_ds(topo, node),
        )
        .container(cid)
        .netns(&pod.path)
        .args(args)
        .run()
    };
    // CHECK as the runtime sends it: the cached ADD result as prevResult.
    let check =
        |topo: &Topology, node: usize, added: &CniReply, pod: &Pod, cid: &str, args: &str| {
            let mut c = conf_ds(topo, node);
            c["prevResult"] = added.expect_ok().clone();
            let r = CniCall::new(&our_plugin(), &topo.node(node).netns, "CHECK", c)
                .container(cid)
                .netns(&pod.path)
                .args(args)
                .run();
            assert!(r.success, "CHECK: {}", r.stdout);
        };
    let set = api.add_stateful_set(NS, "ds");
    let uid = api.add_pod(NS, "ds-0", &api.node(1), Some(("ds", &set)), None);
    let first = topo.add_pod("ds-0-a");
    let added = run(
        &topo,
        0,
        "ADD",
        &first,
        "ds-a",
        &pod_args_in_ns("ds-0", &uid),
    );
    let got = added.addresses();
    assert_eq!(got.len(), 2, "{got:?}");
    check(
        &topo,
        0,
        &added,
        &first,
        "ds-a",
        &pod_args_in_ns("ds-0", &uid),
    );
    let claims = api.claims();
    assert_eq!(claims.len(), 2);
    assert_claim_invariants(&claims);
    let router = topo.router.clone();
    let v6 = got[1].split('/').next().unwrap_or_default().to_string();
    let ping6 = |target: &str| {
        Command::new("ip")
            .args([
                "netns", "exec", &router, "ping", "-6", "-c", "1", "-W", "2", target,
            ])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    // The router learns the first MAC for the IPv6 address.
    assert!((0..5).any(|_| ping6(&v6)), "router cannot reach {v6}");
    let old_mac = link_mac(&first.netns, "net1");
    assert_eq!(
        neighbour_mac(&router, &v6).as_deref(),
        Some(old_mac.as_str())
    );

    topo.crash_node(0, &[&first]);
    api.remove_pod(NS, "ds-0");
    let uid2 = api.add_pod(NS, "ds-0", &api.node(2), Some(("ds", &set)), None);
    let second = topo.add_pod("ds-0-b");
    let moved = run(
        &topo,
        1,
        "ADD",
        &second,
        "ds-b",
        &pod_args_in_ns("ds-0", &uid2),
    );
    let again = moved.addresses();
    assert_eq!(again, got);
    check(
        &topo,
        1,
        &moved,
        &second,
        "ds-b",
        &pod_args_in_ns("ds-0", &uid2),
    );
    // Unsolicited neighbour advertisement (ndisc_notify, after DAD): the
    // router's entry moves to the new MAC without it asking.
    let new_mac = link_mac(&second.netns, "net1");
    let deadline = Instant::now() + Duration::from_secs(3);
    while neighbour_mac(&router, &v6).as_deref() != Some(new_mac.as_str()) {
        assert!(
            Instant::now() < deadline,
            "the router still has {:?} for {v6}, not {new_mac}",
            neighbour_mac(&router, &v6)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let v4 = got[0].split('/').next().unwrap_or_default().to_string();
    assert!(
        topo.ping_eventually(&router, &v4, 5),
        "router cannot reach {v4}"
    );
    assert!((0..5).any(|_| ping6(&v6)), "router cannot reach {v6}");
    let claims = api.claims();
    assert_eq!(claims.len(), 2);
    assert!(claims
        .iter()
        .all(|c| c["status"]["node"] == api.node(2).as_str()));
    assert_claim_invariants(&claims);
}

/// `stickyMac`: the workload keeps its MAC on the new node, so the router's
/// neighbour entry stays valid; and the probe still catches a split brain
/// even though the old holder has the very same MAC.
#[test]
fn sticky_mac_survives_a_reschedule_and_split_brain_is_still_caught() {
    let (mut topo, api) = nodes_on_api(2);
    let sticky = |topo: &Topology, node: usize| {
        let mut c = conf(topo, &api, node, json!({}));
        c["stickyMac"] = json!(true);
        c
    };
    let run = |topo: &Topology, node: usize, pod: &Pod, cid: &str, args: &str| {
        CniCall::new(
            &our_plugin(),
            &topo.node(node).netns,
            "ADD",
            sticky(topo, node),
        )
        .container(cid)
        .netns(&pod.path)
        .args(args)
        .run()
    };
    let set = api.add_stateful_set(NS, "sm");
    let uid = api.add_pod(NS, "sm-0", &api.node(1), Some(("sm", &set)), None);
    let old = topo.add_pod("sm-0-old");
    let x = run(&topo, 0, &old, "sm-old", &pod_args_in_ns("sm-0", &uid)).first_address();
    let mac = link_mac(&old.netns, "net1");
    assert!(mac.starts_with(|c: char| c.is_ascii_hexdigit()), "{mac}");
    let router = topo.router.clone();
    assert!(topo.ping_eventually(&router, &x, 3));
    assert_eq!(neighbour_mac(&router, &x).as_deref(), Some(mac.as_str()));

    api.remove_pod(NS, "sm-0");
    let uid2 = api.add_pod(NS, "sm-0", &api.node(2), Some(("sm", &set)), None);
    let new = topo.add_pod("sm-0-new");
    let refused = run(&topo, 1, &new, "sm-new", &pod_args_in_ns("sm-0", &uid2));
    assert_eq!(
        refused.code(),
        Some(11),
        "a same-MAC old holder must still be caught: {}",
        refused.stdout
    );
    assert!(refused.msg().contains(&mac), "{}", refused.msg());

    let old_ns = old.netns.clone();
    topo.delete_netns(&old_ns);
    assert_eq!(
        run(&topo, 1, &new, "sm-new", &pod_args_in_ns("sm-0", &uid2)).first_address(),
        x
    );
    assert_eq!(
        link_mac(&new.netns, "net1"),
        mac,
        "the MAC moved with the workload"
    );
    assert_eq!(neighbour_mac(&router, &x).as_deref(), Some(mac.as_str()));
    assert!(topo.ping_eventually(&router, &x, 3));
}
