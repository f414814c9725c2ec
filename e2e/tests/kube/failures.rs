//! The API unreachable, a missing CRD, kill -9, a bad object, an adopted
//! lock's age: nothing lost, everything named.

use super::*;

/// The API stops answering: in kubelet's order, the old sandbox's DEL
/// succeeds, then the same pod's new sandbox on the same node is served
/// from the node-local record; anything else is refused with code 11;
/// nothing reaches the API.
#[test]
fn unreachable_api_serves_only_same_pod_readds() {
    let (mut topo, api) = nodes_on_api(1);
    let set_uid = api.add_stateful_set(NS, "db");
    let uid = api.add_pod(NS, "db-0", &api.node(1), Some(("db", &set_uid)), None);
    let other_uid = api.add_pod(NS, "db-1", &api.node(1), Some(("db", &set_uid)), None);
    let p1 = topo.add_pod("db-0-a");
    let ip =
        add_on_node(&topo, &api, 0, &p1, "db0-a", &pod_args_in_ns("db-0", &uid)).first_address();
    let before = api.claims();

    // Short deadlines, so the stopped API costs seconds, not minutes.
    api.request_timeout_ms.set(1500);
    let pid = server_pid(&api);
    let _ = Command::new("kill").args(["-STOP", &pid]).status();
    let resumed = scopeguard(pid.clone());
    // kubelet first tears the dead sandbox down: its DEL succeeds (kubelet
    // must not loop on it) and keeps the node-local record, since the API
    // still holds the claim for this pod.
    let del = CniCall::new(
        &our_plugin(),
        &topo.node(0).netns,
        "DEL",
        conf(&topo, &api, 0, json!({})),
    )
    .container("db0-a")
    .netns(&p1.path)
    .args(&pod_args_in_ns("db-0", &uid))
    .run();
    del.expect_ok();
    // Then the sandbox is re-created for the same pod (same UID): same
    // address, from the node-local record.
    let p2 = topo.add_pod("db-0-b");
    let again = add_on_node(&topo, &api, 0, &p2, "db0-b", &pod_args_in_ns("db-0", &uid));
    assert_eq!(again.first_address(), ip, "{}", again.stderr);
    // A pod this node holds nothing for: refused, nothing allocated.
    let p3 = topo.add_pod("db-1-a");
    let refused = add_on_node(
        &topo,
        &api,
        0,
        &p3,
        "db1-a",
        &pod_args_in_ns("db-1", &other_uid),
    );
    assert_eq!(refused.code(), Some(11), "{}", refused.stdout);
    assert!(
        refused.msg().contains("unreachable") || refused.msg().contains("did not answer"),
        "{}",
        refused.msg()
    );
    assert!(!sticky_e2e::ip_ok(&[
        "-n", &p3.netns, "link", "show", "net1"
    ]));
    drop(resumed);
    assert_eq!(
        api.claims(),
        before,
        "the API was written while it was unreachable"
    );
}

fn server_pid(api: &ApiServer) -> String {
    api.server_pid().map(|p| p.to_string()).unwrap_or_default()
}

/// Resumes a SIGSTOPped API server even when the test panics.
struct Resume(String);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

fn scopeguard(pid: String) -> Resume {
    Resume(pid)
}

/// Without the CRD the API answers 404 for the whole resource: ADD fails at
/// once with code 113 saying how to install it, rather than retrying, and
/// leaves no link.
#[test]
fn missing_crd_is_named_not_retried() {
    let (mut topo, api) = nodes_on_api(1);
    let (code, out) = api.request(
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ipclaims.sticky-macvlan.io",
        None,
    );
    assert_eq!(code, 200, "{out}");
    let pod = topo.add_pod("nocrd");
    let started = std::time::Instant::now();
    let r = add_on_node(
        &topo,
        &api,
        0,
        &pod,
        "nocrd",
        &pod_args_in_ns("nocrd", "u1"),
    );
    assert_eq!(r.code(), Some(113), "{}", r.stdout);
    assert!(
        r.msg().contains("sticky-macvlan crd | kubectl apply"),
        "{}",
        r.msg()
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "it retried: {:?}",
        started.elapsed()
    );
    assert!(!sticky_e2e::ip_ok(&[
        "-n", &pod.netns, "link", "show", "net1"
    ]));
}

