//! Fixtures shared by the engine's unit tests: scripted liveness, small
//! configs, holders and requests, and the invariants a store can show.

use std::collections::BTreeMap;

use serde_json::json;

use super::{plan_add, plan_del, AddRequest, Grant};
use crate::addr::Family;
use crate::claim::Holder;
use crate::config::IpamConfig;
use crate::identity::{Identity, IdentitySource};
use crate::liveness::{Caller, Inspector, Verdict};
use crate::store::memory::MemoryStore;
use crate::store::ClaimStore;
use cni::{CniError, CniResult};

pub struct Alive(pub Vec<&'static str>);

impl Inspector for Alive {
    fn verdict(&self, h: &Holder, caller: Option<&Caller>) -> Verdict {
        if caller.and_then(|c| c.pod_uid.as_ref()).is_some()
            && caller.and_then(|c| c.pod_uid.as_ref()) == h.pod_uid.as_ref()
        {
            return Verdict::Dead("same pod".into());
        }
        if self.0.contains(&h.container_id.as_str()) {
            Verdict::Alive("its netns still exists".into())
        } else {
            Verdict::Dead("its netns no longer exists".into())
        }
    }
}

pub fn conf(v: serde_json::Value) -> IpamConfig {
    IpamConfig::parse("net", &v).unwrap()
}

pub fn small() -> IpamConfig {
    conf(
        json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.13", "gateway": "10.0.0.1"}),
    )
}

pub fn holder(cid: &str) -> Holder {
    Holder {
        container_id: cid.into(),
        ifname: "net1".into(),
        netns: format!("/run/netns/{cid}"),
        netns_id: None,
        pod_namespace: Some("ns".into()),
        pod_name: Some(cid.into()),
        pod_uid: Some(format!("uid-{cid}")),
        node: "n1".into(),
        boot_id: "b".into(),
        since: 0,
    }
}

pub fn req(id: &str, sticky: bool, cid: &str) -> AddRequest {
    AddRequest {
        identity: Identity {
            key: id.into(),
            sticky,
            source: if sticky {
                IdentitySource::ArgsCni
            } else {
                IdentitySource::Container
            },
            owner: None,
        },
        holder: holder(cid),
        caller: Caller {
            pod_uid: Some(format!("uid-{cid}")),
        },
        requested: vec![],
        now: 100,
    }
}

pub fn add(
    conf: &IpamConfig,
    s: &mut MemoryStore,
    alive: &dyn Inspector,
    r: &AddRequest,
) -> CniResult<Vec<Grant>> {
    let (plan, grants) = plan_add(conf, s, alive, r).map_err(CniError::from)?;
    s.commit(&plan).map_err(CniError::from)?;
    Ok(grants)
}

/// Whether the plugin probes grant `g` of request `r` on the wire before
/// binding it, on a store of `scope` (`probe_policy::needs_wire_check`, without
/// `probe.fresh`).
pub fn probed(g: &Grant, r: &AddRequest, scope: crate::probe_policy::StoreScope) -> bool {
    crate::probe_policy::needs_wire_check(&g.origin, g.unconfirmed, &r.identity, scope, "n1", false)
}

pub fn ips(g: &[Grant]) -> Vec<String> {
    g.iter().map(|g| g.ip.to_string()).collect()
}

pub fn del(s: &mut MemoryStore, cid: &str) {
    let plan = plan_del(s, cid, "net1", 200).unwrap();
    s.commit(&plan).unwrap();
}

/// The invariants I1-I5 (ARCHITECTURE.md) that a store can show.
pub fn assert_invariants(s: &MemoryStore) {
    let mut per_identity: BTreeMap<(&str, Family), usize> = BTreeMap::new();
    for c in s.claims.values() {
        *per_identity
            .entry((&c.identity, Family::of(c.ip)))
            .or_default() += 1;
        assert!(
            c.sticky || c.holder.is_some() || c.is_tombstone(),
            "dynamic claim without holder or mark: {c:?}"
        );
    }
    assert!(per_identity.values().all(|n| *n == 1), "{per_identity:?}");
}
