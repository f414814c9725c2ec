use super::*;

#[test]
fn the_element_of_this_attachment_names_the_claim() {
    let two = r#"[
        {"name": "other", "ipam-claim-reference": "vm1.other"},
        {"name": "phys", "namespace": "vms", "ipam-claim-reference": "vm1.phys"}
    ]"#;
    let named = r#"[
        {"name": "phys", "interface": "eth7", "ipam-claim-reference": "vm1.phys"},
        {"name": "plain"}
    ]"#;
    // (annotation, CNI_IFNAME, the claim, or the start of the error)
    /// The claim, or the start of the error.
    type Want = Result<Option<&'static str>, &'static str>;
    let cases: &[(&str, &str, Want)] = &[
        // Multus names elements without an interface net1, net2, ...
        (two, "net1", Ok(Some("vm1.other"))),
        (two, "net2", Ok(Some("vm1.phys"))),
        (two, "net3", Ok(None)),
        (two, "eth0", Ok(None)),
        // An element's own interface wins over its position.
        (named, "eth7", Ok(Some("vm1.phys"))),
        (named, "net1", Ok(None)),
        (named, "net2", Ok(None)),
        // The short form carries no reference.
        ("phys@net1, vms/other", "net1", Ok(None)),
        ("", "net1", Ok(None)),
        ("  ", "net1", Ok(None)),
        (
            r#"[{"name": "phys", "ipam-claim-reference": null}]"#,
            "net1",
            Ok(None),
        ),
        (
            r#"[{"name": "phys", "ipam-claim-reference": "Bad_Name"}]"#,
            "net1",
            Err("the net1 element"),
        ),
        (
            r#"[{"name": "phys", "ipam-claim-reference": 7}]"#,
            "net1",
            Err("the net1 element"),
        ),
        (
            r#"[{"name": "phys", "ipam-claim-reference": ""}]"#,
            "net1",
            Err("the net1 element"),
        ),
        (
            "[{",
            "net1",
            Err("pod annotation k8s.v1.cni.cncf.io/networks"),
        ),
        // Another element's bad reference is not this attachment's business.
        (
            r#"[{"name": "a", "ipam-claim-reference": 7}, {"name": "b", "ipam-claim-reference": "vm.b"}]"#,
            "net2",
            Ok(Some("vm.b")),
        ),
    ];
    for (annotation, ifname, want) in cases {
        let got = claim_reference(annotation, ifname);
        match want {
            Ok(w) => assert_eq!(
                got.as_ref().map(|o| o.as_deref()),
                Ok(*w),
                "{annotation} {ifname}"
            ),
            Err(start) => {
                let e = got.expect_err(annotation);
                assert!(e.starts_with(start), "{annotation}: {e}");
            }
        }
    }
}

#[test]
fn object_names_are_rfc_1123_subdomains() {
    for ok in ["vm1.phys", "a", "a-b.c-d", &"a".repeat(63)] {
        assert!(is_object_name(ok), "{ok}");
    }
    let long_label = "a".repeat(64);
    let too_long = ["a"; 127].join(".") + ".bb";
    for bad in [
        "",
        "A",
        "a_b",
        "-a",
        "a-",
        "a..b",
        ".a",
        long_label.as_str(),
        too_long.as_str(),
        "a/b",
    ] {
        assert!(!is_object_name(bad), "{bad:?}");
    }
}

#[test]
fn a_claim_key_is_namespaced_and_not_a_raw_identity_of_any_namespace() {
    let key = identity_key("vms", "vm1.phys");
    assert_eq!(key, "ipamclaim:vms/vm1.phys");
    // The tenancy rule gives a raw "A/B" to namespace A: here "ipamclaim:vms",
    // which no namespace can be called.
    let (owner, _) = key.split_once('/').unwrap();
    assert!(owner.contains(':'));
    assert_ne!(identity_key("a", "b.c"), identity_key("a.b", "c"));
}

fn claim_obj(owner: Value) -> Value {
    json!({
        "apiVersion": "k8s.cni.cncf.io/v1alpha1",
        "kind": "IPAMClaim",
        "metadata": {"name": "vm1.phys", "namespace": "vms", "uid": "c-uid",
                     "ownerReferences": owner, "finalizers": ["kubevirt.io/persistent-ipam"]},
        "spec": {"network": "phys", "interface": ""}
    })
}

fn vm_ref(api_version: &str, kind: &str, controller: bool) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": "vm1", "uid": "vm-uid",
           "controller": controller, "blockOwnerDeletion": true})
}

