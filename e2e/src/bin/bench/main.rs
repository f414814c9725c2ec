//! The benchmark suite: one command, every figure next to its anchor in the
//! same run, interleaved, as median [min..max] over repeated runs.
//!
//! 1. ADD+DEL cycles against the reference macvlan (+ host-local), L3 and L2.
//! 2. The pod-attach floor: the same netlink work done by `ip` commands.
//! 3. 100 pods attached in parallel on one node: file store, kubernetes
//!    store and the reference.
//! 4. API requests per ADD by path, and 1,000 pods churned over three nodes.
//! 5. ADD latency with 10 to 60,000 existing claims: file store, kubernetes
//!    store (stand-in API server) and the reference with as many files.
//! 6. Peak memory (ru_maxrss) of every plugin process the suite ran.
//! 7. What the wire check (ARP probe, IPv6 DAD) adds, and how fast a live holder refuses.
//! 8. The profile of one ADD in counts the machine's load cannot change:
//!    callgrind instructions and strace system calls, ours and the
//!    reference's.
//! 9. The probe schedule from measurement: how often each candidate misses
//!    a live holder behind a lossy, delayed link (a userspace relay: these
//!    kernels have no netem), and what a silent probe costs. Alone:
//!    `bench --only probe-schedule` (into `--out`; a full run puts it in
//!    BENCHMARKS.md).
//! 10. Many simulated nodes (50 and 200) against one real kube-apiserver:
//!     an ADD storm and churn, ours and Whereabouts v0.9.2's side by side.
//!
//! Output: tables on stdout, `results.json` and SVG plots in `--out`, and
//! (full runs) `BENCHMARKS.md`. Times are measured, never asserted.
//!
//! Run: `sudo scripts/bench.sh` (builds the release binaries first), or
//! `sudo target/release/bench [--quick] [--runs N] [--out DIR] [--markdown FILE]
//! [--only SECTION,...]`: `--only` runs the named sections (`SECTIONS`) into
//! `--out` and leaves BENCHMARKS.md as it is.
//! The bench process enters node 1's netns, so plugins there are exec'd
//! directly, with no `ip netns exec` in the figures.

mod api;
mod cycles;
mod fleet;
mod many;
mod node;
mod probe_schedule;
mod profile;
mod relay;
mod scale;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use sticky_e2e::report::Report;
use sticky_e2e::{reference_plugin, CniCall, CniReply, Topology};

/// Unrecorded rounds before every interleaved series.
pub const WARM_UP: usize = 3;

pub struct Options {
    pub quick: bool,
    pub runs: usize,
    pub churn_pods: usize,
    pub parallel_pods: usize,
    pub parallel_rounds: usize,
    pub scale: Vec<u32>,
    /// Section 9's node counts.
    pub many: Vec<usize>,
    pub out: PathBuf,
    pub markdown: Option<PathBuf>,
    /// `--only a,b`: just these sections (names in `SECTIONS`), into
    /// `out` alone: a partial run never rewrites BENCHMARKS.md.
    pub only: Option<Vec<String>>,
}

/// The sections in the order a full run takes them.
pub const SECTIONS: &[&str] = &[
    "cycles",
    "parallel",
    "requests",
    "churn",
    "scale",
    "many",
    "memory",
    "probe",
    "profile",
    "probe-schedule",
];

impl Options {
    fn parse() -> Options {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = args.iter().any(|a| a == "--quick");
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        if let Some(bad) = args.iter().find(|a| {
            a.starts_with("--")
                && !["--quick", "--runs", "--out", "--markdown", "--only"].contains(&a.as_str())
        }) {
            eprintln!("bench: unknown option {bad}; usage: bench [--quick] [--runs N] [--out DIR] [--markdown FILE] [--only SECTION,...]");
            std::process::exit(2);
        }
        let only: Option<Vec<String>> =
            value("--only").map(|v| v.split(',').map(str::to_string).collect());
        if let Some(bad) = only
            .iter()
            .flatten()
            .find(|s| !SECTIONS.contains(&s.as_str()))
        {
            eprintln!(
                "bench: no section {bad:?}; the sections are {}",
                SECTIONS.join(", ")
            );
            std::process::exit(2);
        }
        let runs = value("--runs")
            .and_then(|v| v.parse().ok())
            .unwrap_or(if quick { 5 } else { 30 });
        Options {
            quick,
            runs,
            churn_pods: if quick { 60 } else { 1000 },
            parallel_pods: if quick { 20 } else { 100 },
            parallel_rounds: if quick { 1 } else { 5 },
            scale: if quick {
                vec![10, 1_000]
            } else {
                vec![10, 1_000, 10_000, 60_000]
            },
            many: if quick { vec![5, 20] } else { vec![50, 200] },
            out: value("--out").map(PathBuf::from).unwrap_or_else(|| {
                PathBuf::from(if quick {
                    "target/bench-quick"
                } else {
                    "docs/bench"
                })
            }),
            markdown: value("--markdown")
                .map(PathBuf::from)
                .or_else(|| (!quick && only.is_none()).then(|| PathBuf::from("BENCHMARKS.md"))),
            only,
        }
    }
}

