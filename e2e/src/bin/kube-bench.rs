//! The kubernetes store's benchmark (printed numbers, no assertions on
//! time): API requests per ADD on the common paths, counted by the
//! stand-in API server, and ADD throughput with 1,000 pods churned (ADD,
//! then DEL) across three nodes, against the stand-in, next to the same
//! churn on the file store and with injected 409s.
//!
//! Run: `sudo target/release/kube-bench [pods]` after
//! `cargo build --release --workspace`. Plugins run through
//! `ip netns exec`, which is in every figure alike.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sticky_e2e::kube::StandIn;
use sticky_e2e::{configs, CniCall, CniReply, Topology};

const NS: &str = "bench";

fn k8s(name: &str, uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={name};K8S_POD_UID={uid}")
}

fn plugin() -> std::path::PathBuf {
    std::env::current_exe()
        .expect("exe")
        .with_file_name("sticky-macvlan")
}

fn conf(topo: &Topology, store: &Value, node: usize) -> Value {
    let ipam = json!({
        "subnet": "10.230.0.0/20",
        "rangeStart": "10.230.0.10",
        "rangeEnd": "10.230.15.250",
        "gateway": "10.230.0.1",
        "store": store,
        "nodeName": format!("node{}", node + 1),
    });
    configs::sticky(&topo.node(node).uplink, &topo.file("unused"), ipam)
}

fn kube_store(topo: &Topology, api: &StandIn, node: usize) -> Value {
    json!({"type": "kubernetes", "kubeconfig": api.kubeconfig, "dir": topo.file(&format!("local{node}"))})
}

fn call(
    topo: &Topology,
    conf: &Value,
    node: usize,
    cmd: &str,
    netns: &str,
    cid: &str,
    args: &str,
) -> CniReply {
    let r = CniCall::new(&plugin(), &topo.node(node).netns, cmd, conf.clone())
        .container(cid)
        .netns(netns)
        .args(args)
        .run();
    assert!(
        r.success,
        "{cmd} {cid} on node{} failed: {}",
        node + 1,
        r.stdout
    );
    r
}

fn total(stats: &Value) -> u64 {
    stats
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !k.starts_with("injected"))
                .filter_map(|(_, v)| v.as_u64())
                .sum()
        })
        .unwrap_or(0)
}

