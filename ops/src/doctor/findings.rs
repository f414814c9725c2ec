//! What `doctor` concludes from what it observed, without I/O: each check
//! turns its observations into findings, each finding with the fix an
//! operator applies. Table-tested below.

use std::fmt::Write as _;

use sticky_ipam::kube::ApiError;

use super::LinkFacts;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Ok,
    Warn,
    Fail,
}

impl Severity {
    fn label(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Warn => "WARN",
            Severity::Fail => "FAIL",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    /// The check's short name: `bin-dir`, `kubeconfig`, `rbac`, ...
    pub check: &'static str,
    pub what: String,
    /// What to do about it; None for an ok finding.
    pub fix: Option<String>,
}

impl Finding {
    pub fn ok(check: &'static str, what: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Ok,
            check,
            what: what.into(),
            fix: None,
        }
    }

    pub fn warn(check: &'static str, what: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Warn,
            check,
            what: what.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(check: &'static str, what: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Fail,
            check,
            what: what.into(),
            fix: Some(fix.into()),
        }
    }
}

/// The worst finding decides the exit code: 0 all ok, 1 a warning, 2 a
/// failure.
pub fn exit_code(findings: &[Finding]) -> u8 {
    match findings.iter().map(|f| f.severity).max() {
        Some(Severity::Fail) => 2,
        Some(Severity::Warn) => 1,
        _ => 0,
    }
}

pub fn render_text(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let _ = writeln!(out, "{:<4}  {:<12} {}", f.severity.label(), f.check, f.what);
        if let Some(fix) = &f.fix {
            let _ = writeln!(out, "      {:<12} fix: {fix}", "");
        }
    }
    let worst = findings.iter().map(|f| f.severity).max();
    let problems = findings
        .iter()
        .filter(|f| f.severity != Severity::Ok)
        .count();
    let _ = writeln!(
        out,
        "{}",
        match worst {
            Some(Severity::Fail) | Some(Severity::Warn) =>
                format!("{problems} problems found; fix them in the order listed"),
            _ => "no problems found".to_string(),
        }
    );
    out
}

pub fn render_json(findings: &[Finding]) -> serde_json::Value {
    serde_json::Value::Array(
        findings
            .iter()
            .map(|f| {
                serde_json::json!({
                    "severity": f.severity.label().to_lowercase(),
                    "check": f.check,
                    "what": f.what,
                    "fix": f.fix,
                })
            })
            .collect(),
    )
}

/// What was found of one installed binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    Missing,
    NotExecutable,
    /// It ran; its `version` printed this version.
    Version(String),
    /// It would not run (wrong architecture, a glibc too old, ...).
    Unrunnable(String),
}

/// The binaries in the CNI bin dir against the one running `doctor` (the
/// DaemonSet's image, when run with `kubectl exec`).
pub fn binary(dir: &str, name: &str, found: &Installed, own: &str) -> Finding {
    let check = "bin-dir";
    let reinstall = "let the DaemonSet's installer run on this node (delete its pod here), or pass the bin dir the runtime uses with --bin-dir (containerd: plugins.\"io.containerd.cri.v1.runtime\".cni.bin_dirs)";
    match found {
        Installed::Missing => Finding::fail(check, format!("{dir}/{name} does not exist"), reinstall),
        Installed::NotExecutable => Finding::fail(
            check,
            format!("{dir}/{name} is not executable"),
            format!("chmod 0755 {dir}/{name}, or {reinstall}"),
        ),
        Installed::Unrunnable(why) => Finding::fail(
            check,
            format!("{dir}/{name} does not run on this node: {why}"),
            "install a build for this node's architecture and C library (scripts/image.sh builds one for glibc 2.28 and later)",
        ),
        Installed::Version(v) if v == own => Finding::ok(check, format!("{dir}/{name}: version {v}")),
        Installed::Version(v) => Finding::warn(
            check,
            format!("{dir}/{name} is version {v:?}, this doctor (the DaemonSet's image) is {own:?}"),
            format!("a rollout has not reached this node yet, or it kept an old copy: {reinstall}"),
        ),
    }
}

/// The CNI config dir: it exists and holds the configs the runtime reads.
pub fn conf_dir(dir: &str, exists: bool, files: usize) -> Finding {
    let check = "conf-dir";
    if !exists {
        return Finding::fail(
            check,
            format!("{dir} does not exist"),
            "pass the dir the runtime reads with --conf-dir (containerd: cni.conf_dir), or create it and install Multus",
        );
    }
    if files == 0 {
        return Finding::warn(
            check,
            format!("{dir} holds no CNI config (.conf or .conflist): the node stays NotReady"),
            "install the cluster network and Multus, whose 00-multus.conf calls us for NetworkAttachmentDefinitions",
        );
    }
    Finding::ok(check, format!("{dir}: {files} CNI configs"))
}

/// The macvlan master: it exists in this netns, is up, and is no port of a
/// bond or bridge (the kernel refuses a macvlan on a device that another
/// driver already receives for).
pub fn master(name: &str, from: &str, link: Option<&LinkFacts>) -> Finding {
    let check = "master";
    let Some(link) = link else {
        return Finding::fail(
            check,
            format!("master {name:?} ({from}) does not exist in this node's network namespace"),
            "set \"master\" in the network config to an interface of this node (ip -br link), or create it",
        );
    };
    // A VRF's ports keep their receive path; these drivers take it.
    if let Some(port) = link
        .port_kind
        .as_deref()
        .filter(|p| matches!(*p, "bond" | "bridge" | "team"))
    {
        return Finding::fail(
            check,
            format!("master {name:?} ({from}) is a port of a {port}: the kernel refuses a macvlan on it"),
            format!("use the {port} itself as \"master\""),
        );
    }
    if !link.up {
        return Finding::fail(
            check,
            format!("master {name:?} ({from}) is down: pods get an interface with no carrier"),
            format!("ip link set {name} up (and make it persistent in the node's network setup)"),
        );
    }
    Finding::ok(
        check,
        format!("master {name:?} ({from}) is up, MTU {}", link.mtu),
    )
}

