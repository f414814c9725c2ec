//! Bad input through the real binary: the right CNI code, a message naming
//! the problem, no panic, and nothing left behind (no link in the pod, no
//! address held by the IPAM). Where the check lives in libcni's skel, the
//! reference plugin must answer with the same code.

use std::os::unix::fs::PermissionsExt;

use serde_json::{json, Value};
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::state::link_names;
use sticky_e2e::{ip, our_plugin, reference_plugin, CniCall, CniReply, Topology};

struct Env<'a> {
    topo: &'a mut Topology,
    n: usize,
}

impl Env<'_> {
    /// A fresh pod and a host-local dir for one case.
    fn call(
        &mut self,
        plugin_type: &str,
        version: &str,
        extra: Value,
    ) -> (CniCall, String, std::path::PathBuf) {
        self.n += 1;
        let pod = self.topo.add_pod(&format!("bad{}-{plugin_type}", self.n));
        let dir = self.topo.file(&format!("bad{}-{plugin_type}", self.n));
        let mut config =
            configs::macvlan(plugin_type, version, "uplink0", configs::host_local(&dir));
        configs::merge(&mut config, &extra);
        let plugin = if plugin_type == OUR_TYPE {
            our_plugin()
        } else {
            reference_plugin("macvlan")
        };
        let call = CniCall::new(&plugin, &self.topo.node(0).netns, "ADD", config).netns(&pod.path);
        (call, pod.netns, dir)
    }
}

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

enum Expect {
    /// Refused with this code and a message naming this.
    Refused(u64, &'static str),
    /// Accepted: untrusted text reaches the store only hashed, inside it.
    Contained,
}

/// (label, plugin keys, ipam keys, args.cni, CNI_ARGS, expected)
type StickyCase = (&'static str, Value, Value, Value, &'static str, Expect);

/// Every file under `dir`, relative to it.
fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap_or(&p).display().to_string());
            }
        }
    }
    out
}

