//! sticky-ipam behind other plugins, CHECK/GC/STATUS, the operator CLI.

use super::*;

/// The standalone sticky-ipam behind the reference macvlan: same sticky
/// behaviour, takeover after the holder's netns is gone.
#[test]
fn standalone_ipam_behind_reference_macvlan() {
    let mut topo = Topology::new(2);
    let store = topo.file("store");
    let mut conf = configs::sticky("uplink0", &store, json!({"identityPolicy": "podName"}));
    conf["type"] = json!(configs::REF_TYPE);
    // our_ipam() asserts the standalone binary is built.
    our_ipam();
    let cni_path = sticky_e2e::cni_path_with_ours();
    let run = |topo: &Topology, node: usize, cmd: &str, cid: &str, pod: &Pod, args: &str| {
        CniCall::new(
            &reference_plugin("macvlan"),
            &topo.node(node).netns,
            cmd,
            conf.clone(),
        )
        .container(cid)
        .netns(&pod.path)
        .args(args)
        .cni_path(&cni_path)
        .run()
    };
    let a = topo.add_pod("a");
    let ip = run(&topo, 0, "ADD", "a", &a, &default_pod_args("peer-0", "u1")).first_address();
    run(&topo, 0, "DEL", "a", &a, &default_pod_args("peer-0", "u1")).expect_ok();
    let b = topo.add_pod("b");
    let other = run(&topo, 0, "ADD", "b", &b, &default_pod_args("peer-1", "u2")).first_address();
    assert_ne!(other, ip);
    let a2 = topo.add_pod("a2");
    assert_eq!(
        run(
            &topo,
            0,
            "ADD",
            "a2",
            &a2,
            &default_pod_args("peer-0", "u3")
        )
        .first_address(),
        ip
    );
    // Refused while a2's netns lives, taken over once it is gone.
    let a3 = topo.add_pod("a3");
    let refused = run(
        &topo,
        1,
        "ADD",
        "a3",
        &a3,
        &default_pod_args("peer-0", "u4"),
    );
    refused.expect_refused(11, &["held by pod default/peer-0"]);
    // The reference macvlan leaves its link behind when its IPAM refuses
    // (ours removes it); kubelet's next try is a new sandbox anyway.
    eprintln!(
        "reference macvlan after an IPAM refusal leaves: {:?}",
        links_in(&a3.netns)
    );
    topo.crash_node(0, &[&a2]);
    let a4 = topo.add_pod("a4");
    assert_eq!(
        run(
            &topo,
            1,
            "ADD",
            "a4",
            &a4,
            &default_pod_args("peer-0", "u4")
        )
        .first_address(),
        ip
    );
    assert!(topo.ping_eventually(&a4.netns, &format!("{SUBNET_PREFIX}.1"), 3));
    assert_invariants(&store, NET);
}

/// CNI 1.1 GC releases holders that are not among the valid attachments,
/// CHECK verifies the claim, STATUS answers.
#[test]
fn gc_check_and_status() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["cniVersion"] = json!("1.1.0");
    let keep = topo.add_pod("keep");
    let gone = topo.add_pod("gone");
    let kept = call(&topo, 0, "ADD", &conf, "keep", &keep, "");
    call(&topo, 0, "ADD", &conf, "gone", &gone, "").expect_ok();
    let mut check = conf.clone();
    check["prevResult"] = kept.expect_ok().clone();
    call(&topo, 0, "CHECK", &check, "keep", &keep, "").expect_ok();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "net1"}]);
    CniCall::new(&our_plugin(), &topo.node(0).netns, "GC", gc)
        .netns("")
        .run()
        .expect_ok();
    // GC's release is a judgement (I7): the address stays as a tombstone.
    let all = claims(&store, NET);
    let left: Vec<String> = all
        .iter()
        .filter(|c| !c.is_tombstone())
        .map(|c| c.identity.clone())
        .collect();
    assert_eq!(left, vec!["container:keep/net1".to_string()]);
    assert!(
        all.iter()
            .any(|c| c.identity == "container:gone/net1" && c.is_tombstone()),
        "{all:?}"
    );
    let stale = call(&topo, 0, "CHECK", &check, "gone", &gone, "");
    assert!(!stale.success);
    CniCall::new(&our_plugin(), &topo.node(0).netns, "STATUS", conf)
        .netns("")
        .run()
        .expect_ok();
}

