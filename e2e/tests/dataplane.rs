//! Data-plane options on real namespaces, with the file store: the ARP
//! probe of fresh allocations (`probe.fresh`) against a host that squats
//! on an address, and the gateway check.

use serde_json::{json, Value};
use sticky_e2e::store::claims;
use sticky_e2e::{configs, ip, links_in, CniReply, Pod, Topology, SUBNET_PREFIX};

/// ADD on node 1 for `pod` as container `cid`.
fn add_on_first_node(topo: &Topology, conf: Value, pod: &Pod, cid: &str) -> CniReply {
    sticky_e2e::scenario::call(topo, 0, "ADD", &conf, cid, pod, "")
}

/// A host on the fabric that nobody allocated (a misconfigured static IP)
/// with `addr` on its interface (at once: no DAD of its own): its MAC.
fn squat(topo: &mut Topology, addr: &str) -> String {
    let squatter = topo.add_pod("squatter");
    topo.uplink(&squatter.netns, "eth0");
    ip(&[
        "-n",
        &squatter.netns,
        "addr",
        "add",
        addr,
        "dev",
        "eth0",
        "nodad",
    ]);
    let out = std::process::Command::new("ip")
        .args(["-n", &squatter.netns, "-j", "link", "show", "eth0"])
        .output()
        .expect("ip link");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v[0]["address"].as_str().unwrap_or_default().to_string()
}

/// A host on the fabric that nobody allocated (a misconfigured static IP)
/// answers for the first address of the range: with `probe.fresh`, ADD
/// refuses it naming the host's MAC and leaves nothing; the claim is not
/// kept either, so the next ADD is a clean retry.
#[test]
fn probing_fresh_allocations_catches_a_squatter() {
    let mut topo = Topology::new(1);
    let squatted = format!("{SUBNET_PREFIX}.10");
    let mac = squat(&mut topo, &format!("{squatted}/24"));
    let store = topo.file("store");
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["probe"] = json!({"fresh": true});
    let pod = topo.add_pod("p1");
    let refused = add_on_first_node(&topo, conf.clone(), &pod, "p1");
    refused.expect_refused(11, &[&squatted, &mac]);
    assert_eq!(links_in(&pod.netns), ["lo"]);
    assert!(
        claims(&store, "macnet").is_empty(),
        "a refused ADD kept its claim"
    );
    // Without probe.fresh (the default) a fresh allocation is not probed.
    conf["probe"] = json!({});
    let plain = add_on_first_node(&topo, conf, &pod, "p1");
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
    add_on_first_node(&topo, conf.clone(), &good, "good").expect_ok();
    let silent = format!("{SUBNET_PREFIX}.254");
    let mut bad_conf = configs::sticky("uplink0", &topo.file("store2"), json!({"gateway": silent}));
    bad_conf["gatewayCheck"] = json!(true);
    let bad = topo.add_pod("bad");
    let refused = add_on_first_node(&topo, bad_conf, &bad, "bad");
    refused.expect_refused(11, &[&format!("gateway {silent} did not answer")]);
    assert_eq!(links_in(&bad.netns), ["lo"]);
    assert!(claims(&topo.file("store2"), "macnet").is_empty());
}

/// `gatewayCheck` on a dual-stack network: the router answers ARP for its
/// IPv4 address and neighbour solicitations for its IPv6 one; a silent
/// IPv6 gateway is named.
#[test]
fn gateway_check_covers_ipv6_gateways() {
    let mut topo = Topology::new(1);
    let dual = |store: std::path::PathBuf, v6_gateway: &str| {
        let mut ipam = configs::host_local_dual_stack(&store);
        ipam["type"] = json!("sticky-ipam");
        ipam["ranges"][1][0]["gateway"] = json!(v6_gateway);
        let mut c = configs::macvlan(configs::OUR_TYPE, "1.0.0", "uplink0", ipam);
        c["gatewayCheck"] = json!(true);
        c
    };
    let good = topo.add_pod("good6");
    let ok = add_on_first_node(&topo, dual(topo.file("s1"), "fd00:213::1"), &good, "good6");
    assert!(ok.success, "{}", ok.stdout);
    assert_eq!(ok.addresses().len(), 2);
    // Its addresses are the next store's first ones too (DAD would
    // rightly refuse them while it is up).
    let good_ns = good.netns.clone();
    topo.delete_netns(&good_ns);
    let bad = topo.add_pod("bad6");
    let refused = add_on_first_node(&topo, dual(topo.file("s2"), "fd00:213::fe"), &bad, "bad6");
    refused.expect_refused(
        11,
        &["gateway fd00:213::fe did not answer neighbour solicitation"],
    );
    assert_eq!(links_in(&bad.netns), ["lo"]);
    assert!(claims(&topo.file("s2"), "macnet").is_empty());
}

/// A dual-stack takeover (the old holder's netns is gone, so the store
/// judges it dead) where another host still answers for the IPv6 address
/// only: the one probe of both families hears DAD's answer and refuses,
/// naming the IPv6 address and the host's MAC; the free IPv4 address does
/// not let the ADD through, and nothing is left in the new pod.
#[test]
fn a_dual_stack_takeover_is_refused_when_only_its_ipv6_address_is_live() {
    let mut topo = Topology::new(1);
    let mut ipam = configs::host_local_dual_stack(&topo.file("store"));
    ipam["type"] = json!("sticky-ipam");
    let mut conf = configs::macvlan(configs::OUR_TYPE, "1.0.0", "uplink0", ipam);
    conf["args"] = json!({"cni": {"identity": "peer-a"}});
    let args = sticky_e2e::scenario::pod_args("default", "peer-a", "uid-1");
    let old = topo.add_pod("old");
    let first = sticky_e2e::scenario::call(&topo, 0, "ADD", &conf, "old", &old, &args);
    let v6 = first
        .addresses()
        .into_iter()
        .find(|a| a.contains(':'))
        .expect("a dual-stack ADD has an IPv6 address");
    let old_ns = old.netns.clone();
    topo.delete_netns(&old_ns);
    let mac = squat(&mut topo, &v6);
    let new = topo.add_pod("new");
    let args = sticky_e2e::scenario::pod_args("default", "peer-a", "uid-2");
    let refused = sticky_e2e::scenario::call(&topo, 0, "ADD", &conf, "new", &new, &args);
    let bare = v6.split('/').next().unwrap_or_default();
    refused.expect_refused(
        11,
        &[
            &format!("{bare} is still answered"),
            &mac,
            "duplicate address detection",
        ],
    );
    assert_eq!(links_in(&new.netns), ["lo"]);
}
