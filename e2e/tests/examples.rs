//! The manifests in examples/ are what users apply: every NAD's config is
//! accepted by the plugin's own parser, the CRD is the one the code
//! generates, and the RBAC grants what the kube client calls and no more.
//! (scripts/test.sh also validates them against the Kubernetes schemas.)

use std::path::PathBuf;

use serde_json::Value;

fn examples() -> Vec<(PathBuf, Vec<Value>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("examples/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read example");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out.push((path, docs));
    }
    assert!(out.len() >= 10, "examples are missing: {}", out.len());
    out
}

#[test]
fn every_nad_config_is_accepted() {
    let mut nads = 0;
    for (path, docs) in examples() {
        for doc in docs
            .iter()
            .filter(|d| d["kind"] == "NetworkAttachmentDefinition")
        {
            nads += 1;
            let config = doc["spec"]["config"].as_str().expect("spec.config");
            let conf = sticky_macvlan::config::NetConf::parse(config.as_bytes())
                .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.msg));
            let ipam: Value = serde_json::from_str(config).expect("json");
            if ipam["ipam"]["type"] == "sticky-ipam" {
                sticky_ipam::config::IpamConfig::parse(&conf.common.name, &ipam["ipam"])
                    .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.msg));
            }
        }
    }
    assert!(nads >= 6);
}

#[test]
fn the_crd_is_the_generated_one() {
    let (_, docs) = examples()
        .into_iter()
        .find(|(p, _)| p.ends_with("ipclaim-crd.yaml"))
        .expect("examples/ipclaim-crd.yaml");
    assert_eq!(
        docs[0],
        sticky_ipam::kube::crd::definition(),
        "regenerate it: sticky-macvlan crd > examples/ipclaim-crd.yaml"
    );
}

#[test]
fn rbac_is_least_privilege() {
    let (_, docs) = examples()
        .into_iter()
        .find(|(p, _)| p.ends_with("rbac.yaml"))
        .expect("examples/rbac.yaml");
    let rules = |role: &str| -> Vec<(String, String, Vec<String>)> {
        let doc = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == role)
            .unwrap_or_else(|| panic!("ClusterRole {role}"));
        let mut out = Vec::new();
        for r in doc["rules"].as_array().expect("rules") {
            for group in r["apiGroups"].as_array().expect("apiGroups") {
                for res in r["resources"].as_array().expect("resources") {
                    let verbs: Vec<String> = r["verbs"]
                        .as_array()
                        .expect("verbs")
                        .iter()
                        .map(|v| v.as_str().unwrap_or_default().to_string())
                        .collect();
                    out.push((
                        group.as_str().unwrap_or_default().into(),
                        res.as_str().unwrap_or_default().into(),
                        verbs,
                    ));
                }
            }
        }
        out.sort();
        out
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // What KubeClient calls on the ADD/DEL/CHECK/STATUS/GC paths.
    assert_eq!(
        rules("sticky-macvlan"),
        vec![
            ("".into(), "nodes".into(), s(&["get"])),
            ("".into(), "pods".into(), s(&["get"])),
            ("apps".into(), "statefulsets".into(), s(&["get"])),
            (
                "sticky-macvlan.io".into(),
                "ipclaims".into(),
                s(&["get", "list", "create", "update", "delete"])
            ),
        ]
    );
    // reconcile never creates claims.
    let reconcile = rules("sticky-macvlan-reconcile");
    assert!(reconcile.iter().all(|(_, _, verbs)| !verbs
        .iter()
        .any(|v| v == "create" || v == "*" || v == "watch")));
    assert!(docs
        .iter()
        .all(|d| d["kind"] != "Role" || d["rules"].is_null()));
}
