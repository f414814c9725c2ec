//! API requests per operation on the kubernetes store: the common paths of
//! a pod's life, each counted on its own by the server (the real
//! kube-apiserver's audit log). Shared by the benchmark's table and the
//! test that holds the targets.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::kube_api::ApiServer;
use crate::scenario::{call, pod_args};
use crate::Topology;

pub const FRESH_DEPLOYMENT: &str = "fresh allocation, Deployment pod (dynamic)";
pub const FRESH_STATEFUL: &str = "fresh allocation, StatefulSet pod (first ADD ever)";
pub const DEL_DYNAMIC: &str = "DEL, dynamic claim";
pub const DEL_STICKY: &str = "DEL, sticky claim";
pub const READD: &str = "re-ADD of a sticky identity (same pod, same node)";
pub const TAKEOVER: &str = "takeover on another node (old pod gone)";
pub const LATE_DEL: &str = "the old sandbox's late DEL on the old node";

/// The targets of issue "Scale on a real apiserver", per operation.
/// `FRESH_STATEFUL` (by one request) and `TAKEOVER` (by two) are not met,
/// on purpose: see `allowance`. The test holds every other target and
/// those rows at what they are.
pub const TARGETS: [(&str, u64); 6] = [
    (READD, 2),
    (FRESH_DEPLOYMENT, 3),
    (FRESH_STATEFUL, 3),
    (TAKEOVER, 4),
    (DEL_DYNAMIC, 2),
    (DEL_STICKY, 2),
];

pub const FRESH_STATEFUL_WHY: &str = "a sticky identity's first ADD must ask whether the identity has a claim elsewhere (GET by name, 404) before it locks an address; making that answer come from a failed create instead would save it here and cost a takeover three more requests (lock, lost claim create, unlock), and the lock must come before the claim or a crash between them could leave a claim on an address another identity then locks (4 is argued as the floor in ARCHITECTURE.md, \"Why a StatefulSet pod's first ADD costs 4 requests\")";

pub const TAKEOVER_WHY: &str = "a takeover from another node takes the address's IPLock along (a GET for its version, a PUT naming this node, marked) before the claim: a lock left naming the old node, unmarked, would be that node's to delete under the new holder's live claim (issue 26, I14); a JSON Patch with test operations on the lock's UID and identity would make it one request";

/// How far over its target each row is held, and why.
pub fn allowance(case: &str) -> (u64, &'static str) {
    match case {
        FRESH_STATEFUL => (1, FRESH_STATEFUL_WHY),
        TAKEOVER => (2, TAKEOVER_WHY),
        _ => (0, "see the breakdown in table 4a"),
    }
}

/// One sample: the total and the breakdown by "verb resource".
pub struct RequestSample {
    pub total: u64,
    /// The best-effort Events among them, not in `total`.
    pub events: u64,
    pub breakdown: String,
}

/// The requests of an operation, less the best-effort Events it posted:
/// those count in their own column (`events`), not in the targets.
pub fn total(stats: &Value) -> u64 {
    stats
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    !k.starts_with("injected") && !k.starts_with("server") && !is_event(k)
                })
                .filter_map(|(_, v)| v.as_u64())
                .sum()
        })
        .unwrap_or(0)
}

fn is_event(key: &str) -> bool {
    key == "create events"
}

/// The Events an operation posted (a takeover's, a refusal's).
pub fn events(stats: &Value) -> u64 {
    stats
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| is_event(k))
                .filter_map(|(_, v)| v.as_u64())
                .sum()
        })
        .unwrap_or(0)
}

