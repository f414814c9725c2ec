//! The holes a new user found, closed: two nodes with their own file
//! stores (as two real nodes have) never hand one identity's address to a
//! second live pod, with the shipped probe defaults, for a configured
//! identity, a StatefulSet-style identity and on IPv6, in-process and
//! behind the reference macvlan; and a pod of another namespace cannot take
//! a configured identity's address.

use std::path::Path;

use serde_json::{json, Value};
use sticky_e2e::scenario::{call, pod_args};
use sticky_e2e::store::claims;
use sticky_e2e::{
    configs, links_in, our_ipam, reference_plugin, CniCall, CniReply, Pod, Topology, SUBNET_PREFIX,
};

const NET: &str = "macnet";

/// The BGP peer NAD of examples/nad-sticky-bgp-peer.yaml on the test
/// fabric, with this node's own store; no probe key (the shipped default).
fn bgp_peer(store: &Path) -> Value {
    let mut conf = configs::sticky(
        "uplink0",
        store,
        json!({
            "rangeStart": format!("{SUBNET_PREFIX}.2"),
            "rangeEnd": format!("{SUBNET_PREFIX}.9"),
            "reservations": {"bgp-peer-a": format!("{SUBNET_PREFIX}.2")},
        }),
    );
    conf["stickyMac"] = json!(true);
    conf["args"] = json!({"cni": {"identity": "bgp-peer-a"}});
    conf
}

/// ADD by our plugin from `node`, the pod's netns name as container ID.
fn add_pod(topo: &Topology, node: usize, conf: &Value, pod: &Pod, args: &str) -> CniReply {
    call(topo, node, "ADD", conf, &pod.netns, pod, args)
}

/// The MAC of `ifname` in a pod, as the kernel has it.
fn mac_in(pod: &Pod, ifname: &str) -> String {
    let out = sticky_e2e::ip(&["-n", &pod.netns, "-j", "link", "show", ifname]);
    let links: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    links[0]["address"].as_str().unwrap_or_default().to_string()
}

/// A refused second ADD: code 11 naming the live holder's MAC, no link
/// left in the pod, and nothing written to the second node's store.
#[track_caller]
fn assert_refused_by_the_wire(reply: &CniReply, live_mac: &str, pod: &Pod, store: &Path) {
    assert_refused_on_the_wire(reply, live_mac, store);
    assert_eq!(
        links_in(&pod.netns),
        vec!["lo".to_string()],
        "a link was left behind"
    );
}

/// The same, for a main plugin whose own link is its business.
#[track_caller]
fn assert_refused_on_the_wire(reply: &CniReply, live_mac: &str, store: &Path) {
    assert_eq!(
        reply.code(),
        Some(11),
        "a second live holder was granted the address: {} {}",
        reply.stdout,
        reply.stderr
    );
    assert!(
        reply.msg().contains(live_mac),
        "the refusal must name the answering MAC {live_mac}: {}",
        reply.msg()
    );
    let left: Vec<String> = claims(store, NET)
        .iter()
        .filter(|c| c.holder.is_some())
        .map(|c| format!("{} {:?}", c.ip, c.holder))
        .collect();
    assert!(left.is_empty(), "the refused ADD left holders: {left:?}");
}

#[test]
fn a_configured_identity_is_never_live_on_two_nodes_with_two_stores() {
    let mut topo = Topology::new(2);
    let (store1, store2) = (topo.file("node1-store"), topo.file("node2-store"));
    let first = topo.add_pod("peer-node1");
    let reply = add_pod(
        &topo,
        0,
        &bgp_peer(&store1),
        &first,
        &pod_args("bgp", "speaker-0", "uid-1"),
    );
    assert_eq!(reply.first_address(), format!("{SUBNET_PREFIX}.2"));
    let live_mac = mac_in(&first, "net1");

    let second = topo.add_pod("peer-node2");
    let started = std::time::Instant::now();
    let refused = add_pod(
        &topo,
        1,
        &bgp_peer(&store2),
        &second,
        &pod_args("bgp", "speaker-0", "uid-2"),
    );
    eprintln!("refusal by the wire took {:?}", started.elapsed());
    assert_refused_by_the_wire(&refused, &live_mac, &second, &store2);
    assert!(topo.ping_from(&topo.router.clone(), &format!("{SUBNET_PREFIX}.2")));

    // Once node1 is gone for real, node2 gets the address.
    topo.crash_node(0, &[&first]);
    let taken = add_pod(
        &topo,
        1,
        &bgp_peer(&store2),
        &second,
        &pod_args("bgp", "speaker-0", "uid-2"),
    );
    assert_eq!(taken.first_address(), format!("{SUBNET_PREFIX}.2"));
}

