//! Moving from host-local or Whereabouts, and running beside Whereabouts.

use super::*;

/// What Whereabouts does in a scenario: the pod's address afterwards, or
/// that it never came up.
fn observe(
    c: &LocalCluster,
    ns: &str,
    pod: &str,
    not_on: &[&str],
    limit: Duration,
) -> Option<(String, BTreeSet<IpAddr>)> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(p) = c.pod(ns, pod) {
            let node = p["spec"]["nodeName"].as_str().unwrap_or("").to_string();
            let running =
                p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null();
            if running && !node.is_empty() && !not_on.contains(&node.as_str()) {
                if let Ok(out) = c.exec(ns, pod, &["ip", "-o", "addr", "show", "dev", "net1"]) {
                    return Some((node, sticky_e2e::local_cluster::parse_ip_o_addr(&out)));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    None
}

fn verdict(before: &BTreeSet<IpAddr>, after: &Option<(String, BTreeSet<IpAddr>)>) -> String {
    match after {
        None => "stuck: the pod never came up".to_string(),
        Some((node, a)) if a == before => format!("same address {a:?} on {node}"),
        Some((node, a)) => format!("NEW address {a:?} on {node} (was {before:?})"),
    }
}

/// Whereabouts v0.9.2 (the reference macvlan 1.10.0 + Whereabouts IPAM,
/// its kubernetes datastore on the same API server) through the same
/// StatefulSet scenarios, on the same fabric. This test records what it
/// does; it asserts only that Whereabouts attaches fresh pods (so the
/// comparison is not against a broken install).
#[test]
fn whereabouts_beside_us_through_the_same_statefulset_scenarios() {
    let Some(c) = cluster("whereabouts_beside_us_through_the_same_statefulset_scenarios") else {
        return;
    };
    let ns = c.namespace("wb");
    let ns = ns.name.clone();
    c.apply(&format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{name: wb-fabric, namespace: {ns}}}
spec:
  config: |
    {{"cniVersion": "1.0.0", "name": "wb-fabric", "type": "macvlan", "master": "eth1", "mode": "bridge",
      "ipam": {{"type": "whereabouts", "range": "172.31.66.0/24", "range_start": "172.31.66.10",
        "range_end": "172.31.66.200", "gateway": "172.31.66.1"}}}}
"#
    ));
    c.apply(&statefulset(&ns, "db", 3, "wb-fabric"));
    let mut first = BTreeMap::new();
    for p in sts_pods(3) {
        let (_, a) = observe(&c, &ns, &p, &[], 2 * MINUTE).unwrap_or_else(|| {
            panic!(
                "whereabouts did not attach {ns}/{p}: {:?}",
                c.pod_events(&ns, &p)
            )
        });
        assert_eq!(a.len(), 1, "{p}: one address from whereabouts: {a:?}");
        first.insert(p, a);
    }
    let mut report = vec![format!("fresh: {first:?}")];

    let old = uid(&c, &ns, "db-1");
    c.kubectl(&["-n", &ns, "delete", "pod", "db-1", "--timeout=60s"]);
    c.wait("db-1 recreated", 2 * MINUTE, || {
        let now = uid(&c, &ns, "db-1");
        if !now.is_empty() && now != old {
            Ok(())
        } else {
            Err(now)
        }
    });
    report.push(format!(
        "delete pod db-1: {}",
        verdict(&first["db-1"], &observe(&c, &ns, "db-1", &[], 2 * MINUTE))
    ));

    let from = observe(&c, &ns, "db-0", &[], MINUTE)
        .map(|(n, _)| n)
        .unwrap_or_default();
    {
        let _guard = NodeGuard::new(&c, &from);
        c.kubectl(&["cordon", &from]);
        c.kubectl(&["-n", &ns, "delete", "pod", "db-0", "--timeout=60s"]);
        report.push(format!(
            "reschedule db-0 off {from}: {}",
            verdict(
                &first["db-0"],
                &observe(&c, &ns, "db-0", &[&from], 2 * MINUTE)
            )
        ));
    }

    let (node, before) = observe(&c, &ns, "db-2", &[], MINUTE).expect("db-2 Running");
    {
        let mut guard = NodeGuard::new(&c, &node);
        guard.crash();
        c.kubectl(&[
            "taint",
            "node",
            &node,
            "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        ]);
        let after = observe(&c, &ns, "db-2", &[&node], 3 * MINUTE);
        report.push(format!(
            "crash {node} + out-of-service taint, db-2: {}",
            verdict(&before, &after)
        ));
        if let Some((_, a)) = &after {
            for addr in a {
                report.push(format!(
                    "  {addr} answers the router: {}",
                    c.router_pings(*addr)
                ));
            }
        }
    }
    // Split brain, as in a_takeover_is_refused_while_the_old_holder_answers_on_the_fabric.
    let (node, before) = observe(&c, &ns, "db-1", &[], MINUTE).expect("db-1 Running");
    {
        let mut guard = NodeGuard::new(&c, &node);
        c.kubectl(&["cordon", &node]);
        guard.cut();
        c.kubectl(&[
            "-n",
            &ns,
            "delete",
            "pod",
            "db-1",
            "--force",
            "--grace-period=0",
        ]);
        let after = observe(&c, &ns, "db-1", &[&node], 2 * MINUTE);
        report.push(format!(
            "split brain ({node} cut from the API, db-1 force-deleted): {}",
            verdict(&before, &after)
        ));
        // Is the old db-1 still up on the cut node with that address?
        let script =
            "for n in $(ip netns list | cut -d' ' -f1); do ip -n \"$n\" -o addr show; done";
        let on_old = c.script(&["exec", &node, "sh", "-c", script]);
        for addr in &before {
            let old_has = sticky_e2e::local_cluster::parse_ip_o_addr(&on_old).contains(addr);
            let new_has = after.as_ref().is_some_and(|(_, a)| a.contains(addr));
            report.push(format!(
                "  {addr}: old pod on {node} still has it: {old_has}; the replacement has it: {new_has}{}",
                if old_has && new_has { " -> LIVE DUPLICATE on the fabric" } else { "" }
            ));
        }
        guard.crash();
    }
    let pools = c
        .try_kubectl(&[
            "-n",
            "kube-system",
            "get",
            "ippools.whereabouts.cni.cncf.io",
            "-o",
            "json",
        ])
        .unwrap_or_default();
    let allocations = serde_json::from_str::<serde_json::Value>(&pools)
        .ok()
        .and_then(|v| {
            v["items"].as_array().map(|items| {
                items
                    .iter()
                    .map(|p| {
                        p["spec"]["allocations"]
                            .as_object()
                            .map(|a| a.len())
                            .unwrap_or(0)
                    })
                    .sum::<usize>()
            })
        })
        .unwrap_or(0);
    report.push(format!(
        "whereabouts allocations left for 3 live pods: {allocations}"
    ));
    for line in &report {
        eprintln!("whereabouts v0.9.2: {line}");
    }
}

/// A NAD named `migr` in NS on /24 `subnet` (.10 to .60): the reference
/// macvlan with host-local or Whereabouts, or ours on the kubernetes store.
fn migration_nad(ns: &str, plugin: &str, ipam: &str, subnet: &str) -> String {
    let prefix = subnet.trim_end_matches(".0/24");
    let ipam = match ipam {
        "whereabouts" => format!(
            r#""type": "whereabouts", "range": "{subnet}", "range_start": "{prefix}.10", "range_end": "{prefix}.60""#
        ),
        other => {
            let store = if other == "sticky-ipam" {
                r#", "store": {"type": "kubernetes"}"#
            } else {
                ""
            };
            format!(
                r#""type": "{other}", "ranges": [[{{"subnet": "{subnet}", "rangeStart": "{prefix}.10", "rangeEnd": "{prefix}.60"}}]]{store}"#
            )
        }
    };
    format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{name: migr, namespace: {ns}}}
spec:
  config: '{{"cniVersion": "1.0.0", "name": "migr", "type": "{plugin}", "master": "eth1", "mode": "bridge", "ipam": {{{ipam}}}}}'
"#
    )
}

