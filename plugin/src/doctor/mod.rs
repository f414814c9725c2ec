//! `sticky-macvlan doctor`: checks a node the way a failed pod start
//! would find it, and lists each problem with its fix. The checks gather
//! facts here (files, the installed binaries, netlink in this netns, the
//! API server's own answers: SelfSubjectReview, SelfSubjectAccessReview,
//! the resources it serves); `judge` turns them into findings.

mod judge;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use serde_json::Value;
use sticky_ipam::backend::Backend;
use sticky_ipam::config::{IpamConfig, StoreKind};
use sticky_ipam::kube::client::KubeClient;
use sticky_ipam::kube::PLUGIN_ACCESS;

use crate::config::NetConf;
use crate::datapath::{Netlink, Ns};
pub use judge::{Finding, Severity};

pub const HELP: &str = "\
Usage: sticky-macvlan doctor [options]

Checks this node for what a pod start needs and prints each problem with
its fix: the CNI bin dir (both binaries present, runnable, the version of
this doctor, which is the DaemonSet's image when run with kubectl exec),
the CNI conf dir, the network's config (--network or --config), its master
interface (exists in this netns, up, not a port of a bond or bridge), its
store (the file store opens; the kubernetes store answers), and for the
kubernetes store the kubeconfig and token (accepted by the API server),
RBAC (a SelfSubjectAccessReview for every verb the plugin uses), the
IPClaim/IPLock CRDs, and the installer DaemonSet (the version its image
names against this node's binaries, and whether its rollout is done). Run
it in the node's network namespace.

Options:
  --bin-dir DIR       the runtime's CNI bin dir (default /opt/cni/bin)
  --conf-dir DIR      the runtime's CNI conf dir (default /etc/cni/net.d)
  --network NAME      check this network's config, found in --conf-dir
  --config FILE       check this network config (a NAD's spec.config)
  --kubeconfig PATH   the plugin's kubeconfig (default: the network's
                      ipam.store.kubeconfig, else
                      <conf dir>/sticky-macvlan.d/sticky-macvlan.kubeconfig)
  --daemonset NS/NAME the installer DaemonSet (default
                      kube-system/sticky-macvlan)
  --json              print the findings as JSON
Exit code: 0 no problem, 1 warnings, 2 failures.
";

struct Opts {
    bin_dir: PathBuf,
    conf_dir: PathBuf,
    network: Option<String>,
    config: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    daemonset: String,
    json: bool,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        bin_dir: "/opt/cni/bin".into(),
        conf_dir: "/etc/cni/net.d".into(),
        network: None,
        config: None,
        kubeconfig: None,
        daemonset: "kube-system/sticky-macvlan".into(),
        json: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--json" {
            o.json = true;
            continue;
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{a} needs a value"))?
            .clone();
        match a.as_str() {
            "--bin-dir" => o.bin_dir = v.into(),
            "--conf-dir" => o.conf_dir = v.into(),
            "--network" => o.network = Some(v),
            "--config" => o.config = Some(v.into()),
            "--kubeconfig" => o.kubeconfig = Some(v.into()),
            "--daemonset" if v.contains('/') => o.daemonset = v,
            "--daemonset" => return Err(format!("--daemonset {v:?}: give NAMESPACE/NAME")),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

pub fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sticky-macvlan doctor: {e}; see --help");
            return ExitCode::from(2);
        }
    };
    let findings = examine(&opts);
    if opts.json {
        println!("{}", judge::render_json(&findings));
    } else {
        print!("{}", judge::render_text(&findings));
    }
    ExitCode::from(judge::exit_code(&findings))
}

fn examine(o: &Opts) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut installed_version = None;
    for name in ["sticky-macvlan", "sticky-ipam"] {
        let found = installed(&o.bin_dir.join(name));
        if let (judge::Installed::Version(v), "sticky-macvlan") = (&found, name) {
            installed_version = Some(v.clone());
        }
        out.push(judge::binary(
            &o.bin_dir.display().to_string(),
            name,
            &found,
            env!("CARGO_PKG_VERSION"),
        ));
    }
    let configs = cni_configs(&o.conf_dir);
    out.push(judge::conf_dir(
        &o.conf_dir.display().to_string(),
        o.conf_dir.is_dir(),
        configs.len(),
    ));
    let network = match network_config(o, &configs) {
        Ok(n) => n,
        Err(f) => {
            out.push(f);
            None
        }
    };
    let ipam = network.as_ref().and_then(|n| ipam_of(n, &mut out));
    if let Some(n) = &network {
        out.push(master(n));
    }
    if let Some(ipam) = &ipam {
        let backend = Backend::for_config(ipam);
        out.push(match backend.usable(&ipam.network) {
            Ok(()) => Finding::ok(
                "store",
                format!("network {:?}: {} is usable", ipam.network, backend.describe()),
            ),
            Err(e) => Finding::fail(
                "store",
                format!("network {:?}: {}: {e}", ipam.network, backend.describe()),
                "see the kubeconfig and rbac findings for the kubernetes store; for the file store, check the directory (ipam.dataDir) is writable",
            ),
        });
    }
    let kubeconfig = o
        .kubeconfig
        .clone()
        .or_else(|| match ipam.map(|i| i.store) {
            Some(StoreKind::Kubernetes { kubeconfig, .. }) => Some(kubeconfig),
            Some(StoreKind::File) => None,
            None => Some(
                o.conf_dir
                    .join("sticky-macvlan.d/sticky-macvlan.kubeconfig"),
            )
            .filter(|p| p.exists()),
        });
    if let Some(path) = kubeconfig {
        out.extend(api(&path, &o.daemonset, installed_version.as_deref()));
    }
    out
}

