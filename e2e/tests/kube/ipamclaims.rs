//! IPAMClaims (issue 30) on the real kube-apiserver, with the IPAMClaim
//! CRD of the pinned ipamclaims module and KubeVirt's own VM and VMI CRDs
//! (target/tools/crds, scripts/tools.sh). The harness plays
//! kubevirt/ipam-extensions (the claim `<vm>.<network>`, owned by the VM,
//! with its finalizer, and the launcher pod's `ipam-claim-reference`) and
//! virt-controller (the VMI's `status.activePods`): neither can run here
//! (README, "What was tested against what").

use super::*;

const VMS: &str = "vms";

fn crds() -> std::path::PathBuf {
    sticky_e2e::paths::repo_root().join("target/tools/crds")
}

/// Every CRD in `file` (YAML documents), served once the server says so.
fn install_crds(api: &ApiServer, file: &str) {
    let path = crds().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/tools.sh)", path.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("CRD YAML");
    for crd in docs.into_iter().filter(|d| d.is_object()) {
        let plural = crd["spec"]["names"]["plural"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let group = crd["spec"]["group"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let version = crd["spec"]["versions"][0]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        api.create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            crd,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let path = format!("/apis/{group}/{version}/{plural}?limit=1");
        while api.request("GET", &path, None).0 != 200 {
            assert!(Instant::now() < deadline, "{plural}.{group} never served");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn on_api_with_kubevirt() -> (Topology, ApiServer) {
    let (topo, api) = nodes_on_api(2);
    install_crds(&api, "ipamclaims.yaml");
    install_crds(&api, "kubevirt.yaml");
    api.add_pod(VMS, "seed", &api.node(1), None, None);
    api.remove_pod(VMS, "seed");
    (topo, api)
}

/// `conf` with the NAD's top-level key that makes ipam-extensions create
/// claims for this network.
fn persistent_conf(topo: &Topology, api: &ApiServer, node: usize) -> Value {
    let mut c = conf(topo, api, node, json!({}));
    c["allowPersistentIPs"] = json!(true);
    c
}

/// A VM as a user writes it (stopped: virt-controller would start it).
fn add_vm(api: &ApiServer, name: &str) -> String {
    let vm = api.create(
        &format!("/apis/kubevirt.io/v1/namespaces/{VMS}/virtualmachines"),
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
               "metadata": {"name": name, "namespace": VMS},
               "spec": {"runStrategy": "Halted", "template": {"spec": {
                   "domain": {"devices": {"interfaces": [{"name": "phys", "bridge": {}}]}},
                   "networks": [{"name": "phys", "multus": {"networkName": "phys"}}]}}}}),
    );
    vm["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// ipam-extensions' part: the claim of VM `vm` on the scenario's network.
fn add_claim(api: &ApiServer, vm: &str, vm_uid: &str) -> String {
    let name = format!("{vm}.{}", api.network);
    api.create(
        &format!("/apis/k8s.cni.cncf.io/v1alpha1/namespaces/{VMS}/ipamclaims"),
        json!({"apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
               "metadata": {"name": name, "namespace": VMS,
                            "labels": {"kubevirt.io/vm": vm},
                            "finalizers": ["kubevirt.io/persistent-ipam"],
                            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                                 "name": vm, "uid": vm_uid,
                                                 "controller": true, "blockOwnerDeletion": true}]},
               "spec": {"network": api.network, "interface": "podd2c1a7a7ae7"}}),
    );
    name
}

fn claim_path(name: &str) -> String {
    format!("/apis/k8s.cni.cncf.io/v1alpha1/namespaces/{VMS}/ipamclaims/{name}")
}

fn ipam_claim(api: &ApiServer, name: &str) -> Value {
    api.request("GET", &claim_path(name), None).1
}

/// virt-controller's part: the VMI of `vm` with `active` (pod UID, node)
/// as its active pods.
fn set_active_pods(api: &ApiServer, vm: &str, active: &[(&str, &str)]) {
    let path = format!("/apis/kubevirt.io/v1/namespaces/{VMS}/virtualmachineinstances");
    let me = format!("{path}/{vm}");
    if api.request("GET", &me, None).0 == 404 {
        api.create(
            &path,
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                   "metadata": {"name": vm, "namespace": VMS},
                   "spec": {"domain": {"devices": {"interfaces": [{"name": "phys", "bridge": {}}]}},
                            "networks": [{"name": "phys", "multus": {"networkName": "phys"}}]}}),
        );
    }
    let pods: serde_json::Map<String, Value> = active
        .iter()
        .map(|(uid, node)| (uid.to_string(), json!(node)))
        .collect();
    // KubeVirt's VMI has no status subresource: virt-controller writes
    // the object. A merge patch replaces the map.
    let (code, out) = api.request("PATCH", &me, Some(&json!({"status": {"activePods": null}})));
    assert_eq!(code, 200, "VMI status: {out}");
    let (code, out) = api.request("PATCH", &me, Some(&json!({"status": {"activePods": pods}})));
    assert_eq!(code, 200, "VMI status: {out}");
}

