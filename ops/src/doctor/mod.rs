//! `sticky-macvlan doctor`: checks a node the way a failed pod start
//! would find it, and lists each problem with its fix. The checks gather
//! facts here (files, the installed binaries, netlink in this netns, the
//! API server's own answers: SelfSubjectReview, SelfSubjectAccessReview,
//! the resources it serves); `judge` turns them into findings.

mod findings;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use serde_json::Value;
use sticky_ipam::backend::Backend;
use sticky_ipam::config::{IpamConfig, StoreKind};
use sticky_ipam::kube::client::KubeClient;
use sticky_ipam::kube::PLUGIN_ACCESS;

use crate::admin::AdminApi;
pub use findings::{Finding, Severity};

pub const DESCRIPTION: &str = "\
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
it in the node's network namespace. Exit code: 0 no problem, 1 warnings,
2 failures.";

pub const OPTIONS: &str = "  --bin-dir DIR       the runtime's CNI bin dir (default /opt/cni/bin)
  --conf-dir DIR      the runtime's CNI conf dir (default /etc/cni/net.d)
  --network NAME      check this network's config, found in --conf-dir
  --config FILE       check this network config (a NAD's spec.config)
  --kubeconfig PATH   the plugin's kubeconfig (default: the network's
                      ipam.store.kubeconfig, else
                      <conf dir>/sticky-macvlan.d/sticky-macvlan.kubeconfig)
  --daemonset NS/NAME the installer DaemonSet (default
                      kube-system/sticky-macvlan)
  --json              print the findings as JSON
";

/// What doctor asks of the main plugin, which alone knows its config and
/// reads this netns's links (`sticky_macvlan::doctor_datapath` answers
/// from netlink; the tests from a table).
pub trait Datapath {
    /// The plugin type whose entry of a network config is checked.
    fn plugin_type(&self) -> &'static str;
    /// Parses that entry (a `.conf`, or a conflist's entry carrying the
    /// list's name and version, as libcni hands it over); the error is the
    /// one a pod start would fail with.
    fn network(&self, entry: &[u8]) -> Result<Network, String>;
    /// The interface of this netns's default route.
    fn default_route_link(&self) -> Result<Option<String>, String>;
    /// A link of this netns, by name.
    fn link(&self, name: &str) -> Result<Option<LinkFacts>, String>;
}

/// What doctor checks of a network's config.
pub struct Network {
    pub name: String,
    /// The config's master; None for the default route's interface.
    pub master: Option<String>,
    /// The master is looked up in the pod's netns.
    pub link_in_container: bool,
    /// The `ipam` section when it is the in-process sticky-ipam.
    pub ipam: Option<Value>,
}

/// What doctor judges of a master link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFacts {
    pub mtu: u32,
    pub up: bool,
    /// "bond", "bridge", ... when the link is a port of one.
    pub port_kind: Option<String>,
}

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

pub fn main(program: &str, args: &[String], datapath: &dyn Datapath) -> ExitCode {
    let opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{program} doctor: {e}; see --help");
            return ExitCode::from(2);
        }
    };
    let findings = examine(&opts, datapath);
    if opts.json {
        println!("{}", findings::render_json(&findings));
    } else {
        print!("{}", findings::render_text(&findings));
    }
    ExitCode::from(findings::exit_code(&findings))
}