/// A binary's state: run `<bin> version`, whose first line is
/// "<name> <version>[: ...]", and keep the version.
fn installed(path: &Path) -> judge::Installed {
    let Ok(meta) = std::fs::metadata(path) else {
        return judge::Installed::Missing;
    };
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return judge::Installed::NotExecutable;
    }
    match Command::new(path)
        .arg("version")
        .env_remove("CNI_COMMAND")
        .output()
    {
        Ok(out) if out.status.success() => judge::Installed::Version(
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .trim_end_matches(':')
                .to_string(),
        ),
        Ok(out) => {
            judge::Installed::Unrunnable(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
        Err(e) => judge::Installed::Unrunnable(e.to_string()),
    }
}

/// The CNI configs of `dir` (what the runtime reads), sorted by name.
fn cni_configs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "conf" || e == "conflist" || e == "json")
        })
        .collect();
    files.sort();
    files
}

/// Our plugin's config out of a .conf or .conflist document: a conflist's
/// entry of type sticky-macvlan with the list's name and version, as
/// libcni hands it over.
fn ours_in(doc: &Value) -> Option<Value> {
    if doc["type"] == "sticky-macvlan" {
        return Some(doc.clone());
    }
    let plugin = doc["plugins"]
        .as_array()?
        .iter()
        .find(|p| p["type"] == "sticky-macvlan")?;
    let mut plugin = plugin.clone();
    plugin["name"] = doc["name"].clone();
    plugin["cniVersion"] = doc["cniVersion"].clone();
    Some(plugin)
}

fn network_config(o: &Opts, configs: &[PathBuf]) -> Result<Option<NetConf>, Finding> {
    let check = "network";
    let read = |path: &Path| -> Result<Value, Finding> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Finding::fail(
                check,
                format!("cannot read {}: {e}", path.display()),
                "pass a readable file with --config",
            )
        })?;
        serde_json::from_str(&text).map_err(|e| {
            Finding::fail(
                check,
                format!("{} is not JSON: {e}", path.display()),
                "save the NetworkAttachmentDefinition's spec.config, as JSON",
            )
        })
    };
    let (source, doc) = match (&o.config, &o.network) {
        (Some(path), _) => (path.display().to_string(), read(path)?),
        (None, Some(name)) => {
            let found = configs
                .iter()
                .filter_map(|p| read(p).ok().map(|d| (p, d)))
                .find(|(_, d)| d["name"] == name.as_str());
            match found {
                Some((p, d)) => (p.display().to_string(), d),
                None => {
                    return Err(Finding::warn(
                        check,
                        format!("no config named {name:?} in {}: with Multus it lives in a NetworkAttachmentDefinition", o.conf_dir.display()),
                        format!("save the NAD's config and pass it: kubectl get net-attach-def NAME -o jsonpath='{{.spec.config}}' > /tmp/{name}.json; sticky-macvlan doctor --config /tmp/{name}.json"),
                    ))
                }
            }
        }
        (None, None) => return Ok(None),
    };
    let Some(ours) = ours_in(&doc) else {
        return Err(Finding::fail(
            check,
            format!("{source} has no plugin of type sticky-macvlan"),
            "pass the config that names \"type\": \"sticky-macvlan\"",
        ));
    };
    NetConf::parse(ours.to_string().as_bytes())
        .map(Some)
        .map_err(|e| {
            Finding::fail(
                check,
                format!("{source}: {}", e.msg),
                "fix the config as the message says: a pod start fails on it the same way",
            )
        })
}

