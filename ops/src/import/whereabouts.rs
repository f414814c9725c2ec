//! `import-whereabouts`: a Whereabouts range's allocations, of pods that
//! still exist, as claims naming those pods (and their nodes, from the
//! API); freed by liveness once the pods are gone, since Multus sends their
//! DELs to Whereabouts.

use std::net::IpAddr;

use cni::{CniError, CniResult};

use super::adoption::{commit_adoption, plan_adoption, store_name, Adoptee};
use crate::admin::AdminApi;
use crate::options::Opts;
use sticky_ipam::backend::Backend;
use sticky_ipam::claim::now_secs;
use sticky_ipam::kube::KubeApi;

/// One address of a Whereabouts IPPool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WhereaboutsAllocation {
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
pub(crate) fn whereabouts_allocations(
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
        let base = sticky_ipam::addr::to_u128(range.network());
        for (offset, a) in allocations {
            let ip = offset
                .parse::<u128>()
                .ok()
                .and_then(|o| base.checked_add(o))
                .map(|n| {
                    sticky_ipam::addr::from_u128(sticky_ipam::addr::Family::of(range.network()), n)
                })
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
pub fn run(opts: &Opts) -> CniResult<()> {
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
        .map_err(sticky_ipam::store::StoreError::from)?;
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
            .map_err(sticky_ipam::store::StoreError::from)?
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
