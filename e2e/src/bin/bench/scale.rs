//! Section 5: ADD latency with up to 60,000 existing claims, on both
//! stores (the kubernetes store on the real kube-apiserver) and
//! host-local, and what each ADD costs the apiserver and etcd.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::kube_api::ApiServer;
use sticky_e2e::report::{line_plot, Series, Stats, Table};
use sticky_e2e::Topology;
use sticky_ipam::claim::{Claim, Holder};
use sticky_ipam::store::file::FileStore;
use sticky_ipam::store::{Change, ClaimStore, Plan};

use crate::{exec, interleaved, ms, ratio, Suite};

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
            unconfirmed: None,
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
pub fn scale(suite: &mut Suite, topo: &mut Topology, api: &ApiServer) {
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
        &["existing claims", "file store", "kubernetes store (kube-apiserver)", "reference host-local", "file / ref", "kubernetes / ref"],
    );
    let cost_adds = if suite.opts.quick { 20 } else { 200 };
    let mut cost = Table::new(
        "scale-server",
        format!("5b. What the kubernetes store's ADDs cost the API server, {cost_adds} ADD+DEL cycles of Deployment pods at each size: CPU time per cycle (user + system, delta over the run) and resident memory after it"),
        &["existing claims", "ADD p50 ms", "kube-apiserver CPU ms / cycle", "etcd CPU ms / cycle", "kube-apiserver RSS MiB", "etcd RSS MiB", "requests / cycle"],
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
    for &existing in &sizes {
        let file_dir = topo.file(&format!("scale-file-{existing}"));
        let hl_dir = topo.file(&format!("scale-hl-{existing}"));
        let seeding = Instant::now();
        seed_file_store(&file_dir, existing);
        seed_host_local(&hl_dir, existing);
        api.seed_claims(SCALE_NET, seed_claims(seeded_api, existing));
        seeded_api = existing;
        api.reset_stats();
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
            let add = exec(plugin, "ADD", &pod.path, conf, "scale", "scale-0");
            exec(plugin, "DEL", &pod.path, conf, "scale", "scale-0");
            ms(add.elapsed)
        });
        let stats: Vec<Stats> = samples.iter().map(|s| Stats::of(s)).collect();
        // The server's side: a CPU delta over many ADDs (one is below the
        // clock tick), the kubernetes store alone.
        api.reset_stats();
        let before = api.server_usage();
        let mut adds = Vec::new();
        for i in 0..cost_adds {
            let cid = format!("scale-cost-{i}");
            let add = exec(
                &suite.ours,
                "ADD",
                &pod.path,
                &confs[1].1,
                &cid,
                &format!("cost-{i}"),
            );
            exec(
                &suite.ours,
                "DEL",
                &pod.path,
                &confs[1].1,
                &cid,
                &format!("cost-{i}"),
            );
            adds.push(ms(add.elapsed));
        }
        let requests = sticky_e2e::requests::total(&api.stats()) as f64 / cost_adds as f64;
        if let (Some(b), Some(a)) = (before, api.server_usage()) {
            let per = |i: usize| (a[i].0 - b[i].0) / cost_adds as f64;
            let add_p50 = Stats::of(&adds).median;
            cost.row(
                vec![
                    existing.to_string(),
                    format!("{add_p50:.2}"),
                    format!("{:.2}", per(0)),
                    format!("{:.2}", per(1)),
                    format!("{:.0}", a[0].1),
                    format!("{:.0}", a[1].1),
                    format!("{requests:.1}"),
                ],
                json!({"existing": existing, "add_p50_ms": add_p50, "apiserver_cpu_ms_per_cycle": per(0), "etcd_cpu_ms_per_cycle": per(1),
                       "apiserver_rss_mib": a[0].1, "etcd_rss_mib": a[1].1, "requests_per_cycle": requests}),
            );
        }
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
                stats[2].cell(),
                ratio(&stats[0], &stats[2]),
                ratio(&stats[1], &stats[2]),
            ],
            json!({"existing": existing, "file": stats[0].json(), "kubernetes": stats[1].json(),
                "reference": stats[2].json()}),
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
            vec![format!("{existing}, kubernetes store, a node's first ADD whose start is taken (one paged listing of the locks)"), "".into(), one.cell(), "".into(), "".into(), "".into()],
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
    suite.report.add(cost);
    for (i, label, limit) in [
        (0, "file store", 2.0),
        (1, "kubernetes store (kube-apiserver)", 1.5),
    ] {
        let pts = &series[i].points;
        if let (Some(first), Some(last)) = (pts.first(), pts.last()) {
            let q = last.1 / first.1;
            suite.report.verdict(
                &format!(
                    "ADD at {} claims within {limit}x of {} claims, {label}",
                    last.0, first.0
                ),
                format!("{q:.2}x ({:.2} vs {:.2} ms)", last.1, first.1),
                q <= limit,
                "see tables 5 and 5b",
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
