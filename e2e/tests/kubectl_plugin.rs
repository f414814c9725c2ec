//! `kubectl sticky`: the binary on PATH as `kubectl-sticky`, run by the
//! real kubectl (v1.36.3, from the local cluster's build) against a real
//! kube-apiserver: kubectl finds the plugin, the usual KUBECONFIG,
//! `--context`, `-n` and `-o json|yaml|wide` work.

use std::os::unix::fs::symlink;
use std::process::Command;

use serde_json::Value;
use sticky_e2e::kube_api::cluster_binary;
use sticky_e2e::{our_plugin, Topology};
use sticky_ipam::claim::{Claim, Holder};

fn claim(ip: &str, identity: &str, namespace: &str, holder: Option<Holder>) -> Claim {
    Claim {
        ip: ip.parse().expect("ip"),
        identity: identity.into(),
        sticky: true,
        holder,
        owner: None,
        namespace: Some(namespace.into()),
        created: 1,
        updated: 1,
        unconfirmed: None,
    }
}

#[test]
fn kubectl_finds_the_plugin_and_it_speaks_kubectl() {
    let mut topo = Topology::new(1);
    let api = topo.start_api();
    let holder = Holder {
        container_id: "c0ffee".into(),
        ifname: "net1".into(),
        netns: "/run/netns/gone".into(),
        netns_id: None,
        pod_namespace: Some("db".into()),
        pod_name: Some("db-0".into()),
        pod_uid: Some("uid-db-0".into()),
        node: "node1".into(),
        boot_id: "b".into(),
        since: 1,
    };
    api.seed_claims(
        "macnet",
        vec![
            claim("192.0.2.10", "db/db-0", "db", Some(holder)),
            claim("192.0.2.11", "web/peer", "web", None),
        ],
    );
    // The plugin on PATH under kubectl's plugin name.
    let bin = topo.file("kubectl-plugins");
    std::fs::create_dir_all(&bin).expect("plugin dir");
    symlink(our_plugin(), bin.join("kubectl-sticky")).expect("link kubectl-sticky");
    // A kubeconfig whose current context points nowhere: --context picks
    // the working one.
    let good = std::fs::read_to_string(&api.kubeconfig).expect("kubeconfig");
    let two = good
        .replace("current-context: e2e", "current-context: nowhere")
        .replace(
            "contexts:\n",
            "contexts:\n- name: nowhere\n  context:\n    cluster: nowhere\n    user: sticky-macvlan\n",
        )
        .replace(
            "clusters:\n",
            "clusters:\n- name: nowhere\n  cluster:\n    server: https://127.0.0.1:1\n",
        );
    let kubeconfig = topo.file("two-contexts.kubeconfig");
    std::fs::write(&kubeconfig, two).expect("write kubeconfig");
    let kubectl = |args: &[&str]| {
        let out = Command::new("ip")
            .args(["netns", "exec", &topo.node(0).netns, "env"])
            .arg(format!(
                "PATH={}:/usr/sbin:/usr/bin:/sbin:/bin",
                bin.display()
            ))
            .arg(format!("KUBECONFIG={}", kubeconfig.display()))
            .arg(cluster_binary("kubectl"))
            .args(args)
            .output()
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    let (ok, listed, _) = kubectl(&["plugin", "list"]);
    assert!(ok && listed.contains("kubectl-sticky"), "{listed}");

    // The current context answers nothing; --context names the good one.
    let (ok, _, err) = kubectl(&["sticky", "claims"]);
    assert!(!ok, "the current context points nowhere");
    assert!(err.contains("127.0.0.1:1"), "{err}");

    let (ok, json, err) = kubectl(&["sticky", "claims", "--context", "e2e", "-o", "json"]);
    assert!(ok, "{err}");
    let all: Value = serde_json::from_str(&json).expect("json");
    let ips: Vec<&str> = all
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["claim"]["ip"].as_str())
        .collect();
    assert_eq!(ips, ["192.0.2.10", "192.0.2.11"], "{json}");

    // -n filters by the claim's namespace; -A is every namespace.
    let (ok, json, err) = kubectl(&["sticky", "claims", "--context=e2e", "-n", "web", "-ojson"]);
    assert!(ok, "{err}");
    let web: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(web.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(web[0]["claim"]["identity"], "web/peer");
    assert_eq!(web[0]["state"], "reserved");
    let (ok, json, _) = kubectl(&["sticky", "claims", "--context", "e2e", "-A", "-o", "json"]);
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&json)
            .expect("json")
            .as_array()
            .map(Vec::len),
        Some(2)
    );

    // yaml, and wide with the reason liveness gives.
    let (ok, yaml, err) = kubectl(&["sticky", "claims", "--context", "e2e", "-o", "yaml"]);
    assert!(ok, "{err}");
    let parsed: Value = serde_saphyr::from_str(&yaml).expect("yaml");
    assert_eq!(parsed.as_array().map(Vec::len), Some(2), "{yaml}");
    let (ok, wide, err) = kubectl(&["sticky", "claims", "--context", "e2e", "-o", "wide"]);
    assert!(ok, "{err}");
    let header = wide.lines().next().unwrap_or_default();
    assert!(header.ends_with("REASON"), "{wide}");
    let db0 = wide
        .lines()
        .find(|l| l.contains("192.0.2.10"))
        .unwrap_or_else(|| panic!("no row of db-0: {wide}"));
    assert!(
        db0.contains("db/db-0") && db0.contains("dead") && db0.contains("no longer exists"),
        "db-0's pod is gone from the API, so its holder is dead: {db0}"
    );
    let (ok, table, _) = kubectl(&["sticky", "claims", "--context", "e2e"]);
    assert!(ok && !table.contains("REASON"), "{table}");

    let (ok, _, err) = kubectl(&["sticky", "claims", "--context", "e2e", "-o", "xml"]);
    assert!(!ok && err.contains("not one of json, yaml, wide"), "{err}");
}
