//! The manifests users apply: the install set in deploy/ (and
//! deploy/optional/), the NADs and workloads in examples/. Every NAD's
//! config is accepted by the plugin's own parser, the CRD is the one the
//! code generates, and the RBAC grants what the kube client calls and no
//! more. (scripts/test.sh also validates them against the Kubernetes
//! schemas.)

use std::path::PathBuf;

use serde_json::Value;
use sticky_e2e::{repo_root, yaml_files};

const MANIFEST_DIRS: [&str; 3] = ["deploy", "deploy/optional", "examples"];

fn manifests() -> Vec<(PathBuf, Vec<Value>)> {
    let mut out = Vec::new();
    for dir in MANIFEST_DIRS {
        for path in yaml_files(&repo_root().join(dir)) {
            let text = std::fs::read_to_string(&path).expect("read manifest");
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path, docs));
        }
    }
    assert!(out.len() >= 13, "manifests are missing: {}", out.len());
    out
}

/// deploy/ is what `kubectl apply -f deploy/` installs, and kubectl applies
/// a directory's files in name order: the CRDs before anything that names
/// them, the RBAC before the DaemonSet that runs under it. examples/ holds
/// no part of the install.
#[test]
fn deploy_holds_the_install_set_in_apply_order() {
    // The kinds of each file directly in DIR, in name order (manifests()
    // reads each directory's files in that order).
    let kinds_in = |dir: &str| -> Vec<(PathBuf, Vec<String>)> {
        let dir = repo_root().join(dir);
        manifests()
            .into_iter()
            .filter(|(p, _)| p.parent() == Some(dir.as_path()))
            .map(|(p, docs)| {
                let kinds = docs
                    .iter()
                    .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
                    .collect();
                (p, kinds)
            })
            .collect()
    };
    let order: Vec<Vec<String>> = kinds_in("deploy").into_iter().map(|(_, k)| k).collect();
    let first = |kind: &str| order.iter().position(|k| k.iter().any(|x| x == kind));
    let (crd, role, policy, daemonset) = (
        first("CustomResourceDefinition").expect("deploy/ has the CRDs"),
        first("ClusterRole").expect("deploy/ has the RBAC"),
        first("ValidatingAdmissionPolicy").expect("deploy/ has the node-scope policy"),
        first("DaemonSet").expect("deploy/ has the DaemonSet"),
    );
    assert!(
        crd < policy && role < daemonset && policy < daemonset,
        "deploy/ applies out of order: {order:?}"
    );
    for (path, kinds) in kinds_in("examples") {
        for kind in kinds {
            assert!(
                [
                    "NetworkAttachmentDefinition",
                    "StatefulSet",
                    "Deployment",
                    "Service",
                    "ConfigMap"
                ]
                .contains(&kind.as_str()),
                "{}: a {kind} is part of the install, move it to deploy/",
                path.display()
            );
        }
    }
}

