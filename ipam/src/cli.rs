//! The operator CLI, shared by `sticky-ipam` and `sticky-macvlan` (their
//! binaries without CNI_COMMAND): claims, release, reconcile,
//! import-host-local. Output goes to stdout, errors to stderr with a
//! non-zero exit.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use cni::{CniError, CniResult};

use crate::backend::Backend;
use crate::claim::{now_secs, Claim, Holder};
use crate::config::DEFAULT_STORE_DIR;
use crate::cri::SandboxRuntime;
use crate::engine::{plan_reconcile, plan_release, plan_retire, ReleaseTarget, Released};
use crate::identity::dynamic_key;
use crate::kube::client::KubeClient;
use crate::liveness::{Inspector, NodeFacts, Verdict};
use crate::store::file::FileStore;
use crate::store::retry::with_retries;
use crate::store::{Change, ClaimStore, Plan, PlanError, PlanResult, StoreError};
use crate::system::node_facts;

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
                      hostname; kubernetes store default: none, the API decides)
  --cri-socket PATH   the container runtime's CRI socket, asked whether the
                      sandbox of an imported host-local holder still exists
                      (default /run/containerd/containerd.sock; \"\" asks none)
  --json              claims: print JSON instead of a table
";

struct Opts {
    dir: PathBuf,
    network: Option<String>,
    node: Option<String>,
    values: BTreeMap<String, String>,
    flags: Vec<String>,
}

const VALUE_OPTS: [&str; 11] = [
    "--cri-socket",
    "--dir",
    "--kubeconfig",
    "--timeout-ms",
    "--network",
    "--node",
    "--ip",
    "--identity",
    "--from",
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
        let client = match path {
            Some(path) => KubeClient::from_kubeconfig(std::path::Path::new(path), timeout),
            None => KubeClient::in_cluster(timeout),
        }
        .map_err(StoreError::from)?;
        Ok(Backend::Kube {
            client: Ok(client),
            local: None,
        })
    }

    /// The liveness judge and where it judges from. The file store is one
    /// node's: its evidence is this node's. On the kubernetes store the API
    /// alone decides unless a node is named, so `claims` run anywhere says
    /// what any node would.
    fn inspector<'a>(&self, backend: &'a Backend) -> CniResult<(Box<dyn Inspector + 'a>, String)> {
        let (facts, from) = match (backend.is_kube(), self.node.as_deref()) {
            (true, None) => (NodeFacts::default(), "the kubernetes API".to_string()),
            (true, node) => {
                let facts = node_facts(node);
                let from = format!("node {} and the kubernetes API", facts.node);
                (facts, from)
            }
            (false, node) => {
                let facts = node_facts(node);
                let from = format!("node {}", facts.node);
                (facts, from)
            }
        };
        Ok((backend.inspector(facts)?, from))
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
  node, state and age. STATE is one of held, dead, reserved, free, damaged;
  --json gives each claim with \"state\", \"reason\" and \"judgedFrom\".
  On the kubernetes store the state is judged from the API alone, as any
  node would, so it does not depend on where the command runs; --node NAME
  adds that node's own evidence (its netns paths), as an ADD there does."
        }
        "release" => {
            "\
release --network NET (--ip IP | --identity ID | --file NAME) [--force] [store options]
  Removes a claim. Refused while its holder is considered alive, unless
  --force. --file removes a damaged record named by `claims` or by an error
  (a claim's file name, or identities/NAME, holders/NAME) and rebuilds the
  network's indexes."
        }
        "reconcile" => {
            "\
reconcile [store options] [--network NET] [--interval SECONDS] [--keep-retired]
  Releases every holder confirmed dead, once or every --interval seconds,
  printing a summary line per sweep. On the kubernetes store it also retires
  the sticky claims of deleted StatefulSets unless --keep-retired."
        }
        "import-host-local" => {
            "\
import-host-local --network NET --from /var/lib/cni/networks/NET [--dir DIR]
  Adopts host-local's allocations of one network (the directory that holds
  one file per address, `lock` and `last_reserved_ip.N`) as dynamic claims
  held by their containers, and its cursors."
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
        _ => import_host_local(&opts),
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program} {command}: {}", e.msg);
            ExitCode::from(1)
        }
    })
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
    match &claim.holder {
        None if claim.sticky => (
            "reserved",
            "sticky, no holder: kept for its identity".into(),
        ),
        None => ("free", "no holder".into()),
        Some(h) => match inspector.verdict(h, None) {
            Verdict::Alive(why) => ("held", why),
            Verdict::Dead(why) => ("dead", why),
        },
    }
}

