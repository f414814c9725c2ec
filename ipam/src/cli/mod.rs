//! The operator CLI, shared by `sticky-ipam` and `sticky-macvlan` (their
//! binaries without CNI_COMMAND): claims, release, reconcile,
//! import-host-local. Output goes to stdout, errors to stderr with a
//! non-zero exit.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cni::{CniError, CniResult};

use crate::backend::Backend;
use crate::claim::{now_secs, Claim, Holder};
use crate::config::DEFAULT_STORE_DIR;
use crate::engine::{plan_reconcile, plan_release, plan_retire, ReleaseTarget, Released};
use crate::kube::client::KubeClient;
use crate::kube::KubeApi;
use crate::liveness::{Inspector, Verdict};
use crate::store::file::FileStore;
use crate::store::ipclaim::ORPHAN_LOCK_GRACE_SECS;
use crate::store::retry::with_retries;
use crate::store::{ClaimStore, Plan, PlanError, PlanResult, StoreError, StoreResult};
use crate::system::here;
use judge::Judge;

mod import;
mod judge;
pub mod metrics;
mod stop;

pub const COMMANDS_HELP: &str = "\
Claim commands (the file store under --dir, or the kubernetes store with
--kubeconfig):
  claims              list claims: network, IP, identity, sticky, holder, node, state, age
  release             remove a claim: --ip IP or --identity ID (with --network);
                      refuses while its holder is alive unless --force;
                      --file NAME removes a damaged record reported by `claims`
  reconcile           release every holder confirmed dead, once or every
                      --interval SECONDS, printing a summary line per sweep;
                      with --kubeconfig it also retires the sticky claims of
                      deleted StatefulSets (unless --keep-retired)
  import-host-local   adopt a host-local directory (--from DIR/NETWORK) into
                      --network, so a live node switches without IP conflicts
  import-whereabouts  adopt a Whereabouts range's allocations (--range CIDR)
                      into --network on the kubernetes store

Options (`COMMAND --help` for one command's):
";

/// The options every claim command takes.
pub const STORE_OPTIONS: &str = "\
  --dir DIR           store directory (default /var/lib/cni/sticky-ipam;
                      the ipam section's dataDir or store.dir)
  --kubeconfig PATH   use the kubernetes store (IPClaim objects) of that cluster
  --in-cluster        the same, with the pod's service account (reconcile Deployment)
  --timeout-ms MS     per-request timeout for the kubernetes API (default 10000)
  --network NAME      only this network (required by release and import)
  --node NAME         this node's name for liveness (file store default: the
                      hostname; kubernetes store default: none, the API decides;
                      its boot id and netns paths count only where this machine
                      is proven to be NAME: the installer's nodename file, beside
                      --kubeconfig or in /etc/cni/net.d/sticky-macvlan.d/, names
                      it, and Node NAME reports no other boot id)
  --cri-socket PATH   the container runtime's CRI socket, asked whether the
                      sandbox of an imported host-local holder still exists
                      (default /run/containerd/containerd.sock; \"\" asks none)
  --context NAME      the kubeconfig's context to use (default: its current one)
  --namespace NS      claims: only the claims of namespace NS (the identity's
                      namespace, or the holder pod's)
  --output FORMAT     claims: json, yaml or wide (adds retention, liveness reason)
  --json              claims: the same as --output json
  --metrics-addr ADDR reconcile: serve Prometheus metrics at http://ADDR/metrics
                      (e.g. 0.0.0.0:9402), refreshed every sweep
";

struct Opts {
    dir: PathBuf,
    network: Option<String>,
    node: Option<String>,
    values: BTreeMap<String, String>,
    flags: Vec<String>,
}

const VALUE_OPTS: [&str; 16] = [
    "--metrics-addr",
    "--context",
    "--namespace",
    "--output",
    "--cri-socket",
    "--dir",
    "--kubeconfig",
    "--timeout-ms",
    "--network",
    "--node",
    "--ip",
    "--identity",
    "--from",
    "--range",
    "--interval",
    "--file",
];
const FLAG_OPTS: [&str; 4] = ["--force", "--json", "--keep-retired", "--in-cluster"];

fn parse_opts(args: &[String]) -> Result<Opts, String> {
    let mut values = BTreeMap::new();
    let mut flags = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if VALUE_OPTS.contains(&a.as_str()) {
            let v = it
                .next()
                .ok_or_else(|| format!("option {a} needs a value"))?;
            values.insert(a.clone(), v.clone());
        } else if FLAG_OPTS.contains(&a.as_str()) {
            flags.push(a.clone());
        } else {
            return Err(format!("unknown argument {a:?}"));
        }
    }
    Ok(Opts {
        dir: values
            .remove("--dir")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STORE_DIR)),
        network: values.remove("--network"),
        node: values.remove("--node"),
        values,
        flags,
    })
}

