//! Starting an API server for a scenario: the real etcd and
//! kube-apiserver (their PKI, audit log and RBAC) or the stand-in, in the
//! management netns.

use super::*;

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

/// A CNI plugin of the local cluster's build (target/cluster/cni: the
/// reference plugins 1.10.0 and Whereabouts).
pub fn cluster_cni_plugin(name: &str) -> PathBuf {
    crate::built(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/cluster/cni")
            .join(name),
        "bash scripts/cluster.sh build",
    )
}

#[track_caller]
pub(super) fn run(what: &str, cmd: &mut Command) {
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
pub(super) fn make_pki(dir: &Path) {
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

pub(super) fn spawn_in(netns: &str, program: &Path, args: &[&str], log: &Path) -> Child {
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
    pub(super) fn management_plane(&mut self) -> String {
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