fn claims(opts: &Opts) -> CniResult<()> {
    let backend = opts.backend()?;
    let (inspector, judged_from) = opts.inspector(&backend)?;
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
    ]
    .map(String::from)];
    let mut json = Vec::new();
    for network in opts.networks(&backend)? {
        let mut store = backend.open(&network, vec![])?;
        let listing = store.list()?;
        for c in &listing.claims {
            let h = c.holder.as_ref();
            let (st, reason) = state(c, inspector.as_ref());
            json.push(serde_json::json!({"network": network, "claim": c, "state": st, "reason": reason, "judgedFrom": judged_from}));
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
            ]);
        }
        for d in &listing.damaged {
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
            ]);
            eprintln!(
                "{network}: record {} is damaged: {}",
                d.path.display(),
                d.why
            );
        }
    }
    if opts.flag("--json") {
        println!("{}", serde_json::Value::Array(json));
        return Ok(());
    }
    eprintln!("states judged from {judged_from}");
    let widths: Vec<usize> = (0..9)
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
    let (inspector, _) = opts.inspector(&backend)?;
    let mut store = backend.open(&network, vec![])?;
    let force = opts.flag("--force");
    let (_, released) = with_retries(&mut store, "release", |s| {
        plan_release(s, inspector.as_ref(), &network, &target, force)
    })?;
    for c in &released {
        println!(
            "released {} (identity {:?}) on network {network}",
            c.ip, c.identity
        );
    }
    Ok(())
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
    let retire = backend.is_kube() && !opts.flag("--keep-retired");
    loop {
        let (inspector, _) = opts.inspector(&backend)?;
        let mut released = 0;
        let mut retired = 0;
        let mut alive = 0;
        let mut raced = Vec::new();
        let networks = opts.networks(&backend)?;
        for network in &networks {
            let mut store = backend.open(network, vec![])?;
            let swept = with_retries(&mut store, "reconcile", |s| {
                let (plan, gone, live) = plan_reconcile(s, inspector.as_ref(), now_secs())?;
                Ok((plan, (gone, live)))
            });
            match sweep_outcome(swept, network, "released")? {
                Some((gone, live)) => {
                    released += gone.len();
                    alive += live;
                }
                None => raced.push(network.clone()),
            }
            if retire {
                let swept = with_retries(&mut store, "retire", |s| {
                    let (plan, out) = plan_retire(s, inspector.as_ref())?;
                    Ok((plan, (out, 0)))
                });
                match sweep_outcome(swept, network, "retired")? {
                    Some((out, _)) => retired += out.len(),
                    None => raced.push(network.clone()),
                }
            }
        }
        println!(
            "reconcile: {} networks, {released} dead holders released, {retired} sticky claims of deleted StatefulSets retired, {alive} live holders kept{}",
            networks.len(),
            if raced.is_empty() {
                String::new()
            } else {
                format!(", {} skipped after a concurrent change (next sweep): {}", raced.len(), raced.join(", "))
            }
        );
        match interval {
            None => return Ok(()),
            Some(d) => std::thread::sleep(d),
        }
    }
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

/// host-local's record: "containerID\r\nifname" (older: "containerID").
fn parse_host_local(content: &str) -> Option<(String, String)> {
    let mut lines = content.split(['\r', '\n']).filter(|l| !l.is_empty());
    let container = lines.next()?.trim().to_string();
    let ifname = lines.next().unwrap_or("eth0").trim().to_string();
    (!container.is_empty()).then_some((container, ifname))
}

