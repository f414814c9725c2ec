//! The kubernetes store's sections: API requests per operation, counted by
//! the real kube-apiserver's audit log, and pods churned (ADD, then DEL)
//! across three nodes on the stand-in, against the same churn on the file
//! store and with injected 409s. These plugins run through `ip netns exec`
//! on their node, alike in every figure.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sticky_e2e::kube_api::ApiServer;
use sticky_e2e::report::{percentile, Table};
use sticky_e2e::requests::total;
use sticky_e2e::{configs, CniCall, CniReply, Topology};

use crate::Suite;

const NS: &str = "bench";

fn k8s(name: &str, uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={name};K8S_POD_UID={uid}")
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

fn kube_store(topo: &Topology, api: &ApiServer, node: usize) -> Value {
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
    let r = CniCall::new(
        &sticky_e2e::our_plugin(),
        &topo.node(node).netns,
        cmd,
        conf.clone(),
    )
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

/// Section 4a, on the real kube-apiserver: requests per operation from its
/// audit log.
pub fn requests(suite: &mut Suite, topo: &mut Topology, api: &ApiServer) {
    use sticky_e2e::requests::{allowance, median_max, per_operation, TARGETS};
    let samples = 15;
    let confs = [
        conf(topo, &kube_store(topo, api, 0), 0),
        conf(topo, &kube_store(topo, api, 1), 1),
    ];
    let counts = per_operation(topo, api, NS, samples, &|node| confs[node].clone());
    let mut table = Table::new(
        "requests",
        format!("4a. API requests per operation, counted by kube-apiserver's audit log, {samples} samples each"),
        &["operation", "median", "max", "target", "Events (not in the count)", "requests (the last sample)"],
    );
    for (case, v) in &counts {
        let (m, max) = median_max(v);
        let target = TARGETS.iter().find(|(c, _)| c == case).map(|(_, t)| *t);
        let last = v.last().map(|s| s.breakdown.clone()).unwrap_or_default();
        let events = v.iter().map(|s| s.events).max().unwrap_or(0);
        table.row(
            vec![
                case.to_string(),
                m.to_string(),
                max.to_string(),
                target.map(|t| format!("<= {t}")).unwrap_or_else(|| "-".into()),
                events.to_string(),
                last.clone(),
            ],
            json!({"operation": case, "median": m, "max": max, "target": target, "events": events, "breakdown": last}),
        );
        if let Some(t) = target {
            suite.report.verdict(
                &format!("API requests (real kube-apiserver), {case} <= {t}"),
                max.to_string(),
                max > 0 && max <= t,
                allowance(case).1,
            );
        }
    }
    suite.report.add(table);
}

/// Section 4b, on the stand-in (its injected 409s): pods churned.
pub fn churn_section(suite: &mut Suite, topo: &mut Topology, api: &ApiServer) {
    let n = suite.opts.churn_pods;
    let set_uid = api.add_stateful_set(NS, "rs");

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
            Box::new(|node| kube_store(topo, api, node)),
            0,
        ),
        (
            "kubernetes store, every 10th write 409",
            Box::new(|node| kube_store(topo, api, node)),
            10,
        ),
        (
            "file store (node-local, baseline)",
            Box::new(move |_| json!({"type": "file", "dir": file_dir})),
            0,
        ),
    ];
    let mut table = Table::new(
        "churn",
        format!("4b. {n} pods churned (ADD then DEL) over 3 nodes x 2 workers, half StatefulSet pods; ADD ms"),
        &["store", "ADDs/s", "p50", "p90", "p99", "max", "API requests"],
    );
    for (label, store_of, every) in &runs {
        api.faults(0, *every);
        api.reset_stats();
        let c = churn(topo, &pods, store_of.as_ref(), &netns);
        let rate = c.adds.len() as f64 / c.wall.as_secs_f64();
        let stats = api.stats();
        let requests = if label.starts_with("file") {
            "-".to_string()
        } else {
            total(&stats).to_string()
        };
        let p = |q| percentile(&c.adds, q);
        table.row(
            vec![label.to_string(), format!("{rate:.1}"), format!("{:.2}", p(0.5)), format!("{:.2}", p(0.9)), format!("{:.2}", p(0.99)), format!("{:.2}", p(1.0)), requests],
            json!({"store": label, "adds_per_s": rate, "p50": p(0.5), "p90": p(0.9), "p99": p(0.99), "max": p(1.0), "requests": stats}),
        );
    }
    suite.report.add(table);
    api.faults(0, 0);
    let left = api.claims();
    let held = left
        .iter()
        .filter(|c| !c["status"]["holder"].is_null())
        .count();
    suite.report.notes.push(format!(
        "after the churn of table 4b: {} IPClaim objects of its network ({} sticky reserved, {held} held); every DEL released its dynamic claim",
        left.len(),
        left.len() - held
    ));
}
