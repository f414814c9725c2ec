//! sticky-ipam through the real binaries on real namespaces: the field
//! reports in the docs/src/developer/tested.md, restarts, scale-down/up, refusals,
//! concurrency, kill -9 at varied points, and the standalone IPAM behind
//! the reference macvlan.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sticky_e2e::scenario::{call, pod_args};
use sticky_e2e::store::{assert_invariants, claims, holder_of};
use sticky_e2e::{
    configs, links_in, our_ipam, our_plugin, reference_plugin, CniCall, CniReply, Pod, Topology,
    SUBNET_PREFIX,
};

const NET: &str = "macnet";

fn default_pod_args(name: &str, uid: &str) -> String {
    pod_args("default", name, uid)
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let claims = dir.join(NET).join("claims");
    std::fs::read_dir(&claims)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().to_string(),
                        std::fs::read(e.path()).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

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

/// An identity held by a live holder is refused with code 11 naming it,
/// and nothing changes.
#[test]
fn live_holder_is_refused_and_nothing_changes() {
    let mut topo = Topology::new(2);
    let store = topo.file("store");
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["args"] = json!({"cni": {"identity": "peer-b"}});
    let holder = topo.add_pod("holder");
    let ip = call(
        &topo,
        0,
        "ADD",
        &conf,
        "holder",
        &holder,
        &default_pod_args("peer-b-1", "uid-1"),
    )
    .first_address();
    let before = snapshot(&store);
    let rival = topo.add_pod("rival");
    let refused = call(
        &topo,
        1,
        "ADD",
        &conf,
        "rival",
        &rival,
        &default_pod_args("peer-b-2", "uid-2"),
    );
    refused.expect_refused(11, &[&ip, "default/peer-b-1", "still exists"]);
    assert_eq!(snapshot(&store), before, "the store is untouched");
    assert_eq!(
        links_in(&rival.netns),
        vec!["lo".to_string()],
        "no link is left"
    );
    assert!(
        topo.ping_eventually(&holder.netns, &format!("{SUBNET_PREFIX}.1"), 2),
        "the holder still works"
    );
}

/// 64 concurrent ADDs of distinct identities on one node.
#[test]
fn concurrent_adds_get_distinct_addresses() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let conf = configs::sticky("uplink0", &store, json!({"identityPolicy": "podName"}));
    let pods: Vec<Pod> = (0..64).map(|i| topo.add_pod(&format!("c{i}"))).collect();
    let node = topo.node(0).netns.clone();
    let replies: Vec<CniReply> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let call = CniCall::new(&our_plugin(), &node, "ADD", conf.clone())
                    .container(&format!("ctr{i}"))
                    .netns(&pod.path)
                    .args(&default_pod_args(&format!("set-{i}"), &format!("uid-{i}")));
                s.spawn(move || call.run())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let ips: BTreeSet<String> = replies.iter().map(CniReply::first_address).collect();
    assert_eq!(ips.len(), 64, "64 distinct addresses");
    let held = assert_invariants(&store, NET);
    assert_eq!(held.len(), 64);
    for (i, reply) in replies.iter().enumerate() {
        assert_eq!(
            held[&format!("default/set-{i}")].to_string(),
            reply.first_address()
        );
    }
}

