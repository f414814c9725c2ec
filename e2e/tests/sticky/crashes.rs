//! Concurrent ADDs and kill -9 in the middle of ADD and DEL.

use super::*;

/// 64 concurrent ADDs of distinct identities on one node.
#[test]
fn concurrent_adds_get_distinct_addresses() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let conf = configs::sticky("uplink0", &store, json!({"identityPolicy": "podName"}));
    let pods: Vec<Pod> = (0..64).map(|i| topo.add_pod(&format!("c{i}"))).collect();
    let node = topo.node(0).netns.clone();
    let replies: Vec<CniReply> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let call = CniCall::new(&our_plugin(), &node, "ADD", conf.clone())
                    .container(&format!("ctr{i}"))
                    .netns(&pod.path)
                    .args(&default_pod_args(&format!("set-{i}"), &format!("uid-{i}")));
                s.spawn(move || call.run())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let ips: BTreeSet<String> = replies.iter().map(CniReply::first_address).collect();
    assert_eq!(ips.len(), 64, "64 distinct addresses");
    let held = assert_invariants(&store, NET);
    assert_eq!(held.len(), 64);
    for (i, reply) in replies.iter().enumerate() {
        assert_eq!(
            held[&format!("default/set-{i}")].to_string(),
            reply.first_address()
        );
    }
}

/// kill -9 at varied points of ADD and DEL, then what kubelet does next;
/// afterwards no duplicate IP, no leaked link, no lost sticky binding.
#[test]
fn kill_9_during_add_and_del_loses_nothing() {
    let mut topo = Topology::new(1);
    let store = topo.file("store");
    let conf = configs::sticky("uplink0", &store, json!({"identityPolicy": "podName"}));
    let node = topo.node(0).netns.clone();
    let identities = 6;
    let mut bound: BTreeMap<String, String> = BTreeMap::new();
    let mut killed = 0;
    // Where the kills landed: (claim written, link left in the pod) -> count.
    let mut landed: BTreeMap<(bool, bool), usize> = BTreeMap::new();
    let trials = 48;
    // Spread kills over a whole command as this machine runs it: start-up,
    // store, netlink. A throwaway ADD+DEL measures how long that is.
    let probe_pod = topo.add_pod("probe");
    let probe = CniCall::new(&our_plugin(), &node, "ADD", conf.clone())
        .container("probe")
        .netns(&probe_pod.path)
        .args(&default_pod_args("probe", "probe"));
    let span = probe.run().elapsed;
    probe.clone().command("DEL").run().expect_ok();
    let span_us = span.as_micros().max(1000) as usize;
    let deadline = Instant::now() + Duration::from_secs(240);
    for trial in 0..trials {
        assert!(
            Instant::now() < deadline,
            "crash trials ran past their time bound"
        );
        let name = format!("crash-{}", trial % identities);
        let uid = format!("uid-{trial}");
        let args = default_pod_args(&name, &uid);
        let delay = Duration::from_micros(((trial * 7919) % span_us) as u64);
        let pod = topo.add_pod(&format!("t{trial}"));
        let cid = format!("ctr-{trial}");
        let add = CniCall::new(&our_plugin(), &node, "ADD", conf.clone())
            .container(&cid)
            .netns(&pod.path)
            .args(&args);
        let kill_add = trial % 2 == 0;
        if kill_add {
            killed += usize::from(add.run_and_kill(delay));
            let claimed =
                holder_of(&store, NET, &format!("default/{name}")).as_deref() == Some(cid.as_str());
            let link_left = links_in(&pod.netns).len() > 1;
            *landed.entry((claimed, link_left)).or_default() += 1;
            // kubelet: tear the failed sandbox down, then a new sandbox.
            call(&topo, 0, "DEL", &conf, &cid, &pod, &args).expect_ok();
            topo.delete_netns(&pod.netns);
            let pod = topo.add_pod(&format!("t{trial}-retry"));
            let reply = call(&topo, 0, "ADD", &conf, &format!("{cid}-retry"), &pod, &args);
            let ip = reply.first_address();
            if let Some(old) = bound.insert(name.clone(), ip.clone()) {
                assert_eq!(old, ip, "{name} lost its sticky binding");
            }
            assert_eq!(
                links_in(&pod.netns),
                vec!["lo".to_string(), "net1".to_string()]
            );
            call(&topo, 0, "DEL", &conf, &format!("{cid}-retry"), &pod, &args).expect_ok();
            topo.delete_netns(&pod.netns);
        } else {
            let ip = add.run().first_address();
            if let Some(old) = bound.insert(name.clone(), ip.clone()) {
                assert_eq!(old, ip, "{name} lost its sticky binding");
            }
            let del = add.clone().command("DEL");
            killed += usize::from(del.run_and_kill(delay));
            // kubelet retries DEL until it succeeds.
            del.run().expect_ok();
            assert_eq!(
                links_in(&pod.netns),
                vec!["lo".to_string()],
                "DEL left a link"
            );
            assert_eq!(holder_of(&store, NET, &format!("default/{name}")), None);
            topo.delete_netns(&pod.netns);
        }
        let held = assert_invariants(&store, NET);
        let distinct: BTreeSet<_> = held.values().collect();
        assert_eq!(
            distinct.len(),
            held.len(),
            "duplicate IP after trial {trial}"
        );
    }
    eprintln!(
        "crash trials: {trials} over {span:?} commands, killed mid-command: {killed}; ADD kills by (claim written, link left): {landed:?}"
    );
    assert!(
        landed.keys().any(|(claimed, _)| *claimed),
        "no ADD was killed after its claim was written: {landed:?}"
    );
    // Macvlans are born in pod netns, so a crash never leaks one on the node.
    assert_eq!(
        links_in(&node),
        vec!["lo".to_string(), "uplink0".to_string()]
    );
    assert!(
        killed > trials / 4,
        "too few kills landed mid-command ({killed}): the delays miss the command"
    );
    assert_eq!(
        claims(&store, NET).len(),
        identities + 1,
        "the crash identities and the probe"
    );
}
