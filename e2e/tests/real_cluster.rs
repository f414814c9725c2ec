//! The Kubernetes scenarios on the local real cluster of
//! `scripts/cluster.sh` (kube-apiserver v1.36 on etcd 3.6, the
//! controller-manager, the scheduler, kubelets with containerd 2.4 and
//! runc, Multus 4.2 thin). sticky-macvlan is installed the way the README
//! tells a user to (deploy/ applied with kubectl); every assertion reads
//! what the cluster says: the pods (their own `ip` output, by exec), the
//! IPClaims, the events, and pings from the router netns on the fabric.
//!
//! One cluster serves every test, so they run one at a time
//! (`--test-threads=1` in scripts/test.sh); each works in its own
//! namespace, and a test that crashes or cuts a node brings it back on
//! drop, also when it fails.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use sticky_e2e::local_cluster::{LocalCluster, TestNamespace};

const MINUTE: Duration = Duration::from_secs(60);

fn cluster(test: &str) -> Option<LocalCluster> {
    let c = LocalCluster::require(test)?;
    eprintln!("{test}: on the local cluster, Multus {}", c.multus_mode());
    c.install();
    Some(c)
}

/// examples/nad-sticky-statefulset.yaml (the dual-stack, cluster-wide
/// StatefulSet network), in namespace NS.
/// The example NAD in namespace NS, logging to each node's
/// /var/log/sticky-macvlan.log (`plugin_log`), which a failing scenario
/// quotes.
fn fabric_db_nad(c: &LocalCluster, ns: &str) -> String {
    c.example("nad-sticky-statefulset.yaml")
        .replace("namespace: db", &format!("namespace: {ns}"))
        .replace(
            "\"master\": \"eth1\",",
            "\"master\": \"eth1\", \"logFile\": \"/var/log/sticky-macvlan.log\",",
        )
}

/// examples/nad-k8s-statefulset.yaml (the IPv4-only, cluster-wide
/// network "fabric" of the BGP example), in namespace NS, logging to each
/// node's /var/log/sticky-macvlan.log (`plugin_log`).
fn fabric_v4_nad(c: &LocalCluster, ns: &str) -> String {
    c.example("nad-k8s-statefulset.yaml")
        .replace("namespace: db", &format!("namespace: {ns}"))
        .replace(
            "\"master\": \"eth1\",",
            "\"master\": \"eth1\", \"logFile\": \"/var/log/sticky-macvlan.log\",",
        )
}

/// The last lines of the plugin's log on NODE that mention NEEDLE.
fn plugin_log(c: &LocalCluster, node: &str, needle: &str) -> Vec<String> {
    let file = c.node_disk(node).join("var-log/sticky-macvlan.log");
    let text =
        std::fs::read_to_string(&file).unwrap_or_else(|e| format!("{}: {e}", file.display()));
    let lines: Vec<String> = text
        .lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect();
    lines[lines.len().saturating_sub(20)..].to_vec()
}

fn statefulset(ns: &str, name: &str, replicas: u32, network: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {name}, namespace: {ns}}}
spec:
  replicas: {replicas}
  podManagementPolicy: Parallel
  serviceName: {name}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{k8s.v1.cni.cncf.io/networks: {network}}}
    spec:
      terminationGracePeriodSeconds: 1
      tolerations:
      - {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 10}}
      - {{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 10}}
      containers:
      - name: c
        image: localhost/testbox:1
        imagePullPolicy: Never
        command: ["sleep", "100000"]
"#
    )
}

/// A dynamic (kubernetes store) NAD NETWORK on SUBNET and a Deployment
/// "web" of REPLICAS pods on it, in namespace NS.
fn dynamic_deployment(
    ns: &str,
    network: &str,
    subnet: &str,
    gateway: &str,
    replicas: usize,
) -> String {
    format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{name: {network}, namespace: {ns}}}
