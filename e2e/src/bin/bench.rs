//! ADD+DEL cycle benchmark: ours vs the reference macvlan, both with
//! host-local, on the e2e topology, interleaved, printed as a table.
//! Run: `sudo target/release/bench [cycles]` after `cargo build --release`.
//! The bench process itself enters the node netns, so the plugins are
//! exec'd directly (no `ip netns exec` cost in the figures).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::Duration;

use serde_json::Value;
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::{reference_plugin, CniCall, Topology};

fn exec(plugin: &std::path::Path, command: &str, netns: &str, config: &Value) -> Duration {
    // "" node netns: this process already lives in it.
    let reply = CniCall::new(plugin, "", command, config.clone())
        .container("bench")
        .netns(netns)
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

fn main() {
    let cycles: usize = std::env::args()
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

    let mut rows = Vec::new();
    for (label, ipam) in [("L3 host-local", true), ("L2 only", false)] {
        let ipam_conf = |tag: &str| {
            if ipam {
                configs::host_local(&topo.file(tag))
            } else {
                serde_json::json!({})
            }
        };
        let our_conf = configs::macvlan(OUR_TYPE, "1.0.0", "uplink0", ipam_conf("our"));
        let ref_conf = configs::macvlan(REF_TYPE, "1.0.0", "uplink0", ipam_conf("ref"));
        let (mut o, mut r) = (Vec::new(), Vec::new());
        let (mut oa, mut ra) = (Vec::new(), Vec::new());
        for i in 0..cycles + 5 {
            // Interleaved, alternating who goes first; 5 warm-up rounds.
            let order: [(&std::path::Path, &Value, bool); 2] = if i % 2 == 0 {
                [(&ours, &our_conf, true), (&reference, &ref_conf, false)]
            } else {
                [(&reference, &ref_conf, false), (&ours, &our_conf, true)]
            };
            for (plugin, conf, is_ours) in order {
                let add = exec(plugin, "ADD", &pod.path, conf);
                let t = add + exec(plugin, "DEL", &pod.path, conf);
                if i >= 5 {
                    let (cycle, adds) = if is_ours {
                        (&mut o, &mut oa)
                    } else {
                        (&mut r, &mut ra)
                    };
                    cycle.push(t.as_secs_f64() * 1e3);
                    adds.push(add.as_secs_f64() * 1e3);
                }
            }
        }
        rows.push((format!("{label} ADD+DEL"), stats(o), stats(r)));
        rows.push((format!("{label} ADD"), stats(oa), stats(ra)));
    }
    println!("{cycles} interleaved ADD+DEL cycles each, ms (median [min..max])");
    println!(
        "{:<16} {:>26} {:>26} {:>8}",
        "case", "sticky-macvlan", "reference macvlan", "ratio"
    );
    for (label, (om, omin, omax), (rm, rmin, rmax)) in rows {
        println!(
            "{label:<22} {:>26} {:>26} {:>7.2}x",
            format!("{om:.2} [{omin:.2}..{omax:.2}]"),
            format!("{rm:.2} [{rmin:.2}..{rmax:.2}]"),
            om / rm
        );
    }
}
