//! The sections on one node that compare paths of the plugin: parallel
//! attaches, memory, and what the wire check costs.

use std::path::Path;
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::kube_api::ApiServer;
use sticky_e2e::report::{distribution_plot, Stats, Table};
use sticky_e2e::{CniCall, Pod, Topology};

use crate::{exec, ms, ratio, Suite};

/// Section 3: `parallel_pods` ADDs at once on one node, then as many DELs,
/// for the file store, the kubernetes store and the reference.
pub fn parallel(suite: &mut Suite, topo: &mut Topology, api: &ApiServer) {
    let n = suite.opts.parallel_pods;
    let rounds = suite.opts.parallel_rounds;
    let pods: Vec<Pod> = (0..n).map(|i| topo.add_pod(&format!("par{i}"))).collect();
    for i in 0..n {
        api.add_pod("bench", &format!("par-{i}"), "node1", None, None);
    }
    let wide = json!({"subnet": "10.231.0.0/20", "rangeStart": "10.231.0.10", "rangeEnd": "10.231.15.250", "gateway": "10.231.0.1", "routes": [{"dst": "0.0.0.0/0"}]});
    let with = |extra: Value| {
        let mut ipam = wide.clone();
        configs::merge(&mut ipam, &extra);
        ipam
    };
    let mut file_ipam = with(json!({"type": "sticky-ipam", "dataDir": topo.file("par-file")}));
    file_ipam["store"] = json!({"type": "file"});
    let kube_ipam = with(
        json!({"type": "sticky-ipam", "dataDir": topo.file("par-kube"), "nodeName": "node1",
        "store": {"type": "kubernetes", "kubeconfig": api.kubeconfig}}),
    );
    let ref_ipam = with(json!({"type": "host-local", "dataDir": topo.file("par-ref")}));
    let named = |plugin_type: &str, ipam: Value| {
        let mut c = configs::macvlan(plugin_type, "1.0.0", "uplink0", ipam);
        c["name"] = json!("parnet");
        c
    };
    let contenders = [
        (
            "sticky-macvlan, file store",
            suite.ours.clone(),
            named(OUR_TYPE, file_ipam),
        ),
        (
            "sticky-macvlan, kubernetes store",
            suite.ours.clone(),
            named(OUR_TYPE, kube_ipam),
        ),
        (
            "reference macvlan + host-local",
            suite.reference.clone(),
            named(REF_TYPE, ref_ipam),
        ),
    ];
    // (wall of the ADDs, wall of the DELs, every ADD's latency)
    let mut results: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![Default::default(); 3];
    let mut round_no = 0;
    for round in 0..rounds {
        for k in 0..3 {
            let c = (round + k) % 3;
            let (_, plugin, conf) = &contenders[c];
            round_no += 1;
            let run = |command: &str| {
                let lat = Mutex::new(Vec::new());
                let barrier = Barrier::new(n);
                let start = Instant::now();
                std::thread::scope(|s| {
                    for (i, pod) in pods.iter().enumerate() {
                        let (lat, barrier) = (&lat, &barrier);
                        s.spawn(move || {
                            barrier.wait();
                            let r = exec(
                                plugin,
                                command,
                                &pod.path,
                                conf,
                                &format!("par{round_no}-{i}"),
                                &format!("par-{i}"),
                            );
                            lat.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(ms(r.elapsed));
                        });
                    }
                });
                (ms(start.elapsed()), lat.into_inner().unwrap_or_default())
            };
            let (add_wall, adds) = run("ADD");
            let (del_wall, _) = run("DEL");
            let r = &mut results[c];
            r.0.push(add_wall);
            r.1.push(del_wall);
            r.2.extend(adds);
        }
    }
    suite.weigh(
        "fresh allocation, kubernetes store",
        &pods[0].path,
        &contenders[1].2,
        None,
    );
    let mut table = Table::new(
        "parallel",
        format!("3. {n} pods attached at once on one node, {rounds} rounds, ms (wall: median [min..max] over rounds; per ADD: over all ADDs)"),
        &["contender", "wall, all ADDs", "per ADD p50", "per ADD p99", "wall, all DELs", "ADD wall vs reference"],
    );
    let ref_wall = Stats::of(&results[2].0);
    let mut plot = Vec::new();
    for (i, (label, _, _)) in contenders.iter().enumerate() {
        let (adds_wall, dels_wall, lat) = &results[i];
        let (w, l, d) = (Stats::of(adds_wall), Stats::of(lat), Stats::of(dels_wall));
        table.row(
            vec![label.to_string(), w.cell(), format!("{:.2}", l.median), format!("{:.2}", l.p99), d.cell(), ratio(&w, &ref_wall)],
            json!({"contender": label, "pods": n, "add_wall": w.json(), "per_add": l.json(), "del_wall": d.json()}),
        );
        plot.push((label.to_string(), lat.clone()));
        if i < 2 {
            // Issue 29's goal for the kubernetes store: 0.8x.
            let goal = if i == 0 { 1.0 } else { 0.8 };
            suite.report.verdict(
                &format!("{n} parallel ADDs, {label}: wall <= {goal}x the reference's"),
                format!("{:.0} vs {:.0} ms ({})", w.median, ref_wall.median, ratio(&w, &ref_wall)),
                w.median <= goal * ref_wall.median,
                if i == 0 {
                    "ADDs of one network on one node are serialised by the file store's lock"
                } else {
                    "each ADD is its own process, with its own TLS handshake and three requests, on the cores the API server and etcd use"
                },
            );
        }
    }
    suite.report.add(table);
    let svg = distribution_plot(
        &format!("{n} ADDs at once on one node: latency of each ADD"),
        "ms",
        &plot,
    );
    suite.report.write(&suite.opts.out, "parallel.svg", &svg);
    suite.report.plots.push((
        "parallel.svg".into(),
        format!("Section 3: the latency of each of {n} simultaneous ADDs, sorted (all rounds)."),
    ));
}

