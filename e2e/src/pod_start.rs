//! Pod start at cluster level, the way Spiderpool publishes it: on the
//! local cluster, the time from `kubectl apply` to every pod Running with
//! its second interface addressed (Multus' network-status annotation names
//! net1's addresses once the ADD succeeded), for Deployments on a dynamic
//! network, then StatefulSets (`podManagementPolicy: Parallel`, so the
//! controller does not serialise them) whose pods are all deleted and timed
//! back, with how many came back with the same addresses. The contenders
//! run on the same nodes and the same master, round after round in turn:
//! - sticky-macvlan with sticky-ipam on the kubernetes store;
//! - the reference macvlan with Whereabouts (its CRDs and per-node
//!   kubeconfig installed by `scripts/cluster.sh`);
//! - the reference macvlan with host-local, one range per node (the floor
//!   that needs no API: each group is pinned to a node and its network).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::local_cluster::LocalCluster;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contender {
    Ours,
    Whereabouts,
    HostLocal,
}

pub const CONTENDERS: [Contender; 3] = [
    Contender::Ours,
    Contender::Whereabouts,
    Contender::HostLocal,
];

impl Contender {
    pub fn label(self) -> &'static str {
        match self {
            Contender::Ours => "sticky-macvlan + sticky-ipam (kubernetes store)",
            Contender::Whereabouts => "macvlan + Whereabouts v0.9.2",
            Contender::HostLocal => "macvlan + host-local, a range per node",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Contender::Ours => "ours",
            Contender::Whereabouts => "wb",
            Contender::HostLocal => "hl",
        }
    }

    /// The network a group of pods uses (host-local: one per node).
    fn network(self, group: usize) -> String {
        match self {
            Contender::HostLocal => format!("ps-hl-node{}", group % 3 + 1),
            other => format!("ps-{}", other.tag()),
        }
    }

    /// The node a group is pinned to (host-local only).
    fn pinned(self, group: usize) -> Option<String> {
        (self == Contender::HostLocal).then(|| format!("node{}", group % 3 + 1))
    }

    fn nads(self, ns: &str) -> String {
        let nad = |name: &str, config: String| {
            format!(
                "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  config: '{config}'\n---\n"
            )
        };
        match self {
            Contender::Ours => nad(
                "ps-ours",
                r#"{"cniVersion": "1.0.0", "name": "ps-ours", "type": "sticky-macvlan", "master": "eth1", "ipam": {"type": "sticky-ipam", "subnet": "172.31.70.0/24", "gateway": "172.31.70.1", "store": {"type": "kubernetes", "kubeconfig": "/etc/cni/net.d/sticky-macvlan.d/sticky-macvlan.kubeconfig", "timeoutMs": 10000}}}"#.into(),
            ),
            Contender::Whereabouts => nad(
                "ps-wb",
                r#"{"cniVersion": "1.0.0", "name": "ps-wb", "type": "macvlan", "master": "eth1", "mode": "bridge", "ipam": {"type": "whereabouts", "range": "172.31.71.0/24", "range_start": "172.31.71.10", "range_end": "172.31.71.250", "gateway": "172.31.71.1"}}"#.into(),
            ),
            Contender::HostLocal => (1..=3)
                .map(|n| {
                    let lo = (n - 1) * 64;
                    nad(
                        &format!("ps-hl-node{n}"),
                        format!(
                            r#"{{"cniVersion": "1.0.0", "name": "ps-hl-node{n}", "type": "macvlan", "master": "eth1", "mode": "bridge", "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "172.31.72.0/24", "rangeStart": "172.31.72.{}", "rangeEnd": "172.31.72.{}"}}]]}}}}"#,
                            lo + 2,
                            lo + 62
                        ),
                    )
                })
                .collect(),
        }
    }
}

/// How many pods: `groups` Deployments (then StatefulSets) of `replicas`.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub groups: usize,
    pub replicas: usize,
    pub rounds: usize,
}

#[derive(Debug, Clone)]
pub struct Round {
    pub contender: Contender,
    pub round: usize,
    pub deployment_up: Duration,
    pub statefulset_up: Duration,
    pub statefulset_back: Duration,
    /// Pods that came back with the addresses they had.
    pub same_addresses: usize,
    pub pods: usize,
}

fn workload(
    kind: &str,
    ns: &str,
    name: &str,
    replicas: usize,
    network: &str,
    node: Option<&str>,
) -> String {
    let extra = match kind {
        "StatefulSet" => format!("  podManagementPolicy: Parallel\n  serviceName: {name}\n"),
        _ => String::new(),
    };
    let pin = node
        .map(|n| format!("      nodeSelector: {{kubernetes.io/hostname: {n}}}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: apps/v1
kind: {kind}
metadata: {{name: {name}, namespace: {ns}}}
spec:
  replicas: {replicas}
{extra}  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}, pod-start: "1"}}
      annotations: {{k8s.v1.cni.cncf.io/networks: {network}}}
    spec:
      terminationGracePeriodSeconds: 1
{pin}      containers:
      - {{name: c, image: localhost/testbox:1, imagePullPolicy: Never, command: ["sleep", "100000"]}}
---
"#
    )
}