/// The IPs of network `migr`'s IPClaims.
/// The addresses of network migr whose claims are Bound to a holder
/// (reconcile's release of a pod whose DEL went to the old IPAM is a
/// judgement, so that claim stays as Released, to be probed, I7).
fn migr_claim_ips(c: &LocalCluster) -> BTreeSet<String> {
    c.ipclaims()
        .into_iter()
        .filter(|k| k["spec"]["network"] == "migr" && k["status"]["phase"] == "Bound")
        .filter_map(|k| k["spec"]["ip"].as_str().map(str::to_string))
        .collect()
}

/// A node on the reference macvlan + host-local switches to us with its
/// pods running: `import-host-local` on the node (its plugin kubeconfig,
/// its containerd) adopts the running pods' addresses into the kubernetes
/// store, naming the pods; a pod started after the switch gets another
/// address; an old pod deleted (its DEL goes to host-local, which Multus
/// cached) has its imported claim freed by the reconcile Deployment, and
/// the live one keeps its own. A rerun imports nothing twice.
#[test]
fn import_host_local_moves_a_running_node_into_the_kubernetes_store() {
    let Some(c) = cluster("import_host_local_moves_a_running_node_into_the_kubernetes_store")
    else {
        return;
    };
    let ns = c.namespace("migr");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    let node = c.nodes()[1].clone();
    c.apply(&migration_nad(
        &ns,
        "macvlan",
        "host-local",
        "172.31.77.0/24",
    ));
    let old = ["old-0", "old-1"];
    for p in old {
        c.apply(&pinned_pod(&ns, p, &node, "migr"));
    }
    let mut before = BTreeMap::new();
    for p in old {
        c.wait_running(&ns, p, &[], 2 * MINUTE);
        before.insert(p, c.pod_addrs(&ns, p, "net1"));
    }
    let import = || {
        let out = std::process::Command::new("nsenter")
            .args(["-t", &c.node_pid(&node), "-n", "-m", "-u", "--"])
            .args([
                "/opt/cni/bin/sticky-macvlan",
                "import-host-local",
                "--network",
                "migr",
                "--from",
                "/var/lib/cni/networks/migr",
                "--kubeconfig",
                "/etc/cni/net.d/sticky-macvlan.d/sticky-macvlan.kubeconfig",
                "--node",
                &node,
            ])
            .output()
            .expect("run import-host-local on the node");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "import-host-local: {said}");
        said
    };
    let said = import();
    assert!(said.contains("imported 2 host-local allocations"), "{said}");
    assert!(said.contains("has 2 of these sandboxes"), "{said}");
    let claims: Vec<serde_json::Value> = c
        .ipclaims()
        .into_iter()
        .filter(|k| k["spec"]["network"] == "migr")
        .collect();
    for p in old {
        let ip = before[p].iter().next().expect("an address").to_string();
        let claim = claims
            .iter()
            .find(|k| k["spec"]["ip"] == ip.as_str())
            .unwrap_or_else(|| panic!("{p}: no claim of {ip}: {claims:?}"));
        assert_eq!(claim["status"]["holder"]["podName"], p, "{claim}");
        assert_eq!(claim["status"]["holder"]["node"], node.as_str(), "{claim}");
    }
    let again = import();
    assert!(
        again.contains("imported 0 host-local allocations")
            && again.contains("2 were imported before"),
        "{again}"
    );

    let (new, kept_ip) = switch_to_us(&c, &ns, "172.31.77.0/24", &node, &before);
    eprintln!(
        "import: {node} moved from host-local with 2 pods running; new-0 got {new:?}; old-0 deleted and its imported claim freed by reconcile, old-1 kept {kept_ip}"
    );
}

