//! The Kubernetes side of the e2e harness: the stand-in API server in its
//! own netns behind a management bridge, and the objects kubelet and the
//! controllers would create (nodes, pods, StatefulSets), written through
//! its control socket. It stays for what a real API server cannot be made
//! to do on purpose (ARCHITECTURE.md, "Where a fake remains"); the
//! scenarios a real cluster can produce run in e2e/tests/real_cluster.rs.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{ip, target_dir, Topology};

pub const API_ADDR: &str = "192.168.254.1";
pub const API_PORT: u16 = 6443;

pub struct StandIn {
    child: Option<Child>,
    pub control: PathBuf,
    /// The kubeconfig the plugins use.
    pub kubeconfig: PathBuf,
    pub netns: String,
    /// The CNI network name the scenarios use.
    pub network: String,
    /// `ipam.store.timeoutMs` for the scenarios' plugins.
    pub request_timeout_ms: std::cell::Cell<u64>,
}

pub fn standin_binary() -> PathBuf {
    let p = target_dir().join("kube-standin");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build -p sticky-e2e)",
        p.display()
    );
    p
}

impl Topology {
    /// The management plane: a bridge in its own netns, the stand-in API
    /// server in another, and a `mgmt0` veth from every node (existing and
    /// added later) at 192.168.254.(10 + node).
    pub fn start_api(&mut self) -> StandIn {
        let mgmt = format!("{}-mgmt", self.prefix);
        let api = format!("{}-api", self.prefix);
        self.add_netns(&mgmt);
        ip(&["-n", &mgmt, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &mgmt, "link", "set", "br0", "up"]);
        self.mgmt = Some(mgmt);
        self.add_netns(&api);
        self.mgmt_link(&api, &format!("{API_ADDR}/24"));
        for i in 0..self.nodes.len() {
            let netns = self.nodes[i].netns.clone();
            self.mgmt_link(&netns, &format!("192.168.254.{}/24", 10 + i));
        }
        let control = self.state_dir.join("standin.sock");
        let log_path = std::env::var_os("STICKY_E2E_STANDIN_LOG")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.state_dir.join("standin.log"));
        let log = std::fs::File::create(log_path).expect("stand-in log file");
        let child = Command::new("ip")
            .args(["netns", "exec", &api])
            .arg(standin_binary())
            .args(["--listen", &format!("{API_ADDR}:{API_PORT}"), "--control"])
            .arg(&control)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kube-standin");
        let kubeconfig = self.state_dir.join("kubeconfig");
        let standin = StandIn {
            child: Some(child),
            control: control.clone(),
            kubeconfig: kubeconfig.clone(),
            netns: api,
            network: "macnet".into(),
            request_timeout_ms: std::cell::Cell::new(10_000),
        };
        let ca = self.state_dir.join("ca.crt");
        std::fs::write(&ca, STANDIN_CA).expect("write ca.crt");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&format!("http://{API_ADDR}:{API_PORT}"), &ca),
        )
        .expect("write kubeconfig");
        let deadline = Instant::now() + Duration::from_secs(10);
        while standin.try_request("GET", "/standin/stats", None).is_err() {
            assert!(Instant::now() < deadline, "kube-standin did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        standin.create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            sticky_ipam::kube::crd::definition(),
        );
        standin
    }

    pub(crate) fn mgmt_link(&mut self, netns: &str, addr: &str) {
        let Some(mgmt) = self.mgmt.clone() else {
            return;
        };
        self.links += 1;
        let end = format!("m{}", self.links);
        ip(&[
            "-n", &mgmt, "link", "add", &end, "type", "veth", "peer", "name", "mgmt0", "netns",
            netns,
        ]);
        ip(&["-n", &mgmt, "link", "set", &end, "master", "br0", "up"]);
        ip(&["-n", netns, "addr", "add", addr, "dev", "mgmt0"]);
        ip(&["-n", netns, "link", "set", "mgmt0", "up"]);
    }
}

/// A self-signed certificate (its key was thrown away) standing in for the
/// cluster CA that every real kubeconfig names; the stand-in speaks plain
/// HTTP, but with a CA configured the client skips loading the host's
/// trust store, as it does on a real node.
pub const STANDIN_CA: &str = include_str!("../standin-ca.pem");