spec:
  config: |
    {{"cniVersion": "1.0.0", "name": "{network}", "type": "sticky-macvlan", "master": "eth1",
      "ipam": {{"type": "sticky-ipam", "subnet": "{subnet}", "gateway": "{gateway}",
        "store": {{"type": "kubernetes", "kubeconfig": "/etc/cni/net.d/sticky-macvlan.d/sticky-macvlan.kubeconfig", "timeoutMs": 10000}}}}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata:
      labels: {{app: web}}
      annotations: {{k8s.v1.cni.cncf.io/networks: {network}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {{name: c, image: localhost/testbox:1, imagePullPolicy: Never, command: ["sleep", "100000"]}}
"#
    )
}

fn uid(c: &LocalCluster, ns: &str, pod: &str) -> String {
    c.pod(ns, pod)
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Each pod's net1 addresses, read inside the pod.
fn addresses(c: &LocalCluster, ns: &str, pods: &[String]) -> BTreeMap<String, BTreeSet<IpAddr>> {
    pods.iter()
        .map(|p| (p.clone(), c.pod_addrs(ns, p, "net1")))
        .collect()
}

/// One IPv4 in 172.31.62.0/24 and one IPv6 in fd00:31:62::/64, as the
/// fabric-db NAD's two range sets give.
fn assert_dual_stack(pod: &str, addrs: &BTreeSet<IpAddr>) {
    let v4: Vec<_> = addrs.iter().filter(|a| a.is_ipv4()).collect();
    let v6: Vec<_> = addrs.iter().filter(|a| a.is_ipv6()).collect();
    assert!(
        v4.len() == 1 && v4[0].to_string().starts_with("172.31.62."),
        "{pod}: net1 should have one address of 172.31.62.0/24, has {addrs:?}"
    );
    assert!(
        v6.len() == 1 && v6[0].to_string().starts_with("fd00:31:62:"),
        "{pod}: net1 should have one address of fd00:31:62::/64, has {addrs:?}"
    );
}

/// The IPClaims agree with the pods: every address a pod has is claimed,
/// Bound to that pod (by name and UID) on the pod's node.
fn assert_claims_match(
    c: &LocalCluster,
    ns: &str,
    network: &str,
    seen: &BTreeMap<String, BTreeSet<IpAddr>>,
) {
    let claims = c.bound_claims(network);
    for (pod, addrs) in seen {
        let p = c
            .pod(ns, pod)
            .unwrap_or_else(|| panic!("{ns}/{pod} is gone"));
        let node = p["spec"]["nodeName"].as_str().unwrap_or("");
        let pod_uid = p["metadata"]["uid"].as_str().unwrap_or("");
        for a in addrs {
            let claim = claims.iter().find(|k| k.ip == *a).unwrap_or_else(|| {
                panic!("{ns}/{pod} has {a} but no Bound IPClaim of {network} says so: {claims:?}")
            });
            assert_eq!(claim.pod, format!("{ns}/{pod}"), "claim of {a}");
            assert_eq!(claim.pod_uid, pod_uid, "claim of {a}: holder UID");
            assert_eq!(claim.node, node, "claim of {a}: node");
            assert_eq!(
                claim.identity,
                format!("{ns}/{pod}"),
                "claim of {a}: identity"
            );
        }
    }
}

fn wait_pingable(c: &LocalCluster, addrs: &BTreeSet<IpAddr>) {
    for a in addrs {
        c.wait(&format!("{a} answers the router's ping"), MINUTE, || {
            if c.router_pings(*a) {
                Ok(())
            } else {
                Err("no reply".into())
            }
        });
    }
}

/// Sticky claims outlive their StatefulSet (that is the point); a test
/// retires its own so the pools stay clean for the next run.
struct ClaimsOf<'a> {
    c: &'a LocalCluster,
    ns: String,
}

impl Drop for ClaimsOf<'_> {
    fn drop(&mut self) {
        // The workloads go first: a StatefulSet that outlived the release
        // would re-create a pod, and its ADD a claim that the namespace's
        // deletion leaves reserved for the next run to trip over.
        let ns = self.ns.as_str();
        let _ = self.c.try_kubectl(&[
            "-n",
            ns,
            "delete",
            "statefulset,deployment",
            "--all",
            "--cascade=foreground",
            "--timeout=60s",
        ]);
        // Bare pods too (a foreground-deleted workload's are gone already).
        let _ = self
            .c
            .try_kubectl(&["-n", ns, "delete", "pod", "--all", "--timeout=60s"]);
        self.c.release_claims_of_namespace(ns);
    }
}

/// A node this test crashed, cut, cordoned or tainted: on drop it is
/// brought back to a plain Ready node.
struct NodeGuard<'a> {
    c: &'a LocalCluster,
    node: String,
    crashed: bool,
    cut: bool,
}

impl<'a> NodeGuard<'a> {
    fn new(c: &'a LocalCluster, node: &str) -> Self {
        NodeGuard {
            c,
            node: node.to_string(),
            crashed: false,
            cut: false,
        }
    }

    fn crash(&mut self) {
        self.c.script(&["crash", &self.node]);
        self.crashed = true;
        self.cut = false;
    }

    fn restart(&mut self) {
        self.c.script(&["restart", &self.node]);
        self.crashed = false;
    }

    fn cut(&mut self) {
        self.c.script(&["cut", &self.node]);
        self.cut = true;
    }

    fn wait_ready(&self) {
        let node = self.node.clone();
        self.c.wait(&format!("{node} Ready"), 3 * MINUTE, || {
            // A node deleted from the API is registered again by its kubelet.
            let text = self.c.try_kubectl(&["get", "node", &node, "-o", "json"])?;
            let n: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let ready = n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready {
                Ok(())
            } else {
                Err("NotReady".into())
            }
        });
    }
}

impl Drop for NodeGuard<'_> {
    fn drop(&mut self) {
        if self.cut {
            self.c.script_best_effort(&["heal", &self.node]);
        }
        if self.crashed {
            self.c.script_best_effort(&["restart", &self.node]);
        }
        let _ = self.c.try_kubectl(&["uncordon", &self.node]);
        let _ = self.c.try_kubectl(&[
            "taint",
            "node",
            &self.node,
            "node.kubernetes.io/out-of-service-",
        ]);
        if !std::thread::panicking() {
            self.wait_ready();
        }
    }
}

fn sts_pods(n: u32) -> Vec<String> {
    (0..n).map(|i| format!("db-{i}")).collect()
}

fn setup_statefulset<'a>(
    c: &'a LocalCluster,
    prefix: &str,
    replicas: u32,
) -> (TestNamespace<'a>, ClaimsOf<'a>) {
    let ns = c.namespace(prefix);
    let claims = ClaimsOf {
        c,
        ns: ns.name.clone(),
    };
    c.apply(&fabric_db_nad(c, &ns.name));
    c.apply(&statefulset(&ns.name, "db", replicas, "fabric-db"));
    for p in sts_pods(replicas) {
        c.wait_running(&ns.name, &p, &[], 2 * MINUTE);
    }
    (ns, claims)
}

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