/// The second half of a migration, once old-0 and old-1 (addresses in
/// BEFORE) were imported: the NAD switched to us on the kubernetes store,
/// a new pod on NODE gets an address no imported pod holds while the old
/// pods keep theirs, and old-0's claim is freed by the reconcile
/// Deployment once old-0 is deleted, old-1's kept. Returns new-0's
/// addresses and old-1's.
fn switch_to_us(
    c: &LocalCluster,
    ns: &str,
    subnet: &str,
    node: &str,
    before: &BTreeMap<&str, BTreeSet<IpAddr>>,
) -> (BTreeSet<IpAddr>, String) {
    c.apply(&migration_nad(ns, "sticky-macvlan", "sticky-ipam", subnet));
    c.apply(&pinned_pod(ns, "new-0", node, "migr"));
    c.wait_running(ns, "new-0", &[], 2 * MINUTE);
    let new = c.pod_addrs(ns, "new-0", "net1");
    assert!(
        before.values().all(|a| a.is_disjoint(&new)),
        "new-0 got {new:?}, an imported address: {before:?}"
    );
    for (p, had) in before {
        assert_eq!(&c.pod_addrs(ns, p, "net1"), had, "{p} kept its address");
    }

    let _reconcile = ReconcileDeployment::every(c, 3);
    c.kubectl(&["-n", ns, "delete", "pod", "old-0", "--wait=true"]);
    let gone_ip = before["old-0"].iter().next().expect("address").to_string();
    let kept_ip = before["old-1"].iter().next().expect("address").to_string();
    c.wait(
        "old-0's imported claim freed by reconcile",
        2 * MINUTE,
        || {
            let ips = migr_claim_ips(c);
            if !ips.contains(&gone_ip) && ips.contains(&kept_ip) {
                Ok(())
            } else {
                Err(format!("Bound claims of migr: {ips:?}"))
            }
        },
    );
    let freed = c
        .ipclaims()
        .into_iter()
        .find(|k| k["spec"]["network"] == "migr" && k["spec"]["ip"] == gone_ip.as_str())
        .map(|k| k["status"].clone());
    if let Some(status) = freed {
        assert_eq!(status["phase"], "Released", "{status}");
        assert!(
            !status["unconfirmed"].is_null(),
            "marked for the wire: {status}"
        );
    }
    (new, kept_ip)
}

