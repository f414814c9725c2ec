//! Section 8: the profile of one ADD in counts machine load cannot
//! change (callgrind instructions, strace system calls).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;
use sticky_e2e::configs::{self, REF_TYPE};
use sticky_e2e::report::Table;
use sticky_e2e::{CniCall, Topology};

use crate::{exec, Suite};

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
