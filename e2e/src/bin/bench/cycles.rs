//! Sections 1 and 2: ADD+DEL cycles against the reference, and the floor
//! the same netlink work has when done by `ip`.

use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::report::{Stats, Table};
use sticky_e2e::{Pod, Topology};

use crate::{exec, interleaved, ms, ratio, Suite};

/// The medians the floor section compares and judges.
pub struct Cycles {
    l3: (Stats, Stats),
    l2: (Stats, Stats),
    /// ADD and DEL alone, L3 then L2, (ours, reference).
    add: [(Stats, Stats); 2],
    del: [(Stats, Stats); 2],
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
