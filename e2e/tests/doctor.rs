//! `sticky-macvlan doctor` in a node netns against a real kube-apiserver
//! (etcd + kube-apiserver with RBAC, `Topology::start_api`): a healthy
//! node passes, and each planted fault is found with its fix: a wrong bin
//! dir, a token the API server rejects, a role missing a verb, a master
//! that is down, a master that is a bridge port, a DaemonSet whose image
//! is newer than the node's binaries, a missing CRD.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use sticky_e2e::kube_api::{deploy_doc, plugin_cluster_role, ApiServer, PLUGIN_GROUP};
use sticky_e2e::{configs, ip, our_plugin, Topology};

struct Doctor {
    exit: i32,
    findings: Vec<Value>,
}

impl Doctor {
    /// The findings that are not ok, as "check: what | fix".
    fn problems(&self) -> Vec<String> {
        self.findings
            .iter()
            .filter(|f| f["severity"] != "ok")
            .map(|f| {
                format!(
                    "{}: {} | {}",
                    f["check"].as_str().unwrap_or(""),
                    f["what"].as_str().unwrap_or(""),
                    f["fix"].as_str().unwrap_or("")
                )
            })
            .collect()
    }

    #[track_caller]
    fn finds(&self, check: &str, what: &str, fix: &str) {
        let found = self.problems().into_iter().any(|p| {
            let (head, fix_text) = p.split_once(" | ").unwrap_or((&p, ""));
            head.starts_with(&format!("{check}: ")) && head.contains(what) && fix_text.contains(fix)
        });
        assert!(
            found,
            "doctor did not find {check} {what:?} with a fix naming {fix:?}: {:#?}",
            self.findings
        );
        assert_eq!(self.exit, 2, "a failure exits 2: {:#?}", self.findings);
    }
}

fn doctor(topo: &Topology, args: &[&str]) -> Doctor {
    let out = Command::new("ip")
        .args(["netns", "exec", &topo.node(0).netns])
        .arg(our_plugin())
        .arg("doctor")
        .arg("--json")
        .args(args)
        .output()
        .expect("run doctor");
    let findings: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Doctor {
        exit: out.status.code().unwrap_or(-1),
        findings: findings.as_array().cloned().unwrap_or_default(),
    }
}

/// A bin dir holding this build's two binaries, as the installer leaves it.
fn bin_dir(topo: &Topology) -> String {
    let dir = topo.file("bin");
    std::fs::create_dir_all(&dir).expect("bin dir");
    for name in ["sticky-macvlan", "sticky-ipam"] {
        let from = our_plugin().with_file_name(name);
        std::fs::copy(&from, dir.join(name))
            .unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
    dir.display().to_string()
}

/// A network config on the kubernetes store of `api`, saved as a NAD's
/// spec.config would be, with `kubeconfig` and `master`.
fn network(
    topo: &Topology,
    api: &ApiServer,
    name: &str,
    kubeconfig: &Path,
    master: &str,
) -> String {
    let mut c = configs::sticky(
        master,
        &topo.file("unused"),
        json!({"store": {"type": "kubernetes", "kubeconfig": kubeconfig, "dir": topo.file("local")}}),
    );
    c["name"] = json!(api.network);
    let path = topo.file(name);
    std::fs::write(&path, c.to_string()).expect("write the config");
    path.display().to_string()
}

/// A service account whose ClusterRole is the plugin's less one verb, and
/// a token for it from the TokenRequest API.
fn kubeconfig_missing_a_verb(topo: &Topology, api: &ApiServer) -> std::path::PathBuf {
    api.create(
        "/api/v1/namespaces/default/serviceaccounts",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "short"}}),
    );
    let mut role = plugin_cluster_role();
    role["metadata"]["name"] = json!("short");
    for rule in role["rules"].as_array_mut().into_iter().flatten() {
        if rule["resources"] == json!(["iplocks"]) {
            let kept: Vec<Value> = rule["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| *v != "delete")
                .cloned()
                .collect();
            rule["verbs"] = Value::Array(kept);
        }
    }
    api.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role);
    api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "short"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "short"},
               "subjects": [{"kind": "ServiceAccount", "name": "short", "namespace": "default"}]}),
    );
    let token = api.create(
        "/api/v1/namespaces/default/serviceaccounts/short/token",
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": 3600}}),
    )["status"]["token"]
        .as_str()
        .expect("a token")
        .to_string();
    let text = std::fs::read_to_string(&api.kubeconfig).expect("the plugin's kubeconfig");
    let path = topo.file("short.kubeconfig");
    std::fs::write(&path, with_token(&text, &token)).expect("write");
    path
}

