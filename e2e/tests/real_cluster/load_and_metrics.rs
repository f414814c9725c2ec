//! Many pods at once, the comparison runs, and reconcile's metrics.

use super::*;

#[test]
fn two_hundred_deployment_pods_get_distinct_addresses_released_after_delete() {
    let Some(c) =
        cluster("two_hundred_deployment_pods_get_distinct_addresses_released_after_delete")
    else {
        return;
    };
    const PODS: usize = 200;
    let ns = c.namespace("deploy");
    let ns = ns.name.clone();
    let network = "fabric-wide";
    c.apply(&dynamic_deployment(
        &ns,
        network,
        "172.31.64.0/22",
        "172.31.64.1",
        PODS,
    ));
    let t0 = Instant::now();
    let running = c.wait(&format!("{PODS} pods Running"), 10 * MINUTE, || {
        let names: Vec<String> = running_pods(&c, &ns, "app=web")
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        if names.len() >= PODS {
            Ok(names)
        } else {
            Err(format!("{} Running", names.len()))
        }
    });
    let up = t0.elapsed();
    let mut seen: BTreeMap<IpAddr, String> = BTreeMap::new();
    for p in &running {
        let addrs = c.pod_addrs(&ns, p, "net1");
        assert_eq!(addrs.len(), 1, "{p}: one address on net1: {addrs:?}");
        for a in addrs {
            if let Some(other) = seen.insert(a, p.clone()) {
                panic!("duplicate address {a}: {other} and {p}");
            }
        }
    }
    let claims = c.bound_claims(network);
    assert_eq!(claims.len(), PODS, "one Bound IPClaim per pod");
    for k in &claims {
        let pod = seen.get(&k.ip).unwrap_or_else(|| {
            panic!(
                "claim of {} names {}, which has no such address",
                k.ip, k.pod
            )
        });
        assert_eq!(k.pod, format!("{ns}/{pod}"), "claim of {}", k.ip);
    }
    let nodes: BTreeSet<String> = claims.iter().map(|k| k.node.clone()).collect();
    eprintln!(
        "deployment: {PODS} pods Running on {} nodes in {:.1} s, 0 duplicate addresses (pods and IPClaims agree)",
        nodes.len(),
        up.as_secs_f64()
    );
    let t = Instant::now();
    c.kubectl(&["-n", &ns, "delete", "deployment", "web"]);
    c.wait("every claim released after the delete", 5 * MINUTE, || {
        let left = c
            .ipclaims()
            .iter()
            .filter(|k| k["spec"]["network"] == network)
            .count();
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} IPClaims left"))
        }
    });
    eprintln!(
        "deployment: all {PODS} claims released {:.1} s after the delete",
        t.elapsed().as_secs_f64()
    );
}

/// The pod-start comparison of `scripts/bench.sh --cluster` on a small
/// shape, so it cannot rot: every contender's pods start and come back,
/// and ours come back with the addresses they had (Whereabouts' and
/// host-local's are recorded, not asserted).
#[test]
fn pod_start_comparison_runs_and_ours_come_back_on_their_addresses() {
    use sticky_e2e::pod_start::{run, Contender, Shape};
    let Some(c) = cluster("pod_start_comparison_runs_and_ours_come_back_on_their_addresses") else {
        return;
    };
    let rounds = run(
        &c,
        Shape {
            groups: 2,
            replicas: 2,
            rounds: 1,
        },
    );
    assert_eq!(rounds.len(), 3);
    for r in &rounds {
        assert_eq!(r.pods, 4);
        if r.contender == Contender::Ours {
            assert_eq!(r.same_addresses, r.pods, "ours came back elsewhere: {r:?}");
        }
    }
    assert!(
        c.bound_claims("ps-ours").is_empty(),
        "the round left claims behind"
    );
}

