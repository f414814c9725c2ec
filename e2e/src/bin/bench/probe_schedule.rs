//! Section 9: the probe schedule, chosen from measurement. A LIVE holder
//! (addresses configured on an interface in a holder netns, answered by
//! its kernel) sits behind a lossy, delayed link, and the plugin's own
//! probe (`conflict::probe_all_here`, called from threads in the prober
//! netns) asks for its addresses over and over: how often each candidate
//! schedule hears nothing (a miss: the plugin would bind a live address),
//! and what a probe that hears nothing costs.
//!
//! netem is missing on these machines (`CONFIG_NET_SCH_NETEM` is not set;
//! `tc qdisc add dev X root netem loss 5%` answers `Error: Specified qdisc
//! kind is unknown.`), so `relay::Relay` plays its part: every frame, each
//! way, is dropped with the given probability and delayed by the given
//! one-way delay. Loss is independent per frame, so many holder addresses
//! are probed at once (`LANES` links of `PER_LANE` addresses) to reach
//! the trial counts a 1-in-10,000 bound needs in bounded time.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use sticky_e2e::report::{Report, Stats, Table};
use sticky_e2e::{ip, Topology};
use sticky_macvlan::datapath::arp::ProbeSpec;
use sticky_macvlan::datapath::conflict::{probe_all_here, Until};
use sticky_macvlan::datapath::Mac;

use crate::relay::{Impairment, Relay, RelayStats};
use crate::Options;

/// (count, interval ms): RFC 5227's PROBE_NUM with our old 100 ms, and
/// schedules whose full silent probe fits in 150 ms: fewer probes spaced
/// wider, or more probes closer (a lost round costs a probe; an RTT longer
/// than the spacing costs the last probes' answers).
pub const CANDIDATES: [(u32, u64); 7] = [
    (3, 100),
    (3, 50),
    (4, 30),
    (5, 25),
    (6, 20),
    (7, 20),
    (6, 25),
];
const LOSSES: [f64; 4] = [0.0, 0.01, 0.05, 0.20];
const DELAYS_MS: [u64; 3] = [0, 2, 20];
/// Links between the prober and the holder, each with its own relay pair.
const LANES: usize = 24;
/// Holder addresses probed at once on one link (one socket each).
const PER_LANE: usize = 16;
/// The loss at which the goal is judged (a miss rate below 1 in 10,000).
const GOAL_LOSS: f64 = 0.05;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4 (ARP probe)",
            Family::V6 => "IPv6 (DAD)",
        }
    }
}

struct Lane {
    ifindex: u32,
    mac: Mac,
    /// Two address sets per family, used in alternate batches, so a reply
    /// still in flight from one batch can never count for the next.
    v4: [Vec<IpAddr>; 2],
    v6: [Vec<IpAddr>; 2],
    silent: [IpAddr; 2],
}

impl Lane {
    fn addresses(&self, family: Family, set: usize) -> &[IpAddr] {
        match family {
            Family::V4 => &self.v4[set],
            Family::V6 => &self.v6[set],
        }
    }
}

fn v4(lane: usize, host: usize) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(10, 219, lane as u8, host as u8))
}

fn v6(lane: usize, host: usize) -> IpAddr {
    IpAddr::V6(std::net::Ipv6Addr::new(
        0xfd00,
        0x219,
        0,
        0,
        0,
        0,
        lane as u16,
        host as u16,
    ))
}

/// The prober, relay and holder netns, wired lane by lane:
/// prober `prN` = relay `raN` ~relay~ `rbN` = holder `hdN`.
struct Bed {
    prober: String,
    relay: String,
    pairs: Vec<(String, String)>,
    lanes: Vec<Lane>,
}

fn batch(topo: &Topology, netns: &str, name: &str, lines: &[String]) {
    let file = topo.file(name);
    if let Err(e) = std::fs::write(&file, lines.join("\n") + "\n") {
        panic!("cannot write {}: {e}", file.display());
    }
    ip(&["-n", netns, "-batch", &file.display().to_string()]);
}

