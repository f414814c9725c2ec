//! Objects by the thousand (a benchmark's nodes and pods), written from
//! several threads as the harness, never counted as the plugins'
//! requests; and Whereabouts' CRDs and ClusterRole on the real server,
//! from its pinned Go module, as `scripts/cluster/control_plane.sh`
//! installs them.

use super::*;

/// One request of a bulk load: method, path, body. PATCH is a merge patch.
pub type BulkRequest = (&'static str, String, Value);

impl ApiServer {
    /// Runs these groups of requests (an object's create and its status)
    /// from 8 threads in the API's netns with the harness's credentials,
    /// each group in order in one thread; every request must succeed. The
    /// answers, in the requests' order.
    pub fn bulk(&self, requests: Vec<Vec<BulkRequest>>) -> Vec<Value> {
        use sticky_ipam::kube::client::KubeClient;
        const THREADS: usize = 8;
        assert!(self.is_real(), "bulk loads are for the real API server");
        let chunk = requests.len().div_ceil(THREADS).max(1);
        let (netns, kubeconfig) = (&self.netns, &self.admin_kubeconfig);
        std::thread::scope(|scope| {
            let parts: Vec<_> = requests
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        crate::enter_netns(netns);
                        let client =
                            KubeClient::from_kubeconfig(kubeconfig, Duration::from_secs(30))
                                .unwrap_or_else(|e| panic!("bulk client: {e}"));
                        part.iter()
                            .flatten()
                            .map(|(method, path, body)| {
                                let content_type = if *method == "PATCH" {
                                    "application/merge-patch+json"
                                } else {
                                    "application/json"
                                };
                                let req = http::Request::builder()
                                    .method(*method)
                                    .uri(path.as_str())
                                    .header("Content-Type", content_type)
                                    .body(body.to_string().into_bytes())
                                    .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
                                let text = client
                                    .bounded(path, client.kube().request_text(req))
                                    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
                                    .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
                                serde_json::from_str(&text).unwrap_or(Value::Null)
                            })
                            .collect::<Vec<Value>>()
                    })
                })
                .collect();
            parts
                .into_iter()
                .flat_map(|p| {
                    p.join()
                        .unwrap_or_else(|_| panic!("a bulk thread panicked"))
                })
                .collect()
        })
    }

    /// The requests that make `name` a Ready node.
    pub fn node_requests(name: &str) -> Vec<BulkRequest> {
        let status = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        vec![
            (
                "POST",
                "/api/v1/nodes".into(),
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status}),
            ),
            (
                "PATCH",
                format!("/api/v1/nodes/{name}/status"),
                json!({ "status": status }),
            ),
        ]
    }

    /// The requests that make a running pod bound to `node` (`owner`: its
    /// StatefulSet's name and UID; `annotation`: its sticky-macvlan
    /// identity); its UID is in the first answer. Its finalizer stands for
    /// the kubelet that has to confirm a deletion. The namespace must exist
    /// (`add_stateful_set` makes it).
    pub fn pod_requests(
        ns: &str,
        name: &str,
        node: &str,
        owner: Option<(&str, &str)>,
        annotation: Option<&str>,
    ) -> Vec<BulkRequest> {
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
        vec![
            (
                "POST",
                format!("/api/v1/namespaces/{ns}/pods"),
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                       "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                       "status": status}),
            ),
            (
                "PATCH",
                format!("/api/v1/namespaces/{ns}/pods/{name}/status"),
                json!({ "status": status }),
            ),
        ]
    }

    /// Whereabouts' IPPool and OverlappingRangeIPReservation CRDs and its
    /// ClusterRole from its install manifest (its module in
    /// e2e/tools/whereabouts), the role bound to the plugins' group: its
    /// requests are made with the plugins' token, so the audit log counts
    /// them as it counts ours. Returns once both CRDs are served.
    pub fn install_whereabouts(&self) {
        let dir = whereabouts_module();
        let docs = |file: &str| -> Vec<Value> {
            let path = dir.join("doc/crds").join(file);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
        };
        for file in [
            "whereabouts.cni.cncf.io_ippools.yaml",
            "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
        ] {
            for crd in docs(file) {
                self.create(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                    crd,
                );
            }
        }
        let role = docs("daemonset-install.yaml")
            .into_iter()
            .find(|d| d["kind"] == "ClusterRole")
            .unwrap_or_else(|| panic!("Whereabouts' install manifest has no ClusterRole"));
        let role_name = role["metadata"]["name"].as_str().unwrap_or("").to_string();
        self.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role);
        self.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "whereabouts-e2e-nodes"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": PLUGIN_GROUP}]}),
        );
        self.wait_until(
            "Whereabouts' CRDs to be served",
            Duration::from_secs(30),
            |a| {
                ["ippools", "overlappingrangeipreservations"]
                    .iter()
                    .all(|plural| {
                        a.try_request(
                            "GET",
                            &format!("/apis/whereabouts.cni.cncf.io/v1alpha1/{plural}?limit=1"),
                            None,
                        )
                        .is_ok_and(|(code, _)| code == 200)
                    })
            },
        );
    }
}

/// The source of the Whereabouts module e2e/tools/whereabouts pins (its
/// CRDs and manifests), which `scripts/cluster.sh build` downloaded.
pub fn whereabouts_module() -> PathBuf {
    let tools = crate::repo_root().join("e2e/tools/whereabouts");
    let out = Command::new("go")
        .args([
            "list",
            "-m",
            "-f",
            "{{.Dir}}",
            "github.com/k8snetworkplumbingwg/whereabouts",
        ])
        .current_dir(&tools)
        .output()
        .unwrap_or_else(|e| panic!("go list in {}: {e}", tools.display()));
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        out.status.success() && dir.join("doc/crds").is_dir(),
        "no Whereabouts module source ({}): run scripts/cluster.sh build first",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}
