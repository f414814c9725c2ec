use crate::claims::age;
use crate::import::host_local::{check_host_local_dir, is_host_local_entry, parse_host_local};
use crate::import::whereabouts::whereabouts_allocations;
use crate::judge::Judge;
use crate::metrics;
use crate::options::parse_opts;
use crate::reconcile::sweep_networks;
use crate::release::release_on;
use sticky_ipam::kube::KubeApi as _;

#[test]
fn only_a_host_local_network_directory_is_imported() {
    let root = std::env::temp_dir().join(format!("smv-import-{}", std::process::id()));
    let net = root.join("fabric");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.0.0.5"), "c1\r\nnet1").unwrap();
    std::fs::write(net.join("lock"), "").unwrap();
    assert!(check_host_local_dir(&net, "fabric").is_ok());
    let e = check_host_local_dir(&root, "fabric").unwrap_err();
    assert!(
        e.msg.contains("parent") && e.msg.contains("--from") && e.msg.contains("fabric"),
        "{}",
        e.msg
    );
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = check_host_local_dir(&empty, "fabric").unwrap_err();
    assert!(
        e.msg.contains("holds no host-local allocations"),
        "{}",
        e.msg
    );
    assert!(check_host_local_dir(&root.join("missing"), "fabric").is_err());
    for (name, host_local) in [
        ("10.0.0.5", true),
        ("fd00::5", true),
        ("lock", true),
        ("last_reserved_ip.0", true),
        ("fabric", false),
        ("README", false),
    ] {
        assert_eq!(is_host_local_entry(name), host_local, "{name}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn host_local_records_both_formats() {
    assert_eq!(
        parse_host_local("abc\r\nnet1"),
        Some(("abc".into(), "net1".into()))
    );
    assert_eq!(parse_host_local("abc"), Some(("abc".into(), "eth0".into())));
    assert_eq!(parse_host_local(""), None);
}

#[test]
fn options_are_checked() {
    let args: Vec<String> = ["--network", "n", "--json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let o = parse_opts(&args).unwrap();
    assert_eq!(o.network.as_deref(), Some("n"));
    assert!(o.flag("--json"));
    assert!(parse_opts(&["--bogus".to_string()]).is_err());
    assert!(parse_opts(&["--ip".to_string()]).is_err());
}

#[test]
fn ages_read_like_kubectl() {
    assert_eq!(age(0, 5), "5s");
    assert_eq!(age(0, 600), "10m");
    assert_eq!(age(0, 7200), "2h");
    assert_eq!(age(0, 3 * 86400), "3d");
}

#[test]
fn whereabouts_allocations_are_offsets_from_their_pools_range() {
    use serde_json::json;
    let pools = vec![
        json!({"metadata": {"name": "172.31.66.0-24"}, "spec": {"range": "172.31.66.0/24", "allocations": {
            "10": {"id": "c1", "podref": "db/a-0", "ifname": "net1"},
            "200": {"id": "c2", "podref": "db/a-1"}
        }}}),
        json!({"metadata": {"name": "other"}, "spec": {"range": "10.9.0.0/16", "allocations": {
            "5": {"id": "c3", "podref": "x/y"}
        }}}),
        json!({"metadata": {"name": "fd00-31-66---64"}, "spec": {"range": "fd00:31:66::/64", "allocations": {
            "4096": {"id": "c4", "podref": "db/a-0", "ifname": "net2"}
        }}}),
    ];
    let v4: ipnet::IpNet = "172.31.66.0/24".parse().unwrap();
    let got = whereabouts_allocations(&pools, &v4, "eth9").unwrap();
    let rows: Vec<(String, &str, &str, &str)> = got
        .iter()
        .map(|a| {
            (
                a.ip.to_string(),
                a.container_id.as_str(),
                a.ifname.as_str(),
                a.podref.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("172.31.66.10".to_string(), "c1", "net1", "db/a-0"),
            ("172.31.66.200".to_string(), "c2", "eth9", "db/a-1"),
        ]
    );
    let v6: ipnet::IpNet = "fd00:31:66::/64".parse().unwrap();
    let got = whereabouts_allocations(&pools, &v6, "net1").unwrap();
    assert_eq!(got[0].ip.to_string(), "fd00:31:66::1000");
    // A range with no pool adopts nothing; damaged pools are named.
    let none: ipnet::IpNet = "192.168.0.0/24".parse().unwrap();
    assert!(whereabouts_allocations(&pools, &none, "net1")
        .unwrap()
        .is_empty());
    for (bad, says) in [
        (
            json!({"metadata": {"name": "p"}, "spec": {"range": "172.31.66.0/24", "allocations": {"300": {"id": "c", "podref": "a/b"}}}}),
            "not an offset inside",
        ),
        (
            json!({"metadata": {"name": "p"}, "spec": {"range": "172.31.66.0/24", "allocations": {"x": {"id": "c", "podref": "a/b"}}}}),
            "not an offset",
        ),
        (
            json!({"metadata": {"name": "p"}, "spec": {"range": "172.31.66.0/24", "allocations": {"3": {"id": "c"}}}}),
            "lacks id or podref",
        ),
        (
            json!({"metadata": {"name": "p"}, "spec": {}}),
            "IPPool p has no valid spec.range",
        ),
    ] {
        let e = whereabouts_allocations(&[bad], &v4, "net1").unwrap_err();
        assert!(e.contains(says), "{e}");
    }
}

// --- Where verdicts get their evidence (issue 26, items 2 and 3) ---

use sticky_ipam::claim::{Claim, Holder};
use sticky_ipam::engine::ReleaseTarget;
use sticky_ipam::kube::fake::FakeApi;
use sticky_ipam::kube::{ClaimObject, ClusterNode, LockObject};
use sticky_ipam::liveness::Here;
use sticky_ipam::pod::PodFacts;
use sticky_ipam::store::ipclaim::KubeStore;

const NODE2_BOOT: &str = "b-node2";

/// A holder on `node` in `boot`, whose netns path does not exist on the
/// machine that runs the tests.
fn holder_of(pod: &str, uid: &str, node: &str, boot: &str) -> Holder {
    Holder {
        container_id: format!("c-{uid}"),
        ifname: "net1".into(),
        netns: format!("/var/run/netns/cni-{uid}-not-on-this-machine"),
        netns_id: None,
        pod_namespace: Some("db".into()),
        pod_name: Some(pod.into()),
        pod_uid: Some(uid.into()),
        node: node.into(),
        boot_id: boot.into(),
        since: 0,
    }
}

/// A sticky claim of `network` at `ip` held by `holder`, with its lock,
/// as the plugin leaves them.
fn seed(api: &FakeApi, network: &str, ip: &str, identity: &str, holder: Holder) {
    let ip: std::net::IpAddr = ip.parse().unwrap();
    let lock = api
        .create_lock(&LockObject {
            network: network.into(),
            ip,
            identity: identity.into(),
            created: 0,
            uid: None,
            node: Some(holder.node.clone()),
            unconfirmed: None,
            resource_version: None,
            adoptions: 0,
            written: None,
        })
        .unwrap();
    api.create_claim(&ClaimObject {
        network: network.into(),
        claim: Claim {
            ip,
            identity: identity.into(),
            sticky: true,
            holder: Some(holder),
            owner: None,
            namespace: Some("db".into()),
            created: 0,
            updated: 0,
            unconfirmed: None,
        },
        resource_version: None,
        lock_uid: lock.uid,
    })
    .unwrap();
}

fn run_pod(api: &FakeApi, pod: &str, uid: &str) {
    api.pods.borrow_mut().insert(
        format!("db/{pod}"),
        PodFacts {
            uid: uid.into(),
            phase: Some("Running".into()),
            ..PodFacts::default()
        },
    );
}

/// The holder of `network`'s claim at `ip`, as stored.
fn holder_at(api: &FakeApi, network: &str, ip: &str) -> Option<Holder> {
    api.claims
        .borrow()
        .values()
        .find(|o| o.network == network && o.claim.ip.to_string() == ip)
        .and_then(|o| o.claim.holder.clone())
}

/// The new db-0 (UID uid-2) is running and has taken over `network`'s
/// claim at `ip` from its predecessor (UID uid-1), as its ADD does.
fn recreate_db0_taking(network: &'static str, ip: &'static str) -> sticky_ipam::kube::fake::Race {
    Box::new(move |api: &FakeApi| {
        run_pod(api, "db-0", "uid-2");
        let rv = api.next_rv();
        let mut claims = api.claims.borrow_mut();
        let obj = claims
            .values_mut()
            .find(|o| o.network == network && o.claim.ip.to_string() == ip)
            .unwrap();
        obj.claim.holder = Some(holder_of("db-0", "uid-2", "node1", "b-node1"));
        obj.resource_version = Some(rv);
    })
}

fn api_only(api: &FakeApi) -> Judge<'_> {
    Judge::kube(api, None, &Here::default())
}

#[test]
fn release_with_node_from_a_machine_that_is_not_that_node_refuses_a_live_holder() {
    let api = FakeApi::default();
    api.nodes.borrow_mut().insert(
        "node2".into(),
        ClusterNode {
            ready: Some(true),
            ..ClusterNode::default()
        },
    );
    run_pod(&api, "sb-0", "uid-1");
    let ip = "172.31.59.2";
    seed(
        &api,
        "fabric",
        ip,
        "db/sb-0",
        holder_of("sb-0", "uid-1", "node2", NODE2_BOOT),
    );
    // `kubectl sticky release --network fabric --ip IP --node node2` run
    // from a workstation (another boot id), and from the host of the local
    // cluster, whose nodes share its kernel and so its boot id, but not
    // its mounts: neither has the installer's nodename file, and on
    // neither does the holder's netns path exist.
    for (machine, boot_id) in [("the host", NODE2_BOOT), ("a workstation", "b-workstation")] {
        let here = Here {
            hostname: "host".into(),
            boot_id: boot_id.into(),
            nodename: None,
            looked: vec![sticky_ipam::system::INSTALLED_NODENAME.into()],
        };
        let judge = Judge::kube(&api, Some("node2"), &here);
        let mut store = KubeStore::new(&api, "fabric", None, vec![]);
        let target = ReleaseTarget::Address(ip.parse().unwrap());
        let refused = release_on(&mut store, &judge, "fabric", &target, false);
        let e = refused.expect_err(machine);
        assert!(e.msg.contains("still running"), "{machine}: {}", e.msg);
        assert!(holder_at(&api, "fabric", ip).is_some(), "{machine}");
        assert!(
            judge
                .describe()
                .starts_with("the kubernetes API only: this machine is not"),
            "{machine}: {}",
            judge.describe()
        );
    }
    // A nodename file copied from node2 onto a machine of another boot.
    api.nodes.borrow_mut().get_mut("node2").unwrap().boot_id = Some(NODE2_BOOT.into());
    let copied = Here {
        hostname: "host".into(),
        boot_id: "b-workstation".into(),
        nodename: Some((
            "/etc/cni/net.d/sticky-macvlan.d/nodename".into(),
            "node2".into(),
        )),
        looked: vec![],
    };
    let judge = Judge::kube(&api, Some("node2"), &copied);
    assert!(
        judge.describe().contains("boot id differs"),
        "{}",
        judge.describe()
    );
    let mut store = KubeStore::new(&api, "fabric", None, vec![]);
    let target = ReleaseTarget::Address(ip.parse().unwrap());
    assert!(release_on(&mut store, &judge, "fabric", &target, false).is_err());
    // On node2 itself, where the sandbox's netns is gone, node2's own
    // evidence frees the claim whose pod object still says Running.
    let on_node2 = Here {
        boot_id: NODE2_BOOT.into(),
        ..copied
    };
    let judge = Judge::kube(&api, Some("node2"), &on_node2);
    assert_eq!(judge.from(), "node node2 and the kubernetes API");
    let released = release_on(&mut store, &judge, "fabric", &target, false).unwrap();
    assert_eq!(released.len(), 1);
    assert_eq!(holder_at(&api, "fabric", ip), None);
}

#[test]
fn a_sweep_judges_each_network_by_its_own_lookups() {
    // The old db-0 (uid-1) held an address on two networks and is gone.
    let api = FakeApi::default();
    seed(
        &api,
        "net-a",
        "10.0.0.5",
        "db/db-0",
        holder_of("db-0", "uid-1", "node1", "b-node1"),
    );
    seed(
        &api,
        "net-b",
        "10.1.0.5",
        "db/db-0",
        holder_of("db-0", "uid-1", "node1", "b-node1"),
    );
    // While the sweep releases net-a's holder, the new db-0 takes net-b's
    // claim over.
    *api.before.borrow_mut() = Some(("replace ".into(), recreate_db0_taking("net-b", "10.1.0.5")));
    let open = |n: &str| {
        Ok(sticky_ipam::backend::Store::Kube(Box::new(KubeStore::new(
            &api,
            n,
            None,
            vec![],
        ))))
    };
    let networks = ["net-a".to_string(), "net-b".to_string()];
    let judge = api_only(&api);
    let mut metrics = metrics::Metrics::default();
    let tally = sweep_networks(&networks, &open, &judge, false, false, &mut metrics).unwrap();
    assert_eq!(holder_at(&api, "net-a", "10.0.0.5"), None, "the old pod's");
    let kept = holder_at(&api, "net-b", "10.1.0.5").map(|h| h.pod_uid);
    assert_eq!(kept, Some(Some("uid-2".into())), "the new pod's is live");
    assert_eq!((tally.released, tally.alive), (1, 1), "{tally:?}");
}

#[test]
fn a_plan_made_again_after_a_409_looks_the_pods_up_again() {
    // The old db-0 (uid-1) is gone; reconcile releases its holder, and the
    // new db-0's takeover lands first: the release meets a 409.
    let api = FakeApi::default();
    seed(
        &api,
        "net-b",
        "10.1.0.5",
        "db/db-0",
        holder_of("db-0", "uid-1", "node1", "b-node1"),
    );
    *api.before.borrow_mut() = Some(("replace ".into(), recreate_db0_taking("net-b", "10.1.0.5")));
    let open = |n: &str| {
        Ok(sticky_ipam::backend::Store::Kube(Box::new(KubeStore::new(
            &api,
            n,
            None,
            vec![],
        ))))
    };
    let judge = api_only(&api);
    let mut metrics = metrics::Metrics::default();
    let tally = sweep_networks(
        &["net-b".to_string()],
        &open,
        &judge,
        false,
        false,
        &mut metrics,
    )
    .unwrap();
    let kept = holder_at(&api, "net-b", "10.1.0.5").map(|h| h.pod_uid);
    assert_eq!(kept, Some(Some("uid-2".into())), "the new pod's is live");
    assert_eq!((tally.released, tally.alive), (0, 1), "{tally:?}");
}

#[test]
fn a_later_networks_verdict_rests_on_a_lookup_of_its_own_plan() {
    // db-0 (one UID) holds an address on two networks and runs; it has
    // finished by the time the sweep reaches net-b.
    let api = FakeApi::default();
    run_pod(&api, "db-0", "uid-1");
    seed(
        &api,
        "net-a",
        "10.0.0.5",
        "db/db-0",
        holder_of("db-0", "uid-1", "node1", "b-node1"),
    );
    seed(
        &api,
        "net-b",
        "10.1.0.5",
        "db/db-0",
        holder_of("db-0", "uid-1", "node1", "b-node1"),
    );
    let open = |n: &str| {
        if n == "net-b" {
            if let Some(p) = api.pods.borrow_mut().get_mut("db/db-0") {
                p.phase = Some("Failed".into());
            }
        }
        Ok(sticky_ipam::backend::Store::Kube(Box::new(KubeStore::new(
            &api,
            n,
            None,
            vec![],
        ))))
    };
    let networks = ["net-a".to_string(), "net-b".to_string()];
    let judge = api_only(&api);
    let mut metrics = metrics::Metrics::default();
    let tally = sweep_networks(&networks, &open, &judge, false, false, &mut metrics).unwrap();
    assert!(holder_at(&api, "net-a", "10.0.0.5").is_some());
    assert_eq!(holder_at(&api, "net-b", "10.1.0.5"), None, "it finished");
    assert_eq!((tally.released, tally.alive), (1, 1), "{tally:?}");
    assert_eq!(api.count("get pod db/db-0"), 2, "{:?}", api.calls.borrow());
}