/// An ADD that adopts a lock no claim names writes it first (the orphan
/// sweep's race, issue 26 item 5): on the real API server the lock's age
/// is the server's clock, not the writer's `spec.created`; the adoption's
/// write is stamped in the managed fields, so the sweep finds the lock
/// young; and a delete or adoption at the resourceVersion read before it
/// fails.
#[test]
fn an_adopted_lock_is_young_by_the_servers_clock_and_an_earlier_read_cannot_delete_it() {
    use sticky_ipam::kube::client::KubeClient;
    use sticky_ipam::kube::{lock_name, ApiError, KubeApi as _, LockObject};
    let (_topo, api) = nodes_on_api(1);
    let (netns, kubeconfig, network, node) = (
        api.netns.clone(),
        api.kubeconfig.clone(),
        api.network.clone(),
        api.node(1),
    );
    std::thread::spawn(move || {
        sticky_e2e::enter_netns(&netns);
        let client = KubeClient::from_kubeconfig(&kubeconfig, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("client: {e}"));
        let ip = "10.77.0.5".parse().unwrap();
        let name = lock_name(&network, ip);
        let made = client
            .create_lock(&LockObject {
                network: network.clone(),
                ip,
                identity: "peer".into(),
                // A node whose clock is an hour behind.
                created: sticky_ipam::claim::now_secs() - 3600,
                uid: None,
                node: Some(node.clone()),
                unconfirmed: None,
                resource_version: None,
                adoptions: 0,
                written: None,
            })
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        let now = sticky_ipam::claim::now_secs();
        assert!(
            made.created + 60 > now,
            "the lock's age is the writer's clock: {made:?}"
        );
        let uid = made.uid.clone().expect("uid");
        // managedFields' times have a resolution of a second.
        std::thread::sleep(Duration::from_millis(2100));
        let adopted = client
            .adopt_lock(&made, Some(&node))
            .unwrap_or_else(|e| panic!("adopt {name}: {e}"));
        assert_eq!(adopted.adoptions, 1, "{adopted:?}");
        assert_eq!(adopted.created, made.created, "{adopted:?}");
        assert!(
            adopted.written.is_some_and(|w| w >= made.created + 2),
            "the server stamped no time on the adoption: {adopted:?}"
        );
        let read = client.get_lock(&name).unwrap().expect("the lock");
        assert_eq!(read.written, adopted.written);
        // The sweep's delete at what it listed before the adoption fails,
        // and so does a second adoption from that read.
        let stale = made.resource_version.as_deref();
        assert!(
            matches!(
                client.delete_lock(&name, &uid, stale),
                Err(ApiError::Conflict(_))
            ),
            "a delete at the resourceVersion before the adoption succeeded"
        );
        assert!(matches!(
            client.adopt_lock(&made, Some(&node)),
            Err(ApiError::Conflict(_))
        ));
        client
            .delete_lock(&name, &uid, adopted.resource_version.as_deref())
            .unwrap_or_else(|e| panic!("delete {name} at its resourceVersion: {e}"));
    })
    .join()
    .expect("the client thread");
}

