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

use super::Opts;
use crate::backend::{Backend, Store};
use crate::claim::{now_secs, Claim, Holder};
use crate::cri::SandboxRuntime;
use crate::identity::dynamic_key;
use crate::kube::KubeApi;
use crate::store::{Change, ClaimStore, Plan};

use crate::system::node_facts;

/// host-local's record: "containerID\r\nifname" (older: "containerID").
pub(super) fn parse_host_local(content: &str) -> Option<(String, String)> {
    let mut lines = content.split(['\r', '\n']).filter(|l| !l.is_empty());
    let container = lines.next()?.trim().to_string();
    let ifname = lines.next().unwrap_or("eth0").trim().to_string();
    (!container.is_empty()).then_some((container, ifname))
}

/// One allocation of the system we adopt from, as a claim's holder.
struct Adoptee {
    ip: IpAddr,
    container_id: String,
    ifname: String,
    pod_namespace: Option<String>,
    pod_name: Option<String>,
    pod_uid: Option<String>,
    node: String,
    /// Empty when unknown (Whereabouts records no node): such a holder is
    /// never judged by its netns, only by its pod.
    boot_id: String,
}

impl Adoptee {
    /// A dynamic claim held by the allocation's container, as the plugin's
    /// own ADD would have made it.
    fn claim(self, now: u64) -> Claim {
        Claim {
            ip: self.ip,
            identity: dynamic_key(&self.container_id, &self.ifname),
            sticky: false,
            owner: None,
            namespace: self.pod_namespace.clone(),
            holder: Some(Holder {
                container_id: self.container_id,
                ifname: self.ifname,
                netns: String::new(),
                netns_id: None,
                pod_namespace: self.pod_namespace,
                pod_name: self.pod_name,
                pod_uid: self.pod_uid,
                node: self.node,
                boot_id: self.boot_id,
                since: now,
            }),
            created: now,
            updated: now,
            unconfirmed: None,
        }
    }
}

/// What an import adds, what an earlier run already added, and the
/// addresses another holder has.
#[derive(Default)]
struct Adoption {
    plan: Plan,
    already: usize,
    conflicts: Vec<String>,
}

/// Plans the claims of `list` that the store lacks: rerunning adopts
/// nothing twice, and an address claimed by anyone else is a conflict.
fn plan_adoption(store: &mut dyn ClaimStore, list: Vec<Adoptee>, now: u64) -> CniResult<Adoption> {
    let mut out = Adoption::default();
    for a in list {
        if let Some(existing) = store.claim(a.ip)? {
            if existing.held_by(&a.container_id, &a.ifname) {
                out.already += 1;
            } else {
                let holder = existing
                    .holder
                    .as_ref()
                    .map(Holder::describe)
                    .unwrap_or_else(|| "no holder (reserved)".into());
                out.conflicts.push(format!(
                    "{}: given to container {}/{}, but claimed by identity {:?}, held by {holder}",
                    a.ip, a.container_id, a.ifname, existing.identity
                ));
            }
            continue;
        }
        out.plan.changes.push(Change {
            before: None,
            after: Some(a.claim(now)),
        });
    }
    out.plan.changes.sort_by_key(|c| c.ip());
    Ok(out)
}

/// Writes the adoption, says what it did, and fails (after writing the
/// rest) when any address conflicted.
fn commit_adoption(
    store: &mut Store<'_>,
    adoption: &Adoption,
    network: &str,
    what: &str,
    into: &str,
) -> CniResult<()> {
    store.set_durable(false);
    store.commit(&adoption.plan)?;
    if let Store::File(s) = store {
        s.sync()?;
    }
    println!(
        "imported {} {what} into network {network} ({into}); {} were imported before",
        adoption.plan.changes.len(),
        adoption.already
    );
    if adoption.conflicts.is_empty() {
        return Ok(());
    }
    for c in &adoption.conflicts {
        eprintln!("conflict: {c}");
    }
    Err(CniError::new(
        cni::code::INVALID_CONFIG,
        format!(
            "{} allocations of network {network} conflict with claims of other holders (listed above) and the rest were imported: keep these pods on their old IPAM until they are gone, or release the other claim if its holder is (`release --ip`), then rerun",
            adoption.conflicts.len()
        ),
    ))
}

fn store_name(backend: &Backend, node: Option<&str>) -> String {
    match (backend, node) {
        (Backend::File { .. }, _) => "the file store".into(),
        (Backend::Kube { .. }, Some(node)) => format!("the kubernetes store, node {node}"),
        (Backend::Kube { .. }, None) => "the kubernetes store".into(),
    }
}

pub(super) fn import_host_local(opts: &Opts) -> CniResult<()> {
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
        .map(|s| crate::cri::CriClient::new(&s, Duration::from_secs(5)));
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

/// One address of a Whereabouts IPPool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WhereaboutsAllocation {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: String,
    /// "namespace/name".
    pub podref: String,
}