fn ipam_of(conf: &NetConf, out: &mut Vec<Finding>) -> Option<IpamConfig> {
    let section = conf.common.ipam.as_ref()?;
    if section.plugin_type != crate::ipam::IN_PROCESS {
        return None;
    }
    match IpamConfig::parse(&conf.common.name, &section.raw) {
        Ok(ipam) => {
            out.push(Finding::ok(
                "network",
                format!("network {:?}: config valid", conf.common.name),
            ));
            Some(ipam)
        }
        Err(e) => {
            out.push(Finding::fail(
                "network",
                format!("network {:?}: ipam: {}", conf.common.name, e.msg),
                "fix the ipam section as the message says",
            ));
            None
        }
    }
}

fn master(conf: &NetConf) -> Finding {
    let mut nl = match crate::commands::connect(None) {
        Ok(nl) => nl,
        Err(e) => {
            return Finding::fail(
                "master",
                format!("cannot read this netns's links: {}", e.msg),
                "run doctor as root in the node's network namespace",
            )
        }
    };
    let (name, from) = match &conf.master {
        Some(m) => (m.clone(), "the config's master"),
        None => match nl.default_route_link(Ns::Node) {
            Ok(Some(m)) => (m, "the default route's interface"),
            _ => {
                return Finding::fail(
                    "master",
                    "the config names no master and this netns has no default route",
                    "set \"master\" in the network config",
                )
            }
        },
    };
    if conf.link_in_container {
        return Finding::ok(
            "master",
            format!("master {name:?} is looked up in the pod's netns (linkInContainer)"),
        );
    }
    let link = nl.link_by_name(Ns::Node, &name).ok().flatten();
    judge::master(&name, from, link.as_ref())
}

/// The kubeconfig, the token, RBAC and the CRDs, from the API server's
/// own answers.
/// The API findings; with INSTALLED (the bin dir's version), the
/// DaemonSet DS compared with it.
fn api(path: &Path, ds: &str, installed: Option<&str>) -> Vec<Finding> {
    let shown = path.display().to_string();
    let client = match KubeClient::from_kubeconfig(path, Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => return vec![judge::api_error("kubeconfig", "-", &shown, &e)],
    };
    let server = client.server().to_string();
    let user = match client.who_am_i() {
        Ok(u) => u,
        Err(e) => return vec![judge::api_error("kubeconfig", &server, &shown, &e)],
    };
    let mut out = vec![Finding::ok(
        "kubeconfig",
        format!("{shown}: {server} accepts the token as {user:?}"),
    )];
    let mut answers = Vec::new();
    for p in PLUGIN_ACCESS {
        match client.may(p) {
            Ok(allowed) => answers.push((p, allowed)),
            Err(e) => {
                out.push(judge::api_error("rbac", &server, &shown, &e));
                return out;
            }
        }
    }
    out.push(judge::access(&user, &answers, "sticky-macvlan"));
    out.push(match client.resources_served() {
        Ok(()) => Finding::ok("crd", "the API server serves ipclaims and iplocks"),
        Err(e) => judge::api_error("crd", &server, &shown, &e),
    });
    if let (Some(installed), Some((ns, name))) = (installed, ds.split_once('/')) {
        out.push(judge::daemon_set(
            ds,
            installed,
            &client.daemon_set(ns, name),
        ));
    }
    out
}
