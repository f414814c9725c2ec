//! A thousand ADD/DEL cycles across three nodes.

use super::*;

/// Load: 1,000 ADD/DEL cycles across three node netns sharing the stand-in,
/// two workers per node, half the pods StatefulSet pods (sticky), every
/// 10th write answered 409; bounded at 1,000 cycles and 240 s. A failed
/// call is retried as kubelet would (DEL, then a new ADD). Reports errors,
/// retries and violations; the target is 0 violations and no pod left
/// unattached.
#[test]
fn load_a_thousand_cycles_across_three_nodes() {
    const CYCLES: usize = 1000;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let mut topo = Topology::new(3);
    let api = topo.start_standin();
    for n in 1..=3 {
        api.add_node(&api.node(n));
    }
    let set_uid = api.add_stateful_set("default", "load");
    // Per node, its pods in order: StatefulSet pods recur (the same pod
    // restarting, its identity sticky), Deployment pods are new each time.
    let mut sts_uids: BTreeMap<String, String> = BTreeMap::new();
    let mut per_node: Vec<Vec<(String, String)>> = vec![Vec::new(); 3];
    for i in 0..CYCLES {
        let node = i % 3;
        let (name, uid) = if i % 2 == 0 {
            let name = format!("load-sts-{}", i % 48);
            let uid = sts_uids
                .entry(name.clone())
                .or_insert_with(|| {
                    api.add_pod(
                        "default",
                        &name,
                        &api.node(node + 1),
                        Some(("load", &set_uid)),
                        None,
                    )
                })
                .clone();
            (name, uid)
        } else {
            let name = format!("load-dep-{i}");
            let uid = api.add_pod("default", &name, &api.node(node + 1), None, None);
            (name, uid)
        };
        per_node[node].push((name, uid));
    }
    let workers: Vec<(usize, Pod)> = (0..6)
        .map(|w| (w % 3, topo.add_pod(&format!("load-w{w}"))))
        .collect();
    api.faults(0, 10);
    let next: Vec<std::sync::Mutex<usize>> = (0..3).map(|_| std::sync::Mutex::new(0)).collect();
    let tally = std::sync::Mutex::new((0usize, 0usize, 0usize, Vec::<String>::new()));
    let started = std::time::Instant::now();
    let (kubeconfig, network) = (api.kubeconfig.clone(), api.network.clone());
    let node_names: Vec<String> = (1..=3).map(|n| api.node(n)).collect();
    std::thread::scope(|s| {
        for (node, pod) in &workers {
            let (topo, pods, next, tally) = (&topo, &per_node[*node], &next[*node], &tally);
            let (kubeconfig, network, node_names) = (&kubeconfig, &network, &node_names);
            s.spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                    *n += 1;
                    *n - 1
                };
                if i >= pods.len() || std::time::Instant::now() > deadline {
                    return;
                }
                let (name, uid) = &pods[i];
                let mut conf = configs::sticky(
                    &topo.node(*node).uplink,
                    &topo.file("unused"),
                    json!({
                        "subnet": "10.232.0.0/22", "rangeStart": "10.232.0.10", "rangeEnd": "10.232.3.250", "gateway": "10.232.0.1",
                        "store": {"type": "kubernetes", "kubeconfig": kubeconfig, "dir": topo.file(&format!("load-local{node}"))},
                        "nodeName": node_names[*node],
                    }),
                );
                conf["name"] = json!(network);
                let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_UID={uid}");
                let run = |cmd: &str, cid: &str| {
                    CniCall::new(&our_plugin(), &topo.node(*node).netns, cmd, conf.clone())
                        .container(cid)
                        .netns(&pod.path)
                        .args(&args)
                        .run()
                };
                let (mut errors, mut retries, mut ok) = (0, 0, false);
                for attempt in 0..4 {
                    let cid = format!("load{node}-{i}-{attempt}");
                    if run("ADD", &cid).success {
                        ok = run("DEL", &cid).success || run("DEL", &cid).success;
                        break;
                    }
                    errors += 1;
                    retries += 1;
                    let _ = run("DEL", &cid);
                }
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                t.0 += usize::from(ok);
                t.1 += errors;
                t.2 += retries;
                if !ok {
                    t.3.push(format!("pod {i} ({name}) was not attached and detached"));
                }
            });
        }
    });
    let elapsed = started.elapsed();
    api.faults(0, 0);
    let (done, errors, retries, failures) = tally.into_inner().unwrap_or_else(|p| p.into_inner());
    let claims = api.claims();
    let held = claims
        .iter()
        .filter(|c| !c["status"]["holder"].is_null())
        .count();
    let stats = api.stats();
    println!(
        "\nload: {done}/{CYCLES} cycles in {:.1} s ({:.0} cycles/s), {errors} errors, {retries} retries, {} injected 409s, {} claims left ({held} held)",
        elapsed.as_secs_f64(),
        done as f64 / elapsed.as_secs_f64(),
        stats["injected 409"],
        claims.len()
    );
    for f in &failures {
        println!("    {f}");
    }
    sticky_e2e::kube_api::assert_claim_invariants(&claims);
    assert_eq!(held, 0, "claims still held after every DEL");
    assert_eq!(done, CYCLES, "not every cycle completed within the bound");
    assert!(failures.is_empty());
}