fn sysctls(netns: &str, settings: &[&str]) {
    let mut args = vec!["netns", "exec", netns, "sysctl", "-qw"];
    args.extend_from_slice(settings);
    ip(&args);
}

fn build(topo: &mut Topology) -> Bed {
    let prober = topo.add_pod("sched-prober").netns;
    let relay = topo.add_pod("sched-relay").netns;
    let holder = topo.add_pod("sched-holder").netns;
    // The relay netns only moves frames: no IPv6 of its own to add noise.
    sysctls(
        &relay,
        &[
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ],
    );
    let mut links = Vec::new();
    let mut addrs = Vec::new();
    let mut pairs = Vec::new();
    for i in 0..LANES {
        links.push(format!(
            "link add ra{i} type veth peer name pr{i} netns {prober}"
        ));
        links.push(format!(
            "link add rb{i} type veth peer name hd{i} netns {holder}"
        ));
        links.push(format!("link set ra{i} promisc on up"));
        links.push(format!("link set rb{i} promisc on up"));
        pairs.push((format!("ra{i}"), format!("rb{i}")));
        addrs.push(format!("link set hd{i} up"));
        for set in 0..2 {
            for j in 0..PER_LANE {
                let host = 10 + set * 100 + j;
                addrs.push(format!("addr add {}/32 dev hd{i}", v4(i, host)));
                addrs.push(format!("addr add {}/64 dev hd{i} nodad", v6(i, host)));
            }
        }
    }
    batch(topo, &relay, "sched-links.batch", &links);
    batch(topo, &holder, "sched-holder.batch", &addrs);
    let up: Vec<String> = (0..LANES).map(|i| format!("link set pr{i} up")).collect();
    batch(topo, &prober, "sched-prober.batch", &up);
    let out = ip(&["-n", &prober, "-j", "link", "show"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let lanes = (0..LANES)
        .map(|i| {
            let link = shown
                .as_array()
                .and_then(|l| l.iter().find(|l| l["ifname"] == format!("pr{i}")))
                .unwrap_or_else(|| panic!("pr{i} is missing in {prober}"));
            let mac = sticky_macvlan::datapath::parse_mac(link["address"].as_str().unwrap_or(""))
                .unwrap_or_else(|e| panic!("pr{i}'s MAC: {e}"));
            let set = |f: fn(usize, usize) -> IpAddr, s: usize| {
                (0..PER_LANE).map(|j| f(i, 10 + s * 100 + j)).collect()
            };
            Lane {
                ifindex: link["ifindex"].as_u64().unwrap_or(0) as u32,
                mac,
                v4: [set(v4, 0), set(v4, 1)],
                v6: [set(v6, 0), set(v6, 1)],
                silent: [v4(i, 250), v6(i, 250)],
            }
        })
        .collect();
    Bed {
        prober,
        relay,
        pairs,
        lanes,
    }
}

/// The upper end of a 95 % interval for a miss rate of `misses` in
/// `trials`: the rule of three when nothing was missed, Wilson's score
/// bound otherwise.
pub fn upper_95(misses: u64, trials: u64) -> f64 {
    if trials == 0 {
        return 1.0;
    }
    let n = trials as f64;
    if misses == 0 {
        return (3.0 / n).min(1.0);
    }
    let (p, z) = (misses as f64 / n, 1.96f64);
    let centre = p + z * z / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    ((centre + spread) / (1.0 + z * z / n)).min(1.0)
}

/// Probes whose answer can arrive before the schedule ends, with
/// `one_way` delay each way: probe k (sent at k intervals) is answered
/// two delays later, and listening stops at `count` intervals.
pub fn probes_that_count(spec: ProbeSpec, one_way: Duration) -> u32 {
    (0..spec.count)
        .filter(|k| spec.interval * *k + one_way * 2 < spec.interval * spec.count)
        .count() as u32
}

/// The miss rate the loss implies when the relay drops frames both ways:
/// a round is lost when its probe or its answer is (1 - (1 - p)^2), and a
/// miss needs every round that counts lost.
pub fn model_miss(spec: ProbeSpec, loss: f64, one_way: Duration) -> f64 {
    let round = 1.0 - (1.0 - loss) * (1.0 - loss);
    round.powi(probes_that_count(spec, one_way) as i32)
}

/// (trials, misses) of `spec` for `family` over up to `batches` batches
/// of every lane at once, stopping early at `budget`.
fn trials(
    bed: &Bed,
    family: Family,
    spec: ProbeSpec,
    batches: usize,
    one_way: Duration,
    budget: Duration,
) -> (u64, u64) {
    let (mut n, mut missed) = (0u64, 0u64);
    let start = Instant::now();
    // Late answers of a batch arrive within two delays of its end.
    let gap = one_way * 2 + Duration::from_millis(5);
    for b in 0..batches {
        if start.elapsed() > budget {
            break;
        }
        let heard: Vec<Vec<Option<Mac>>> = std::thread::scope(|s| {
            let runs: Vec<_> = bed
                .lanes
                .iter()
                .map(|lane| {
                    s.spawn(move || {
                        let ips = lane.addresses(family, b % 2);
                        probe_all_here(lane.ifindex, lane.mac, ips, spec, Until::EveryAddress)
                            .unwrap_or_else(|e| panic!("probe on lane {}: {e}", lane.ifindex))
                    })
                })
                .collect();
            runs.into_iter()
                .map(|r| r.join().unwrap_or_else(|_| panic!("a prober panicked")))
                .collect()
        });
        for lane in heard {
            n += lane.len() as u64;
            missed += lane.iter().filter(|h| h.is_none()).count() as u64;
        }
        std::thread::sleep(gap);
    }
    (n, missed)
}

/// What a probe that hears nothing costs, as the plugin runs it (first
/// conflict wins), ms: the v4 address alone, the v6 one alone, both.
fn silent_cost(bed: &Bed, spec: ProbeSpec, runs: usize) -> [Stats; 3] {
    let lane = &bed.lanes[0];
    let sets: [Vec<IpAddr>; 3] = [
        vec![lane.silent[0]],
        vec![lane.silent[1]],
        lane.silent.to_vec(),
    ];
    sets.map(|ips| {
        let samples: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                let heard =
                    probe_all_here(lane.ifindex, lane.mac, &ips, spec, Until::FirstConflict)
                        .unwrap_or_else(|e| panic!("silent probe: {e}"));
                assert!(heard.iter().all(Option::is_none), "nobody holds {ips:?}");
                crate::ms(t.elapsed())
            })
            .collect();
        Stats::of(&samples)
    })
}

