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

/// The claims of identity ID (a pod `ns/name`), as "ip" -> the IPClaim.
fn claims_of_identity(c: &LocalCluster, id: &str) -> BTreeMap<String, serde_json::Value> {
    c.ipclaims()
        .into_iter()
        .filter(|k| k["spec"]["identity"] == id)
        .map(|k| (k["spec"]["ip"].as_str().unwrap_or_default().to_string(), k))
        .collect()
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

mod authority;
mod chaos;
mod install_and_upgrade;
mod load_and_metrics;
mod migration;
mod split_brain;
mod statefulset;
mod unreliable_api;