/// The MACs that answer ARP for ADDR on the fabric, asked from the
/// router's namespace with iputils' arping (a few requests, 2 s at most).
fn arp_answerers(addr: IpAddr) -> BTreeSet<String> {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            "smc-router",
            "arping",
            "-c",
            "4",
            "-w",
            "2",
            "-I",
            "eth0",
            &addr.to_string(),
        ])
        .output()
        .expect("arping in the router netns (Debian iputils-arping, scripts/deps.sh)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("reply from"))
        .filter_map(|l| {
            let mac = l.split('[').nth(1)?.split(']').next()?;
            Some(mac.to_ascii_lowercase())
        })
        .collect()
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

#[test]
fn a_verb_missing_from_the_clusterrole_is_refused_by_the_real_authorizer() {
    let Some(c) = cluster("a_verb_missing_from_the_clusterrole_is_refused_by_the_real_authorizer")
    else {
        return;
    };
    let ns = c.namespace("rbac");
    let ns = ns.name.clone();
    // The examples' ClusterRole without `create` on ipclaims, bound to a
    // service account of its own, whose token the node's plugin uses.
    let sa = format!("limited-{ns}");
    c.apply(&format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {sa}, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {sa}}}
rules:
  - apiGroups: ["sticky-macvlan.io"]
    resources: ["ipclaims"]
    verbs: ["get", "list", "update", "delete"]
  - apiGroups: ["sticky-macvlan.io"]
    resources: ["iplocks"]
    verbs: ["get", "list", "create", "delete"]
  - apiGroups: [""]
    resources: ["pods", "nodes"]
    verbs: ["get"]
  - apiGroups: ["apps"]
    resources: ["statefulsets"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {sa}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {sa}}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]
"#
    ));
    let token = c.kubectl(&["-n", &ns, "create", "token", &sa, "--duration=1h"]);
    // On every node, next to the installer's files: a kubeconfig with
    // that token.
    c.write_node_kubeconfigs(&format!("{sa}.token"), |_| token.trim().to_string());
    c.write_node_kubeconfigs(&format!("{sa}.kubeconfig"), |kc| {
        kc.replace(
            "tokenFile: /etc/cni/net.d/sticky-macvlan.d/token",
            &format!("tokenFile: /etc/cni/net.d/sticky-macvlan.d/{sa}.token"),
        )
    });
    let nad = c
        .example("nad-k8s-statefulset.yaml")
        .replace("namespace: db", &format!("namespace: {ns}"))
        .replace("name: fabric\n", "name: fabric-limited\n")
        .replace("\"name\": \"fabric\"", "\"name\": \"fabric-limited\"")
        .replace("sticky-macvlan.kubeconfig", &format!("{sa}.kubeconfig"));
    c.apply(&nad);
    c.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: p
  namespace: {ns}
  annotations: {{k8s.v1.cni.cncf.io/networks: fabric-limited}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: c, image: localhost/testbox:1, imagePullPolicy: Never, command: ["sleep", "100000"]}}
"#
    ));
    let refused = c.wait("the ADD refused by the authorizer", 2 * MINUTE, || {
        let events = c.pod_events(&ns, "p");
        events
            .iter()
            .find(|e| e.starts_with("FailedCreatePodSandBox") && e.contains("forbidden"))
            .cloned()
            .ok_or_else(|| format!("events: {events:?}"))
    });
    eprintln!("rbac: {refused}");
    assert!(
        refused.contains(&format!("system:serviceaccount:{ns}:{sa}"))
            && refused.contains("cannot create resource")
            && refused.contains("ipclaims"),
        "the message names the user, the verb and the resource: {refused}"
    );
    assert!(
        c.bound_claims("fabric-limited").is_empty(),
        "no claim was made without the create verb"
    );
    let _ = c.try_kubectl(&["delete", "clusterrolebinding", &sa]);
    let _ = c.try_kubectl(&["delete", "clusterrole", &sa]);
}

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

/// Claims of NETWORK held by pods that are no longer in the API.
fn claims_of_gone_pods(
    c: &LocalCluster,
    ns: &str,
    network: &str,
) -> Vec<sticky_e2e::local_cluster::BoundClaim> {
    c.bound_claims(network)
        .into_iter()
        .filter(|k| {
            let name = k.pod.rsplit('/').next().unwrap_or("");
            c.pod(ns, name)
                .map(|p| p["metadata"]["uid"] != k.pod_uid.as_str())
                .unwrap_or(true)
        })
        .collect()
}

fn running_pods(c: &LocalCluster, ns: &str, selector: &str) -> Vec<(String, String)> {
    c.json(&["-n", ns, "get", "pods", "-l", selector])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
        })
        .filter_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                p["spec"]["nodeName"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// A lost DEL: Multus' cache of the pod's delegates (sandbox CONTAINER on
/// NODE) is removed before the pod is force-deleted, so with the pod gone
/// from the API Multus cannot rebuild the list; it logs that it cannot
/// properly delete and returns success without calling the NAD plugin.
fn lose_the_del(c: &LocalCluster, ns: &str, pod: &str, node: &str, container: &str) {
    let cache = c
        .node_disk(node)
        .join(format!("var-lib-cni/multus/{container}"));
    std::fs::remove_file(&cache)
        .unwrap_or_else(|e| panic!("Multus' cache {}: {e}", cache.display()));
    c.kubectl(&[
        "-n",
        ns,
        "delete",
        "pod",
        pod,
        "--force",
        "--grace-period=0",
    ]);
    let multus_log = c.node_disk(node).join("var-log/multus.log");
    c.wait(
        &format!("Multus on {node} giving up {pod}'s DEL"),
        2 * MINUTE,
        || {
            let log = std::fs::read_to_string(&multus_log).unwrap_or_default();
            if log.contains(container) && log.contains("failed to get the cached delegates file") {
                Ok(())
            } else {
                Err("not yet".into())
            }
        },
    );
}

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

/// The reconcile Deployment of deploy/optional/, as shipped except a shorter
/// interval; deleted on drop, also when the test fails, so no later
/// scenario meets a sweep it did not ask for.
struct ReconcileDeployment<'a>(&'a LocalCluster);