#[test]
fn every_nad_config_is_accepted() {
    let mut nads = 0;
    for (path, docs) in manifests() {
        for doc in docs
            .iter()
            .filter(|d| d["kind"] == "NetworkAttachmentDefinition")
        {
            nads += 1;
            let config = doc["spec"]["config"].as_str().expect("spec.config");
            let conf = sticky_macvlan::netconf::NetConf::parse(config.as_bytes())
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

/// The DaemonSet and the reconcile Deployment name the image
/// scripts/image.sh builds for this version, which the real-cluster tests
/// import into every node's containerd.
#[test]
fn the_manifests_name_the_image_the_script_builds() {
    let want = format!("localhost/sticky-macvlan:{}", env!("CARGO_PKG_VERSION"));
    let script = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/image.sh"),
    )
    .expect("scripts/image.sh");
    assert!(script.contains("tag=localhost/sticky-macvlan:$version"));
    let mut named = 0;
    for (path, docs) in manifests() {
        for doc in &docs {
            let containers = doc["spec"]["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for c in containers {
                let image = c["image"].as_str().unwrap_or_default();
                if image.contains("sticky-macvlan") {
                    named += 1;
                    assert_eq!(image, want, "{}", path.display());
                }
            }
        }
    }
    assert_eq!(named, 2, "the DaemonSet and the reconcile Deployment");
}

#[test]
fn the_crd_is_the_generated_one() {
    let (_, docs) = manifests()
        .into_iter()
        .find(|(p, _)| p.ends_with("10-ipclaim-crd.yaml"))
        .expect("deploy/10-ipclaim-crd.yaml");
    assert_eq!(
        docs,
        sticky_ipam::kube::crd::definitions(),
        "regenerate it: sticky-macvlan crd into charts/sticky-macvlan/templates/10-ipclaim-crd.yaml, then python3 scripts/render-deploy.py"
    );
    // helm uninstall deleting a CRD would delete every claim.
    for crd in &docs {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{}: helm must never delete it",
            crd["metadata"]["name"]
        );
    }
}

/// The chart is this release: its version and appVersion are the crates'
/// (the image tag it defaults to is the appVersion).
#[test]
fn the_chart_is_this_release() {
    let path = repo_root().join("charts/sticky-macvlan/Chart.yaml");
    let text = std::fs::read_to_string(&path).expect("charts/sticky-macvlan/Chart.yaml");
    let chart: Value =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for key in ["version", "appVersion"] {
        assert_eq!(
            chart[key],
            env!("CARGO_PKG_VERSION"),
            "{}: {key} must be the release's version",
            path.display()
        );
    }
}

#[test]
fn rbac_is_least_privilege() {
    let (_, docs) = manifests()
        .into_iter()
        .find(|(p, _)| p.ends_with("20-rbac.yaml"))
        .expect("deploy/20-rbac.yaml");
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
    // The node's role grants exactly what the client code calls: read off
    // `impl KubeApi for KubeClient`, so a new call without its grant, or a
    // grant nothing uses, fails here.
    let mut granted: Vec<(String, String)> = rules("sticky-macvlan")
        .into_iter()
        .flat_map(|(_, res, verbs)| verbs.into_iter().map(move |v| (res.clone(), v)))
        .collect();
    granted.sort();
    assert_eq!(
        kube_calls_in_the_client(),
        granted,
        "deploy/20-rbac.yaml and ipam/src/kube/client/requests.rs disagree"
    );
    assert_eq!(
        rules("sticky-macvlan"),
        vec![
            ("".into(), "events".into(), s(&["create", "get", "patch"])),
            ("".into(), "nodes".into(), s(&["get"])),
            ("".into(), "pods".into(), s(&["get"])),
            ("apps".into(), "statefulsets".into(), s(&["get"])),
            ("k8s.cni.cncf.io".into(), "ipamclaims".into(), s(&["get"])),
            (
                "k8s.cni.cncf.io".into(),
                "ipamclaims/status".into(),
                s(&["update"])
            ),
            (
                "kubevirt.io".into(),
                "virtualmachineinstances".into(),
                s(&["get"])
            ),
            (
                "sticky-macvlan.io".into(),
                "ipclaims".into(),
                s(&["get", "list", "create", "update", "delete"])
            ),
            (
                "sticky-macvlan.io".into(),
                "iplocks".into(),
                s(&["get", "list", "create", "update", "delete"])
            ),
        ]
    );
    // doctor's SelfSubjectAccessReviews ask about exactly this role.
    let mut table: Vec<(String, String, String)> = sticky_ipam::kube::PLUGIN_ACCESS
        .iter()
        .map(|p| (p.group.into(), p.resource.into(), p.verb.into()))
        .collect();
    table.sort();
    let mut role: Vec<(String, String, String)> = rules("sticky-macvlan")
        .into_iter()
        .flat_map(|(g, res, verbs)| verbs.into_iter().map(move |v| (g.clone(), res.clone(), v)))
        .collect();
    role.sort();
    assert_eq!(
        table, role,
        "kube::PLUGIN_ACCESS and deploy/20-rbac.yaml disagree"
    );
    // reconcile never creates claims.
    let reconcile = rules("sticky-macvlan-reconcile");
    assert!(reconcile.iter().all(|(_, _, verbs)| !verbs
        .iter()
        .any(|v| v == "create" || v == "*" || v == "watch")));
    // The one Role: the installer may mint tokens of the plugin's own
    // service account (bound to its node), of no other, and doctor may
    // read the DaemonSet, no other.
    let roles: Vec<&serde_json::Value> = docs.iter().filter(|d| d["kind"] == "Role").collect();
    assert_eq!(roles.len(), 1, "{roles:?}");
    assert_eq!(roles[0]["metadata"]["name"], "sticky-macvlan-installer");
    assert_eq!(
        roles[0]["rules"],
        serde_json::json!([{
            "apiGroups": [""],
            "resources": ["serviceaccounts/token"],
            "resourceNames": ["sticky-macvlan"],
            "verbs": ["create"]
        }, {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": ["sticky-macvlan"],
            "verbs": ["get"]
        }])
    );
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "RoleBinding")
        .expect("the installer's RoleBinding");
    assert_eq!(binding["roleRef"]["name"], "sticky-macvlan-installer");
    assert_eq!(binding["subjects"][0]["name"], "sticky-macvlan");
}

