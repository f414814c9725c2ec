//! The API server and the network to it failing under ADDs: down,
//! restarted, without etcd, behind a lossy proxy; DELs that never arrive.

use super::*;

#[test]
fn dels_that_never_arrive_are_swept_by_the_reconcile_deployment() {
    let Some(c) = cluster("dels_that_never_arrive_are_swept_by_the_reconcile_deployment") else {
        return;
    };
    let ns = c.namespace("lostdel");
    let ns = ns.name.clone();
    let network = "fabric-sweep";
    c.apply(&dynamic_deployment(
        &ns,
        network,
        "172.31.68.0/24",
        "172.31.68.1",
        6,
    ));
    let pods = c.wait("6 pods Running on at least 2 nodes", 3 * MINUTE, || {
        let pods = running_pods(&c, &ns, "app=web");
        let nodes: BTreeSet<&String> = pods.iter().map(|(_, n)| n).collect();
        if pods.len() == 6 && nodes.len() >= 2 && c.bound_claims(network).len() == 6 {
            Ok(pods)
        } else {
            Err(format!("{pods:?}"))
        }
    });

    // Lost DEL 1: Multus' cache of the pod's delegates is missing on its
    // node when the pod is deleted (and the pod is already gone from the
    // API, so Multus cannot rebuild the list): Multus logs that it cannot
    // properly delete and returns success without calling the NAD plugin.
    let (victim, victim_node) = pods[0].clone();
    let claim = c
        .bound_claims(network)
        .into_iter()
        .find(|k| k.pod == format!("{ns}/{victim}"))
        .expect("the victim's claim");
    let container = c
        .ipclaims()
        .into_iter()
        .find(|k| {
            k["spec"]["ip"] == claim.ip.to_string().as_str() && k["spec"]["network"] == network
        })
        .and_then(|k| {
            k["status"]["holder"]["containerID"]
                .as_str()
                .map(str::to_string)
        })
        .expect("the claim records the sandbox");
    lose_the_del(&c, &ns, &victim, &victim_node, &container);

    // Lost DEL 2: a node crashes and is deleted from the API; its pods are
    // garbage-collected and recreated elsewhere; nobody ever runs their DELs.
    let other = pods
        .iter()
        .map(|(_, n)| n.clone())
        .find(|n| *n != victim_node)
        .expect("a second node");
    let on_other: Vec<String> = pods
        .iter()
        .filter(|(_, n)| *n == other)
        .map(|(p, _)| p.clone())
        .collect();
    let mut guard = NodeGuard::new(&c, &other);
    guard.crash();
    c.kubectl(&["delete", "node", &other, "--wait=false"]);
    c.wait(
        "the deleted node's pods garbage-collected and replaced",
        3 * MINUTE,
        || {
            let running = running_pods(&c, &ns, "app=web");
            let gone = on_other.iter().all(|p| c.pod(&ns, p).is_none());
            if gone && running.len() == 6 && running.iter().all(|(_, n)| *n != other) {
                Ok(())
            } else {
                Err(format!("{running:?}"))
            }
        },
    );
    c.wait("every live pod attached", 2 * MINUTE, || {
        let live = running_pods(&c, &ns, "app=web").len();
        let leaked = claims_of_gone_pods(&c, &ns, network).len();
        if c.bound_claims(network).len() == live + leaked {
            Ok(())
        } else {
            Err(format!("{live} live, {leaked} leaked"))
        }
    });
    let leaked = claims_of_gone_pods(&c, &ns, network);
    assert_eq!(
        leaked.len(),
        1 + on_other.len(),
        "the claims whose DEL never arrived are still Bound (the victim's and those of {other}): {leaked:?}"
    );
    eprintln!(
        "lost DELs: {} claims left Bound to gone pods (1 by a missing Multus cache on {victim_node}, {} by {other} crashed and deleted)",
        leaked.len(),
        on_other.len()
    );

    // The reconcile Deployment of deploy/optional/, as shipped except a shorter
    // interval (the test's only change), frees exactly those.
    let live_before: BTreeSet<IpAddr> = c
        .bound_claims(network)
        .into_iter()
        .filter(|k| !leaked.contains(k))
        .map(|k| k.ip)
        .collect();
    let t = Instant::now();
    let reconcile = ReconcileDeployment::every(&c, 5);
    c.wait(
        "the reconcile Deployment freeing the leaked claims",
        3 * MINUTE,
        || {
            let left = claims_of_gone_pods(&c, &ns, network);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
    let live_after: BTreeSet<IpAddr> = c.bound_claims(network).into_iter().map(|k| k.ip).collect();
    assert_eq!(live_after, live_before, "no live pod's claim was touched");
    eprintln!(
        "lost DELs: reconcile freed all {} in {:.1} s, no live claim touched",
        leaked.len(),
        t.elapsed().as_secs_f64()
    );
    drop(reconcile);
    drop(guard);
}

/// The MAC the router's neighbour table has for ADDR after pinging it.
fn router_mac(addr: IpAddr) -> Option<String> {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            "smc-router",
            "ip",
            "neigh",
            "show",
            &addr.to_string(),
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    words.find(|w| *w == "lladdr")?;
    words.next().map(str::to_string)
}

/// Resumes a paused API server on drop, also when the test fails.
struct ApiServerResumed<'a>(&'a LocalCluster);

impl Drop for ApiServerResumed<'_> {
    fn drop(&mut self) {
        self.0
            .script_best_effort(&["control", "resume", "kube-apiserver"]);
    }
}

