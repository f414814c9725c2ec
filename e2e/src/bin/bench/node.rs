//! The sections on one node: ADD+DEL cycles, the `ip` floor, parallel
//! attaches, scale, memory and the ARP probe.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::kube::StandIn;
use sticky_e2e::report::{distribution_plot, line_plot, Series, Stats, Table};
use sticky_e2e::{CniCall, Pod, Topology};
use sticky_ipam::claim::{Claim, Holder};
use sticky_ipam::store::file::FileStore;
use sticky_ipam::store::{Change, ClaimStore, Plan};

use crate::{exec, interleaved, ms, Suite};

/// The medians the floor section compares and judges.
pub struct Cycles {
    l3: (Stats, Stats),
    l2: (Stats, Stats),
    /// ADD and DEL alone, L3 then L2, (ours, reference).
    add: [(Stats, Stats); 2],
    del: [(Stats, Stats); 2],
}

fn ratio(ours: &Stats, theirs: &Stats) -> String {
    format!("{:.2}x", ours.median / theirs.median)
}

/// Section 1: interleaved ADD+DEL cycles, ours against the reference.
pub fn add_del_cycles(suite: &mut Suite, topo: &mut Topology) -> Cycles {
    let pod = topo.add_pod("bench");
    let ref_l3 = configs::macvlan(
        REF_TYPE,
        "1.0.0",
        "uplink0",
        configs::host_local(&topo.file("ref")),
    );
    let mut sticky_identity = configs::sticky("uplink0", &topo.file("sticky-id"), json!({}));
    sticky_identity["args"] = json!({"cni": {"identity": "bench-peer"}});
    let cases: [(&str, Value, Value); 4] = [
        (
            "L3, host-local delegated",
            configs::macvlan(
                OUR_TYPE,
                "1.0.0",
                "uplink0",
                configs::host_local(&topo.file("our")),
            ),
            ref_l3.clone(),
        ),
        (
            "L3, sticky-ipam fresh dynamic",
            configs::sticky("uplink0", &topo.file("sticky-dyn"), json!({})),
            ref_l3.clone(),
        ),
        ("L3, sticky-ipam sticky re-ADD", sticky_identity, ref_l3),
        (
            "L2 only",
            configs::macvlan(OUR_TYPE, "1.0.0", "uplink0", json!({})),
            configs::macvlan(REF_TYPE, "1.0.0", "uplink0", json!({})),
        ),
    ];
    let runs = suite.opts.runs;
    let mut table = Table::new(
        "cycles",
        format!("1. ADD+DEL cycles, {runs} interleaved runs, ms; reference = macvlan + host-local (L3) or macvlan (L2)"),
        &["case", "sticky-macvlan", "reference", "ratio"],
    );
    let mut figures = Vec::new();
    for (label, our_conf, ref_conf) in &cases {
        let plugins = [
            (&suite.ours.clone(), our_conf),
            (&suite.reference.clone(), ref_conf),
        ];
        let samples = interleaved(2, runs, |c| {
            let (plugin, conf) = plugins[c];
            let add = exec(plugin, "ADD", &pod.path, conf, "bench", "bench-0");
            let del = exec(plugin, "DEL", &pod.path, conf, "bench", "bench-0");
            (ms(add.elapsed), ms(del.elapsed))
        });
        let stat = |c: usize, f: fn(&(f64, f64)) -> f64| {
            Stats::of(&samples[c].iter().map(f).collect::<Vec<_>>())
        };
        let cycle = |s: &(f64, f64)| s.0 + s.1;
        let (o, r) = (stat(0, cycle), stat(1, cycle));
        let (oa, ra) = (stat(0, |s| s.0), stat(1, |s| s.0));
        let (od, rd) = (stat(0, |s| s.1), stat(1, |s| s.1));
        for (what, ours, theirs) in [("ADD+DEL", &o, &r), ("ADD", &oa, &ra), ("DEL", &od, &rd)] {
            table.row(
                vec![format!("{label}: {what}"), ours.cell(), theirs.cell(), ratio(ours, theirs)],
                json!({"case": label, "what": what, "ours": ours.json(), "reference": theirs.json()}),
            );
        }
        suite.weigh(label, &pod.path, our_conf, Some(ref_conf));
        figures.push((o, r, oa, ra, od, rd));
    }
    suite.report.add(table);
    let (l3, l2) = (&figures[1], &figures[3]);
    Cycles {
        l3: (l3.0, l3.1),
        l2: (l2.0, l2.1),
        add: [(l3.2, l3.3), (l2.2, l2.3)],
        del: [(l3.4, l3.5), (l2.4, l2.5)],
    }
}

