//! A kill at every named crash point, then kubelet's next step.

use super::*;

/// What kubelet does after a failed ADD.
#[derive(Clone, Copy)]
enum Next {
    /// The same sandbox's ADD again.
    RetryAdd,
    /// DEL of that sandbox, then a new sandbox.
    DelThenNewSandbox,
}

struct Bench<'a> {
    topo: &'a mut Topology,
    api: &'a ApiServer,
    store: Store,
    dir: std::path::PathBuf,
    seq: usize,
}

impl Bench<'_> {
    fn conf(&self) -> Value {
        let ipam = match self.store {
            Store::File => json!({}),
            Store::Kube => json!({
                "store": {"type": "kubernetes", "kubeconfig": self.api.kubeconfig, "dir": self.topo.file("faults-local")},
                "nodeName": self.api.node(1),
            }),
        };
        let mut c = configs::sticky(&self.topo.node(0).uplink, &self.dir, ipam);
        c["name"] = json!(self.api.network);
        c
    }

    fn sandbox(&mut self) -> (Pod, String) {
        self.seq += 1;
        (
            self.topo.add_pod(&format!("f{}", self.seq)),
            format!("sandbox{}", self.seq),
        )
    }

    fn call(
        &self,
        command: &str,
        pod: &Pod,
        cid: &str,
        identity: &str,
        fault: Option<&str>,
    ) -> CniReply {
        let mut conf = self.conf();
        conf["args"] = json!({"cni": {"identity": identity}});
        let mut call = CniCall::new(&our_plugin(), &self.topo.node(0).netns, command, conf)
            .container(cid)
            .netns(&pod.path)
            // One pod throughout: each sandbox is that pod's next one.
            .args("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=f-0;K8S_POD_UID=f-0-uid");
        if let Some(point) = fault {
            call = call.env("STICKY_FAULT", point);
        }
        call.run()
    }

    /// kubelet's teardown of a sandbox: DEL (true when it succeeded),
    /// no link may be left in it, then its netns goes.
    fn tear_down(
        &mut self,
        pod: &Pod,
        cid: &str,
        identity: &str,
        problems: &mut Vec<String>,
    ) -> bool {
        let ok = self.call("DEL", pod, cid, identity, None).success;
        let left = links_in(&pod.netns);
        if left != ["lo"] {
            problems.push(format!("links left in the sandbox after DEL: {left:?}"));
        }
        self.topo.delete_netns(&pod.netns);
        ok
    }

    fn claims(&self) -> Vec<Seen> {
        match self.store {
            Store::File => sticky_e2e::store::claims(&self.dir, &self.api.network)
                .into_iter()
                .map(|c| Seen {
                    ip: c.ip.to_string(),
                    identity: c.identity,
                    sticky: c.sticky,
                    holder: c.holder.map(|h| h.container_id),
                })
                .collect(),
            Store::Kube => seen_objects(self.api),
        }
    }
}

struct Row {
    store: &'static str,
    point: &'static str,
    case: String,
    injected: bool,
    recovered: bool,
    violations: Vec<String>,
}

/// Kills the ADD at `point`, runs `next`, and checks. `sticky`: the
/// identity already has an address from an earlier sandbox.
fn add_trial(
    b: &mut Bench,
    point: &'static str,
    sticky: bool,
    next: Next,
    kept: &mut BTreeMap<String, String>,
) -> Row {
    let identity = format!("peer-{}-{}", b.store.name(), b.seq);
    let mut before = None;
    if sticky {
        let (pod, cid) = b.sandbox();
        let r = b.call("ADD", &pod, &cid, &identity, None);
        before = Some(r.first_address());
        assert!(b.call("DEL", &pod, &cid, &identity, None).success);
        b.topo.delete_netns(&pod.netns);
    }
    let (pod, cid) = b.sandbox();
    let killed = b.call("ADD", &pod, &cid, &identity, Some(point));
    let injected = !killed.success && killed.stdout.trim().is_empty();
    let mut recovered = true;
    let mut problems = Vec::new();
    let mut ended_with = None;
    if !injected {
        // The point is not on this path (e.g. no new identity entry on a
        // re-ADD): the ADD simply succeeded.
        assert!(killed.success, "{point}: {}", killed.stdout);
        ended_with = Some(killed.first_address());
        assert!(b.call("DEL", &pod, &cid, &identity, None).success);
        b.topo.delete_netns(&pod.netns);
    } else {
        match next {
            Next::RetryAdd => {
                let r = b.call("ADD", &pod, &cid, &identity, None);
                recovered &= r.success;
                if r.success {
                    ended_with = Some(r.first_address());
                } else {
                    problems.push(format!("retried ADD failed: {}", r.stdout));
                }
                recovered &= b.tear_down(&pod, &cid, &identity, &mut problems);
            }
            Next::DelThenNewSandbox => {
                recovered &= b.tear_down(&pod, &cid, &identity, &mut problems);
                let (pod2, cid2) = b.sandbox();
                let r = b.call("ADD", &pod2, &cid2, &identity, None);
                recovered &= r.success;
                if r.success {
                    ended_with = Some(r.first_address());
                } else {
                    problems.push(format!("the new sandbox's ADD failed: {}", r.stdout));
                }
                recovered &= b.call("DEL", &pod2, &cid2, &identity, None).success;
                b.topo.delete_netns(&pod2.netns);
            }
        }
    }
    if let (Some(was), Some(now)) = (&before, &ended_with) {
        if was != now {
            problems.push(format!("identity {identity} moved from {was} to {now}"));
        }
    }
    if let Some(ip) = ended_with {
        kept.insert(identity, ip);
    }
    Row {
        store: b.store.name(),
        point,
        case: format!(
            "{} ADD, then {}",
            if sticky { "sticky re-" } else { "fresh" },
            match next {
                Next::RetryAdd => "ADD again",
                Next::DelThenNewSandbox => "DEL + new sandbox",
            }
        ),
        injected,
        recovered,
        violations: problems,
    }
}

