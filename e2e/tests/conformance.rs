//! Side by side with the reference macvlan (Debian containernetworking-plugins)
//! on identical inputs: same result JSON (modulo the random MAC) and the
//! same interface, addresses and routes inside the pod netns.

use serde_json::{json, Value};
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::state::{interface_state, link_names, mac_of, normalize_result};
use sticky_e2e::{ip, our_plugin, reference_plugin, CniCall, Topology, SUBNET_PREFIX};

const VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

#[derive(Clone)]
enum IpamKind {
    L2,
    HostLocal,
    DualStack,
    Static,
}

struct Case {
    label: String,
    version: String,
    ipam: IpamKind,
    extra: Value,
    args: String,
    /// Where the master lives: None = the node's uplink; Some = an uplink
    /// created inside each pod (linkInContainer).
    pod_master: bool,
}

impl Case {
    fn new(label: &str, version: &str, ipam: IpamKind) -> Case {
        Case {
            label: label.into(),
            version: version.into(),
            ipam,
            extra: json!({}),
            args: String::new(),
            pod_master: false,
        }
    }
}

struct Side {
    pod_netns: String,
    pod_path: String,
    config: Value,
    result: Option<Value>,
}

fn config_for(topo: &Topology, case: &Case, plugin_type: &str, version: &str, tag: &str) -> Value {
    let dir = topo.file(&format!("{}-{tag}", case.label));
    let ipam = match case.ipam {
        IpamKind::L2 => json!({}),
        IpamKind::HostLocal => configs::host_local(&dir),
        IpamKind::DualStack => configs::host_local_dual_stack(&dir),
        IpamKind::Static => configs::static_ipam(),
    };
    let master = if case.pod_master { "podup0" } else { "uplink0" };
    let mut c = configs::macvlan(plugin_type, version, master, ipam);
    configs::merge(&mut c, &case.extra);
    c
}

/// A call for one plugin's side of a case: its container, pod and CNI_ARGS.
fn side_call(
    plugin: &std::path::Path,
    node: &str,
    verb: &str,
    config: Value,
    case: &Case,
    tag: &str,
    pod_path: &str,
) -> CniCall {
    CniCall::new(plugin, node, verb, config)
        .container(&format!("c-{tag}"))
        .netns(pod_path)
        .args(&case.args)
}

fn add_side(
    topo: &mut Topology,
    case: &Case,
    plugin: &std::path::Path,
    plugin_type: &str,
    version: &str,
    tag: &str,
) -> (Side, sticky_e2e::CniReply) {
    let pod = topo.add_pod(&format!("{}-{tag}", case.label));
    if case.pod_master {
        topo.uplink(&pod.netns, "podup0");
    }
    let config = config_for(topo, case, plugin_type, version, tag);
    let reply = side_call(
        plugin,
        &topo.node(0).netns,
        "ADD",
        config.clone(),
        case,
        tag,
        &pod.path,
    )
    .run();
    let side = Side {
        pod_netns: pod.netns,
        pod_path: pod.path,
        config,
        result: reply.json.clone().filter(|_| reply.success),
    };
    (side, reply)
}

fn with_prev(config: &Value, prev: &Value) -> Value {
    let mut c = config.clone();
    c["prevResult"] = prev.clone();
    c
}

/// What one plugin did with a case: its reply, the pod state after ADD,
/// and whether CHECK and two DELs then succeeded.
struct Observed {
    reply: sticky_e2e::CniReply,
    state: Value,
    pod_netns: String,
}

