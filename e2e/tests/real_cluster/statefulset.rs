//! A StatefulSet's pods keep their addresses: delete, scale, reschedule,
//! a node crash with the out-of-service taint, a BGP speaker, retention,
//! one network attached twice.

use super::*;

#[test]
fn statefulset_keeps_both_addresses_across_delete_scale_and_reschedule() {
    let Some(c) = cluster("statefulset_keeps_both_addresses_across_delete_scale_and_reschedule")
    else {
        return;
    };
    let t0 = Instant::now();
    let (ns, _claims) = setup_statefulset(&c, "sts", 3);
    let ns = ns.name.clone();
    let pods = sts_pods(3);
    let first = addresses(&c, &ns, &pods);
    for (p, a) in &first {
        assert_dual_stack(p, a);
    }
    let all: BTreeSet<IpAddr> = first.values().flatten().copied().collect();
    assert_eq!(
        all.len(),
        6,
        "six distinct addresses for three pods: {first:?}"
    );
    assert_claims_match(&c, &ns, "fabric-db", &first);
    for a in first.values() {
        wait_pingable(&c, a);
    }
    eprintln!(
        "statefulset: 3 dual-stack pods Running and pingable in {:?}",
        t0.elapsed()
    );
    // What an operator reads: `kubectl get ipclaims` (-o wide) has the
    // network as a column, and every claim reports its conditions.
    let table = c.kubectl(&["get", "ipclaims", "-o", "wide"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "NETWORK",
            "IP",
            "IDENTITY",
            "POD",
            "NODE",
            "STATE",
            "AGE",
            "STICKY",
            "NAMESPACE"
        ],
        "{table}"
    );
    for (p, addrs) in &first {
        for a in addrs {
            assert!(
                table.lines().any(|l| {
                    let cells: Vec<&str> = l.split_whitespace().collect();
                    cells.get(1) == Some(&"fabric-db")
                        && cells.get(2) == Some(&a.to_string().as_str())
                        && cells.get(4) == Some(&format!("{ns}/{p}").as_str())
                        && cells.get(6) == Some(&"Bound")
                        && cells.get(8) == Some(&"true")
                }),
                "no row for {p}'s {a}:\n{table}"
            );
        }
    }
    for claim in c
        .ipclaims()
        .iter()
        .filter(|k| k["spec"]["namespace"] == ns.as_str())
    {
        let conditions = &claim["status"]["conditions"];
        assert_eq!(conditions[0]["type"], "Held", "{claim}");
        assert_eq!(conditions[0]["status"], "True", "{claim}");
        assert_eq!(conditions[1]["type"], "Reserved", "{claim}");
        assert_eq!(conditions[1]["status"], "False", "{claim}");
    }

    // kubectl delete pod: the StatefulSet controller recreates it.
    let t = Instant::now();
    let old = uid(&c, &ns, "db-1");
    c.kubectl(&["-n", &ns, "delete", "pod", "db-1", "--timeout=60s"]);
    c.wait("db-1 recreated", 2 * MINUTE, || {
        let now = uid(&c, &ns, "db-1");
        if !now.is_empty() && now != old {
            Ok(())
        } else {
            Err(format!("uid {now}"))
        }
    });
    c.wait_running(&ns, "db-1", &[], 2 * MINUTE);
    assert_eq!(
        c.pod_addrs(&ns, "db-1", "net1"),
        first["db-1"],
        "db-1 after delete"
    );
    eprintln!(
        "statefulset: db-1 deleted, recreated with its addresses in {:?}",
        t.elapsed()
    );

    // Scale to 1 and back to 3.
    let t = Instant::now();
    c.kubectl(&["-n", &ns, "scale", "statefulset", "db", "--replicas=1"]);
    c.wait_gone(&ns, "db-1", 2 * MINUTE);
    c.wait_gone(&ns, "db-2", 2 * MINUTE);
    c.kubectl(&["-n", &ns, "scale", "statefulset", "db", "--replicas=3"]);
    for p in &pods {
        c.wait_running(&ns, p, &[], 2 * MINUTE);
    }
    let scaled = addresses(&c, &ns, &pods);
    assert_eq!(scaled, first, "addresses after scaling 3 -> 1 -> 3");
    assert_claims_match(&c, &ns, "fabric-db", &scaled);
    eprintln!(
        "statefulset: scaled 3 -> 1 -> 3 with the same addresses in {:?}",
        t.elapsed()
    );

    // Reschedule to another node: cordon db-0's node, delete db-0.
    let t = Instant::now();
    let from = c.wait_running(&ns, "db-0", &[], MINUTE);
    let _guard = NodeGuard::new(&c, &from);
    c.kubectl(&["cordon", &from]);
    c.kubectl(&["-n", &ns, "delete", "pod", "db-0", "--timeout=60s"]);
    let to = c.wait_running(&ns, "db-0", &[&from], 2 * MINUTE);
    let moved = c.pod_addrs(&ns, "db-0", "net1");
    assert_eq!(moved, first["db-0"], "db-0 moved from {from} to {to}");
    wait_pingable(&c, &moved);
    assert_claims_match(&c, &ns, "fabric-db", &addresses(&c, &ns, &pods));
    eprintln!(
        "statefulset: db-0 rescheduled {from} -> {to} with its addresses, pingable, in {:?}",
        t.elapsed()
    );
}

