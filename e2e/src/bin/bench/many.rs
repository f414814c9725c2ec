//! Section 10: many nodes against one real kube-apiserver. N simulated
//! nodes (`fleet.rs`) each ADD 5 pods at once (2 StatefulSet pods, 3
//! Deployment pods), then churn: every pod is deleted and re-created (the
//! StatefulSet pods under their names, the Deployment pods as new pods).
//! The same storm is driven through Whereabouts v0.9.2's IPAM binary, on
//! a fresh etcd and kube-apiserver of the same binaries for every storm,
//! so neither inherits the other's objects or heap.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use sticky_e2e::kube_api::{
    assert_claim_invariants, cluster_cni_plugin, process_usage, reset_peak, ApiServer, BulkRequest,
};
use sticky_e2e::report::{percentile, Table};
use sticky_e2e::Topology;

use crate::fleet::{node_name, run_bounded, Batch, Call, Fleet};
use crate::Suite;

const NS: &str = "many";
const SET: &str = "db";
const PODS_PER_NODE: usize = 5;
/// Of each node's pods, the StatefulSet's; the others are Deployment pods.
const STICKY_PER_NODE: usize = 2;
/// Plugin processes running at once across all nodes: a bound on this
/// 2-core machine's memory (a Whereabouts process holds ~30 MiB), not a
/// property of either IPAM.
pub const IN_FLIGHT: usize = 100;
/// No task of a phase starts after this.
const PHASE_LIMIT: Duration = Duration::from_secs(15 * 60);
const SUBNET: &str = "10.240.0.0/20";
const RANGE: (&str, &str) = ("10.240.0.10", "10.240.15.250");
const GATEWAY: &str = "10.240.0.1";

#[derive(Clone, Copy, PartialEq)]
enum Ipam {
    Ours,
    Whereabouts,
}

impl Ipam {
    fn label(self) -> &'static str {
        match self {
            Ipam::Ours => "sticky-ipam (kubernetes store)",
            Ipam::Whereabouts => "Whereabouts v0.9.2",
        }
    }
}

/// A pod of the storm: node, name, whether its StatefulSet owns it.
struct PodRef {
    node: usize,
    name: String,
    sticky: bool,
}

/// The figures of one phase (the storm, or the churn) of one IPAM.
struct Figures {
    adds: usize,
    ok: usize,
    skipped: usize,
    wall_s: f64,
    p50: f64,
    p99: f64,
    max: f64,
    conflicts: u64,
    requests: u64,
    /// kube-apiserver, etcd: CPU seconds in the phase, peak RSS MiB.
    cpu_s: [f64; 2],
    peak_mib: [f64; 2],
    start_mib: [f64; 2],
    answers: BTreeMap<String, u64>,
    first_failure: Option<String>,
}

impl Figures {
    /// Per ADD (the storm), or per DEL + ADD pair (the churn).
    fn per(&self, v: u64) -> f64 {
        v as f64 / self.adds.max(1) as f64
    }

    fn values(&self) -> [f64; 10] {
        [
            self.wall_s,
            self.p50,
            self.p99,
            self.per(self.conflicts),
            self.per(self.requests),
            self.cpu_s[0],
            self.cpu_s[1],
            self.peak_mib[0],
            self.peak_mib[1],
            self.ok as f64,
        ]
    }

    fn json(&self) -> Value {
        json!({"adds": self.adds, "ok": self.ok, "skipped": self.skipped, "wall_s": self.wall_s,
               "p50_ms": self.p50, "p99_ms": self.p99, "max_ms": self.max,
               "conflicts_409": self.conflicts, "requests": self.requests,
               "apiserver_cpu_s": self.cpu_s[0], "etcd_cpu_s": self.cpu_s[1],
               "apiserver_peak_rss_mib": self.peak_mib[0], "etcd_peak_rss_mib": self.peak_mib[1],
               "apiserver_rss_at_start_mib": self.start_mib[0], "etcd_rss_at_start_mib": self.start_mib[1],
               "answers": self.answers, "first_failure": self.first_failure})
    }
}