fn breakdown(stats: &Value) -> String {
    stats
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

struct Churn {
    wall: Duration,
    adds: Vec<f64>,
}

/// `pods` ADD+DEL pairs spread over 3 nodes x 2 workers; half the pods are
/// StatefulSet pods, half Deployment pods.
fn churn(
    topo: &Topology,
    pods: &[(String, String)],
    store_of: &dyn Fn(usize) -> Value,
    netns: &[String],
) -> Churn {
    let next = Arc::new(Mutex::new(0usize));
    let adds = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    std::thread::scope(|s| {
        for (w, pod_netns) in netns.iter().enumerate() {
            let node = w % 3;
            let conf = conf(topo, &store_of(node), node);
            let (next, adds) = (next.clone(), adds.clone());
            let pod_netns = pod_netns.clone();
            s.spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                    *n += 1;
                    *n - 1
                };
                let Some((name, uid)) = pods.get(i) else {
                    return;
                };
                let path = format!("/var/run/netns/{pod_netns}");
                let args = k8s(name, uid);
                let cid = format!("churn-{i}");
                let r = call(topo, &conf, node, "ADD", &path, &cid, &args);
                call(topo, &conf, node, "DEL", &path, &cid, &args);
                adds.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(r.elapsed.as_secs_f64() * 1e3);
            });
        }
    });
    let mut adds = Arc::try_unwrap(adds)
        .map(|m| m.into_inner().unwrap_or_default())
        .unwrap_or_default();
    adds.sort_by(|a, b| a.total_cmp(b));
    Churn {
        wall: start.elapsed(),
        adds,
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    assert!(
        plugin().exists(),
        "build first: cargo build --release --workspace"
    );
    let mut topo = Topology::new(3);
    let api = topo.start_api();
    for i in 1..=3 {
        api.add_node(&format!("node{i}"));
    }
    let set_uid = api.add_stateful_set(NS, "rs");

    // 1. Requests per ADD on the common paths.
    let samples = 15;
    let mut counts: BTreeMap<&str, (Vec<u64>, String)> = BTreeMap::new();
    let mut record = |case: &'static str, api: &StandIn| {
        let s = api.stats();
        let e = counts.entry(case).or_default();
        e.0.push(total(&s));
        e.1 = breakdown(&s);
        api.reset_stats();
    };
    let pod_a = topo.add_pod("req-a");
    let pod_b = topo.add_pod("req-b");
    let c1 = conf(&topo, &kube_store(&topo, &api, 0), 0);
    let c2 = conf(&topo, &kube_store(&topo, &api, 1), 1);
    for i in 0..samples {
        let dep = format!("web-{i}");
        let dep_uid = api.add_pod(NS, &dep, "node1", None, None);
        let sts = format!("rs-{i}");
        let sts_uid = api.add_pod(NS, &sts, "node1", Some(("rs", &set_uid)), None);
        api.reset_stats();
        call(
            &topo,
            &c1,
            0,
            "ADD",
            &pod_a.path,
            &format!("d{i}"),
            &k8s(&dep, &dep_uid),
        );
        record("fresh allocation, Deployment pod (dynamic)", &api);
        call(
            &topo,
            &c1,
            0,
            "DEL",
            &pod_a.path,
            &format!("d{i}"),
            &k8s(&dep, &dep_uid),
        );
        record("DEL, dynamic claim", &api);
        call(
            &topo,
            &c1,
            0,
            "ADD",
            &pod_b.path,
            &format!("s{i}"),
            &k8s(&sts, &sts_uid),
        );
        record("fresh allocation, StatefulSet pod", &api);
        call(
            &topo,
            &c1,
            0,
            "DEL",
            &pod_b.path,
            &format!("s{i}"),
            &k8s(&sts, &sts_uid),
        );
        record("DEL, sticky claim", &api);
        call(
            &topo,
            &c1,
            0,
            "ADD",
            &pod_b.path,
            &format!("s{i}b"),
            &k8s(&sts, &sts_uid),
        );
        record("re-ADD of a sticky identity (same pod, same node)", &api);
        // Rescheduled: the old pod is gone, the new one runs on node2.
        api.remove_pod(NS, &sts);
        let moved_uid = api.add_pod(NS, &sts, "node2", Some(("rs", &set_uid)), None);
        api.reset_stats();
        call(
            &topo,
            &c2,
            1,
            "ADD",
            &pod_a.path,
            &format!("s{i}c"),
            &k8s(&sts, &moved_uid),
        );
        record("takeover on another node (old pod gone)", &api);
        call(
            &topo,
            &c2,
            1,
            "DEL",
            &pod_a.path,
            &format!("s{i}c"),
            &k8s(&sts, &moved_uid),
        );
        // The old sandbox's late DEL on node1 is a no-op.
        call(
            &topo,
            &c1,
            0,
            "DEL",
            &pod_b.path,
            &format!("s{i}b"),
            &k8s(&sts, &sts_uid),
        );
        api.reset_stats();
    }
    println!("\nAPI requests per operation against the stand-in ({samples} samples each): median, max, breakdown of the last");
    println!("{:<52} {:>6} {:>4}  breakdown", "case", "median", "max");
    for (case, (v, last)) in &counts {
        let mut v = v.clone();
        v.sort();
        println!(
            "{case:<52} {:>6} {:>4}  {last}",
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
    let median = |case: &str| {
        counts
            .get(case)
            .map(|(v, _)| {
                let mut v = v.clone();
                v.sort();
                v[v.len() / 2]
            })
            .unwrap_or(0)
    };
    println!(
        "targets: re-ADD of a sticky identity {} requests (<= 3), fresh allocation {} and {} (<= 4)",
        median("re-ADD of a sticky identity (same pod, same node)"),
        median("fresh allocation, Deployment pod (dynamic)"),
        median("fresh allocation, StatefulSet pod")
    );

    // 2. Churn throughput.
    let pods: Vec<(String, String)> = (0..n)
        .map(|i| {
            let name = format!("churn-{i}");
            let uid = if i % 2 == 0 {
                api.add_pod(
                    NS,
                    &name,
                    &format!("node{}", i % 3 + 1),
                    Some(("rs", &set_uid)),
                    None,
                )
            } else {
                api.add_pod(NS, &name, &format!("node{}", i % 3 + 1), None, None)
            };
            (name, uid)
        })
        .collect();
    let netns: Vec<String> = (0..6)
        .map(|w| topo.add_pod(&format!("churn-w{w}")).netns)
        .collect();
    let file_dir = topo.file("file-store");
    type StoreOf<'a> = Box<dyn Fn(usize) -> Value + 'a>;
    let runs: Vec<(&str, StoreOf, u64)> = vec![
        (
            "kubernetes store",
            Box::new(|node| kube_store(&topo, &api, node)),
            0,
        ),
        (
            "kubernetes store, every 10th write 409",
            Box::new(|node| kube_store(&topo, &api, node)),
            10,
        ),
        (
            "file store (node-local, baseline)",
            Box::new(move |_| json!({"type": "file", "dir": file_dir})),
            0,
        ),
    ];
    println!("\n{n} pods churned (ADD then DEL), 3 nodes x 2 workers, half StatefulSet pods; ADD latency in ms");
    println!(
        "{:<40} {:>9} {:>8} {:>8} {:>8} {:>8} {:>10}",
        "store", "ADDs/s", "p50", "p90", "p99", "max", "requests"
    );
    let mut kube_rate = 0.0;
    for (label, store_of, every) in &runs {
        api.faults(0, *every);
        api.reset_stats();
        let c = churn(&topo, &pods, store_of.as_ref(), &netns);
        let rate = c.adds.len() as f64 / c.wall.as_secs_f64();
        if kube_rate == 0.0 {
            kube_rate = rate;
        }
        let stats = api.stats();
        println!(
            "{label:<40} {rate:>9.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10}",
            pct(&c.adds, 0.5),
            pct(&c.adds, 0.9),
            pct(&c.adds, 0.99),
            pct(&c.adds, 1.0),
            total(&stats)
        );
        if *every > 0 {
            println!("    {}", breakdown(&stats));
        }
    }
    api.faults(0, 0);
    let left = api.claims();
    let held = left
        .iter()
        .filter(|c| !c["status"]["holder"].is_null())
        .count();
    println!(
        "after the churn: {} IPClaim objects ({} sticky reserved, {held} held)",
        left.len(),
        left.len() - held
    );
}