#[test]
fn a_claims_vm_is_its_kubevirt_controller_owner_only() {
    // (owner references, the VM read)
    let cases = [
        (
            json!([vm_ref("kubevirt.io/v1", "VirtualMachine", true)]),
            Some("vm1"),
        ),
        (
            json!([vm_ref("kubevirt.io/v1", "VirtualMachineInstance", true)]),
            Some("vm1"),
        ),
        // Not the controller, another group's kind, or no owner at all.
        (
            json!([vm_ref("kubevirt.io/v1", "VirtualMachine", false)]),
            None,
        ),
        (
            json!([vm_ref("example.com/v1", "VirtualMachine", true)]),
            None,
        ),
        (json!([vm_ref("v1", "VirtualMachine", true)]), None),
        (json!([vm_ref("kubevirt.io/v1", "Pod", true)]), None),
        (Value::Null, None),
    ];
    for (owners, want) in cases {
        let facts = ClaimFacts::parse(&claim_obj(owners.clone())).unwrap();
        assert_eq!(facts.vm.as_deref(), want, "{owners}");
        assert_eq!(facts.network, "phys");
        assert_eq!(facts.uid, "c-uid");
        assert!(!facts.deleting);
    }
    let mut no_network = claim_obj(Value::Null);
    no_network["spec"]["network"] = json!("");
    assert!(ClaimFacts::parse(&no_network)
        .unwrap_err()
        .contains("no spec.network"));
    let mut deleting = claim_obj(Value::Null);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-07T10:00:00Z");
    assert!(ClaimFacts::parse(&deleting).unwrap().deleting);
}

fn vmi(active: &[&str]) -> VmiFacts {
    VmiFacts::parse(&json!({
        "metadata": {"name": "vm1", "namespace": "vms"},
        "status": {"activePods": active.iter().map(|u| (u.to_string(), json!("node1"))).collect::<serde_json::Map<_, _>>()}
    }))
}

#[test]
fn only_the_vms_active_pods_may_use_its_claim() {
    let owned = ClaimFacts::parse(&claim_obj(json!([vm_ref(
        "kubevirt.io/v1",
        "VirtualMachine",
        true
    )])))
    .unwrap();
    let unowned = ClaimFacts::parse(&claim_obj(Value::Null)).unwrap();
    let deleting = ClaimFacts {
        deleting: true,
        ..owned.clone()
    };
    let launcher = vmi(&["pod-a"]);
    // Two active pods: a migration's target, or a pod posing as the VM's
    // (its owner reference written by its author); neither is taken for
    // the launcher, and neither is the launcher beside it.
    let two = vmi(&["pod-a", "pod-b"]);
    let none = vmi(&[]);
    // (claim, network, VMI, pod UID, the code refused with)
    type Case<'a> = (
        &'a ClaimFacts,
        &'a str,
        Option<&'a VmiFacts>,
        &'a str,
        Option<u32>,
    );
    let cases: Vec<Case> = vec![
        (&owned, "phys", Some(&launcher), "pod-a", None),
        (
            &owned,
            "phys",
            Some(&two),
            "pod-b",
            Some(code::TRY_AGAIN_LATER),
        ),
        (
            &owned,
            "phys",
            Some(&two),
            "pod-a",
            Some(code::TRY_AGAIN_LATER),
        ),
        // A pod that names the claim but virt-controller does not count.
        (
            &owned,
            "phys",
            Some(&launcher),
            "pod-x",
            Some(code::TRY_AGAIN_LATER),
        ),
        (
            &owned,
            "phys",
            Some(&none),
            "pod-a",
            Some(code::TRY_AGAIN_LATER),
        ),
        (&owned, "phys", None, "pod-a", Some(code::TRY_AGAIN_LATER)),
        // The claim is another network's.
        (
            &owned,
            "other",
            Some(&launcher),
            "pod-a",
            Some(code::INVALID_CONFIG),
        ),
        // A claim nobody's VM owns: no pod can be shown to be its launcher.
        (
            &unowned,
            "phys",
            Some(&launcher),
            "pod-a",
            Some(code::INVALID_CONFIG),
        ),
        (
            &deleting,
            "phys",
            Some(&launcher),
            "pod-a",
            Some(code::TRY_AGAIN_LATER),
        ),
    ];
    for (claim, network, vmi, pod_uid, want) in cases {
        let got = may_use(claim, network, vmi, "virt-launcher-vm1-abcde", pod_uid);
        match want {
            None => assert!(got.is_ok(), "{pod_uid} on {network}: {got:?}"),
            Some(c) => {
                let e = got.expect_err(pod_uid);
                assert_eq!(e.code, c, "{pod_uid} on {network}: {}", e.msg);
                assert!(e.msg.contains("vm1.phys"), "{}", e.msg);
            }
        }
    }
}

