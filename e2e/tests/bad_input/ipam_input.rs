//! Bad input to sticky-ipam and unknown keys in every CNI version.

use super::*;

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