/// The kubeconfig TEXT with its token replaced.
fn with_token(text: &str, token: &str) -> String {
    text.lines()
        .map(|l| match l.split_once("token:") {
            Some((indent, _)) => format!("{indent}token: {token}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn doctor_passes_a_healthy_node_and_finds_every_planted_fault_with_its_fix() {
    let mut topo = Topology::new(1);
    let api = topo.start_api();
    let bin = bin_dir(&topo);
    let conf_dir = topo.file("net.d");
    std::fs::create_dir_all(&conf_dir).expect("conf dir");
    std::fs::write(
        conf_dir.join("00-multus.conf"),
        r#"{"cniVersion":"1.0.0","name":"multus-cni-network","type":"multus"}"#,
    )
    .expect("a config");
    let conf_dir = conf_dir.display().to_string();
    // The installer DaemonSet and the Role that lets a node read it, as
    // deploy/ has them (no controller runs, so its status stays empty).
    api.create(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles",
        deploy_doc("20-rbac.yaml", "Role", "sticky-macvlan-installer"),
    );
    api.create(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "sticky-macvlan-installer-e2e-nodes", "namespace": "kube-system"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sticky-macvlan-installer"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": PLUGIN_GROUP}]}),
    );
    let daemonset = deploy_doc("40-daemonset.yaml", "DaemonSet", "sticky-macvlan");
    api.create("/apis/apps/v1/namespaces/kube-system/daemonsets", daemonset);
    let uplink = topo.node(0).uplink.clone();
    let good = network(&topo, &api, "good.json", &api.kubeconfig, &uplink);
    let base = |config: &str| -> Vec<String> {
        [
            "--bin-dir",
            &bin,
            "--conf-dir",
            &conf_dir,
            "--config",
            config,
        ]
        .map(String::from)
        .to_vec()
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        doctor(&topo, &refs)
    };

    let healthy = run(base(&good));
    assert_eq!(
        healthy.exit,
        0,
        "a healthy node has no problem: {:?}",
        healthy.problems()
    );
    for check in [
        "bin-dir",
        "conf-dir",
        "network",
        "master",
        "store",
        "kubeconfig",
        "rbac",
        "crd",
        "daemonset",
    ] {
        assert!(
            healthy
                .findings
                .iter()
                .any(|f| f["check"] == check && f["severity"] == "ok"),
            "no ok finding of {check}: {:#?}",
            healthy.findings
        );
    }

    // 1. The runtime's bin dir is not where the binaries went.
    let mut args = base(&good);
    args[1] = topo.file("empty-bin").display().to_string();
    run(args).finds("bin-dir", "sticky-macvlan does not exist", "--bin-dir");

    // 2. A token the API server rejects.
    let text = std::fs::read_to_string(&api.kubeconfig).expect("kubeconfig");
    let rejected = topo.file("rejected.kubeconfig");
    std::fs::write(&rejected, with_token(&text, "not-a-token")).expect("write");
    let cfg = network(&topo, &api, "rejected.json", &rejected, &uplink);
    let d = run(base(&cfg));
    d.finds("kubeconfig", "rejects the credentials", "fresh one");

    // 3. A role missing a verb the plugin uses.
    let short = kubeconfig_missing_a_verb(&topo, &api);
    let cfg = network(&topo, &api, "short.json", &short, &uplink);
    run(base(&cfg)).finds(
        "rbac",
        "may not: delete iplocks.sticky-macvlan.io",
        "deploy/20-rbac.yaml",
    );

    // 4. The master is down; 5. the master is a bridge's port.
    let node = topo.node(0).netns.clone();
    ip(&[
        "-n", &node, "link", "add", "docdown0", "type", "veth", "peer", "name", "docdown1",
    ]);
    let cfg = network(&topo, &api, "down.json", &api.kubeconfig, "docdown0");
    run(base(&cfg)).finds(
        "master",
        "\"docdown0\" (the config's master) is down",
        "ip link set docdown0 up",
    );
    ip(&["-n", &node, "link", "add", "docbr0", "type", "bridge"]);
    ip(&[
        "-n", &node, "link", "set", "docdown1", "master", "docbr0", "up",
    ]);
    let cfg = network(&topo, &api, "port.json", &api.kubeconfig, "docdown1");
    run(base(&cfg)).finds("master", "is a port of a bridge", "use the bridge itself");

    // 6. A config the plugin would refuse.
    let mut bad: Value =
        serde_json::from_str(&std::fs::read_to_string(&good).expect("good")).expect("json");
    bad["mastre"] = json!(uplink);
    let bad_path = topo.file("typo.json");
    std::fs::write(&bad_path, bad.to_string()).expect("write");
    run(base(&bad_path.display().to_string())).finds("network", "mastre", "fix the config");

    // 7. The DaemonSet runs a newer image than the node's binaries, and
    // its rollout is done: the installer pod here did not run it.
    let (code, out) = api.request(
        "PATCH",
        "/apis/apps/v1/namespaces/kube-system/daemonsets/sticky-macvlan",
        Some(&json!({"spec": {"template": {"spec": {"containers": [
            {"name": "install", "image": "localhost/sticky-macvlan:9.9.9"}]}}}})),
    );
    assert_eq!(code, 200, "patch the DaemonSet's image: {out}");
    run(base(&good)).finds(
        "daemonset",
        "runs localhost/sticky-macvlan:9.9.9 (version 9.9.9) on every node",
        "delete the one on this node",
    );

    // 8. The CRDs were never installed (here: removed by the admin).
    for crd in ["ipclaims", "iplocks"] {
        let (code, out) = api.request(
            "DELETE",
            &format!(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}.sticky-macvlan.io"
            ),
            None,
        );
        assert!(
            code == 200 || code == 202,
            "delete the {crd} CRD: {code} {out}"
        );
    }
    let mut missing = None;
    for _ in 0..60 {
        let d = run(base(&good));
        if d.problems().iter().any(|p| p.starts_with("crd: ")) {
            missing = Some(d);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let d = missing.expect("doctor never saw the CRDs missing");
    d.finds(
        "crd",
        "does not know this resource",
        "sticky-macvlan crd | kubectl apply",
    );
}
