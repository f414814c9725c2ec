//! Planned API server faults under ADD and DEL.

use super::*;

/// API faults for the kubernetes store: 409 storms, 500s, answers past the
/// deadline and connections dropped mid-answer, each before the server
/// acts on the request or after (the write done, the client not told: a
/// claim created or a holder recorded without the plugin knowing). Pods
/// are attached the way kubelet does it (a failed ADD is followed by DEL
/// and a new sandbox, up to 8 tries); then the faults stop, everything is
/// deleted, and section 3's invariants are checked on the stored objects.
#[test]
fn api_faults_keep_the_invariants() {
    let mut topo = Topology::new(1);
    let api = topo.start_standin();
    api.add_node(&api.node(1));
    let plans: Vec<(&str, Value)> = vec![
        ("409 storm on writes", json!({"conflicts": 6})),
        (
            "500 before create",
            json!({"fault": "error500", "verbs": ["create"], "chance": 0.4}),
        ),
        (
            "500 after create",
            json!({"fault": "error500", "verbs": ["create"], "chance": 0.4, "after": true}),
        ),
        (
            "500 after update",
            json!({"fault": "error500", "verbs": ["update"], "chance": 0.4, "after": true}),
        ),
        (
            // The ADD and DEL paths read by name (GET), never by LIST.
            "500 before get",
            json!({"fault": "error500", "verbs": ["get"], "chance": 0.4}),
        ),
        (
            "slow create, past the deadline, after",
            json!({"fault": "slow", "verbs": ["create"], "chance": 0.4, "after": true, "delayMs": 1500}),
        ),
        (
            "slow update, past the deadline, after",
            json!({"fault": "slow", "verbs": ["update"], "chance": 0.4, "after": true, "delayMs": 1500}),
        ),
        (
            "slow answers within the deadline",
            json!({"fault": "slow", "chance": 1.0, "delayMs": 150}),
        ),
        (
            "dropped connection after create",
            json!({"fault": "drop", "verbs": ["create"], "chance": 0.4, "after": true}),
        ),
        (
            "dropped connection before delete",
            json!({"fault": "drop", "verbs": ["delete"], "chance": 0.4}),
        ),
        (
            "dropped connection after delete",
            json!({"fault": "drop", "verbs": ["delete"], "chance": 0.4, "after": true}),
        ),
    ];
    let dir = topo.file("api-faults");
    let mut rows = Vec::new();
    let mut kept: BTreeMap<String, String> = BTreeMap::new();
    let mut seq = 0;
    for (label, plan) in &plans {
        api.fault_plan(plan.clone());
        api.reset_stats();
        let (mut attached, mut retries, mut failures) = (0, 0, Vec::new());
        for k in 0..4 {
            // Half sticky identities (kept across sandboxes), half dynamic.
            let identity = (k % 2 == 0).then(|| format!("apif-{seq}-{k}"));
            let mut conf = configs::sticky(
                &topo.node(0).uplink,
                &dir,
                json!({
                    "store": {"type": "kubernetes", "kubeconfig": api.kubeconfig, "timeoutMs": 1000, "dir": topo.file("api-faults-local")},
                    "nodeName": api.node(1),
                }),
            );
            conf["name"] = json!(api.network);
            if let Some(id) = &identity {
                conf["args"] = json!({"cni": {"identity": id}});
            }
            let mut done = false;
            for _attempt in 0..8 {
                seq += 1;
                let pod = topo.add_pod(&format!("af{seq}"));
                let cid = format!("af{seq}");
                let run = |cmd: &str| {
                    CniCall::new(&our_plugin(), &topo.node(0).netns, cmd, conf.clone())
                        .container(&cid)
                        .netns(&pod.path)
                        .args("IgnoreUnknown=1")
                        .run()
                };
                let add = run("ADD");
                if add.success {
                    attached += 1;
                    if let Some(id) = &identity {
                        let ip = add.first_address();
                        if let Some(was) = kept.insert(id.clone(), ip.clone()) {
                            if was != ip {
                                failures.push(format!("identity {id} moved from {was} to {ip}"));
                            }
                        }
                    }
                    // The pod goes away: DEL until it succeeds, as kubelet.
                    let mut deleted = false;
                    for _ in 0..8 {
                        if run("DEL").success {
                            deleted = true;
                            break;
                        }
                        retries += 1;
                    }
                    if !deleted {
                        failures.push(format!("DEL of {cid} never succeeded"));
                    }
                    topo.delete_netns(&pod.netns);
                    done = true;
                    break;
                }
                // A failed ADD: kubelet tears the sandbox down and tries anew.
                retries += 1;
                eprintln!("ADD {cid} failed: {}", add.stdout);
                for _ in 0..8 {
                    if run("DEL").success {
                        break;
                    }
                }
                topo.delete_netns(&pod.netns);
            }
            if !done {
                failures.push(format!("pod {k} was never attached"));
            }
        }
        let stats = api.stats();
        let injected: u64 = stats
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.starts_with("injected"))
                    .filter_map(|(_, v)| v.as_u64())
                    .sum()
            })
            .unwrap_or(0);
        api.fault_plan(json!({}));
        rows.push((label.to_string(), injected, attached, retries, failures));
    }
    // Everything is deleted. A DEL that met an unanswering API left its
    // claim for liveness (kubelet must not loop on DEL): one reconcile
    // sweep must explain every such claim, and then the stored objects
    // must obey section 3.
    // This machine is node1, whose pods' netns paths it sees, as the
    // installer's nodename file says on a real node.
    std::fs::write(api.kubeconfig.with_file_name("nodename"), api.node(1))
        .expect("write the nodename file");
    let sweep = std::process::Command::new("ip")
        .args(["netns", "exec", &topo.node(0).netns])
        .arg(our_plugin())
        .args(["reconcile", "--kubeconfig"])
        .arg(&api.kubeconfig)
        .args(["--node", &api.node(1)])
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run reconcile");
    let swept = String::from_utf8_lossy(&sweep.stdout).to_string();
    assert!(
        sweep.status.success(),
        "reconcile: {swept}{}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    let claims = seen_objects(&api);
    let after = violations(&claims, &kept);
    println!(
        "\n{:<40} {:>8} {:>9} {:>8} {:>10}",
        "API fault", "injected", "attached", "retries", "violations"
    );
    for (label, injected, attached, retries, failures) in &rows {
        println!(
            "{label:<40} {injected:>8} {attached:>6}/4 {retries:>8} {:>10}",
            failures.len()
        );
        for f in failures {
            println!("    {f}");
        }
    }
    println!("reconcile: {}", swept.trim());
    println!(
        "the stored objects afterwards: {} claims, violations: {}",
        claims.len(),
        after.len()
    );
    for v in &after {
        println!("    {v}");
    }
    // With STANDIN_TRACE=1 the stand-in logs every request and its fate.
    if std::env::var_os("STANDIN_TRACE").is_some() {
        let _ = std::fs::copy(
            topo.state_dir.join("standin.log"),
            std::env::temp_dir().join("standin-trace.log"),
        );
    }
    assert!(
        rows.iter().all(|r| r.1 > 0),
        "a fault plan injected nothing"
    );
    assert!(
        rows.iter().all(|r| r.4.is_empty()),
        "failures under API faults (see the table)"
    );
    assert!(
        after.is_empty(),
        "invariant violations in the stored objects"
    );
}