/// One step of the `ip` floor: a command run to completion, in ms.
fn ip_step(args: &[&str], stdin: Option<&str>) -> f64 {
    let start = Instant::now();
    let mut cmd = Command::new("ip");
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().expect("run ip");
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(text.as_bytes()).expect("ip -batch input");
    }
    let out = child.wait_with_output().expect("wait for ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ms(start.elapsed())
}

/// The netlink work of one ADD+DEL by `ip`: create the macvlan straight
/// into the pod netns, rename, address, up, default route; then delete.
/// `batched` runs it as one `ip` process per netns (the least an `ip`
/// script can do), otherwise one process per step as a shell script
/// would. Returns (ADD ms, DEL ms).
fn ip_cycle(pod: &Pod, l3: bool, batched: bool) -> (f64, f64) {
    let ns = pod.netns.as_str();
    let add = if batched {
        let mut t = ip_step(
            &[
                "link", "add", "link", "uplink0", "name", "net1", "netns", ns, "type", "macvlan",
                "mode", "bridge",
            ],
            None,
        );
        let script = if l3 {
            "addr add 10.213.0.77/24 dev net1\nlink set net1 up\nroute add default via 10.213.0.1 dev net1\n"
        } else {
            "link set net1 up\n"
        };
        t += ip_step(&["-n", ns, "-batch", "-"], Some(script));
        t
    } else {
        let mut t = ip_step(
            &[
                "link", "add", "link", "uplink0", "name", "smvtmp0", "netns", ns, "type",
                "macvlan", "mode", "bridge",
            ],
            None,
        );
        t += ip_step(&["-n", ns, "link", "set", "smvtmp0", "name", "net1"], None);
        if l3 {
            t += ip_step(
                &["-n", ns, "addr", "add", "10.213.0.77/24", "dev", "net1"],
                None,
            );
        }
        t += ip_step(&["-n", ns, "link", "set", "net1", "up"], None);
        if l3 {
            t += ip_step(
                &[
                    "-n",
                    ns,
                    "route",
                    "add",
                    "default",
                    "via",
                    "10.213.0.1",
                    "dev",
                    "net1",
                ],
                None,
            );
        }
        t
    };
    let del = ip_step(&["-n", ns, "link", "del", "net1"], None);
    (add, del)
}