fn examine(o: &Opts, datapath: &dyn Datapath) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut installed_version = None;
    for name in ["sticky-macvlan", "sticky-ipam"] {
        let found = installed(&o.bin_dir.join(name));
        if let (findings::Installed::Version(v), "sticky-macvlan") = (&found, name) {
            installed_version = Some(v.clone());
        }
        out.push(findings::binary(
            &o.bin_dir.display().to_string(),
            name,
            &found,
            env!("CARGO_PKG_VERSION"),
        ));
    }
    let configs = cni_configs(&o.conf_dir);
    out.push(findings::conf_dir(
        &o.conf_dir.display().to_string(),
        o.conf_dir.is_dir(),
        configs.len(),
    ));
    let network = match network_config(o, &configs, datapath) {
        Ok(n) => n,
        Err(f) => {
            out.push(f);
            None
        }
    };
    let ipam = network.as_ref().and_then(|n| ipam_of(n, &mut out));
    if let Some(n) = &network {
        out.push(master(n, datapath));
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
fn installed(path: &Path) -> findings::Installed {
    let Ok(meta) = std::fs::metadata(path) else {
        return findings::Installed::Missing;
    };
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return findings::Installed::NotExecutable;
    }
    match Command::new(path)
        .arg("version")
        .env_remove("CNI_COMMAND")
        .output()
    {
        Ok(out) if out.status.success() => findings::Installed::Version(
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .trim_end_matches(':')
                .to_string(),
        ),
        Ok(out) => {
            findings::Installed::Unrunnable(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
        Err(e) => findings::Installed::Unrunnable(e.to_string()),
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

/// Our plugin's entry of a .conf or .conflist document (a conflist's
/// entry of type `ours`, with the list's name and version, as libcni hands
/// it over).
fn ours_in(doc: &Value, ours: &str) -> Option<Value> {
    if doc["type"] == ours {
        return Some(doc.clone());
    }
    let plugin = doc["plugins"]
        .as_array()?
        .iter()
        .find(|p| p["type"] == ours)?;
    let mut plugin = plugin.clone();
    plugin["name"] = doc["name"].clone();
    plugin["cniVersion"] = doc["cniVersion"].clone();
    Some(plugin)
}

fn network_config(
    o: &Opts,
    configs: &[PathBuf],
    datapath: &dyn Datapath,
) -> Result<Option<Network>, Finding> {
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
    let plugin_type = datapath.plugin_type();
    let Some(ours) = ours_in(&doc, plugin_type) else {
        return Err(Finding::fail(
            check,
            format!("{source} has no plugin of type {plugin_type}"),
            format!("pass the config that names \"type\": \"{plugin_type}\""),
        ));
    };
    datapath
        .network(ours.to_string().as_bytes())
        .map(Some)
        .map_err(|e| {
            Finding::fail(
                check,
                format!("{source}: {e}"),
                "fix the config as the message says: a pod start fails on it the same way",
            )
        })
}

fn ipam_of(conf: &Network, out: &mut Vec<Finding>) -> Option<IpamConfig> {
    let section = conf.ipam.as_ref()?;
    match IpamConfig::parse(&conf.name, section) {
        Ok(ipam) => {
            out.push(Finding::ok(
                "network",
                format!("network {:?}: config valid", conf.name),
            ));
            Some(ipam)
        }
        Err(e) => {
            out.push(Finding::fail(
                "network",
                format!("network {:?}: ipam: {}", conf.name, e.msg),
                "fix the ipam section as the message says",
            ));
            None
        }
    }
}

fn master(conf: &Network, datapath: &dyn Datapath) -> Finding {
    let unreadable = |e: String| {
        Finding::fail(
            "master",
            format!("cannot read this netns's links: {e}"),
            "run doctor as root in the node's network namespace",
        )
    };
    let (name, from) = match &conf.master {
        Some(m) => (m.clone(), "the config's master"),
        None => match datapath.default_route_link() {
            Ok(Some(m)) => (m, "the default route's interface"),
            Ok(None) => {
                return Finding::fail(
                    "master",
                    "the config names no master and this netns has no default route",
                    "set \"master\" in the network config",
                )
            }
            Err(e) => return unreadable(e),
        },
    };
    if conf.link_in_container {
        return Finding::ok(
            "master",
            format!("master {name:?} is looked up in the pod's netns (linkInContainer)"),
        );
    }
    match datapath.link(&name) {
        Ok(link) => findings::master(&name, from, link.as_ref()),
        Err(e) => unreadable(e),
    }
}

/// The kubeconfig, the token, RBAC and the CRDs, from the API server's
/// own answers.
/// The API findings; with INSTALLED (the bin dir's version), the
/// DaemonSet DS compared with it.
fn api(path: &Path, ds: &str, installed: Option<&str>) -> Vec<Finding> {
    let shown = path.display().to_string();
    let client = match KubeClient::from_kubeconfig(path, Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => return vec![findings::api_error("kubeconfig", "-", &shown, &e)],
    };
    let server = client.server().to_string();
    let user = match client.who_am_i() {
        Ok(u) => u,
        Err(e) => return vec![findings::api_error("kubeconfig", &server, &shown, &e)],
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
                out.push(findings::api_error("rbac", &server, &shown, &e));
                return out;
            }
        }
    }
    out.push(findings::access(&user, &answers, "sticky-macvlan"));
    out.push(match client.resources_served() {
        Ok(()) => Finding::ok("crd", "the API server serves ipclaims and iplocks"),
        Err(e) => findings::api_error("crd", &server, &shown, &e),
    });
    if let (Some(installed), Some((ns, name))) = (installed, ds.split_once('/')) {
        out.push(findings::daemon_set(
            ds,
            installed,
            &client.daemon_set(ns, name),
        ));
    }
    out
}