/// The same switch from Whereabouts v0.9, cluster-wide: its IPPool's
/// allocations become claims naming the pods and their nodes; a pod
/// started after the NAD names us gets another address; an old pod
/// deleted (its DEL goes to Whereabouts) has its claim freed by the
/// reconcile Deployment.
#[test]
fn import_whereabouts_moves_a_range_into_the_kubernetes_store() {
    let Some(c) = cluster("import_whereabouts_moves_a_range_into_the_kubernetes_store") else {
        return;
    };
    let ns = c.namespace("wbmigr");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    let subnet = "172.31.78.0/24";
    c.apply(&migration_nad(&ns, "macvlan", "whereabouts", subnet));
    let nodes = c.nodes();
    let old = [("old-0", &nodes[0]), ("old-1", &nodes[2])];
    for (p, node) in old {
        c.apply(&pinned_pod(&ns, p, node, "migr"));
    }
    let mut before = BTreeMap::new();
    for (p, _) in old {
        c.wait_running(&ns, p, &[], 2 * MINUTE);
        before.insert(p, c.pod_addrs(&ns, p, "net1"));
    }
    let import = || {
        let out = std::process::Command::new(sticky_e2e::our_plugin())
            .args(["import-whereabouts", "--network", "migr", "--range", subnet])
            .arg("--kubeconfig")
            .arg(c.admin_kubeconfig())
            .env_remove("CNI_COMMAND")
            .output()
            .expect("run import-whereabouts");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "import-whereabouts: {said}");
        said
    };
    let said = import();
    assert!(
        said.contains("imported 2 Whereabouts allocations"),
        "{said}"
    );
    let claims: Vec<serde_json::Value> = c
        .ipclaims()
        .into_iter()
        .filter(|k| k["spec"]["network"] == "migr")
        .collect();
    for (p, node) in old {
        let ip = before[p].iter().next().expect("an address").to_string();
        let claim = claims
            .iter()
            .find(|k| k["spec"]["ip"] == ip.as_str())
            .unwrap_or_else(|| panic!("{p}: no claim of {ip}: {claims:?}"));
        assert_eq!(claim["status"]["holder"]["podName"], p, "{claim}");
        assert_eq!(claim["status"]["holder"]["node"], node.as_str(), "{claim}");
    }
    let again = import();
    assert!(again.contains("2 were imported before"), "{again}");

    let (new, kept_ip) = switch_to_us(&c, &ns, subnet, &nodes[1], &before);
    eprintln!(
        "import: Whereabouts range {subnet} adopted with 2 pods running; new-0 got {new:?}; old-0 deleted and its claim freed by reconcile, old-1 kept {kept_ip}"
    );
}
