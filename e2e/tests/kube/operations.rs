//! What an operator and the installer do on the kubernetes store, and the
//! secrets that never reach a log.

use super::*;

/// `sticky-macvlan install` as the DaemonSet runs it: binaries copied and
/// runnable, a kubeconfig naming the host paths of a private token and CA
/// copy, the node name recorded.
#[test]
fn installer_lays_out_a_node() {
    let root = std::env::temp_dir().join(format!("smv-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let sa = root.join("sa");
    std::fs::create_dir_all(&sa).expect("sa dir");
    std::fs::write(sa.join("token"), "token-1").expect("token");
    std::fs::write(sa.join("namespace"), "kube-system").expect("namespace");
    std::fs::write(sa.join("ca.crt"), "-----BEGIN CERTIFICATE-----\n").expect("ca");
    let (bin, conf) = (
        root.join("host/opt/cni/bin"),
        root.join("host/etc/cni/net.d"),
    );
    let out = Command::new(our_plugin())
        .arg("install")
        .args(["--cni-bin-dir".as_ref(), bin.as_os_str()])
        .args(["--cni-conf-dir".as_ref(), conf.as_os_str()])
        .args(["--service-account".as_ref(), sa.as_os_str()])
        .args(["--node-name", "node7"])
        // Nothing listens there (loopback only): the node-bound token
        // cannot be had, and install falls back to the pod's token.
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", "1")
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run install");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let installed = Command::new(bin.join("sticky-macvlan"))
        .arg("version")
        .output()
        .expect("run copy");
    assert!(String::from_utf8_lossy(&installed.stdout).contains("sticky-macvlan"));
    let dir = conf.join("sticky-macvlan.d");
    let kubeconfig =
        std::fs::read_to_string(dir.join("sticky-macvlan.kubeconfig")).expect("kubeconfig");
    assert!(
        kubeconfig.contains("server: https://127.0.0.1:1"),
        "{kubeconfig}"
    );
    assert!(
        kubeconfig.contains("tokenFile: /etc/cni/net.d/sticky-macvlan.d/token"),
        "{kubeconfig}"
    );
    assert!(kubeconfig.contains("certificate-authority: /etc/cni/net.d/sticky-macvlan.d/ca.crt"));
    assert_eq!(
        std::fs::read_to_string(dir.join("nodename")).expect("nodename"),
        "node7\n"
    );
    // Without a node-bound token it copies the pod's, and says what that
    // costs.
    assert_eq!(
        std::fs::read_to_string(dir.join("token")).expect("token"),
        "token-1"
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("no node-bound token") && said.contains("DaemonSet rollout"),
        "{said}"
    );
    use std::os::unix::fs::PermissionsExt;
    for (file, mode) in [("token", 0o600), ("sticky-macvlan.kubeconfig", 0o600)] {
        let m = std::fs::metadata(dir.join(file))
            .expect("stat")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(m, mode, "{file}");
    }
    assert_eq!(
        std::fs::metadata(&dir).expect("stat").permissions().mode() & 0o777,
        0o700
    );
    // Outside a pod it says what is missing.
    let out = Command::new(our_plugin())
        .args(["install", "--cni-bin-dir"])
        .arg(&bin)
        .args(["--cni-conf-dir".as_ref(), conf.as_os_str()])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run install");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("KUBERNETES_SERVICE_HOST"));
    let _ = std::fs::remove_dir_all(&root);
}

/// The operator CLI on the kubernetes store: `claims` shows who holds
/// what, `reconcile` releases holders whose pods are gone and retires the
/// sticky claims of a deleted StatefulSet, `release` refuses a live holder.
#[test]
fn operator_cli_on_the_kubernetes_store() {
    let (mut topo, api) = nodes_on_api(1);
    let set_uid = api.add_stateful_set(NS, "db");
    let uid0 = api.add_pod(NS, "db-0", &api.node(1), Some(("db", &set_uid)), None);
    let uid1 = api.add_pod(NS, "db-1", &api.node(1), Some(("db", &set_uid)), None);
    let p0 = topo.add_pod("db-0");
    let p1 = topo.add_pod("db-1");
    let ip0 =
        add_on_node(&topo, &api, 0, &p0, "db0", &pod_args_in_ns("db-0", &uid0)).first_address();
    let ip1 =
        add_on_node(&topo, &api, 0, &p1, "db1", &pod_args_in_ns("db-1", &uid1)).first_address();
    let (ok, table) = cli_on_node1(&topo, &api, &["claims"]);
    assert!(ok, "{table}");
    assert!(
        table.contains(&ip0) && table.contains("default/db-0") && table.contains("held"),
        "{table}"
    );

    let (ok, out) = cli_on_node1(
        &topo,
        &api,
        &["release", "--network", &api.network, "--ip", &ip0],
    );
    assert!(!ok && out.contains("still running"), "{out}");

    // db-1's netns is gone while its pod object still runs in the API:
    // `claims` judges from the API alone unless a node is named, so its
    // verdict does not depend on where it runs, and it says so.
    let p1_ns = p1.netns.clone();
    topo.delete_netns(&p1_ns);
    let state_of = |json: &str, ip: &str| -> (String, String, String) {
        let all: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
        let row = all
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["claim"]["ip"] == ip)
            .cloned()
            .unwrap_or_default();
        let text = |k: &str| row[k].as_str().unwrap_or_default().to_string();
        (text("state"), text("reason"), text("judgedFrom"))
    };
    let anywhere = Command::new("ip")
        .args(["netns", "exec", &topo.node(0).netns])
        .arg(our_plugin())
        .args(["claims", "--json", "--kubeconfig"])
        .arg(&api.kubeconfig)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run the CLI");
    let (state, reason, from) = state_of(&String::from_utf8_lossy(&anywhere.stdout), &ip1);
    assert_eq!(
        (state.as_str(), from.as_str()),
        ("held", "the kubernetes API"),
        "{reason}"
    );
    let (ok, json) = cli_on_node1(&topo, &api, &["claims", "--json"]);
    assert!(ok, "{json}");
    let (state, reason, from) = state_of(json.lines().next().unwrap_or_default(), &ip1);
    assert_eq!(state, "dead", "{reason}");
    assert!(
        reason.contains("netns") && from.starts_with("node "),
        "{reason} / {from}"
    );

    // db-1's pod is gone too: reconcile releases its holder, and the
    // sticky claim stays reserved for db-1.
    api.remove_pod(NS, "db-1");
    let (ok, out) = cli_on_node1(&topo, &api, &["reconcile"]);
    assert!(ok, "{out}");
    assert!(out.contains(&format!("released {ip1}")), "{out}");
    assert!(out.contains("1 dead holders released"), "{out}");
    let reserved = api
        .claims()
        .into_iter()
        .find(|c| c["spec"]["ip"] == ip1.as_str())
        .expect("db-1 claim");
    assert_eq!(reserved["status"]["phase"], "Reserved");

    // The StatefulSet is deleted: its identities retire once unheld.
    api.delete_stateful_set(NS, "db");
    let (ok, out) = cli_on_node1(&topo, &api, &["reconcile"]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("retired {ip1}"))
            && out.contains("StatefulSet default/db was deleted"),
        "{out}"
    );
    assert!(
        !out.contains(&format!("retired {ip0}")),
        "db-0 is still running: {out}"
    );
    let left: Vec<Value> = api.claims();
    let kept: Vec<&Value> = left
        .iter()
        .filter(|c| c["status"]["phase"] != "Released")
        .collect();
    assert_eq!(kept.len(), 1, "{left:?}");
    assert_eq!(kept[0]["spec"]["ip"], ip0.as_str());
    // db-1's holder was released by reconcile's judgement, so its retired
    // address stays as released, to be probed before it is bound again.
    let released = left
        .iter()
        .find(|c| c["spec"]["ip"] == ip1.as_str())
        .expect("db-1's address, kept as released");
    assert_eq!(released["status"]["phase"], "Released", "{released}");
}

