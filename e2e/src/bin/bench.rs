//! Benchmarks on the e2e topology, interleaved with the reference plugins
//! in the same run, printed as tables:
//! 1. ADD+DEL cycle: ours with host-local, with in-process sticky-ipam
//!    (fresh dynamic allocation, and a sticky identity's re-ADD), and L2,
//!    each against the reference macvlan (+ host-local).
//! 2. ADD latency with 10, 1,000 and 60,000 existing claims in a /16, for
//!    sticky-ipam and for the reference with as many host-local files.
//! 3. What the ARP probe adds: a takeover ADD (another pod's dead holder)
//!    and a fresh ADD, with the default probe and with it off.
//!
//! Run: `sudo target/release/bench [cycles]` after `cargo build --release`.
//! The bench process itself enters the node netns, so the plugins are
//! exec'd directly (no `ip netns exec` cost in the figures).

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::{reference_plugin, CniCall, Topology};
use sticky_ipam::claim::{Claim, Holder};
use sticky_ipam::store::file::FileStore;
use sticky_ipam::store::{Change, ClaimStore, Plan};

fn exec(plugin: &Path, command: &str, netns: &str, config: &Value) -> Duration {
    // "" node netns: this process already lives in it.
    let reply = CniCall::new(plugin, "", command, config.clone())
        .container("bench")
        .netns(netns)
        .args("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=bench-0;K8S_POD_UID=bench-uid")
        .run();
    assert!(
        reply.success,
        "{} {command} failed: {}",
        plugin.display(),
        reply.stdout
    );
    reply.elapsed
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

type Row = (String, (f64, f64, f64), (f64, f64, f64));

fn print_rows(title: &str, ours: &str, theirs: &str, rows: &[Row]) {
    println!("\n{title}");
    println!("{:<40} {:>24} {:>24} {:>7}", "case", ours, theirs, "ratio");
    for (label, (om, omin, omax), (rm, rmin, rmax)) in rows {
        println!(
            "{label:<40} {:>24} {:>24} {:>6.2}x",
            format!("{om:.2} [{omin:.2}..{omax:.2}]"),
            format!("{rm:.2} [{rmin:.2}..{rmax:.2}]"),
            om / rm
        );
    }
}

/// Interleaved ADD+DEL cycles, alternating who goes first; 5 warm-ups.
fn cycles(
    ours: &Path,
    reference: &Path,
    pod: &str,
    our_conf: &Value,
    ref_conf: &Value,
    n: usize,
) -> [Vec<f64>; 4] {
    let (mut o, mut r, mut oa, mut ra) = (vec![], vec![], vec![], vec![]);
    for i in 0..n + 5 {
        let order: [(&Path, &Value, bool); 2] = if i % 2 == 0 {
            [(ours, our_conf, true), (reference, ref_conf, false)]
        } else {
            [(reference, ref_conf, false), (ours, our_conf, true)]
        };
        for (plugin, conf, is_ours) in order {
            let add = exec(plugin, "ADD", pod, conf);
            let t = add + exec(plugin, "DEL", pod, conf);
            if i >= 5 {
                let (cycle, adds) = if is_ours {
                    (&mut o, &mut oa)
                } else {
                    (&mut r, &mut ra)
                };
                cycle.push(ms(t));
                adds.push(ms(add));
            }
        }
    }
    [o, r, oa, ra]
}

const SCALE_NET: &str = "macnet";

fn scale_ip(i: u32) -> IpAddr {
    // 10.220.0.2 onwards: a /16 that carries no traffic, only allocations.
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 220, 0, 2)) + i))
}