impl Opts {
    fn flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }

    /// The CRI socket that judges holders without a netns ("" for none).
    fn cri_socket(&self) -> Option<PathBuf> {
        match self.values.get("--cri-socket").map(String::as_str) {
            None => Some(PathBuf::from(crate::cri::DEFAULT_CRI_SOCKET)),
            Some("") => None,
            Some(path) => Some(PathBuf::from(path)),
        }
    }

    fn backend(&self) -> CniResult<Backend> {
        let in_cluster = self.flag("--in-cluster");
        let path = self.values.get("--kubeconfig");
        if !in_cluster && path.is_none() {
            return Ok(Backend::File {
                dir: self.dir.clone(),
                cri_socket: self.cri_socket(),
            });
        }
        let timeout = match self.values.get("--timeout-ms") {
            None => Duration::from_millis(crate::config::DEFAULT_KUBE_TIMEOUT_MS),
            Some(ms) => Duration::from_millis(ms.parse().map_err(|_| {
                CniError::invalid_config(format!(
                    "--timeout-ms {ms:?} must be a number of milliseconds"
                ))
            })?),
        };
        let context = self.values.get("--context").map(String::as_str);
        let client = match path {
            Some(path) => {
                KubeClient::from_kubeconfig_context(std::path::Path::new(path), context, timeout)
            }
            None => KubeClient::in_cluster(timeout),
        }
        .map_err(StoreError::from)?;
        Ok(Backend::Kube {
            client: Ok(client),
            local: None,
        })
    }

    /// The liveness judge and where it judges from, decided once. The file
    /// store is one node's: its evidence is this node's. On the kubernetes
    /// store the API alone decides unless a node is named and this machine
    /// provably is that node (`liveness::node_evidence`), so a command run
    /// anywhere else says what any node would.
    fn judge<'b>(&self, backend: &'b Backend) -> CniResult<Judge<'b>> {
        let here = here(self.values.get("--kubeconfig").map(std::path::Path::new));
        Ok(match backend {
            Backend::File { cri_socket, .. } => {
                Judge::file(self.node.as_deref(), &here, cri_socket.clone())
            }
            Backend::Kube { .. } => {
                let api: &dyn KubeApi = backend.client()?;
                Judge::kube(api, self.node.as_deref(), &here)
            }
        })
    }

    /// The networks to act on; a named one must already have claims (a
    /// typo must not create an empty store).
    fn networks(&self, backend: &Backend) -> CniResult<Vec<String>> {
        let known = backend.networks()?;
        match &self.network {
            None => Ok(known),
            Some(n) if known.contains(n) => Ok(vec![n.clone()]),
            Some(n) => Err(CniError::invalid_config(format!(
                "network {n:?} has no claims in {} (networks there: {}): check --network, and --dir against the ipam section's dataDir",
                backend.describe(),
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ))),
        }
    }

    fn network(&self, command: &str) -> Result<String, CniError> {
        self.network
            .clone()
            .ok_or_else(|| CniError::invalid_config(format!("{command} needs --network NAME")))
    }
}

