//! What is refused and leaves nothing: a live holder, a bad config, a
//! damaged record, a symlink.

use super::*;

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let claims = dir.join(NET).join("claims");
    std::fs::read_dir(&claims)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().to_string(),
                        std::fs::read(e.path()).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// An identity held by a live holder is refused with code 11 naming it,
/// and nothing changes.
#[test]
fn live_holder_is_refused_and_nothing_changes() {
    let mut topo = Topology::new(2);
    let store = topo.file("store");
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["args"] = json!({"cni": {"identity": "peer-b"}});
    let holder = topo.add_pod("holder");
    let ip = call(
        &topo,
        0,
        "ADD",
        &conf,
        "holder",
        &holder,
        &default_pod_args("peer-b-1", "uid-1"),
    )
    .first_address();
    let before = snapshot(&store);
    let rival = topo.add_pod("rival");
    let refused = call(
        &topo,
        1,
        "ADD",
        &conf,
        "rival",
        &rival,
        &default_pod_args("peer-b-2", "uid-2"),
    );
    refused.expect_refused(11, &[&ip, "default/peer-b-1", "still exists"]);
    assert_eq!(snapshot(&store), before, "the store is untouched");
    assert_eq!(
        links_in(&rival.netns),
        vec!["lo".to_string()],
        "no link is left"
    );
    assert!(
        topo.ping_eventually(&holder.netns, &format!("{SUBNET_PREFIX}.1"), 2),
        "the holder still works"
    );
}

/// Invalid sticky-ipam configs fail before anything is created.
#[test]
fn invalid_ipam_config_leaves_nothing() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let pod = topo.add_pod("p");
    for (extra, want) in [
        (json!({"rangeStart": "10.213.1.5"}), "rangeStart"),
        (json!({"gateway": "10.9.9.9"}), "gateway"),
        (json!({"reservations": {"a": "10.99.0.1"}}), "reservations"),
    ] {
        let conf = configs::sticky("uplink0", &store, extra);
        let reply = call(&topo, 0, "ADD", &conf, "c", &pod, "");
        assert_eq!(reply.code(), Some(7), "{}", reply.stdout);
        assert!(reply.msg().contains(want), "{}", reply.msg());
        assert_eq!(links_in(&pod.netns), vec!["lo".to_string()]);
    }
    let mut conf = configs::sticky("uplink0", &store, json!({}));
    conf["args"] = json!({"cni": {"identity": "x".repeat(10_000)}});
    let reply = call(&topo, 0, "ADD", &conf, "c", &pod, "");
    assert_eq!(reply.code(), Some(7));
    assert!(reply.msg().contains("args.cni.identity"));
    assert_eq!(links_in(&pod.netns), vec!["lo".to_string()]);
    assert!(!store.join(NET).join("claims").exists() || snapshot(&store).is_empty());
}