/// CNI 1.1 GC and STATUS on the kubernetes store: GC releases this node's
/// holders the runtime no longer knows (another node's are not its
/// business); STATUS answers while the API does and reports 50 when the
/// API is stopped.
#[test]
fn gc_and_status_on_the_kubernetes_store() {
    let (mut topo, mut api) = nodes_on_api(2);
    let v11 = |topo: &Topology, node: usize| {
        let mut c = conf(topo, &api, node, json!({}));
        c["cniVersion"] = json!("1.1.0");
        c
    };
    let mut held = Vec::new();
    for (node, cid) in [(0, "keep"), (0, "gone"), (1, "other-node")] {
        let pod = topo.add_pod(cid);
        CniCall::new(
            &our_plugin(),
            &topo.node(node).netns,
            "ADD",
            v11(&topo, node),
        )
        .container(cid)
        .netns(&pod.path)
        .run()
        .expect_ok();
        held.push(pod);
    }
    let mut gc = v11(&topo, 0);
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "net1"}]);
    CniCall::new(&our_plugin(), &topo.node(0).netns, "GC", gc)
        .netns("")
        .run()
        .expect_ok();
    let claims = api.claims();
    let mut left: Vec<String> = claims
        .iter()
        .filter(|c| c["status"]["phase"] == "Bound")
        .filter_map(|c| c["spec"]["identity"].as_str().map(String::from))
        .collect();
    left.sort();
    assert_eq!(left, ["container:keep/net1", "container:other-node/net1"]);
    // GC's word is a judgement (I7): the released address stays, marked,
    // until a probe confirms it at its next grant.
    let gone = claims
        .iter()
        .find(|c| c["spec"]["identity"] == "container:gone/net1")
        .expect("the GC'd claim, kept as released");
    assert_eq!(gone["status"]["phase"], "Released", "{gone}");
    assert!(
        gone["status"]["unconfirmed"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("CNI GC")),
        "{gone}"
    );
    let status_conf = v11(&topo, 0);
    let status = |topo: &Topology| {
        CniCall::new(
            &our_plugin(),
            &topo.node(0).netns,
            "STATUS",
            status_conf.clone(),
        )
        .netns("")
        .run()
    };
    status(&topo).expect_ok();
    api.stop();
    let down = status(&topo);
    assert_eq!(down.code(), Some(50), "{}", down.stdout);
    assert!(
        down.msg().contains("kubernetes API") || down.msg().contains("unreachable"),
        "{}",
        down.msg()
    );
}

