//! The fault matrix: the plugin is killed (SIGKILL, from a crash point the
//! debug build honours through `STICKY_FAULT`) at every step of ADD and
//! DEL, on the file store and on the kubernetes store, and then kubelet's
//! next step runs: a retried ADD, or DEL followed by a new sandbox.
//! Afterwards I1-I5 (ARCHITECTURE.md) are checked against what was written and
//! what is in the namespaces: no duplicate address, one address per
//! identity, no claim left held by a sandbox that is gone, no leaked link,
//! and an identity that had an address still has it.
//!
//! Prints the matrix: faults injected, recovered, violations.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sticky_e2e::kube_api::ApiServer;
use sticky_e2e::{configs, links_in, our_plugin, CniCall, CniReply, Pod, Topology};

#[derive(Clone, Copy, PartialEq)]
enum Store {
    File,
    Kube,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::File => "file",
            Store::Kube => "kubernetes",
        }
    }
}

/// What kubelet does after a failed ADD.
#[derive(Clone, Copy)]
enum Next {
    /// The same sandbox's ADD again.
    RetryAdd,
    /// DEL of that sandbox, then a new sandbox.
    DelThenNewSandbox,
}

/// One claim as either store holds it, for the invariant check.
struct Seen {
    ip: String,
    identity: String,
    sticky: bool,
    holder: Option<String>,
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

/// The stand-in's IPClaim objects of the test network, as `Seen`.
fn seen_objects(api: &ApiServer) -> Vec<Seen> {
    api.claims()
        .iter()
        .map(|c| Seen {
            ip: c["spec"]["ip"].as_str().unwrap_or_default().into(),
            identity: c["spec"]["identity"].as_str().unwrap_or_default().into(),
            sticky: c["spec"]["sticky"].as_bool().unwrap_or(false),
            holder: c["status"]["holder"]["containerID"]
                .as_str()
                .map(String::from),
        })
        .collect()
}

/// Section 3's invariants, with every sandbox gone: each problem, named.
fn violations(claims: &[Seen], kept: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut per_ip: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_identity: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in claims {
        *per_ip.entry(&c.ip).or_default() += 1;
        per_identity.entry(&c.identity).or_default().push(&c.ip);
        if let Some(h) = &c.holder {
            out.push(format!(
                "{} is still held by {h}, whose sandbox is gone",
                c.ip
            ));
        }
        if !c.sticky {
            out.push(format!("{} is a dynamic claim left behind", c.ip));
        }
    }
    for (ip, n) in per_ip.iter().filter(|(_, n)| **n > 1) {
        out.push(format!("{ip} is claimed {n} times"));
    }
    for (id, ips) in per_identity.iter().filter(|(_, ips)| ips.len() > 1) {
        out.push(format!("identity {id} holds {ips:?}"));
    }
    for (id, ip) in kept {
        if per_identity.get(id.as_str()).map(|v| v.as_slice()) != Some(&[ip.as_str()][..]) {
            out.push(format!("identity {id} lost its address {ip}"));
        }
    }
    out
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

/// API faults for the kubernetes store: 409 storms, 500s, answers past the
/// deadline and connections dropped mid-answer, each before the server
/// acts on the request or after (the write done, the client not told: a
/// claim created or a holder recorded without the plugin knowing). Pods
/// are attached the way kubelet does it (a failed ADD is followed by DEL
/// and a new sandbox, up to 8 tries); then the faults stop, everything is
/// deleted, and section 3's invariants are checked on the stored objects.
#[test]
fn api_faults_keep_the_invariants() {
    let mut topo = Topology::new(1);
    let api = topo.start_standin();
    api.add_node(&api.node(1));
    let plans: Vec<(&str, Value)> = vec![
        ("409 storm on writes", json!({"conflicts": 6})),
        (
            "500 before create",
            json!({"fault": "error500", "verbs": ["create"], "chance": 0.4}),
        ),
        (
            "500 after create",
            json!({"fault": "error500", "verbs": ["create"], "chance": 0.4, "after": true}),
        ),
        (
            "500 after update",
            json!({"fault": "error500", "verbs": ["update"], "chance": 0.4, "after": true}),
        ),
        (
            // The ADD and DEL paths read by name (GET), never by LIST.
            "500 before get",
            json!({"fault": "error500", "verbs": ["get"], "chance": 0.4}),
        ),
        (
            "slow create, past the deadline, after",
            json!({"fault": "slow", "verbs": ["create"], "chance": 0.4, "after": true, "delayMs": 1500}),
        ),
        (
            "slow update, past the deadline, after",
            json!({"fault": "slow", "verbs": ["update"], "chance": 0.4, "after": true, "delayMs": 1500}),
        ),
        (
            "slow answers within the deadline",
            json!({"fault": "slow", "chance": 1.0, "delayMs": 150}),
        ),
        (
            "dropped connection after create",
            json!({"fault": "drop", "verbs": ["create"], "chance": 0.4, "after": true}),
        ),
        (
            "dropped connection before delete",
            json!({"fault": "drop", "verbs": ["delete"], "chance": 0.4}),
        ),
        (
            "dropped connection after delete",
            json!({"fault": "drop", "verbs": ["delete"], "chance": 0.4, "after": true}),
        ),
    ];
    let dir = topo.file("api-faults");
    let mut rows = Vec::new();
    let mut kept: BTreeMap<String, String> = BTreeMap::new();
    let mut seq = 0;
    for (label, plan) in &plans {
        api.fault_plan(plan.clone());
        api.reset_stats();
        let (mut attached, mut retries, mut failures) = (0, 0, Vec::new());
        for k in 0..4 {
            // Half sticky identities (kept across sandboxes), half dynamic.
            let identity = (k % 2 == 0).then(|| format!("apif-{seq}-{k}"));
            let mut conf = configs::sticky(
                &topo.node(0).uplink,
                &dir,
                json!({
                    "store": {"type": "kubernetes", "kubeconfig": api.kubeconfig, "timeoutMs": 1000, "dir": topo.file("api-faults-local")},
                    "nodeName": api.node(1),
                }),
            );
            conf["name"] = json!(api.network);
            if let Some(id) = &identity {
                conf["args"] = json!({"cni": {"identity": id}});
            }
            let mut done = false;
            for _attempt in 0..8 {
                seq += 1;
                let pod = topo.add_pod(&format!("af{seq}"));
                let cid = format!("af{seq}");
                let run = |cmd: &str| {
                    CniCall::new(&our_plugin(), &topo.node(0).netns, cmd, conf.clone())
                        .container(&cid)
                        .netns(&pod.path)
                        .args("IgnoreUnknown=1")
                        .run()
                };
                let add = run("ADD");
                if add.success {
                    attached += 1;
                    if let Some(id) = &identity {
                        let ip = add.first_address();
                        if let Some(was) = kept.insert(id.clone(), ip.clone()) {
                            if was != ip {
                                failures.push(format!("identity {id} moved from {was} to {ip}"));
                            }
                        }
                    }
                    // The pod goes away: DEL until it succeeds, as kubelet.
                    let mut deleted = false;
                    for _ in 0..8 {
                        if run("DEL").success {
                            deleted = true;
                            break;
                        }
                        retries += 1;
                    }
                    if !deleted {
                        failures.push(format!("DEL of {cid} never succeeded"));
                    }
                    topo.delete_netns(&pod.netns);
                    done = true;
                    break;
                }
                // A failed ADD: kubelet tears the sandbox down and tries anew.
                retries += 1;
                eprintln!("ADD {cid} failed: {}", add.stdout);
                for _ in 0..8 {
                    if run("DEL").success {
                        break;
                    }
                }
                topo.delete_netns(&pod.netns);
            }
            if !done {
                failures.push(format!("pod {k} was never attached"));
            }
        }
        let stats = api.stats();
        let injected: u64 = stats
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.starts_with("injected"))
                    .filter_map(|(_, v)| v.as_u64())
                    .sum()
            })
            .unwrap_or(0);
        api.fault_plan(json!({}));
        rows.push((label.to_string(), injected, attached, retries, failures));
    }
    // Everything is deleted. A DEL that met an unanswering API left its
    // claim for liveness (kubelet must not loop on DEL): one reconcile
    // sweep must explain every such claim, and then the stored objects
    // must obey section 3.
    // This machine is node1, whose pods' netns paths it sees, as the
    // installer's nodename file says on a real node.
    std::fs::write(api.kubeconfig.with_file_name("nodename"), api.node(1))
        .expect("write the nodename file");
    let sweep = std::process::Command::new("ip")
        .args(["netns", "exec", &topo.node(0).netns])
        .arg(our_plugin())
        .args(["reconcile", "--kubeconfig"])
        .arg(&api.kubeconfig)
        .args(["--node", &api.node(1)])
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run reconcile");
    let swept = String::from_utf8_lossy(&sweep.stdout).to_string();
    assert!(
        sweep.status.success(),
        "reconcile: {swept}{}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    let claims = seen_objects(&api);
    let after = violations(&claims, &kept);
    println!(
        "\n{:<40} {:>8} {:>9} {:>8} {:>10}",
        "API fault", "injected", "attached", "retries", "violations"
    );
    for (label, injected, attached, retries, failures) in &rows {
        println!(
            "{label:<40} {injected:>8} {attached:>6}/4 {retries:>8} {:>10}",
            failures.len()
        );
        for f in failures {
            println!("    {f}");
        }
    }
    println!("reconcile: {}", swept.trim());
    println!(
        "the stored objects afterwards: {} claims, violations: {}",
        claims.len(),
        after.len()
    );
    for v in &after {
        println!("    {v}");
    }
    // With STANDIN_TRACE=1 the stand-in logs every request and its fate.
    if std::env::var_os("STANDIN_TRACE").is_some() {
        let _ = std::fs::copy(
            topo.state_dir.join("standin.log"),
            std::env::temp_dir().join("standin-trace.log"),
        );
    }
    assert!(
        rows.iter().all(|r| r.1 > 0),
        "a fault plan injected nothing"
    );
    assert!(
        rows.iter().all(|r| r.4.is_empty()),
        "failures under API faults (see the table)"
    );
    assert!(
        after.is_empty(),
        "invariant violations in the stored objects"
    );
}