/// A launcher pod of `vm` on test node `node` whose network selection
/// element references `claim` (what ipam-extensions' webhook adds).
fn add_launcher(api: &ApiServer, name: &str, node: usize, claim: &str) -> String {
    let uid = api.add_pod(VMS, name, &api.node(node), None, None);
    let networks = json!([{"name": "phys", "namespace": VMS, "ipam-claim-reference": claim}]);
    let (code, out) = api.request(
        "PATCH",
        &format!("/api/v1/namespaces/{VMS}/pods/{name}"),
        Some(&json!({"metadata": {
            "labels": {"kubevirt.io": "virt-launcher"},
            "annotations": {"k8s.v1.cni.cncf.io/networks": networks.to_string(),
                            "kubevirt.io/domain": name}}})),
    );
    assert_eq!(code, 200, "annotate {name}: {out}");
    uid
}

/// A launcher pod: its object in the API and its sandbox on a test node.
struct Launcher {
    name: String,
    uid: String,
    pod: Pod,
    /// The test node (0-based) it runs on.
    node: usize,
}

impl Launcher {
    fn new(topo: &mut Topology, api: &ApiServer, name: &str, node: usize, claim: &str) -> Launcher {
        Launcher {
            uid: add_launcher(api, name, node + 1, claim),
            pod: topo.add_pod(name),
            name: name.to_string(),
            node,
        }
    }

    fn call(&self, topo: &Topology, api: &ApiServer, verb: &str) -> CniReply {
        let conf = persistent_conf(topo, api, self.node);
        let args = sticky_e2e::scenario::pod_args(VMS, &self.name, &self.uid);
        let cid = format!("ctr-{}", self.name);
        sticky_e2e::scenario::call(topo, self.node, verb, &conf, &cid, &self.pod, &args)
    }
}

fn condition(claim: &Value) -> (String, String) {
    let c = claim["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "IPsAllocated"))
        .cloned()
        .unwrap_or_default();
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["reason"].as_str().unwrap_or_default().to_string(),
    )
}

