#[test]
fn a_misspelt_args_cni_key_is_refused_naming_the_key_meant() {
    // (args.cni, refused with this key meant)
    let cases: Vec<(serde_json::Value, Option<&str>)> = vec![
        (serde_json::json!({"identiy": "peer-a"}), Some("identity")),
        (serde_json::json!({"Identity": "peer-a"}), Some("identity")),
        (serde_json::json!({"idnetity": "peer-a"}), Some("identity")),
        (serde_json::json!({"ipss": ["10.0.0.5"]}), Some("ips")),
        // Ours, another plugin's, or too short to call a typo.
        (serde_json::json!({"identity": "peer-a", "ips": []}), None),
        (
            serde_json::json!({"ip": "10.0.0.5", "mac": "x", "vlan": 5}),
            None,
        ),
        (serde_json::json!({"bandwidth": {}}), None),
    ];
    for (args, meant) in cases {
        let got = refuse_misspelt_args_cni(args.as_object().unwrap());
        match meant {
            None => assert!(got.is_ok(), "{args}: {got:?}"),
            Some(k) => {
                let e = got.unwrap_err();
                assert_eq!(e.code, cni::code::UNSUPPORTED_FIELD);
                assert!(e.msg.contains(&format!("did you mean {k:?}")), "{}", e.msg);
            }
        }
    }
}
use super::*;
use serde_json::json;

fn conf(extra: Value) -> IpamConfig {
    let mut v = json!({"subnet": "10.0.0.0/24"});
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    IpamConfig::parse("n", &v).unwrap()
}