fn import_host_local(opts: &Opts) -> CniResult<()> {
    let network = opts.network("import-host-local")?;
    let from = opts.values.get("--from").map(PathBuf::from).ok_or_else(|| {
        CniError::invalid_config(
            "import-host-local needs --from DIR/NETWORK (host-local's dataDir and network, e.g. /var/lib/cni/networks/fabric)",
        )
    })?;
    check_host_local_dir(&from, &network)?;
    let entries = std::fs::read_dir(&from)
        .map_err(|e| CniError::io(format!("cannot read {}: {e}", from.display())))?;
    let node = node_facts(opts.node.as_deref());
    let runtime = opts
        .cri_socket()
        .map(|s| crate::cri::CriClient::new(&s, Duration::from_secs(5)));
    let mut in_runtime = 0usize;
    let mut not_in_runtime = Vec::new();
    let mut runtime_error = None;
    let now = now_secs();
    if opts.values.contains_key("--kubeconfig") || opts.flag("--in-cluster") {
        return Err(CniError::invalid_config(
            "import-host-local adopts into the file store (--dir); import into a node's file store first, or let the kubernetes store allocate afresh",
        ));
    }
    let mut store = FileStore::open(&opts.dir, &network)?;
    let mut plan = Plan::default();
    let mut skipped = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(set) = name.strip_prefix("last_reserved_ip.") {
            let cursor = std::fs::read_to_string(entry.path()).ok();
            if let (Ok(set), Some(Ok(ip))) = (
                set.parse::<usize>(),
                cursor.map(|c| c.trim().parse::<IpAddr>()),
            ) {
                plan.cursors.push((set, ip));
            }
            continue;
        }
        let Ok(ip) = name.parse::<IpAddr>() else {
            continue;
        };
        let content = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let Some((container_id, ifname)) = parse_host_local(&content) else {
            skipped.push(format!("{ip}: unreadable host-local record"));
            continue;
        };
        if let Some(existing) = store.claim(ip)? {
            if !existing.held_by(&container_id, &ifname) {
                skipped.push(format!(
                    "{ip}: already claimed by identity {:?}",
                    existing.identity
                ));
            }
            continue;
        }
        // The pod behind the sandbox, from the runtime, so the claim names
        // it; a sandbox the runtime no longer has is freed by liveness.
        let pod = match runtime.as_ref().map(|r| r.sandbox(&container_id)) {
            Some(crate::cri::SandboxState::Present(s)) => {
                in_runtime += 1;
                Some(s)
            }
            Some(crate::cri::SandboxState::Absent) => {
                not_in_runtime.push(ip);
                None
            }
            Some(crate::cri::SandboxState::Unknown(why)) => {
                runtime_error = Some(why);
                None
            }
            None => None,
        };
        let known = |f: fn(&crate::cri::Sandbox) -> &String| {
            pod.as_ref().map(f).filter(|v| !v.is_empty()).cloned()
        };
        plan.changes.push(Change {
            before: None,
            after: Some(Claim {
                ip,
                identity: dynamic_key(&container_id, &ifname),
                sticky: false,
                holder: Some(Holder {
                    container_id,
                    ifname,
                    netns: String::new(),
                    netns_id: None,
                    pod_namespace: known(|s| &s.namespace),
                    pod_name: known(|s| &s.name),
                    pod_uid: known(|s| &s.uid),
                    node: node.node.clone(),
                    boot_id: node.boot_id.clone(),
                    since: now,
                }),
                owner: None,
                namespace: None,
                created: now,
                updated: now,
            }),
        });
    }
    plan.changes.sort_by_key(|c| c.ip());
    store.set_durable(false);
    store.commit(&plan)?;
    store.sync()?;
    println!(
        "imported {} host-local allocations from {} into network {network}",
        plan.changes.len(),
        from.display()
    );
    if let Some(r) = &runtime {
        match &runtime_error {
            Some(why) => println!(
                "{} could not be asked about the sandboxes ({why}): the imported holders stay held until their DEL, or until reconcile can ask it",
                r.describe()
            ),
            None => println!(
                "{} has {in_runtime} of these sandboxes; {} are gone and are freed by the next reconcile or ADD that needs them{}",
                r.describe(),
                not_in_runtime.len(),
                if not_in_runtime.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({})",
                        not_in_runtime.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(", ")
                    )
                }
            ),
        }
    }
    for s in &skipped {
        println!("skipped {s}");
    }
    Ok(())
}