/// A VM's launcher pod gets an address recorded in its IPAMClaim; a pod
/// that is not the VM's is refused; the VM's next launcher pod, on
/// another node after a crash, gets the same address; the address stays
/// while the claim exists and is freed by reconcile once it is deleted.
#[test]
fn a_vms_ipamclaim_keeps_its_address_across_launcher_pods_until_the_claim_is_deleted() {
    let (mut topo, api) = on_api_with_kubevirt();
    let vm_uid = add_vm(&api, "vm1");
    let claim = add_claim(&api, "vm1", &vm_uid);
    let a = Launcher::new(&mut topo, &api, "virt-launcher-vm1-aaaaa", 0, &claim);
    set_active_pods(&api, "vm1", &[(&a.uid, &api.node(1))]);
    let x = a.call(&topo, &api, "ADD").first_address();
    let status = ipam_claim(&api, &claim)["status"].clone();
    assert!(
        status["ips"][0]
            .as_str()
            .is_some_and(|ip| ip.starts_with(&format!("{x}/"))),
        "{status}"
    );
    assert_eq!(status["ownerPod"]["name"], a.name.as_str());
    let allocated = ("True".to_string(), "SuccessfulAllocation".to_string());
    assert_eq!(condition(&ipam_claim(&api, &claim)), allocated);
    let identity = format!("ipamclaim:{VMS}/{claim}");
    let ours = api
        .claims()
        .into_iter()
        .find(|c| c["spec"]["ip"] == x.as_str())
        .expect("IPClaim of X");
    assert_eq!(ours["spec"]["identity"], identity.as_str());
    assert_eq!(ours["spec"]["owner"]["kind"], "IPAMClaim.k8s.cni.cncf.io");

    // A pod that is not one of the VMI's, naming the claim (a pod author
    // can set labels, annotations and owner references): refused, and the
    // claim's status is not its to change.
    let stranger = Launcher::new(&mut topo, &api, "not-a-launcher", 1, &claim);
    stranger
        .call(&topo, &api, "ADD")
        .expect_refused(11, &["not-a-launcher", "active pods", &claim]);
    assert_eq!(ipam_claim(&api, &claim)["status"], status);

    // A second pod virt-controller counts beside the launcher: a live
    // migration's target (KubeVirt names it in the VMI only after it is
    // Ready, so after this ADD), or a pod whose author wrote the owner
    // reference virt-controller counts by. Neither is taken for the
    // launcher: the address is never on two pods, and the claim still
    // says it is the launcher's.
    let target = Launcher::new(&mut topo, &api, "virt-launcher-vm1-ttttt", 1, &claim);
    set_active_pods(
        &api,
        "vm1",
        &[(&a.uid, &api.node(1)), (&target.uid, &api.node(2))],
    );
    target
        .call(&topo, &api, "ADD")
        .expect_refused(11, &["besides pod", "not supported yet"]);
    assert_eq!(ipam_claim(&api, &claim)["status"], status);
    api.remove_pod(VMS, &target.name);

    // node1 crashes; its launcher pod is gone for good; the VM restarts on
    // node2 with a new launcher pod: the same address.
    topo.crash_node(0, &[&a.pod]);
    api.taint_out_of_service(&api.node(1));
    api.remove_pod(VMS, &a.name);
    let b = Launcher::new(&mut topo, &api, "virt-launcher-vm1-bbbbb", 1, &claim);
    set_active_pods(&api, "vm1", &[(&b.uid, &api.node(2))]);
    assert_eq!(b.call(&topo, &api, "ADD").first_address(), x);
    assert_eq!(
        ipam_claim(&api, &claim)["status"]["ownerPod"]["name"],
        b.name.as_str()
    );
    assert_eq!(condition(&ipam_claim(&api, &claim)), allocated);

    // The VM stops: its pod's DEL, then reconcile. The claim exists, so
    // the address stays the VM's.
    b.call(&topo, &api, "DEL").expect_ok();
    api.remove_pod(VMS, &b.name);
    let (ok, out) = cli_on_node(&topo, &api, 1, &["reconcile"]);
    assert!(ok, "{out}");
    let claimed = |api: &ApiServer| {
        api.claims()
            .iter()
            .any(|c| c["spec"]["ip"] == x.as_str() && c["spec"]["identity"] == identity.as_str())
    };
    assert!(claimed(&api), "kept while the IPAMClaim exists: {out}");

    // The VM is deleted: ipam-extensions drops its finalizer and the
    // claim goes; reconcile frees the address.
    let mut obj = ipam_claim(&api, &claim);
    obj["metadata"]["finalizers"] = json!([]);
    assert_eq!(api.request("PUT", &claim_path(&claim), Some(&obj)).0, 200);
    assert_eq!(api.request("DELETE", &claim_path(&claim), None).0, 200);
    let (ok, out) = cli_on_node(&topo, &api, 1, &["reconcile"]);
    assert!(ok, "{out}");
    assert!(
        !claimed(&api),
        "the deleted IPAMClaim's address is still claimed\n{out}"
    );
}

/// An API server that does not serve IPAMClaims (the CRD not installed
/// yet again, or no longer at v1alpha1) answers 404 for every claim: that
/// says nothing of the claims, so reconcile frees none of their addresses.
#[test]
fn reconcile_frees_no_ipamclaims_address_while_the_api_does_not_serve_ipamclaims() {
    let (topo, api) = nodes_on_api(2);
    let ip = format!("{}.77", sticky_e2e::SUBNET_PREFIX);
    let identity = format!("ipamclaim:{VMS}/vm1.{}", api.network);
    let facts = sticky_ipam::ipamclaim::ClaimFacts {
        name: format!("vm1.{}", api.network),
        uid: "uid-vm1-claim".into(),
        network: api.network.clone(),
        deleting: false,
        vm: Some("vm1".into()),
    };
    // A stopped VM's address: its claim has no holder.
    api.seed_claims(
        &api.network,
        vec![sticky_ipam::claim::Claim {
            ip: ip.parse().expect("an address"),
            identity: identity.clone(),
            sticky: true,
            holder: None,
            owner: Some(sticky_ipam::ipamclaim::owner(VMS, &facts)),
            namespace: Some(VMS.into()),
            created: 1,
            updated: 1,
            unconfirmed: None,
        }],
    );
    let (ok, out) = cli_on_node(&topo, &api, 1, &["reconcile"]);
    assert!(ok, "{out}");
    assert!(
        api.claims()
            .iter()
            .any(|c| c["spec"]["ip"] == ip.as_str() && c["spec"]["identity"] == identity.as_str()),
        "freed on a 404 for the resource:\n{out}"
    );
}
