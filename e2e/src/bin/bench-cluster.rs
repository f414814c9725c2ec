//! The benchmarks on the local real cluster (issue 18, items 4 and 5):
//! pod start with sticky-macvlan, Whereabouts and host-local side by side
//! (`e2e/src/pod_start.rs`), and what Multus costs beside what we cost
//! (`e2e/src/multus_overhead.rs`). `scripts/bench.sh --cluster` brings the
//! cluster up, runs this and takes it down; it writes `<out>/pod-start.md`
//! (`.json`, `.svg`) and `<out>/multus-overhead.md` (`.json`), and a full
//! run puts both into BENCHMARKS.md's cluster sections.
//!
//! `sudo STICKY_E2E_CLUSTER=1 target/release/bench-cluster [--quick] [--out DIR] [--only pod-start|multus]`
//! `target/release/bench-cluster --splice-only`: BENCHMARKS.md's cluster
//! sections from the section files in docs/bench, measuring nothing.

use std::path::PathBuf;

use serde_json::json;
use sticky_e2e::local_cluster::LocalCluster;
use sticky_e2e::multus_overhead;
use sticky_e2e::pod_start::{run, Contender, Round, Shape, CONTENDERS};
use sticky_e2e::report::{
    cluster_region, line_plot, splice_cluster_region, Series, Stats, Table, CLUSTER_BEGIN,
    CLUSTER_END,
};

fn median(rounds: &[&Round], f: impl Fn(&Round) -> f64) -> Stats {
    Stats::of(&rounds.iter().map(|r| f(r)).collect::<Vec<_>>())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    if let Some(o) = &only {
        if o != "pod-start" && o != "multus" {
            eprintln!("bench-cluster: --only takes pod-start or multus, not {o:?}");
            std::process::exit(2);
        }
    }
    let wanted = |section: &str| only.as_deref().is_none_or(|o| o == section);
    if args.iter().any(|a| a == "--splice-only") {
        update_benchmarks_md(std::path::Path::new("docs/bench"));
        return;
    }
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(if quick {
                "target/bench-quick"
            } else {
                "docs/bench"
            })
        });
    let shape = if quick {
        Shape {
            groups: 2,
            replicas: 2,
            rounds: 1,
        }
    } else {
        Shape {
            groups: 10,
            replicas: 10,
            rounds: 3,
        }
    };
    let Some(c) = LocalCluster::require("bench-cluster") else {
        eprintln!("bench-cluster: no local cluster; run it through scripts/bench.sh --cluster");
        std::process::exit(2);
    };
    c.install();
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
    if wanted("multus") {
        write_files(&out, &multus_section(&c, if quick { 3 } else { 30 }));
    }
    if wanted("pod-start") {
        write_files(&out, &pod_start_section(&c, shape));
    }
    if !quick && out == std::path::Path::new("docs/bench") {
        update_benchmarks_md(&out);
    }
}

fn write_files(out: &std::path::Path, files: &[(&str, String)]) {
    for (name, text) in files {
        let path = out.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        println!("wrote {}", path.display());
    }
}

/// BENCHMARKS.md's cluster sections: the section files of `out`, their
/// titles one level down and their images relative to the repository.
fn update_benchmarks_md(out: &std::path::Path) {
    let mut region = format!("{CLUSTER_BEGIN}\n");
    for name in ["pod-start.md", "multus-overhead.md"] {
        let Ok(text) = std::fs::read_to_string(out.join(name)) else {
            continue;
        };
        let text = text.replacen("# ", "## ", 1).replace(
            "](pod-start.svg)",
            &format!("]({}/pod-start.svg)", out.display()),
        );
        region.push_str(&text);
        region.push('\n');
    }
    region.push_str(CLUSTER_END);
    let md = std::path::Path::new("BENCHMARKS.md");
    let doc = std::fs::read_to_string(md).unwrap_or_default();
    let updated = splice_cluster_region(&doc, &region);
    debug_assert!(cluster_region(&updated).is_some());
    std::fs::write(md, updated).unwrap_or_else(|e| panic!("write {}: {e}", md.display()));
    println!("wrote the cluster sections of {}", md.display());
}

/// 11c: one pod's ADD and DEL through Multus thin and directly.
fn multus_section(c: &LocalCluster, runs: usize) -> Vec<(&'static str, String)> {
    let node = "node1";
    let samples = multus_overhead::measure(c, node, runs);
    let mut t = Table::new(
        "multus-overhead",
        format!("11c. What Multus costs: one pod's ADD and DEL on {node}, through Multus thin and with its two delegates run directly, {runs} interleaved runs, ms"),
        &["path", "ADD", "DEL"],
    );
    for (i, label) in multus_overhead::PATHS.iter().enumerate() {
        let of = |pick: fn((f64, f64)) -> f64| {
            Stats::of(
                &samples
                    .iter()
                    .map(|s| pick(s.by_path()[i]))
                    .collect::<Vec<_>>(),
            )
        };
        let (a, d) = (of(|(add, _)| add), of(|(_, del)| del));
        t.row(
            vec![label.to_string(), a.cell(), d.cell()],
            json!({"path": label, "add_ms": a.json(), "del_ms": d.json()}),
        );
    }
    println!("{}", t.text());
    let mut md = String::from(
        "# What Multus costs\n\nMeasured by `sudo scripts/bench.sh --cluster` (`e2e/src/multus_overhead.rs`): the plugins exec'd in the node's namespaces as its containerd does, for a pod that exists in the API but is held by a scheduling gate (Multus reads it and writes its network-status annotation; no kubelet runs it). Directly, the cluster network's plugin and then ours with the NAD's config and Multus' `CNI_ARGS`; through Multus thin, the same two as its delegates.\n\n",
    );
    md.push_str(&t.markdown());
    vec![
        ("multus-overhead.md", md),
        (
            "multus-overhead.json",
            serde_json::to_string_pretty(&json!({"runs": runs, "node": node, "table": t.raw}))
                .unwrap_or_default(),
        ),
    ]
}