/// kill -9 at varied points of ADD and DEL, then what kubelet does next;
/// afterwards no duplicate IP, no leaked link, no lost sticky binding.
#[test]
fn kill_9_during_add_and_del_loses_nothing() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let conf = configs::sticky("uplink0", &store, json!({"identityPolicy": "podName"}));
    let node = topo.node(0).netns.clone();
    let identities = 6;
    let mut bound: BTreeMap<String, String> = BTreeMap::new();
    let mut killed = 0;
    // Where the kills landed: (claim written, link left in the pod) -> count.
    let mut landed: BTreeMap<(bool, bool), usize> = BTreeMap::new();
    let trials = 48;
    // Spread kills over a whole command as this machine runs it: start-up,
    // store, netlink. A throwaway ADD+DEL measures how long that is.
    let probe_pod = topo.add_pod("probe");
    let probe = CniCall::new(&our_plugin(), &node, "ADD", conf.clone())
        .container("probe")
        .netns(&probe_pod.path)
        .args(&default_pod_args("probe", "probe"));
    let span = probe.run().elapsed;
    probe.clone().command("DEL").run().expect_ok();
    let span_us = span.as_micros().max(1000) as usize;
    let deadline = Instant::now() + Duration::from_secs(240);
    for trial in 0..trials {
        assert!(
            Instant::now() < deadline,
            "crash trials ran past their time bound"
        );
        let name = format!("crash-{}", trial % identities);
        let uid = format!("uid-{trial}");
        let args = default_pod_args(&name, &uid);
        let delay = Duration::from_micros(((trial * 7919) % span_us) as u64);
        let pod = topo.add_pod(&format!("t{trial}"));
        let cid = format!("ctr-{trial}");
        let add = CniCall::new(&our_plugin(), &node, "ADD", conf.clone())
            .container(&cid)
            .netns(&pod.path)
            .args(&args);
        let kill_add = trial % 2 == 0;
        if kill_add {
            killed += usize::from(add.run_and_kill(delay));
            let claimed =
                holder_of(&store, NET, &format!("default/{name}")).as_deref() == Some(cid.as_str());
            let link_left = links_in(&pod.netns).len() > 1;
            *landed.entry((claimed, link_left)).or_default() += 1;
            // kubelet: tear the failed sandbox down, then a new sandbox.
            call(&topo, 0, "DEL", &conf, &cid, &pod, &args).expect_ok();
            topo.delete_netns(&pod.netns);
            let pod = topo.add_pod(&format!("t{trial}-retry"));
            let reply = call(&topo, 0, "ADD", &conf, &format!("{cid}-retry"), &pod, &args);
            let ip = reply.first_address();
            if let Some(old) = bound.insert(name.clone(), ip.clone()) {
                assert_eq!(old, ip, "{name} lost its sticky binding");
            }
            assert_eq!(
                links_in(&pod.netns),
                vec!["lo".to_string(), "net1".to_string()]
            );
            call(&topo, 0, "DEL", &conf, &format!("{cid}-retry"), &pod, &args).expect_ok();
            topo.delete_netns(&pod.netns);
        } else {
            let ip = add.run().first_address();
            if let Some(old) = bound.insert(name.clone(), ip.clone()) {
                assert_eq!(old, ip, "{name} lost its sticky binding");
            }
            let del = add.clone().command("DEL");
            killed += usize::from(del.run_and_kill(delay));
            // kubelet retries DEL until it succeeds.
            del.run().expect_ok();
            assert_eq!(
                links_in(&pod.netns),
                vec!["lo".to_string()],
                "DEL left a link"
            );
            assert_eq!(holder_of(&store, NET, &format!("default/{name}")), None);
            topo.delete_netns(&pod.netns);
        }
        let held = assert_invariants(&store, NET);
        let distinct: BTreeSet<_> = held.values().collect();
        assert_eq!(
            distinct.len(),
            held.len(),
            "duplicate IP after trial {trial}"
        );
    }
    eprintln!(
        "crash trials: {trials} over {span:?} commands, killed mid-command: {killed}; ADD kills by (claim written, link left): {landed:?}"
    );
    assert!(
        landed.keys().any(|(claimed, _)| *claimed),
        "no ADD was killed after its claim was written: {landed:?}"
    );
    // Macvlans are born in pod netns, so a crash never leaks one on the node.
    assert_eq!(
        links_in(&node),
        vec!["lo".to_string(), "uplink0".to_string()]
    );
    assert!(
        killed > trials / 4,
        "too few kills landed mid-command ({killed}): the delays miss the command"
    );
    assert_eq!(
        claims(&store, NET).len(),
        identities + 1,
        "the crash identities and the probe"
    );
}

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

