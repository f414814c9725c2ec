//! What both importers share: an allocation of the system adopted from,
//! planned against the store so that a rerun adopts nothing twice and an
//! address claimed by anyone else is a conflict, then written.

use cni::{CniError, CniResult};
use std::net::IpAddr;
use sticky_ipam::backend::{Backend, Store};
use sticky_ipam::claim::{Claim, Holder};
use sticky_ipam::identity::dynamic_key;
use sticky_ipam::store::{Change, ClaimStore, Plan};

/// One allocation of the system we adopt from, as a claim's holder.
pub(super) struct Adoptee {
    pub(super) ip: IpAddr,
    pub(super) container_id: String,
    pub(super) ifname: String,
    pub(super) pod_namespace: Option<String>,
    pub(super) pod_name: Option<String>,
    pub(super) pod_uid: Option<String>,
    pub(super) node: String,
    /// Empty when unknown (Whereabouts records no node): such a holder is
    /// never judged by its netns, only by its pod.
    pub(super) boot_id: String,
}

impl Adoptee {
    /// A dynamic claim held by the allocation's container, as the plugin's
    /// own ADD would have made it.
    pub(super) fn claim(self, now: u64) -> Claim {
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
pub(super) struct Adoption {
    pub(super) plan: Plan,
    pub(super) already: usize,
    pub(super) conflicts: Vec<String>,
}

/// Plans the claims of `list` that the store lacks: rerunning adopts
/// nothing twice, and an address claimed by anyone else is a conflict.
pub(super) fn plan_adoption(
    store: &mut dyn ClaimStore,
    list: Vec<Adoptee>,
    now: u64,
) -> CniResult<Adoption> {
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
pub(super) fn commit_adoption(
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

pub(super) fn store_name(backend: &Backend, node: Option<&str>) -> String {
    match (backend, node) {
        (Backend::File { .. }, _) => "the file store".into(),
        (Backend::Kube { .. }, Some(node)) => format!("the kubernetes store, node {node}"),
        (Backend::Kube { .. }, None) => "the kubernetes store".into(),
    }
}