/// 11a and 11b: pod start, every contender, rounds interleaved.
fn pod_start_section(c: &LocalCluster, shape: Shape) -> Vec<(&'static str, String)> {
    let rounds = run(c, shape);
    let pods = shape.groups * shape.replicas;
    let secs = |d: std::time::Duration| d.as_secs_f64();

    let mut per_round = Table::new(
        "pod-start-rounds",
        format!(
            "11a. Pod start on the local cluster, per round, s: {g} Deployments x {r} replicas from `kubectl apply` to every pod Running with net1 addressed; then {g} StatefulSets x {r} (Parallel), and all their pods deleted and back",
            g = shape.groups,
            r = shape.replicas
        ),
        &["round", "contender", "Deployments up", "StatefulSets up", "StatefulSet pods back", "same addresses after", "ours / this (Deployments)"],
    );
    for r in &rounds {
        let ours = rounds
            .iter()
            .find(|o| o.round == r.round && o.contender == Contender::Ours)
            .map(|o| secs(o.deployment_up));
        per_round.row(
            vec![
                r.round.to_string(),
                r.contender.label().into(),
                format!("{:.1}", secs(r.deployment_up)),
                format!("{:.1}", secs(r.statefulset_up)),
                format!("{:.1}", secs(r.statefulset_back)),
                format!("{}/{}", r.same_addresses, r.pods),
                ours.map(|o| format!("{:.2}x", o / secs(r.deployment_up))).unwrap_or_default(),
            ],
            json!({"round": r.round, "contender": r.contender.label(), "deployments_up_s": secs(r.deployment_up),
                   "statefulsets_up_s": secs(r.statefulset_up), "statefulset_back_s": secs(r.statefulset_back),
                   "same_addresses": r.same_addresses, "pods": r.pods}),
        );
    }
    let mut summary = Table::new(
        "pod-start",
        format!(
            "11b. Pod start, median [min..max] over {} rounds, s ({pods} pods)",
            shape.rounds
        ),
        &[
            "contender",
            "Deployments up",
            "StatefulSets up",
            "StatefulSet pods back",
            "same addresses",
            "Deployments: ours / this",
        ],
    );
    let of = |c: Contender| {
        rounds
            .iter()
            .filter(|r| r.contender == c)
            .collect::<Vec<_>>()
    };
    let ours = median(&of(Contender::Ours), |r| secs(r.deployment_up)).median;
    let mut series = Vec::new();
    for contender in CONTENDERS {
        let rs = of(contender);
        let up = median(&rs, |r| secs(r.deployment_up));
        let same: usize = rs.iter().map(|r| r.same_addresses).sum();
        summary.row(
            vec![
                contender.label().into(),
                up.cell(),
                median(&rs, |r| secs(r.statefulset_up)).cell(),
                median(&rs, |r| secs(r.statefulset_back)).cell(),
                format!("{same}/{}", pods * rs.len()),
                format!("{:.2}x", ours / up.median),
            ],
            json!({"contender": contender.label(), "deployments_up": up.json()}),
        );
        series.push(Series {
            name: contender.label().into(),
            points: rs
                .iter()
                .map(|r| (r.round as f64 + 1.0, secs(r.deployment_up)))
                .collect(),
        });
    }
    let mut md = String::from(
        "# Pod start on the local cluster\n\nMeasured by `sudo scripts/bench.sh --cluster` (`e2e/src/bin/bench-cluster.rs`, `e2e/src/pod_start.rs`) on the local cluster of `scripts/cluster.sh` (3 kubelets with containerd, Multus thin, kube-apiserver v1.36.3 on etcd 3.6.16), every contender on the same nodes and master, rounds interleaved. Targets: ours <= 0.5x Whereabouts and <= 1.1x host-local.\n\n",
    );
    for t in [&per_round, &summary] {
        println!("{}", t.text());
        md.push_str(&t.markdown());
        md.push('\n');
    }
    md.push_str("![Deployments' pod start per round](pod-start.svg)\n");
    let svg = line_plot(
        "Deployments' pods Running and addressed",
        "round",
        "s",
        &series,
        false,
    );
    vec![
        ("pod-start.md", md),
        ("pod-start.svg", svg),
        (
            "pod-start.json",
            serde_json::to_string_pretty(&json!({"rounds": per_round.raw, "summary": summary.raw}))
                .unwrap_or_default(),
        ),
    ]
}
