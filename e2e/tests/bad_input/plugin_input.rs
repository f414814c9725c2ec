//! Bad input to sticky-macvlan: each refused with its code, nothing left.

use super::*;

#[track_caller]
fn assert_refused(
    label: &str,
    reply: &CniReply,
    code: u64,
    needle: &str,
    pod: &str,
    dir: &std::path::Path,
) {
    assert!(!reply.success, "{label}: accepted: {}", reply.stdout);
    assert!(
        !reply.stderr.contains("panicked"),
        "{label}: panic: {}",
        reply.stderr
    );
    let json = reply
        .json
        .as_ref()
        .unwrap_or_else(|| panic!("{label}: stdout is not a CNI error: {:?}", reply.stdout));
    assert!(
        json.get("cniVersion").is_some(),
        "{label}: error lacks cniVersion: {json}"
    );
    assert_eq!(reply.code(), Some(code), "{label}: {json}");
    assert!(
        reply.msg().contains(needle),
        "{label}: message {:?} does not name {needle:?}",
        reply.msg()
    );
    let leftovers: Vec<String> = link_names(pod)
        .into_iter()
        .filter(|n| n != "net1x")
        .collect();
    assert!(
        leftovers.is_empty() || leftovers == ["net1"] && needle == "already exists",
        "{label}: links left: {leftovers:?}"
    );
    assert!(
        configs::host_local_allocations(dir).is_empty(),
        "{label}: IPAM state left"
    );
}

type Mutate = fn(CniCall) -> CniCall;

/// (label, cniVersion, config change, call change, code, needle, reference code if it must match)
type BadCase = (
    &'static str,
    &'static str,
    Value,
    Mutate,
    u64,
    &'static str,
    Option<u64>,
);

#[test]
fn bad_input_table() {
    let mut topo = Topology::new(1);
    let mut env = Env {
        topo: &mut topo,
        n: 0,
    };
    let cases: Vec<BadCase> = vec![
        (
            "unknown cniVersion",
            "9.9.9",
            json!({}),
            |c| c,
            1,
            "9.9.9",
            Some(1),
        ),
        (
            "CHECK at 0.3.1",
            "0.3.1",
            json!({}),
            |c| c.command("CHECK"),
            1,
            "CHECK",
            Some(1),
        ),
        (
            "missing CNI_CONTAINERID",
            "1.0.0",
            json!({}),
            |c| c.without("CNI_CONTAINERID"),
            4,
            "CNI_CONTAINERID",
            Some(4),
        ),
        (
            "missing CNI_NETNS",
            "1.0.0",
            json!({}),
            |c| c.without("CNI_NETNS"),
            4,
            "CNI_NETNS",
            Some(4),
        ),
        (
            "missing CNI_IFNAME",
            "1.0.0",
            json!({}),
            |c| c.without("CNI_IFNAME"),
            4,
            "CNI_IFNAME",
            Some(4),
        ),
        (
            "missing CNI_PATH",
            "1.0.0",
            json!({}),
            |c| c.without("CNI_PATH"),
            4,
            "CNI_PATH",
            Some(4),
        ),
        (
            "missing CNI_COMMAND",
            "1.0.0",
            json!({}),
            |c| c.without("CNI_COMMAND"),
            4,
            "CNI_COMMAND",
            None,
        ),
        (
            "unknown CNI_COMMAND",
            "1.0.0",
            json!({}),
            |c| c.command("FROB"),
            4,
            "FROB",
            Some(4),
        ),
        (
            "empty ifname",
            "1.0.0",
            json!({}),
            |c| c.ifname(""),
            4,
            "CNI_IFNAME",
            Some(4),
        ),
        (
            "16-char ifname",
            "1.0.0",
            json!({}),
            |c| c.ifname("abcdefghijklmnop"),
            4,
            "CNI_IFNAME",
            Some(4),
        ),
        (
            "ifname with /",
            "1.0.0",
            json!({}),
            |c| c.ifname("a/b"),
            4,
            "CNI_IFNAME",
            Some(4),
        ),
        (
            "ifname ..",
            "1.0.0",
            json!({}),
            |c| c.ifname(".."),
            4,
            "CNI_IFNAME",
            Some(4),
        ),
        (
            "bad container id",
            "1.0.0",
            json!({}),
            |c| c.container("-bad id"),
            4,
            "CNI_CONTAINERID",
            Some(4),
        ),
        (
            "missing name",
            "1.0.0",
            json!({"name": ""}),
            |c| c,
            7,
            "name",
            Some(7),
        ),
        (
            "bad network name",
            "1.0.0",
            json!({"name": "a b"}),
            |c| c,
            7,
            "a b",
            Some(7),
        ),
        (
            "missing type",
            "1.0.0",
            json!({"type": ""}),
            |c| c,
            7,
            "type",
            None,
        ),
        (
            "nonexistent master",
            "1.0.0",
            json!({"master": "nope0"}),
            |c| c,
            7,
            "nope0",
            None,
        ),
        (
            "MTU above master",
            "1.0.0",
            json!({"mtu": 9000}),
            |c| c,
            7,
            "9000",
            None,
        ),
        (
            "negative MTU",
            "1.0.0",
            json!({"mtu": -5}),
            |c| c,
            7,
            "-5",
            None,
        ),
        (
            "unknown mode",
            "1.0.0",
            json!({"mode": "turbo"}),
            |c| c,
            7,
            "turbo",
            None,
        ),
        (
            "bad MAC in config",
            "1.0.0",
            json!({"mac": "02:00:zz:00:00:01"}),
            |c| c,
            7,
            "02:00:zz:00:00:01",
            None,
        ),
        (
            "multicast MAC",
            "1.0.0",
            json!({"mac": "01:00:5e:00:00:01"}),
            |c| c,
            7,
            "multicast",
            None,
        ),
        (
            "bad MAC in CNI_ARGS",
            "1.0.0",
            json!({}),
            |c| c.args("MAC=nope"),
            7,
            "CNI_ARGS",
            None,
        ),
        (
            "unknown CNI_ARGS key",
            "1.0.0",
            json!({}),
            |c| c.args("FOO=bar"),
            4,
            "FOO",
            None,
        ),
        (
            "malformed CNI_ARGS",
            "1.0.0",
            json!({}),
            |c| c.args("FOO"),
            4,
            "FOO",
            None,
        ),
        (
            "mtu of the wrong type",
            "1.0.0",
            json!({"mtu": "big"}),
            |c| c,
            7,
            "mtu",
            None,
        ),
        (
            "ipam type with a path",
            "1.0.0",
            json!({"ipam": {"type": "../../bin/sh"}}),
            |c| c,
            7,
            "ipam.type",
            None,
        ),
        (
            "ipam plugin not on CNI_PATH",
            "1.0.0",
            json!({"ipam": {"type": "no-such-ipam"}}),
            |c| c,
            7,
            "no-such-ipam",
            None,
        ),
        (
            "netns does not exist",
            "1.0.0",
            json!({}),
            |c| c.netns("/var/run/netns/smvt-nonexistent"),
            4,
            "CNI_NETNS",
            None,
        ),
        (
            "netns is not a netns",
            "1.0.0",
            json!({}),
            |c| c.netns("/etc/hostname"),
            4,
            "not a network namespace",
            None,
        ),
        (
            "bad prevResult",
            "1.0.0",
            json!({"prevResult": {"cniVersion": "1.0.0", "ips": "x"}}),
            |c| c,
            6,
            "prevResult",
            None,
        ),
    ];
    for (label, version, extra, mutate, code, needle, ref_code) in cases {
        let (call, pod, dir) = env.call(OUR_TYPE, version, extra.clone());
        let reply = mutate(call).run();
        assert_refused(label, &reply, code, needle, &pod, &dir);
        if let Some(want) = ref_code {
            let (call, _, _) = env.call(REF_TYPE, version, extra);
            let theirs = mutate(call).run();
            assert_eq!(
                theirs.code(),
                Some(want),
                "{label}: reference answered {}",
                theirs.stdout
            );
        }
    }
}