#[test]
fn a_pod_name_identity_is_never_live_on_two_nodes_with_two_stores() {
    let mut topo = Topology::new(2);
    let (store1, store2) = (topo.file("node1-store"), topo.file("node2-store"));
    let conf =
        |store: &Path| configs::sticky("uplink0", store, json!({"identityPolicy": "podName"}));
    let first = topo.add_pod("db0-node1");
    let granted = add_pod(
        &topo,
        0,
        &conf(&store1),
        &first,
        &pod_args("db", "db-0", "uid-1"),
    )
    .first_address();
    let live_mac = mac_in(&first, "net1");
    // node2's store has never seen db/db-0; its first free address is the
    // same one node1's store gave (one range, two stores).
    let second = topo.add_pod("db0-node2");
    let refused = add_pod(
        &topo,
        1,
        &conf(&store2),
        &second,
        &pod_args("db", "db-0", "uid-2"),
    );
    assert!(refused.msg().contains(&granted), "{}", refused.msg());
    assert_refused_by_the_wire(&refused, &live_mac, &second, &store2);
}

#[test]
fn an_ipv6_identity_is_never_live_on_two_nodes_with_two_stores() {
    let mut topo = Topology::new(2);
    let (store1, store2) = (topo.file("node1-store"), topo.file("node2-store"));
    let conf = |store: &Path| {
        let mut c = configs::sticky(
            "uplink0",
            store,
            json!({
                "subnet": "fd00:213::/64",
                "rangeStart": "fd00:213::10",
                "rangeEnd": "fd00:213::20",
                "gateway": "fd00:213::1",
                "routes": [],
                "reservations": {"bgp-peer-a": "fd00:213::10"},
            }),
        );
        c["args"] = json!({"cni": {"identity": "bgp-peer-a"}});
        c
    };
    let first = topo.add_pod("v6-node1");
    assert_eq!(
        add_pod(
            &topo,
            0,
            &conf(&store1),
            &first,
            &pod_args("bgp", "speaker-0", "uid-1")
        )
        .first_address(),
        "fd00:213::10"
    );
    let live_mac = mac_in(&first, "net1");
    let second = topo.add_pod("v6-node2");
    let refused = add_pod(
        &topo,
        1,
        &conf(&store2),
        &second,
        &pod_args("bgp", "speaker-0", "uid-2"),
    );
    assert_refused_by_the_wire(&refused, &live_mac, &second, &store2);
    topo.crash_node(0, &[&first]);
    assert_eq!(
        add_pod(
            &topo,
            1,
            &conf(&store2),
            &second,
            &pod_args("bgp", "speaker-0", "uid-2")
        )
        .first_address(),
        "fd00:213::10"
    );
}

