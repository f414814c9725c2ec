use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::ipamclaim::{VmiFacts, IPS_ALLOCATED};
use crate::kube::fake::FakeApi;

const NS: &str = "vms";

/// A claim as ipam-extensions makes it: `<vm>.<network>`, owned by the VM.
fn claim_object(name: &str, network: &str, vm: Option<&str>) -> Value {
    let owners: Vec<Value> = vm
        .map(|vm| {
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": vm,
                   "uid": "vm-uid", "controller": true, "blockOwnerDeletion": true})
        })
        .into_iter()
        .collect();
    json!({
        "apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                     "resourceVersion": "1", "generation": 1,
                     "ownerReferences": owners, "finalizers": ["kubevirt.io/persistent-ipam"]},
        "spec": {"network": network, "interface": "pod16367aacb67"},
    })
}

fn launcher(networks: &str) -> PodFacts {
    PodFacts {
        uid: "pod-a".into(),
        annotations: BTreeMap::from([(NETWORKS_ANNOTATION.to_string(), networks.to_string())]),
        ..PodFacts::default()
    }
}

fn api_with(claim: Option<Value>, active: &[&str]) -> FakeApi {
    let api = FakeApi::default();
    if let Some(c) = claim {
        let name = c["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        api.ipam_claims
            .borrow_mut()
            .insert(format!("{NS}/{name}"), c);
    }
    api.vmis.borrow_mut().insert(
        format!("{NS}/vm1"),
        VmiFacts {
            name: "vm1".into(),
            active_pods: active.iter().map(|s| s.to_string()).collect(),
        },
    );
    api
}

const REFERENCING: &str = r#"[{"name": "phys", "ipam-claim-reference": "vm1.phys"}]"#;

fn bind_as(api: &FakeApi, facts: &PodFacts, uid: &str) -> CniResult<Option<AdmittedClaim>> {
    let pod = ClaimingPod {
        namespace: NS,
        name: "virt-launcher-vm1-abcde",
        uid,
        facts,
    };
    bind(api, "phys", "net1", &pod)
}

#[test]
fn a_launcher_pod_of_the_claims_vm_is_bound_and_no_other_pod_is() {
    let vm_claim = || Some(claim_object("vm1.phys", "phys", Some("vm1")));
    // (the API's objects, the pod's networks, its UID, Ok(bound?) or the code refused)
    type Case = (
        &'static str,
        FakeApi,
        &'static str,
        &'static str,
        Result<bool, u32>,
    );
    let cases: Vec<Case> = vec![
        (
            "the VMI's active pod",
            api_with(vm_claim(), &["pod-a"]),
            REFERENCING,
            "pod-a",
            Ok(true),
        ),
        (
            "one of two active pods (a migration, or a pod posing as the VM's)",
            api_with(vm_claim(), &["pod-b", "pod-a"]),
            REFERENCING,
            "pod-a",
            Err(cni::code::TRY_AGAIN_LATER),
        ),
        (
            "no reference: not bound, nothing read",
            api_with(vm_claim(), &[]),
            r#"[{"name": "phys"}]"#,
            "pod-a",
            Ok(false),
        ),
        (
            "another pod naming the claim",
            api_with(vm_claim(), &["pod-b"]),
            REFERENCING,
            "pod-a",
            Err(cni::code::TRY_AGAIN_LATER),
        ),
        (
            "a claim not yet made",
            api_with(None, &["pod-a"]),
            REFERENCING,
            "pod-a",
            Err(cni::code::TRY_AGAIN_LATER),
        ),
        (
            "a claim of no VM",
            api_with(Some(claim_object("vm1.phys", "phys", None)), &["pod-a"]),
            REFERENCING,
            "pod-a",
            Err(cni::code::INVALID_CONFIG),
        ),
        (
            "a claim of another network",
            api_with(
                Some(claim_object("vm1.phys", "other", Some("vm1"))),
                &["pod-a"],
            ),
            REFERENCING,
            "pod-a",
            Err(cni::code::INVALID_CONFIG),
        ),
        (
            "a VM with no VMI",
            {
                let api = api_with(vm_claim(), &[]);
                api.vmis.borrow_mut().clear();
                api
            },
            REFERENCING,
            "pod-a",
            Err(cni::code::TRY_AGAIN_LATER),
        ),
        (
            "a reference that is no object name",
            api_with(vm_claim(), &["pod-a"]),
            r#"[{"name": "phys", "ipam-claim-reference": "No_Name"}]"#,
            "pod-a",
            Err(cni::code::INVALID_CONFIG),
        ),
    ];
    for (what, api, networks, uid, want) in cases {
        let got = bind_as(&api, &launcher(networks), uid);
        match (got, want) {
            (Ok(bound), Ok(b)) => assert_eq!(bound.is_some(), b, "{what}"),
            (Err(e), Err(code)) => assert_eq!(e.code, code, "{what}: {}", e.msg),
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
        if networks.contains("ipam-claim-reference\": \"vm1") {
            assert!(
                api.calls
                    .borrow()
                    .iter()
                    .any(|c| c == "get ipamclaim vms/vm1.phys"),
                "{what}: {:?}",
                api.calls.borrow()
            );
        } else {
            assert!(
                api.calls.borrow().is_empty(),
                "{what}: {:?}",
                api.calls.borrow()
            );
        }
    }
}

fn allocated() -> Outcome {
    Outcome::Allocated {
        ips: vec!["10.0.0.5/24".into()],
        pod: "virt-launcher-vm1-abcde".into(),
    }
}

/// VM vm1's claim, and its active launcher pod admitted to it.
fn admitted_launcher() -> (FakeApi, AdmittedClaim) {
    let api = api_with(
        Some(claim_object("vm1.phys", "phys", Some("vm1"))),
        &["pod-a"],
    );
    let admitted = bind_as(&api, &launcher(REFERENCING), "pod-a")
        .unwrap()
        .unwrap();
    (api, admitted)
}

fn stored(api: &FakeApi) -> Value {
    api.ipam_claims.borrow()[&format!("{NS}/vm1.phys")].clone()
}

/// Another writer's change to the stored claim, between this ADD's read
/// and its write.
fn rewrite_stored(api: &FakeApi, change: impl FnOnce(&mut Value)) {
    let mut claims = api.ipam_claims.borrow_mut();
    change(claims.get_mut(&format!("{NS}/vm1.phys")).unwrap());
}

#[test]
fn the_status_is_written_once_and_not_again_for_the_same_outcome() {
    let (api, mut bound) = admitted_launcher();
    write_status(&api, &mut bound, &allocated(), "2026-12-07T10:00:00Z");
    let status = &stored(&api)["status"];
    assert_eq!(status["ips"], json!(["10.0.0.5/24"]));
    assert_eq!(
        status["ownerPod"],
        json!({"name": "virt-launcher-vm1-abcde"})
    );
    assert_eq!(status["conditions"][0]["type"], IPS_ALLOCATED);
    assert_eq!(status["conditions"][0]["status"], "True");
    // A restart of the same pod with the same address writes nothing.
    let writes = || {
        api.calls
            .borrow()
            .iter()
            .filter(|c| c.starts_with("update ipamclaim/status"))
            .count()
    };
    assert_eq!(writes(), 1);
    write_status(&api, &mut bound, &allocated(), "2026-12-07T11:00:00Z");
    assert_eq!(writes(), 1, "{:?}", api.calls.borrow());
}

#[test]
fn a_status_write_that_lost_a_race_reads_the_claim_again_and_keeps_what_others_wrote() {
    let (api, mut bound) = admitted_launcher();
    // Someone else (the migration's other pod, ipam-extensions) wrote the
    // claim after this ADD read it.
    rewrite_stored(&api, |c| {
        c["metadata"]["resourceVersion"] = json!("7");
        c["status"] = json!({"conditions": [{"type": "Other", "status": "True"}]});
    });
    write_status(&api, &mut bound, &allocated(), "2026-12-07T10:00:00Z");
    let status = &stored(&api)["status"];
    assert_eq!(status["ips"], json!(["10.0.0.5/24"]));
    let types: Vec<&str> = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(types, ["Other", IPS_ALLOCATED]);
}

#[test]
fn a_status_write_gives_up_when_the_claim_is_gone_and_never_recreates_it() {
    let (api, mut bound) = admitted_launcher();
    api.ipam_claims.borrow_mut().clear();
    write_status(&api, &mut bound, &allocated(), "2026-12-07T10:00:00Z");
    assert!(api.ipam_claims.borrow().is_empty());
}

#[test]
fn allow_persistent_ips_needs_the_kubernetes_store_and_no_configured_identity() {
    let parse = |ipam: Value| IpamConfig::parse("phys", &ipam).unwrap();
    let kube = json!({"type": "kubernetes", "kubeconfig": "/etc/cni/net.d/sticky.kubeconfig"});
    let cases = [
        (json!({"subnet": "10.0.0.0/24"}), Some("file store")),
        (json!({"subnet": "10.0.0.0/24", "store": kube}), None),
        (
            json!({"subnet": "10.0.0.0/24", "store": kube, "identity": "peer"}),
            Some("remove ipam.identity"),
        ),
    ];
    for (ipam, refused) in cases {
        let got = refuse_persistent_ips_without_claims(&parse(ipam.clone()));
        match refused {
            None => assert!(got.is_ok(), "{ipam}: {got:?}"),
            Some(why) => {
                let e = got.unwrap_err();
                assert_eq!(e.code, cni::code::INVALID_CONFIG);
                assert!(e.msg.contains(why), "{ipam}: {}", e.msg);
            }
        }
    }
}

#[test]
fn a_status_write_never_lands_on_a_claim_re_created_under_the_same_name() {
    let (api, mut bound) = admitted_launcher();
    rewrite_stored(&api, |c| {
        c["metadata"]["uid"] = json!("uid-of-another-vm");
        c["metadata"]["resourceVersion"] = json!("9");
    });
    write_status(&api, &mut bound, &allocated(), "2026-12-07T10:00:00Z");
    assert_eq!(stored(&api)["status"], Value::Null);
}