/// Runs a batch and reads what it cost the server: requests and 409s from
/// the audit log, CPU and peak RSS from /proc.
fn measured(api: &ApiServer, batch: impl FnOnce() -> Batch) -> Figures {
    let pids = api.server_pids().expect("the real API server");
    api.reset_stats();
    for pid in pids {
        reset_peak(pid);
    }
    let before = pids.map(process_usage);
    let b = batch();
    let after = pids.map(process_usage);
    let stats = api.stats();
    let answers = api.answers();
    let mut adds: Vec<f64> = b
        .done
        .iter()
        .filter(|d| d.verb == "ADD")
        .map(|d| d.ms)
        .collect();
    adds.sort_by(|x, y| x.total_cmp(y));
    Figures {
        adds: adds.len(),
        ok: b.done.iter().filter(|d| d.verb == "ADD" && d.ok).count(),
        skipped: b.skipped,
        wall_s: b.wall.as_secs_f64(),
        p50: percentile(&adds, 0.5),
        p99: percentile(&adds, 0.99),
        max: percentile(&adds, 1.0),
        conflicts: answers
            .iter()
            .filter(|(k, _)| k.ends_with(" 409"))
            .map(|(_, v)| v)
            .sum(),
        requests: sticky_e2e::requests::total(&stats),
        cpu_s: [0, 1].map(|i| (after[i].cpu_ms - before[i].cpu_ms) / 1e3),
        peak_mib: [0, 1].map(|i| after[i].peak_rss_mib),
        start_mib: [0, 1].map(|i| before[i].rss_mib),
        answers,
        first_failure: b.done.iter().find(|d| !d.ok).map(|d| d.msg.clone()),
    }
}

/// Every address the successful ADDs returned, checked distinct.
fn assert_distinct(batch_ips: &[String], what: &str) {
    let set: BTreeSet<&String> = batch_ips.iter().collect();
    assert_eq!(
        set.len(),
        batch_ips.len(),
        "{what}: an address was handed out twice"
    );
}

fn k8s_args(name: &str, uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=infra;K8S_POD_UID={uid}")
}

/// Node `k`'s network config for this IPAM (the binary reads only `ipam`
/// and the network's name, as behind Multus and macvlan).
fn conf(ipam: Ipam, api: &ApiServer, fleet: &Fleet, k: usize) -> Value {
    let node = &fleet.nodes[k];
    let section = match ipam {
        Ipam::Ours => json!({
            "type": "sticky-ipam", "subnet": SUBNET, "rangeStart": RANGE.0, "rangeEnd": RANGE.1,
            "gateway": GATEWAY, "nodeName": node.name,
            "store": {"type": "kubernetes", "kubeconfig": api.kubeconfig, "dir": node.dir,
                      "timeoutMs": api.request_timeout_ms.get()},
        }),
        Ipam::Whereabouts => json!({
            "type": "whereabouts", "range": SUBNET, "range_start": RANGE.0, "range_end": RANGE.1,
            "gateway": GATEWAY, "configuration_path": node.dir.join("whereabouts.conf"),
        }),
    };
    let plugin_type = if ipam == Ipam::Ours {
        "sticky-ipam"
    } else {
        "macvlan"
    };
    json!({"cniVersion": "1.0.0", "name": api.network, "type": plugin_type, "ipam": section})
}

