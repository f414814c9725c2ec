//! The kubernetes store through the real plugin binary and the real kube
//! client, on three node netns that share the stand-in API server
//! (docs/src/concepts/kubernetes-store.md): reschedule after a node crash,
//! refusal while the old pod may be alive, the out-of-service taint,
//! a configured identity shared by two replicas, racing nodes, injected
//! 409s and an unreachable API.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sticky_e2e::kube_api::{assert_claim_invariants, ApiServer};
use sticky_e2e::{configs, our_ipam, our_plugin, CniCall, CniReply, Pod, Topology};

const NS: &str = "default";

fn pod_args_in_ns(name: &str, uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=infra;K8S_POD_UID={uid}")
}

/// Node `node`'s config: the kubernetes store, its own node name and
/// node-local record.
fn conf(topo: &Topology, api: &ApiServer, node: usize, extra: Value) -> Value {
    let mut ipam = json!({
        "store": {"type": "kubernetes", "kubeconfig": api.kubeconfig, "timeoutMs": api.request_timeout_ms.get(),
                  "dir": topo.file(&format!("node{}-local", node + 1))},
        "nodeName": api.node(node + 1),
    });
    configs::merge(&mut ipam, &extra);
    let mut c = configs::sticky(&topo.node(node).uplink, &topo.file("unused"), ipam);
    c["name"] = json!(api.network);
    c
}

fn add_on_node(
    topo: &Topology,
    api: &ApiServer,
    node: usize,
    pod: &Pod,
    cid: &str,
    args: &str,
) -> CniReply {
    let conf = conf(topo, api, node, json!({}));
    sticky_e2e::scenario::call(topo, node, "ADD", &conf, cid, pod, args)
}

/// `nodes` node netns on the real kube-apiserver.
fn nodes_on_api(nodes: usize) -> (Topology, ApiServer) {
    let mut topo = Topology::new(nodes);
    let api = topo.start_api();
    add_nodes(&api, nodes);
    (topo, api)
}

/// The same on the stand-in, for injected 409s (ARCHITECTURE.md, "Where
/// a fake remains").
fn cluster_on_standin(nodes: usize) -> (Topology, ApiServer) {
    let mut topo = Topology::new(nodes);
    let api = topo.start_standin();
    add_nodes(&api, nodes);
    (topo, api)
}

fn add_nodes(api: &ApiServer, nodes: usize) {
    for i in 0..nodes {
        api.add_node(&api.node(i + 1));
    }
}

fn cli_on_node1(topo: &Topology, api: &ApiServer, args: &[&str]) -> (bool, String) {
    cli_on_node(topo, api, 0, args)
}

/// The CLI on test node `node` (0-based).
fn cli_on_node(topo: &Topology, api: &ApiServer, node: usize, args: &[&str]) -> (bool, String) {
    // The CLI runs beside the node's pods and sees their netns paths: this
    // machine is that node, as the installer's nodename file beside the
    // plugin's kubeconfig says on a real node (`--node` counts only there).
    std::fs::write(
        api.kubeconfig.with_file_name("nodename"),
        api.node(node + 1),
    )
    .expect("write the nodename file");
    let out = Command::new("ip")
        .args(["netns", "exec", &topo.node(node).netns])
        .arg(our_plugin())
        .args(args)
        .args(["--kubeconfig".as_ref(), api.kubeconfig.as_os_str()])
        .args(["--node", &api.node(node + 1)])
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run the CLI");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn link_mac(netns: &str, ifname: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", netns, "-j", "link", "show", ifname])
        .output()
        .expect("ip link");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["address"].as_str().unwrap_or_default().to_string()
}

/// The MAC in `netns`'s neighbour entry for `ip`, if it has one.
fn neighbour_mac(netns: &str, ip: &str) -> Option<String> {
    let out = Command::new("ip")
        .args(["-n", netns, "-j", "neigh", "show", ip])
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v[0]["lladdr"].as_str().map(str::to_string)
}

mod concurrency;
mod failures;
mod ipamclaims;
mod node_scope;
mod operations;
mod split_brain;
mod statefulsets;
