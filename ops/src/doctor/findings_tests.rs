use super::*;
use sticky_ipam::kube::PLUGIN_ACCESS;

fn link(up: bool, port: Option<&str>) -> LinkFacts {
    LinkFacts {
        mtu: 1500,
        up,
        port_kind: port.map(str::to_string),
    }
}

#[test]
fn every_fault_has_its_fix_and_the_worst_decides_the_exit() {
    let cases: Vec<(Finding, Severity, &str)> = vec![
        (binary("/opt/cni/bin", "sticky-macvlan", &Installed::Missing, "v1"), Severity::Fail, "installer"),
        (binary("/opt/cni/bin", "sticky-macvlan", &Installed::NotExecutable, "v1"), Severity::Fail, "chmod 0755"),
        (binary("/b", "sticky-ipam", &Installed::Unrunnable("GLIBC_2.34 not found".into()), "v1"), Severity::Fail, "glibc 2.28"),
        (binary("/b", "sticky-ipam", &Installed::Version("v0".into()), "v1"), Severity::Warn, "rollout"),
        (binary("/b", "sticky-ipam", &Installed::Version("v1".into()), "v1"), Severity::Ok, ""),
        (conf_dir("/etc/cni/net.d", false, 0), Severity::Fail, "--conf-dir"),
        (conf_dir("/etc/cni/net.d", true, 0), Severity::Warn, "Multus"),
        (conf_dir("/etc/cni/net.d", true, 2), Severity::Ok, ""),
        (master("eth1", "config", None), Severity::Fail, "ip -br link"),
        (master("eth1", "config", Some(&link(false, None))), Severity::Fail, "ip link set eth1 up"),
        (master("eth1", "config", Some(&link(true, Some("bond")))), Severity::Fail, "the bond itself"),
        (master("eth1", "config", Some(&link(true, None))), Severity::Ok, ""),
        (
            api_error("kubeconfig", "https://a", "/k", &ApiError::Unauthorized("create selfsubjectaccessreview: 401 Unauthorized (Unauthorized)".into())),
            Severity::Fail,
            "fresh one",
        ),
        (
            api_error("crd", "https://a", "/k", &ApiError::Refused("list ipclaims: the API server does not know this resource of sticky-macvlan.io (404)".into())),
            Severity::Fail,
            "sticky-macvlan crd | kubectl apply",
        ),
        (api_error("kubeconfig", "https://a", "/k", &ApiError::Unreachable("connect refused".into())), Severity::Fail, "kube-proxy"),
    ];
    for (f, severity, fix) in &cases {
        assert_eq!(f.severity, *severity, "{f:?}");
        match severity {
            Severity::Ok => assert!(f.fix.is_none()),
            _ => assert!(f.fix.as_deref().unwrap_or_default().contains(fix), "{f:?}"),
        }
    }
    let all: Vec<Finding> = cases.iter().map(|(f, _, _)| f.clone()).collect();
    assert_eq!(exit_code(&all), 2);
    let no_fail: Vec<Finding> = all
        .iter()
        .filter(|f| f.severity != Severity::Fail)
        .cloned()
        .collect();
    assert_eq!(exit_code(&no_fail), 1);
    assert_eq!(exit_code(&[Finding::ok("x", "fine")]), 0);
    assert!(render_text(&all).contains("fix: "));
    assert_eq!(render_json(&all).as_array().map(Vec::len), Some(all.len()));
}

#[test]
fn a_denied_verb_is_named_with_its_resource() {
    let answers: Vec<_> = PLUGIN_ACCESS
        .iter()
        .map(|p| (p, !(p.resource == "iplocks" && p.verb == "delete")))
        .collect();
    let f = access(
        "system:serviceaccount:kube-system:sticky-macvlan",
        &answers,
        "sticky-macvlan",
    );
    assert_eq!(f.severity, Severity::Fail);
    assert!(
        f.what.contains("delete iplocks.sticky-macvlan.io"),
        "{}",
        f.what
    );
    assert!(!f.what.contains("get pods"));
    let all: Vec<_> = PLUGIN_ACCESS.iter().map(|p| (p, true)).collect();
    assert_eq!(access("u", &all, "sticky-macvlan").severity, Severity::Ok);
}

#[test]
fn the_daemonset_is_compared_with_the_installed_binaries() {
    use crate::admin::DaemonSetFacts;
    type Found = Result<Option<DaemonSetFacts>, ApiError>;
    let ds = |image: &str, desired: u64, updated: u64| -> Found {
        Ok(Some(DaemonSetFacts {
            image: image.into(),
            desired,
            updated,
        }))
    };
    let name = "kube-system/sticky-macvlan";
    // (daemonset, installed, severity, what says, fix says)
    let cases: Vec<(Found, &str, Severity, &str, &str)> = vec![
        (
            ds("localhost/sticky-macvlan:0.2.0", 3, 3),
            "0.2.0",
            Severity::Ok,
            "3 of 3 nodes updated",
            "",
        ),
        (
            ds("reg:5000/team/sticky-macvlan:v0.2.0@sha256:ab", 3, 3),
            "0.2.0",
            Severity::Ok,
            "this node has 0.2.0",
            "",
        ),
        (
            ds("localhost/sticky-macvlan:0.2.0", 3, 1),
            "0.2.0",
            Severity::Warn,
            "is rolling out",
            "rollout status daemonset/sticky-macvlan",
        ),
        (
            ds("localhost/sticky-macvlan:0.2.0", 3, 1),
            "0.1.0",
            Severity::Warn,
            "still has 0.1.0",
            "rollout status",
        ),
        (
            ds("localhost/sticky-macvlan:0.2.0", 3, 3),
            "0.1.0",
            Severity::Fail,
            "has 0.1.0 installed",
            "delete the one on this node",
        ),
        (
            ds("localhost/sticky-macvlan:dev", 3, 3),
            "0.2.0",
            Severity::Warn,
            "names no version",
            "scripts/image.sh",
        ),
        (
            ds("localhost/sticky-macvlan", 3, 3),
            "0.2.0",
            Severity::Warn,
            "names no version",
            "tag the image",
        ),
        (
            Ok(None),
            "0.2.0",
            Severity::Warn,
            "no DaemonSet kube-system/sticky-macvlan",
            "--daemonset",
        ),
        (
            Err(ApiError::Refused(
                "get daemonset kube-system/sticky-macvlan: 403 Forbidden (no)".into(),
            )),
            "0.2.0",
            Severity::Warn,
            "may not read DaemonSet",
            "deploy/20-rbac.yaml",
        ),
        (
            Err(ApiError::Unreachable("timed out".into())),
            "0.2.0",
            Severity::Warn,
            "could not read",
            "kubeconfig",
        ),
    ];
    for (found, installed, severity, what, fix) in cases {
        let f = daemon_set(name, installed, &found);
        assert_eq!(f.severity, severity, "{found:?} / {installed}: {f:?}");
        assert!(f.what.contains(what), "{f:?} should say {what:?}");
        assert!(
            f.fix.as_deref().unwrap_or("").contains(fix),
            "{f:?} should fix with {fix:?}"
        );
    }
}