/// One storm of `n` nodes through `ipam`, on a server of its own: the
/// storm's figures, then the churn's.
fn storm(n: usize, ipam: Ipam, plugin: &Path) -> (Figures, Figures, String) {
    let mut topo = Topology::new(1);
    let api = topo.start_api();
    let set_uid = api.add_stateful_set(NS, SET);
    // The pods as the scheduler would have bound them: the storm's, and the
    // Deployment pods the churn creates; nodes first.
    let pod = |k: usize, j: usize, round: usize| PodRef {
        node: k,
        name: if j < STICKY_PER_NODE {
            format!("{SET}-{}", k * STICKY_PER_NODE + j)
        } else {
            format!("web-{k}-{j}-r{round}")
        },
        sticky: j < STICKY_PER_NODE,
    };
    let storm_pods: Vec<PodRef> = (0..PODS_PER_NODE)
        .flat_map(|j| (0..n).map(move |k| (k, j)))
        .map(|(k, j)| pod(k, j, 1))
        .collect();
    let churn_pods: Vec<PodRef> = (0..PODS_PER_NODE)
        .flat_map(|j| (0..n).map(move |k| (k, j)))
        .map(|(k, j)| pod(k, j, 2))
        .collect();
    let mut reqs: Vec<Vec<BulkRequest>> = (1..=n)
        .map(|k| ApiServer::node_requests(&node_name(k)))
        .collect();
    for p in storm_pods
        .iter()
        .chain(churn_pods.iter().filter(|p| !p.sticky))
    {
        let owner = p.sticky.then_some((SET, set_uid.as_str()));
        reqs.push(ApiServer::pod_requests(
            NS,
            &p.name,
            &node_name(p.node + 1),
            owner,
            None,
        ));
    }
    let uids: HashMap<String, String> = api
        .bulk(reqs)
        .into_iter()
        .filter(|o| o["kind"] == "Pod")
        .filter_map(|o| {
            Some((
                o["metadata"]["name"].as_str()?.to_string(),
                o["metadata"]["uid"].as_str()?.to_string(),
            ))
        })
        .collect();
    let fleet = Fleet::new(&topo, n);
    if ipam == Ipam::Whereabouts {
        api.install_whereabouts();
        for node in &fleet.nodes {
            let flat =
                json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": api.kubeconfig}});
            std::fs::write(node.dir.join("whereabouts.conf"), flat.to_string())
                .expect("write Whereabouts' flat file");
        }
    }
    let confs: Vec<Value> = (0..n).map(|k| conf(ipam, &api, &fleet, k)).collect();
    let conf_of = |k: usize| confs[k].clone();
    let call = |p: &PodRef, verb: &'static str, round: usize| Call {
        node: p.node,
        verb,
        cid: format!("{}-c{round}", p.name),
        args: k8s_args(&p.name, uids.get(&p.name).map(String::as_str).unwrap_or("")),
    };
    // One ADD and DEL before the figures: what a server that has served
    // anything before pays once (its first answers after start-up take
    // seconds) is no part of a storm.
    let warm = PodRef {
        node: 0,
        name: "warm-up".into(),
        sticky: false,
    };
    let warm_up = [vec![call(&warm, "ADD", 0), call(&warm, "DEL", 0)]];
    let b = run_bounded(&fleet, plugin, &conf_of, &warm_up, 1, PHASE_LIMIT);
    eprintln!(
        "many: warm-up {:?}",
        b.done
            .iter()
            .map(|d| (d.ok, d.ms as u64))
            .collect::<Vec<_>>()
    );
    // A phase: its figures, and no address handed out twice in it.
    let phase = |what: &str, tasks: &[Vec<Call>]| {
        eprintln!("many: {n} nodes, {}: {what}", ipam.label());
        let mut ips = Vec::new();
        let figures = measured(&api, || {
            let b = run_bounded(&fleet, plugin, &conf_of, tasks, IN_FLIGHT, PHASE_LIMIT);
            ips = b.done.iter().filter_map(|d| d.ip.clone()).collect();
            b
        });
        assert_distinct(&ips, what);
        figures
    };
    let storm_tasks: Vec<Vec<Call>> = storm_pods.iter().map(|p| vec![call(p, "ADD", 1)]).collect();
    let first = phase("the storm", &storm_tasks);
    let churn_tasks: Vec<Vec<Call>> = storm_pods
        .iter()
        .zip(&churn_pods)
        .map(|(old, new)| vec![call(old, "DEL", 1), call(new, "ADD", 2)])
        .collect();
    let second = phase("the churn", &churn_tasks);
    let left = match ipam {
        Ipam::Ours => {
            let claims = api.claims();
            assert_claim_invariants(&claims);
            format!("{} IPClaims (and as many IPLocks)", claims.len())
        }
        Ipam::Whereabouts => {
            let (_, pools) = api.request(
                "GET",
                "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/ippools",
                None,
            );
            let items = pools["items"].as_array().cloned().unwrap_or_default();
            let allocations: usize = items
                .iter()
                .map(|p| p["spec"]["allocations"].as_object().map_or(0, |a| a.len()))
                .sum();
            let bytes = items.first().map(|p| p.to_string().len()).unwrap_or(0);
            format!(
                "{} IPPool(s) holding {allocations} allocations ({bytes} bytes of JSON)",
                items.len()
            )
        }
    };
    (first, second, left)
}