impl<'a> ReconcileDeployment<'a> {
    fn every(c: &'a LocalCluster, secs: u32) -> ReconcileDeployment<'a> {
        c.apply(
            &c.deploy_file("optional/reconcile-deployment.yaml").replace(
                "\"--interval\", \"60\"",
                &format!("\"--interval\", \"{secs}\""),
            ),
        );
        ReconcileDeployment(c)
    }
}

impl Drop for ReconcileDeployment<'_> {
    fn drop(&mut self) {
        // Gone means its pod is gone: a pod still terminating would sweep
        // (release a crashed node's holder, say) under the next scenario.
        let _ = self.0.try_kubectl(&[
            "-n",
            "kube-system",
            "delete",
            "deployment",
            "sticky-macvlan-reconcile",
            "--cascade=foreground",
            "--timeout=60s",
        ]);
        let _ = self.0.try_kubectl(&[
            "-n",
            "kube-system",
            "wait",
            "--for=delete",
            "pod",
            "-l",
            "app.kubernetes.io/name=sticky-macvlan-reconcile",
            "--timeout=60s",
        ]);
    }
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

/// `kubectl scale` of the proxy scenario's StatefulSet db.
fn scale_db(c: &LocalCluster, ns: &str, replicas: u32) {
    c.kubectl(&[
        "-n",
        ns,
        "scale",
        "statefulset",
        "db",
        &format!("--replicas={replicas}"),
    ]);
}

/// Every db pod's addresses, read in the pods: both families on each, all
/// distinct, and the IPClaims of fabric-db agree.
fn db_attached_distinct(
    c: &LocalCluster,
    ns: &str,
    replicas: u32,
    after: &str,
) -> BTreeMap<String, BTreeSet<IpAddr>> {
    let seen = addresses(c, ns, &sts_pods(replicas));
    let all: BTreeSet<IpAddr> = seen.values().flatten().copied().collect();
    assert_eq!(
        all.len(),
        2 * replicas as usize,
        "distinct addresses after {after}: {seen:?}"
    );
    for (p, a) in &seen {
        assert_dual_stack(p, a);
    }
    assert_claims_match(c, ns, "fabric-db", &seen);
    seen
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

/// The Multus overhead figure of `scripts/bench.sh --cluster` (table 9c)
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

/// The claims of identity ID (a pod `ns/name`), as "ip" -> the IPClaim.
fn claims_of_identity(c: &LocalCluster, id: &str) -> BTreeMap<String, serde_json::Value> {
    c.ipclaims()
        .into_iter()
        .filter(|k| k["spec"]["identity"] == id)
        .map(|k| (k["spec"]["ip"].as_str().unwrap_or_default().to_string(), k))
        .collect()
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

/// The claims of the token the installer left on NODE for the plugin.
fn plugin_token_claims(c: &LocalCluster, node: &str) -> serde_json::Value {
    use base64::Engine;
    let file = c
        .node_disk(node)
        .join("etc-cni-net.d/sticky-macvlan.d/token");
    let token =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let payload = token.split('.').nth(1).expect("a JWT has a payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .expect("base64url payload");
    serde_json::from_slice(&bytes).expect("JSON payload")
}

/// A pod on NODE (no scheduler) attached to NETWORK (a NAD's name).
fn pinned_pod(ns: &str, name: &str, node: &str, network: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  annotations: {{k8s.v1.cni.cncf.io/networks: {network}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: localhost/testbox:1
    imagePullPolicy: Never
    command: ["sleep", "100000"]
"#
    )
}

/// Puts the sticky-macvlan DaemonSet back as deploy/ has it on drop
/// (a test that patched it rolls it out again) and waits for the rollout.
struct DaemonSetRestore<'a>(&'a LocalCluster);

impl Drop for DaemonSetRestore<'_> {
    fn drop(&mut self) {
        let _ = self.0.try_kubectl(&[
            "-n",
            "kube-system",
            "patch",
            "daemonset",
            "sticky-macvlan",
            "--type=merge",
            "-p",
            r#"{"spec":{"template":{"spec":{"affinity":null}}}}"#,
        ]);
        self.0.settle_daemonset();
    }
}

/// The token the installer writes is bound to the node, so the plugin's
/// credentials outlive the installer pod: a DaemonSet rollout (a template
/// change) that also takes the installer off one node entirely, with pods
/// started on every node while it runs; all get their addresses, and so
/// does a pod started on the node whose installer pod is gone.
#[test]
fn the_plugins_token_outlives_the_installer_pod_through_a_daemonset_rollout() {
    let Some(c) =
        cluster("the_plugins_token_outlives_the_installer_pod_through_a_daemonset_rollout")
    else {
        return;
    };
    let ns = c.namespace("rollout");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    c.apply(&fabric_db_nad(&c, &ns));
    let nodes = c.nodes();
    for n in &nodes {
        let claims = plugin_token_claims(&c, n);
        assert_eq!(
            claims["kubernetes.io"]["node"]["name"],
            n.as_str(),
            "{n}: the plugin's token is bound to its node: {claims}"
        );
        assert!(
            claims["kubernetes.io"]["pod"].is_null(),
            "{n}: and not to the installer pod: {claims}"
        );
    }
    let spared = nodes[0].clone();
    let _restore = DaemonSetRestore(&c);
    let t = Instant::now();
    let affinity = format!(
        r#"{{"spec":{{"template":{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"kubernetes.io/hostname","operator":"NotIn","values":["{spared}"]}}]}}]}}}}}}}}}}}}}}"#
    );
    c.kubectl(&[
        "-n",
        "kube-system",
        "patch",
        "daemonset",
        "sticky-macvlan",
        "--type=merge",
        "-p",
        &affinity,
    ]);
    for n in &nodes {
        c.apply(&pinned_pod(&ns, &format!("during-{n}"), n, "fabric-db"));
    }
    c.wait(
        "no installer pod left on the spared node",
        2 * MINUTE,
        || match c.installer_pods(Some(&spared)) {
            Some(0) => Ok(()),
            n => Err(format!("{n:?} installer pods on {spared}")),
        },
    );
    let mut all = BTreeSet::new();
    for n in &nodes {
        let pod = format!("during-{n}");
        c.wait_running(&ns, &pod, &[], 2 * MINUTE);
        let addrs = c.pod_addrs(&ns, &pod, "net1");
        assert_dual_stack(&pod, &addrs);
        all.extend(addrs);
    }
    c.apply(&pinned_pod(&ns, "after", &spared, "fabric-db"));
    c.wait_running(&ns, "after", &[], 2 * MINUTE);
    let addrs = c.pod_addrs(&ns, "after", "net1");
    assert_dual_stack("after", &addrs);
    all.extend(addrs);
    assert_eq!(
        all.len(),
        2 * (nodes.len() + 1),
        "distinct addresses: {all:?}"
    );
    eprintln!(
        "rollout: {} pods started during a DaemonSet rollout and 1 on {spared} after its installer pod was gone, all attached, in {:.1} s",
        nodes.len(),
        t.elapsed().as_secs_f64()
    );
}

/// Puts this release's install back on drop, after the upgrade test took
/// it down to start from the previous release.
struct InstallRestored<'a>(&'a LocalCluster);

impl Drop for InstallRestored<'_> {
    fn drop(&mut self) {
        self.0.restore_install();
    }
}

/// How many times kubelet reported a failed sandbox for NS/POD: each is an
/// ADD that failed and was retried.
fn failed_sandboxes(c: &LocalCluster, ns: &str, pod: &str) -> u64 {
    let sel = format!("involvedObject.name={pod},reason=FailedCreatePodSandBox");
    c.json(&["-n", ns, "get", "events", "--field-selector", &sel])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["count"].as_u64().unwrap_or(1))
        .sum()
}

