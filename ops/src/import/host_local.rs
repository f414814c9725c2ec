//! `import-host-local`: adopting a node's host-local allocations, with
//! the container runtime's word on each sandbox, into either store. On
//! the kubernetes store a cluster switches node by node with its pods
//! running: Multus sends an old pod's DEL to the delegates it cached at
//! the pod's ADD (host-local), never to us, so the imported claims name
//! the pod and are freed by liveness once it is gone.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use cni::{CniError, CniResult};

use super::adoption::{commit_adoption, plan_adoption, store_name, Adoptee};
use crate::options::Opts;
use sticky_ipam::claim::now_secs;
use sticky_ipam::cri::SandboxRuntime;
use sticky_ipam::system::node_facts;

/// host-local's record: "containerID\r\nifname" (older: "containerID").
pub(crate) fn parse_host_local(content: &str) -> Option<(String, String)> {
    let mut lines = content.split(['\r', '\n']).filter(|l| !l.is_empty());
    let container = lines.next()?.trim().to_string();
    let ifname = lines.next().unwrap_or("eth0").trim().to_string();
    (!container.is_empty()).then_some((container, ifname))
}

pub fn run(opts: &Opts) -> CniResult<()> {
    let network = opts.network("import-host-local")?;
    let from = opts.values.get("--from").map(PathBuf::from).ok_or_else(|| {
        CniError::invalid_config(
            "import-host-local needs --from DIR/NETWORK (host-local's dataDir and network, e.g. /var/lib/cni/networks/fabric)",
        )
    })?;
    check_host_local_dir(&from, &network)?;
    let entries = std::fs::read_dir(&from)
        .map_err(|e| CniError::io(format!("cannot read {}: {e}", from.display())))?;
    let backend = opts.backend()?;
    if backend.is_kube() && opts.node.is_none() {
        return Err(CniError::invalid_config(
            "import-host-local into the kubernetes store needs --node NAME: the Kubernetes node whose host-local files these are (run it on that node)",
        ));
    }
    let node = node_facts(opts.node.as_deref());
    let runtime = opts
        .cri_socket()
        .map(|s| sticky_ipam::cri::CriClient::new(&s, Duration::from_secs(5)));
    let mut in_runtime = 0usize;
    let mut not_in_runtime = Vec::new();
    let mut runtime_error = None;
    let mut cursors = Vec::new();
    let mut skipped = Vec::new();
    let mut list = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(set) = name.strip_prefix("last_reserved_ip.") {
            let cursor = std::fs::read_to_string(entry.path()).ok();
            if let (Ok(set), Some(Ok(ip))) = (
                set.parse::<usize>(),
                cursor.map(|c| c.trim().parse::<IpAddr>()),
            ) {
                cursors.push((set, ip));
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
        // The pod behind the sandbox, from the runtime, so the claim names
        // it; a sandbox the runtime no longer has is freed by liveness.
        let pod = match runtime.as_ref().map(|r| r.sandbox(&container_id)) {
            Some(sticky_ipam::cri::SandboxState::Present(s)) => {
                in_runtime += 1;
                Some(s)
            }
            Some(sticky_ipam::cri::SandboxState::Absent) => {
                not_in_runtime.push(ip);
                None
            }
            Some(sticky_ipam::cri::SandboxState::Unknown(why)) => {
                runtime_error = Some(why);
                None
            }
            None => None,
        };
        let known = |f: fn(&sticky_ipam::cri::Sandbox) -> &String| {
            pod.as_ref().map(f).filter(|v| !v.is_empty()).cloned()
        };
        list.push(Adoptee {
            ip,
            container_id,
            ifname,
            pod_namespace: known(|s| &s.namespace),
            pod_name: known(|s| &s.name),
            pod_uid: known(|s| &s.uid),
            node: node.node.clone(),
            boot_id: node.boot_id.clone(),
        });
    }
    let mut store = backend.open(&network, vec![])?;
    let mut adoption = plan_adoption(&mut store, list, now_secs())?;
    adoption.plan.cursors = cursors;
    let outcome = commit_adoption(
        &mut store,
        &adoption,
        &network,
        &format!("host-local allocations from {}", from.display()),
        &store_name(&backend, opts.node.as_deref()),
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
    outcome
}

/// Whether a directory entry name is one host-local writes in a network's
/// directory: an address, its lock, or a range set's cursor.
pub(crate) fn is_host_local_entry(name: &str) -> bool {
    name == "lock" || name.starts_with("last_reserved_ip.") || name.parse::<IpAddr>().is_ok()
}

/// `--from` must be one network's host-local directory; its parent (or
/// any other directory) is refused naming the layout, so a wrong path never
/// creates an empty store.
pub(crate) fn check_host_local_dir(from: &std::path::Path, network: &str) -> CniResult<()> {
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
