//! The Kubernetes side of the e2e harness: an API server in its own netns
//! behind a management bridge, and the objects kubelet and the controllers
//! would create (nodes, pods, StatefulSets). `start_api` runs the real one,
//! etcd and kube-apiserver from the local cluster's build
//! (scripts/cluster.sh build), with RBAC and deploy/20-rbac.yaml's
//! ClusterRole bound to the plugins' token; no controller or kubelet runs,
//! so each scenario plays them by writing objects as they would (a pod
//! bound to a node, its status, a taint). `start_standin` runs our
//! stand-in, kept only for what a real API server cannot be made to do on
//! purpose (ARCHITECTURE.md, "Where a fake remains"): injected 409s and
//! planned server faults.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{ip, target_dir, Topology};

mod bulk;
mod objects;
mod start;

pub use bulk::{whereabouts_module, BulkRequest};
pub use start::{cluster_binary, cluster_cni_plugin, standin_binary};

pub const API_ADDR: &str = "192.168.254.1";
pub const API_PORT: u16 = 6443;
/// The static token of the plugins' user, bound to deploy/20-rbac.yaml's
/// ClusterRole through its group.
const PLUGIN_TOKEN: &str = "e2e-token";
const PLUGIN_USER: &str = "sticky-macvlan-e2e-node";
pub const PLUGIN_GROUP: &str = "sticky-macvlan:e2e-nodes";
const ADMIN_TOKEN: &str = "e2e-admin-token";

enum ServerKind {
    /// etcd and kube-apiserver; requests counted from the audit log, from
    /// `counted_from` bytes on.
    Real {
        etcd: Child,
        apiserver: Child,
        audit_log: PathBuf,
        counted_from: std::cell::Cell<u64>,
    },
    StandIn {
        child: Child,
        control: PathBuf,
    },
    Stopped,
}

pub struct ApiServer {
    backend: ServerKind,
    /// The kubeconfig the plugins use.
    pub kubeconfig: PathBuf,
    /// The harness's own (system:masters on the real server), for bulk
    /// loads that the plugins' RBAC and request counts must not see.
    admin_kubeconfig: PathBuf,
    pub netns: String,
    /// The CNI network name the scenarios use.
    pub network: String,
    /// `ipam.store.timeoutMs` for the scenarios' plugins.
    pub request_timeout_ms: std::cell::Cell<u64>,
    /// Namespaces made so far (the real server has only the built-in ones).
    namespaces: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

/// A self-signed certificate (its key was thrown away) standing in for the
/// cluster CA that every real kubeconfig names; the stand-in speaks plain
/// HTTP, but with a CA configured the client skips loading the host's
/// trust store, as it does on a real node.
pub const STANDIN_CA: &str = include_str!("../../standin-ca.pem");

/// The node plugin's ClusterRole, as deploy/20-rbac.yaml defines it.
pub fn plugin_cluster_role() -> Value {
    deploy_doc("20-rbac.yaml", "ClusterRole", "sticky-macvlan")
}

/// The documents of deploy/FILE (the install set).
pub fn deploy_docs(file: &str) -> Vec<Value> {
    let path = crate::repo_root().join("deploy").join(file);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// The object of KIND named NAME in deploy/FILE.
pub fn deploy_doc(file: &str, kind: &str, name: &str) -> Value {
    deploy_docs(file)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("deploy/{file} has no {kind} {name}"))
}

/// A kubeconfig as `sticky-macvlan install` writes it (the stand-in
/// ignores the token).
pub fn kubeconfig_yaml(server: &str, ca: &std::path::Path) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: sticky-macvlan\n  user:\n    token: {PLUGIN_TOKEN}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: sticky-macvlan\ncurrent-context: e2e\n",
        ca.display()
    )
}

/// The status line and JSON body of a raw HTTP/1.0 answer.
fn parse_answer(raw: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(raw);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (code, json)
}

