//! The plugin driven by the real libcni (v1.3.0 from its module, built by
//! scripts/test.sh from e2e/tools/libcni-driver) as Multus and runtimes
//! drive it: a network list (ours, then the
//! reference tuning plugin on our prevResult), Multus-style CNI_ARGS,
//! mac and ips capability args, the libcni result cache; then traffic.

use std::process::Command;

use serde_json::json;
use sticky_e2e::configs;
use sticky_e2e::state::{interface_state, mac_of};
use sticky_e2e::{target_dir, Topology, SUBNET_PREFIX};

fn driver() -> std::path::PathBuf {
    let p = std::env::var("LIBCNI_DRIVER")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| target_dir().join("../libcni-driver"));
    assert!(
        p.exists(),
        "{} is missing: scripts/test.sh builds it from e2e/tools/libcni-driver",
        p.display()
    );
    p
}

#[test]
fn libcni_add_check_ping_del_with_capabilities() {
    let mut topo = Topology::new(1);
    let pod = topo.add_pod("libcni");
    let dir = topo.file("hl");
    let mut our = configs::macvlan(
        "sticky-macvlan",
        "1.0.0",
        "uplink0",
        configs::host_local(&dir),
    );
    our["capabilities"] = json!({"mac": true, "ips": true});
    let list = json!({"cniVersion": "1.0.0", "name": "macnet", "plugins": [our, {"type": "tuning", "mtu": 1450}]});
    let conflist = topo.file("net.conflist");
    std::fs::write(&conflist, list.to_string()).expect("write conflist");
    let ips = format!("{SUBNET_PREFIX}.77/24");
    let capabilities = [
        "-pod-namespace",
        "bgp",
        "-pod-name",
        "speaker-0",
        "-mac",
        "02:13:00:00:00:77",
        "-ips",
        &ips,
    ];
    let run = |actions: &[&str]| {
        let args: Vec<&str> = capabilities.iter().chain(actions).copied().collect();
        drive(&topo, &conflist, &pod, "libcni-ctr", &args)
    };
    let (ok, stdout, stderr) = run(&["add"]);
    assert!(ok, "libcni ADD failed: {stderr}");
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).expect("result JSON");
    assert_eq!(
        result["ips"][0]["address"],
        format!("{SUBNET_PREFIX}.77/24"),
        "{result}"
    );
    assert_eq!(
        mac_of(&pod.netns, "net1").as_deref(),
        Some("02:13:00:00:00:77")
    );
    assert_eq!(
        interface_state(&pod.netns, "net1")["link"]["mtu"],
        1450,
        "tuning ran on our prevResult"
    );
    assert!(
        topo.ping_from(&pod.netns, &format!("{SUBNET_PREFIX}.1")),
        "pod cannot reach the router over net1"
    );

    let (ok, _, stderr) = run(&["check"]);
    assert!(ok, "libcni CHECK failed: {stderr}");
    let (ok, _, stderr) = run(&["del", "del"]);
    assert!(ok, "libcni DEL failed: {stderr}");
    assert!(interface_state(&pod.netns, "net1").is_null());
    assert!(configs::host_local_allocations(&dir).is_empty());
}

/// Runs the libcni driver on `conflist` for one attachment; `args` are the
/// driver's pod and capability flags, then the actions.
fn drive(
    topo: &Topology,
    conflist: &std::path::Path,
    pod: &sticky_e2e::Pod,
    container: &str,
    args: &[&str],
) -> (bool, String, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", &topo.node(0).netns])
        .arg(driver())
        .args([
            "-conflist",
            &conflist.to_string_lossy(),
            "-netns",
            &pod.path,
        ])
        .args(["-container", container, "-ifname", "net1"])
        .args(["-cni-path", &sticky_e2e::cni_path_with_ours()])
        .args(["-cache-dir", &topo.file("cache").to_string_lossy()])
        .args(args)
        .output()
        .expect("run libcni-driver");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The driver flags for pod db/db-0 with `uid`, then `action`.
fn db_pod<'a>(uid: &'a str, action: &'a str) -> [&'a str; 7] {
    [
        "-pod-namespace",
        "db",
        "-pod-name",
        "db-0",
        "-pod-uid",
        uid,
        action,
    ]
}