fn spec_of((count, ms): (u32, u64)) -> ProbeSpec {
    ProbeSpec {
        count,
        interval: Duration::from_millis(ms),
    }
}

fn label(spec: ProbeSpec) -> String {
    format!("{} x {} ms", spec.count, spec.interval.as_millis())
}

fn rate(misses: u64, trials: u64) -> String {
    format!("{misses}/{trials}")
}

/// (family, candidate, delay, loss) -> (trials, misses)
type Counts = Vec<(usize, usize, usize, usize, u64, u64)>;

pub fn probe_schedule(opts: &Options, topo: &mut Topology, report: &mut Report) {
    let bed = build(topo);
    // Trials at the goal's loss: 0 misses in this many bounds the miss
    // rate at 3/n; elsewhere fewer do to show the trend.
    let (goal_batches, other_batches, cost_runs) =
        if opts.quick { (8, 2, 2) } else { (110, 14, 7) };
    let budget = Duration::from_secs(if opts.quick { 10 } else { 60 });
    let prober = bed.prober.clone();
    let (counts, costs, relayed) = std::thread::scope(|s| {
        s.spawn(|| {
            // Every prober thread is spawned from here, so all of them
            // start in the prober netns.
            sticky_e2e::enter_netns(&prober);
            let mut counts: Counts = Vec::new();
            let mut relayed = RelayStats::default();
            let clean = Impairment {
                loss: 0.0,
                delay: Duration::ZERO,
            };
            let relay = Relay::start(&bed.relay, &bed.pairs, clean, 1, budget * 4);
            let costs: Vec<[Stats; 3]> = CANDIDATES
                .iter()
                .map(|c| silent_cost(&bed, spec_of(*c), cost_runs))
                .collect();
            let r = relay.stop();
            relayed.socket_drops += r.socket_drops;
            for (d, delay_ms) in DELAYS_MS.iter().enumerate() {
                for (l, loss) in LOSSES.iter().enumerate() {
                    let delay = Duration::from_millis(*delay_ms);
                    let link = Impairment { loss: *loss, delay };
                    let seed = 0x5eed + (d * 10 + l) as u64;
                    let relay = Relay::start(&bed.relay, &bed.pairs, link, seed, budget * 30);
                    let batches = if *loss == GOAL_LOSS {
                        goal_batches
                    } else {
                        other_batches
                    };
                    for (c, cand) in CANDIDATES.iter().enumerate() {
                        for (f, family) in [Family::V4, Family::V6].iter().enumerate() {
                            let (n, m) = trials(&bed, *family, spec_of(*cand), batches, delay, budget);
                            counts.push((f, c, d, l, n, m));
                        }
                    }
                    let r = relay.stop();
                    println!(
                        "probe schedule: {delay_ms} ms, {:.0} % loss: relay forwarded {}, dropped {} by choice, {} in its sockets",
                        loss * 100.0,
                        r.forwarded,
                        r.dropped,
                        r.socket_drops
                    );
                    relayed.forwarded += r.forwarded;
                    relayed.dropped += r.dropped;
                    relayed.socket_drops += r.socket_drops;
                }
            }
            (counts, costs, relayed)
        })
        .join()
        .unwrap_or_else(|_| panic!("the probe-schedule measurement panicked"))
    });
    tables(report, &counts, &costs, relayed);
}