/// kill -9 at points spread over ADD and DEL on the kubernetes store, then
/// what kubelet does next (DEL, a new sandbox's ADD; or DEL again): the
/// pod keeps its address, no link is left, and the stored objects keep
/// every invariant.
#[test]
fn kill_9_on_the_kubernetes_store_loses_nothing() {
    let (mut topo, api) = nodes_on_api(1);
    let set = api.add_stateful_set(NS, "k");
    let names: Vec<(String, String)> = (0..4)
        .map(|i| {
            let name = format!("k-{i}");
            let uid = api.add_pod(NS, &name, &api.node(1), Some(("k", &set)), None);
            (name, uid)
        })
        .collect();
    let node = topo.node(0).netns.clone();
    let call = |topo: &Topology, cmd: &str, pod: &Pod, cid: &str, args: &str| {
        CniCall::new(
            &our_plugin(),
            &topo.node(0).netns,
            cmd,
            conf(topo, &api, 0, json!({})),
        )
        .container(cid)
        .netns(&pod.path)
        .args(args)
    };
    // The kill delays spread over a warm ADD's duration: the server's
    // first answers (its caches cold) take far longer than the rest, and
    // a span measured on them would put most kills after the command.
    let probe_pod = topo.add_pod("probe");
    let probe = call(
        &topo,
        "ADD",
        &probe_pod,
        "probe",
        &pod_args_in_ns("probe", "probe"),
    );
    probe.run().expect_ok();
    probe.clone().command("DEL").run().expect_ok();
    let span_us = probe.run().elapsed.as_micros().max(1000) as usize;
    probe.clone().command("DEL").run().expect_ok();
    let mut bound: std::collections::BTreeMap<String, String> = Default::default();
    let mut killed = 0;
    let trials = 24;
    let deadline = Instant::now() + Duration::from_secs(180);
    for trial in 0..trials {
        assert!(
            Instant::now() < deadline,
            "crash trials ran past their time bound"
        );
        let (name, uid) = &names[trial % names.len()];
        let args = pod_args_in_ns(name, uid);
        let delay = Duration::from_micros(((trial * 7919) % span_us) as u64);
        let pod = topo.add_pod(&format!("t{trial}"));
        let cid = format!("ctr-{trial}");
        let add = call(&topo, "ADD", &pod, &cid, &args);
        if trial % 2 == 0 {
            killed += usize::from(add.run_and_kill(delay));
            // kubelet: tear the failed sandbox down, then a new one.
            add.clone().command("DEL").run().expect_ok();
            topo.delete_netns(&pod.netns);
            let retry_pod = topo.add_pod(&format!("t{trial}-retry"));
            let retry = call(&topo, "ADD", &retry_pod, &format!("{cid}-r"), &args);
            let ip = retry.run().first_address();
            if let Some(old) = bound.insert(name.clone(), ip.clone()) {
                assert_eq!(old, ip, "{name} lost its sticky address");
            }
            assert_eq!(sticky_e2e::links_in(&retry_pod.netns), ["lo", "net1"]);
            retry.clone().command("DEL").run().expect_ok();
            topo.delete_netns(&retry_pod.netns);
        } else {
            let ip = add.run().first_address();
            if let Some(old) = bound.insert(name.clone(), ip.clone()) {
                assert_eq!(old, ip, "{name} lost its sticky address");
            }
            let del = add.clone().command("DEL");
            killed += usize::from(del.run_and_kill(delay));
            del.run().expect_ok();
            assert_eq!(sticky_e2e::links_in(&pod.netns), ["lo"], "DEL left a link");
            topo.delete_netns(&pod.netns);
        }
        let claims = api.claims();
        assert_claim_invariants(&claims);
        assert!(
            claims.iter().all(|c| c["status"]["holder"].is_null()),
            "a holder was left after trial {trial}: {claims:?}"
        );
    }
    eprintln!("kube crash trials: {trials}, killed mid-command: {killed}");
    assert!(
        killed > trials / 4,
        "too few kills landed mid-command: {killed}"
    );
    assert_eq!(sticky_e2e::links_in(&node), ["lo", "uplink0", "mgmt0"]);
}

/// An IPClaim with a bad spec (written past the schema, e.g. by hand):
/// its identity is refused with the object named, other identities are
/// served, and the CLI names it too; deleting it (kubectl) repairs.
#[test]
fn a_claim_object_with_a_bad_spec_is_named_not_guessed() {
    let (mut topo, api) = nodes_on_api(1);
    let identity = "broken-peer";
    let labels = json!({sticky_ipam::kube::LABEL_NETWORK: sticky_ipam::kube::slug(&api.network)});
    // Where the identity's IPv4 claim lives, so its ADD reads it.
    let name = sticky_ipam::kube::claim_name(&api.network, identity, sticky_ipam::addr::Family::V4);
    api.create(
        "/apis/sticky-macvlan.io/v1alpha1/ipclaims",
        json!({
            "apiVersion": "sticky-macvlan.io/v1alpha1", "kind": "IPClaim",
            "metadata": {"name": name, "labels": labels},
            "spec": {"network": api.network, "ip": "not-an-ip", "identity": identity, "sticky": true, "created": 1},
        }),
    );
    let pod = topo.add_pod("bad-spec");
    let other = topo.add_pod("good-spec");
    let base = conf(&topo, &api, 0, json!({}));
    let add_as = |id: &str, pod: &Pod, cid: &str| {
        let mut c = base.clone();
        c["args"] = json!({"cni": {"identity": id}});
        CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", c)
            .container(cid)
            .netns(&pod.path)
            .run()
    };
    let refused = add_as(identity, &pod, "bad-spec");
    assert!(!refused.success, "{}", refused.stdout);
    assert!(
        refused.msg().contains(&name) && refused.msg().contains("spec.ip"),
        "{}",
        refused.msg()
    );
    assert!(
        !sticky_e2e::ip_ok(&["-n", &pod.netns, "link", "show", "net1"]),
        "a link was left"
    );
    let served = add_as("fine-peer", &other, "good-spec");
    assert!(served.success, "{}", served.stdout);
    let (_, out) = cli_on_node1(&topo, &api, &["claims"]);
    assert!(
        out.contains(&name),
        "the CLI does not name the damaged object: {out}"
    );
    // kubectl delete ipclaim <name> repairs it.
    let (code, _) = api.request(
        "DELETE",
        &format!("/apis/sticky-macvlan.io/v1alpha1/ipclaims/{name}"),
        None,
    );
    assert_eq!(code, 200);
    let again = add_as(identity, &pod, "bad-spec");
    assert!(again.success, "{}", again.stdout);
    assert_claim_invariants(&api.claims());
}