/// A path whose peak memory section 6 measures: a config of ours and,
/// where there is one, the reference's for the same work.
pub struct MemoryProbe {
    pub label: String,
    pub pod: String,
    pub ours: Value,
    pub reference: Option<Value>,
}

/// What every section shares: the binaries, the options, the report and
/// the paths to weigh.
pub struct Suite {
    pub ours: PathBuf,
    pub reference: PathBuf,
    pub opts: Options,
    pub report: Report,
    pub memory: Vec<MemoryProbe>,
}

impl Suite {
    pub fn weigh(&mut self, label: &str, pod: &str, ours: &Value, reference: Option<&Value>) {
        self.memory.push(MemoryProbe {
            label: label.to_string(),
            pod: pod.to_string(),
            ours: ours.clone(),
            reference: reference.cloned(),
        });
    }
}

/// A ratio as the tables print it.
pub fn ratio(ours: &sticky_e2e::report::Stats, theirs: &sticky_e2e::report::Stats) -> String {
    format!("{:.2}x", ours.median / theirs.median)
}

/// One plugin call from the bench process's own netns (node 1); panics on
/// failure, since a failed call would make every figure meaningless.
pub fn exec(
    plugin: &Path,
    command: &str,
    netns: &str,
    config: &Value,
    cid: &str,
    pod: &str,
) -> CniReply {
    let reply = CniCall::new(plugin, "", command, config.clone())
        .container(cid)
        .netns(netns)
        .args(&pod_args(pod))
        .run();
    assert!(
        reply.success,
        "{} {command} {cid} failed: {}{}",
        plugin.display(),
        reply.stdout,
        reply.stderr
    );
    reply
}

pub fn pod_args(pod: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={pod};K8S_POD_UID={pod}-uid")
}

pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `runs` recorded rounds (after `WARM_UP`) of every contender's `step`,
/// rotating who goes first, so drift and warm caches fall on all alike.
pub fn interleaved<T>(
    contenders: usize,
    runs: usize,
    mut step: impl FnMut(usize) -> T,
) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = (0..contenders).map(|_| Vec::new()).collect();
    for round in 0..runs + WARM_UP {
        for k in 0..contenders {
            let c = (round + k) % contenders;
            let v = step(c);
            if round >= WARM_UP {
                out[c].push(v);
            }
        }
    }
    out
}

fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

fn machine(topo: &Topology) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .next()
        .unwrap_or("")
        .replace("MemTotal:", "")
        .trim()
        .to_string();
    let data = topo.file("probe-fs");
    let fs = first_line(
        "stat",
        &[
            "-f",
            "-c",
            "%T",
            &data
                .parent()
                .unwrap_or(Path::new("/"))
                .display()
                .to_string(),
        ],
    );
    json!({
        "date": first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        "kernel": first_line("uname", &["-r"]),
        "cpu": format!("{cpu} x {}", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
        "memory": mem,
        "state files on": fs,
        "reference plugins": first_line("dpkg-query", &["-W", "-f", "containernetworking-plugins ${Version}", "containernetworking-plugins"]),
        "sticky-macvlan": format!("{} (release build)", env!("CARGO_PKG_VERSION")),
    })
}

/// `--only probe-schedule`: section 9 alone, on its own topology (it needs
/// no API server), into the out dir's `probe-schedule.md` and JSON; the
/// figures of record are a full run's, in BENCHMARKS.md section 9.
fn run_probe_schedule_alone(opts: &Options) {
    if let Err(e) = std::fs::create_dir_all(&opts.out) {
        panic!("cannot create {}: {e}", opts.out.display());
    }
    let mut topo = Topology::new(0);
    let machine = machine(&topo);
    let mut report = Report::default();
    probe_schedule::probe_schedule(opts, &mut topo, &mut report);
    let command = "sudo target/release/bench --only probe-schedule";
    let results = report.json(&machine, command);
    report.write(
        &opts.out,
        "probe-schedule.json",
        &serde_json::to_string_pretty(&results).unwrap_or_default(),
    );
    let md = section_markdown(&report.markdown(&machine, command, "."));
    report.write(&opts.out, "probe-schedule.md", &md);
}

/// The suite's markdown, headed for section 9 alone: its anchor is the
/// old schedule in the same run, not the reference plugins.
fn section_markdown(suite_md: &str) -> String {
    let intro_end = suite_md.find("## How to reproduce").unwrap_or(0);
    format!(
        "# The probe schedule, measured (BENCHMARKS.md section 9)\n\n\
         Generated by `bench --only probe-schedule`; do not edit by hand. Every\n\
         candidate is measured in the same run as the old default (3 x 100 ms),\n\
         interleaved under one relay setting at a time. netem is missing on these\n\
         machines (`Error: Specified qdisc kind is unknown.`): a userspace relay\n\
         drops and delays every frame, each way. Times are wall-clock\n\
         milliseconds, `median [min..max]`.\n\n{}",
        suite_md[intro_end..].replace("docs/bench/results.json", "probe-schedule.json")
    )
}