/// The operator CLI: import a live host-local directory, list, refuse to
/// release a live holder, reconcile dead ones, release by identity.
#[test]
fn operator_cli_import_claims_release_reconcile() {
    let mut topo = Topology::new(1);
    let hl_dir = topo.file("host-local");
    let reference = configs::macvlan(
        configs::REF_TYPE,
        "1.0.0",
        "uplink0",
        configs::host_local(&hl_dir),
    );
    let live = topo.add_pod("live");
    let hl_ip = CniCall::new(
        &reference_plugin("macvlan"),
        &topo.node(0).netns,
        "ADD",
        reference,
    )
    .container("hl-live")
    .netns(&live.path)
    .run()
    .first_address();
    let store = topo.file("store");
    let dir = store.to_string_lossy().to_string();
    let from = hl_dir.join(NET);
    let (ok, out, err) = sticky_e2e::scenario::run_cli(&[
        "import-host-local",
        "--dir",
        &dir,
        "--network",
        NET,
        "--from",
        &from.to_string_lossy(),
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("imported 1"), "{out}");

    // The node switches to sticky-ipam: no conflict with the imported IP.
    let conf = configs::sticky("uplink0", &store, json!({"identityPolicy": "podName"}));
    let pod = topo.add_pod("new");
    let ip = call(
        &topo,
        0,
        "ADD",
        &conf,
        "new",
        &pod,
        &default_pod_args("db-0", "u1"),
    )
    .first_address();
    assert_ne!(ip, hl_ip);
    let (ok, table, _) = sticky_e2e::scenario::run_cli(&["claims", "--dir", &dir]);
    assert!(ok);
    assert!(table.starts_with("NETWORK  IP"), "{table}");
    assert!(
        table.contains("default/db-0") && table.contains(&hl_ip) && table.contains("held"),
        "{table}"
    );

    // A live holder is not released without --force.
    let (ok, _, err) = sticky_e2e::scenario::run_cli(&[
        "release",
        "--dir",
        &dir,
        "--network",
        NET,
        "--identity",
        "default/db-0",
    ]);
    assert!(!ok && err.contains("considered alive"), "{err}");
    // Its pod dies without DEL: reconcile releases the holder, keeps the IP reserved.
    topo.delete_netns(&pod.netns);
    let (ok, out, _) = sticky_e2e::scenario::run_cli(&["reconcile", "--dir", &dir]);
    assert!(ok && out.contains("1 dead holders released"), "{out}");
    let (_, table, _) = sticky_e2e::scenario::run_cli(&["claims", "--dir", &dir, "--network", NET]);
    assert!(table.contains("reserved"), "{table}");
    let (ok, out, _) = sticky_e2e::scenario::run_cli(&[
        "release",
        "--dir",
        &dir,
        "--network",
        NET,
        "--identity",
        "default/db-0",
    ]);
    assert!(ok && out.contains(&ip), "{out}");
    // The imported container's DEL (as kubelet would send it) releases it.
    let mut del = conf.clone();
    del["ipam"]["identityPolicy"] = json!("dynamic");
    call(&topo, 0, "DEL", &del, "hl-live", &live, "").expect_ok();
    // What is left is db-0's address, released by reconcile's judgement and
    // then by the operator: kept as a tombstone, probed before it is reused.
    let left = claims(&store, NET);
    assert!(
        left.iter()
            .all(|c| c.is_tombstone() && c.ip.to_string() == ip),
        "{left:?}"
    );
    let (ok, _, err) = sticky_e2e::scenario::run_cli(&["release", "--dir", &dir]);
    assert!(!ok && err.contains("--network"), "{err}");
    let (ok, _, err) =
        sticky_e2e::scenario::run_cli(&["claims", "--dir", &dir, "--network", "typo"]);
    assert!(
        !ok && err.contains("\"typo\" has no claims") && err.contains(NET),
        "{err}"
    );
    assert!(
        !store.join("typo").exists(),
        "a typo does not create a store"
    );
    let (ok, _, err) = sticky_e2e::scenario::run_cli(&["claims", "--bogus"]);
    assert!(!ok && err.contains("--bogus"), "{err}");
}

/// sticky-ipam answers like host-local for the same keys: the same result
/// JSON (MAC and sandbox aside) and the same pod state, in-process behind
/// our plugin and standalone behind the reference macvlan, single and dual
/// stack, at every version host-local speaks that can carry the result.
#[test]
fn sticky_ipam_answers_like_host_local() {
    let mut topo = Topology::new(1);
    // our_ipam() asserts the standalone binary is built.
    our_ipam();
    let cni_path = sticky_e2e::cni_path_with_ours();
    type IpamOf = fn(&Path) -> Value;
    let layouts: [(&str, IpamOf); 2] = [
        ("single", configs::host_local),
        ("dual", configs::host_local_dual_stack),
    ];
    let mut compared = 0;
    for (layout, ipam_of) in layouts {
        for version in ["0.3.1", "0.4.0", "1.0.0"] {
            let tag = format!("{layout}-{}", version.replace('.', ""));
            let mut side = |label: &str, plugin: &Path, plugin_type: &str, ipam_type: &str| {
                let mut ipam = ipam_of(&topo.file(&format!("{tag}-{label}")));
                ipam["type"] = json!(ipam_type);
                let conf = configs::macvlan(plugin_type, version, "uplink0", ipam);
                let pod = topo.add_pod(&format!("{tag}-{label}"));
                let call = CniCall::new(plugin, &topo.node(0).netns, "ADD", conf)
                    .container(&format!("{tag}-{label}"))
                    .netns(&pod.path)
                    .cni_path(&cni_path);
                let reply = call.run();
                let result = sticky_e2e::state::normalize_result(reply.expect_ok());
                let state = sticky_e2e::state::interface_state(&pod.netns, "net1");
                call.clone().command("DEL").run().expect_ok();
                topo.delete_netns(&pod.netns);
                (result, state)
            };
            let reference = side(
                "ref",
                &reference_plugin("macvlan"),
                configs::REF_TYPE,
                "host-local",
            );
            let in_process = side("ours", &our_plugin(), configs::OUR_TYPE, "sticky-ipam");
            let standalone = side(
                "standalone",
                &reference_plugin("macvlan"),
                configs::REF_TYPE,
                "sticky-ipam",
            );
            assert_eq!(
                in_process, reference,
                "{tag}: in-process sticky-ipam vs host-local"
            );
            assert_eq!(
                standalone, reference,
                "{tag}: standalone sticky-ipam vs host-local"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 6);
}