#[test]
fn a_failure_is_reported_with_the_standards_reason_where_it_has_one() {
    let with = |r: Option<Refusal>| {
        let mut e = CniError::new(code::TRY_AGAIN_LATER, "x");
        e.refusal = r;
        failure_reason(&e)
    };
    assert_eq!(with(Some(Refusal::PoolExhausted)), reason::SUBNET_EXHAUSTED);
    assert_eq!(
        with(Some(Refusal::AnsweredOnWire)),
        reason::IP_ADDRESS_CONFLICT
    );
    assert_eq!(
        with(Some(Refusal::AddressReserved)),
        reason::IP_ADDRESS_CONFLICT
    );
    assert_eq!(
        with(Some(Refusal::HolderAlive)),
        reason::HOLDER_MAY_BE_ALIVE
    );
    assert_eq!(
        with(Some(Refusal::NamespaceNotAllowed)),
        reason::NAMESPACE_NOT_ALLOWED
    );
    assert_eq!(with(None), reason::INTERNAL_ERROR);
}

#[test]
fn the_status_keeps_its_addresses_on_failure_and_its_transition_time_while_unchanged() {
    let ok = Outcome::Allocated {
        ips: vec!["10.0.0.5/24".into(), "fd00::5/64".into()],
        pod: "virt-launcher-vm1-abcde".into(),
    };
    let first = status(&Value::Null, &ok, 1, "t1");
    assert_eq!(first["ips"], json!(["10.0.0.5/24", "fd00::5/64"]));
    assert_eq!(
        first["ownerPod"],
        json!({"name": "virt-launcher-vm1-abcde"})
    );
    let cond = &first["conditions"][0];
    assert_eq!(cond["type"], "IPsAllocated");
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["reason"], "SuccessfulAllocation");
    assert_eq!(cond["lastTransitionTime"], "t1");
    assert_eq!(cond["observedGeneration"], 1);

    // The same outcome later: the transition time stays.
    let again = status(&first, &ok, 1, "t2");
    assert_eq!(again["conditions"][0]["lastTransitionTime"], "t1");
    assert_eq!(again["conditions"].as_array().unwrap().len(), 1);

    // A failure turns the condition False and keeps the addresses.
    let failed = Outcome::Failed {
        reason: reason::SUBNET_EXHAUSTED,
        message: "no free address".into(),
    };
    let bad = status(&again, &failed, 2, "t3");
    assert_eq!(bad["ips"], first["ips"]);
    assert_eq!(bad["ownerPod"], first["ownerPod"]);
    let cond = &bad["conditions"][0];
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "SubnetExhausted");
    assert_eq!(cond["lastTransitionTime"], "t3");

    // Conditions others wrote are left as they are.
    let mut foreign = first.clone();
    foreign["conditions"]
        .as_array_mut()
        .unwrap()
        .insert(0, json!({"type": "Other", "status": "True"}));
    let kept = status(&foreign, &failed, 2, "t4");
    assert_eq!(kept["conditions"][0]["type"], "Other");
    assert_eq!(kept["conditions"][1]["type"], "IPsAllocated");
}

#[test]
fn an_ipamclaims_address_is_retired_only_once_that_claim_is_gone() {
    let facts = ClaimFacts {
        name: "vm1.phys".into(),
        uid: "uid-1".into(),
        network: "phys".into(),
        deleting: false,
        vm: Some("vm1".into()),
    };
    let mine = owner("vms", &facts);
    let cases: &[(ClaimState, Option<&str>)] = &[
        (ClaimState::Present { uid: "uid-1" }, None),
        // A new VM of the same name has a new claim: the old address goes.
        (
            ClaimState::Present { uid: "uid-2" },
            Some("its IPAMClaim vms/vm1.phys was deleted and re-created"),
        ),
        (
            ClaimState::Missing,
            Some("its IPAMClaim vms/vm1.phys was deleted"),
        ),
        // No answer, or RBAC without `get ipamclaims`: nothing on a guess.
        (ClaimState::Unknown, None),
    ];
    for (state, want) in cases {
        assert_eq!(retired(&mine, *state).as_deref(), *want, "{state:?}");
    }
    // A StatefulSet owner is retention's business, never this one's.
    let set = Owner {
        kind: crate::pod::STATEFUL_SET.into(),
        ..mine
    };
    assert_eq!(retired(&set, ClaimState::Missing), None);
}
