//! What Multus costs, beside what we cost (issue 18, item 5): on one node
//! of the local cluster, the same pod's ADD and DEL run through Multus thin
//! (`/opt/cni/bin/multus` with the node's `00-multus.conf`, as containerd
//! execs it) and directly (the cluster network's `bridge`, then
//! `sticky-macvlan` with the NAD's config and Multus' `CNI_ARGS`, as
//! Multus execs its delegates). Multus' own share is the difference, per
//! run: its pod and NAD reads, the network-status annotation it writes,
//! its cache, and the second process.
//!
//! The pod exists in the API (Multus reads it and checks its UID) but is
//! held by a scheduling gate, so no kubelet ever runs it: the runs below
//! are the only CNI calls it gets. Every run uses a fresh container ID and
//! a netns of its own in the node's mount namespace, removed afterwards
//! (also on a panic, by `Drop`).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

use crate::local_cluster::LocalCluster;

/// The network the runs attach (a subnet no other scenario uses).
const NETWORK: &str = "mo-ours";

/// One run's wall times, ms.
#[derive(Debug, Clone, Copy, Default)]
pub struct OverheadSample {
    pub multus_add: f64,
    pub multus_del: f64,
    /// The cluster network's plugin (`bridge` + `host-local`) alone.
    pub primary_add: f64,
    pub primary_del: f64,
    /// sticky-macvlan with sticky-ipam (kubernetes store) alone.
    pub ours_add: f64,
    pub ours_del: f64,
}

/// The rows of the table, in the order of `OverheadSample::by_path`.
pub const PATHS: [&str; 4] = [
    "through Multus thin: cluster network, then sticky-macvlan on net1",
    "the cluster network alone (bridge + host-local), direct",
    "sticky-macvlan + sticky-ipam (kubernetes store) alone, direct",
    "Multus' own share (through Multus less both delegates, per run)",
];

impl OverheadSample {
    /// (ADD, DEL) for each of `PATHS`; Multus' own share is what it adds
    /// over its two delegates run directly.
    pub fn by_path(&self) -> [(f64, f64); 4] {
        [
            (self.multus_add, self.multus_del),
            (self.primary_add, self.primary_del),
            (self.ours_add, self.ours_del),
            (
                self.multus_add - self.primary_add - self.ours_add,
                self.multus_del - self.primary_del - self.ours_del,
            ),
        ]
    }
}

/// A command in NODE's network, mount and UTS namespaces, as the node's
/// containerd runs its CNI plugins.
fn in_node(c: &LocalCluster, node: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.args(["-t", &c.node_pid(node), "-n", "-m", "-u", "--"]);
    cmd
}

struct Call<'a> {
    plugin: &'a str,
    command: &'a str,
    container_id: &'a str,
    netns: &'a str,
    ifname: &'a str,
    args: &'a str,
    config: &'a str,
}

/// Execs the plugin as a CNI runtime does and returns its wall time, ms;
/// panics with its answer when it fails.
fn exec_timed(c: &LocalCluster, node: &str, call: &Call) -> f64 {
    let mut cmd = in_node(c, node);
    cmd.args(["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"])
        .arg(format!("CNI_COMMAND={}", call.command))
        .arg(format!("CNI_CONTAINERID={}", call.container_id))
        .arg(format!("CNI_NETNS={}", call.netns))
        .arg(format!("CNI_IFNAME={}", call.ifname))
        .arg(format!("CNI_ARGS={}", call.args))
        .arg("CNI_PATH=/opt/cni/bin")
        .arg(format!("/opt/cni/bin/{}", call.plugin))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{node}: cannot run {}: {e}", call.plugin));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(call.config.as_bytes())
            .unwrap_or_else(|e| panic!("{}: write its config: {e}", call.plugin));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{}: {e}", call.plugin));
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    assert!(
        out.status.success(),
        "{node}: {} {} failed: {}{}",
        call.plugin,
        call.command,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ms
}

/// A netns in the node's mount namespace, removed on drop.
struct NodeNetns<'a> {
    cluster: &'a LocalCluster,
    node: String,
    name: String,
}

