//! Pod start on the local real cluster (issue 18, item 4): sticky-macvlan,
//! Whereabouts and host-local side by side, `e2e/src/pod_start.rs`.
//! `scripts/bench.sh --cluster` brings the cluster up, runs this and takes
//! it down; it writes `<out>/pod-start.md`, `pod-start.json` and
//! `pod-start.svg`.
//!
//! `sudo STICKY_E2E_CLUSTER=1 target/release/bench-cluster [--quick] [--out DIR]`

use std::path::PathBuf;

use serde_json::json;
use sticky_e2e::local_cluster::LocalCluster;
use sticky_e2e::pod_start::{run, Contender, Round, Shape, CONTENDERS};
use sticky_e2e::report::{line_plot, Series, Stats, Table};

fn median(rounds: &[&Round], f: impl Fn(&Round) -> f64) -> Stats {
    Stats::of(&rounds.iter().map(|r| f(r)).collect::<Vec<_>>())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
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
    let rounds = run(&c, shape);
    let pods = shape.groups * shape.replicas;
    let secs = |d: std::time::Duration| d.as_secs_f64();

    let mut per_round = Table::new(
        "pod-start-rounds",
        format!(
            "9a. Pod start on the local cluster, per round, s: {g} Deployments x {r} replicas from `kubectl apply` to every pod Running with net1 addressed; then {g} StatefulSets x {r} (Parallel), and all their pods deleted and back",
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
            "9b. Pod start, median [min..max] over {} rounds, s ({pods} pods)",
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
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
    for (name, text) in [
        ("pod-start.md", md),
        ("pod-start.svg", svg),
        (
            "pod-start.json",
            serde_json::to_string_pretty(&json!({"rounds": per_round.raw, "summary": summary.raw}))
                .unwrap_or_default(),
        ),
    ] {
        let path = out.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        println!("wrote {}", path.display());
    }
}