/// One subcommand's usage, for `COMMAND --help`.
fn usage(command: &str) -> Option<&'static str> {
    Some(match command {
        "claims" => {
            "\
claims [--dir DIR | --kubeconfig PATH | --in-cluster] [--network NET] [--node NAME] [--json]
  Lists every claim: network, IP, identity, sticky, holder pod and container,
  node, state and age. STATE is one of held, dead, reserved, released, free,
  damaged (released: a claim freed on a judgement, kept until a probe of its
  address at its next grant);
  --json gives each claim with \"state\", \"reason\" and \"judgedFrom\".
  On the kubernetes store the state is judged from the API alone, as any
  node would, so it does not depend on where the command runs; --node NAME
  adds that node's own evidence (its boot id and netns paths), as an ADD
  there does, only when this machine is proven to be NAME (see --node);
  stderr, and \"evidence\" in --json, say which was used."
        }
        "release" => {
            "\
release --network NET (--ip IP | --identity ID | --file NAME) [--force] [store options]
  Removes a claim. A claim that had a holder (or was already released on
  a judgement) is kept as released instead, its identity's reservation
  gone, so that its address is probed on the wire before it is bound
  again. Refused while its holder is considered alive, unless
  --force; liveness as for claims (a node's own evidence only on that node,
  and stderr says which). --file removes a damaged record named by `claims`
  or by an error (a claim's file name, or identities/NAME, holders/NAME)
  and rebuilds the network's indexes."
        }
        "reconcile" => {
            "\
reconcile [store options] [--network NET] [--interval SECONDS] [--keep-retired] [--metrics-addr ADDR]
  Releases every holder confirmed dead, once or every --interval seconds,
  printing a summary line per sweep (the addresses it frees are probed
  before they are bound again); SIGTERM stops it between sweeps.
  Liveness as for claims (stderr says which evidence); every network, and
  every attempt after a lost race, is judged by lookups of its own. On
  the kubernetes store it also retires the sticky claims their network's
  ipam.retention gives up (by default those of deleted StatefulSets) unless
  --keep-retired, and with
  --metrics-addr serves Prometheus metrics: per network the range size (from
  the NetworkAttachmentDefinitions), addresses held, reserved, dead and free,
  and counters of refusals by reason, takeovers and reclaims (from the
  plugins' Events), releases, sweeps, failed sweeps and API errors. With
  --interval a failed sweep is logged and counted, and the next one runs."
        }
        "import-host-local" => {
            "\
import-host-local --network NET --from /var/lib/cni/networks/NET [store options]
  Adopts host-local's allocations of one network on this node (the
  directory that holds one file per address, `lock` and
  `last_reserved_ip.N`) as dynamic claims held by their containers, naming
  their pods (from the container runtime), into the file store (--dir) or
  the kubernetes store (--kubeconfig or --in-cluster, with --node). Safe
  to rerun; an address claimed by another holder is a conflict, listed,
  and the exit code is non-zero."
        }
        "import-whereabouts" => {
            "\
import-whereabouts --network NET --range CIDR (--kubeconfig PATH | --in-cluster)
  Adopts the allocations of the Whereabouts IPPool of range CIDR (v0.9's
  whereabouts.cni.cncf.io/v1alpha1, any namespace) whose pods still exist
  as dynamic claims naming those pods and their nodes, into the kubernetes
  store. Multus keeps sending those pods' DELs to Whereabouts, so their
  claims are freed by liveness once they are gone. Safe to rerun;
  conflicts as import-host-local. Needs list on ippools and get on pods."
        }
        _ => return None,
    })
}