/// The Multus overhead figure of `scripts/bench.sh --cluster` (table 11c)
/// on two runs, so it cannot rot: every call succeeds through Multus and
/// directly, and the DELs leave no claim of the network behind.
#[test]
fn multus_overhead_runs_and_its_dels_release_every_claim() {
    let Some(c) = cluster("multus_overhead_runs_and_its_dels_release_every_claim") else {
        return;
    };
    let samples = sticky_e2e::multus_overhead::measure(&c, "node1", 2);
    assert_eq!(samples.len(), 2);
    for s in &samples {
        for ms in [
            s.multus_add,
            s.multus_del,
            s.primary_add,
            s.ours_add,
            s.ours_del,
        ] {
            assert!(ms > 0.0, "a call was not timed: {s:?}");
        }
    }
    // Dynamic claims: a DEL deletes them, through Multus or not.
    let left: Vec<_> = c
        .ipclaims()
        .into_iter()
        .filter(|claim| claim["spec"]["network"] == "mo-ours")
        .collect();
    assert!(left.is_empty(), "the DELs left claims: {left:?}");
}

/// The reconcile Deployment's metrics (deploy/optional/, interval shortened),
/// scraped with curl from its node as Prometheus would: a NAD whose /29
/// hands out 5 addresses, filled by a Deployment from 3 to 6 replicas
/// (the sixth refused: pool exhausted) and back to 1. The figures follow:
/// held, free, the range, and the refusal counted from the plugins' Events.
#[test]
fn reconcile_metrics_follow_the_pods_and_show_a_full_pool() {
    let Some(c) = cluster("reconcile_metrics_follow_the_pods_and_show_a_full_pool") else {
        return;
    };
    let ns = c.namespace("metrics");
    let network = "metrics-net";
    let deployment =
        |replicas| dynamic_deployment(&ns.name, network, "172.31.75.0/29", "172.31.75.1", replicas);
    c.apply(&deployment(3));
    let _reconcile = ReconcileDeployment::every(&c, 3);
    let scrape = || -> Result<BTreeMap<String, f64>, String> {
        let pods = c.json(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=sticky-macvlan-reconcile",
        ]);
        let pod = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| {
                p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
            })
            .ok_or("no running reconcile pod")?;
        let (Some(ip), Some(node)) = (
            pod["status"]["podIP"].as_str(),
            pod["spec"]["nodeName"].as_str(),
        ) else {
            return Err("the reconcile pod has no IP yet".into());
        };
        let out = std::process::Command::new("bash")
            .args([
                "scripts/cluster.sh",
                "exec",
                node,
                "curl",
                "-sS",
                "--max-time",
                "5",
            ])
            .arg(format!("http://{ip}:9402/metrics"))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect())
    };
    let key = |name: &str, extra: &str| format!("{name}{{network=\"{network}\"{extra}}}");
    let held = key("sticky_macvlan_addresses", ",state=\"held\"");
    let free = key("sticky_macvlan_free_addresses", "");
    let range = key("sticky_macvlan_range_addresses", "");
    let refused = key(
        "sticky_macvlan_refusals_total",
        ",reason=\"StickyPoolExhausted\"",
    );
    let until = |what: &str, want: &dyn Fn(&BTreeMap<String, f64>) -> bool| {
        c.wait(what, 3 * MINUTE, || {
            let m = scrape()?;
            if want(&m) {
                Ok(m)
            } else {
                Err(format!(
                    "held {:?}, free {:?}, range {:?}, refused {:?}",
                    m.get(&held),
                    m.get(&free),
                    m.get(&range),
                    m.get(&refused)
                ))
            }
        })
    };
    let m = until("3 of 5 held in the metrics", &|m| {
        m.get(&held) == Some(&3.0) && m.get(&range) == Some(&5.0) && m.get(&free) == Some(&2.0)
    });
    assert!(m
        .get("sticky_macvlan_reconcile_sweeps_total")
        .is_some_and(|n| *n >= 1.0));
    assert!(m.contains_key("sticky_macvlan_reconcile_sweep_duration_seconds"));

    // Six replicas for five addresses: the sixth is refused, and counted.
    c.apply(&deployment(6));
    until("the full pool and its refusal in the metrics", &|m| {
        m.get(&held) == Some(&5.0)
            && m.get(&free) == Some(&0.0)
            && m.get(&refused).is_some_and(|n| *n >= 1.0)
    });
    // Back to one: the DELs free the dynamic claims.
    c.apply(&deployment(1));
    until("one held and four free", &|m| {
        m.get(&held) == Some(&1.0) && m.get(&free) == Some(&4.0)
    });
}