/// Whether a directory entry name is one host-local writes in a network's
/// directory: an address, its lock, or a range set's cursor.
fn is_host_local_entry(name: &str) -> bool {
    name == "lock" || name.starts_with("last_reserved_ip.") || name.parse::<IpAddr>().is_ok()
}

/// `--from` must be one network's host-local directory; its parent (or
/// any other directory) is refused naming the layout, so a wrong path never
/// creates an empty store.
fn check_host_local_dir(from: &std::path::Path, network: &str) -> CniResult<()> {
    let names = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect()
    };
    if !from.is_dir() {
        return Err(CniError::invalid_config(format!(
            "--from {} is not a directory: give host-local's directory of the network, {}/{network} by default",
            from.display(),
            HOST_LOCAL_DEFAULT_DIR
        )));
    }
    if names(from).iter().any(|n| is_host_local_entry(n)) {
        return Ok(());
    }
    let mut networks: Vec<String> = names(from)
        .into_iter()
        .filter(|n| names(&from.join(n)).iter().any(|c| is_host_local_entry(c)))
        .collect();
    networks.sort();
    let layout = "one file per allocated address (named by the address, holding the container ID and ifname), `lock` and `last_reserved_ip.N`";
    Err(CniError::invalid_config(if networks.is_empty() {
        format!(
            "--from {} holds no host-local allocations: host-local keeps {layout} in DATADIR/NETWORK ({}/{network} by default); nothing was imported",
            from.display(),
            HOST_LOCAL_DEFAULT_DIR
        )
    } else {
        format!(
            "--from {} is the parent of host-local's network directories ({}): give the network's own directory, e.g. --from {}, which holds {layout}; nothing was imported",
            from.display(),
            networks.join(", "),
            from.join(networks.iter().find(|n| *n == network).unwrap_or(&networks[0])).display()
        )
    }))
}

/// host-local's default dataDir.
const HOST_LOCAL_DEFAULT_DIR: &str = "/var/lib/cni/networks";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_host_local_network_directory_is_imported() {
        let root = std::env::temp_dir().join(format!("smv-import-{}", std::process::id()));
        let net = root.join("fabric");
        std::fs::create_dir_all(&net).unwrap();
        std::fs::write(net.join("10.0.0.5"), "c1\r\nnet1").unwrap();
        std::fs::write(net.join("lock"), "").unwrap();
        assert!(check_host_local_dir(&net, "fabric").is_ok());
        let e = check_host_local_dir(&root, "fabric").unwrap_err();
        assert!(
            e.msg.contains("parent") && e.msg.contains("--from") && e.msg.contains("fabric"),
            "{}",
            e.msg
        );
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = check_host_local_dir(&empty, "fabric").unwrap_err();
        assert!(
            e.msg.contains("holds no host-local allocations"),
            "{}",
            e.msg
        );
        assert!(check_host_local_dir(&root.join("missing"), "fabric").is_err());
        for (name, host_local) in [
            ("10.0.0.5", true),
            ("fd00::5", true),
            ("lock", true),
            ("last_reserved_ip.0", true),
            ("fabric", false),
            ("README", false),
        ] {
            assert_eq!(is_host_local_entry(name), host_local, "{name}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn host_local_records_both_formats() {
        assert_eq!(
            parse_host_local("abc\r\nnet1"),
            Some(("abc".into(), "net1".into()))
        );
        assert_eq!(parse_host_local("abc"), Some(("abc".into(), "eth0".into())));
        assert_eq!(parse_host_local(""), None);
    }

    #[test]
    fn options_are_checked() {
        let args: Vec<String> = ["--network", "n", "--json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let o = parse_opts(&args).unwrap();
        assert_eq!(o.network.as_deref(), Some("n"));
        assert!(o.flag("--json"));
        assert!(parse_opts(&["--bogus".to_string()]).is_err());
        assert!(parse_opts(&["--ip".to_string()]).is_err());
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(0, 5), "5s");
        assert_eq!(age(0, 600), "10m");
        assert_eq!(age(0, 7200), "2h");
        assert_eq!(age(0, 3 * 86400), "3d");
    }
}