#[test]
fn malformed_json_is_code_6_like_the_reference() {
    let mut topo = Topology::new(1);
    let pod = topo.add_pod("badjson");
    for (plugin, label) in [
        (our_plugin(), "ours"),
        (reference_plugin("macvlan"), "reference"),
    ] {
        for raw in [
            &b"{"[..],
            b"not json",
            b"{\"cniVersion\": \"1.0.0\", \"name\": }",
        ] {
            let r = CniCall::new(&plugin, &topo.node(0).netns, "ADD", Value::Null)
                .netns(&pod.path)
                .run_raw(raw);
            assert_eq!(r.code(), Some(6), "{label}: {}", r.stdout);
        }
    }
    assert!(link_names(&pod.netns).is_empty());
}

#[test]
fn failing_ipam_delegate_removes_the_link_and_keeps_its_code() {
    let mut topo = Topology::new(1);
    let bin = topo.file("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let script = bin.join("failing-ipam");
    std::fs::write(&script, "#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"pool is being resized\"}'\nexit 1\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let pod = topo.add_pod("failipam");
    let config = configs::macvlan(
        OUR_TYPE,
        "1.0.0",
        "uplink0",
        json!({"type": "failing-ipam"}),
    );
    let r = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", config.clone())
        .netns(&pod.path)
        .cni_path(&format!("{}:/usr/lib/cni", bin.display()))
        .run();
    assert_eq!(r.code(), Some(11), "{}", r.stdout);
    assert!(
        r.msg().contains("failing-ipam") && r.msg().contains("pool is being resized"),
        "{}",
        r.msg()
    );
    assert!(
        link_names(&pod.netns).is_empty(),
        "link left behind: {:?}",
        link_names(&pod.netns)
    );

    // A delegate that prints garbage is our own code, with its output quoted.
    std::fs::write(&script, "#!/bin/sh\necho 'segfault at 0x0'\nexit 2\n").expect("write");
    let r = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", config)
        .netns(&pod.path)
        .cni_path(&format!("{}:/usr/lib/cni", bin.display()))
        .run();
    assert_eq!(r.code(), Some(101), "{}", r.stdout);
    assert!(r.msg().contains("segfault at 0x0"));
    assert!(link_names(&pod.netns).is_empty());
}

#[test]
fn existing_ifname_in_the_pod_is_refused_without_side_effects() {
    let mut topo = Topology::new(1);
    let pod = topo.add_pod("dupif");
    ip(&[
        "-n", &pod.netns, "link", "add", "net1", "type", "veth", "peer", "name", "net1x",
    ]);
    let dir = topo.file("dupif");
    let config = configs::macvlan(OUR_TYPE, "1.0.0", "uplink0", configs::host_local(&dir));
    let r = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", config)
        .netns(&pod.path)
        .run();
    assert_eq!(r.code(), Some(100), "{}", r.stdout);
    assert!(r.msg().contains("\"net1\" already exists"), "{}", r.msg());
    let mut names = link_names(&pod.netns);
    names.sort();
    assert_eq!(
        names,
        vec!["net1", "net1x"],
        "only the pre-existing veth remains"
    );
    assert!(
        configs::host_local_allocations(&dir).is_empty(),
        "no address was allocated"
    );
}