const COLUMNS: [&str; 10] = [
    "wall s",
    "ADD p50 ms",
    "ADD p99 ms",
    "409s / ADD",
    "requests / ADD",
    "apiserver CPU s",
    "etcd CPU s",
    "apiserver peak MiB",
    "etcd peak MiB",
    "ADDs ok",
];

/// Section 10: the table, one storm and one churn per node count and IPAM,
/// and each figure of ours as a ratio to Whereabouts' in the same run.
pub fn many(suite: &mut Suite) {
    let plugin = sticky_e2e::our_ipam();
    let whereabouts = cluster_cni_plugin("whereabouts");
    let mut columns = vec!["nodes x 5 pods", "phase", "IPAM"];
    columns.extend(COLUMNS);
    let mut table = Table::new(
        "many",
        format!("10. Many nodes against one real kube-apiserver: every node ADDs 5 pods at once (2 StatefulSet, 3 Deployment pods), then churns them (DEL + re-ADD each; figures per DEL+ADD pair), at most {IN_FLIGHT} plugin processes at once; ours / Whereabouts in the same run"),
        &columns,
    );
    for n in suite.opts.many.clone() {
        let mut results = Vec::new();
        for ipam in [Ipam::Ours, Ipam::Whereabouts] {
            let bin = if ipam == Ipam::Ours {
                &plugin
            } else {
                &whereabouts
            };
            results.push((ipam, storm(n, ipam, bin)));
        }
        for (phase, pick) in [("storm", 0usize), ("churn", 1)] {
            fn figures(r: &(Figures, Figures, String), pick: usize) -> &Figures {
                if pick == 0 {
                    &r.0
                } else {
                    &r.1
                }
            }
            for (ipam, r) in &results {
                let f = figures(r, pick);
                let v = f.values();
                let mut cells = vec![n.to_string(), phase.to_string(), ipam.label().to_string()];
                cells.extend(v[..9].iter().map(|x| format!("{x:.2}")));
                cells.push(format!("{}/{}", f.ok, f.adds + f.skipped));
                table.row(
                    cells,
                    json!({"nodes": n, "phase": phase, "ipam": ipam.label(), "figures": f.json(), "left": r.2}),
                );
            }
            let (ours, theirs) = (
                figures(&results[0].1, pick).values(),
                figures(&results[1].1, pick).values(),
            );
            let mut cells = vec![
                n.to_string(),
                phase.to_string(),
                "ours / Whereabouts".into(),
            ];
            let ratios: Vec<f64> = ours.iter().zip(theirs).map(|(a, b)| a / b).collect();
            cells.extend(ratios.iter().map(|r| {
                if r.is_finite() {
                    format!("{r:.2}x")
                } else {
                    "-".into()
                }
            }));
            table.row(cells, json!({"nodes": n, "phase": phase, "ratios": ratios.iter().map(|r| if r.is_finite() { json!(r) } else { Value::Null }).collect::<Vec<_>>()}));
        }
        for (ipam, r) in &results {
            let failure = [&r.0, &r.1]
                .iter()
                .find_map(|f| f.first_failure.clone())
                .map(|m| {
                    format!(
                        "; first failure: {}",
                        m.chars().take(300).collect::<String>()
                    )
                })
                .unwrap_or_default();
            suite.report.notes.push(format!(
                "table 10, {n} nodes, {}: left {}; 409s of the storm by request: {}{failure}",
                ipam.label(),
                r.2,
                conflicts_by_request(&r.0.answers)
            ));
        }
    }
    suite.report.add(table);
    suite.report.notes.extend(NOTES.map(String::from));
}