/// An API error of a doctor request, as a finding of `check`.
pub fn api_error(check: &'static str, server: &str, kubeconfig: &str, e: &ApiError) -> Finding {
    match e {
        ApiError::Unauthorized(m) => Finding::fail(
            check,
            format!("the API server at {server} rejects the credentials of {kubeconfig}: {m}"),
            "the token was revoked, has expired, or names a Node object that was deleted and registered again: the DaemonSet's installer writes a fresh one within a minute (or delete its pod on this node); check that its service account still exists",
        ),
        ApiError::Refused(m) if m.contains("does not know this resource") => Finding::fail(
            check,
            m.clone(),
            "install the CRDs: sticky-macvlan crd | kubectl apply -f -",
        ),
        ApiError::Unreachable(m) => Finding::fail(
            check,
            format!("the API server at {server} does not answer: {m}"),
            "check the server address in the kubeconfig and that this node reaches it (a service IP needs kube-proxy)",
        ),
        ApiError::Client(m) => Finding::fail(
            check,
            m.clone(),
            "install the kubeconfig with the DaemonSet (deploy/40-daemonset.yaml), or pass --kubeconfig",
        ),
        other => Finding::fail(
            check,
            format!("{server}: {other}"),
            "see the API server's answer above",
        ),
    }
}

/// The version an image's tag names ("localhost/sticky-macvlan:0.2.0" ->
/// "0.2.0", a "v" dropped), None for a tag that names no version ("dev",
/// "latest", a digest only).
fn image_version(image: &str) -> Option<&str> {
    let last = image.rsplit('/').next().unwrap_or(image);
    let last = last.split('@').next().unwrap_or(last);
    let (_, tag) = last.split_once(':')?;
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    tag.starts_with(|c: char| c.is_ascii_digit()).then_some(tag)
}

/// The installer DaemonSet (DS, "namespace/name") against this node's
/// installed binaries (version INSTALLED): the image it runs, and whether
/// its rollout reached every node.
pub fn daemon_set(
    ds: &str,
    installed: &str,
    found: &Result<Option<crate::admin::DaemonSetFacts>, ApiError>,
) -> Finding {
    let check = "daemonset";
    let (ns, name) = ds.split_once('/').unwrap_or(("kube-system", ds));
    let f = match found {
        Err(ApiError::Refused(m)) if m.contains(" 403 ") => {
            return Finding::warn(
                check,
                format!("may not read DaemonSet {ds}: {m}"),
                "apply deploy/20-rbac.yaml: its Role sticky-macvlan-installer lets the node read its installer DaemonSet",
            )
        }
        Err(e) => {
            return Finding::warn(
                check,
                format!("could not read DaemonSet {ds}: {e}"),
                "see the kubeconfig finding",
            )
        }
        Ok(None) => {
            return Finding::warn(
                check,
                format!("there is no DaemonSet {ds} to keep this node's binaries current"),
                "install with deploy/40-daemonset.yaml, or pass --daemonset NAMESPACE/NAME where yours is",
            )
        }
        Ok(Some(f)) => f,
    };
    let rolling = f.updated < f.desired;
    let progress = format!("{} of {} nodes updated", f.updated, f.desired);
    match image_version(&f.image) {
        None => Finding::warn(
            check,
            format!(
                "DaemonSet {ds} runs {}, whose tag names no version; this node has {installed}",
                f.image
            ),
            "tag the image with its release version (scripts/image.sh does) so that nodes can be compared with it",
        ),
        Some(v) if v == installed && !rolling => Finding::ok(
            check,
            format!("DaemonSet {ds} runs {} ({progress}); this node has {installed}", f.image),
        ),
        Some(v) if v == installed => Finding::warn(
            check,
            format!("DaemonSet {ds} is rolling out {} ({progress}); this node has it", f.image),
            format!("wait for kubectl -n {ns} rollout status daemonset/{name}"),
        ),
        Some(_) if rolling => Finding::warn(
            check,
            format!(
                "DaemonSet {ds} is rolling out {} ({progress}); this node still has {installed}",
                f.image
            ),
            format!("wait for kubectl -n {ns} rollout status daemonset/{name}; until then this node allocates with {installed}"),
        ),
        Some(v) => Finding::fail(
            check,
            format!(
                "DaemonSet {ds} runs {} (version {v}) on every node, but this node has {installed} installed",
                f.image
            ),
            format!(
                "its installer pod on this node has not run the new image: kubectl -n {ns} get pods -l app.kubernetes.io/name={name} -o wide, and delete the one on this node so that it runs again"
            ),
        ),
    }
}

/// The SelfSubjectAccessReviews for every permission the plugin uses.
pub fn access(
    user: &str,
    answers: &[(&sticky_ipam::kube::Permission, bool)],
    clusterrole: &str,
) -> Finding {
    let check = "rbac";
    let denied: Vec<String> = answers
        .iter()
        .filter(|(_, allowed)| !allowed)
        .map(|(p, _)| p.describe())
        .collect();
    if denied.is_empty() {
        return Finding::ok(
            check,
            format!("{user} may do all {} things the plugin does", answers.len()),
        );
    }
    Finding::fail(
        check,
        format!("{user} may not: {}", denied.join("; ")),
        format!("apply the ClusterRole {clusterrole} of deploy/20-rbac.yaml and its binding to the DaemonSet's service account"),
    )
}

#[cfg(test)]
#[path = "findings_tests.rs"]
mod tests;