/// Section 6: the peak resident set of one plugin process on every path
/// the other sections registered, ours and the reference's, one ADD and
/// one DEL each under GNU time.
pub fn memory(suite: &mut Suite, topo: &Topology) {
    let mut table = Table::new(
        "memory",
        "6. Peak memory of one plugin process (ru_maxrss under GNU time), MiB",
        &[
            "path",
            "ours ADD",
            "ours DEL",
            "reference ADD",
            "reference DEL",
        ],
    );
    let file = topo.file("rss");
    let weigh = |plugin: &Path, conf: &Value, pod: &str| {
        let run = |command: &str| {
            let _ = std::fs::remove_file(&file);
            let r = CniCall::new(plugin, "", command, conf.clone())
                .container("mem")
                .netns(pod)
                .args(&crate::pod_args("mem-0"))
                .measured(&file)
                .run();
            assert!(
                r.success,
                "{command} under time failed: {}{}",
                r.stdout, r.stderr
            );
            r.max_rss_kib.unwrap_or(0)
        };
        (run("ADD"), run("DEL"))
    };
    let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
    let mut worst = (0u64, String::new());
    let probes = std::mem::take(&mut suite.memory);
    for p in &probes {
        let (oa, od) = weigh(&suite.ours, &p.ours, &p.pod);
        let theirs = p
            .reference
            .as_ref()
            .map(|r| weigh(&suite.reference, r, &p.pod));
        for (k, what) in [(oa, "ADD"), (od, "DEL")] {
            if k > worst.0 {
                worst = (k, format!("{what}, {}", p.label));
            }
        }
        let (ra, rd) = theirs
            .map(|(a, d)| (mib(a), mib(d)))
            .unwrap_or(("-".into(), "-".into()));
        table.row(
            vec![p.label.clone(), mib(oa), mib(od), ra, rd],
            json!({"path": p.label, "ours_add_kib": oa, "ours_del_kib": od, "reference_kib": theirs}),
        );
    }
    suite.report.add(table);
    suite.report.verdict(
        "peak memory of one plugin process < 20 MiB",
        format!("{} MiB ({})", mib(worst.0), worst.1),
        worst.0 > 0 && worst.0 < 20 * 1024,
        "see table 6 for the path",
    );
}