fn args_cni(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn k8s() -> CniArgs {
    CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAMESPACE=bgp;K8S_POD_NAME=rs0-0;K8S_POD_UID=u1")
        .unwrap()
}

#[test]
fn precedence_table() {
    struct Case {
        conf: Value,
        args_cni: Value,
        args: CniArgs,
        pod: Option<PodFacts>,
        want: (&'static str, bool, IdentitySource),
    }
    let stateful = PodFacts {
        uid: "u1".into(),
        stateful_set: Some(crate::pod::StableOwner {
            kind: crate::pod::STATEFUL_SET,
            name: "rs0".into(),
            uid: "ss-uid".into(),
        }),
        ..PodFacts::default()
    };
    let annotated = PodFacts {
        identity_annotation: Some("peer-b".into()),
        ..stateful.clone()
    };
    let cases = [
        Case {
            conf: json!({"identity": "fixed", "identityPolicy": "podName"}),
            args_cni: json!({"identity": "peer-a"}),
            args: k8s(),
            pod: None,
            want: ("peer-a", true, IdentitySource::ArgsCni),
        },
        Case {
            conf: json!({"identity": "fixed", "identityPolicy": "podName"}),
            args_cni: json!({}),
            args: k8s(),
            pod: None,
            want: ("fixed", true, IdentitySource::Config),
        },
        Case {
            conf: json!({"identityPolicy": "podName"}),
            args_cni: json!({"identity": null}),
            args: k8s(),
            pod: None,
            want: ("bgp/rs0-0", true, IdentitySource::PodName),
        },
        Case {
            conf: json!({"identity": "fixed"}),
            args_cni: json!({}),
            args: k8s(),
            pod: Some(annotated.clone()),
            want: ("fixed", true, IdentitySource::Config),
        },
        Case {
            conf: json!({"identityPolicy": "podName"}),
            args_cni: json!({}),
            args: k8s(),
            pod: Some(annotated),
            want: ("peer-b", true, IdentitySource::Annotation),
        },
        Case {
            conf: json!({}),
            args_cni: json!({}),
            args: k8s(),
            pod: Some(stateful.clone()),
            want: ("bgp/rs0-0", true, IdentitySource::StatefulSet),
        },
        Case {
            conf: json!({}),
            args_cni: json!({}),
            args: CniArgs::default(),
            pod: Some(stateful),
            want: ("container:c1/net1", false, IdentitySource::Container),
        },
        Case {
            conf: json!({}),
            args_cni: json!({}),
            args: k8s(),
            pod: Some(PodFacts::default()),
            want: ("container:c1/net1", false, IdentitySource::Container),
        },
        Case {
            conf: json!({}),
            args_cni: json!({}),
            args: k8s(),
            pod: None,
            want: ("container:c1/net1", false, IdentitySource::Container),
        },
    ];
    for c in cases {
        let id = resolve(
            &conf(c.conf),
            &args_cni(c.args_cni),
            &c.args,
            "c1",
            "net1",
            c.pod.as_ref(),
        )
        .unwrap();
        assert_eq!((id.key.as_str(), id.sticky, id.source), c.want);
        assert_eq!(id.owner.is_some(), c.want.2 == IdentitySource::StatefulSet);
    }
}

/// `identityFrom` and other controllers than StatefulSet.
#[test]
fn identities_from_a_configured_key_and_other_ordinal_controllers() {
    let kube = json!({"store": {"type": "kubernetes", "kubeconfig": "/k"}});
    let with = |k: &str, v: Value| {
        let mut c = kube.clone();
        c[k] = v;
        c
    };
    let labelled = PodFacts {
        uid: "u1".into(),
        labels: [("example.com/ordinal".to_string(), "peer-3".to_string())].into(),
        annotations: [("example.com/slot".to_string(), "slot-1".to_string())].into(),
        ..PodFacts::default()
    };
    let kruise = PodFacts {
        stateful_set: Some(crate::pod::StableOwner {
            kind: crate::pod::ADVANCED_STATEFUL_SET,
            name: "rs0".into(),
            uid: "asts-uid".into(),
        }),
        ..labelled.clone()
    };
    // (ipam, pod, identity, source, owner kind)
    let cases: Vec<(Value, PodFacts, &str, IdentitySource, Option<&str>)> = vec![
        // The label's value, in the pod's own namespace.
        (
            with("identityFrom", json!({"label": "example.com/ordinal"})),
            labelled.clone(),
            "bgp/peer-3",
            IdentitySource::PodKey,
            None,
        ),
        (
            with("identityFrom", json!({"annotation": "example.com/slot"})),
            labelled.clone(),
            "bgp/slot-1",
            IdentitySource::PodKey,
            None,
        ),
        // A pod without the key falls through to the next source.
        (
            with("identityFrom", json!({"label": "example.com/absent"})),
            labelled.clone(),
            "container:c1/net1",
            IdentitySource::Container,
            None,
        ),
        (
            with("identityFrom", json!({"label": "example.com/absent"})),
            kruise.clone(),
            "bgp/rs0-0",
            IdentitySource::StatefulSet,
            Some(crate::pod::ADVANCED_STATEFUL_SET),
        ),
        // The configured key wins over the owner.
        (
            with("identityFrom", json!({"label": "example.com/ordinal"})),
            kruise.clone(),
            "bgp/peer-3",
            IdentitySource::PodKey,
            None,
        ),
        // An Advanced StatefulSet's pod is sticky by its name.
        (
            kube.clone(),
            kruise,
            "bgp/rs0-0",
            IdentitySource::StatefulSet,
            Some(crate::pod::ADVANCED_STATEFUL_SET),
        ),
    ];
    for (ipam, pod, key, source, owner) in cases {
        let id = resolve(
            &conf(ipam.clone()),
            &Map::new(),
            &k8s(),
            "c1",
            "net1",
            Some(&pod),
        )
        .unwrap_or_else(|e| panic!("{ipam}: {}", e.msg));
        assert_eq!((id.key.as_str(), id.source), (key, source), "{ipam}");
        assert_eq!(id.owner.as_ref().map(|o| o.kind.as_str()), owner, "{ipam}");
    }
    // Bad configs: not one key, an unknown kind, the file store.
    for (ipam, want) in [
        (with("identityFrom", json!({})), "takes one non-empty key"),
        (
            with("identityFrom", json!({"label": "a", "annotation": "b"})),
            "takes one non-empty key",
        ),
        (
            with("identityFrom", json!({"label": ""})),
            "takes one non-empty key",
        ),
        (
            with("identityFrom", json!({"field": "x"})),
            "identityFrom.field is unknown",
        ),
        (json!({"identityFrom": {"label": "x"}}), "needs \"store\""),
    ] {
        let mut v = json!({"subnet": "10.0.0.0/24"});
        v.as_object_mut()
            .unwrap()
            .extend(ipam.as_object().unwrap().clone());
        let e = IpamConfig::parse("n", &v).unwrap_err();
        assert!(e.msg.contains(want), "{ipam}: {}", e.msg);
    }
    // A value that is no identity is named.
    let mut bad = labelled;
    bad.labels
        .insert("example.com/ordinal".into(), "a\u{0}b".into());
    let e = resolve(
        &conf(with(
            "identityFrom",
            json!({"label": "example.com/ordinal"}),
        )),
        &Map::new(),
        &k8s(),
        "c1",
        "net1",
        Some(&bad),
    )
    .unwrap_err();
    assert!(e.msg.contains("pod label example.com/ordinal"), "{}", e.msg);
}

#[test]
fn untrusted_identities_are_bounded() {
    let c = conf(json!({}));
    let long = "x".repeat(10_000);
    for (bad, want) in [
        (json!({"identity": ""}), "is empty"),
        (json!({"identity": long}), "at most 320 bytes"),
        (json!({"identity": "a\u{0}b"}), "control character"),
        (json!({"identity": "a\nb"}), "control character"),
        (json!({"identity": 5}), "must be a string"),
    ] {
        let e = resolve(&c, &args_cni(bad), &CniArgs::default(), "c", "i", None).unwrap_err();
        assert_eq!(e.code, cni::code::INVALID_CONFIG);
        assert!(
            e.msg.contains("args.cni.identity") && e.msg.contains(want),
            "{}",
            e.msg
        );
    }
    // Path-like and unicode identities are fine: they are hashed, never used as paths.
    for ok in ["../../etc/passwd", "bgp/peer-a", "ピア-1", "/"] {
        let id = resolve(
            &c,
            &args_cni(json!({"identity": ok})),
            &CniArgs::default(),
            "c",
            "i",
            None,
        )
        .unwrap();
        assert_eq!(id.key, ok);
    }
}

#[test]
fn pod_name_policy_needs_the_pod_args() {
    let e = resolve(
        &conf(json!({"identityPolicy": "podName"})),
        &Map::new(),
        &CniArgs::default(),
        "c",
        "i",
        None,
    )
    .unwrap_err();
    assert_eq!(e.code, cni::code::INVALID_ENV);
    assert!(e.msg.contains("K8S_POD_NAME"));
}

#[test]
fn an_ipamclaim_gives_a_namespaced_identity_owned_by_the_claim_and_cni_args_contradict_it() {
    let claim = crate::ipamclaim::ClaimFacts {
        name: "vm1.phys".into(),
        uid: "uid-1".into(),
        network: "phys".into(),
        deleting: false,
        vm: Some("vm1".into()),
    };
    let id = for_ipam_claim(&Map::new(), "vms", &claim).unwrap();
    assert_eq!(id.key, "ipamclaim:vms/vm1.phys");
    assert!(id.sticky);
    assert_eq!(id.source, IdentitySource::IpamClaim);
    let owner = id.owner.unwrap();
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.namespace.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        (crate::ipamclaim::OWNER_KIND, "vms", "vm1.phys", "uid-1")
    );
    let e = for_ipam_claim(&args_cni(json!({"identity": "peer"})), "vms", &claim).unwrap_err();
    assert_eq!(e.code, cni::code::INVALID_CONFIG);
    assert!(e.msg.contains("remove one of the two"), "{}", e.msg);
    // Other cni-args keys are the chain's, but a typo of ours is still one.
    assert!(for_ipam_claim(&args_cni(json!({"mac": "x"})), "vms", &claim).is_ok());
    assert!(for_ipam_claim(&args_cni(json!({"identiy": "x"})), "vms", &claim).is_err());
}
