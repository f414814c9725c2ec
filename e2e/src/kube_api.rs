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

pub fn standin_binary() -> PathBuf {
    crate::built(
        target_dir().join("kube-standin"),
        "cargo build -p sticky-e2e",
    )
}

/// A program of the local cluster's build.
pub fn cluster_binary(name: &str) -> PathBuf {
    crate::built(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/cluster/bin")
            .join(name),
        "bash scripts/cluster.sh build",
    )
}

#[track_caller]
fn run(what: &str, cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a serving certificate for the API address and a service-account
/// key pair, all EC (quick to make per scenario).
fn make_pki(dir: &Path) {
    std::fs::create_dir_all(dir).expect("create pki dir");
    let f = |name: &str| dir.join(name).to_string_lossy().to_string();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    run(
        "make the test CA",
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=sticky-e2e-ca",
            ])
            .args(ec)
            .args(["-keyout", &f("ca.key"), "-out", &f("ca.crt")]),
    );
    run(
        "make the API server's key",
        Command::new("openssl")
            .args(["req", "-new", "-nodes", "-subj", "/CN=kube-apiserver"])
            .args(ec)
            .args(["-keyout", &f("apiserver.key"), "-out", &f("apiserver.csr")]),
    );
    std::fs::write(
        dir.join("apiserver.ext"),
        format!("basicConstraints=CA:FALSE\nsubjectAltName=IP:{API_ADDR},IP:127.0.0.1\n"),
    )
    .expect("write apiserver.ext");
    run(
        "sign the API server's certificate",
        Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in", &f("apiserver.csr")])
            .args([
                "-CA",
                &f("ca.crt"),
                "-CAkey",
                &f("ca.key"),
                "-CAcreateserial",
            ])
            .args(["-extfile", &f("apiserver.ext"), "-out", &f("apiserver.crt")]),
    );
    run(
        "make the service-account key",
        Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-out", &f("sa.key")]),
    );
    run(
        "derive the service-account public key",
        Command::new("openssl").args([
            "pkey",
            "-in",
            &f("sa.key"),
            "-pubout",
            "-out",
            &f("sa.pub"),
        ]),
    );
    std::fs::write(
        dir.join("tokens.csv"),
        format!(
            "{ADMIN_TOKEN},e2e-admin,e2e-admin,system:masters\n{PLUGIN_TOKEN},{PLUGIN_USER},{PLUGIN_USER},{PLUGIN_GROUP}\n"
        ),
    )
    .expect("write tokens.csv");
    // Only the plugins' requests are recorded: they are what is counted.
    std::fs::write(
        dir.join("audit-policy.yaml"),
        format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users: [{PLUGIN_USER}]\n- level: None\n"
        ),
    )
    .expect("write audit-policy.yaml");
}

fn spawn_in(netns: &str, program: &Path, args: &[&str], log: &Path) -> Child {
    let log = std::fs::File::create(log).expect("server log file");
    Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
}

impl Topology {
    /// The management plane: a bridge in its own netns, the API server's
    /// netns, and a `mgmt0` veth from every node (existing and added
    /// later) at 192.168.254.(10 + node).
    fn management_plane(&mut self) -> String {
        let mgmt = format!("{}-mgmt", self.prefix);
        let api = format!("{}-api", self.prefix);
        self.add_netns(&mgmt);
        ip(&["-n", &mgmt, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &mgmt, "link", "set", "br0", "up"]);
        self.mgmt = Some(mgmt);
        self.add_netns(&api);
        ip(&["-n", &api, "link", "set", "lo", "up"]);
        self.mgmt_link(&api, &format!("{API_ADDR}/24"));
        for i in 0..self.nodes.len() {
            let netns = self.nodes[i].netns.clone();
            self.mgmt_link(&netns, &format!("192.168.254.{}/24", 10 + i));
        }
        api
    }