/// Runs a CLI command; `None` when `command` is not one of ours.
pub fn run(program: &str, command: &str, args: &[String]) -> Option<ExitCode> {
    let usage = usage(command)?;
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{program} {usage}\n\nStore options:\n{STORE_OPTIONS}");
        return Some(ExitCode::SUCCESS);
    }
    let opts = match parse_opts(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{program} {command}: {e}; run `{program} --help`");
            return Some(ExitCode::from(2));
        }
    };
    let result = match command {
        "claims" => claims(&opts),
        "release" => release(&opts),
        "reconcile" => reconcile(&opts),
        "import-whereabouts" => import::import_whereabouts(&opts),
        _ => import::import_host_local(&opts),
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program} {command}: {}", e.msg);
            ExitCode::from(1)
        }
    })
}

pub const KUBECTL_HELP: &str = "\
kubectl sticky: sticky-macvlan's claims on the cluster in kubectl's terms
(install: put the sticky-macvlan binary on your PATH as kubectl-sticky)

Usage: kubectl sticky <command> [options]

Commands:
  claims      list the IPClaims with their state judged from the API:
              network, IP, identity, sticky, pod, container, node, state, age
  release     remove a claim: --network NET (--ip IP | --identity ID) [--force]
  reconcile   release every holder the API proves dead (once)

Options, as kubectl takes them:
  --kubeconfig PATH        default: $KUBECONFIG, else ~/.kube/config
  --context NAME           a context of that kubeconfig
  -n, --namespace NS       only the claims of that namespace (the identity's,
                           or its holder pod's); default: every namespace
  -A, --all-namespaces     every namespace (the default)
  -o, --output FORMAT      json, yaml or wide (wide adds retention and the liveness reason)
  --network NET            only that network
";

/// `kubectl sticky ...` (the binary run as `kubectl-sticky`): the claim
/// commands on the kubernetes store, with kubectl's flags translated.
pub fn kubectl_plugin(args: &[String]) -> ExitCode {
    let command = args.first().map(String::as_str).unwrap_or("help");
    if matches!(command, "help" | "--help" | "-h") {
        print!("{KUBECTL_HELP}");
        return ExitCode::SUCCESS;
    }
    if !matches!(command, "claims" | "release" | "reconcile") {
        eprintln!("kubectl sticky: unknown command {command:?}; run `kubectl sticky --help`");
        return ExitCode::from(2);
    }
    let mut out: Vec<String> = Vec::new();
    for a in &args[1..] {
        // --output=json and -ojson, as kubectl accepts them.
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ if a.starts_with("-o") && a.len() > 2 => ("-o".to_string(), Some(a[2..].to_string())),
            _ => (a.clone(), None),
        };
        let flag = match flag.as_str() {
            "-o" => "--output".to_string(),
            "-n" => "--namespace".to_string(),
            "-A" | "--all-namespaces" => continue,
            _ => flag,
        };
        out.push(flag);
        out.extend(value);
    }
    if !out.iter().any(|a| a == "--kubeconfig") {
        let path = std::env::var("KUBECONFIG")
            .ok()
            .and_then(|v| v.split(':').find(|p| !p.is_empty()).map(str::to_string))
            .or_else(|| {
                std::env::var("HOME")
                    .ok()
                    .map(|h| format!("{h}/.kube/config"))
            });
        let Some(path) = path else {
            eprintln!("kubectl sticky: no kubeconfig: set KUBECONFIG or pass --kubeconfig");
            return ExitCode::from(2);
        };
        out.extend(["--kubeconfig".to_string(), path]);
    }
    run("kubectl sticky", command, &out).unwrap_or(ExitCode::from(2))
}