/// Kills the DEL at `point`; kubelet retries DEL; a new sandbox follows.
fn del_trial(b: &mut Bench, point: &'static str, kept: &mut BTreeMap<String, String>) -> Row {
    let identity = format!("peer-{}-{}", b.store.name(), b.seq);
    let (pod, cid) = b.sandbox();
    let ip = b.call("ADD", &pod, &cid, &identity, None).first_address();
    let killed = b.call("DEL", &pod, &cid, &identity, Some(point));
    let injected = !killed.success && killed.stdout.trim().is_empty();
    let mut problems = Vec::new();
    let mut recovered = b.tear_down(&pod, &cid, &identity, &mut problems);
    let (pod2, cid2) = b.sandbox();
    let r = b.call("ADD", &pod2, &cid2, &identity, None);
    recovered &= r.success;
    if r.success && r.first_address() != ip {
        problems.push(format!(
            "identity {identity} moved from {ip} to {}",
            r.first_address()
        ));
    }
    recovered &= b.call("DEL", &pod2, &cid2, &identity, None).success;
    b.topo.delete_netns(&pod2.netns);
    kept.insert(identity, ip);
    Row {
        store: b.store.name(),
        point,
        case: "DEL, then DEL again + new sandbox".into(),
        injected,
        recovered,
        violations: problems,
    }
}

#[test]
fn kill_at_every_step_then_kubelet_next_step_keeps_the_invariants() {
    let mut topo = Topology::new(1);
    let api = topo.start_api();
    api.add_node(&api.node(1));
    let node_links = links_in(&topo.node(0).netns);
    let mut rows = Vec::new();
    for store in [Store::File, Store::Kube] {
        let dir = topo.file(&format!("faults-{}", store.name()));
        let mut b = Bench {
            topo: &mut topo,
            api: &api,
            store,
            dir,
            seq: 0,
        };
        let mut kept = BTreeMap::new();
        for &point in sticky_macvlan::cni::fault::POINTS {
            if point.starts_with("del-") {
                rows.push(del_trial(&mut b, point, &mut kept));
                continue;
            }
            for sticky in [false, true] {
                for next in [Next::RetryAdd, Next::DelThenNewSandbox] {
                    rows.push(add_trial(&mut b, point, sticky, next, &mut kept));
                }
            }
        }
        // The store as a whole, every sandbox gone.
        let claims = b.claims();
        let found = violations(&claims, &kept);
        rows.push(Row {
            store: store.name(),
            point: "(the whole store afterwards)",
            case: format!("{} claims, {} identities", claims.len(), kept.len()),
            injected: false,
            recovered: true,
            violations: found,
        });
        let leaked: Vec<String> = links_in(&b.topo.node(0).netns)
            .into_iter()
            .filter(|l| !node_links.contains(l))
            .collect();
        if !leaked.is_empty() {
            rows.push(Row {
                store: store.name(),
                point: "(the node netns afterwards)",
                case: "links".into(),
                injected: false,
                recovered: true,
                violations: vec![format!("links leaked into the node netns: {leaked:?}")],
            });
        }
    }

    println!(
        "\n{:<11} {:<28} {:<38} {:>8} {:>9} {:>10}",
        "store", "crash point", "case", "injected", "recovered", "violations"
    );
    for r in &rows {
        println!(
            "{:<11} {:<28} {:<38} {:>8} {:>9} {:>10}",
            r.store,
            r.point,
            r.case,
            if r.injected { "yes" } else { "-" },
            if r.recovered { "yes" } else { "NO" },
            r.violations.len()
        );
        for v in &r.violations {
            println!("    {v}");
        }
    }
    let injected = rows.iter().filter(|r| r.injected).count();
    let recovered = rows.iter().filter(|r| r.injected && r.recovered).count();
    let violations: usize = rows.iter().map(|r| r.violations.len()).sum();
    println!("faults injected: {injected}, recovered: {recovered}, violations: {violations}");
    // Every crash point was reached at least once on each store.
    for store in ["file", "kubernetes"] {
        for &point in sticky_macvlan::cni::fault::POINTS {
            assert!(
                rows.iter()
                    .any(|r| r.store == store && r.point == point && r.injected),
                "crash point {point} was never reached on the {store} store"
            );
        }
    }
    assert_eq!(recovered, injected, "some trials did not recover");
    assert_eq!(violations, 0, "invariant violations (see the table)");
}
