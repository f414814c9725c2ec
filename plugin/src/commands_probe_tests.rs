use super::*;

#[test]
fn a_dual_stack_add_probes_both_families_in_one_call_and_names_the_one_that_answered() {
    let dual = || CniOutput {
        ips: ["10.0.0.5/24", "fd00:59::5/64"]
            .map(|a| IpConfig {
                interface: None,
                address: a.parse().unwrap(),
                gateway: None,
            })
            .to_vec(),
        ..CniOutput::default()
    };
    let taken: Vec<std::net::IpAddr> =
        vec!["10.0.0.5".parse().unwrap(), "fd00:59::5".parse().unwrap()];
    let run = |nl: &mut FakeNetlink| {
        let mut ipam = FakeIpam {
            result: Some(dual()),
            taken: taken.clone(),
            ..FakeIpam::default()
        };
        add(&env(), &conf("1.0.0", json!({})), nl, Some(&mut ipam))
    };
    let probes = |nl: &FakeNetlink| -> Vec<String> {
        nl.calls
            .iter()
            .filter(|c| c.starts_with("probe_"))
            .cloned()
            .collect()
    };
    let one_call = |nl: &FakeNetlink| {
        let p = probes(nl);
        assert_eq!(p.len(), 1, "one probe for both families: {p:?}");
        assert!(
            p[0].contains("10.0.0.5") && p[0].contains("fd00:59::5"),
            "{p:?}"
        );
    };
    // One address live: refused in one probe call, naming that address,
    // the MAC that answered and how it was asked; nothing bound.
    let refused = |live: &mut FakeNetlink, ip: &str, mac: &str, how: &str| {
        let e = run(live).unwrap_err();
        assert_eq!(
            (e.code, e.refusal),
            (
                code::TRY_AGAIN_LATER,
                Some(crate::cni::Refusal::AnsweredOnWire)
            )
        );
        assert!(
            e.msg.starts_with(&format!("{ip} is still answered"))
                && e.msg.contains(&format!("{mac} ({how}")),
            "{}",
            e.msg
        );
        one_call(live);
        assert!(!live.calls.iter().any(|c| c.starts_with("add_address")));
    };
    let mut v6_live = nl();
    v6_live
        .ndp_owners
        .insert("fd00:59::5".parse().unwrap(), [2, 0, 0, 0, 0, 0x66]);
    refused(
        &mut v6_live,
        "fd00:59::5",
        "02:00:00:00:00:66",
        "duplicate address detection",
    );
    let mut v4_live = nl();
    v4_live
        .arp_owners
        .insert("10.0.0.5".parse().unwrap(), [2, 0, 0, 0, 0, 0x44]);
    refused(&mut v4_live, "10.0.0.5", "02:00:00:00:00:44", "ARP probe");
    // Nobody answers: one probe, then both addresses bound.
    let mut free = nl();
    run(&mut free).unwrap();
    one_call(&free);
    assert_eq!(
        free.calls
            .iter()
            .filter(|c| c.starts_with("add_address"))
            .count(),
        2,
        "{:?}",
        free.calls
    );
}