pub fn breakdown(stats: &Value) -> String {
    stats
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !k.starts_with("server"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// `samples` rounds of a Deployment pod's ADD and DEL and a StatefulSet
/// pod's first ADD, DEL, re-ADD, move to node 2 and the old node's late
/// DEL, with `conf(node)` the plugin's config on each node. Pods live in
/// `ns`, the StatefulSet's pods are `rs-<i>` of StatefulSet `rs`.
pub fn per_operation(
    topo: &mut Topology,
    api: &ApiServer,
    ns: &str,
    samples: usize,
    conf: &dyn Fn(usize) -> Value,
) -> BTreeMap<&'static str, Vec<RequestSample>> {
    let set_uid = api.add_stateful_set(ns, "rs");
    let mut counts: BTreeMap<&'static str, Vec<RequestSample>> = BTreeMap::new();
    let record = |counts: &mut BTreeMap<&'static str, Vec<RequestSample>>, case: &'static str| {
        let s = api.stats();
        counts.entry(case).or_default().push(RequestSample {
            total: total(&s),
            events: events(&s),
            breakdown: breakdown(&s),
        });
        api.reset_stats();
    };
    let pod_a = topo.add_pod("req-a");
    let pod_b = topo.add_pod("req-b");
    let (c1, c2) = (conf(0), conf(1));
    let ok = |r: crate::CniReply, what: &str| {
        assert!(r.success, "{what}: {}", r.stdout);
    };
    for i in 0..samples {
        let dep = format!("web-{i}");
        let dep_uid = api.add_pod(ns, &dep, &api.node(1), None, None);
        let sts = format!("rs-{i}");
        let sts_uid = api.add_pod(ns, &sts, &api.node(1), Some(("rs", &set_uid)), None);
        let dep_args = pod_args(ns, &dep, &dep_uid);
        let sts_args = pod_args(ns, &sts, &sts_uid);
        api.reset_stats();
        let d = format!("d{i}");
        ok(call(topo, 0, "ADD", &c1, &d, &pod_a, &dep_args), "ADD");
        record(&mut counts, FRESH_DEPLOYMENT);
        ok(call(topo, 0, "DEL", &c1, &d, &pod_a, &dep_args), "DEL");
        record(&mut counts, DEL_DYNAMIC);
        let s = format!("s{i}");
        ok(call(topo, 0, "ADD", &c1, &s, &pod_b, &sts_args), "ADD");
        record(&mut counts, FRESH_STATEFUL);
        ok(call(topo, 0, "DEL", &c1, &s, &pod_b, &sts_args), "DEL");
        record(&mut counts, DEL_STICKY);
        let sb = format!("s{i}b");
        ok(call(topo, 0, "ADD", &c1, &sb, &pod_b, &sts_args), "re-ADD");
        record(&mut counts, READD);
        // Rescheduled: the old pod is gone, and its link with it (else the
        // ARP probe rightly refuses the takeover); the new one runs on node 2.
        crate::ip(&["-n", &pod_b.netns, "link", "del", "net1"]);
        api.remove_pod(ns, &sts);
        let moved_uid = api.add_pod(ns, &sts, &api.node(2), Some(("rs", &set_uid)), None);
        let moved_args = pod_args(ns, &sts, &moved_uid);
        api.reset_stats();
        let sc = format!("s{i}c");
        ok(
            call(topo, 1, "ADD", &c2, &sc, &pod_a, &moved_args),
            "takeover",
        );
        record(&mut counts, TAKEOVER);
        // The old sandbox's late DEL on node 1 finds the claim moved on.
        ok(
            call(topo, 0, "DEL", &c1, &sb, &pod_b, &sts_args),
            "late DEL",
        );
        record(&mut counts, LATE_DEL);
        ok(call(topo, 1, "DEL", &c2, &sc, &pod_a, &moved_args), "DEL");
        api.reset_stats();
    }
    counts
}

/// (median, max) of the samples' totals.
pub fn median_max(samples: &[RequestSample]) -> (u64, u64) {
    let mut v: Vec<u64> = samples.iter().map(|s| s.total).collect();
    v.sort();
    match (v.get(v.len() / 2), v.last()) {
        (Some(m), Some(max)) => (*m, *max),
        _ => (0, 0),
    }
}
