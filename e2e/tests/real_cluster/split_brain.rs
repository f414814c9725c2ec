//! A node that is only cut off: takeovers refused while the old holder
//! answers on the fabric, and whose evidence `--node` may use.

use super::*;

#[test]
fn a_takeover_is_refused_while_the_old_holder_answers_on_the_fabric() {
    let Some(c) = cluster("a_takeover_is_refused_while_the_old_holder_answers_on_the_fabric")
    else {
        return;
    };
    let (ns, _claims) = setup_statefulset(&c, "split", 1);
    let ns = ns.name.clone();
    let node = c.wait_running(&ns, "db-0", &[], MINUTE);
    let held = c.pod_addrs(&ns, "db-0", "net1");
    let old_uid = uid(&c, &ns, "db-0");
    let mut guard = NodeGuard::new(&c, &node);

    // Split brain: the node loses the API (its management link is cut) but
    // keeps its fabric link, so its kubelet cannot tear the pod down and
    // the old db-0 stays alive on the wire; then the pod object is
    // force-deleted, so the API says the holder is gone.
    c.kubectl(&["cordon", &node]);
    guard.cut();
    c.kubectl(&[
        "-n",
        &ns,
        "delete",
        "pod",
        "db-0",
        "--force",
        "--grace-period=0",
    ]);
    let t0 = Instant::now();
    let refused = c.wait(
        "the replacement db-0 refused with our reason",
        3 * MINUTE,
        || {
            let p = c.pod(&ns, "db-0").ok_or("no db-0 yet")?;
            if p["metadata"]["uid"] == old_uid.as_str() {
                return Err("still the old pod".into());
            }
            let events = c.pod_events(&ns, "db-0");
            events
                .iter()
                .find(|e| {
                    e.starts_with("FailedCreatePodSandBox")
                        && e.contains("is still answered on the wire")
                })
                .cloned()
                .ok_or_else(|| format!("events: {events:?}"))
        },
    );
    eprintln!(
        "split brain: replacement refused after {:.1} s: {refused}",
        t0.elapsed().as_secs_f64()
    );
    // `kubectl describe pod` shows our Warning beside kubelet's, which
    // Multus' wrapping does not blur: its reason says what happened.
    let described = c.wait("our Event on the refused db-0", MINUTE, || {
        let text = c.kubectl(&["-n", &ns, "describe", "pod", "db-0"]);
        if text.contains("StickyAddressAnswered") {
            Ok(text)
        } else {
            Err(text)
        }
    });
    let ours = described
        .lines()
        .find(|l| l.contains("StickyAddressAnswered"))
        .unwrap_or_default();
    assert!(
        ours.contains("Warning") && ours.contains("sticky-macvlan"),
        "our Event is a Warning from sticky-macvlan: {ours}"
    );
    // kubelet retries the sandbox and meets the same refusal: one Event
    // whose count grows, not one more per retry.
    let counts = c.wait("our refusal Event counted again", 2 * MINUTE, || {
        let listed = c.json(&[
            "-n",
            &ns,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=db-0,reason=StickyAddressAnswered",
        ]);
        let counts: Vec<u64> = listed["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["count"].as_u64().unwrap_or(0))
            .collect();
        if counts.iter().any(|n| *n >= 2) {
            Ok(counts)
        } else {
            Err(format!("counts {counts:?}"))
        }
    });
    assert_eq!(
        counts.len(),
        1,
        "one Event for the repeated refusal: {counts:?}"
    );
    for a in &held {
        if a.is_ipv4() {
            assert!(
                refused.contains(&a.to_string()),
                "the refusal names {a}: {refused}"
            );
        }
    }
    // Nothing moved: the claims still name the old holder.
    let claims = c.bound_claims("fabric-db");
    for a in &held {
        let k = claims
            .iter()
            .find(|k| k.ip == *a)
            .unwrap_or_else(|| panic!("no claim of {a}"));
        assert_eq!(
            k.pod_uid, old_uid,
            "claim of {a} while the takeover is refused"
        );
    }
    let p = c.pod(&ns, "db-0").unwrap_or_default();
    assert_ne!(
        p["status"]["phase"], "Running",
        "the replacement must not run while the old holder answers"
    );

    // Once the old node is really dead, kubelet's retry succeeds.
    let t = Instant::now();
    guard.crash();
    let to = c.wait_running(&ns, "db-0", &[&node], 3 * MINUTE);
    assert_eq!(
        c.pod_addrs(&ns, "db-0", "net1"),
        held,
        "db-0 on {to} after {node} died"
    );
    wait_pingable(&c, &held);
    eprintln!(
        "split brain: {node} crashed -> db-0 Running on {to} with its addresses after {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn a_split_brain_stays_refused_while_the_reconcile_deployment_releases_the_claim() {
    // Issue 26 item 1, as a user runs it: the IPv4-only StatefulSet
    // network of examples/ and the reconcile Deployment of deploy/optional/ (a 5 s
    // interval instead of 60 s, so that it sweeps many times in the window).
    // While the old db-0 still answers on the fabric, reconcile judges it
    // dead and releases its claim; the replacement's next retry must still
    // probe the address, and be refused, or the address is live twice.
    let Some(c) =
        cluster("a_split_brain_stays_refused_while_the_reconcile_deployment_releases_the_claim")
    else {
        return;
    };
    let ns = c.namespace("split4");
    let ns_name = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns_name.clone(),
    };
    c.apply(&fabric_v4_nad(&c, &ns_name));
    c.apply(&statefulset(&ns_name, "db", 1, "fabric"));
    let node = c.wait_running(&ns_name, "db-0", &[], 2 * MINUTE);
    let held = c.pod_addrs(&ns_name, "db-0", "net1");
    let [addr] = held.iter().copied().collect::<Vec<_>>()[..] else {
        panic!("one IPv4 address on an IPv4-only network: {held:?}");
    };
    assert!(addr.is_ipv4(), "{addr}");
    let first = arp_answerers(addr);
    assert_eq!(first.len(), 1, "db-0 alone answers for {addr}: {first:?}");
    let old_uid = uid(&c, &ns_name, "db-0");
    let reconcile = ReconcileDeployment::every(&c, 5);
    let mut guard = NodeGuard::new(&c, &node);

    c.kubectl(&["cordon", &node]);
    guard.cut();
    c.kubectl(&[
        "-n",
        &ns_name,
        "delete",
        "pod",
        "db-0",
        "--force",
        "--grace-period=0",
    ]);
    // 120 s: two dozen sweeps, and kubelet's retries of the replacement's
    // sandbox between them.
    let t0 = Instant::now();
    let (mut rounds, mut doubled, mut released_at) = (0u32, Vec::new(), None);
    while t0.elapsed() < 2 * MINUTE {
        let answerers = arp_answerers(addr);
        rounds += 1;
        if answerers.len() > 1 {
            doubled.push(format!(
                "{:.0} s: {answerers:?}",
                t0.elapsed().as_secs_f64()
            ));
        }
        let claim = c.ipclaims().into_iter().find(|k| {
            k["spec"]["network"] == "fabric" && k["spec"]["ip"] == addr.to_string().as_str()
        });
        let why = claim
            .as_ref()
            .and_then(|k| k["status"]["unconfirmed"]["why"].as_str().map(String::from));
        if released_at.is_none() && why.as_deref().is_some_and(|w| w.contains("reconcile")) {
            released_at = Some(t0.elapsed().as_secs_f64());
        }
        if let Some(p) = c.pod(&ns_name, "db-0") {
            assert!(
                p["metadata"]["uid"] == old_uid.as_str() || p["status"]["phase"] != "Running",
                "the replacement db-0 runs with {addr} while the old one answers on the fabric (claim: {claim:?})"
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        doubled.is_empty(),
        "{addr} answered by two MACs in {} of {rounds} rounds: {doubled:?}",
        doubled.len()
    );
    let released_at = released_at.unwrap_or_else(|| {
        panic!(
            "reconcile never released the old holder's claim within 120 s: the scenario did not happen; plugin log on the new node: {:?}",
            plugin_log(&c, &node, "fabric")
        )
    });
    let refusals = c.pod_events(&ns_name, "db-0");
    assert!(
        refusals
            .iter()
            .any(|e| e.contains("StickyAddressAnswered")
                || e.contains("is still answered on the wire")),
        "the replacement was refused by the wire: {refusals:?}"
    );
    eprintln!(
        "split brain with reconcile: claim released by reconcile after {released_at:.0} s, replacement refused throughout, {rounds} ARP rounds from the router, none answered twice"
    );

    // The old node dies for real: the replacement's next probe hears
    // nobody, it runs with the address, and the mark is cleared.
    let t = Instant::now();
    guard.crash();
    let to = c.wait_running(&ns_name, "db-0", &[&node], 3 * MINUTE);
    assert_eq!(c.pod_addrs(&ns_name, "db-0", "net1"), held, "db-0 on {to}");
    wait_pingable(&c, &held);
    let confirmed = c.wait(
        "the claim's mark cleared by the confirmed grant",
        MINUTE,
        || {
            let claim = c
                .ipclaims()
                .into_iter()
                .find(|k| {
                    k["spec"]["network"] == "fabric" && k["spec"]["ip"] == addr.to_string().as_str()
                })
                .ok_or("no claim")?;
            if claim["status"]["phase"] == "Bound" && claim["status"]["unconfirmed"].is_null() {
                Ok(claim)
            } else {
                Err(format!("{}", claim["status"]))
            }
        },
    );
    assert_eq!(confirmed["status"]["node"], to.as_str());
    eprintln!(
        "split brain with reconcile: {node} crashed -> db-0 Running on {to} with {addr} after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    drop(reconcile);
    drop(guard);
}

/// The operator CLI run on the host (not a node), with the admin
/// kubeconfig: what `kubectl sticky` on a workstation does.
fn host_cli(c: &LocalCluster, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(sticky_e2e::our_plugin())
        .args(args)
        .arg("--kubeconfig")
        .arg(c.admin_kubeconfig())
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run the operator CLI");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn node_evidence_for_node_is_used_only_on_that_node_not_from_a_workstation() {
    // Issue 26 item 2: `--node node2` run from the host paired node2 with
    // the host's boot id and /var/run/netns, so node2's Running pod was
    // "dead" (its netns is not on the host), and release freed its claim.
    let Some(c) =
        cluster("node_evidence_for_node_is_used_only_on_that_node_not_from_a_workstation")
    else {
        return;
    };
    let (ns, _claims) = setup_statefulset(&c, "evid", 1);
    let ns = ns.name.clone();
    let node = c.wait_running(&ns, "db-0", &[], MINUTE);
    let held = c.pod_addrs(&ns, "db-0", "net1");
    let v4 = held.iter().find(|a| a.is_ipv4()).expect("an IPv4 address");
    let (ok, said) = host_cli(
        &c,
        &[
            "claims",
            "--network",
            "fabric-db",
            "--node",
            &node,
            "--json",
        ],
    );
    assert!(ok, "claims: {said}");
    let line = said
        .lines()
        .find(|l| l.contains(&format!("\"{v4}\"")) || l.contains(&v4.to_string()))
        .unwrap_or_default();
    assert!(
        !said.contains("\"dead\""),
        "db-0 is Running, not dead: {line} in {said}"
    );
    let says_api_only = said.contains("the kubernetes API only");
    let (ok, said) = host_cli(
        &c,
        &[
            "release",
            "--network",
            "fabric-db",
            "--ip",
            &v4.to_string(),
            "--node",
            &node,
        ],
    );
    assert!(
        !ok,
        "release of a Running pod's address from the host must be refused: {said}"
    );
    assert!(said.contains("considered alive"), "{said}");
    let claim = c
        .bound_claims("fabric-db")
        .into_iter()
        .find(|k| k.ip == *v4)
        .unwrap_or_else(|| panic!("the claim of {v4} is still Bound"));
    assert_eq!(claim.pod, format!("{ns}/db-0"));
    assert!(
        says_api_only,
        "the CLI says its verdicts came from the API alone: {said}"
    );
    eprintln!("--node {node} from the host: verdicts from the API alone, release of {v4} refused");
}
