//! The objects kubelet and the controllers would write (Nodes, Pods and
//! their status, StatefulSets, taints), and the claims read back or seeded.

use super::*;

impl ApiServer {
    #[track_caller]
    pub fn create(&self, collection: &str, obj: Value) -> Value {
        let (code, out) = self.request("POST", collection, Some(&obj));
        assert_eq!(code, 201, "create in {collection}: {out}");
        out
    }

    /// What kubelet reports: the real server takes status only through the
    /// status subresource.
    #[track_caller]
    pub(super) fn set_status(&self, path: &str, status: Value) {
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

    /// One object's requests (`node_requests`, `pod_requests`) in turn:
    /// the create's answer. The stand-in takes status with the object, so
    /// it gets no status patch.
    #[track_caller]
    fn apply(&self, requests: Vec<BulkRequest>) -> Value {
        let mut created = Value::Null;
        for (method, path, body) in requests {
            if method == "POST" {
                created = self.create(&path, body);
            } else if self.is_real() {
                let (code, out) = self.request(method, &path, Some(&body));
                assert_eq!(code, 200, "{method} {path}: {out}");
            }
        }
        created
    }

    pub fn add_node(&self, name: &str) {
        self.apply(Self::node_requests(name));
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
        let pod = self.apply(Self::pod_requests(ns, name, node, owner, annotation));
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

    pub(super) fn get(&self, path: &str) -> Option<Value> {
        let (code, v) = self.request("GET", path, None);
        (code == 200).then_some(v)
    }

    pub(super) fn put(&self, path: &str, obj: &Value) {
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
}