/// Runs one case through one plugin: ADD, CHECK (>= 0.4.0), DEL twice.
/// The two plugins run one after the other so they never share the wire
/// (same IPs, same MACs).
fn exercise(
    topo: &mut Topology,
    case: &Case,
    plugin: &std::path::Path,
    plugin_type: &str,
    version: &str,
    tag: &str,
) -> Observed {
    let label = &case.label;
    let (side, reply) = add_side(topo, case, plugin, plugin_type, version, tag);
    if !reply.success {
        let pod_netns = side.pod_netns.clone();
        return Observed {
            reply,
            state: interface_state(&pod_netns, "net1"),
            pod_netns,
        };
    }
    let state = interface_state(&side.pod_netns, "net1");
    let iface = &reply.expect_ok()["interfaces"][0];
    if let Some(mac) = iface.get("mac") {
        assert_eq!(
            mac.as_str().map(str::to_string),
            mac_of(&side.pod_netns, "net1"),
            "{label} {tag}: result MAC is the link's"
        );
    }
    if let Some(sandbox) = iface.get("sandbox") {
        assert_eq!(sandbox, &json!(side.pod_path), "{label} {tag}");
    }
    let node = topo.node(0).netns.clone();
    if version >= "0.4.0" {
        let prev = side.result.clone().unwrap_or(Value::Null);
        let check = side_call(
            plugin,
            &node,
            "CHECK",
            with_prev(&side.config, &prev),
            case,
            tag,
            &side.pod_path,
        )
        .run();
        assert!(
            check.success,
            "{label}: {tag} CHECK after ADD failed: {}",
            check.stdout
        );
    }
    for round in 1..=2 {
        let mut config = side.config.clone();
        if let Some(prev) = &side.result {
            config = with_prev(&config, prev);
        }
        let r = side_call(plugin, &node, "DEL", config, case, tag, &side.pod_path).run();
        assert!(
            r.success,
            "{label}: {tag} DEL #{round} failed: {}",
            r.stdout
        );
    }
    assert!(
        interface_state(&side.pod_netns, "net1").is_null(),
        "{label}: {tag} DEL left net1"
    );
    let dir = topo.file(&format!("{label}-{tag}"));
    assert!(
        configs::host_local_allocations(&dir).is_empty(),
        "{label}: {tag} DEL left host-local state"
    );
    Observed {
        reply,
        state,
        pod_netns: side.pod_netns,
    }
}

/// Runs one case on both plugins and compares everything observable.
fn compare(topo: &mut Topology, case: &Case) {
    let delegated = !matches!(case.ipam, IpamKind::L2);
    let delegate_knows = sticky_e2e::reference_versions().contains(&case.version);
    if case.version == "1.1.0" && delegated && !delegate_knows {
        // Debian's host-local and static stop at 1.0.0: the delegate refuses
        // and we must pass its refusal on and leave nothing behind (the
        // 1.10.0 ones speak 1.1.0, and are compared like any version).
        let ours = exercise(topo, case, &our_plugin(), OUR_TYPE, &case.version, "our");
        assert_eq!(
            ours.reply.code(),
            Some(1),
            "{}: {}",
            case.label,
            ours.reply.stdout
        );
        assert!(
            ours.reply.msg().contains("ipam plugin"),
            "{}",
            ours.reply.msg()
        );
        assert!(
            link_names(&ours.pod_netns).is_empty(),
            "{}: link left after a refused ADD",
            case.label
        );
        return;
    }
    compare_against(topo, case, case)
}