#[test]
fn the_api_down_restarted_or_without_etcd_loses_no_address() {
    let Some(c) = cluster("the_api_down_restarted_or_without_etcd_loses_no_address") else {
        return;
    };
    let (ns, _claims) = setup_statefulset(&c, "apifault", 1);
    let ns = ns.name.clone();
    let node = c.wait_running(&ns, "db-0", &[], MINUTE);
    let held = c.pod_addrs(&ns, "db-0", "net1");
    let v4 = *held.iter().find(|a| a.is_ipv4()).expect("an IPv4 address");
    wait_pingable(&c, &held);
    let mac_before = router_mac(v4).expect("the router learned the pod's MAC");
    let netns = c
        .ipclaims()
        .into_iter()
        .find(|k| k["spec"]["ip"] == v4.to_string().as_str())
        .and_then(|k| k["status"]["holder"]["netns"].as_str().map(str::to_string))
        .expect("the claim records the sandbox's netns");
    let netns = netns.rsplit('/').next().unwrap_or_default().to_string();

    // The API server stops answering (SIGSTOP: connections hang, as in a
    // partition) and the pod's sandbox dies, so kubelet makes a new one for
    // the same pod. Through Multus that ADD cannot reach us: Multus 4.2.3
    // first waits for the pod from the API ("error waiting for pod") and
    // fails the ADD, so our degraded mode (a same-pod re-ADD served from the
    // node-local record) is not reachable behind Multus thin. What must
    // hold: nobody else gets the address meanwhile, and the pod gets it
    // back, on a new interface, once the API answers.
    let _resume = ApiServerResumed(&c);
    c.script(&["control", "pause", "kube-apiserver"]);
    let pids = c.script(&["exec", &node, "ip", "netns", "pids", &netns]);
    assert!(!pids.trim().is_empty(), "the sandbox {netns} has processes");
    for pid in pids.split_whitespace() {
        c.script(&["exec", &node, "kill", "-9", pid]);
    }
    let multus_log = c.node_disk(&node).join("var-log/multus.log");
    let said = c.wait(
        "Multus failing the re-ADD while the API is down",
        3 * MINUTE,
        || {
            let log = std::fs::read_to_string(&multus_log).unwrap_or_default();
            log.lines()
                .rev()
                .find(|l| {
                    l.contains(&format!("{ns}/db-0/"))
                        && l.contains("error waiting for pod")
                        && !l.contains("continue to delete")
                })
                .map(str::to_string)
                .ok_or_else(|| "not yet".to_string())
        },
    );
    eprintln!("api faults: API server paused, sandbox killed; Multus says: {said}");
    // The old sandbox's DEL (Multus has its cache) reached us and removed
    // the interface; nothing else took the address.
    c.wait(
        &format!("{v4} silent while its pod has no sandbox"),
        MINUTE,
        || {
            if c.router_pings(v4) {
                Err("still answers".into())
            } else {
                Ok(())
            }
        },
    );
    let t = Instant::now();
    c.script(&["control", "resume", "kube-apiserver"]);
    let mac_after = c.wait(
        "the address back on a new sandbox after the API answers",
        3 * MINUTE,
        || {
            if !c.router_pings(v4) {
                return Err("no reply".into());
            }
            match router_mac(v4) {
                Some(m) if m != mac_before => Ok(m),
                other => Err(format!("still {other:?}")),
            }
        },
    );
    eprintln!(
        "api faults: API server resumed -> {v4} back on a new sandbox ({mac_before} -> {mac_after}) {:.1} s later",
        t.elapsed().as_secs_f64()
    );
    c.wait_running(&ns, "db-0", &[], 2 * MINUTE);
    assert_eq!(
        c.pod_addrs(&ns, "db-0", "net1"),
        held,
        "db-0 after the API came back"
    );
    assert_claims_match(
        &c,
        &ns,
        "fabric-db",
        &addresses(&c, &ns, &["db-0".to_string()]),
    );

    // The API server killed and started again while ADDs are in flight,
    // then etcd: every pod attached, distinct addresses, claims agree.
    c.kubectl(&["-n", &ns, "scale", "statefulset", "db", "--replicas=3"]);
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    c.script(&["control", "restart", "kube-apiserver"]);
    eprintln!(
        "api faults: kube-apiserver restarted in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for p in sts_pods(3) {
        c.wait_running(&ns, &p, &[], 3 * MINUTE);
    }
    c.kubectl(&["-n", &ns, "scale", "statefulset", "db", "--replicas=5"]);
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    c.script(&["control", "restart", "etcd"]);
    eprintln!(
        "api faults: etcd restarted in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for p in sts_pods(5) {
        c.wait_running(&ns, &p, &[], 3 * MINUTE);
    }
    let seen = addresses(&c, &ns, &sts_pods(5));
    let all: BTreeSet<IpAddr> = seen.values().flatten().copied().collect();
    assert_eq!(
        all.len(),
        10,
        "ten distinct addresses for five dual-stack pods: {seen:?}"
    );
    for (p, a) in &seen {
        assert_dual_stack(p, a);
    }
    assert_eq!(seen["db-0"], held, "db-0 kept its addresses through it all");
    assert_claims_match(&c, &ns, "fabric-db", &seen);
    eprintln!("api faults: 5 pods attached through an API server and an etcd restart, 0 duplicates, claims agree");
}