fn find(counts: &Counts, f: usize, c: usize, d: usize, l: usize) -> (u64, u64) {
    counts
        .iter()
        .find(|r| (r.0, r.1, r.2, r.3) == (f, c, d, l))
        .map(|r| (r.4, r.5))
        .unwrap_or((0, 0))
}

fn tables(report: &mut Report, counts: &Counts, costs: &[[Stats; 3]], relayed: RelayStats) {
    let goal = LOSSES.iter().position(|l| *l == GOAL_LOSS).unwrap_or(2);
    for (f, family) in [Family::V4, Family::V6].iter().enumerate() {
        let mut t = Table::new(
            if f == 0 { "probe-schedule-v4" } else { "probe-schedule-v6" },
            format!(
                "9{}. A live holder missed, {}: misses/trials by one-way delay and loss (each way, independently per frame), with the 95 % upper bound and the model at {:.0} % loss",
                if f == 0 { "a" } else { "b" },
                family.label(),
                GOAL_LOSS * 100.0
            ),
            &["schedule", "delay", "0 %", "1 %", "5 %", "20 %", "5 %: upper 95 %", "5 %: model, both ways"],
        );
        for (c, cand) in CANDIDATES.iter().enumerate() {
            let spec = spec_of(*cand);
            for (d, delay_ms) in DELAYS_MS.iter().enumerate() {
                let cells: Vec<(u64, u64)> = (0..LOSSES.len())
                    .map(|l| find(counts, f, c, d, l))
                    .collect();
                let (n, m) = cells[goal];
                let model = model_miss(spec, GOAL_LOSS, Duration::from_millis(*delay_ms));
                let mut row = vec![label(spec), format!("{delay_ms} ms")];
                row.extend(cells.iter().map(|(n, m)| rate(*m, *n)));
                row.push(format!("{:.1e}", upper_95(m, n)));
                row.push(format!("{model:.1e}"));
                t.row(
                    row,
                    json!({"family": family.label(), "count": spec.count, "interval_ms": spec.interval.as_millis() as u64,
                        "delay_ms": delay_ms, "losses": LOSSES, "trials_misses": cells, "upper_95_at_goal": upper_95(m, n), "model_at_goal": model}),
                );
            }
        }
        report.add(t);
    }
    let mut t = Table::new(
        "probe-schedule-cost",
        "9c. What a probe that hears nothing costs (the plugin's code, first conflict wins), ms, and the 5 % model: a loss on both directions loses a round with 1 - (1 - p)^2 (9.75 %), not p",
        &["schedule", "v4 alone", "v6 alone", "v4 + v6 at once", "probes that count at 20 ms", "model 5 %, both ways, <= 2 ms", "model 5 %, one way only"],
    );
    for (c, cand) in CANDIDATES.iter().enumerate() {
        let spec = spec_of(*cand);
        let [a, b, both] = costs[c];
        let one_way_only = GOAL_LOSS.powi(spec.count as i32);
        t.row(
            vec![
                label(spec),
                a.cell(),
                b.cell(),
                both.cell(),
                format!("{} of {}", probes_that_count(spec, Duration::from_millis(20)), spec.count),
                format!("{:.1e}", model_miss(spec, GOAL_LOSS, Duration::from_millis(2))),
                format!("{one_way_only:.1e}"),
            ],
            json!({"count": spec.count, "interval_ms": spec.interval.as_millis() as u64, "v4": a.json(), "v6": b.json(), "both": both.json()}),
        );
    }
    report.add(t);
    verdicts(report, counts, costs, goal);
    report.notes.push(format!(
        "Section 9's relay (netem is missing on these machines: `Error: Specified qdisc kind is unknown.`) forwarded {} frames and dropped {} by choice; its own sockets dropped {} (loss nobody chose).",
        relayed.forwarded, relayed.dropped, relayed.socket_drops
    ));
}