/// A running cluster upgraded from the previous release (0.1.0, built from
/// its commit by scripts/cluster.sh build, installed from the manifests it
/// shipped) by applying this release's deploy/ as the README says, with
/// pods started on every node while the DaemonSet rolls: the running pods
/// keep their addresses, the claims 0.1.0 wrote (held and reserved) hand
/// the same addresses back to this release's plugin, which adds what 0.1.0
/// did not write (conditions; the retention defaults come from the CRD);
/// `doctor` on every node then finds nothing wrong.
#[test]
fn upgrading_a_running_cluster_from_the_previous_release_keeps_every_address() {
    let Some(c) =
        cluster("upgrading_a_running_cluster_from_the_previous_release_keeps_every_address")
    else {
        return;
    };
    let previous = c.previous_release();
    let nodes = c.nodes();
    let _restore = InstallRestored(&c);
    c.uninstall();
    c.install_release(&previous.manifests);
    for n in &nodes {
        let v = c.installed_version(n);
        assert!(
            v.contains(&previous.version),
            "{n}: {} installed {v:?}, not {}",
            previous.image,
            previous.version
        );
    }
    let ns = c.namespace("upgrade");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    let nad = "nad-sticky-statefulset.yaml";
    let old_nad = std::fs::read_to_string(previous.examples.join(nad)).unwrap_or_default();
    assert_eq!(
        old_nad,
        c.example(nad),
        "a NAD written for {} works unchanged",
        previous.version
    );
    c.apply(&fabric_db_nad(&c, &ns));
    c.apply(&statefulset(&ns, "db", 3, "fabric-db"));
    for p in sts_pods(3) {
        c.wait_running(&ns, &p, &[], 2 * MINUTE);
    }
    let before = db_attached_distinct(&c, &ns, 3, &format!("{} installed", previous.version));
    // db-2's claims are left reserved by the previous release.
    scale_db(&c, &ns, 2);
    c.wait_gone(&ns, "db-2", 2 * MINUTE);
    c.wait("db-2's claims reserved", MINUTE, || {
        let k = claims_of_identity(&c, &format!("{ns}/db-2"));
        if k.len() == 2 && k.values().all(|k| k["status"]["phase"] == "Reserved") {
            Ok(())
        } else {
            Err(format!("{k:?}"))
        }
    });
    let untouched_uids: Vec<String> = ["db-0", "db-1"].iter().map(|p| uid(&c, &ns, p)).collect();
    for k in claims_of_identity(&c, &format!("{ns}/db-1")).values() {
        assert!(
            k["status"]["conditions"].is_null(),
            "{} writes no conditions: {k}",
            previous.version
        );
    }

    // The upgrade: this release's deploy/, in its files' order.
    let t = Instant::now();
    c.apply_release(&c.install_set());
    for n in &nodes {
        c.apply(&pinned_pod(&ns, &format!("during-{n}"), n, "fabric-db"));
    }
    c.wait_rolled_out();
    let rolled = t.elapsed();
    let version = env!("CARGO_PKG_VERSION");
    for n in &nodes {
        let v = c.installed_version(n);
        assert!(v.contains(version), "{n}: {v:?} installed, not {version}");
        let claims = plugin_token_claims(&c, n);
        assert_eq!(
            claims["kubernetes.io"]["node"]["name"],
            n.as_str(),
            "{n}: the upgraded installer wrote a node-bound token: {claims}"
        );
    }
    let mut during = BTreeSet::new();
    let mut retried = Vec::new();
    for n in &nodes {
        let pod = format!("during-{n}");
        c.wait_running(&ns, &pod, &[], 2 * MINUTE);
        let addrs = c.pod_addrs(&ns, &pod, "net1");
        assert_dual_stack(&pod, &addrs);
        during.extend(addrs);
        retried.push(failed_sandboxes(&c, &ns, &pod));
    }
    let attached = t.elapsed();
    let db_addrs: BTreeSet<IpAddr> = before.values().flatten().copied().collect();
    assert_eq!(
        during.len(),
        2 * nodes.len(),
        "distinct addresses for the pods started during the rollout: {during:?}"
    );
    assert!(
        during.is_disjoint(&db_addrs),
        "no pod started during the rollout got a db address: {during:?} vs {db_addrs:?}"
    );

    // The pods that ran through the upgrade were not touched.
    for (p, was) in ["db-0", "db-1"].iter().zip(&untouched_uids) {
        assert_eq!(&uid(&c, &ns, p), was, "{p} ran through the upgrade");
        assert_eq!(
            Some(&c.pod_addrs(&ns, p, "net1")),
            before.get(*p),
            "{p} keeps its addresses"
        );
    }
    // The claims the previous release wrote give the same addresses back:
    // db-2's reserved ones, and db-0's held ones once db-0 is replaced.
    scale_db(&c, &ns, 3);
    c.kubectl(&["-n", &ns, "delete", "pod", "db-0", "--wait=true"]);
    for p in sts_pods(3) {
        c.wait_running(&ns, &p, &[], 2 * MINUTE);
    }
    let after = db_attached_distinct(&c, &ns, 3, "the upgrade");
    assert_eq!(
        after, before,
        "every db pod on its addresses from before the upgrade"
    );
    for p in ["db-0", "db-2"] {
        for k in claims_of_identity(&c, &format!("{ns}/{p}")).values() {
            let types: Vec<&str> = k["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["type"].as_str())
                .collect();
            assert_eq!(
                types,
                ["Held", "Reserved"],
                "{p}: rewritten by {version}: {k}"
            );
        }
    }
    for k in claims_of_identity(&c, &format!("{ns}/db-1")).values() {
        assert_eq!(
            k["spec"]["owner"]["retention"],
            serde_json::json!({"whenScaled": "Retain", "whenDeleted": "Delete"}),
            "db-1's claim, written by {} only, reads the CRD's retention defaults: {k}",
            previous.version
        );
    }
    // doctor on every node, with the plugin's own kubeconfig: the node's
    // binaries are the DaemonSet's image, and nothing is wrong.
    for n in &nodes {
        let out = std::process::Command::new("nsenter")
            .args(["-t", &c.node_pid(n), "-n", "-m", "-u", "--"])
            .args(["/opt/cni/bin/sticky-macvlan", "doctor", "--json"])
            .output()
            .expect("run doctor on the node");
        let findings: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{n}: doctor printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let daemonset = findings
            .as_array()
            .into_iter()
            .flatten()
            .find(|f| f["check"] == "daemonset")
            .cloned()
            .unwrap_or_default();
        assert!(
            daemonset["severity"] == "ok"
                && daemonset["what"]
                    .as_str()
                    .is_some_and(|w| w.contains(&format!("this node has {version}"))),
            "{n}: doctor compares the DaemonSet with the node: {findings:#}"
        );
        assert_eq!(out.status.code(), Some(0), "{n}: doctor: {findings:#}");
    }
    let table = c.kubectl(&["get", "ipclaims"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.contains("NETWORK") && header.contains("STATE"),
        "the new columns: {header}"
    );
    eprintln!(
        "upgrade {} -> {version}: DaemonSet rolled out on {} nodes in {:.1} s; {} pods started during it attached within {:.1} s (failed sandboxes retried by kubelet per pod: {retried:?}); db-0..2 kept their addresses",
        previous.version,
        nodes.len(),
        rolled.as_secs_f64(),
        nodes.len(),
        attached.as_secs_f64()
    );
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

/// A kubeconfig for the admin's server and CA with the token the installer
/// left on NODE for its plugin, in DIR.
fn node_plugin_kubeconfig(
    c: &LocalCluster,
    node: &str,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let admin = c.json(&["config", "view", "--raw", "--minify"]);
    let cluster = &admin["clusters"][0]["cluster"];
    let token = std::fs::read_to_string(
        c.node_disk(node)
            .join("etc-cni-net.d/sticky-macvlan.d/token"),
    )
    .expect("the plugin's token");
    let ca = match cluster["certificate-authority-data"].as_str() {
        Some(data) => format!("certificate-authority-data: {data}"),
        None => format!(
            "certificate-authority: {}",
            cluster["certificate-authority"].as_str().expect("a CA")
        ),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    {ca}\nusers:\n- name: u\n  user:\n    token: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        cluster["server"].as_str().expect("a server"),
        token.trim()
    );
    let path = dir.join(format!("{node}.kubeconfig"));
    std::fs::write(&path, text).expect("write the kubeconfig");
    path
}

/// The exhaustion reclaim across nodes under the node-scope policy: a
/// one-address pool held by a pod on node2 whose DEL never came (its
/// Multus cache gone) is reclaimed by a pod on node1, which takes the
/// claim over (marked), re-keys the lock naming itself (marked: the
/// policy refuses node1 deleting node2's lock, or taking it unmarked),
/// deletes the claim, and gets the address.
#[test]
fn an_exhausted_pool_reclaims_another_nodes_dead_claim_and_lock_under_node_scope() {
    let Some(c) =
        cluster("an_exhausted_pool_reclaims_another_nodes_dead_claim_and_lock_under_node_scope")
    else {
        return;
    };
    let ns = c.namespace("reclaim");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    let network = "fabric-one";
    c.apply(&format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{name: {network}, namespace: {ns}}}
spec:
  config: |
    {{"cniVersion": "1.0.0", "name": "{network}", "type": "sticky-macvlan", "master": "eth1",
      "logFile": "/var/log/sticky-macvlan.log",
      "ipam": {{"type": "sticky-ipam", "subnet": "172.31.79.0/24", "rangeStart": "172.31.79.10",
        "rangeEnd": "172.31.79.10", "gateway": "172.31.79.1",
        "store": {{"type": "kubernetes", "kubeconfig": "/etc/cni/net.d/sticky-macvlan.d/sticky-macvlan.kubeconfig", "timeoutMs": 10000}}}}}}
"#
    ));
    let nodes = c.nodes();
    let (me, other) = (nodes[0].clone(), nodes[1].clone());
    c.apply(&pinned_pod(&ns, "gone", &other, network));
    c.wait_running(&ns, "gone", &[], 2 * MINUTE);
    let lock_on = |ip: &str| -> serde_json::Value {
        c.json(&["get", "iplocks"])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["spec"]["network"] == network && l["spec"]["ip"] == ip)
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    };
    let lock = lock_on("172.31.79.10");
    assert_eq!(lock["spec"]["node"], other.as_str(), "{lock}");
    let container = c
        .ipclaims()
        .into_iter()
        .find(|k| k["spec"]["network"] == network && k["status"]["holder"]["podName"] == "gone")
        .and_then(|k| {
            k["status"]["holder"]["containerID"]
                .as_str()
                .map(str::to_string)
        })
        .expect("gone's claim records its sandbox");
    lose_the_del(&c, &ns, "gone", &other, &container);
    assert_eq!(
        c.bound_claims(network).len(),
        1,
        "the dead pod's claim is still held"
    );

    let t = Instant::now();
    c.apply(&pinned_pod(&ns, "new", &me, network));
    c.wait_running(&ns, "new", &[], 2 * MINUTE);
    let addrs = c.pod_addrs(&ns, "new", "net1");
    assert_eq!(
        addrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["172.31.79.10"],
        "the pod on {me} reclaimed the pool's one address; {me}'s log: {:#?}",
        plugin_log(&c, &me, &ns)
    );
    let held = c.bound_claims(network);
    assert!(
        held.len() == 1 && held[0].pod == format!("{ns}/new") && held[0].node == me,
        "{held:?}"
    );
    let lock = lock_on("172.31.79.10");
    assert_eq!(
        lock["spec"]["node"],
        me.as_str(),
        "the new lock is {me}'s: {lock}"
    );
    eprintln!(
        "reclaim under node scope: the pod on {me} took over the one address {other}'s dead pod held, claim and lock, Running {:.1} s after it was created",
        t.elapsed().as_secs_f64()
    );
}