/// Ours on `case`, the reference on `ref_case` (for what the Debian
/// reference cannot express, e.g. linkInContainer, which it predates).
fn compare_against(topo: &mut Topology, case: &Case, ref_case: &Case) {
    // Debian's reference speaks up to 1.0.0: for 1.1.0 it is compared at
    // 1.0.0 (the wire shape is the same); 1.10.0 speaks 1.1.0 itself.
    let ref_version = if sticky_e2e::reference_versions().contains(&case.version) {
        case.version.as_str()
    } else {
        "1.0.0"
    };
    let theirs = exercise(
        topo,
        ref_case,
        &reference_plugin("macvlan"),
        REF_TYPE,
        ref_version,
        "ref",
    );
    let ours = exercise(topo, case, &our_plugin(), OUR_TYPE, &case.version, "our");
    let label = &case.label;
    assert_eq!(
        ours.reply.success, theirs.reply.success,
        "{label}: ours={} ref={}",
        ours.reply.stdout, theirs.reply.stdout
    );
    if !theirs.reply.success {
        // Both refuse (e.g. L2-only in a 0.2.0 result). The reference leaks
        // the link here; we must not.
        assert_eq!(
            ours.reply.msg().split(':').next(),
            theirs.reply.msg().split(':').next(),
            "{label}: same reason"
        );
        assert!(
            link_names(&ours.pod_netns).is_empty(),
            "{label}: our failed ADD left a link"
        );
        return;
    }
    let mut ref_norm = normalize_result(theirs.reply.json.as_ref().unwrap_or(&Value::Null));
    ref_norm["cniVersion"] = json!(case.version);
    let our_norm = normalize_result(ours.reply.json.as_ref().unwrap_or(&Value::Null));
    assert_eq!(our_norm, ref_norm, "{label}: results differ");
    assert!(!theirs.state.is_null(), "{label}: reference made no net1");
    let mut their_state = theirs.state.clone();
    if their_state["link"]["txqlen"] == json!(1000) && ours.state["link"]["txqlen"].is_null() {
        // The 1.10.0 reference's netlink library sends IFLA_TXQLEN 1000;
        // ours, like 1.1.1, leaves the kernel's default for a macvlan. A
        // macvlan is a noqueue device, so the length has no effect: the one
        // difference accepted (docs/src/developer/tested.md).
        their_state["link"]["txqlen"] = Value::Null;
    }
    assert_eq!(ours.state, their_state, "{label}: pod state differs");
}

#[test]
fn every_version_with_l2_host_local_and_static_ipam() {
    let mut topo = Topology::new(1);
    for v in VERSIONS {
        for (kind, name) in [
            (IpamKind::L2, "l2"),
            (IpamKind::HostLocal, "hl"),
            (IpamKind::Static, "st"),
        ] {
            let case = Case::new(&format!("{name}{}", v.replace('.', "")), v, kind);
            compare(&mut topo, &case);
        }
    }
}

#[test]
fn dual_stack_host_local() {
    let mut topo = Topology::new(1);
    for v in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        compare(
            &mut topo,
            &Case::new(&format!("ds{}", v.replace('.', "")), v, IpamKind::DualStack),
        );
    }
}

#[test]
fn every_mode() {
    let mut topo = Topology::new(1);
    for mode in ["bridge", "private", "vepa", "passthru"] {
        let mut case = Case::new(&format!("mode-{mode}"), "1.0.0", IpamKind::HostLocal);
        case.extra = json!({"mode": mode});
        compare(&mut topo, &case);
    }
}

#[test]
fn explicit_mac_from_config_args_and_runtime_config() {
    let mut topo = Topology::new(1);
    let mut cases = Vec::new();
    let mut c = Case::new("mac-conf", "1.0.0", IpamKind::HostLocal);
    c.extra = json!({"mac": "02:13:00:00:00:01"});
    cases.push((c, "02:13:00:00:00:01"));
    let mut c = Case::new("mac-args", "1.0.0", IpamKind::HostLocal);
    c.extra = json!({"mac": "02:13:00:00:00:01"});
    c.args = "IgnoreUnknown=1;MAC=02:13:00:00:00:02".into();
    cases.push((c, "02:13:00:00:00:02"));
    let mut c = Case::new("mac-rc", "0.4.0", IpamKind::HostLocal);
    c.extra = json!({"mac": "02:13:00:00:00:01", "capabilities": {"mac": true}, "runtimeConfig": {"mac": "02:13:00:00:00:03"}});
    c.args = "IgnoreUnknown=1;MAC=02:13:00:00:00:02".into();
    cases.push((c, "02:13:00:00:00:03"));
    for (case, want) in cases {
        let ours = exercise(
            &mut topo,
            &case,
            &our_plugin(),
            OUR_TYPE,
            &case.version,
            "mac-our",
        );
        assert_eq!(
            ours.reply.expect_ok()["interfaces"][0]["mac"],
            json!(want),
            "{}",
            case.label
        );
        compare(&mut topo, &case);
    }
}