/// Section 2: how close the plugin comes to the kernel's own cost, and the
/// verdicts of section 1, which need the floor's DEL to explain a miss.
pub fn floor(suite: &mut Suite, topo: &mut Topology, cycles: &Cycles) {
    let pod = topo.add_pod("floor");
    let runs = suite.opts.runs;
    let dir = topo.file("floor");
    let ours = suite.ours.clone();
    let l3_conf = configs::sticky("uplink0", &dir, json!({}));
    let l2_conf = configs::macvlan(OUR_TYPE, "1.0.0", "uplink0", json!({}));
    let mut table = Table::new(
        "floor",
        format!(
            "2. The pod-attach floor: the same netlink work by `ip`, {runs} interleaved runs, ms"
        ),
        &[
            "case",
            "sticky-macvlan",
            "ip, one process per step",
            "ip -batch, one per netns",
            "ours / batch",
        ],
    );
    let mut l3_verdict = None;
    let mut del_floor = Stats::of(&[]);
    for (label, l3, conf) in [
        ("L3 (sticky-ipam) ADD+DEL", true, &l3_conf),
        ("L2 ADD+DEL", false, &l2_conf),
    ] {
        let samples = interleaved(3, runs, |c| match c {
            0 => {
                let add = exec(&ours, "ADD", &pod.path, conf, "floor", "floor-0");
                let del = exec(&ours, "DEL", &pod.path, conf, "floor", "floor-0");
                (ms(add.elapsed), ms(del.elapsed))
            }
            1 => ip_cycle(&pod, l3, false),
            _ => ip_cycle(&pod, l3, true),
        });
        let cycle = |c: usize| Stats::of(&samples[c].iter().map(|s| s.0 + s.1).collect::<Vec<_>>());
        let (o, step, batch) = (cycle(0), cycle(1), cycle(2));
        table.row(
            vec![label.into(), o.cell(), step.cell(), batch.cell(), ratio(&o, &batch)],
            json!({"case": label, "ours": o.json(), "ip_per_step": step.json(), "ip_batch": batch.json()}),
        );
        if l3 {
            let dels: Vec<f64> = samples[2].iter().map(|s| s.1).collect();
            del_floor = Stats::of(&dels);
            table.row(
                vec![
                    "  of which the kernel's link delete (`ip link del`)".into(),
                    "".into(),
                    "".into(),
                    del_floor.cell(),
                    "".into(),
                ],
                json!({"case": "ip link del", "ip_batch": del_floor.json()}),
            );
            l3_verdict = Some((o, batch));
        }
    }
    suite.report.add(table);

    let cases = [
        ("L3 ADD+DEL (sticky-ipam)", &cycles.l3),
        ("L2 ADD+DEL", &cycles.l2),
    ];
    for (i, (label, (o, r))) in cases.into_iter().enumerate() {
        let q = o.median / r.median;
        let cause = format!(
            "the kernel's link delete costs {:.1} ms of every cycle for both plugins ({:.0}% of the reference's cycle; `ip link del` alone, section 2); our ADD alone is {} the reference's and our DEL {}",
            del_floor.median,
            del_floor.median / r.median * 100.0,
            ratio(&cycles.add[i].0, &cycles.add[i].1),
            ratio(&cycles.del[i].0, &cycles.del[i].1)
        );
        suite.report.verdict(
            &format!("{label} <= 0.6x the reference"),
            format!("{q:.2}x ({:.2} vs {:.2} ms)", o.median, r.median),
            q <= 0.6,
            &cause,
        );
    }
    if let Some((o, batch)) = l3_verdict {
        let q = o.median / batch.median;
        suite.report.verdict(
            "L3 ADD+DEL within 1.5x of the `ip -batch` floor",
            format!("{q:.2}x ({:.2} vs {:.2} ms)", o.median, batch.median),
            q <= 1.5,
            "the plugin's IPAM writes (fsync'd claim files) are work the floor does not do",
        );
    }
}

/// Section 3: `parallel_pods` ADDs at once on one node, then as many DELs,
/// for the file store, the kubernetes store and the reference.
pub fn parallel(suite: &mut Suite, topo: &mut Topology, api: &StandIn) {
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
            suite.report.verdict(
                &format!("{n} parallel ADDs, {label}: wall <= the reference's"),
                format!("{:.0} vs {:.0} ms ({})", w.median, ref_wall.median, ratio(&w, &ref_wall)),
                w.median <= ref_wall.median,
                "ADDs of one network on one node are serialised by the store's lock (for the kubernetes store, across its API round trips)",
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

const SCALE_NET: &str = "scalenet";

fn scale_ip(i: u32) -> IpAddr {
    // 10.220.0.2 onwards: a /16 that carries no traffic, only allocations.
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 220, 0, 2)) + i))
}