/// deploy/30-node-scope-policy.yaml on the real API server: node1's plugin
/// token may not release, redirect or delete a claim node2 holds, nor
/// create one naming node2, nor take it over without the unconfirmed
/// mark, nor move a claim's address; it may change its own. The same for the
/// locks, which name the node that made them; and node1's token may mint
/// the account's token only bound to node1. (Server-side dry runs:
/// admission runs, nothing is stored.)
#[test]
fn one_nodes_token_is_refused_when_it_rewrites_another_nodes_live_claim() {
    let Some(c) = cluster("one_nodes_token_is_refused_when_it_rewrites_another_nodes_live_claim")
    else {
        return;
    };
    let ns = c.namespace("scope");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    c.apply(&fabric_db_nad(&c, &ns));
    let nodes = c.nodes();
    let (me, other) = (nodes[0].clone(), nodes[1].clone());
    c.apply(&pinned_pod(&ns, "theirs", &other, "fabric-db"));
    c.apply(&pinned_pod(&ns, "mine", &me, "fabric-db"));
    c.wait_running(&ns, "theirs", &[], 2 * MINUTE);
    c.wait_running(&ns, "mine", &[], 2 * MINUTE);
    let claim_of = |pod: &str| -> serde_json::Value {
        c.ipclaims()
            .into_iter()
            .find(|k| {
                k["status"]["holder"]["podName"] == pod
                    && k["status"]["holder"]["podNamespace"] == ns.as_str()
            })
            .unwrap_or_else(|| panic!("no claim held by {pod}"))
    };
    let dir = std::env::temp_dir().join(format!("sticky-scope-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = node_plugin_kubeconfig(&c, &me, &dir);
    let as_me = |args: &[&str], stdin: Option<&serde_json::Value>| -> (bool, String) {
        use std::io::Write;
        let mut cmd = std::process::Command::new(c.kubectl_binary());
        cmd.arg("--kubeconfig").arg(&kubeconfig).args(args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(v) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(v.to_string().as_bytes())
                .expect("write stdin");
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("kubectl");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let theirs = claim_of("theirs");
    let name = theirs["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let refused = |what: &str, (ok, said): (bool, String), says: &str| {
        assert!(!ok, "{what} was allowed: {said}");
        assert!(
            said.contains("sticky-macvlan-node-scope") && said.contains(says),
            "{what}: {said}"
        );
    };
    // Release it (no holder), redirect it to a third node, delete it.
    let mut released = theirs.clone();
    released["status"]
        .as_object_mut()
        .expect("status")
        .remove("holder");
    refused(
        "releasing node2's claim",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&released)),
        "may not release, redirect or delete",
    );
    let mut redirected = theirs.clone();
    redirected["status"]["holder"]["node"] = serde_json::json!(nodes[2]);
    refused(
        "redirecting node2's claim",
        as_me(
            &["replace", "--dry-run=server", "-f", "-"],
            Some(&redirected),
        ),
        "may not",
    );
    refused(
        "deleting node2's claim",
        as_me(&["delete", "--dry-run=server", "ipclaim", &name], None),
        "may not release, redirect or delete",
    );
    let mut forged = theirs.clone();
    let meta = forged["metadata"].as_object_mut().expect("metadata");
    for k in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
        "managedFields",
    ] {
        meta.remove(k);
    }
    meta.insert("name".into(), serde_json::json!(format!("{name}-forged")));
    refused(
        "creating a claim held on node2",
        as_me(&["create", "--dry-run=server", "-f", "-"], Some(&forged)),
        "a node names only itself",
    );
    // A takeover must carry the unconfirmed mark (so the address is
    // probed before anyone binds it), and a claim's address never moves.
    let mut unmarked = theirs.clone();
    unmarked["status"]["holder"]["node"] = serde_json::json!(me);
    if let Some(status) = unmarked["status"].as_object_mut() {
        status.remove("unconfirmed");
    }
    refused(
        "taking node2's claim over without the mark",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&unmarked)),
        "without setting status.unconfirmed",
    );
    let mut marked = unmarked.clone();
    marked["status"]["unconfirmed"] = serde_json::json!({"since": 1, "why": "scope test"});
    let (ok, said) = as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&marked));
    assert!(ok, "node1 taking node2's claim over, marked: {said}");
    let mut moved = claim_of("mine");
    moved["spec"]["ip"] = serde_json::json!("172.31.59.250");
    refused(
        "moving node1's own claim to another address",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&moved)),
        "never change",
    );
    // Its own claim: allowed (the policy is not a blanket refusal).
    let mut own = claim_of("mine");
    own["metadata"]["labels"]["scope-test"] = serde_json::json!("1");
    let (ok, said) = as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&own));
    assert!(ok, "node1 changing its own claim: {said}");

    // The locks: each names the node that made it; node1 may not delete
    // node2's, change its identity, or forge one naming node2; it may
    // delete its own, and take node2's over (the reclaim's first step).
    let lock_of = |claim: &serde_json::Value| -> serde_json::Value {
        let mut lock = c.json(&["get", "iplocks"])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["metadata"]["uid"] == claim["spec"]["lockUID"])
            .cloned()
            .unwrap_or_else(|| panic!("no IPLock under {}", claim["metadata"]["name"]));
        lock["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("managedFields");
        lock
    };
    let their_lock = lock_of(&theirs);
    let lock_name = their_lock["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    assert_eq!(
        their_lock["spec"]["node"],
        other.as_str(),
        "a lock names the node that made it: {their_lock}"
    );
    refused(
        "deleting node2's lock",
        as_me(&["delete", "--dry-run=server", "iplock", &lock_name], None),
        "may not delete IPLock",
    );
    // Giving an address to another identity is one conditional update of
    // its lock (the exhaustion reclaim's re-key): allowed only to a node
    // that names itself, as a takeover is.
    let mut stolen = their_lock.clone();
    stolen["spec"]["identity"] = serde_json::json!(format!("{ns}/someone-else"));
    refused(
        "giving node2's lock to another identity while it still names node2",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&stolen)),
        "a node names only itself",
    );
    stolen["spec"]["node"] = serde_json::json!(me);
    refused(
        "re-keying node2's lock naming itself, unmarked",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&stolen)),
        "without setting spec.unconfirmed",
    );
    let lock_mark = serde_json::json!({"since": 1, "why": "a dead holder's address reclaimed"});
    stolen["spec"]["unconfirmed"] = lock_mark.clone();
    let (ok, said) = as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&stolen));
    assert!(
        ok,
        "re-keying node2's lock naming itself, marked (the reclaim's write), is allowed: {said}"
    );
    let mut forged_lock = their_lock.clone();
    let meta = forged_lock["metadata"].as_object_mut().expect("metadata");
    for k in ["resourceVersion", "uid", "creationTimestamp", "generation"] {
        meta.remove(k);
    }
    meta.insert(
        "name".into(),
        serde_json::json!(format!("{lock_name}-forged")),
    );
    refused(
        "creating a lock naming node2",
        as_me(
            &["create", "--dry-run=server", "-f", "-"],
            Some(&forged_lock),
        ),
        "a node names only itself",
    );
    // Issue 26 item 6: renaming oneself onto node2's lock (to delete it
    // while node2's live claim names the address) must mark it, and a
    // marked lock is no node's to delete.
    let mut taken = their_lock.clone();
    taken["spec"]["node"] = serde_json::json!(me);
    refused(
        "taking node2's lock over unmarked",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&taken)),
        "without setting spec.unconfirmed",
    );
    taken["spec"]["unconfirmed"] = lock_mark;
    let (ok, said) = as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&taken));
    assert!(ok, "node1 taking node2's lock over, marked: {said}");
    let own_lock = lock_of(&claim_of("mine"));
    let (ok, said) = as_me(
        &[
            "delete",
            "--dry-run=server",
            "iplock",
            own_lock["metadata"]["name"].as_str().expect("name"),
        ],
        None,
    );
    assert!(ok, "node1 deleting its own lock: {said}");

    // The node in a token stays true: node1's token may mint the
    // account's token bound to node1 (the installer's renewal), not one
    // bound to node2 (which would pass the policies as node2) or unbound.
    let mint = |bound: Option<&str>| {
        let mut args = vec!["-n", "kube-system", "create", "token", "sticky-macvlan"];
        if let Some(node) = bound {
            args.extend(["--bound-object-kind", "Node", "--bound-object-name", node]);
        }
        as_me(&args, None)
    };
    refused(
        "minting a token bound to node2",
        mint(Some(&other)),
        "may mint a token bound only to the node it runs on",
    );
    refused(
        "minting an unbound token",
        mint(None),
        "may mint a token bound only to the node it runs on",
    );
    let (ok, said) = mint(Some(&me));
    assert!(ok, "node1 minting a token bound to itself: {said}");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "node scope: {me}'s plugin token refused releasing, redirecting, deleting and forging {other}'s claim, taking it over unmarked, moving its own claim's address, deleting {other}'s lock, giving it to another identity and forging one, taking it over or re-keying it unmarked, minting a token bound to {other} or to nothing; allowed on its own claim and lock, to take {other}'s lock over marked, and to mint a token bound to {me}"
    );
}
