//! The plugin driven by the real libcni (Debian golang-github-appc-cni-dev)
//! as Multus and runtimes drive it: a network list (ours, then the
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
        "{} is missing: scripts/test.sh builds it with Debian's golang-go",
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
    let cni_path = sticky_e2e::cni_path_with_ours();
    let cache = topo.file("cache");
    let run = |actions: &[&str]| {
        let out = Command::new("ip")
            .args(["netns", "exec", &topo.node(0).netns])
            .arg(driver())
            .args([
                "-conflist",
                &conflist.to_string_lossy(),
                "-netns",
                &pod.path,
                "-container",
                "libcni-ctr",
                "-ifname",
                "net1",
            ])
            .args([
                "-cni-path",
                &cni_path,
                "-cache-dir",
                &cache.to_string_lossy(),
            ])
            .args([
                "-pod-namespace",
                "bgp",
                "-pod-name",
                "speaker-0",
                "-mac",
                "02:13:00:00:00:77",
            ])
            .args(["-ips", &format!("{SUBNET_PREFIX}.77/24")])
            .args(actions)
            .output()
            .expect("run libcni-driver");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
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