/// Claims `from..to` as another node's pods would have left them.
fn seed_claims(from: u32, to: u32) -> Vec<Claim> {
    let now = sticky_ipam::claim::now_secs();
    (from..to)
        .map(|i| Claim {
            ip: scale_ip(i),
            identity: format!("default/seed-{i}"),
            sticky: true,
            holder: Some(Holder {
                container_id: format!("seed{i}"),
                ifname: "net1".into(),
                netns: format!("/var/run/netns/seed{i}"),
                netns_id: None,
                pod_namespace: Some("default".into()),
                pod_name: Some(format!("seed-{i}")),
                pod_uid: Some(format!("uid-{i}")),
                node: "elsewhere".into(),
                boot_id: String::new(),
                since: now,
            }),
            owner: None,
            namespace: Some("default".into()),
            created: now,
            updated: now,
        })
        .collect()
}

/// `n` claims in a new file store, loaded in bulk.
fn seed_file_store(dir: &Path, n: u32) {
    let mut store = FileStore::open(dir, SCALE_NET).expect("open store");
    store.set_durable(false);
    let changes = seed_claims(0, n)
        .into_iter()
        .map(|c| Change {
            before: None,
            after: Some(c),
        })
        .collect();
    let plan = Plan {
        changes,
        cursors: vec![(0, scale_ip(n - 1))],
    };
    store.commit(&plan).expect("seed claims");
    store.sync().expect("sync");
}

/// `n` host-local files and its cursor, as host-local would have written.
fn seed_host_local(dir: &Path, n: u32) {
    let net = dir.join(SCALE_NET);
    std::fs::create_dir_all(&net).expect("mkdir");
    for i in 0..n {
        std::fs::write(
            net.join(scale_ip(i).to_string()),
            format!("seed{i}\r\nnet1"),
        )
        .expect("seed");
    }
    std::fs::write(net.join("last_reserved_ip.0"), scale_ip(n - 1).to_string()).expect("cursor");
}