/// A kubeconfig as `sticky-macvlan install` writes it (the token is sent
/// and ignored by the stand-in).
pub fn kubeconfig_yaml(server: &str, ca: &std::path::Path) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: sticky-macvlan\n  user:\n    token: e2e-token\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: sticky-macvlan\ncurrent-context: standin\n",
        ca.display()
    )
}

impl StandIn {
    /// The name of test node `i` (1-based).
    pub fn node(&self, i: usize) -> String {
        format!("node{i}")
    }

    fn try_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        let mut s = UnixStream::connect(&self.control)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: standin\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        // HTTP/1.0, so the answer is never chunked.
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw);
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let json = text
            .split_once("\r\n\r\n")
            .and_then(|(_, b)| serde_json::from_str(b).ok())
            .unwrap_or(Value::Null);
        Ok((code, json))
    }

    #[track_caller]
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.try_request(method, path, body)
            .unwrap_or_else(|e| panic!("stand-in control {method} {path}: {e}"))
    }

    #[track_caller]
    pub fn create(&self, collection: &str, obj: Value) -> Value {
        let (code, out) = self.request("POST", collection, Some(&obj));
        assert_eq!(code, 201, "create in {collection}: {out}");
        out
    }

    pub fn add_node(&self, name: &str) {
        self.create(
            "/api/v1/nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        );
    }

    /// A running pod bound to `node`; returns its UID. `owner` makes it a
    /// StatefulSet pod; `annotation` sets its sticky-macvlan identity.
    pub fn add_pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        owner: Option<(&str, &str)>,
        annotation: Option<&str>,
    ) -> String {
        let mut meta = json!({"name": name, "namespace": ns,
                              "finalizers": ["e2e.sticky-macvlan.io/kubelet"]});
        if let Some((set, uid)) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": set, "uid": uid, "controller": true}]);
        }
        if let Some(id) = annotation {
            meta["annotations"] = json!({sticky_ipam::pod::IDENTITY_ANNOTATION: id});
        }
        let pod = self.create(
            &format!("/api/v1/namespaces/{ns}/pods"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                   "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                   "status": {"phase": "Running"}}),
        );
        pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// A StatefulSet with no replicas of its own (the scenarios create its
    /// pods, bound to test nodes, as its controller would).
    pub fn add_stateful_set(&self, ns: &str, name: &str) -> String {
        let set = self.create(
            &format!("/apis/apps/v1/namespaces/{ns}/statefulsets"),
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                   "metadata": {"name": name, "namespace": ns},
                   "spec": {"replicas": 0, "serviceName": name,
                            "selector": {"matchLabels": {"e2e.sticky-macvlan.io/set": name}},
                            "template": {"metadata": {"labels": {"e2e.sticky-macvlan.io/set": name}},
                                         "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
        );
        set["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn get(&self, path: &str) -> Option<Value> {
        let (code, v) = self.request("GET", path, None);
        (code == 200).then_some(v)
    }

    fn put(&self, path: &str, obj: &Value) {
        let (code, out) = self.request("PUT", path, Some(obj));
        assert_eq!(code, 200, "update {path}: {out}");
    }

    /// What kubectl delete does: the pod turns Terminating (its finalizer
    /// stands for a kubelet that never confirms).
    pub fn delete_pod(&self, ns: &str, name: &str) {
        let (code, out) = self.request(
            "DELETE",
            &format!("/api/v1/namespaces/{ns}/pods/{name}"),
            None,
        );
        assert_eq!(code, 200, "delete pod: {out}");
    }

    /// The pod object is gone for good (force delete, or kubelet confirmed).
    pub fn remove_pod(&self, ns: &str, name: &str) {
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
        if let Some(mut pod) = self.get(&path) {
            pod["metadata"]["finalizers"] = json!([]);
            self.put(&path, &pod);
            let _ = self.request("DELETE", &path, Some(&json!({"gracePeriodSeconds": 0})));
        }
    }

    pub fn taint_out_of_service(&self, node: &str) {
        let path = format!("/api/v1/nodes/{node}");
        let mut n = self.get(&path).expect("node exists");
        n["spec"]["taints"] = json!([{"key": sticky_ipam::kube::OUT_OF_SERVICE_TAINT,
                                      "value": "nodeshutdown", "effect": "NoExecute"}]);
        n["status"]["conditions"] = json!([{"type": "Ready", "status": "Unknown"}]);
        self.put(&path, &n);
    }

    pub fn delete_stateful_set(&self, ns: &str, name: &str) {
        let _ = self.request(
            "DELETE",
            &format!("/apis/apps/v1/namespaces/{ns}/statefulsets/{name}"),
            None,
        );
    }

    /// Every IPClaim object of the scenarios' network.
    pub fn claims(&self) -> Vec<Value> {
        let selector = sticky_ipam::kube::network_selector(&self.network)
            .replace('/', "%2F")
            .replace('=', "%3D");
        let (code, list) = self.request(
            "GET",
            &format!("/apis/sticky-macvlan.io/v1alpha1/ipclaims?labelSelector={selector}"),
            None,
        );
        assert_eq!(code, 200, "list ipclaims: {list}");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Stores these claims of `network` as the plugin would have created
    /// them (the benchmark's pre-existing claims); not counted as requests.
    pub fn seed_claims(&self, network: &str, claims: Vec<sticky_ipam::claim::Claim>) {
        use sticky_ipam::kube::{crd, ClaimObject};
        for claim in claims {
            let obj = crd::to_object(&ClaimObject {
                network: network.to_string(),
                claim,
                resource_version: None,
            });
            let body = serde_json::to_value(&obj).unwrap_or(Value::Null);
            let (code, out) = self.request(
                "POST",
                "/apis/sticky-macvlan.io/v1alpha1/ipclaims",
                Some(&body),
            );
            assert_eq!(code, 201, "seed an IPClaim: {out}");
        }
    }

    /// Request counts by "verb resource" from the plugins (not the
    /// harness).
    pub fn stats(&self) -> Value {
        self.request("GET", "/standin/stats", None).1
    }

    pub fn reset_stats(&self) {
        self.request("POST", "/standin/reset", Some(&json!({})));
    }

    /// Injected 409s.
    pub fn faults(&self, conflicts: u64, conflict_every: u64) {
        self.request(
            "POST",
            "/standin/faults",
            Some(&json!({"conflicts": conflicts, "conflictEvery": conflict_every})),
        );
    }

    /// A server or transport fault: `{"fault": "error500" | "slow" |
    /// "drop", "verbs": [...], "every": N, "after": bool, "delayMs": MS}`;
    /// `{}` clears it (and the injected 409s).
    pub fn fault_plan(&self, plan: Value) {
        self.request("POST", "/standin/faults", Some(&plan));
    }

    /// Stops the API server (the API becomes unreachable).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.control);
    }
}

/// Checks I1-I3 (ARCHITECTURE.md) on the stored objects.
#[track_caller]
pub fn assert_claim_invariants(claims: &[Value]) {
    use std::collections::BTreeMap;
    let mut per_ip: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut per_identity: BTreeMap<(String, String, bool), Vec<String>> = BTreeMap::new();
    for c in claims {
        let net = c["spec"]["network"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let ip = c["spec"]["ip"].as_str().unwrap_or_default().to_string();
        *per_ip.entry((net.clone(), ip.clone())).or_default() += 1;
        let id = c["spec"]["identity"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        per_identity
            .entry((net, id, ip.contains(':')))
            .or_default()
            .push(ip);
        let sticky = c["spec"]["sticky"].as_bool().unwrap_or(false);
        assert!(
            sticky || !c["status"]["holder"].is_null(),
            "a dynamic claim without a holder was left: {c}"
        );
    }
    assert!(
        per_ip.values().all(|n| *n == 1),
        "duplicate claims: {per_ip:?}"
    );
    for (key, ips) in &per_identity {
        assert_eq!(ips.len(), 1, "identity {key:?} holds {ips:?}");
    }
}