#[test]
fn the_standalone_ipam_behind_the_reference_macvlan_is_refused_too() {
    let mut topo = Topology::new(2);
    let (store1, store2) = (topo.file("node1-store"), topo.file("node2-store"));
    let conf = |store: &Path| {
        let mut c = bgp_peer(store);
        c["type"] = json!("macvlan");
        c.as_object_mut().map(|o| o.remove("stickyMac"));
        c
    };
    let call = |topo: &Topology, node: usize, store: &Path, pod: &Pod, uid: &str| {
        CniCall::new(
            &reference_plugin("macvlan"),
            &topo.node(node).netns,
            "ADD",
            conf(store),
        )
        .container(&pod.netns)
        .netns(&pod.path)
        .args(&pod_args("bgp", "speaker-0", uid))
        .cni_path(&sticky_e2e::cni_path_with_ours())
        .run()
    };
    assert!(our_ipam().exists());
    let first = topo.add_pod("ref-node1");
    assert_eq!(
        call(&topo, 0, &store1, &first, "uid-1").first_address(),
        format!("{SUBNET_PREFIX}.2")
    );
    let live_mac = mac_in(&first, "net1");
    let second = topo.add_pod("ref-node2");
    let refused = call(&topo, 1, &store2, &second, "uid-2");
    // The reference macvlan passes our error on (its link is its own).
    assert_refused_on_the_wire(&refused, &live_mac, &store2);
}

#[test]
fn a_pod_of_another_namespace_cannot_take_a_configured_identity() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let conf = bgp_peer(&store);
    let first = topo.add_pod("speaker");
    let ip = add_pod(
        &topo,
        0,
        &conf,
        &first,
        &pod_args("bgp", "speaker-0", "uid-1"),
    )
    .first_address();
    // The holder crashes; no DEL ever comes.
    topo.delete_netns(&first.netns);

    let evil = topo.add_pod("evil");
    let refused = add_pod(&topo, 0, &conf, &evil, &pod_args("evil", "x", "uid-evil"));
    assert_eq!(refused.code(), Some(114), "{}", refused.stdout);
    for needle in ["bgp-peer-a", "\"bgp\"", "\"evil\"", "namespaces"] {
        assert!(
            refused.msg().contains(needle),
            "{needle}: {}",
            refused.msg()
        );
    }
    assert_eq!(links_in(&evil.netns), vec!["lo".to_string()]);
    let held: Vec<_> = claims(&store, NET)
        .into_iter()
        .filter(|c| c.identity == "bgp-peer-a")
        .collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].namespace.as_deref(), Some("bgp"));
    assert!(
        held[0]
            .holder
            .as_ref()
            .is_some_and(|h| h.pod_namespace.as_deref() == Some("bgp")),
        "the claim still names the bgp pod: {:?}",
        held[0].holder
    );

    // The operator lists the namespace: allowed from there, still not from others.
    let mut shared = conf.clone();
    shared["ipam"]["reservations"]["bgp-peer-a"] =
        json!({"ip": ip, "namespaces": ["bgp", "bgp-canary"]});
    let canary = topo.add_pod("canary");
    assert_eq!(
        add_pod(
            &topo,
            0,
            &shared,
            &canary,
            &pod_args("bgp-canary", "speaker-0", "uid-c")
        )
        .first_address(),
        ip
    );
    let other = topo.add_pod("other");
    let refused = add_pod(&topo, 0, &shared, &other, &pod_args("evil", "x", "uid-e2"));
    assert_eq!(refused.code(), Some(114), "{}", refused.stdout);
    assert!(
        refused
            .msg()
            .contains("ipam.reservations[\"bgp-peer-a\"].namespaces"),
        "{}",
        refused.msg()
    );
}