/// Bad input to sticky-ipam through the real binary: identities with `/`,
/// `..`, NUL, 10 KB and unicode, and each config key with a value it must
/// refuse. A refusal has the exact code, names the field, and leaves the
/// store without a record and the pod without a link; an odd identity that
/// is valid is stored hashed, inside the store.
#[test]
fn sticky_ipam_input_table() {
    let mut topo = Topology::new(1);
    let long = "x".repeat(10 * 1024);
    let cases: Vec<StickyCase> = vec![
        (
            "identity empty",
            json!({}),
            json!({}),
            json!({"identity": ""}),
            "",
            Expect::Refused(7, "args.cni.identity"),
        ),
        (
            "identity with NUL",
            json!({}),
            json!({}),
            json!({"identity": "a\u{0}b"}),
            "",
            Expect::Refused(7, "args.cni.identity"),
        ),
        (
            "identity with a newline",
            json!({}),
            json!({}),
            json!({"identity": "a\nb"}),
            "",
            Expect::Refused(7, "args.cni.identity"),
        ),
        (
            "identity of 10 KB",
            json!({}),
            json!({}),
            json!({"identity": long}),
            "",
            Expect::Refused(7, "args.cni.identity"),
        ),
        (
            "identity a number",
            json!({}),
            json!({}),
            json!({"identity": 5}),
            "",
            Expect::Refused(7, "args.cni.identity"),
        ),
        (
            "identity an object",
            json!({}),
            json!({}),
            json!({"identity": {"a": 1}}),
            "",
            Expect::Refused(7, "args.cni.identity"),
        ),
        (
            "ipam.identity with NUL",
            json!({}),
            json!({"identity": "a\u{0}b"}),
            json!({}),
            "",
            Expect::Refused(7, "identity"),
        ),
        (
            "ipam.identityPolicy unknown",
            json!({}),
            json!({"identityPolicy": "magic"}),
            json!({}),
            "",
            Expect::Refused(7, "identityPolicy"),
        ),
        (
            "subnet /33",
            json!({}),
            json!({"subnet": "10.213.0.0/33"}),
            json!({}),
            "",
            Expect::Refused(7, "subnet"),
        ),
        (
            "subnet not an address",
            json!({}),
            json!({"subnet": "nonsense"}),
            json!({}),
            "",
            Expect::Refused(7, "subnet"),
        ),
        (
            "subnet in full-width digits",
            json!({}),
            json!({"subnet": "\u{ff11}0.0.0.0/8"}),
            json!({}),
            "",
            Expect::Refused(7, "subnet"),
        ),
        (
            "rangeStart outside the subnet",
            json!({}),
            json!({"rangeStart": "10.99.0.10"}),
            json!({}),
            "",
            Expect::Refused(7, "rangeStart"),
        ),
        (
            "rangeEnd before rangeStart",
            json!({}),
            json!({"rangeStart": "10.213.0.100", "rangeEnd": "10.213.0.20"}),
            json!({}),
            "",
            Expect::Refused(7, "rangeEnd"),
        ),
        (
            "gateway outside the subnet",
            json!({}),
            json!({"gateway": "10.99.0.1"}),
            json!({}),
            "",
            Expect::Refused(7, "gateway"),
        ),
        (
            "route dst not a prefix",
            json!({}),
            json!({"routes": [{"dst": "default"}]}),
            json!({}),
            "",
            Expect::Refused(7, "routes"),
        ),
        (
            "store type unknown",
            json!({}),
            json!({"store": {"type": "etcd"}}),
            json!({}),
            "",
            Expect::Refused(7, "store"),
        ),
        (
            "dataDir relative",
            json!({}),
            json!({"dataDir": "relative/dir"}),
            json!({}),
            "",
            Expect::Refused(7, "dataDir"),
        ),
        (
            "exclude not an address",
            json!({}),
            json!({"exclude": ["nope"]}),
            json!({}),
            "",
            Expect::Refused(7, "exclude"),
        ),
        (
            "probe.count 11",
            json!({"probe": {"count": 11}}),
            json!({}),
            json!({}),
            "",
            Expect::Refused(7, "probe.count"),
        ),
        (
            "probe.intervalMs 5",
            json!({"probe": {"intervalMs": 5}}),
            json!({}),
            json!({}),
            "",
            Expect::Refused(7, "probe.intervalMs"),
        ),
        (
            "mtu negative",
            json!({"mtu": -1}),
            json!({}),
            json!({}),
            "",
            Expect::Refused(7, "mtu"),
        ),
        (
            "mode unknown",
            json!({"mode": "weird"}),
            json!({}),
            json!({}),
            "",
            Expect::Refused(7, "mode"),
        ),
        (
            "mac not a MAC",
            json!({"mac": "zz:zz:zz:zz:zz:zz"}),
            json!({}),
            json!({}),
            "",
            Expect::Refused(7, "mac"),
        ),
        (
            "network name with /",
            json!({"name": "a/../../b"}),
            json!({}),
            json!({}),
            "",
            Expect::Refused(7, "network name"),
        ),
        (
            "network name unicode",
            json!({"name": "n\u{e9}t"}),
            json!({}),
            json!({}),
            "",
            Expect::Refused(7, "network name"),
        ),
        (
            "CNI_ARGS without =",
            json!({}),
            json!({}),
            json!({}),
            "IgnoreUnknown=1;garbage",
            Expect::Refused(4, "CNI_ARGS"),
        ),
        (
            "CNI_ARGS unknown key",
            json!({}),
            json!({}),
            json!({}),
            "FOO=bar",
            Expect::Refused(4, "FOO"),
        ),
        (
            "CNI_ARGS IP not an address",
            json!({}),
            json!({}),
            json!({}),
            "IgnoreUnknown=1;IP=10.213.0.999",
            Expect::Refused(7, "IP"),
        ),
        (
            "CNI_ARGS MAC not a MAC",
            json!({}),
            json!({}),
            json!({}),
            "IgnoreUnknown=1;MAC=12345",
            Expect::Refused(7, "MAC"),
        ),
        (
            "identity ../../../etc/passwd",
            json!({}),
            json!({}),
            json!({"identity": "../../../etc/passwd"}),
            "",
            Expect::Contained,
        ),
        (
            "identity with / and ..",
            json!({}),
            json!({}),
            json!({"identity": "ns/../../sts-0"}),
            "",
            Expect::Contained,
        ),
        (
            "identity in unicode",
            json!({}),
            json!({}),
            json!({"identity": "\u{540d}\u{524d}/\u{fc}n\u{ef}-0"}),
            "",
            Expect::Contained,
        ),
        (
            "identity of 320 bytes",
            json!({}),
            json!({}),
            json!({"identity": "y".repeat(320)}),
            "",
            Expect::Contained,
        ),
    ];
    assert!(
        cases.len() >= 30,
        "with bad_input_table's cases, at least 60"
    );
    for (i, (label, plugin, ipam, args_cni, cni_args, expect)) in cases.into_iter().enumerate() {
        let pod = topo.add_pod(&format!("sti{i}"));
        let dir = topo.file(&format!("sti{i}"));
        let mut conf = configs::sticky("uplink0", &dir, ipam);
        configs::merge(&mut conf, &plugin);
        if args_cni.as_object().is_some_and(|o| !o.is_empty()) {
            conf["args"] = json!({"cni": args_cni});
        }
        let call = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", conf)
            .netns(&pod.path)
            .args(if cni_args.is_empty() {
                "IgnoreUnknown=1"
            } else {
                cni_args
            });
        let reply = call.run();
        match expect {
            Expect::Refused(code, needle) => {
                assert!(!reply.success, "{label}: accepted: {}", reply.stdout);
                assert!(
                    !reply.stderr.contains("panicked"),
                    "{label}: panic: {}",
                    reply.stderr
                );
                assert!(
                    reply
                        .json
                        .as_ref()
                        .is_some_and(|j| j.get("cniVersion").is_some()),
                    "{label}: not a CNI error: {:?}",
                    reply.stdout
                );
                assert_eq!(reply.code(), Some(code), "{label}: {}", reply.stdout);
                assert!(
                    reply.msg().contains(needle),
                    "{label}: message {:?} does not name {needle:?}",
                    reply.msg()
                );
                let records: Vec<String> = files_under(&dir)
                    .into_iter()
                    .filter(|f| {
                        f.contains("/claims/")
                            || f.contains("/identities/")
                            || f.contains("/holders/")
                    })
                    .collect();
                assert!(records.is_empty(), "{label}: records written: {records:?}");
                assert!(
                    link_names(&pod.netns).is_empty(),
                    "{label}: links left: {:?}",
                    link_names(&pod.netns)
                );
            }
            Expect::Contained => {
                assert!(reply.success, "{label}: refused: {}", reply.stdout);
                for f in files_under(&dir) {
                    assert!(
                        f.starts_with("macnet/"),
                        "{label}: {f} is outside the network's directory"
                    );
                    let name = f.rsplit('/').next().unwrap_or("");
                    assert!(
                        name.is_ascii() && !name.contains(".."),
                        "{label}: unhashed name {f}"
                    );
                }
                let del = call.clone().command("DEL").run();
                assert!(del.success, "{label}: DEL: {}", del.stdout);
            }
        }
    }
}