/// The `sticky-ipam` binary's whole CLI.
pub fn main(program: &str, args: &[String]) -> ExitCode {
    let command = args.first().map(String::as_str).unwrap_or("help");
    if matches!(command, "help" | "--help" | "-h") {
        println!(
            "{program} {}: sticky, identity-keyed IPAM for CNI\n\nAs a CNI IPAM plugin it is run with CNI_COMMAND set and the network config on stdin.\n\nUsage: {program} <command> [options]\n\n{COMMANDS_HELP}{STORE_OPTIONS}",
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    if matches!(command, "version" | "--version" | "-V") {
        println!("{program} {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    run(program, command, &args[1..]).unwrap_or_else(|| {
        eprintln!("{program}: unknown command {command:?}; run `{program} --help`");
        ExitCode::from(2)
    })
}

fn age(since: u64, now: u64) -> String {
    let s = now.saturating_sub(since);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// A claim's state, from a fixed vocabulary, and why.
fn state(claim: &Claim, inspector: &dyn Inspector) -> (&'static str, String) {
    let probe = |what: String| match &claim.unconfirmed {
        Some(u) => format!(
            "{what}; probed on the wire before its next grant: {}",
            u.why
        ),
        None => what,
    };
    match &claim.holder {
        None if claim.sticky => (
            "reserved",
            probe("sticky, no holder: kept for its identity".into()),
        ),
        None if claim.is_tombstone() => (
            "released",
            probe("no holder, released on a judgement; an exhausted pool reuses it".into()),
        ),
        None => ("free", "no holder".into()),
        Some(h) => match inspector.verdict(h, None) {
            Verdict::Alive(why) => ("held", probe(why)),
            Verdict::Dead(why) => ("dead", probe(why)),
        },
    }
}

/// How `claims` prints: a table (`wide` adds the retention and the reason), JSON or YAML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

impl Opts {
    fn output(&self) -> CniResult<Output> {
        match self.values.get("--output").map(String::as_str) {
            None if self.flag("--json") => Ok(Output::Json),
            None => Ok(Output::Table),
            Some("json") => Ok(Output::Json),
            Some("yaml") => Ok(Output::Yaml),
            Some("wide") => Ok(Output::Wide),
            Some(other) => Err(CniError::invalid_config(format!(
                "--output {other:?} is not one of json, yaml, wide"
            ))),
        }
    }

    /// Whether `claim` is of the namespace `--namespace` names (its
    /// identity's, or its holder pod's); every claim when none is named.
    fn in_namespace(&self, claim: &Claim) -> bool {
        let Some(ns) = self.values.get("--namespace") else {
            return true;
        };
        claim.namespace.as_deref() == Some(ns.as_str())
            || claim
                .holder
                .as_ref()
                .is_some_and(|h| h.pod_namespace.as_deref() == Some(ns.as_str()))
    }
}

fn claims(opts: &Opts) -> CniResult<()> {
    let output = opts.output()?;
    let backend = opts.backend()?;
    let judge = opts.judge(&backend)?;
    let judged_from = judge.from();
    let evidence = judge.describe();
    let now = now_secs();
    let mut rows = vec![[
        "NETWORK",
        "IP",
        "IDENTITY",
        "STICKY",
        "POD",
        "CONTAINER",
        "NODE",
        "STATE",
        "AGE",
        "RETENTION",
        "REASON",
    ]
    .map(String::from)];
    let mut json = Vec::new();
    for network in opts.networks(&backend)? {
        let mut store = backend.open(&network, vec![])?;
        let listing = store.list()?;
        let inspector = judge.inspector();
        for c in listing.claims.iter().filter(|c| opts.in_namespace(c)) {
            let h = c.holder.as_ref();
            let (st, reason) = state(c, inspector.as_ref());
            json.push(serde_json::json!({"network": network, "claim": c, "state": st, "reason": reason, "judgedFrom": judged_from, "evidence": evidence}));
            rows.push([
                network.clone(),
                c.ip.to_string(),
                c.identity.clone(),
                if c.sticky { "yes" } else { "no" }.into(),
                h.and_then(Holder::pod).unwrap_or_else(|| "-".into()),
                h.map(|h| {
                    let short: String = h.container_id.chars().take(12).collect();
                    format!("{short}/{}", h.ifname)
                })
                .unwrap_or_else(|| "-".into()),
                h.map(|h| h.node.clone()).unwrap_or_else(|| "-".into()),
                st.to_string(),
                age(c.updated, now),
                // Only a StatefulSet's claims have a retention to apply.
                c.owner
                    .as_ref()
                    .map(|o| o.retention.describe())
                    .unwrap_or_else(|| "-".into()),
                reason,
            ]);
        }
        // A damaged record has no namespace to filter by.
        let damaged = if opts.values.contains_key("--namespace") {
            &[][..]
        } else {
            &listing.damaged[..]
        };
        for d in damaged {
            let name = d
                .path
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            json.push(serde_json::json!({"network": network, "damaged": d.path, "state": "damaged", "reason": d.why}));
            rows.push([
                network.clone(),
                name,
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "damaged".into(),
                "-".into(),
                "-".into(),
                d.why.clone(),
            ]);
            eprintln!(
                "{network}: record {} is damaged: {}",
                d.path.display(),
                d.why
            );
        }
    }
    match output {
        Output::Json => {
            println!("{}", serde_json::Value::Array(json));
            return Ok(());
        }
        Output::Yaml => {
            let text = serde_saphyr::to_string(&serde_json::Value::Array(json))
                .map_err(|e| CniError::io(format!("cannot write YAML: {e}")))?;
            print!("{text}");
            return Ok(());
        }
        // RETENTION and REASON are wide's.
        Output::Table => rows.iter_mut().for_each(|r| {
            r[9].clear();
            r[10].clear();
        }),
        Output::Wide => {}
    }
    eprintln!("states judged from {evidence}");
    let widths: Vec<usize> = (0..11)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

fn release(opts: &Opts) -> CniResult<()> {
    let network = opts.network("release")?;
    let backend = opts.backend()?;
    opts.networks(&backend)?;
    if let Some(name) = opts.values.get("--file") {
        let Backend::File { dir, .. } = &backend else {
            return Err(CniError::invalid_config(
                "release --file is for damaged file-store records; in the kubernetes store delete the IPClaim with kubectl",
            ));
        };
        let mut store = FileStore::open(dir, &network)?;
        store.remove_record(name)?;
        store.rebuild_indexes()?;
        println!("removed record {name} of network {network} and rebuilt its indexes");
        return Ok(());
    }
    let target =
        match (opts.values.get("--ip"), opts.values.get("--identity")) {
            (Some(ip), None) => ReleaseTarget::Address(ip.parse().map_err(|_| {
                CniError::invalid_config(format!("--ip {ip:?} is not an IP address"))
            })?),
            (None, Some(id)) => ReleaseTarget::Identity(id.clone()),
            _ => {
                return Err(CniError::invalid_config(
                    "release needs exactly one of --ip IP, --identity ID or --file NAME",
                ))
            }
        };
    let judge = opts.judge(&backend)?;
    eprintln!("release: verdicts from {}", judge.describe());
    let mut store = backend.open(&network, vec![])?;
    let released = release_on(&mut store, &judge, &network, &target, opts.flag("--force"))?;
    for c in &released {
        println!(
            "released {} (identity {:?}) on network {network}",
            c.ip, c.identity
        );
    }
    Ok(())
}

/// Releases `target` of `network` in `store`, refused while its holder is
/// alive unless `force`.
fn release_on(
    store: &mut dyn ClaimStore,
    judge: &Judge,
    network: &str,
    target: &ReleaseTarget,
    force: bool,
) -> CniResult<Vec<Claim>> {
    // Each attempt judges with lookups of its own.
    let (_, released) = with_retries(store, "release", |s| {
        plan_release(
            s,
            judge.inspector().as_ref(),
            network,
            target,
            force,
            now_secs(),
        )
    })?;
    Ok(released)
}

fn reconcile(opts: &Opts) -> CniResult<()> {
    let interval = match opts.values.get("--interval") {
        None => None,
        Some(s) => match s.parse::<u64>() {
            Ok(n) if n > 0 => Some(Duration::from_secs(n)),
            _ => {
                return Err(CniError::invalid_config(format!(
                    "--interval {s:?} must be a whole number of seconds, at least 1"
                )))
            }
        },
    };
    let backend = opts.backend()?;
    let judge = opts.judge(&backend)?;
    eprintln!("reconcile: verdicts from {}", judge.describe());
    let retire = backend.is_kube() && !opts.flag("--keep-retired");
    let mut metrics = metrics::Metrics::default();
    let page = Arc::new(Mutex::new(metrics.render()));
    // The gauges cost a listing of each network and two cluster-wide
    // listings per sweep: made only when someone can read them.
    let serving = opts.values.get("--metrics-addr");
    if let Some(addr) = serving {
        metrics::serve(addr, page.clone()).map_err(|e| {
            CniError::io(format!(
                "cannot serve metrics on {addr}: {e}: pass a free ADDR:PORT to --metrics-addr"
            ))
        })?;
        eprintln!("reconcile: metrics at http://{addr}/metrics");
    }
    if interval.is_some() {
        stop::install();
    }
    loop {
        let t0 = Instant::now();
        let gauges = serving.is_some();
        let swept = sweep(opts, &backend, &judge, retire, gauges, &mut metrics);
        let api_failed = matches!(&swept, Err(e) if e.code == cni::code::STORE_UNREACHABLE || e.code == cni::code::STORE_REFUSED);
        if api_failed {
            metrics.api_error();
        }
        metrics.swept(t0.elapsed().as_secs_f64(), swept.is_ok());
        if let Ok(mut p) = page.lock() {
            *p = metrics.render();
        }
        match (interval, swept) {
            (None, outcome) => return outcome,
            (Some(d), outcome) => {
                if let Err(e) = outcome {
                    eprintln!(
                        "reconcile: this sweep failed, the next runs in {} s: {}",
                        d.as_secs(),
                        e.msg
                    );
                }
                if stop::sleep_unless_stopped(d) {
                    eprintln!("reconcile: stopped by a signal, between sweeps");
                    return Ok(());
                }
            }
        }
    }
}

/// One sweep over every network; counts its releases in `metrics`, and
/// with `gauges` also reads what the metrics' gauges and Event counters
/// need.
fn sweep(
    opts: &Opts,
    backend: &Backend,
    judge: &Judge,
    retire: bool,
    gauges: bool,
    metrics: &mut metrics::Metrics,
) -> CniResult<()> {
    let networks = opts.networks(backend)?;
    let open = |network: &str| backend.open(network, vec![]);
    let mut tally = sweep_networks(&networks, &open, judge, retire, gauges, metrics)?;
    if !gauges {
        summary(&networks, &tally);
        return Ok(());
    }
    if let Backend::Kube {
        client: Ok(client), ..
    } = backend
    {
        // Best effort: a listing that fails keeps the last figures.
        match client.nad_configs() {
            Ok(configs) => {
                for (network, size) in metrics::ranges_of(&configs) {
                    tally.figures.entry(network).or_default().range = Some(size);
                }
            }
            Err(e) => {
                metrics.api_error();
                eprintln!("reconcile: metrics: {e}");
                for (network, last) in &metrics.networks {
                    if let Some(range) = last.range {
                        tally.figures.entry(network.clone()).or_default().range = Some(range);
                    }
                }
            }
        }
        match client.our_events() {
            Ok(events) => metrics.observe_events(&events),
            Err(e) => {
                metrics.api_error();
                eprintln!("reconcile: metrics: {e}");
            }
        }
    }
    metrics.networks = std::mem::take(&mut tally.figures);
    summary(&networks, &tally);
    Ok(())
}

/// What a sweep did, for its summary line and the metrics' gauges.
#[derive(Debug, Default)]
struct Tally {
    released: usize,
    retired: usize,
    alive: usize,
    /// Networks skipped after losing every race (the next sweep sees them).
    raced: Vec<String>,
    figures: BTreeMap<String, metrics::NetworkGauges>,
}

/// The sweep's work on each network's store (`open`): release dead
/// holders, unlock orphan locks, retire (with `retire`), and with `gauges`
/// count the network's claims by state. Every plan, and every attempt of
/// one, judges with a new inspector: a pod looked up for one network, or
/// before a lost race, may have been re-created since.
fn sweep_networks<'a>(
    networks: &[String],
    open: &dyn Fn(&str) -> StoreResult<crate::backend::Store<'a>>,
    judge: &Judge<'a>,
    retire: bool,
    gauges: bool,
    metrics: &mut metrics::Metrics,
) -> CniResult<Tally> {
    let mut tally = Tally::default();
    for network in networks {
        let mut store = open(network)?;
        let swept = with_retries(&mut store, "reconcile", |s| {
            let (plan, gone, live) = plan_reconcile(s, judge.inspector().as_ref(), now_secs())?;
            Ok((plan, (gone, live)))
        });
        match sweep_outcome(swept, network, "released")? {
            Some((gone, live)) => {
                tally.released += gone.len();
                metrics.released(network, gone.len() as u64);
                tally.alive += live;
            }
            None => tally.raced.push(network.clone()),
        }
        if let crate::backend::Store::Kube(kube) = &mut store {
            let swept = kube.sweep_locks(ORPHAN_LOCK_GRACE_SECS)?;
            for ip in swept.freed {
                println!("{network}: unlocked {ip}: an ADD left its lock and no claim more than {ORPHAN_LOCK_GRACE_SECS} s ago");
            }
            for ip in swept.cleared {
                println!("{network}: cleared the mark of the lock on {ip}: the claim naming it carries none");
            }
        }
        if retire {
            let swept = with_retries(&mut store, "retire", |s| {
                let (plan, out) = plan_retire(s, judge.inspector().as_ref(), now_secs())?;
                Ok((plan, (out, 0)))
            });
            match sweep_outcome(swept, network, "retired")? {
                Some((out, _)) => tally.retired += out.len(),
                None => tally.raced.push(network.clone()),
            }
        }
        if !gauges {
            continue;
        }
        let mut g = metrics::NetworkGauges::default();
        let inspector = judge.inspector();
        for c in &store.list()?.claims {
            match state(c, inspector.as_ref()).0 {
                "held" => g.held += 1,
                "dead" => g.dead += 1,
                "released" => g.released += 1,
                _ => g.reserved += u64::from(c.sticky),
            }
        }
        tally.figures.insert(network.clone(), g);
    }
    Ok(tally)
}

/// The sweep's summary line.
fn summary(networks: &[String], tally: &Tally) {
    let Tally {
        released,
        retired,
        alive,
        raced,
        ..
    } = tally;
    println!(
        "reconcile: {} networks, {released} dead holders released, {retired} sticky claims of deleted StatefulSets retired, {alive} live holders kept{}",
        networks.len(),
        if raced.is_empty() {
            String::new()
        } else {
            format!(", {} skipped after a concurrent change (next sweep): {}", raced.len(), raced.join(", "))
        }
    );
}

/// Prints what one sweep of a network changed; None when it kept losing
/// races (or the store stayed locked): the next sweep sees the new state.
fn sweep_outcome(
    swept: PlanResult<(Plan, (Vec<Released>, usize))>,
    network: &str,
    verb: &str,
) -> CniResult<Option<(Vec<Released>, usize)>> {
    match swept {
        Ok((_, (what, live))) => {
            for r in &what {
                println!(
                    "{network}: {verb} {} of identity {:?}: {}",
                    r.ip, r.identity, r.why
                );
            }
            Ok(Some((what, live)))
        }
        Err(PlanError::Store(StoreError::Busy(_))) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