/// The small things a new user tripped over: hints that work, errors that
/// say what happened, `--help` everywhere, a fixed state vocabulary,
/// RFC 3339 log lines.
#[test]
fn the_operator_surface_says_what_it_means() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let dir = store.to_string_lossy().to_string();
    let log = topo.file("plugin.log");
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["logFile"] = json!(log);
    conf["args"] = json!({"cni": {"identity": "db-a"}});
    let pod = topo.add_pod("cli");
    let ip = add_pod(&topo, 0, &conf, &pod, &pod_args("db", "a", "uid-a")).first_address();

    // Every subcommand answers --help.
    for command in [
        "claims",
        "release",
        "reconcile",
        "import-host-local",
        "install",
        "crd",
    ] {
        let (ok, out, err) = sticky_e2e::scenario::run_cli(&[command, "--help"]);
        assert!(ok && out.contains(command), "{command} --help: {out}{err}");
    }

    // claims --json: a fixed vocabulary, the reason apart, and from where.
    let (ok, out, err) = sticky_e2e::scenario::run_cli(&["claims", "--dir", &dir, "--json"]);
    assert!(ok, "{err}");
    let rows: Value = serde_json::from_str(&out).expect("claims --json");
    let row = &rows[0];
    assert_eq!(row["state"], "held", "{row}");
    assert!(
        row["reason"].as_str().is_some_and(|r| r.contains("netns")),
        "{row}"
    );
    assert!(
        row["judgedFrom"]
            .as_str()
            .is_some_and(|f| f.starts_with("node ")),
        "{row}"
    );
    topo.delete_netns(&pod.netns);
    let (_, out, _) = sticky_e2e::scenario::run_cli(&["claims", "--dir", &dir, "--json"]);
    let rows: Value = serde_json::from_str(&out).expect("claims --json");
    assert_eq!(rows[0]["state"], "dead", "{}", rows[0]);
    assert!(rows[0]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("no longer exists")));

    // release --ip of an address no claim holds is an error saying so.
    let (ok, out, err) = sticky_e2e::scenario::run_cli(&[
        "release",
        "--dir",
        &dir,
        "--network",
        NET,
        "--ip",
        "192.0.2.7",
    ]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("192.0.2.7") && err.contains("nothing was released"),
        "{err}"
    );

    // A damaged record: the hint names a command that works.
    std::fs::write(store.join(NET).join("claims").join(&ip), b"{ not json").unwrap();
    let pod = topo.add_pod("cli-2");
    let reply = add_pod(&topo, 0, &conf, &pod, &pod_args("db", "a", "uid-a2"));
    assert_eq!(reply.code(), Some(110), "{}", reply.stdout);
    let hint = reply.msg();
    let command = hint
        .split('`')
        .find(|part| part.starts_with("sticky-macvlan release"))
        .unwrap_or_else(|| panic!("no release command in {hint}"));
    let mut args: Vec<&str> = command.split_whitespace().skip(1).collect();
    args.extend(["--dir", &dir]);
    let (ok, out, err) = sticky_e2e::scenario::run_cli(&args);
    assert!(ok, "the hint's own command failed: {command}: {out}{err}");

    // The log file's lines start with an RFC 3339 UTC time.
    let text = std::fs::read_to_string(&log).expect("log file");
    let first = text.lines().next().unwrap_or_default();
    let stamp = first.split(' ').next().unwrap_or_default();
    assert!(
        stamp.len() == 24
            && stamp.ends_with('Z')
            && stamp.as_bytes()[10] == b'T'
            && stamp.starts_with("20"),
        "{first}"
    );

    // A missing kubeconfig is not blamed on RBAC: no request was made.
    let mut kube = configs::sticky(
        "uplink0",
        &store,
        json!({"store": {"type": "kubernetes", "kubeconfig": "/nonexistent/kubeconfig"}}),
    );
    kube["args"] = json!({"cni": {"identity": "db-b"}});
    let pod = topo.add_pod("cli-3");
    let reply = add_pod(&topo, 0, &kube, &pod, &pod_args("db", "b", "uid-b"));
    assert!(!reply.success);
    assert!(
        reply.msg().contains("/nonexistent/kubeconfig")
            && reply.msg().contains("no request was made")
            && !reply.msg().contains("RBAC"),
        "{}",
        reply.msg()
    );
}