/// (resource, verb) of every request `KubeClient` can make, from its source:
/// each method of `impl KubeApi for KubeClient`, the kind its `Api` is for
/// and the kube-rs calls on it.
fn kube_calls_in_the_client() -> Vec<(String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ipam/src/kube/client/requests.rs");
    let src = std::fs::read_to_string(&path).expect("read ipam/src/kube/client/requests.rs");
    let start = src
        .find("impl KubeApi for KubeClient")
        .expect("impl KubeApi for KubeClient");
    let body = &src[start..];
    let end = body.find("\n}\n").unwrap_or(body.len());
    let mut calls = std::collections::BTreeSet::new();
    for method in body[..end].split("\n    fn ").skip(1) {
        let resource = if method.contains("Api<Pod>") {
            "pods"
        } else if method.contains("Api<Node>") {
            "nodes"
        } else if method.contains("Api<Event>") {
            "events"
        } else if method.contains("Api<StatefulSet>") {
            "statefulsets"
        } else if method.contains("self.claims()") {
            "ipclaims"
        } else if method.contains("self.locks()") {
            "iplocks"
        } else if method.contains("self.ipam_claims(") {
            "ipamclaims"
        } else if method.contains("self.vmis(") {
            "virtualmachineinstances"
        } else {
            panic!(
                "a KubeApi method whose resource this test cannot tell: {}",
                &method[..method.len().min(80)]
            );
        };
        for (call, verb) in [
            ("api.get(", "get"),
            ("api.list(", "list"),
            ("self.paged(", "list"),
            ("api.create(", "create"),
            ("api.replace(", "update"),
            ("api.delete(", "delete"),
            ("api.patch(", "patch"),
            ("api.watch(", "watch"),
        ] {
            if method.contains(call) {
                calls.insert((resource.to_string(), verb.to_string()));
            }
        }
        if method.contains("api.replace_status(") {
            calls.insert((format!("{resource}/status"), "update".to_string()));
        }
    }
    calls.into_iter().collect()
}

/// The reference's table of error codes (docs/src/reference/errors.md)
/// lists exactly the codes the plugin defines (`cni::code::TABLE`), so
/// neither can drift from the other.
#[test]
fn the_reference_documents_every_error_code() {
    let path = repo_root().join("docs/src/reference/errors.md");
    let readme =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = readme
        .find("| code | when |")
        .expect("the code table of docs/src/reference/errors.md");
    let documented: Vec<u32> = readme[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            l.trim_start_matches('|')
                .split('|')
                .next()?
                .trim()
                .parse()
                .ok()
        })
        .collect();
    let defined: Vec<u32> = sticky_macvlan::cni::code::TABLE
        .iter()
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(
        documented, defined,
        "docs/src/reference/errors.md vs cni::code::TABLE"
    );
}