/// Dual-stack through libcni: ADD, CHECK and DEL of sticky-ipam with one
/// IPv4 and one IPv6 range set give the same result as the reference
/// macvlan + host-local on the same ranges; and the pod's next sandbox
/// gets both addresses back.
#[test]
fn libcni_dual_stack_matches_the_reference_and_sticks() {
    let mut topo = Topology::new(1);
    let mut results = Vec::new();
    for (name, plugin, ipam_type) in [
        ("ref", "macvlan", "host-local"),
        ("ours", "sticky-macvlan", "sticky-ipam"),
    ] {
        let mut ipam = configs::host_local_dual_stack(&topo.file(&format!("{name}-store")));
        ipam["type"] = json!(ipam_type);
        if ipam_type == "sticky-ipam" {
            ipam["identityPolicy"] = json!("podName");
        }
        let net = configs::macvlan(plugin, "1.0.0", "uplink0", ipam);
        let list = json!({"cniVersion": "1.0.0", "name": "macnet", "plugins": [net]});
        let conflist = topo.file(&format!("{name}.conflist"));
        std::fs::write(&conflist, list.to_string()).expect("write conflist");
        let pod = topo.add_pod(&format!("{name}-ds"));
        let (ok, stdout, stderr) = drive(
            &topo,
            &conflist,
            &pod,
            &format!("{name}-1"),
            &db_pod("uid-1", "add"),
        );
        assert!(ok, "{name}: libcni ADD failed: {stderr}");
        let result: serde_json::Value = serde_json::from_str(stdout.trim()).expect("result JSON");
        let (ok, _, stderr) = drive(
            &topo,
            &conflist,
            &pod,
            &format!("{name}-1"),
            &db_pod("uid-1", "check"),
        );
        assert!(ok, "{name}: libcni CHECK failed: {stderr}");
        let (ok, _, stderr) = drive(
            &topo,
            &conflist,
            &pod,
            &format!("{name}-1"),
            &db_pod("uid-1", "del"),
        );
        assert!(ok, "{name}: libcni DEL failed: {stderr}");
        assert!(interface_state(&pod.netns, "net1").is_null());
        if name == "ours" {
            // The pod's next sandbox: both addresses come back.
            let again_pod = topo.add_pod("ours-ds-2");
            let (ok, stdout, stderr) = drive(
                &topo,
                &conflist,
                &again_pod,
                "ours-2",
                &db_pod("uid-2", "add"),
            );
            assert!(ok, "libcni ADD of the next sandbox failed: {stderr}");
            let again: serde_json::Value =
                serde_json::from_str(stdout.trim()).expect("result JSON");
            assert_eq!(
                again["ips"], result["ips"],
                "the sticky addresses came back"
            );
            drive(
                &topo,
                &conflist,
                &again_pod,
                "ours-2",
                &db_pod("uid-2", "del"),
            );
        }
        results.push(result);
    }
    assert_eq!(
        results[0]["ips"].as_array().map(Vec::len),
        Some(2),
        "{}",
        results[0]
    );
    assert_eq!(
        results[1]["ips"], results[0]["ips"],
        "ours: {} reference: {}",
        results[1], results[0]
    );
    assert_eq!(results[1]["routes"], results[0]["routes"]);
}

/// CNI 1.1.0 GC and STATUS through libcni 1.3 (the client runtimes use):
/// two attachments on the file store; a GC naming only the first as valid
/// releases the second's claim and keeps the first's; STATUS answers.
#[test]
fn libcni_gc_and_status_at_cni_1_1_0() {
    let mut topo = Topology::new(1);
    let a = topo.add_pod("gc-a");
    let b = topo.add_pod("gc-b");
    let store = topo.file("store");
    let mut net = configs::sticky("uplink0", &store, json!({}));
    net["cniVersion"] = json!("1.1.0");
    let list = json!({"cniVersion": "1.1.0", "name": "macnet", "plugins": [net]});
    let conflist = topo.file("gc.conflist");
    std::fs::write(&conflist, list.to_string()).expect("write conflist");
    for (pod, container, name) in [(&a, "ctr-a", "a"), (&b, "ctr-b", "b")] {
        let (ok, _, stderr) = drive(
            &topo,
            &conflist,
            pod,
            container,
            &["-pod-name", name, "add"],
        );
        assert!(ok, "libcni ADD {name}: {stderr}");
    }
    assert_eq!(
        sticky_e2e::store::claims(&store, "macnet").len(),
        2,
        "two attachments, two claims"
    );
    let (ok, _, stderr) = drive(
        &topo,
        &conflist,
        &a,
        "ctr-a",
        &["-valid", "ctr-a/net1", "gc"],
    );
    assert!(ok, "libcni GC: {stderr}");
    let left = sticky_e2e::store::claims(&store, "macnet");
    assert_eq!(
        left.len(),
        1,
        "GC released the attachment it was not told about: {left:?}"
    );
    assert_eq!(
        left[0].holder.as_ref().map(|h| h.container_id.as_str()),
        Some("ctr-a"),
        "the valid attachment keeps its claim"
    );
    let (ok, _, stderr) = drive(&topo, &conflist, &a, "ctr-a", &["status"]);
    assert!(ok, "libcni STATUS: {stderr}");
}