/// Invalid sticky-ipam configs fail before anything is created.
#[test]
fn invalid_ipam_config_leaves_nothing() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let pod = topo.add_pod("p");
    for (extra, want) in [
        (json!({"rangeStart": "10.213.1.5"}), "rangeStart"),
        (json!({"gateway": "10.9.9.9"}), "gateway"),
        (json!({"reservations": {"a": "10.99.0.1"}}), "reservations"),
    ] {
        let conf = configs::sticky("uplink0", &store, extra);
        let reply = call(&topo, 0, "ADD", &conf, "c", &pod, "");
        assert_eq!(reply.code(), Some(7), "{}", reply.stdout);
        assert!(reply.msg().contains(want), "{}", reply.msg());
        assert_eq!(links_in(&pod.netns), vec!["lo".to_string()]);
    }
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["args"] = json!({"cni": {"identity": "x".repeat(10_000)}});
    let reply = call(&topo, 0, "ADD", &conf, "c", &pod, "");
    assert_eq!(reply.code(), Some(7));
    assert!(reply.msg().contains("args.cni.identity"));
    assert_eq!(links_in(&pod.netns), vec!["lo".to_string()]);
    assert!(!store.join(NET).join("claims").exists() || snapshot(&store).is_empty());
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

/// Damaged file store: a truncated, an empty and a corrupt claim and a
/// foreign file. The plugin refuses to guess (the damaged identity gets
/// code 110 naming its record, and damaged addresses are never handed
/// out), everything else works and nothing else is lost; the CLI shows
/// each damaged record by name and removes it, after which the identity
/// is served again.
#[test]
fn damaged_store_records_are_named_refused_and_repairable() {
    let mut topo = Topology::new(1);
    let store = topo.file("damaged");
    let dir = store.to_string_lossy().to_string();
    let conf = |id: &str| {
        let mut c = configs::sticky("uplink0", &store, json!({}));
        c["args"] = json!({"cni": {"identity": id}});
        c
    };
    let mut ips = BTreeMap::new();
    for id in ["truncated", "empty", "corrupt", "intact"] {
        let pod = topo.add_pod(&format!("dmg-{id}"));
        let ip = call(&topo, 0, "ADD", &conf(id), id, &pod, "IgnoreUnknown=1").first_address();
        assert!(call(&topo, 0, "DEL", &conf(id), id, &pod, "IgnoreUnknown=1").success);
        topo.delete_netns(&pod.netns);
        ips.insert(id, ip);
    }
    let claims_dir = store.join(NET).join("claims");
    let path = |id: &str| claims_dir.join(&ips[id]);
    let whole = std::fs::read(path("truncated")).expect("claim");
    std::fs::write(path("truncated"), &whole[..whole.len() / 2]).expect("truncate");
    std::fs::write(path("empty"), b"").expect("empty");
    std::fs::write(path("corrupt"), [0xff, 0xfe, 0x00, 0x7b, 0x22]).expect("corrupt");
    std::fs::write(claims_dir.join("README.txt"), "left by someone\n").expect("foreign");

    // The damaged identities are refused, naming the record; no link left.
    for id in ["truncated", "empty", "corrupt"] {
        let pod = topo.add_pod(&format!("dmg2-{id}"));
        let r = call(
            &topo,
            0,
            "ADD",
            &conf(id),
            &format!("{id}-2"),
            &pod,
            "IgnoreUnknown=1",
        );
        assert_eq!(r.code(), Some(110), "{id}: {}", r.stdout);
        assert!(
            r.msg().contains(&ips[id]),
            "{id}: {:?} does not name the record",
            r.msg()
        );
        assert!(
            sticky_e2e::links_in(&pod.netns) == ["lo"],
            "{id}: a link was left"
        );
    }
    // Nothing else is lost: the intact identity keeps its address, and a
    // new one gets an address none of the damaged records names.
    let pod = topo.add_pod("dmg-intact-2");
    let r = call(
        &topo,
        0,
        "ADD",
        &conf("intact"),
        "intact-2",
        &pod,
        "IgnoreUnknown=1",
    );
    assert_eq!(r.first_address(), ips["intact"]);
    let pod = topo.add_pod("dmg-new");
    let fresh = call(
        &topo,
        0,
        "ADD",
        &conf("new"),
        "new",
        &pod,
        "IgnoreUnknown=1",
    )
    .first_address();
    assert!(
        !["truncated", "empty", "corrupt"]
            .iter()
            .any(|id| ips[id] == fresh),
        "{fresh} was damaged"
    );

    // The CLI shows every damaged record by name...
    let (ok, out, err) = sticky_e2e::scenario::run_cli(&["claims", "--dir", &dir]);
    assert!(ok, "{out}{err}");
    for name in [
        ips["truncated"].as_str(),
        ips["empty"].as_str(),
        ips["corrupt"].as_str(),
        "README.txt",
    ] {
        assert!(
            out.contains(name) && out.contains("damaged"),
            "claims does not show {name}: {out}"
        );
    }
    // ...and removes each; the identity is then served again.
    for name in [
        ips["truncated"].as_str(),
        ips["empty"].as_str(),
        ips["corrupt"].as_str(),
        "README.txt",
    ] {
        let (ok, out, err) = sticky_e2e::scenario::run_cli(&[
            "release",
            "--dir",
            &dir,
            "--network",
            NET,
            "--file",
            name,
        ]);
        assert!(ok, "release --file {name}: {out}{err}");
    }
    let pod = topo.add_pod("dmg-truncated-3");
    assert!(
        call(
            &topo,
            0,
            "ADD",
            &conf("truncated"),
            "truncated-3",
            &pod,
            "IgnoreUnknown=1"
        )
        .success
    );
    let by_identity = assert_invariants(&store, NET);
    assert_eq!(
        by_identity.get("intact").map(|ip| ip.to_string()),
        Some(ips["intact"].clone())
    );
}