/// Migration from host-local: the parent directory is refused naming the
/// layout; imported holders carry no netns, so the container runtime
/// (a real containerd with its CRI) says whether their sandbox exists:
/// reconcile frees the stale entry and keeps the live one.
#[test]
fn imported_host_local_holders_are_judged_by_the_container_runtime() {
    let topo = Topology::new(1);
    let runtime = sticky_e2e::runtime::Containerd::start(&topo, 0);
    let socket = runtime.socket.to_string_lossy().to_string();
    let live = runtime.run_sandbox("db", "db-0", "uid-db-0");
    let gone = runtime.run_sandbox("db", "db-1", "uid-db-1");
    // kubelet removed this sandbox; its DEL never reached host-local.
    runtime.remove_sandbox(&gone);

    let host_local = topo.file("host-local");
    let net_dir = host_local.join(NET);
    std::fs::create_dir_all(&net_dir).unwrap();
    let (live_ip, gone_ip) = (format!("{SUBNET_PREFIX}.10"), format!("{SUBNET_PREFIX}.11"));
    std::fs::write(net_dir.join(&live_ip), format!("{live}\r\nnet1")).unwrap();
    std::fs::write(net_dir.join(&gone_ip), format!("{gone}\r\nnet1")).unwrap();
    std::fs::write(net_dir.join("last_reserved_ip.0"), &gone_ip).unwrap();
    std::fs::write(net_dir.join("lock"), "").unwrap();
    let store = topo.file("store");
    let dir = store.to_string_lossy().to_string();

    // The parent directory: refused, naming the layout and the path meant.
    let parent = host_local.to_string_lossy().to_string();
    let (ok, out, err) = sticky_e2e::scenario::run_cli(&[
        "import-host-local",
        "--network",
        NET,
        "--from",
        &parent,
        "--dir",
        &dir,
        "--cri-socket",
        &socket,
    ]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("parent")
            && err.contains(&net_dir.to_string_lossy().to_string())
            && err.contains("last_reserved_ip"),
        "{err}"
    );
    assert!(
        !store.join(NET).exists(),
        "a refused import created a store"
    );

    let from = net_dir.to_string_lossy().to_string();
    let (ok, out, err) = sticky_e2e::scenario::run_cli(&[
        "import-host-local",
        "--network",
        NET,
        "--from",
        &from,
        "--dir",
        &dir,
        "--cri-socket",
        &socket,
    ]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("imported 2")
            && out.contains("has 1 of these sandboxes")
            && out.contains(&gone_ip),
        "{out}"
    );
    let imported = claims(&store, NET);
    let live_claim = imported
        .iter()
        .find(|c| c.ip.to_string() == live_ip)
        .expect("live claim");
    let holder = live_claim.holder.as_ref().expect("held");
    assert_eq!(
        (
            holder.pod_namespace.as_deref(),
            holder.pod_name.as_deref(),
            holder.pod_uid.as_deref()
        ),
        (Some("db"), Some("db-0"), Some("uid-db-0")),
        "the import records the sandbox's pod from the runtime"
    );

    // reconcile asks the runtime: the stale entry goes, the live one stays.
    let (ok, out, err) =
        sticky_e2e::scenario::run_cli(&["reconcile", "--dir", &dir, "--cri-socket", &socket]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("released {gone_ip}")) && out.contains("has no pod sandbox"),
        "{out}"
    );
    assert!(
        out.contains("1 dead holders released") && out.contains("1 live holders kept"),
        "{out}"
    );
    // The released one stays as a tombstone: the runtime's word is a
    // judgement, so its address is probed before it is bound again (I7).
    let all = claims(&store, NET);
    let left: Vec<String> = all
        .iter()
        .filter(|c| !c.is_tombstone())
        .map(|c| c.ip.to_string())
        .collect();
    assert_eq!(left, vec![live_ip.clone()]);
    assert!(
        all.iter()
            .any(|c| c.ip.to_string() == gone_ip && c.is_tombstone()),
        "{all:?}"
    );

    // Without a runtime to ask, nothing is concluded: the holder is kept.
    let (ok, out, _) = sticky_e2e::scenario::run_cli(&[
        "reconcile",
        "--dir",
        &dir,
        "--cri-socket",
        "/nonexistent/cri.sock",
    ]);
    assert!(ok && out.contains("0 dead holders released"), "{out}");

    // Once kubelet removes the live sandbox too, it is freed.
    runtime.remove_sandbox(&live);
    let (ok, out, _) =
        sticky_e2e::scenario::run_cli(&["reconcile", "--dir", &dir, "--cri-socket", &socket]);
    assert!(ok && out.contains(&format!("released {live_ip}")), "{out}");
    assert!(claims(&store, NET).iter().all(|c| c.is_tombstone()));
}
