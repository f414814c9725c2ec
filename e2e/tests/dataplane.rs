//! Data-plane options on real namespaces, with the file store: the ARP
//! probe of fresh allocations (`probe.fresh`) against a host that squats
//! on an address, and the gateway check.

use serde_json::json;
use sticky_e2e::store::claims;
use sticky_e2e::{configs, ip, links_in, our_plugin, CniCall, Topology, SUBNET_PREFIX};

/// A host on the fabric that nobody allocated (a misconfigured static IP)
/// answers for the first address of the range: with `probe.fresh`, ADD
/// refuses it naming the host's MAC and leaves nothing; the claim is not
/// kept either, so the next ADD is a clean retry.
#[test]
fn probing_fresh_allocations_catches_a_squatter() {
    let mut topo = Topology::new(1);
    let squatter = topo.add_pod("squatter");
    topo.uplink(&squatter.netns, "eth0");
    let squatted = format!("{SUBNET_PREFIX}.10");
    ip(&[
        "-n",
        &squatter.netns,
        "addr",
        "add",
        &format!("{squatted}/24"),
        "dev",
        "eth0",
    ]);
    let mac = {
        let out = std::process::Command::new("ip")
            .args(["-n", &squatter.netns, "-j", "link", "show", "eth0"])
            .output()
            .expect("ip link");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v[0]["address"].as_str().unwrap_or_default().to_string()
    };
    let store = topo.file("store");
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["probe"] = json!({"fresh": true});
    let pod = topo.add_pod("p1");
    let refused = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", conf.clone())
        .container("p1")
        .netns(&pod.path)
        .run();
    assert_eq!(refused.code(), Some(11), "{}", refused.stdout);
    assert!(
        refused.msg().contains(&squatted) && refused.msg().contains(&mac),
        "{}",
        refused.msg()
    );
    assert_eq!(links_in(&pod.netns), ["lo"]);
    assert!(
        claims(&store, "macnet").is_empty(),
        "a refused ADD kept its claim"
    );
    // Without probe.fresh (the default) a fresh allocation is not probed.
    conf["probe"] = json!({});
    let plain = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", conf)
        .container("p1")
        .netns(&pod.path)
        .run();
    assert!(plain.success, "{}", plain.stdout);
}

/// `gatewayCheck`: with the router at the gateway address ADD succeeds;
/// with a gateway nobody answers for, ADD fails naming it and leaves
/// nothing behind.
#[test]
fn gateway_check_reports_a_silent_gateway() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["gatewayCheck"] = json!(true);
    let good = topo.add_pod("good");
    CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", conf.clone())
        .container("good")
        .netns(&good.path)
        .run()
        .expect_ok();
    let silent = format!("{SUBNET_PREFIX}.254");
    let mut bad_conf = configs::sticky("uplink0", &topo.file("store2"), json!({"gateway": silent}));
    bad_conf["gatewayCheck"] = json!(true);
    let bad = topo.add_pod("bad");
    let refused = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", bad_conf)
        .container("bad")
        .netns(&bad.path)
        .run();
    assert_eq!(refused.code(), Some(11), "{}", refused.stdout);
    assert!(
        refused
            .msg()
            .contains(&format!("gateway {silent} did not answer")),
        "{}",
        refused.msg()
    );
    assert_eq!(links_in(&bad.netns), ["lo"]);
    assert!(claims(&topo.file("store2"), "macnet").is_empty());
}