/// "verb resource=count" of the 409 answers.
fn conflicts_by_request(answers: &BTreeMap<String, u64>) -> String {
    let parts: Vec<String> = answers
        .iter()
        .filter_map(|(k, v)| Some(format!("{}={v}", k.strip_suffix(" 409")?)))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(" ")
    }
}

/// Where each design's cost grows (docs/src/developer/many-nodes.md says
/// the same at length, with the figures of a full run).
const NOTES: [&str; 5] = [
    "Table 10, how: every storm runs on a fresh etcd + kube-apiserver of the local cluster's build (same binaries for both IPAMs), after one warm-up ADD and DEL outside the figures; every simulated node has its own node name, node-local record (or Whereabouts flat file) and boot id (a mount namespace per node with a file bound over /proc/sys/kernel/random/boot_id, entered with setns between fork and exec, like its node netns); at most 100 plugin processes run at once on this 2-core machine, so ADD latencies include queueing for the CPU, alike for both; requests and 409s are the audit log's, CPU and peak RSS (VmHWM, restarted per phase) are /proc's.",
    "Table 10, ours: 2 objects per address (IPLock, IPClaim), every write by name and conditional, no object that every ADD writes: requests per ADD stay 3.4 to 5 from 5 to 200 nodes, and the only 409s are two nodes' next-fit picking the same free address at once (a lock create that loses and tries the next one), which grow with the number of nodes allocating at the same moment. What grows with the cluster is the object count, hence the API server's memory: section 5's 60,000 claims (120,000 objects) took kube-apiserver from 318 to 3,171 MiB, about 24 KiB per object (its watch cache of every CR, held decoded, with managedFields), and etcd about 1.2 KiB per object; every API server replica holds its own cache.",
    "Table 10, Whereabouts v0.9.2: every ADD and DEL first takes one cluster-wide Lease (kube-system/whereabouts, leader election polled every 500 ms), then reads the range's one IPPool and rewrites it whole, and (overlapping ranges on by default) creates or deletes an OverlappingRangeIPReservation per address: the Lease turns concurrency into waiting (its 409s are the lease's; the pool's update never loses a race, because only the leader writes it), so wall time grows with the cluster's total ADDs, not with a node's, and every rewrite of the pool (about 130 bytes per allocation) puts a whole copy through the watch cache, which is where its API server peak memory grows. An ADD that waits more than 2 minutes for the lease fails.",
    "Table 10, the reference on paper, Calico's block-per-node IPAM: a block (a /26, 64 addresses) is affine to a node (a BlockAffinity object), one object holds the block's allocations, and a node allocates inside its own blocks, so nodes do not contend; it still writes an IPAMHandle per pod, so it is about one object per pod plus one per 64 addresses, against our two per address. For us a block would cost stickiness across nodes: a StatefulSet pod's address must follow it to another node, so it must be able to leave its block (a borrowed address written into another node's block, the contention back on exactly the takeover path), and a node's concurrent ADDs would again all rewrite one object. A hybrid, dynamic addresses in per-node blocks and sticky ones per identity, would halve the objects of Deployment-heavy networks at the price of a second store path whose invariants would all have to be proven again.",
    "Table 10 is not in BENCHMARKS.md until a full `sudo scripts/bench.sh` run; its figures from `target/release/bench --only many` are in docs/src/developer/many-nodes.md.",
];