    /// The real API server: etcd and kube-apiserver in the API netns, the
    /// IPClaim CRD installed and deploy/20-rbac.yaml's ClusterRole bound to
    /// the plugins' token.
    pub fn start_api(&mut self) -> ApiServer {
        let etcd_bin = cluster_binary("etcd");
        let apiserver_bin = cluster_binary("kube-apiserver");
        let api = self.management_plane();
        let pki = self.state_dir.join("pki");
        make_pki(&pki);
        let p = |name: &str| pki.join(name).to_string_lossy().to_string();
        let state = |name: &str| self.state_dir.join(name).to_string_lossy().to_string();
        let etcd_args = [
            "--name",
            "e2e",
            "--data-dir",
            &state("etcd"),
            "--listen-client-urls",
            "http://127.0.0.1:2379",
            "--advertise-client-urls",
            "http://127.0.0.1:2379",
            "--listen-peer-urls",
            "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:2380",
            "--initial-cluster",
            "e2e=http://127.0.0.1:2380",
            "--unsafe-no-fsync",
        ];
        let etcd = spawn_in(
            &api,
            &etcd_bin,
            &etcd_args,
            &self.state_dir.join("etcd.log"),
        );
        let audit_log = self.state_dir.join("audit.log");
        let audit_path = audit_log.to_string_lossy().to_string();
        let apiserver_args = [
            "--etcd-servers",
            "http://127.0.0.1:2379",
            "--bind-address",
            "0.0.0.0",
            "--advertise-address",
            API_ADDR,
            "--secure-port",
            "6443",
            "--tls-cert-file",
            &p("apiserver.crt"),
            "--tls-private-key-file",
            &p("apiserver.key"),
            "--token-auth-file",
            &p("tokens.csv"),
            "--authorization-mode",
            "RBAC",
            "--service-cluster-ip-range",
            "10.254.0.0/24",
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            &p("sa.pub"),
            "--service-account-signing-key-file",
            &p("sa.key"),
            "--audit-policy-file",
            &p("audit-policy.yaml"),
            "--audit-log-path",
            &audit_path,
            "--audit-log-mode",
            "blocking",
            "--cert-dir",
            &state("apiserver-certs"),
            "--profiling=false",
        ];
        let apiserver = spawn_in(
            &api,
            &apiserver_bin,
            &apiserver_args,
            &self.state_dir.join("kube-apiserver.log"),
        );
        let kubeconfig = self.state_dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(
                &format!("https://{API_ADDR}:{API_PORT}"),
                &pki.join("ca.crt"),
            ),
        )
        .expect("write kubeconfig");
        let admin_kubeconfig = self.state_dir.join("kubeconfig-admin");
        std::fs::write(
            &admin_kubeconfig,
            kubeconfig_yaml(
                &format!("https://{API_ADDR}:{API_PORT}"),
                &pki.join("ca.crt"),
            )
            .replace(PLUGIN_TOKEN, ADMIN_TOKEN),
        )
        .expect("write the admin kubeconfig");
        let api = ApiServer {
            admin_kubeconfig,
            backend: ServerKind::Real {
                etcd,
                apiserver,
                audit_log,
                counted_from: std::cell::Cell::new(0),
            },
            kubeconfig,
            netns: api,
            network: "macnet".into(),
            request_timeout_ms: std::cell::Cell::new(10_000),
            namespaces: std::cell::RefCell::new(["default".to_string()].into()),
        };
        api.wait_until("kube-apiserver to be ready", Duration::from_secs(90), |a| {
            a.try_request("GET", "/readyz", None)
                .is_ok_and(|(code, _)| code == 200)
        });
        api.install_crd();
        api.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            plugin_cluster_role(),
        );
        api.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "sticky-macvlan-e2e-nodes"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "sticky-macvlan"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": PLUGIN_GROUP}]}),
        );
        // No controller-manager runs, so nobody makes the namespace's
        // default service account, which pod admission requires.
        api.create(
            "/api/v1/namespaces/default/serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        );
        api
    }

    /// Our stand-in API server, for the faults a real one cannot be made
    /// to produce.
    pub fn start_standin(&mut self) -> ApiServer {
        let api = self.management_plane();
        let control = self.state_dir.join("standin.sock");
        let log_path = std::env::var_os("STICKY_E2E_STANDIN_LOG")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.state_dir.join("standin.log"));
        let listen = format!("{API_ADDR}:{API_PORT}");
        let control_path = control.to_string_lossy().to_string();
        let args = ["--listen", &listen, "--control", &control_path];
        let child = spawn_in(&api, &standin_binary(), &args, &log_path);
        let kubeconfig = self.state_dir.join("kubeconfig");
        let standin = ApiServer {
            backend: ServerKind::StandIn { child, control },
            kubeconfig: kubeconfig.clone(),
            admin_kubeconfig: kubeconfig.clone(),
            netns: api,
            network: "macnet".into(),
            request_timeout_ms: std::cell::Cell::new(10_000),
            namespaces: std::cell::RefCell::new(["default".to_string()].into()),
        };
        let ca = self.state_dir.join("ca.crt");
        std::fs::write(&ca, STANDIN_CA).expect("write ca.crt");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&format!("http://{API_ADDR}:{API_PORT}"), &ca),
        )
        .expect("write kubeconfig");
        standin.wait_until("kube-standin to start", Duration::from_secs(10), |a| {
            a.try_request("GET", "/standin/stats", None).is_ok()
        });
        standin.install_crd();
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

    #[track_caller]
    pub fn create(&self, collection: &str, obj: Value) -> Value {
        let (code, out) = self.request("POST", collection, Some(&obj));
        assert_eq!(code, 201, "create in {collection}: {out}");
        out
    }

    /// What kubelet reports: the real server takes status only through the
    /// status subresource.
    #[track_caller]
    fn set_status(&self, path: &str, status: Value) {
        if !self.is_real() {
            return;
        }
        let (code, out) = self.request(
            "PATCH",
            &format!("{path}/status"),
            Some(&json!({ "status": status })),
        );
        assert_eq!(code, 200, "patch {path}/status: {out}");
    }

    pub fn add_node(&self, name: &str) {
        let status = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        self.create(
            "/api/v1/nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status}),
        );
        self.set_status(&format!("/api/v1/nodes/{name}"), status);
    }

    /// A running pod bound to `node`; returns its UID. `owner` makes it a
    /// StatefulSet pod; `annotation` sets its sticky-macvlan identity. Its
    /// finalizer stands for the kubelet that has to confirm a deletion.
    pub fn add_pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        owner: Option<(&str, &str)>,
        annotation: Option<&str>,
    ) -> String {
        self.ensure_namespace(ns);
        let mut meta = json!({"name": name, "namespace": ns,
                              "finalizers": ["e2e.sticky-macvlan.io/kubelet"]});
        if let Some((set, uid)) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": set, "uid": uid, "controller": true}]);
        }
        if let Some(id) = annotation {
            meta["annotations"] = json!({sticky_ipam::pod::IDENTITY_ANNOTATION: id});
        }
        let status = json!({"phase": "Running"});
        let pod = self.create(
            &format!("/api/v1/namespaces/{ns}/pods"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                   "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                   "status": status}),
        );
        self.set_status(&format!("/api/v1/namespaces/{ns}/pods/{name}"), status);
        pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// A StatefulSet with no replicas of its own (the scenarios create its
    /// pods, bound to test nodes, as its controller would).
    pub fn add_stateful_set(&self, ns: &str, name: &str) -> String {
        self.ensure_namespace(ns);
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
        assert!(code == 200 || code == 202, "delete pod: {code} {out}");
    }

    /// The pod object is gone for good (force delete, or kubelet confirmed).
    pub fn remove_pod(&self, ns: &str, name: &str) {
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
        if let Some(mut pod) = self.get(&path) {
            pod["metadata"]["finalizers"] = json!([]);
            self.put(&path, &pod);
            let _ = self.request(
                "DELETE",
                &path,
                Some(
                    &json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}),
                ),
            );
        }
    }

    /// The out-of-service taint an operator puts on a dead node, with the
    /// Ready condition the node lifecycle controller would have set.
    pub fn taint_out_of_service(&self, node: &str) {
        let path = format!("/api/v1/nodes/{node}");
        let mut n = self.get(&path).expect("node exists");
        let status = json!({"conditions": [{"type": "Ready", "status": "Unknown"}]});
        n["spec"]["taints"] = json!([{"key": sticky_ipam::kube::OUT_OF_SERVICE_TAINT,
                                      "value": "nodeshutdown", "effect": "NoExecute"}]);
        n["status"] = status.clone();
        self.put(&path, &n);
        self.set_status(&path, status);
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
        let claims = list["items"].as_array().cloned().unwrap_or_default();
        // The locks as of the same revision (a consistent snapshot on the
        // real server): every claim's address is locked for its identity.
        let rv = list["metadata"]["resourceVersion"].as_str().unwrap_or("");
        let (code, locks) = self.request(
            "GET",
            &format!("/apis/sticky-macvlan.io/v1alpha1/iplocks?labelSelector={selector}&resourceVersion={rv}&resourceVersionMatch=Exact"),
            None,
        );
        assert_eq!(code, 200, "list iplocks: {locks}");
        let locks: std::collections::BTreeMap<String, String> = locks["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| {
                (
                    l["spec"]["ip"].as_str().unwrap_or_default().to_string(),
                    l["spec"]["identity"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        for c in &claims {
            let ip = c["spec"]["ip"].as_str().unwrap_or_default();
            assert_eq!(
                locks.get(ip).map(String::as_str),
                c["spec"]["identity"].as_str(),
                "the claim on {ip} has no lock of its identity: {c}"
            );
        }
        claims
    }

    /// Stores these claims of `network` as the plugin would have created
    /// them, lock then claim (the benchmark's pre-existing claims), from 8
    /// threads in the API's netns with the harness's credentials: not
    /// counted as the plugins' requests.
    pub fn seed_claims(&self, network: &str, claims: Vec<sticky_ipam::claim::Claim>) {
        use sticky_ipam::kube::client::KubeClient;
        use sticky_ipam::kube::{ClaimObject, KubeApi as _, LockObject};
        const THREADS: usize = 8;
        let chunk = claims.len().div_ceil(THREADS).max(1);
        let (netns, kubeconfig) = (&self.netns, &self.admin_kubeconfig);
        std::thread::scope(|scope| {
            for part in claims.chunks(chunk) {
                scope.spawn(move || {
                    crate::enter_netns(netns);
                    let client = KubeClient::from_kubeconfig(kubeconfig, Duration::from_secs(30))
                        .unwrap_or_else(|e| panic!("seeding client: {e}"));
                    for claim in part {
                        let lock = client
                            .create_lock(&LockObject {
                                network: network.to_string(),
                                ip: claim.ip,
                                identity: claim.identity.clone(),
                                created: claim.created,
                                uid: None,
                                node: claim.holder_node().map(str::to_string),
                                unconfirmed: None,
                                resource_version: None,
                                adoptions: 0,
                                written: None,
                            })
                            .unwrap_or_else(|e| panic!("seed the IPLock of {}: {e}", claim.ip));
                        client
                            .create_claim(&ClaimObject {
                                network: network.to_string(),
                                claim: claim.clone(),
                                resource_version: None,
                                lock_uid: lock.uid,
                            })
                            .unwrap_or_else(|e| panic!("seed the IPClaim of {}: {e}", claim.ip));
                    }
                });
            }
        });
    }

    /// CPU time so far (user + system, ms) and resident memory (MiB) of
    /// kube-apiserver and of etcd; None on the stand-in.
    pub fn server_usage(&self) -> Option<[(f64, f64); 2]> {
        let ServerKind::Real {
            etcd, apiserver, ..
        } = &self.backend
        else {
            return None;
        };
        let usage = |pid: u32| -> (f64, f64) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Fields after the command name, which is in parentheses.
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            // utime and stime are fields 14 and 15, i.e. 11 and 12 after ')'.
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            let cpu_ms = (ticks(11) + ticks(12)) * 1e3 / hz.max(1.0);
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let rss_kib = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .unwrap_or(0.0);
            (cpu_ms, rss_kib / 1024.0)
        };
        Some([usage(apiserver.id()), usage(etcd.id())])
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

/// "verb resource" counts of an audit log's ResponseComplete events (the
/// policy records only the plugins' user).
fn audit_counts(log: &[u8]) -> std::collections::BTreeMap<String, u64> {
    let mut counts = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(log).lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if event["stage"] != "ResponseComplete" || event["user"]["username"] != PLUGIN_USER {
            continue;
        }
        let verb = event["verb"].as_str().unwrap_or("?");
        let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
        *counts.entry(format!("{verb} {resource}")).or_default() += 1;
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