const EVERY_VERSION: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// A typo among our keys is refused by the real binaries in every
/// cniVersion with code 2, the key and the key meant, and nothing is
/// created; the keys that the spec, libcni and Multus add stay accepted.
#[test]
fn unknown_keys_are_refused_and_foreign_keys_accepted_in_every_version() {
    let mut topo = Topology::new(1);
    let pod = topo.add_pod("keys");
    // (label, change to the plugin config, change to ipam, key, key meant)
    let typos: Vec<(&str, Value, Value, &str, &str)> = vec![
        (
            "master misspelt",
            json!({"mastre": "uplink0"}),
            json!({}),
            "mastre",
            "master",
        ),
        (
            "stickyMac misspelt",
            json!({"stickyMAC": true}),
            json!({}),
            "stickyMAC",
            "stickyMac",
        ),
        (
            "probe key misspelt",
            json!({"probe": {"cuont": 2}}),
            json!({}),
            "cuont",
            "count",
        ),
        (
            "reservations misspelt",
            json!({}),
            json!({"reservation": {"a": "10.213.0.20"}}),
            "reservation",
            "reservations",
        ),
        (
            "rangeStart misspelt",
            json!({}),
            json!({"rangeStrat": "10.213.0.20"}),
            "rangeStrat",
            "rangeStart",
        ),
        (
            "store misspelt",
            json!({}),
            json!({"stroe": {"type": "kubernetes"}}),
            "stroe",
            "store",
        ),
        (
            "store type misspelt",
            json!({}),
            json!({"store": {"tpye": "kubernetes"}}),
            "tpye",
            "type",
        ),
    ];
    for version in EVERY_VERSION {
        for (label, plugin, ipam, key, meant) in &typos {
            let dir = topo.file(&format!("keys-{version}-{key}"));
            let mut conf = configs::sticky("uplink0", &dir, ipam.clone());
            conf["cniVersion"] = json!(version);
            configs::merge(&mut conf, plugin);
            let reply = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", conf)
                .netns(&pod.path)
                .run();
            assert_eq!(reply.code(), Some(2), "{version} {label}: {}", reply.stdout);
            assert_eq!(
                reply.json.as_ref().and_then(|j| j["cniVersion"].as_str()),
                Some(*version),
                "{version} {label}: the error is in the caller's version"
            );
            assert!(
                reply.msg().contains(&format!("{key:?}"))
                    && reply.msg().contains(&format!("did you mean {meant:?}")),
                "{version} {label}: {}",
                reply.msg()
            );
            assert!(
                link_names(&pod.netns).is_empty(),
                "{version} {label}: a link was left"
            );
            assert!(
                !dir.join("macnet").join("claims").exists(),
                "{version} {label}: a claim was written"
            );
        }

        // What others add: accepted, the attachment works, DEL cleans up.
        let dir = topo.file(&format!("foreign-{version}"));
        let mut conf = configs::sticky(
            "uplink0",
            &dir,
            // host-local's key, accepted so a NAD converts by changing type.
            json!({"resolvConf": "/etc/resolv.conf"}),
        );
        conf["cniVersion"] = json!(version);
        configs::merge(
            &mut conf,
            &json!({
                // CNI spec: a plugin configuration object's keys.
                "capabilities": {"mac": true, "ips": true},
                "args": {"cni": {"identity": format!("foreign-{version}")}},
                // libcni's InjectConf: capability args.
                "runtimeConfig": {"portMappings": []},
                // Multus: delegateAddDeviceID.
                "deviceID": "0000:03:00.1",
                "pciBusID": "0000:03:00.1",
            }),
        );
        let call = CniCall::new(&our_plugin(), &topo.node(0).netns, "ADD", conf.clone())
            .container(&format!("foreign-{}", version.replace('.', "")))
            .netns(&pod.path);
        let reply = call.run();
        assert!(
            reply.success,
            "{version}: foreign keys refused: {}",
            reply.stdout
        );
        assert!(call.clone().command("DEL").run().success, "{version}: DEL");
        assert!(
            link_names(&pod.netns).is_empty(),
            "{version}: DEL left a link"
        );
    }

    // The standalone sticky-ipam receives the reference macvlan's whole
    // config: strict inside ipam only.
    let dir = topo.file("standalone");
    let mut conf = configs::sticky("uplink0", &dir, json!({}));
    conf["type"] = json!("macvlan");
    conf["someReferenceOnlyKey"] = json!(true);
    let standalone = |conf: Value| {
        CniCall::new(
            &reference_plugin("macvlan"),
            &topo.node(0).netns,
            "ADD",
            conf,
        )
        .container("standalone")
        .netns(&pod.path)
        .cni_path(&sticky_e2e::cni_path_with_ours())
        .run()
    };
    let reply = standalone(conf.clone());
    assert!(reply.success, "{}", reply.stdout);
    let mut typo = conf.clone();
    typo["ipam"]["reservation"] = json!({"a": "10.213.0.20"});
    ip(&["-n", &pod.netns, "link", "del", "net1"]);
    let reply = standalone(typo);
    assert_eq!(reply.code(), Some(2), "{}", reply.stdout);
    assert!(
        reply.msg().contains("did you mean \"reservations\""),
        "{}",
        reply.msg()
    );
}