/// One ADD of identity `id` from a new pod (its own UID): ms and netns.
fn add_as(suite: &Suite, topo: &mut Topology, conf: &Value, id: &str, tag: &str) -> (f64, String) {
    let pod = topo.add_pod(tag);
    let mut c = conf.clone();
    c["args"] = json!({"cni": {"identity": id}});
    let reply = exec(&suite.ours, "ADD", &pod.path, &c, tag, tag);
    (ms(reply.elapsed), pod.netns)
}

/// A pool of one address: a dynamic ADD takes it, a CNI GC that lists no
/// attachment releases it (a judgement: the address stays a tombstone), its
/// netns goes, and the ADD measured is the next pod's, which can only reclaim
/// the tombstone. Returns that ADD's ms and its netns.
fn judged_reallocation(
    suite: &Suite,
    topo: &mut Topology,
    conf: &Value,
    seq: usize,
) -> (f64, String) {
    let one = format!("{}.10", sticky_e2e::SUBNET_PREFIX);
    let mut conf = conf.clone();
    conf["cniVersion"] = json!("1.1.0");
    conf["ipam"]["rangeStart"] = json!(one);
    conf["ipam"]["rangeEnd"] = json!(one);
    let first = format!("pg{seq}");
    let old = topo.add_pod(&first);
    exec(&suite.ours, "ADD", &old.path, &conf, &first, &first);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    CniCall::new(&suite.ours, "", "GC", gc)
        .netns("")
        .run()
        .expect_ok();
    topo.delete_netns(&old.netns);
    let next = format!("ph{seq}");
    let pod = topo.add_pod(&next);
    let reply = exec(&suite.ours, "ADD", &pod.path, &conf, &next, &next);
    (ms(reply.elapsed), pod.netns)
}