#[test]
fn node_crash_and_the_out_of_service_taint_move_the_pod_with_its_address() {
    let Some(c) = cluster("node_crash_and_the_out_of_service_taint_move_the_pod_with_its_address")
    else {
        return;
    };
    let (ns, _claims) = setup_statefulset(&c, "crash", 2);
    let ns = ns.name.clone();
    let node = c.wait_running(&ns, "db-0", &[], MINUTE);
    let before = c.pod_addrs(&ns, "db-0", "net1");
    assert_dual_stack("db-0", &before);
    let old_uid = uid(&c, &ns, "db-0");
    let mut guard = NodeGuard::new(&c, &node);

    let t0 = Instant::now();
    guard.crash();
    // The runbook (docs/src/guide/node-down.md): a node that died is declared so.
    c.kubectl(&[
        "taint",
        "node",
        &node,
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
    ]);
    let to = c.wait_running(&ns, "db-0", &[&node], 3 * MINUTE);
    let after = c.pod_addrs(&ns, "db-0", "net1");
    assert_eq!(
        after, before,
        "db-0 after {node} crashed, recreated on {to}"
    );
    wait_pingable(&c, &after);
    eprintln!(
        "crash: {node} crashed -> db-0 Running on {to} with its addresses, pingable from the router, {:.1} s after the crash",
        t0.elapsed().as_secs_f64()
    );
    let new_uid = uid(&c, &ns, "db-0");
    assert_ne!(new_uid, old_uid);
    // The pod is told whose address it took and why (our Event, posted
    // before the ADD answered).
    let told = c.pod_events(&ns, "db-0");
    let takeover = told
        .iter()
        .find(|e| e.starts_with("StickyAddressTakenOver: "))
        .unwrap_or_else(|| {
            panic!(
                "no takeover Event on the new db-0: {told:?}; the plugin's log on {to}: {:#?}",
                plugin_log(&c, &to, &ns)
            )
        });
    assert!(
        takeover.contains(&format!("on node {node}"))
            && before.iter().any(|a| takeover.contains(&a.to_string())),
        "the takeover Event names the old node and the address: {takeover}"
    );

    // The crashed node comes back: its kubelet finds the old sandbox and
    // tears it down (a late DEL for the old pod). That DEL must not free
    // the claim the live pod holds.
    let t = Instant::now();
    guard.restart();
    guard.wait_ready();
    c.kubectl(&["taint", "node", &node, "node.kubernetes.io/out-of-service-"]);
    let multus_log = c.node_disk(&node).join("var-log/multus.log");
    c.wait(
        "the late DEL of the old db-0 on the restarted node",
        3 * MINUTE,
        || {
            let log = std::fs::read_to_string(&multus_log).unwrap_or_default();
            let late = log.lines().any(|l| {
                l.contains(&format!("Del: {ns}:db-0:"))
                    && l.contains(":fabric-db:net1")
                    && !l.contains(&new_uid)
            });
            if late {
                Ok(())
            } else {
                Err(format!(
                    "no DEL of {ns}/db-0 on net1 in {} yet",
                    multus_log.display()
                ))
            }
        },
    );
    // Give the DEL's effect (if it had one) time to reach the API.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.pod_addrs(&ns, "db-0", "net1"),
        before,
        "db-0 after the late DEL"
    );
    assert_claims_match(
        &c,
        &ns,
        "fabric-db",
        &addresses(&c, &ns, &["db-0".to_string()]),
    );
    wait_pingable(&c, &before);
    eprintln!(
        "crash: {node} restarted, its late DEL of the old db-0 freed nothing ({:.1} s)",
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn a_pod_attaching_one_network_twice_is_refused_unless_the_second_has_its_own_identity() {
    // Issue 26 item 8: the second attachment of one sandbox to one network
    // used to see its own pod UID on the first one's claim, judge that
    // holder "a new sandbox's predecessor" and bind the same address on a
    // second interface.
    let Some(c) = cluster(
        "a_pod_attaching_one_network_twice_is_refused_unless_the_second_has_its_own_identity",
    ) else {
        return;
    };
    let (ns, _claims) = setup_statefulset(&c, "twice", 0);
    let ns = ns.name.clone();
    let twice =
        r#"'[{"name":"fabric-db","interface":"net1"},{"name":"fabric-db","interface":"net2"}]'"#;
    c.apply(&statefulset(&ns, "db", 1, twice));
    let refused = c.wait(
        "db-0's second attachment refused with our reason",
        2 * MINUTE,
        || {
            let events = c.pod_events(&ns, "db-0");
            events
                .iter()
                .find(|e| e.contains("cannot be attached twice under one identity"))
                .cloned()
                .ok_or_else(|| format!("events: {events:?}"))
        },
    );
    assert!(refused.contains("interface net1"), "{refused}");
    let p = c.pod(&ns, "db-0").unwrap_or_default();
    assert_ne!(p["status"]["phase"], "Running", "refused, so not running");
    // The refused ADD left nothing: the only claims are net1's, held by
    // the sandbox kubelet tears down (or already released by its DEL).
    for k in c
        .ipclaims()
        .iter()
        .filter(|k| k["spec"]["namespace"] == ns.as_str())
    {
        assert_ne!(
            k["status"]["holder"]["ifname"], "net2",
            "no claim of the refused attachment: {k}"
        );
    }
    c.kubectl(&[
        "-n",
        &ns,
        "delete",
        "statefulset",
        "db",
        "--cascade=foreground",
    ]);
    c.kubectl(&[
        "-n",
        &ns,
        "wait",
        "--for=delete",
        "pod/db-0",
        "--timeout=60s",
    ]);

    // With an identity of its own (in the pod's namespace) the second
    // attachment gets its own sticky address.
    let own = format!(
        r#"'[{{"name":"fabric-db","interface":"net1"}},{{"name":"fabric-db","interface":"net2","cni-args":{{"identity":"{ns}/db-0-second"}}}}]'"#
    );
    c.apply(&statefulset(&ns, "db", 1, &own));
    c.wait_running(&ns, "db-0", &[], 2 * MINUTE);
    let (net1, net2) = (
        c.pod_addrs(&ns, "db-0", "net1"),
        c.pod_addrs(&ns, "db-0", "net2"),
    );
    assert_dual_stack("db-0/net1", &net1);
    assert_dual_stack("db-0/net2", &net2);
    assert!(net1.is_disjoint(&net2), "net1 {net1:?}, net2 {net2:?}");
    eprintln!("one network twice: refused under one identity; with its own, net1 {net1:?} and net2 {net2:?}");
}

/// bird2 in the router netns, peering with the speaker's sticky address.
struct Bird {
    child: std::process::Child,
    sock: std::path::PathBuf,
    conf: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Bird {
    fn start(peer: &str) -> Bird {
        let dir = std::env::temp_dir().join(format!("smc-bird-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("bird dir");
        let conf = dir.join("bird.conf");
        std::fs::write(
            &conf,
            format!(
                "router id 172.31.60.1;\n\
                 protocol device {{ scan time 1; }}\n\
                 protocol bgp speaker {{\n\
                   local 172.31.60.1 as 64500;\n\
                   neighbor {peer} as 64512;\n\
                   hold time 6; keepalive time 2; connect retry time 1; connect delay time 1; error wait time 1, 2;\n\
                   ipv4 {{ import all; export none; }};\n\
                 }}\n"
            ),
        )
        .expect("bird config");
        let sock = dir.join("bird.ctl");
        let log = std::fs::File::create(dir.join("bird.log")).expect("bird log");
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", "smc-router", "bird", "-f", "-c"])
            .arg(&conf)
            .arg("-s")
            .arg(&sock)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start bird (Debian bird2)");
        Bird {
            child,
            sock,
            conf,
            dir,
        }
    }

    fn show(&self) -> String {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", "smc-router", "birdc", "-s"])
            .arg(&self.sock)
            .args(["show", "protocols"])
            .output()
            .expect("birdc");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait_established(&self, c: &LocalCluster) -> Duration {
        let t = Instant::now();
        c.wait(
            "bird's session with the speaker Established",
            3 * MINUTE,
            || {
                let out = self.show();
                if out
                    .lines()
                    .any(|l| l.starts_with("speaker") && l.contains("Established"))
                {
                    Ok(())
                } else {
                    Err(out)
                }
            },
        );
        t.elapsed()
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_bgp_speaker_statefulset_peers_again_after_its_node_crashes() {
    let Some(c) = cluster("a_bgp_speaker_statefulset_peers_again_after_its_node_crashes") else {
        return;
    };
    let ns = c.namespace("bgp");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    // The fabric NAD with the reservation examples/gobgpd-statefulset.yaml asks for.
    let nad = c
        .example("nad-k8s-statefulset.yaml")
        .replace("namespace: db", &format!("namespace: {ns}"))
        .replace(
            "\"gateway\": \"172.31.60.1\",",
            "\"gateway\": \"172.31.60.1\",\n        \"reservations\": {\"bgp-speaker-a\": \"172.31.60.20\"},",
        );
    assert!(
        nad.contains("bgp-speaker-a"),
        "the fabric NAD still has its gateway line"
    );
    c.apply(&nad);
    let bird = Bird::start("172.31.60.20");
    let bird_conf = std::fs::read(&bird.conf).expect("bird config");
    c.apply(
        &c.example("gobgpd-statefulset.yaml")
            .replace("namespace: db", &format!("namespace: {ns}")),
    );
    let node = c.wait_running(&ns, "bgp-speaker-0", &[], 2 * MINUTE);
    let addrs = c.pod_addrs(&ns, "bgp-speaker-0", "net1");
    assert!(
        addrs.contains(&"172.31.60.20".parse().expect("ip")),
        "the speaker has its reserved address: {addrs:?}"
    );
    let first = bird.wait_established(&c);
    eprintln!(
        "bgp: gobgpd on {node} Established with bird {:.1} s after Running",
        first.as_secs_f64()
    );

    let mut guard = NodeGuard::new(&c, &node);
    let t0 = Instant::now();
    guard.crash();
    c.kubectl(&[
        "taint",
        "node",
        &node,
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
    ]);
    let to = c.wait_running(&ns, "bgp-speaker-0", &[&node], 3 * MINUTE);
    assert_eq!(
        c.pod_addrs(&ns, "bgp-speaker-0", "net1"),
        addrs,
        "the speaker's address on {to}"
    );
    bird.wait_established(&c);
    eprintln!(
        "bgp: {node} crashed -> gobgpd on {to} Established again with the same address {:.1} s after the crash",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(
        std::fs::read(&bird.conf).expect("bird config"),
        bird_conf,
        "the router's config is byte-identical"
    );
}

/// `ipam.retention` with the defaults turned around, applied by the
/// reconcile Deployment of deploy/optional/: a StatefulSet scaled 3 -> 1 loses
/// db-1's and db-2's claims (whenScaled=Delete) once their pods are gone;
/// deleted, it keeps db-0's (whenDeleted=Retain), which a StatefulSet of
/// the same name re-created later finds again.
#[test]
fn retention_deletes_scaled_away_claims_and_keeps_a_deleted_statefulsets() {
    let Some(c) = cluster("retention_deletes_scaled_away_claims_and_keeps_a_deleted_statefulsets")
    else {
        return;
    };
    let ns = c.namespace("retain");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    let nad = fabric_db_nad(&c, &ns).replace(
        "\"identityPolicy\": \"podName\",",
        "\"identityPolicy\": \"podName\", \"retention\": {\"whenScaled\": \"Delete\", \"whenDeleted\": \"Retain\"},",
    );
    assert!(
        nad.contains("whenScaled"),
        "the NAD still has its identityPolicy line"
    );
    c.apply(&nad);
    c.apply(&statefulset(&ns, "db", 3, "fabric-db"));
    let pods = sts_pods(3);
    for p in &pods {
        c.wait_running(&ns, p, &[], 2 * MINUTE);
    }
    let first = addresses(&c, &ns, &pods);
    for p in &pods {
        let held = claims_of_identity(&c, &format!("{ns}/{p}"));
        assert_eq!(held.len(), 2, "{p}: one claim per family: {held:?}");
        for k in held.values() {
            assert_eq!(
                k["spec"]["owner"]["retention"],
                serde_json::json!({"whenScaled": "Delete", "whenDeleted": "Retain"}),
                "{p}: the NAD's retention is recorded on its claim"
            );
        }
    }
    let _reconcile = ReconcileDeployment::every(&c, 3);

    let t = Instant::now();
    scale_db(&c, &ns, 1);
    c.wait("db-1's and db-2's claims deleted", 2 * MINUTE, || {
        let left: Vec<usize> = pods
            .iter()
            .map(|p| claims_of_identity(&c, &format!("{ns}/{p}")).len())
            .collect();
        if left == [2, 0, 0] {
            Ok(())
        } else {
            Err(format!("claims per ordinal: {left:?}"))
        }
    });
    eprintln!(
        "retention: scaled 3 -> 1, the claims of db-1 and db-2 deleted {:.1} s later (whenScaled=Delete)",
        t.elapsed().as_secs_f64()
    );

    c.kubectl(&[
        "-n",
        &ns,
        "delete",
        "statefulset",
        "db",
        "--cascade=foreground",
        "--timeout=60s",
    ]);
    c.wait("db-0 gone", MINUTE, || match c.pod(&ns, "db-0") {
        None => Ok(()),
        Some(_) => Err("db-0 still exists".into()),
    });
    // Several sweeps (every 3 s) see the StatefulSet gone.
    std::thread::sleep(Duration::from_secs(12));
    let kept = claims_of_identity(&c, &format!("{ns}/db-0"));
    assert_eq!(
        kept.len(),
        2,
        "whenDeleted=Retain keeps db-0's claims: {kept:?}"
    );
    assert!(
        kept.values()
            .all(|k| k["status"]["holder"].is_null() && k["status"]["phase"] == "Reserved"),
        "db-0's claims are unheld once it is gone: {kept:?}"
    );

    c.apply(&statefulset(&ns, "db", 1, "fabric-db"));
    c.wait_running(&ns, "db-0", &[], 2 * MINUTE);
    let again = c.pod_addrs(&ns, "db-0", "net1");
    assert_eq!(
        Some(&again),
        first.get("db-0"),
        "a re-created StatefulSet's db-0 finds the retained addresses"
    );
    eprintln!("retention: the StatefulSet deleted and re-created, db-0 back on {again:?} (whenDeleted=Retain)");
}