fn main() {
    let opts = Options::parse();
    sticky_e2e::require_root();
    // Release builds abort on panic, so no Drop cleans up: the hook does.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        sticky_e2e::remove_run(std::process::id());
    }));
    if opts.only.as_deref() == Some(&["probe-schedule".to_string()][..]) {
        run_probe_schedule_alone(&opts);
        return;
    }
    // Both panic with how to build them when missing.
    let ours = sticky_e2e::our_plugin();
    sticky_e2e::kube_api::standin_binary();
    let mut suite = Suite {
        ours,
        reference: reference_plugin("macvlan"),
        opts,
        report: Report::default(),
        memory: Vec::new(),
    };
    if let Err(e) = std::fs::create_dir_all(&suite.opts.out) {
        panic!("cannot create {}: {e}", suite.opts.out.display());
    }
    // The real kube-apiserver for every kubernetes-store figure; the
    // stand-in only where its injected 409s are the point (table 4b).
    let mut topo = Topology::new(3);
    let api = topo.start_api();
    for i in 1..=3 {
        api.add_node(&format!("node{i}"));
    }
    let machine = machine(&topo);
    sticky_e2e::enter_netns(&topo.node(0).netns);

    suite.report.notes.extend(
        [
            "What profiling the ADD path (callgrind, strace; section 8) removed: two of the six fsyncs of a fresh allocation (holder index entries: only a power loss can lose one, and every holder it could name is then from an earlier boot, dead to liveness); polling a contended store lock with sleeps (now a blocking flock, so parallel ADDs are woken in turn); and, on the kubernetes store, loading every claim of the network after a lost create race (now a paged listing of the taken addresses).",
            "The fsyncs kept, because crash safety needs them: the identity's index entry and its directory, then the claim and its directory, before ADD answers; a sticky re-ADD needs only the last two. Releases and cursors are never fsynced.",
            "Left as they are: one netlink socket per netns, each opened once; one helper thread (the pod-netns worker); the config read once from stdin; the file store reads only the identity's index, the next-fit candidates and the cursor. 39% of an ADD's 1.08 M user-space instructions are the dynamic loader's relocations; static non-PIE linking would remove them (about 0.1 ms) but static glibc cannot load NSS, which the kube client's name resolution needs.",
            "Pod start at cluster level (ours, Whereabouts and host-local on the local cluster, the way Spiderpool publishes it) is measured by `sudo scripts/bench.sh --cluster` into [docs/bench/pod-start.md](docs/bench/pod-start.md).",
            "Medians move between full runs on a shared 2-core VM (a ratio such as the host-local-delegated ADD ranged 0.65x to 1.15x over four runs); within a run, interleaving makes each ratio fair. Read ratios, not absolutes.",
        ]
        .map(String::from),
    );
    let only = suite.opts.only.clone();
    let runs = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|s| s == name));
    if runs("cycles") {
        let cycles = cycles::add_del_cycles(&mut suite, &mut topo);
        cycles::floor(&mut suite, &mut topo, &cycles);
    }
    if runs("parallel") {
        node::parallel(&mut suite, &mut topo, &api);
    }
    if runs("requests") {
        api::requests(&mut suite, &mut topo, &api);
    }
    if runs("churn") {
        let mut standin_topo = Topology::new(3);
        let standin = standin_topo.start_standin();
        for i in 1..=3 {
            standin.add_node(&format!("node{i}"));
        }
        api::churn_section(&mut suite, &mut standin_topo, &standin);
    }
    if runs("scale") {
        scale::scale(&mut suite, &mut topo, &api);
    }
    if runs("many") {
        // Each storm on an API server of its own (the shared one may hold
        // section 5's 60,000 claims).
        many::many(&mut suite);
    }
    if runs("memory") {
        node::memory(&mut suite, &topo);
    }
    if runs("probe") {
        node::probe_cost(&mut suite, &mut topo);
    }
    if runs("profile") {
        profile::profile(&mut suite, &mut topo);
    }
    if runs("probe-schedule") {
        probe_schedule::probe_schedule(&suite.opts, &mut topo, &mut suite.report);
    }

    let command = "sudo scripts/bench.sh";
    let results = suite.report.json(&machine, command);
    suite.report.write(
        &suite.opts.out,
        "results.json",
        &serde_json::to_string_pretty(&results).unwrap_or_default(),
    );
    println!(
        "\nwrote {}/results.json and the plots",
        suite.opts.out.display()
    );
    if let Some(md) = &suite.opts.markdown {
        let plot_dir = suite.opts.out.display().to_string();
        let mut text = suite.report.markdown(&machine, command, &plot_dir);
        // The cluster sections are bench-cluster's: kept as they were.
        let before = std::fs::read_to_string(md).unwrap_or_default();
        if let Some(region) = sticky_e2e::report::cluster_region(&before) {
            text = sticky_e2e::report::splice_cluster_region(&text, region);
        }
        if let Err(e) = std::fs::write(md, text) {
            panic!("cannot write {}: {e}", md.display());
        }
        println!("wrote {}", md.display());
    }
}