impl<'a> NodeNetns<'a> {
    fn new(cluster: &'a LocalCluster, node: &str, name: String) -> NodeNetns<'a> {
        crate::run(in_node(cluster, node).args(["ip", "netns", "add", &name]));
        NodeNetns {
            cluster,
            node: node.to_string(),
            name,
        }
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
}

impl Drop for NodeNetns<'_> {
    fn drop(&mut self) {
        let _ = in_node(self.cluster, &self.node)
            .args(["ip", "netns", "del", &self.name])
            .status();
    }
}

/// The cluster network's single plugin, as libcni runs a one-plugin
/// conflist: the list's name and version put on the plugin's config.
fn primary_config(conflist: &str) -> String {
    let list: Value = serde_json::from_str(conflist).expect("the node's podnet.conflist");
    let mut plugin = list["plugins"][0].clone();
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    plugin.to_string()
}

/// `runs` interleaved runs on NODE (direct first on even runs, Multus
/// first on odd ones). Needs the cluster in Multus thin mode and
/// sticky-macvlan installed (`LocalCluster::install`).
pub fn measure(c: &LocalCluster, node: &str, runs: usize) -> Vec<OverheadSample> {
    assert_eq!(
        c.multus_mode(),
        "thin",
        "the Multus overhead is measured with Multus thin"
    );
    let ns = c.namespace("mo");
    let nad_config = format!(
        r#"{{"cniVersion": "1.0.0", "name": "{NETWORK}", "type": "sticky-macvlan", "master": "eth1", "ipam": {{"type": "sticky-ipam", "subnet": "172.31.74.0/24", "gateway": "172.31.74.1", "store": {{"type": "kubernetes", "kubeconfig": "/etc/cni/net.d/sticky-macvlan.d/sticky-macvlan.kubeconfig", "timeoutMs": 10000}}}}}}"#
    );
    c.apply(&format!(
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: {NETWORK}, namespace: {n}}}\nspec:\n  config: '{nad_config}'\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: gated\n  namespace: {n}\n  annotations: {{k8s.v1.cni.cncf.io/networks: {NETWORK}}}\nspec:\n  schedulingGates: [{{name: sticky-macvlan.io/never}}]\n  containers:\n  - {{name: c, image: localhost/testbox:1, imagePullPolicy: Never}}\n",
        n = ns.name
    ));
    let uid = c.json(&["-n", &ns.name, "get", "pod", "gated"])["metadata"]["uid"]
        .as_str()
        .expect("the gated pod's uid")
        .to_string();
    let disk = c.node_disk(node).join("etc-cni-net.d");
    let read = |p: &str| {
        std::fs::read_to_string(disk.join(p)).unwrap_or_else(|e| panic!("{node}: {p}: {e}"))
    };
    let multus_conf = read("00-multus.conf");
    let primary = primary_config(&read("multus.d/podnet/podnet.conflist"));
    let mut out = Vec::with_capacity(runs);
    for i in 0..runs {
        let mut s = OverheadSample::default();
        // A fresh sandbox of the gated pod: its container ID, netns and
        // the CNI_ARGS containerd passes.
        let sandbox = |tag: &str| {
            let cid = format!("mo{tag}{}x{i}", std::process::id());
            let netns = NodeNetns::new(c, node, format!("smo-{}-{tag}{i}", std::process::id()));
            let args = format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME=gated;K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid}",
                ns.name
            );
            (cid, netns, args)
        };
        let direct = |s: &mut OverheadSample| {
            let (cid, netns, args) = sandbox("d");
            // Multus' delegate CNI_ARGS: IgnoreUnknown=true in front.
            let delegate_args = format!("IgnoreUnknown=true;{args}");
            let path = netns.path();
            let exec = |plugin, command, ifname, args, config| {
                let call = Call {
                    plugin,
                    command,
                    container_id: &cid,
                    netns: &path,
                    ifname,
                    args,
                    config,
                };
                exec_timed(c, node, &call)
            };
            s.primary_add = exec("bridge", "ADD", "eth0", &args, &primary);
            s.ours_add = exec("sticky-macvlan", "ADD", "net1", &delegate_args, &nad_config);
            // Multus removes its delegates in reverse order.
            s.ours_del = exec("sticky-macvlan", "DEL", "net1", &delegate_args, &nad_config);
            s.primary_del = exec("bridge", "DEL", "eth0", &args, &primary);
        };
        let multus = |s: &mut OverheadSample| {
            let (cid, netns, args) = sandbox("m");
            let path = netns.path();
            let call = |command| Call {
                plugin: "multus",
                command,
                container_id: &cid,
                netns: &path,
                ifname: "eth0",
                args: &args,
                config: &multus_conf,
            };
            s.multus_add = exec_timed(c, node, &call("ADD"));
            s.multus_del = exec_timed(c, node, &call("DEL"));
        };
        if i % 2 == 0 {
            direct(&mut s);
            multus(&mut s);
        } else {
            multus(&mut s);
            direct(&mut s);
        }
        out.push(s);
    }
    // The pod is never run: delete it at once.
    let _ = c.try_kubectl(&[
        "-n",
        &ns.name,
        "delete",
        "pod",
        "gated",
        "--grace-period=0",
        "--force",
    ]);
    out
}