/// The fault proxy in the control-plane netns, in front of the real API
/// server; its mode file switches what the next connections get.
struct FaultProxy {
    child: std::process::Child,
    mode: std::path::PathBuf,
}

impl FaultProxy {
    const LISTEN: &'static str = "10.200.0.1:7443";

    fn start() -> FaultProxy {
        let dir = std::env::temp_dir().join(format!("smc-proxy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("proxy dir");
        let mode = dir.join("mode");
        std::fs::write(&mode, "pass").expect("proxy mode");
        let bin = sticky_e2e::target_dir().join("fault-proxy");
        let log = std::fs::File::create(dir.join("proxy.log")).expect("proxy log");
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", "smc-cp"])
            .arg(&bin)
            .args([
                "--listen",
                Self::LISTEN,
                "--upstream",
                "10.200.0.1:6443",
                "--mode-file",
            ])
            .arg(&mode)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        FaultProxy { child, mode }
    }

    fn set(&self, mode: &str) {
        std::fs::write(&self.mode, mode).expect("proxy mode");
    }

    /// How many connections the proxy served in a mode whose name starts
    /// with KIND ("Delay", "Reset", "Drop").
    fn served(&self, kind: &str) -> usize {
        let log = self.mode.with_file_name("proxy.log");
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&format!("connection in mode {kind}")))
            .count()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.mode.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn a_proxy_that_delays_resets_and_drops_api_traffic_loses_no_address() {
    let Some(c) = cluster("a_proxy_that_delays_resets_and_drops_api_traffic_loses_no_address")
    else {
        return;
    };
    let proxy = FaultProxy::start();
    // Every node's plugin reaches the API through the proxy: the
    // installer's kubeconfig with the proxy as the server (same address as
    // the API server, so TLS still verifies).
    c.write_node_kubeconfigs("via-proxy.kubeconfig", |kc| {
        let server = kc
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .expect("a server line");
        kc.replace(server, &format!("https://{}", FaultProxy::LISTEN))
    });
    let ns = c.namespace("proxy");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    c.apply(
        &fabric_db_nad(&c, &ns)
            .replace("sticky-macvlan.kubeconfig", "via-proxy.kubeconfig")
            .replace("\"timeoutMs\": 10000", "\"timeoutMs\": 3000")
            .replace(
                "/var/log/sticky-macvlan.log",
                "/var/log/sticky-macvlan-proxy.log",
            ),
    );
    c.apply(&statefulset(&ns, "db", 1, "fabric-db"));
    c.wait_running(&ns, "db-0", &[], 2 * MINUTE);
    let held = c.pod_addrs(&ns, "db-0", "net1");
    let mut replicas = 1;
    for mode in ["delay 1500", "reset", "drop"] {
        let t = Instant::now();
        proxy.set(mode);
        replicas += 1;
        scale_db(&c, &ns, replicas);
        let old = uid(&c, &ns, "db-0");
        c.kubectl(&["-n", &ns, "delete", "pod", "db-0", "--wait=false"]);
        // Let the ADDs (and db-0's DEL) meet the fault for a while.
        std::thread::sleep(Duration::from_secs(12));
        proxy.set("pass");
        for p in sts_pods(replicas) {
            c.wait_running(&ns, &p, &[], 3 * MINUTE);
        }
        assert_ne!(uid(&c, &ns, "db-0"), old, "db-0 was recreated");
        let seen = db_attached_distinct(&c, &ns, replicas, mode);
        assert_eq!(seen["db-0"], held, "db-0 kept its addresses through {mode}");
        let kind = match mode.split(' ').next() {
            Some("delay") => "Delay",
            Some("reset") => "Reset",
            _ => "Drop",
        };
        let hit = proxy.served(kind);
        assert!(hit > 0, "no plugin connection met the {mode} fault");
        eprintln!(
            "proxy: {mode} ({hit} connections met it): {replicas} pods attached, distinct addresses, claims agree, db-0 kept its addresses, {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }

    // Degraded mode behind Multus: the plugin's API path is cut while
    // Multus' own is not. db-0's sandbox dies; kubelet's DEL and the new
    // sandbox's ADD reach us with the API unreachable: the same pod (same
    // UID, same node) gets its addresses back from the node-local record,
    // nothing is written to the API, and a pod the node holds nothing for
    // is refused until the API answers.
    let held = c.pod_addrs(&ns, "db-0", "net1");
    let db0 = c.pod(&ns, "db-0").expect("db-0 exists");
    let db0_uid = db0["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let claims_before = claims_in(&c, &ns);
    proxy.set("drop");
    let t = Instant::now();
    kill_sandbox(&db0_uid);
    c.wait("db-0's sandbox re-created", 3 * MINUTE, || {
        let events = c.pod_events(&ns, "db-0");
        if events.iter().any(|e| e.starts_with("SandboxChanged")) {
            Ok(())
        } else {
            Err(events.join(" | "))
        }
    });
    let restarts =
        |pod: &serde_json::Value| pod["status"]["containerStatuses"][0]["restartCount"].as_u64();
    let restarted_before = restarts(&db0).unwrap_or(0);
    c.wait(
        "db-0's container restarted in the new sandbox",
        3 * MINUTE,
        || {
            let pod = c.pod(&ns, "db-0").ok_or("db-0 is gone")?;
            let ready = pod["status"]["containerStatuses"][0]["ready"] == true;
            match restarts(&pod) {
                Some(n) if n > restarted_before && ready => Ok(()),
                n => Err(format!("restartCount {n:?}, ready {ready}")),
            }
        },
    );
    let db0_node = c.wait_running(&ns, "db-0", &[], 3 * MINUTE);
    assert_eq!(uid(&c, &ns, "db-0"), db0_uid, "db-0 is the same pod");
    let plugin_log = std::fs::read_to_string(
        c.node_disk(&db0_node)
            .join("var-log/sticky-macvlan-proxy.log"),
    )
    .unwrap_or_default();
    assert!(
        plugin_log.contains(&format!(
            "degraded mode, re-ADD of pod UID {db0_uid} served from the node-local record"
        )),
        "{db0_node}'s plugin log does not show the degraded re-ADD of db-0:\n{plugin_log}"
    );
    assert_eq!(
        c.pod_addrs(&ns, "db-0", "net1"),
        held,
        "db-0's new sandbox got its addresses from the node-local record"
    );
    let readd = t.elapsed();
    replicas += 1;
    let newcomer = format!("db-{}", replicas - 1);
    scale_db(&c, &ns, replicas);
    let refusal = c.wait(
        &format!("{newcomer} refused while the API is cut"),
        3 * MINUTE,
        || {
            let events = c.pod_events(&ns, &newcomer);
            events
                .iter()
                .find(|e| {
                    e.starts_with("FailedCreatePodSandBox")
                        && (e.contains("unreachable") || e.contains("did not answer"))
                })
                .cloned()
                .ok_or_else(|| events.join(" | "))
        },
    );
    assert!(
        proxy.served("Drop") > 0,
        "no plugin connection met the drop"
    );
    assert_eq!(
        claims_in(&c, &ns),
        claims_before,
        "the API was written while the plugin could not reach it"
    );
    proxy.set("pass");
    c.wait_running(&ns, &newcomer, &[], 3 * MINUTE);
    db_attached_distinct(&c, &ns, replicas, "degraded mode");
    eprintln!(
        "proxy: degraded mode: db-0's new sandbox had its addresses {:.1} s after its sandbox was killed, with the API cut; {newcomer} refused ({refusal}) and attached once the API answered",
        readd.as_secs_f64()
    );
}

/// The IPClaims of NS's identities and pods, as (name, spec, status)
/// text: what a write would change.
fn claims_in(c: &LocalCluster, ns: &str) -> BTreeSet<String> {
    c.ipclaims()
        .iter()
        .filter(|k| {
            k["spec"]["namespace"] == ns
                || k["status"]["pod"]
                    .as_str()
                    .is_some_and(|p| p.starts_with(&format!("{ns}/")))
        })
        .map(|k| format!("{} {} {}", k["metadata"]["name"], k["spec"], k["status"]))
        .collect()
}

/// SIGKILL to the pause process of the pod with this UID: its sandbox
/// dies, as when a runtime restarts it; kubelet then makes a new one.
fn kill_sandbox(pod_uid: &str) {
    let marker = format!("pod{pod_uid}");
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let dir = entry.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let cgroup = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
        if comm.trim() == "pause" && cgroup.contains(&marker) {
            if let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed += 1;
            }
        }
    }
    assert!(killed > 0, "no pause process of pod {pod_uid} found");
}