/// Section 7: what the wire check adds, on the file store (node-local:
/// every sticky grant is probed), with the default probe against
/// `probe.riskDuplicateAddresses`: a sticky identity's first ADD on this
/// node, its re-ADD after its DEL (a pod restart), a takeover from a holder
/// whose netns is gone (nobody answers, so the probe runs its full course),
/// a dynamic allocation (not probed: host-local's contract), a dynamic
/// allocation of the one address a CNI GC freed by judgement (probed since
/// I7: a judgement never proves an address free), and how soon a refusal
/// comes when a live holder does answer.
pub fn probe_cost(suite: &mut Suite, topo: &mut Topology) {
    let n = if suite.opts.quick {
        2
    } else {
        (suite.opts.runs / 3).max(5)
    };
    let default = sticky_macvlan::datapath::arp::ProbeSpec::default();
    let mut table = Table::new(
        "probe",
        format!(
            "7. What the wire check adds on the file store, {n} ADDs each, ms: default probe ({} x {} ms) against probe.riskDuplicateAddresses",
            default.count,
            default.interval.as_millis()
        ),
        &["ADD", "default probe", "probe off", "added"],
    );
    #[derive(Clone, Copy, PartialEq)]
    enum Case {
        Fresh,
        ReAdd,
        Takeover,
        Dynamic,
        Judged,
    }
    let mut seq = 0usize;
    for (label, case) in [
        ("sticky identity, first ADD on this node", Case::Fresh),
        ("sticky re-ADD after its DEL (pod restart)", Case::ReAdd),
        ("takeover (old holder's netns gone)", Case::Takeover),
        ("dynamic allocation (not probed)", Case::Dynamic),
        (
            "dynamic allocation of an address CNI GC freed (probed: a judgement)",
            Case::Judged,
        ),
    ] {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..n {
            for (probe, out) in [
                (json!({}), &mut with),
                (json!({"riskDuplicateAddresses": true}), &mut without),
            ] {
                seq += 1;
                let mut conf =
                    configs::sticky("uplink0", &topo.file(&format!("probe-{seq}")), json!({}));
                conf["probe"] = probe;
                let id = format!("peer-{seq}");
                let (ms, netns) = match case {
                    Case::Fresh => add_as(suite, topo, &conf, &id, &format!("pf{seq}")),
                    Case::Dynamic => {
                        let pod = topo.add_pod(&format!("pd{seq}"));
                        let tag = format!("pd{seq}");
                        let reply = exec(&suite.ours, "ADD", &pod.path, &conf, &tag, &tag);
                        (ms(reply.elapsed), pod.netns)
                    }
                    Case::ReAdd => {
                        let tag = format!("pr{seq}");
                        let pod = topo.add_pod(&tag);
                        let mut c = conf.clone();
                        c["args"] = json!({"cni": {"identity": id}});
                        exec(&suite.ours, "ADD", &pod.path, &c, &tag, &tag);
                        exec(&suite.ours, "DEL", &pod.path, &c, &tag, &tag);
                        let again =
                            exec(&suite.ours, "ADD", &pod.path, &c, &format!("{tag}b"), &tag);
                        (ms(again.elapsed), pod.netns)
                    }
                    Case::Takeover => {
                        let (_, old) = add_as(suite, topo, &conf, &id, &format!("po{seq}"));
                        topo.delete_netns(&old);
                        add_as(suite, topo, &conf, &id, &format!("pn{seq}"))
                    }
                    Case::Judged => judged_reallocation(suite, topo, &conf, seq),
                };
                topo.delete_netns(&netns);
                out.push(ms);
            }
        }
        let (w, wo) = (Stats::of(&with), Stats::of(&without));
        let added = w.median - wo.median;
        if case == Case::Takeover {
            suite.report.verdict(
                "a takeover's ADD on the file store, default probe, <= 150 ms",
                format!("{:.1} ms (probe off {:.1} ms)", w.median, wo.median),
                w.median <= 150.0,
                "the probe's schedule is the cost: section 9 weighs it against its miss rate",
            );
        }
        table.row(
            vec![label.into(), w.cell(), wo.cell(), format!("{added:.1}")],
            json!({"case": label, "probe": w.json(), "off": wo.json()}),
        );
    }
    // A live holder answers the first probe: the refusal's time is the
    // ADD's own work plus one ARP round trip on the segment.
    let mut refused = Vec::new();
    for _ in 0..n {
        seq += 1;
        let live = configs::sticky(
            "uplink0",
            &topo.file(&format!("probe-live-{seq}")),
            json!({}),
        );
        let other = configs::sticky(
            "uplink0",
            &topo.file(&format!("probe-other-{seq}")),
            json!({}),
        );
        let id = format!("peer-{seq}");
        let (_, holder) = add_as(suite, topo, &live, &id, &format!("pl{seq}"));
        let tag = format!("px{seq}");
        let pod = topo.add_pod(&tag);
        let mut c = other.clone();
        c["args"] = json!({"cni": {"identity": id}});
        let reply = sticky_e2e::CniCall::new(&suite.ours, "", "ADD", c)
            .container(&tag)
            .netns(&pod.path)
            .args(&super::pod_args(&tag))
            .run();
        assert_eq!(
            reply.code(),
            Some(11),
            "a live holder must refuse: {}",
            reply.stdout
        );
        refused.push(ms(reply.elapsed));
        topo.delete_netns(&pod.netns);
        topo.delete_netns(&holder);
    }
    let r = Stats::of(&refused);
    table.row(
        vec![
            "refused: a live holder on another store answers".into(),
            r.cell(),
            "-".into(),
            "-".into(),
        ],
        json!({"case": "refused by a live holder", "probe": r.json()}),
    );
    suite.report.add(table);
}