/// The default's goals: a silent probe of both families <= 150 ms, and
/// at 5 % loss a miss rate below 1 in 10,000 (95 % upper bound) for each
/// family at LAN delays (0 and 2 ms).
fn verdicts(report: &mut Report, counts: &Counts, costs: &[[Stats; 3]], goal: usize) {
    let default = ProbeSpec::default();
    let Some(c) = CANDIDATES.iter().position(|c| spec_of(*c) == default) else {
        report.verdict(
            "default probe schedule measured",
            label(default),
            false,
            "the default is not among the candidates",
        );
        return;
    };
    let both = costs[c][2];
    report.verdict(
        &format!(
            "default probe ({}): a silent dual-stack probe <= 150 ms",
            label(default)
        ),
        format!("{:.1} ms", both.median),
        both.median <= 150.0,
        "the schedule's length plus the sockets' set-up",
    );
    let worst = (0..2)
        .flat_map(|f| (0..2).map(move |d| (f, d)))
        .map(|(f, d)| find(counts, f, c, d, goal))
        .map(|(n, m)| (upper_95(m, n), m, n))
        .fold((0.0, 0, 0), |a, b| if b.0 > a.0 { b } else { a });
    report.verdict(
        &format!(
            "default probe ({}): misses a live holder < 1 in 10,000 at 5 % loss, 0-2 ms",
            label(default)
        ),
        format!("{}/{} misses, upper 95 % {:.1e}", worst.1, worst.2, worst.0),
        worst.0 < 1e-4,
        "too few trials to bound it, or too few probes for the loss",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_models() {
        assert!((upper_95(0, 30_000) - 1e-4).abs() < 1e-9);
        assert!(upper_95(27, 30_000) > 27.0 / 30_000.0);
        assert_eq!(upper_95(0, 0), 1.0);
        let s = |count, ms| ProbeSpec {
            count,
            interval: Duration::from_millis(ms),
        };
        assert_eq!(probes_that_count(s(3, 100), Duration::from_millis(20)), 3);
        assert_eq!(probes_that_count(s(6, 20), Duration::from_millis(20)), 4);
        assert_eq!(probes_that_count(s(5, 25), Duration::ZERO), 5);
        let m = model_miss(s(3, 100), 0.05, Duration::ZERO);
        assert!((m - 0.0975f64.powi(3)).abs() < 1e-12);
    }
}