#[test]
fn link_in_container_mtu_and_default_master() {
    let mut topo = Topology::new(1);
    // The Debian reference (1.1.1) predates linkInContainer: ours, with the
    // master inside the pod, must build what the reference builds with the
    // master on the node.
    let mut case = Case::new("lic", "1.0.0", IpamKind::HostLocal);
    case.extra = json!({"linkInContainer": true});
    case.pod_master = true;
    let ref_case = Case::new("lic", "1.0.0", IpamKind::HostLocal);
    compare_against(&mut topo, &case, &ref_case);

    let mut case = Case::new("mtu", "1.0.0", IpamKind::HostLocal);
    case.extra = json!({"mtu": 1400});
    compare(&mut topo, &case);

    // No master: both take the interface of the node's default route.
    let node = topo.node(0).netns.clone();
    ip(&[
        "-n",
        &node,
        "addr",
        "add",
        &format!("{SUBNET_PREFIX}.250/24"),
        "dev",
        "uplink0",
    ]);
    ip(&[
        "-n",
        &node,
        "route",
        "add",
        "default",
        "via",
        &format!("{SUBNET_PREFIX}.1"),
    ]);
    let mut case = Case::new("defroute", "1.0.0", IpamKind::HostLocal);
    case.extra = json!({"master": ""});
    compare(&mut topo, &case);
}

#[test]
fn del_edge_cases_and_check_drift() {
    let mut topo = Topology::new(1);
    for (plugin, ty) in [
        (reference_plugin("macvlan"), REF_TYPE),
        (our_plugin(), OUR_TYPE),
    ] {
        let dir = topo.file(&format!("del-{ty}"));
        let config = configs::macvlan(ty, "1.0.0", "uplink0", configs::host_local(&dir));
        let node = topo.node(0).netns.clone();

        // DEL of a container that was never added.
        let pod = topo.add_pod(&format!("never-{ty}"));
        let r = CniCall::new(&plugin, &node, "DEL", config.clone())
            .container("never")
            .netns(&pod.path)
            .run();
        assert!(
            r.success,
            "{ty}: DEL of a never-added container: {}",
            r.stdout
        );

        // CHECK after someone removed the address must fail.
        let pod = topo.add_pod(&format!("drift-{ty}"));
        let add = CniCall::new(&plugin, &node, "ADD", config.clone())
            .container("drift")
            .netns(&pod.path)
            .run();
        let result = add.expect_ok().clone();
        let addr = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ip(&["-n", &pod.netns, "addr", "del", &addr, "dev", "net1"]);
        let check = CniCall::new(&plugin, &node, "CHECK", with_prev(&config, &result))
            .container("drift")
            .netns(&pod.path)
            .run();
        assert!(!check.success, "{ty}: CHECK passed with {addr} removed");
        if ty == OUR_TYPE {
            assert!(
                check.msg().contains(&addr),
                "our CHECK names the address: {}",
                check.msg()
            );
        }

        // DEL with the netns gone: success, and the IPAM is released.
        topo.delete_netns(&pod.netns);
        let r = CniCall::new(&plugin, &node, "DEL", with_prev(&config, &result))
            .container("drift")
            .netns(&pod.path)
            .run();
        assert!(r.success, "{ty}: DEL with the netns gone: {}", r.stdout);
        let r = CniCall::new(&plugin, &node, "DEL", config.clone())
            .container("drift")
            .run();
        assert!(r.success, "{ty}: DEL with no CNI_NETNS: {}", r.stdout);
        assert!(
            configs::host_local_allocations(&dir).is_empty(),
            "{ty}: IP still allocated after DEL"
        );
    }
}