/// Section 4: ADD latency against the number of existing claims in a /16.
pub fn scale(suite: &mut Suite, topo: &mut Topology, api: &StandIn) {
    let pod = topo.add_pod("scale");
    let runs = (suite.opts.runs / 2).max(5);
    let sizes = suite.opts.scale.clone();
    let range = json!({"subnet": "10.220.0.0/16", "gateway": "10.220.0.1", "routes": [{"dst": "0.0.0.0/0"}]});
    let conf = |plugin_type: &str, ipam: Value| {
        let mut ipam_all = range.clone();
        configs::merge(&mut ipam_all, &ipam);
        let mut c = configs::macvlan(plugin_type, "1.0.0", "uplink0", ipam_all);
        c["name"] = json!(SCALE_NET);
        c
    };
    let mut table = Table::new(
        "scale",
        format!("5. ADD latency with existing claims in a /16, {runs} interleaved ADD+DEL cycles each, ms"),
        &["existing claims", "file store", "kubernetes store (stand-in)", "kubernetes, less the stand-in's own time", "reference host-local", "file / ref"],
    );
    let mut seeded_api = 0;
    let mut series: Vec<Series> = [
        "sticky-ipam, file store",
        "sticky-ipam, kubernetes store",
        "reference host-local",
    ]
    .iter()
    .map(|n| Series {
        name: n.to_string(),
        points: vec![],
    })
    .collect();
    let kube_dir = topo.file("scale-kube");
    let mut own_series = Series {
        name: "kubernetes store, less the stand-in's time".into(),
        points: vec![],
    };
    for &existing in &sizes {
        let file_dir = topo.file(&format!("scale-file-{existing}"));
        let hl_dir = topo.file(&format!("scale-hl-{existing}"));
        let seeding = Instant::now();
        seed_file_store(&file_dir, existing);
        seed_host_local(&hl_dir, existing);
        api.seed_claims(SCALE_NET, seed_claims(seeded_api, existing));
        seeded_api = existing;
        eprintln!("seeded {existing} claims in {:?}", seeding.elapsed());
        let confs = [
            (
                suite.ours.clone(),
                conf(
                    OUR_TYPE,
                    json!({"type": "sticky-ipam", "dataDir": file_dir}),
                ),
            ),
            (
                suite.ours.clone(),
                conf(
                    OUR_TYPE,
                    json!({"type": "sticky-ipam", "dataDir": kube_dir, "nodeName": "node1",
                "store": {"type": "kubernetes", "kubeconfig": api.kubeconfig}}),
                ),
            ),
            (
                suite.reference.clone(),
                conf(REF_TYPE, json!({"type": "host-local", "dataDir": hl_dir})),
            ),
        ];
        let samples = interleaved(3, runs, |c| {
            let (plugin, conf) = &confs[c];
            api.reset_stats();
            let add = exec(plugin, "ADD", &pod.path, conf, "scale", "scale-0");
            let served = api.stats()["server busy us"].as_f64().unwrap_or(0.0) / 1e3;
            exec(plugin, "DEL", &pod.path, conf, "scale", "scale-0");
            (ms(add.elapsed), ms(add.elapsed) - served)
        });
        let stats: Vec<Stats> = samples
            .iter()
            .map(|s| Stats::of(&s.iter().map(|x| x.0).collect::<Vec<_>>()))
            .collect();
        let kube_own = Stats::of(&samples[1].iter().map(|x| x.1).collect::<Vec<_>>());
        own_series
            .points
            .push((f64::from(existing), kube_own.median));
        for (c, stat) in stats.iter().enumerate() {
            series[c].points.push((f64::from(existing), stat.median));
        }
        if Some(&existing) == sizes.last() {
            suite.weigh(
                &format!("{existing} existing claims, file store"),
                &pod.path,
                &confs[0].1,
                Some(&confs[2].1),
            );
            suite.weigh(
                &format!("{existing} existing claims, kubernetes store"),
                &pod.path,
                &confs[1].1,
                None,
            );
        }
        table.row(
            vec![
                existing.to_string(),
                stats[0].cell(),
                stats[1].cell(),
                kube_own.cell(),
                stats[2].cell(),
                ratio(&stats[0], &stats[2]),
            ],
            json!({"existing": existing, "file": stats[0].json(), "kubernetes": stats[1].json(),
                "kubernetes_less_server": kube_own.json(), "reference": stats[2].json()}),
        );
    }
    // The kubernetes store's one unbounded path: a node whose next-fit
    // start is taken loads the network's listing once (later ADDs start
    // from its cursor). Shown with a new node whose start lands mid-pool.
    if let Some(&existing) = sizes.last() {
        let node = (0..1_000_000)
            .map(|i| format!("bench-node-{i}"))
            .find(|n| {
                let at = sticky_ipam::store::ipclaim::node_offset(n, 65_534);
                at > 10 && at + 10 < u128::from(existing)
            })
            .expect("a node name whose next-fit start is taken");
        let collide = |dir: &str| {
            conf(
                OUR_TYPE,
                json!({"type": "sticky-ipam", "dataDir": topo.file(dir), "nodeName": node,
                "store": {"type": "kubernetes", "kubeconfig": api.kubeconfig}}),
            )
        };
        let first = collide("scale-kube-first");
        let add = exec(
            &suite.ours,
            "ADD",
            &pod.path,
            &first,
            "scale-first",
            "scale-first",
        );
        exec(
            &suite.ours,
            "DEL",
            &pod.path,
            &first,
            "scale-first",
            "scale-first",
        );
        let one = Stats::of(&[ms(add.elapsed)]);
        table.row(
            vec![format!("{existing}, kubernetes store, a node's first ADD whose start is taken (one paged listing)"), "".into(), one.cell(), "".into(), "".into(), "".into()],
            json!({"existing": existing, "kubernetes_first_add_with_list": one.json()}),
        );
        suite.weigh(
            &format!("{existing} existing claims, kubernetes store, first ADD with a LIST"),
            &pod.path,
            &collide("scale-kube-first-mem"),
            None,
        );
    }
    suite.report.add(table);
    series.insert(2, own_series);
    let scan = "the stand-in answers each label-selected LIST (two per fresh ADD) by scanning every object, as kube-apiserver's watch cache does; the plugin's own time is the next target";
    let own = "the plugin decodes the claims its LISTs return, and those grow with the pool only through the stand-in's answer size, not by count";
    for (i, label, cause) in [
        (0, "file store", "unexpected: see table 4"),
        (1, "kubernetes store (stand-in)", scan),
        (2, "kubernetes store, less the stand-in's own time", own),
    ] {
        let pts = &series[i].points;
        if let (Some(first), Some(last)) = (pts.first(), pts.last()) {
            let q = last.1 / first.1;
            suite.report.verdict(
                &format!(
                    "ADD at {} claims within 2x of {} claims, {label}",
                    last.0, first.0
                ),
                format!("{q:.2}x ({:.2} vs {:.2} ms)", last.1, first.1),
                q <= 2.0,
                cause,
            );
        }
    }
    let svg = line_plot(
        "ADD latency against existing claims (median)",
        "existing claims in the network",
        "ms per ADD",
        &series,
        true,
    );
    suite.report.write(&suite.opts.out, "scale.svg", &svg);
    suite.report.plots.push((
        "scale.svg".into(),
        "Section 5: median ADD latency against the number of existing claims, log scale.".into(),
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

/// Section 7: what the wire check adds, on the file store (node-local:
/// every sticky grant is probed), with the default probe against
/// `probe.riskDuplicateAddresses`: a sticky identity's first ADD on this
/// node, its re-ADD after its DEL (a pod restart), a takeover from a holder
/// whose netns is gone (nobody answers, so the probe runs its full course),
/// a dynamic allocation (not probed: host-local's contract), and how soon
/// a refusal comes when a live holder does answer.
pub fn probe_cost(suite: &mut Suite, topo: &mut Topology) {
    let n = if suite.opts.quick {
        2
    } else {
        (suite.opts.runs / 3).max(5)
    };
    let mut table = Table::new(
        "probe",
        format!("7. What the wire check adds on the file store, {n} ADDs each, ms: default probe (3 x 100 ms) against probe.riskDuplicateAddresses"),
        &["ADD", "default probe", "probe off", "added"],
    );
    #[derive(Clone, Copy, PartialEq)]
    enum Case {
        Fresh,
        ReAdd,
        Takeover,
        Dynamic,
    }
    let mut seq = 0usize;
    for (label, case) in [
        ("sticky identity, first ADD on this node", Case::Fresh),
        ("sticky re-ADD after its DEL (pod restart)", Case::ReAdd),
        ("takeover (old holder's netns gone)", Case::Takeover),
        ("dynamic allocation (not probed)", Case::Dynamic),
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
                };
                topo.delete_netns(&netns);
                out.push(ms);
            }
        }
        let (w, wo) = (Stats::of(&with), Stats::of(&without));
        let added = w.median - wo.median;
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

/// What a tool prints, or None when it is not installed.
fn tool(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

/// Section 8: the profile of one ADD, in counts that do not depend on how
/// busy the machine is: user-space instructions (callgrind, every process
/// of the ADD, so the reference's host-local too) and system calls
/// (strace), ours against the reference, for a fresh L3 allocation.
pub fn profile(suite: &mut Suite, topo: &mut Topology) {
    let (Some(_), Some(_)) = (tool("valgrind"), tool("strace")) else {
        suite
            .report
            .notes
            .push("section 8 (profile) skipped: valgrind or strace is not installed".into());
        return;
    };
    let pod = topo.add_pod("profile");
    let ours_conf = configs::sticky("uplink0", &topo.file("profile-ours"), json!({}));
    let ref_conf = configs::macvlan(
        REF_TYPE,
        "1.0.0",
        "uplink0",
        configs::host_local(&topo.file("profile-ref")),
    );
    let trace = topo.file("profile.strace");
    let mut table = Table::new(
        "profile",
        "8. The profile of one fresh L3 ADD: user-space instructions (callgrind, all its processes) and system calls (strace -f)",
        &["count", "sticky-macvlan", "reference", "ratio"],
    );
    let mut instructions = Vec::new();
    let mut counts: Vec<BTreeMap<String, u64>> = Vec::new();
    for (plugin, conf) in [
        (suite.ours.clone(), &ours_conf),
        (suite.reference.clone(), &ref_conf),
    ] {
        let grind = CniCall::new(&plugin, "", "ADD", conf.clone())
            .container("profile")
            .netns(&pod.path)
            .args(&crate::pod_args("profile-0"))
            .wrapped(&[
                "valgrind",
                "--tool=callgrind",
                "--trace-children=yes",
                "--callgrind-out-file=/dev/null",
            ])
            .run();
        // valgrind 3.19 cannot run the Go runtime: the reference has no
        // instruction count then.
        let collected: Option<u64> = grind.success.then(|| {
            grind
                .stderr
                .lines()
                .filter_map(|l| {
                    l.split_once("Collected :")
                        .map(|(_, n)| n.trim().replace(',', ""))
                })
                .filter_map(|n| n.parse::<u64>().ok())
                .sum()
        });
        let _ = CniCall::new(&plugin, "", "DEL", conf.clone())
            .container("profile")
            .netns(&pod.path)
            .args(&crate::pod_args("profile-0"))
            .run();
        let traced = CniCall::new(&plugin, "", "ADD", conf.clone())
            .container("profile")
            .netns(&pod.path)
            .args(&crate::pod_args("profile-0"))
            .wrapped(&["strace", "-f", "-c", "-o", &trace.display().to_string()])
            .run();
        assert!(traced.success, "ADD under strace: {}", traced.stdout);
        exec(&plugin, "DEL", &pod.path, conf, "profile", "profile-0");
        // strace -c: "% time seconds usecs/call calls errors syscall".
        let mut by_call = BTreeMap::new();
        for line in std::fs::read_to_string(&trace).unwrap_or_default().lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 5 && f[0].parse::<f64>().is_ok() {
                let calls = f[3].parse::<u64>().unwrap_or(0);
                by_call.insert(f[f.len() - 1].to_string(), calls);
            }
        }
        counts.push(by_call);
        instructions.push(collected);
    }
    let get = |i: usize, k: &str| counts[i].get(k).copied().unwrap_or(0);
    let total = |i: usize| counts[i].values().sum::<u64>();
    let cell =
        |n: Option<u64>| n.map_or("- (valgrind cannot run it)".to_string(), |n| n.to_string());
    table.row(
        vec![
            "user-space instructions".into(),
            cell(instructions[0]),
            cell(instructions[1]),
            match (instructions[0], instructions[1]) {
                (Some(o), Some(r)) if r > 0 => format!("{:.2}x", o as f64 / r as f64),
                _ => "-".into(),
            },
        ],
        json!({"count": "user-space instructions", "ours": instructions[0], "reference": instructions[1]}),
    );
    let lines: Vec<(&str, u64, u64)> = vec![
        ("system calls", total(0), total(1)),
        (
            "  fsync + fdatasync",
            get(0, "fsync") + get(0, "fdatasync"),
            get(1, "fsync") + get(1, "fdatasync"),
        ),
        (
            "  netlink/packet sockets opened (socket)",
            get(0, "socket"),
            get(1, "socket"),
        ),
        (
            "  files opened (openat)",
            get(0, "openat"),
            get(1, "openat"),
        ),
        (
            "  processes and threads started (clone, clone3, execve)",
            get(0, "clone") + get(0, "clone3") + get(0, "execve"),
            get(1, "clone") + get(1, "clone3") + get(1, "execve"),
        ),
    ];
    for (label, o, r) in lines {
        table.row(
            vec![
                label.to_string(),
                o.to_string(),
                r.to_string(),
                if r > 0 {
                    format!("{:.2}x", o as f64 / r as f64)
                } else {
                    "-".into()
                },
            ],
            json!({"count": label, "ours": o, "reference": r}),
        );
    }
    suite.report.add(table);
}