/// `n` claims as sticky-ipam would have written them, loaded in bulk.
fn seed_sticky(dir: &Path, n: u32) {
    let mut store = FileStore::open(dir, SCALE_NET).expect("open store");
    store.set_durable(false);
    let now = sticky_ipam::claim::now_secs();
    let changes = (0..n)
        .map(|i| Change {
            before: None,
            after: Some(Claim {
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
                created: now,
                updated: now,
            }),
        })
        .collect();
    let plan = Plan {
        changes,
        cursors: vec![(0, scale_ip(n - 1))],
    };
    store.commit(&plan).expect("seed claims");
    store.sync().expect("sync");
    assert_eq!(store.list().expect("list").claims.len(), n as usize);
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

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let ours = std::env::current_exe()
        .expect("exe")
        .with_file_name("sticky-macvlan");
    assert!(
        ours.exists(),
        "build the plugin first: cargo build --release -p sticky-macvlan"
    );
    let reference = reference_plugin("macvlan");
    let mut topo = Topology::new(1);
    let pod = topo.add_pod("bench");
    let node =
        File::open(format!("/var/run/netns/{}", topo.node(0).netns)).expect("open node netns");
    // SAFETY: setns on our own single thread with a valid netns fd.
    let rc = unsafe { libc::setns(node.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns into the node netns failed");

    let ref_l3 = configs::macvlan(
        REF_TYPE,
        "1.0.0",
        "uplink0",
        configs::host_local(&topo.file("ref")),
    );
    let sticky_dynamic = configs::sticky("uplink0", &topo.file("sticky-dyn"), json!({}));
    let mut sticky_identity = configs::sticky("uplink0", &topo.file("sticky-id"), json!({}));
    sticky_identity["args"] = json!({"cni": {"identity": "bench-peer"}});
    let cases: [(&str, Value, Value); 4] = [
        (
            "L3 host-local (delegated)",
            configs::macvlan(
                OUR_TYPE,
                "1.0.0",
                "uplink0",
                configs::host_local(&topo.file("our")),
            ),
            ref_l3.clone(),
        ),
        (
            "L3 sticky-ipam, fresh dynamic",
            sticky_dynamic,
            ref_l3.clone(),
        ),
        ("L3 sticky-ipam, sticky re-ADD", sticky_identity, ref_l3),
        (
            "L2 only",
            configs::macvlan(OUR_TYPE, "1.0.0", "uplink0", json!({})),
            configs::macvlan(REF_TYPE, "1.0.0", "uplink0", json!({})),
        ),
    ];
    let mut rows: Vec<Row> = Vec::new();
    for (label, our_conf, ref_conf) in &cases {
        let [o, r, oa, ra] = cycles(&ours, &reference, &pod.path, our_conf, ref_conf, n);
        rows.push((format!("{label}: ADD+DEL"), stats(o), stats(r)));
        rows.push((format!("{label}: ADD"), stats(oa), stats(ra)));
    }
    print_rows(
        &format!("{n} interleaved ADD+DEL cycles each, ms, median [min..max]; the reference is macvlan + host-local (L3) or macvlan (L2)"),
        "sticky-macvlan",
        "reference",
        &rows,
    );

    // Scale: ADD latency against the number of existing claims.
    let scale_runs = (n / 2).max(10);
    let mut scale_rows: Vec<Row> = Vec::new();
    let mut medians = Vec::new();
    for existing in [10u32, 1_000, 60_000] {
        let sticky_dir = topo.file(&format!("scale-sticky-{existing}"));
        let hl_dir = topo.file(&format!("scale-hl-{existing}"));
        let seeding = Instant::now();
        seed_sticky(&sticky_dir, existing);
        seed_host_local(&hl_dir, existing);
        eprintln!("seeded {existing} claims in {:?}", seeding.elapsed());
        let range = json!({"subnet": "10.220.0.0/16", "gateway": "10.220.0.1", "routes": [{"dst": "0.0.0.0/0"}]});
        let mut ours_ipam = range.clone();
        ours_ipam["type"] = json!("sticky-ipam");
        ours_ipam["dataDir"] = json!(sticky_dir);
        let mut ref_ipam = range;
        ref_ipam["type"] = json!("host-local");
        ref_ipam["dataDir"] = json!(hl_dir);
        let mut our_conf = configs::macvlan(OUR_TYPE, "1.0.0", "uplink0", ours_ipam);
        our_conf["name"] = json!(SCALE_NET);
        let mut ref_conf = configs::macvlan(REF_TYPE, "1.0.0", "uplink0", ref_ipam);
        ref_conf["name"] = json!(SCALE_NET);
        let [_, _, oa, ra] = cycles(
            &ours, &reference, &pod.path, &our_conf, &ref_conf, scale_runs,
        );
        let (o, r) = (stats(oa), stats(ra));
        medians.push((existing, o.0, r.0));
        scale_rows.push((format!("ADD with {existing} existing claims"), o, r));
    }
    print_rows(
        &format!("ADD latency in a /16 with existing claims, {scale_runs} interleaved ADDs each, ms, median [min..max]; the reference is macvlan + host-local with as many files"),
        "sticky-macvlan",
        "reference",
        &scale_rows,
    );
    if let (Some(first), Some(last)) = (medians.first(), medians.last()) {
        println!(
            "\nscale: sticky-ipam ADD at {} claims is {:.2}x its ADD at {} claims (target <= 2x); the reference: {:.2}x",
            last.0,
            last.1 / first.1,
            first.0,
            last.2 / first.2
        );
    }

    probe_cost(&mut topo, scale_runs);
}

/// One ADD of identity `id` from a new pod (its own UID), ms.
fn add_as(topo: &mut Topology, conf: &Value, id: &str, tag: &str) -> (f64, String) {
    let pod = topo.add_pod(tag);
    let mut c = conf.clone();
    c["args"] = json!({"cni": {"identity": id}});
    let reply = CniCall::new(&plugin_path(), "", "ADD", c)
        .container(tag)
        .netns(&pod.path)
        .args(&format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={tag};K8S_POD_UID={tag}"
        ))
        .run();
    assert!(reply.success, "ADD {tag} failed: {}", reply.stdout);
    (ms(reply.elapsed), pod.netns)
}

fn plugin_path() -> std::path::PathBuf {
    std::env::current_exe()
        .expect("exe")
        .with_file_name("sticky-macvlan")
}

/// The probe's added latency: takeovers (the old holder's netns is gone,
/// so nobody answers and the probe runs its full course) and fresh
/// allocations, with the default probe and with `probe.count` 0.
fn probe_cost(topo: &mut Topology, n: usize) {
    let mut rows: Vec<Row> = Vec::new();
    let mut seq = 0usize;
    for (label, fresh) in [
        ("takeover ADD (old holder gone)", false),
        ("fresh ADD", true),
    ] {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..n {
            for (probe, out) in [(json!({}), &mut with), (json!({"count": 0}), &mut without)] {
                seq += 1;
                let mut conf =
                    configs::sticky("uplink0", &topo.file(&format!("probe-{seq}")), json!({}));
                conf["probe"] = probe;
                let id = format!("peer-{seq}");
                let (ms, netns) = if fresh {
                    add_as(topo, &conf, &id, &format!("pf{seq}"))
                } else {
                    let (_, old) = add_as(topo, &conf, &id, &format!("po{seq}"));
                    topo.delete_netns(&old);
                    add_as(topo, &conf, &id, &format!("pn{seq}"))
                };
                topo.delete_netns(&netns);
                out.push(ms);
            }
        }
        rows.push((label.to_string(), stats(with), stats(without)));
    }
    print_rows(
        &format!("ARP probe cost, {n} ADDs each, ms, median [min..max]: default probe (3 x 100 ms) against probe.count 0"),
        "default probe",
        "probe off",
        &rows,
    );
    for (label, with, without) in &rows {
        println!("{label}: the probe adds {:.1} ms (target: under 400 ms on a takeover, 0 on a fresh allocation)", with.0 - without.0);
    }
}