/// Damaged file store: a truncated, an empty and a corrupt claim and a
/// foreign file. The plugin refuses to guess (the damaged identity gets
/// code 110 naming its record, and damaged addresses are never handed
/// out), everything else works and nothing else is lost; the CLI shows
/// each damaged record by name and removes it, after which the identity
/// is served again.
#[test]
fn damaged_store_records_are_named_refused_and_repairable() {
    let mut topo = Topology::new(1);
    let store = topo.file("damaged");
    let dir = store.to_string_lossy().to_string();
    let conf = |id: &str| {
        let mut c = configs::sticky("uplink0", &store, json!({}));
        c["args"] = json!({"cni": {"identity": id}});
        c
    };
    let mut ips = BTreeMap::new();
    for id in ["truncated", "empty", "corrupt", "intact"] {
        let pod = topo.add_pod(&format!("dmg-{id}"));
        let ip = call(&topo, 0, "ADD", &conf(id), id, &pod, "IgnoreUnknown=1").first_address();
        assert!(call(&topo, 0, "DEL", &conf(id), id, &pod, "IgnoreUnknown=1").success);
        topo.delete_netns(&pod.netns);
        ips.insert(id, ip);
    }
    let claims_dir = store.join(NET).join("claims");
    let path = |id: &str| claims_dir.join(&ips[id]);
    let whole = std::fs::read(path("truncated")).expect("claim");
    std::fs::write(path("truncated"), &whole[..whole.len() / 2]).expect("truncate");
    std::fs::write(path("empty"), b"").expect("empty");
    std::fs::write(path("corrupt"), [0xff, 0xfe, 0x00, 0x7b, 0x22]).expect("corrupt");
    std::fs::write(claims_dir.join("README.txt"), "left by someone\n").expect("foreign");

    // The damaged identities are refused, naming the record; no link left.
    for id in ["truncated", "empty", "corrupt"] {
        let pod = topo.add_pod(&format!("dmg2-{id}"));
        let r = call(
            &topo,
            0,
            "ADD",
            &conf(id),
            &format!("{id}-2"),
            &pod,
            "IgnoreUnknown=1",
        );
        assert_eq!(r.code(), Some(110), "{id}: {}", r.stdout);
        assert!(
            r.msg().contains(&ips[id]),
            "{id}: {:?} does not name the record",
            r.msg()
        );
        assert!(
            sticky_e2e::links_in(&pod.netns) == ["lo"],
            "{id}: a link was left"
        );
    }
    // Nothing else is lost: the intact identity keeps its address, and a
    // new one gets an address none of the damaged records names.
    let pod = topo.add_pod("dmg-intact-2");
    let r = call(
        &topo,
        0,
        "ADD",
        &conf("intact"),
        "intact-2",
        &pod,
        "IgnoreUnknown=1",
    );
    assert_eq!(r.first_address(), ips["intact"]);
    let pod = topo.add_pod("dmg-new");
    let fresh = call(
        &topo,
        0,
        "ADD",
        &conf("new"),
        "new",
        &pod,
        "IgnoreUnknown=1",
    )
    .first_address();
    assert!(
        !["truncated", "empty", "corrupt"]
            .iter()
            .any(|id| ips[id] == fresh),
        "{fresh} was damaged"
    );

    // The CLI shows every damaged record by name...
    let (ok, out, err) = sticky_e2e::scenario::run_cli(&["claims", "--dir", &dir]);
    assert!(ok, "{out}{err}");
    for name in [
        ips["truncated"].as_str(),
        ips["empty"].as_str(),
        ips["corrupt"].as_str(),
        "README.txt",
    ] {
        assert!(
            out.contains(name) && out.contains("damaged"),
            "claims does not show {name}: {out}"
        );
    }
    // ...and removes each; the identity is then served again.
    for name in [
        ips["truncated"].as_str(),
        ips["empty"].as_str(),
        ips["corrupt"].as_str(),
        "README.txt",
    ] {
        let (ok, out, err) = sticky_e2e::scenario::run_cli(&[
            "release",
            "--dir",
            &dir,
            "--network",
            NET,
            "--file",
            name,
        ]);
        assert!(ok, "release --file {name}: {out}{err}");
    }
    let pod = topo.add_pod("dmg-truncated-3");
    assert!(
        call(
            &topo,
            0,
            "ADD",
            &conf("truncated"),
            "truncated-3",
            &pod,
            "IgnoreUnknown=1"
        )
        .success
    );
    let by_identity = assert_invariants(&store, NET);
    assert_eq!(
        by_identity.get("intact").map(|ip| ip.to_string()),
        Some(ips["intact"].clone())
    );
}

/// State files through the real binary: every directory the plugin made
/// is 0700 and every file 0600 (the kubernetes store's node-local record
/// is written by the same code); a network directory that is a symlink (out
/// of the state directory) is refused by name and nothing is written
/// through it.
#[test]
fn state_is_private_and_symlinks_are_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let mut topo = Topology::new(1);
    let store = topo.file("private");
    let conf = {
        let mut c = configs::sticky("uplink0", &store, json!({}));
        c["args"] = json!({"cni": {"identity": "private-peer"}});
        c
    };
    let pod = topo.add_pod("private");
    assert!(call(&topo, 0, "ADD", &conf, "private", &pod, "IgnoreUnknown=1").success);
    let mut seen = 0;
    let mut stack = vec![store.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read store").flatten() {
            let meta = std::fs::symlink_metadata(e.path()).expect("stat");
            let mode = meta.permissions().mode() & 0o777;
            if meta.is_dir() {
                assert_eq!(mode, 0o700, "{} is {mode:o}", e.path().display());
                stack.push(e.path());
            } else {
                assert_eq!(mode, 0o600, "{} is {mode:o}", e.path().display());
            }
            seen += 1;
        }
    }
    assert!(seen >= 6, "too little state to judge: {seen} entries");

    // The network's directory replaced by a symlink to elsewhere.
    let elsewhere = topo.file("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    let linked = topo.file("linked");
    std::fs::create_dir_all(&linked).expect("mkdir");
    std::os::unix::fs::symlink(&elsewhere, linked.join(NET)).expect("symlink");
    let mut conf2 = configs::sticky("uplink0", &linked, json!({}));
    conf2["args"] = json!({"cni": {"identity": "linked-peer"}});
    let pod2 = topo.add_pod("linked");
    let r = call(&topo, 0, "ADD", &conf2, "linked", &pod2, "IgnoreUnknown=1");
    assert!(!r.success, "{}", r.stdout);
    assert!(r.msg().contains("symlink"), "{}", r.msg());
    assert_eq!(
        std::fs::read_dir(&elsewhere).expect("read").count(),
        0,
        "written through the symlink"
    );
    assert!(
        sticky_e2e::links_in(&pod2.netns) == ["lo"],
        "a link was left"
    );
}