impl ApiServer {
    /// Namespace `ns` with the default service account pod admission wants
    /// (no controller makes it here); once per namespace.
    fn ensure_namespace(&self, ns: &str) {
        if !self.is_real() || !self.namespaces.borrow_mut().insert(ns.to_string()) {
            return;
        }
        let (code, out) = self.request(
            "POST",
            "/api/v1/namespaces",
            Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})),
        );
        assert!(code == 201 || code == 409, "create namespace {ns}: {out}");
        let (code, out) = self.request(
            "POST",
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            Some(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})),
        );
        assert!(code == 201 || code == 409, "create {ns}/default: {out}");
    }

    /// The name of test node `i` (1-based).
    pub fn node(&self, i: usize) -> String {
        format!("node{i}")
    }

    /// Whether this is the real kube-apiserver (not the stand-in).
    pub fn is_real(&self) -> bool {
        matches!(self.backend, ServerKind::Real { .. })
    }

    /// A request as the cluster admin (the harness's own requests, never
    /// counted). PATCH sends a JSON merge patch.
    fn try_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        self.try_request_with(method, path, body, &[])
    }

    /// A request as the `sticky-macvlan` service account (the real server
    /// only), through the admin's impersonation: with NODE, as a token
    /// bound to that node carries it (the user's
    /// `authentication.kubernetes.io/node-name` extra); without, as a
    /// token that names no node (its credential ID only, as an unbound
    /// or secret-bound token carries). The account is given the plugins' group,
    /// so deploy/20-rbac.yaml's ClusterRole applies.
    #[track_caller]
    pub fn request_as_plugin(
        &self,
        node: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        assert!(self.is_real(), "impersonation needs the real API server");
        let mut headers = vec![
            "Impersonate-User: system:serviceaccount:kube-system:sticky-macvlan".to_string(),
            format!("Impersonate-Group: {PLUGIN_GROUP}"),
            "Impersonate-Group: system:serviceaccounts".to_string(),
        ];
        match node {
            Some(node) => headers.push(format!(
                "Impersonate-Extra-authentication.kubernetes.io%2Fnode-name: {node}"
            )),
            // What every service-account JWT carries, bound or not.
            None => headers.push(
                "Impersonate-Extra-authentication.kubernetes.io%2Fcredential-id: JTI=e2e".into(),
            ),
        }
        self.try_request_with(method, path, body, &headers)
            .unwrap_or_else(|e| panic!("API {method} {path} as the plugin of {node:?}: {e}"))
    }

    fn try_request_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[String],
    ) -> std::io::Result<(u16, Value)> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let content_type = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        match &self.backend {
            ServerKind::StandIn { control, .. } => {
                let mut s = UnixStream::connect(control)?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                write!(
                    s,
                    "{method} {path} HTTP/1.0\r\nHost: standin\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )?;
                // HTTP/1.0, so the answer is never chunked.
                let mut raw = Vec::new();
                s.read_to_end(&mut raw)?;
                Ok(parse_answer(&raw))
            }
            ServerKind::Real { .. } => {
                let mut child = Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        &self.netns,
                        "curl",
                        "-sS",
                        "-k",
                        "-i",
                        "--http1.1",
                    ])
                    .args(["--max-time", "20", "-X", method])
                    .args(["-H", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
                    .args(headers.iter().flat_map(|h| ["-H", h.as_str()]))
                    .args([
                        "-H",
                        &format!("Content-Type: {content_type}"),
                        "-H",
                        "Expect:",
                    ])
                    .args(["--data-binary", "@-"])
                    .arg(format!("https://127.0.0.1:{API_PORT}{path}"))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()?;
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(body.as_bytes())?;
                }
                let out = child.wait_with_output()?;
                if !out.status.success() {
                    return Err(std::io::Error::other(
                        String::from_utf8_lossy(&out.stderr).to_string(),
                    ));
                }
                Ok(parse_answer(&out.stdout))
            }
            ServerKind::Stopped => Err(std::io::Error::other("the API server was stopped")),
        }
    }

    #[track_caller]
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.try_request(method, path, body)
            .unwrap_or_else(|e| panic!("API {method} {path}: {e}"))
    }

    #[track_caller]
    fn wait_until(&self, what: &str, limit: Duration, ready: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            if Instant::now() > deadline {
                let dir = self
                    .kubeconfig
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                let tail = |name: &str| {
                    let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    lines[lines.len().saturating_sub(15)..].join("\n")
                };
                panic!(
                    "timed out waiting for {what}\nkube-apiserver.log:\n{}\netcd.log:\n{}",
                    tail("kube-apiserver.log"),
                    tail("etcd.log")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The IPClaim and IPLock CRDs, served once the server says so.
    fn install_crd(&self) {
        for crd in sticky_ipam::kube::crd::definitions() {
            self.create(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                crd,
            );
        }
        self.wait_until("the CRDs to be served", Duration::from_secs(30), |a| {
            ["ipclaims", "iplocks"].iter().all(|plural| {
                a.try_request(
                    "GET",
                    &format!("/apis/sticky-macvlan.io/v1alpha1/{plural}?limit=1"),
                    None,
                )
                .is_ok_and(|(code, _)| code == 200)
            })
        });
    }

    /// CPU time so far (user + system, ms) and resident memory (MiB) of
    /// kube-apiserver and of etcd; None on the stand-in.
    pub fn server_usage(&self) -> Option<[(f64, f64); 2]> {
        let pids = self.server_pids()?;
        Some(pids.map(|pid| {
            let u = process_usage(pid);
            (u.cpu_ms, u.rss_mib)
        }))
    }

    /// The real server's processes: kube-apiserver, etcd.
    pub fn server_pids(&self) -> Option<[u32; 2]> {
        match &self.backend {
            ServerKind::Real {
                etcd, apiserver, ..
            } => Some([apiserver.id(), etcd.id()]),
            _ => None,
        }
    }

    /// Request counts by "verb resource" from the plugins (not the
    /// harness): on the real server, from its audit log.
    pub fn stats(&self) -> Value {
        match &self.backend {
            ServerKind::Real {
                audit_log,
                counted_from,
                ..
            } => {
                let log = std::fs::read(audit_log).unwrap_or_default();
                let from = (counted_from.get() as usize).min(log.len());
                json!(audit_counts(&log[from..]))
            }
            _ => self.request("GET", "/standin/stats", None).1,
        }
    }

    /// The plugins' requests since `reset_stats` by "verb resource code"
    /// (the answer's HTTP status), from the real server's audit log: how
    /// many of them were answered 409, and where.
    pub fn answers(&self) -> std::collections::BTreeMap<String, u64> {
        let ServerKind::Real {
            audit_log,
            counted_from,
            ..
        } = &self.backend
        else {
            return Default::default();
        };
        let log = std::fs::read(audit_log).unwrap_or_default();
        let from = (counted_from.get() as usize).min(log.len());
        let mut counts = std::collections::BTreeMap::new();
        for event in plugin_events(&log[from..]) {
            let code = event["responseStatus"]["code"].as_u64().unwrap_or(0);
            *counts
                .entry(format!("{} {code}", verb_resource(&event)))
                .or_default() += 1;
        }
        counts
    }

    pub fn reset_stats(&self) {
        match &self.backend {
            ServerKind::Real {
                audit_log,
                counted_from,
                ..
            } => counted_from.set(std::fs::metadata(audit_log).map(|m| m.len()).unwrap_or(0)),
            _ => {
                self.request("POST", "/standin/reset", Some(&json!({})));
            }
        }
    }

    #[track_caller]
    fn standin_only(&self, what: &str) {
        assert!(
            !self.is_real(),
            "{what} needs the stand-in (Topology::start_standin): a real API server cannot be told to"
        );
    }

    /// Injected 409s.
    #[track_caller]
    pub fn faults(&self, conflicts: u64, conflict_every: u64) {
        self.standin_only("injected 409s");
        self.request(
            "POST",
            "/standin/faults",
            Some(&json!({"conflicts": conflicts, "conflictEvery": conflict_every})),
        );
    }

    /// A server or transport fault: `{"fault": "error500" | "slow" |
    /// "drop", "verbs": [...], "every": N, "after": bool, "delayMs": MS}`;
    /// `{}` clears it (and the injected 409s).
    #[track_caller]
    pub fn fault_plan(&self, plan: Value) {
        self.standin_only("a planned server fault");
        self.request("POST", "/standin/faults", Some(&plan));
    }

    /// The pid of the process that answers the API (to SIGSTOP it).
    pub fn server_pid(&self) -> Option<u32> {
        match &self.backend {
            ServerKind::Real { apiserver, .. } => Some(apiserver.id()),
            ServerKind::StandIn { child, .. } => Some(child.id()),
            ServerKind::Stopped => None,
        }
    }

    /// Stops the API server (the API becomes unreachable).
    pub fn stop(&mut self) {
        match std::mem::replace(&mut self.backend, ServerKind::Stopped) {
            ServerKind::Real {
                mut etcd,
                mut apiserver,
                ..
            } => {
                for c in [&mut apiserver, &mut etcd] {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            ServerKind::StandIn { mut child, control } => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(control);
            }
            ServerKind::Stopped => {}
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What /proc says of a process: CPU time so far, resident memory now and
/// its peak since start or since `reset_peak`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessUsage {
    /// user + system, ms
    pub cpu_ms: f64,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
}

pub fn process_usage(pid: u32) -> ProcessUsage {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after ')'.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    ProcessUsage {
        cpu_ms: (ticks(11) + ticks(12)) * 1e3 / hz.max(1.0),
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_rss_mib: kib("VmHWM:") / 1024.0,
    }
}

/// Starts a process's peak resident set (VmHWM) again from its current
/// one (`clear_refs` 5, Linux 4.0+).
pub fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// The plugins' ResponseComplete events of an audit log (the policy
/// records only the plugins' user).
fn plugin_events(log: &[u8]) -> impl Iterator<Item = Value> + '_ {
    log.split(|b| *b == b'\n').filter_map(|line| {
        let event: Value = serde_json::from_slice(line).ok()?;
        (event["stage"] == "ResponseComplete" && event["user"]["username"] == PLUGIN_USER)
            .then_some(event)
    })
}

fn verb_resource(event: &Value) -> String {
    let verb = event["verb"].as_str().unwrap_or("?");
    let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
    format!("{verb} {resource}")
}

/// "verb resource" counts of an audit log's plugin requests.
fn audit_counts(log: &[u8]) -> std::collections::BTreeMap<String, u64> {
    let mut counts = std::collections::BTreeMap::new();
    for event in plugin_events(log) {
        *counts.entry(verb_resource(&event)).or_default() += 1;
    }
    counts
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