/// The allocations of the Whereabouts IPPools (v0.9's
/// `whereabouts.cni.cncf.io/v1alpha1`, as JSON) whose range is `range`:
/// each key of `spec.allocations` is an offset from the range's network
/// address. An allocation without `ifname` (older Whereabouts) is taken as
/// `default_ifname`.
pub(super) fn whereabouts_allocations(
    pools: &[serde_json::Value],
    range: &ipnet::IpNet,
    default_ifname: &str,
) -> Result<Vec<WhereaboutsAllocation>, String> {
    let mut out = Vec::new();
    for pool in pools {
        let name = pool["metadata"]["name"].as_str().unwrap_or("?");
        let Some(Ok(pool_range)) = pool["spec"]["range"]
            .as_str()
            .map(str::parse::<ipnet::IpNet>)
        else {
            return Err(format!("IPPool {name} has no valid spec.range"));
        };
        if pool_range.trunc() != range.trunc() {
            continue;
        }
        let Some(allocations) = pool["spec"]["allocations"].as_object() else {
            continue;
        };
        let base = crate::addr::to_u128(range.network());
        for (offset, a) in allocations {
            let ip = offset
                .parse::<u128>()
                .ok()
                .and_then(|o| base.checked_add(o))
                .map(|n| crate::addr::from_u128(crate::addr::Family::of(range.network()), n))
                .filter(|ip| range.contains(ip))
                .ok_or_else(|| {
                    format!(
                        "IPPool {name}: allocation key {offset:?} is not an offset inside {range}"
                    )
                })?;
            let field = |k: &str| a[k].as_str().filter(|v| !v.is_empty()).map(str::to_string);
            let (Some(container_id), Some(podref)) = (field("id"), field("podref")) else {
                return Err(format!(
                    "IPPool {name}: allocation {offset} lacks id or podref"
                ));
            };
            out.push(WhereaboutsAllocation {
                ip,
                container_id,
                ifname: field("ifname").unwrap_or_else(|| default_ifname.to_string()),
                podref,
            });
        }
    }
    out.sort_by_key(|a| a.ip);
    Ok(out)
}

/// `import-whereabouts`: a Whereabouts range's allocations, of pods that
/// still exist, as claims naming those pods (and their nodes, from the
/// API); freed by liveness once the pods are gone, since Multus sends their
/// DELs to Whereabouts.
pub(super) fn import_whereabouts(opts: &Opts) -> CniResult<()> {
    let network = opts.network("import-whereabouts")?;
    let range: ipnet::IpNet = opts
        .values
        .get("--range")
        .ok_or_else(|| {
            CniError::invalid_config(
                "import-whereabouts needs --range CIDR: the Whereabouts range whose IPPool to adopt (its NAD's \"range\")",
            )
        })?
        .parse()
        .map_err(|e| CniError::invalid_config(format!("--range: {e}: give a CIDR such as 172.31.66.0/24")))?;
    let backend = opts.backend()?;
    let Backend::Kube { .. } = &backend else {
        return Err(CniError::invalid_config(
            "import-whereabouts adopts into the kubernetes store: pass --kubeconfig PATH or --in-cluster",
        ));
    };
    let client = backend.client()?;
    let pools = client
        .list_whereabouts_pools()
        .map_err(crate::store::StoreError::from)?;
    let allocations =
        whereabouts_allocations(&pools, &range, "net1").map_err(CniError::invalid_config)?;
    let mut list = Vec::new();
    let mut gone = Vec::new();
    for a in allocations {
        let (ns, name) = a
            .podref
            .split_once('/')
            .unwrap_or(("default", a.podref.as_str()));
        match client
            .get_pod(ns, name)
            .map_err(crate::store::StoreError::from)?
        {
            Some(pod) => list.push(Adoptee {
                ip: a.ip,
                container_id: a.container_id,
                ifname: a.ifname,
                pod_namespace: Some(ns.to_string()),
                pod_name: Some(name.to_string()),
                pod_uid: Some(pod.uid).filter(|u| !u.is_empty()),
                node: pod.node.unwrap_or_default(),
                boot_id: String::new(),
            }),
            None => gone.push(format!("{} ({})", a.ip, a.podref)),
        }
    }
    let mut store = backend.open(&network, vec![])?;
    let adoption = plan_adoption(&mut store, list, now_secs())?;
    let outcome = commit_adoption(
        &mut store,
        &adoption,
        &network,
        &format!("Whereabouts allocations of {range}"),
        &store_name(&backend, None),
    );
    if !gone.is_empty() {
        println!(
            "not imported, their pods are gone (the addresses are free here; release them in Whereabouts too if it stays in use): {}",
            gone.join(", ")
        );
    }
    outcome
}

/// Whether a directory entry name is one host-local writes in a network's
/// directory: an address, its lock, or a range set's cursor.
pub(super) fn is_host_local_entry(name: &str) -> bool {
    name == "lock" || name.starts_with("last_reserved_ip.") || name.parse::<IpAddr>().is_ok()
}

/// `--from` must be one network's host-local directory; its parent (or
/// any other directory) is refused naming the layout, so a wrong path never
/// creates an empty store.
pub(super) fn check_host_local_dir(from: &std::path::Path, network: &str) -> CniResult<()> {
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