/// No request credential reaches a log: the token in the kubeconfig (or
/// its tokenFile) is absent from the log file and from stderr, through
/// successes, injected conflicts and an unreachable API, at debug level.
#[test]
fn secrets_never_reach_the_logs() {
    let (mut topo, mut api) = cluster_on_standin(1);
    let text = std::fs::read_to_string(&api.kubeconfig).expect("kubeconfig");
    let kubeconfig: Value = serde_saphyr::from_str(&text).expect("parse the kubeconfig");
    let mut secrets: Vec<String> = Vec::new();
    for u in kubeconfig["users"].as_array().into_iter().flatten() {
        if let Some(t) = u["user"]["token"].as_str() {
            secrets.push(t.to_string());
        }
        if let Some(f) = u["user"]["tokenFile"].as_str() {
            secrets.push(
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            );
        }
    }
    secrets.retain(|s| s.len() >= 8);
    assert!(
        !secrets.is_empty(),
        "the kubeconfig carries no token to look for"
    );
    let log = topo.file("secrets.log");
    let p1 = topo.add_pod("sec-a");
    let p2 = topo.add_pod("sec-c");
    let mut logged = conf(&topo, &api, 0, json!({}));
    logged["logFile"] = json!(log);
    logged["logLevel"] = json!("debug");
    let uid = api.add_pod(NS, "web-0", &api.node(1), None, None);
    let mut stderr = String::new();
    let run = |cmd: &str, pod: &Pod, cid: &str, conf: &Value| {
        CniCall::new(&our_plugin(), &topo.node(0).netns, cmd, conf.clone())
            .container(cid)
            .netns(&pod.path)
            .args(&pod_args_in_ns("web-0", &uid))
            .run()
    };
    let ok = run("ADD", &p1, "sec-a", &logged);
    assert!(ok.success, "{}", ok.stdout);
    stderr += &ok.stderr;
    stderr += &run("DEL", &p1, "sec-a", &logged).stderr;
    api.faults(3, 0);
    let stormy = run("ADD", &p1, "sec-b", &logged);
    stderr += &stormy.stderr;
    stderr += &run("DEL", &p1, "sec-b", &logged).stderr;
    api.faults(0, 0);
    let mut down_conf = logged.clone();
    down_conf["ipam"]["store"]["timeoutMs"] = json!(800);
    api.stop();
    let down = run("ADD", &p2, "sec-c", &down_conf);
    assert!(!down.success, "an ADD with the API down: {}", down.stdout);
    stderr += &down.stderr;
    stderr += &down.stdout;
    let written = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        written.lines().count() >= 5,
        "the log file has too little to judge: {written}"
    );
    for secret in &secrets {
        assert!(
            !written.contains(secret.as_str()),
            "the token is in the log file"
        );
        assert!(!stderr.contains(secret.as_str()), "the token is on stderr");
    }
    for marker in ["Authorization", "Bearer "] {
        assert!(
            !written.contains(marker) && !stderr.contains(marker),
            "{marker} was logged"
        );
    }
}