/// State files through the real binary: every directory the plugin made
/// is 0700 and every file 0600 (the kubernetes store's node-local record
/// is written by the same code); a network directory that is a symlink (out
/// of the state directory) is refused by name and nothing is written
/// through it.
#[test]
fn state_is_private_and_symlinks_are_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let mut topo = Topology::new(1);
    let store = topo.file("private");
    let conf = {
        let mut c = configs::sticky("uplink0", &store, json!({}));
        c["args"] = json!({"cni": {"identity": "private-peer"}});
        c
    };
    let pod = topo.add_pod("private");
    assert!(call(&topo, 0, "ADD", &conf, "private", &pod, "IgnoreUnknown=1").success);
    let mut seen = 0;
    let mut stack = vec![store.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read store").flatten() {
            let meta = std::fs::symlink_metadata(e.path()).expect("stat");
            let mode = meta.permissions().mode() & 0o777;
            if meta.is_dir() {
                assert_eq!(mode, 0o700, "{} is {mode:o}", e.path().display());
                stack.push(e.path());
            } else {
                assert_eq!(mode, 0o600, "{} is {mode:o}", e.path().display());
            }
            seen += 1;
        }
    }
    assert!(seen >= 6, "too little state to judge: {seen} entries");

    // The network's directory replaced by a symlink to elsewhere.
    let elsewhere = topo.file("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    let linked = topo.file("linked");
    std::fs::create_dir_all(&linked).expect("mkdir");
    std::os::unix::fs::symlink(&elsewhere, linked.join(NET)).expect("symlink");
    let mut conf2 = configs::sticky("uplink0", &linked, json!({}));
    conf2["args"] = json!({"cni": {"identity": "linked-peer"}});
    let pod2 = topo.add_pod("linked");
    let r = call(&topo, 0, "ADD", &conf2, "linked", &pod2, "IgnoreUnknown=1");
    assert!(!r.success, "{}", r.stdout);
    assert!(r.msg().contains("symlink"), "{}", r.msg());
    assert_eq!(
        std::fs::read_dir(&elsewhere).expect("read").count(),
        0,
        "written through the symlink"
    );
    assert!(
        sticky_e2e::links_in(&pod2.netns) == ["lo"],
        "a link was left"
    );
}