/// Load: 1,000 ADD/DEL cycles across three node netns sharing the stand-in,
/// two workers per node, half the pods StatefulSet pods (sticky), every
/// 10th write answered 409; bounded at 1,000 cycles and 240 s. A failed
/// call is retried as kubelet would (DEL, then a new ADD). Reports errors,
/// retries and violations; the target is 0 violations and no pod left
/// unattached.
#[test]
fn load_a_thousand_cycles_across_three_nodes() {
    const CYCLES: usize = 1000;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let mut topo = Topology::new(3);
    let api = topo.start_standin();
    for n in 1..=3 {
        api.add_node(&api.node(n));
    }
    let set_uid = api.add_stateful_set("default", "load");
    // Per node, its pods in order: StatefulSet pods recur (the same pod
    // restarting, its identity sticky), Deployment pods are new each time.
    let mut sts_uids: BTreeMap<String, String> = BTreeMap::new();
    let mut per_node: Vec<Vec<(String, String)>> = vec![Vec::new(); 3];
    for i in 0..CYCLES {
        let node = i % 3;
        let (name, uid) = if i % 2 == 0 {
            let name = format!("load-sts-{}", i % 48);
            let uid = sts_uids
                .entry(name.clone())
                .or_insert_with(|| {
                    api.add_pod(
                        "default",
                        &name,
                        &api.node(node + 1),
                        Some(("load", &set_uid)),
                        None,
                    )
                })
                .clone();
            (name, uid)
        } else {
            let name = format!("load-dep-{i}");
            let uid = api.add_pod("default", &name, &api.node(node + 1), None, None);
            (name, uid)
        };
        per_node[node].push((name, uid));
    }
    let workers: Vec<(usize, Pod)> = (0..6)
        .map(|w| (w % 3, topo.add_pod(&format!("load-w{w}"))))
        .collect();
    api.faults(0, 10);
    let next: Vec<std::sync::Mutex<usize>> = (0..3).map(|_| std::sync::Mutex::new(0)).collect();
    let tally = std::sync::Mutex::new((0usize, 0usize, 0usize, Vec::<String>::new()));
    let started = std::time::Instant::now();
    let (kubeconfig, network) = (api.kubeconfig.clone(), api.network.clone());
    let node_names: Vec<String> = (1..=3).map(|n| api.node(n)).collect();
    std::thread::scope(|s| {
        for (node, pod) in &workers {
            let (topo, pods, next, tally) = (&topo, &per_node[*node], &next[*node], &tally);
            let (kubeconfig, network, node_names) = (&kubeconfig, &network, &node_names);
            s.spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                    *n += 1;
                    *n - 1
                };
                if i >= pods.len() || std::time::Instant::now() > deadline {
                    return;
                }
                let (name, uid) = &pods[i];
                let mut conf = configs::sticky(
                    &topo.node(*node).uplink,
                    &topo.file("unused"),
                    json!({
                        "subnet": "10.232.0.0/22", "rangeStart": "10.232.0.10", "rangeEnd": "10.232.3.250", "gateway": "10.232.0.1",
                        "store": {"type": "kubernetes", "kubeconfig": kubeconfig, "dir": topo.file(&format!("load-local{node}"))},
                        "nodeName": node_names[*node],
                    }),
                );
                conf["name"] = json!(network);
                let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_UID={uid}");
                let run = |cmd: &str, cid: &str| {
                    CniCall::new(&our_plugin(), &topo.node(*node).netns, cmd, conf.clone())
                        .container(cid)
                        .netns(&pod.path)
                        .args(&args)
                        .run()
                };
                let (mut errors, mut retries, mut ok) = (0, 0, false);
                for attempt in 0..4 {
                    let cid = format!("load{node}-{i}-{attempt}");
                    if run("ADD", &cid).success {
                        ok = run("DEL", &cid).success || run("DEL", &cid).success;
                        break;
                    }
                    errors += 1;
                    retries += 1;
                    let _ = run("DEL", &cid);
                }
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                t.0 += usize::from(ok);
                t.1 += errors;
                t.2 += retries;
                if !ok {
                    t.3.push(format!("pod {i} ({name}) was not attached and detached"));
                }
            });
        }
    });
    let elapsed = started.elapsed();
    api.faults(0, 0);
    let (done, errors, retries, failures) = tally.into_inner().unwrap_or_else(|p| p.into_inner());
    let claims = api.claims();
    let held = claims
        .iter()
        .filter(|c| !c["status"]["holder"].is_null())
        .count();
    let stats = api.stats();
    println!(
        "\nload: {done}/{CYCLES} cycles in {:.1} s ({:.0} cycles/s), {errors} errors, {retries} retries, {} injected 409s, {} claims left ({held} held)",
        elapsed.as_secs_f64(),
        done as f64 / elapsed.as_secs_f64(),
        stats["injected 409"],
        claims.len()
    );
    for f in &failures {
        println!("    {f}");
    }
    sticky_e2e::kube_api::assert_claim_invariants(&claims);
    assert_eq!(held, 0, "claims still held after every DEL");
    assert_eq!(done, CYCLES, "not every cycle completed within the bound");
    assert!(failures.is_empty());
}
