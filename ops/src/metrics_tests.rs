use super::*;

fn event(uid: &str, network: &str, reason: &str) -> SeenEvent {
    SeenEvent {
        uid: uid.into(),
        network: network.into(),
        reason: reason.into(),
        count: 1,
    }
}

#[test]
fn a_repeated_events_count_adds_only_what_it_grew_by() {
    let mut m = Metrics::default();
    let seen = |count| SeenEvent {
        count,
        ..event("u1", "fabric", "StickyAddressHeld")
    };
    let total = |m: &Metrics| m.events.values().sum::<u64>();
    m.observe_events(&[seen(1)]);
    m.observe_events(&[seen(1)]);
    assert_eq!(total(&m), 1);
    m.observe_events(&[seen(4)]);
    assert_eq!(total(&m), 4);
    // First seen with a count already (reconcile started late).
    m.observe_events(&[SeenEvent {
        count: 3,
        ..event("u2", "fabric", "StickyAddressHeld")
    }]);
    assert_eq!(total(&m), 7);
}

#[test]
fn gauges_counters_and_the_text_format() {
    let mut m = Metrics::default();
    m.networks.insert(
        "fabric".into(),
        NetworkGauges {
            range: Some(10.0),
            held: 6,
            reserved: 2,
            dead: 0,
            released: 1,
        },
    );
    m.networks.insert(
        "nad-less".into(),
        NetworkGauges {
            held: 1,
            ..NetworkGauges::default()
        },
    );
    m.observe_events(&[
        event("u1", "fabric", "StickyPoolExhausted"),
        event("u2", "fabric", "StickyPoolExhausted"),
        event("u3", "fabric", "StickyAddressTakenOver"),
        event("u4", "fabric", "StickyAddressReclaimed"),
    ]);
    // Listed again next sweep: counted once.
    m.observe_events(&[
        event("u1", "fabric", "StickyPoolExhausted"),
        event("u5", "fabric", "StickyAddressHeld"),
    ]);
    m.released("fabric", 3);
    m.swept(0.25, true);
    m.swept(0.5, false);
    m.api_error();
    m.api_error();
    let text = m.render();
    for line in [
        "sticky_macvlan_range_addresses{network=\"fabric\"} 10",
        "sticky_macvlan_addresses{network=\"fabric\",state=\"held\"} 6",
        "sticky_macvlan_addresses{network=\"fabric\",state=\"reserved\"} 2",
        "sticky_macvlan_addresses{network=\"fabric\",state=\"released\"} 1",
        "sticky_macvlan_addresses{network=\"nad-less\",state=\"held\"} 1",
        "sticky_macvlan_free_addresses{network=\"fabric\"} 1",
        "sticky_macvlan_refusals_total{network=\"fabric\",reason=\"StickyPoolExhausted\"} 2",
        "sticky_macvlan_refusals_total{network=\"fabric\",reason=\"StickyAddressHeld\"} 1",
        "sticky_macvlan_takeovers_total{network=\"fabric\"} 1",
        "sticky_macvlan_reclaims_total{network=\"fabric\"} 1",
        "sticky_macvlan_reconcile_released_total{network=\"fabric\"} 3",
        "sticky_macvlan_reconcile_sweeps_total 2",
        "sticky_macvlan_reconcile_failed_sweeps_total 1",
        "sticky_macvlan_api_errors_total 2",
        "sticky_macvlan_reconcile_sweep_duration_seconds 0.5",
        "# TYPE sticky_macvlan_refusals_total counter",
        "# TYPE sticky_macvlan_addresses gauge",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
    // No range known: no range or free sample for that network.
    assert!(!text.contains("sticky_macvlan_free_addresses{network=\"nad-less\"}"));
    // Every sample line is `name{labels} value` or `name value`.
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let (_, v) = l.rsplit_once(' ').unwrap();
        assert!(v.parse::<f64>().is_ok(), "{l}");
    }
    assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
}

#[test]
fn ranges_come_from_the_nads_sticky_ipam_sections() {
    let configs = [
        r#"{"cniVersion":"1.0.0","name":"fabric","type":"sticky-macvlan","master":"eth1","ipam":{"type":"sticky-ipam","subnet":"10.0.0.0/24","rangeStart":"10.0.0.10","rangeEnd":"10.0.0.13"}}"#,
        // The same network defined wider in another namespace: the larger.
        r#"{"cniVersion":"1.0.0","name":"fabric","type":"sticky-macvlan","master":"eth1","ipam":{"type":"sticky-ipam","subnet":"10.0.0.0/24","rangeStart":"10.0.0.10","rangeEnd":"10.0.0.19"}}"#,
        r#"{"cniVersion":"1.0.0","name":"listed","plugins":[{"type":"sticky-macvlan","master":"eth1","ipam":{"type":"sticky-ipam","ranges":[[{"subnet":"10.1.0.0/29"}],[{"subnet":"fd00::/126"}]]}}]}"#,
        r#"{"cniVersion":"1.0.0","name":"theirs","type":"macvlan","ipam":{"type":"whereabouts","range":"10.2.0.0/24"}}"#,
        // Excluded addresses are not in the pool: 10 less the /30.
        r#"{"cniVersion":"1.0.0","name":"cut","type":"sticky-macvlan","master":"eth1","ipam":{"type":"sticky-ipam","subnet":"10.3.0.0/24","rangeStart":"10.3.0.10","rangeEnd":"10.3.0.19","exclude":["10.3.0.12/30"]}}"#,
        "not json",
    ]
    .map(String::from);
    let r = ranges_of(&configs);
    // 10.0.0.10-19: ten addresses, none of them special.
    assert_eq!(r.get("fabric"), Some(&10.0));
    assert!(r.get("listed").is_some_and(|n| *n > 0.0));
    assert_eq!(r.get("theirs"), None);
    assert_eq!(r.get("cut"), Some(&6.0));
    assert_eq!(r.len(), 3);
}

#[test]
fn the_server_answers_metrics_and_nothing_else() {
    let page = Arc::new(Mutex::new(
        "sticky_macvlan_reconcile_sweeps_total 1\n".to_string(),
    ));
    // A free port on loopback.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    serve(&format!("127.0.0.1:{port}"), page).unwrap();
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut s, &mut out).unwrap();
        out
    };
    let ok = get("/metrics");
    assert!(
        ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("sweeps_total 1\n"),
        "{ok}"
    );
    assert!(ok.contains("text/plain; version=0.0.4"));
    assert!(get("/").starts_with("HTTP/1.1 404"));
}