/// name -> (uid, net1's addresses) of the pods that are Running, not
/// terminating, and whose net1 Multus reported addressed.
fn attached(c: &LocalCluster, ns: &str) -> BTreeMap<String, (String, Vec<IpAddr>)> {
    let pods = c.json(&["-n", ns, "get", "pods", "-l", "pod-start=1"]);
    let mut out = BTreeMap::new();
    for p in pods["items"].as_array().into_iter().flatten() {
        if p["status"]["phase"] != "Running" || !p["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let status: Value = p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(Value::Null);
        let ips: Vec<IpAddr> = status
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["interface"] == "net1")
            .flat_map(|n| n["ips"].as_array().cloned().unwrap_or_default())
            .filter_map(|ip| ip.as_str()?.parse().ok())
            .collect();
        if ips.is_empty() {
            continue;
        }
        let (Some(name), Some(uid)) = (
            p["metadata"]["name"].as_str(),
            p["metadata"]["uid"].as_str(),
        ) else {
            continue;
        };
        out.insert(name.to_string(), (uid.to_string(), ips));
    }
    out
}

const LIMIT: Duration = Duration::from_secs(600);

/// Applies `manifest` and waits until `pods` pods are attached and `done`
/// says so; returns the time and the pods.
fn timed(
    c: &LocalCluster,
    ns: &str,
    what: &str,
    pods: usize,
    start: impl FnOnce(),
    done: impl Fn(&BTreeMap<String, (String, Vec<IpAddr>)>) -> bool,
) -> (Duration, BTreeMap<String, (String, Vec<IpAddr>)>) {
    let t0 = Instant::now();
    start();
    let got = c.wait(what, LIMIT, || {
        let now = attached(c, ns);
        if now.len() >= pods && done(&now) {
            return Ok(now);
        }
        // Only the failure message needs the events: not asked while polling.
        let events = if t0.elapsed() + Duration::from_secs(2) >= LIMIT {
            first_events(c, ns)
        } else {
            Vec::new()
        };
        Err(format!(
            "{} of {pods} attached; events of a pending pod: {events:?}",
            now.len()
        ))
    });
    (t0.elapsed(), got)
}

fn first_events(c: &LocalCluster, ns: &str) -> Vec<String> {
    let pods = c.json(&["-n", ns, "get", "pods", "-l", "pod-start=1"]);
    let pending = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["status"]["phase"] != "Running")
        .and_then(|p| p["metadata"]["name"].as_str().map(str::to_string));
    match pending {
        Some(p) => c.pod_events(ns, &p).into_iter().rev().take(2).collect(),
        None => Vec::new(),
    }
}

fn wait_no_pods(c: &LocalCluster, ns: &str) {
    c.wait("the pods gone", LIMIT, || {
        let n = c.json(&["-n", ns, "get", "pods", "-l", "pod-start=1"])["items"]
            .as_array()
            .map_or(0, Vec::len);
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} pods left"))
        }
    });
}

/// One contender's round in a namespace of its own, removed afterwards
/// with what our store keeps of it (sticky claims outlive their pods).
pub fn one_round(c: &LocalCluster, contender: Contender, round: usize, shape: Shape) -> Round {
    let ns = format!("ps-{}-{round}-{}", contender.tag(), std::process::id());
    c.kubectl(&["create", "namespace", &ns]);
    let pods = shape.groups * shape.replicas;
    c.apply(&contender.nads(&ns));
    let manifests = |kind: &str| -> String {
        (0..shape.groups)
            .map(|g| {
                workload(
                    kind,
                    &ns,
                    &format!("{}-{g}", if kind == "Deployment" { "web" } else { "db" }),
                    shape.replicas,
                    &contender.network(g),
                    contender.pinned(g).as_deref(),
                )
            })
            .collect()
    };
    let deployments = manifests("Deployment");
    let (deployment_up, _) = timed(
        c,
        &ns,
        "the Deployments' pods attached",
        pods,
        || c.apply(&deployments),
        |_| true,
    );
    c.kubectl(&["-n", &ns, "delete", "deployments", "--all", "--wait=false"]);
    wait_no_pods(c, &ns);
    let sets = manifests("StatefulSet");
    let (statefulset_up, first) = timed(
        c,
        &ns,
        "the StatefulSets' pods attached",
        pods,
        || c.apply(&sets),
        |_| true,
    );
    let (statefulset_back, back) = timed(
        c,
        &ns,
        "the StatefulSets' pods back",
        pods,
        || {
            c.kubectl(&[
                "-n",
                &ns,
                "delete",
                "pods",
                "-l",
                "pod-start=1",
                "--wait=false",
            ]);
        },
        |now| {
            now.iter()
                .all(|(name, (uid, _))| first.get(name).is_none_or(|(old, _)| old != uid))
        },
    );
    let same_addresses = back
        .iter()
        .filter(|(name, (_, ips))| first.get(*name).is_some_and(|(_, old)| old == ips))
        .count();
    c.kubectl(&["-n", &ns, "delete", "statefulsets", "--all", "--wait=false"]);
    wait_no_pods(c, &ns);
    let _ = c.try_kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    if contender == Contender::Ours {
        c.release_claims_of_namespace(&ns);
    }
    Round {
        contender,
        round,
        deployment_up,
        statefulset_up,
        statefulset_back,
        same_addresses,
        pods,
    }
}

/// Every contender, round after round in turn (interleaved, so a slow
/// moment of the machine falls on all of them).
pub fn run(c: &LocalCluster, shape: Shape) -> Vec<Round> {
    let mut out = Vec::new();
    for round in 0..shape.rounds {
        for contender in CONTENDERS {
            let r = one_round(c, contender, round, shape);
            eprintln!(
                "pod start, round {round}, {}: Deployments {:.1} s, StatefulSets {:.1} s, back {:.1} s, {}/{} same addresses",
                contender.label(),
                r.deployment_up.as_secs_f64(),
                r.statefulset_up.as_secs_f64(),
                r.statefulset_back.as_secs_f64(),
                r.same_addresses,
                r.pods
            );
            out.push(r);
        }
    }
    out
}
