//! Claims as `IPClaim` objects in the Kubernetes API (README, "The
//! kubernetes store"). No lock and no pool object: every write carries a precondition
//! (create-if-absent, or the resourceVersion read), so a plan built on
//! stale reads fails with `StoreError::Conflict` and is planned again.
//!
//! I2 (one address per identity and family) spans objects, which
//! the API cannot lock together. It is kept by create-then-verify: after
//! creating a claim for an identity, the identity's claims are listed (a
//! quorum read); if there is more than one per family, this ADD removes
//! its own and retries. Of two racing ADDs the later lister always sees
//! both, so at most one keeps its claim.
//!
//! Reads are per identity, per holder or per address (label selectors and
//! GET by name); only exhaustion, GC and reconcile list a network's pool.
//! Next-fit candidates are not read first: the create is the check, and a
//! collision loads the network's taken addresses once for the retry (paged,
//! addresses only: memory stays flat however many claims there are).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;

use super::file::FileStore;
use super::{Change, ClaimStore, Damaged, Listing, Plan, StoreError, StoreResult};
use crate::addr::Family;
use crate::claim::Claim;
use crate::kube::{
    holder_selector, identity_selector, network_selector, object_name, ClaimObject, KubeApi,
};

pub struct KubeStore<'a> {
    api: &'a dyn KubeApi,
    network: String,
    /// resourceVersion of each claim as last read or written.
    versions: BTreeMap<IpAddr, String>,
    /// The pool, once something needed it (exhaustion, a collision).
    pool: Option<BTreeMap<IpAddr, Claim>>,
    /// The network's taken addresses, loaded after a lost race.
    taken: Option<BTreeSet<IpAddr>>,
    /// Node-local record and next-fit cursors (no API request).
    local: Option<FileStore>,
    /// Where next-fit starts on this node before it has a cursor, so
    /// nodes do not all race for the same first address.
    first_cursors: Vec<Option<IpAddr>>,
}

impl<'a> KubeStore<'a> {
    pub fn new(
        api: &'a dyn KubeApi,
        network: &str,
        local: Option<FileStore>,
        first_cursors: Vec<Option<IpAddr>>,
    ) -> KubeStore<'a> {
        KubeStore {
            api,
            network: network.to_string(),
            versions: BTreeMap::new(),
            pool: None,
            taken: None,
            local,
            first_cursors,
        }
    }

    pub fn into_local(self) -> Option<FileStore> {
        self.local
    }

    fn remember(&mut self, objs: Vec<ClaimObject>) -> Vec<Claim> {
        objs.into_iter()
            .filter(|o| o.network == self.network)
            .map(|o| {
                if let Some(rv) = o.resource_version {
                    self.versions.insert(o.claim.ip, rv);
                }
                o.claim
            })
            .collect()
    }

    fn object(&self, claim: &Claim) -> ClaimObject {
        ClaimObject {
            network: self.network.clone(),
            claim: claim.clone(),
            resource_version: self.versions.get(&claim.ip).cloned(),
        }
    }

    fn version_of(&self, ip: IpAddr) -> StoreResult<String> {
        self.versions.get(&ip).cloned().ok_or_else(|| {
            StoreError::Conflict(format!("no resourceVersion read for {ip}: planning again"))
        })
    }

    fn apply(&mut self, change: &Change) -> StoreResult<()> {
        let written = match (&change.before, &change.after) {
            (None, Some(after)) => self.api.create_claim(&self.object(after)),
            (Some(before), Some(after)) if before.ip == after.ip => {
                let mut obj = self.object(after);
                obj.resource_version = Some(self.version_of(before.ip)?);
                self.api.replace_claim(&obj)
            }
            (Some(before), after) => {
                let rv = self.version_of(before.ip)?;
                self.api
                    .delete_claim(&object_name(&self.network, before.ip), &rv)
                    .map_err(StoreError::from)?;
                self.versions.remove(&before.ip);
                return match after {
                    Some(after) => self.apply(&Change {
                        before: None,
                        after: Some(after.clone()),
                    }),
                    None => Ok(()),
                };
            }
            (None, None) => return Ok(()),
        };
        let obj = written.map_err(StoreError::from)?;
        if let Some(rv) = obj.resource_version {
            self.versions.insert(obj.claim.ip, rv);
        }
        Ok(())
    }

    /// Best effort: puts back what this commit wrote before it lost a race.
    fn roll_back(&mut self, applied: &[Change]) {
        for change in applied.iter().rev() {
            if let Err(e) = self.apply(&change.inverse()) {
                cni::log::warn(&format!(
                    "could not roll back the claim on {}: {}; a later ADD, DEL or reconcile settles it by liveness",
                    change.ip().map(|ip| ip.to_string()).unwrap_or_default(),
                    e
                ));
            }
        }
    }

    /// Identities that gained an address in `plan` (create-then-verify).
    fn gained(plan: &Plan) -> BTreeSet<(String, Family)> {
        plan.changes
            .iter()
            .filter_map(|c| {
                let after = c.after.as_ref()?;
                let same = c
                    .before
                    .as_ref()
                    .is_some_and(|b| b.identity == after.identity && b.ip == after.ip);
                (!same).then(|| (after.identity.clone(), Family::of(after.ip)))
            })
            .collect()
    }

    fn verify_single(&mut self, plan: &Plan) -> StoreResult<()> {
        let identities: BTreeSet<String> =
            Self::gained(plan).into_iter().map(|(id, _)| id).collect();
        for identity in identities {
            let objs = self
                .api
                .list_claims(&identity_selector(&self.network, &identity))
                .map_err(StoreError::from)?;
            let mut per_family: BTreeMap<Family, Vec<IpAddr>> = BTreeMap::new();
            for o in objs
                .iter()
                .filter(|o| o.network == self.network && o.claim.identity == identity)
            {
                per_family
                    .entry(Family::of(o.claim.ip))
                    .or_default()
                    .push(o.claim.ip);
            }
            if let Some(ips) = per_family.values().find(|ips| ips.len() > 1) {
                return Err(StoreError::Conflict(format!(
                    "identity {identity:?} was given {} at once by concurrent ADDs",
                    ips.iter()
                        .map(|ip| ip.to_string())
                        .collect::<Vec<_>>()
                        .join(" and ")
                )));
            }
        }
        Ok(())
    }

    /// Mirrors what the API now says into the node-local record, for
    /// degraded mode; best effort, the API is the truth.
    fn mirror(&mut self, plan: &Plan) {
        let Some(local) = self.local.as_mut() else {
            return;
        };
        let mut changes = Vec::new();
        for c in &plan.changes {
            for ip in [c.before.as_ref(), c.after.as_ref()]
                .into_iter()
                .flatten()
                .map(|x| x.ip)
                .collect::<BTreeSet<_>>()
            {
                let after = c.after.as_ref().filter(|a| a.ip == ip).cloned();
                match local.claim(ip) {
                    Ok(before) if before != after => changes.push(Change { before, after }),
                    Ok(_) => {}
                    // A damaged local record is replaced by the API's truth.
                    Err(_) => {
                        let _ = local.remove_record(&super::file::claim_file_name(ip));
                        changes.push(Change {
                            before: None,
                            after,
                        });
                    }
                }
            }
        }
        let local_plan = Plan {
            changes,
            cursors: plan.cursors.clone(),
        };
        if let Err(e) = local.commit(&local_plan) {
            cni::log::warn(&format!(
                "node-local record of network {:?} not updated: {e}",
                self.network
            ));
        }
    }
}

impl ClaimStore for KubeStore<'_> {
    fn claim(&mut self, ip: IpAddr) -> StoreResult<Option<Claim>> {
        if let Some(pool) = &self.pool {
            return Ok(pool.get(&ip).cloned());
        }
        let got = self
            .api
            .get_claim(&object_name(&self.network, ip))
            .map_err(StoreError::from)?;
        Ok(self.remember(got.into_iter().collect()).pop())
    }

    fn candidate_taken(&mut self, ip: IpAddr) -> StoreResult<bool> {
        Ok(match (&self.taken, &self.pool) {
            (Some(taken), _) => taken.contains(&ip),
            (None, Some(pool)) => pool.contains_key(&ip),
            (None, None) => false,
        })
    }

    fn claims_of_identity(&mut self, identity: &str) -> StoreResult<Vec<Claim>> {
        let objs = self
            .api
            .list_claims(&identity_selector(&self.network, identity))
            .map_err(StoreError::from)?;
        let mut claims = self.remember(objs);
        claims.retain(|c| c.identity == identity);
        Ok(claims)
    }

    fn claims_of_holder(&mut self, container_id: &str, ifname: &str) -> StoreResult<Vec<Claim>> {
        let objs = self
            .api
            .list_claims(&holder_selector(&self.network, container_id, ifname))
            .map_err(StoreError::from)?;
        let mut claims = self.remember(objs);
        claims.retain(|c| c.held_by(container_id, ifname));
        Ok(claims)
    }

    fn list(&mut self) -> StoreResult<Listing> {
        let objs = self
            .api
            .list_claims(&network_selector(&self.network))
            .map_err(StoreError::from)?;
        let claims = self.remember(objs);
        self.pool = Some(claims.iter().map(|c| (c.ip, c.clone())).collect());
        self.taken = None;
        Ok(Listing {
            claims,
            damaged: Vec::<Damaged>::new(),
        })
    }

    fn cursor(&mut self, set: usize) -> StoreResult<Option<IpAddr>> {
        let local = match self.local.as_mut() {
            Some(local) => local.cursor(set).unwrap_or(None),
            None => None,
        };
        Ok(local.or_else(|| self.first_cursors.get(set).copied().flatten()))
    }

    fn commit(&mut self, plan: &Plan) -> StoreResult<()> {
        let mut applied = Vec::new();
        for change in &plan.changes {
            if let Err(e) = self.apply(change) {
                self.roll_back(&applied);
                return Err(e);
            }
            applied.push(change.clone());
        }
        if plan.changes.iter().any(|c| c.before.is_none()) {
            cni::fault::point(cni::fault::ADD_IDENTITY_RECORDED);
        }
        if let Err(e) = self.verify_single(plan) {
            self.roll_back(&applied);
            return Err(e);
        }
        self.mirror(plan);
        Ok(())
    }

    /// After a lost race, next-fit needs to know which addresses are
    /// taken, not the claims: a paged listing of the addresses alone keeps
    /// this path's memory flat at 60,000 claims. Claims the replan reads
    /// are fetched afresh.
    fn conflicted(&mut self) -> StoreResult<()> {
        self.versions.clear();
        self.pool = None;
        let taken = self
            .api
            .taken_addresses(&network_selector(&self.network))
            .map_err(StoreError::from)?;
        self.taken = Some(taken);
        Ok(())
    }
}

/// Where this node's next-fit starts in a range set of `size` addresses
/// beginning at `first`: spread by the node name's hash.
pub fn node_offset(node: &str, size: u128) -> u128 {
    use sha2::{Digest, Sha256};
    if size == 0 {
        return 0;
    }
    let d = Sha256::digest(node.as_bytes());
    let mut n = [0u8; 16];
    n.copy_from_slice(&d[..16]);
    u128::from_be_bytes(n) % size
}

/// The node-local record's directory for the kube store.
pub fn local_dir(store_dir: &std::path::Path) -> PathBuf {
    store_dir.join("kubernetes-local")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::Holder;
    use crate::config::IpamConfig;
    use crate::engine::{plan_add, plan_del, AddRequest};
    use crate::identity::{Identity, IdentitySource};
    use crate::kube::fake::FakeApi;
    use crate::kube::liveness::KubeInspector;
    use crate::liveness::{Caller, NodeFacts};
    use crate::pod::PodFacts;
    use serde_json::json;

    fn conf() -> IpamConfig {
        IpamConfig::parse(
            "macnet",
            &json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.19"}),
        )
        .unwrap()
    }

    fn req(identity: &str, sticky: bool, pod: &str, node: &str) -> AddRequest {
        AddRequest {
            identity: Identity {
                key: identity.into(),
                sticky,
                source: IdentitySource::ArgsCni,
                owner: None,
            },
            holder: Holder {
                container_id: format!("c-{pod}"),
                ifname: "net1".into(),
                netns: String::new(),
                netns_id: None,
                pod_namespace: Some("ns".into()),
                pod_name: Some(pod.into()),
                pod_uid: Some(format!("uid-{pod}")),
                node: node.into(),
                boot_id: "b".into(),
                since: 1,
            },
            caller: Caller {
                pod_uid: Some(format!("uid-{pod}")),
            },
            requested: vec![],
            now: 1,
        }
    }

    fn running(api: &FakeApi, pod: &str, node: &str) {
        api.pods.borrow_mut().insert(
            format!("ns/{pod}"),
            PodFacts {
                uid: format!("uid-{pod}"),
                node: Some(node.into()),
                phase: Some("Running".into()),
                ..PodFacts::default()
            },
        );
    }

    fn node(name: &str) -> NodeFacts {
        NodeFacts {
            node: name.into(),
            boot_id: "b".into(),
        }
    }

    /// ADD as cni_ipam does it, without the retry loop.
    fn add_once(api: &FakeApi, r: &AddRequest) -> crate::store::PlanResult<Vec<IpAddr>> {
        let mut store = KubeStore::new(api, "macnet", None, vec![None]);
        let inspector = KubeInspector::new(api, node(&r.holder.node));
        let (plan, grants) = plan_add(&conf(), &mut store, &inspector, r)?;
        store.commit(&plan)?;
        Ok(grants.iter().map(|g| g.ip).collect())
    }

    fn per_identity(api: &FakeApi) -> BTreeMap<String, usize> {
        let mut n = BTreeMap::new();
        for o in api.claims.borrow().values() {
            *n.entry(o.claim.identity.clone()).or_default() += 1;
        }
        n
    }

    #[test]
    fn request_counts_on_the_common_paths() {
        let api = FakeApi::default();
        running(&api, "rs0-0", "n1");
        let first = add_once(&api, &req("peer-a", true, "rs0-0", "n1")).unwrap();
        // list by identity, create, list to verify
        assert_eq!(api.calls.borrow().len(), 3, "{:?}", api.calls.borrow());
        api.calls.borrow_mut().clear();
        // Same pod, new sandbox: list by identity, replace the holder.
        let mut again = req("peer-a", true, "rs0-0", "n1");
        again.holder.container_id = "c-new".into();
        assert_eq!(add_once(&api, &again).unwrap(), first);
        assert_eq!(api.calls.borrow().len(), 2, "{:?}", api.calls.borrow());
        api.calls.borrow_mut().clear();
        // DEL: list by holder, replace (sticky: reserved).
        let mut store = KubeStore::new(&api, "macnet", None, vec![None]);
        let plan = plan_del(&mut store, "c-new", "net1", 2).unwrap();
        store.commit(&plan).unwrap();
        assert_eq!(api.calls.borrow().len(), 2, "{:?}", api.calls.borrow());
        let stored = api.claims.borrow().values().next().cloned().unwrap();
        assert!(stored.claim.holder.is_none() && stored.claim.sticky);
    }

    #[test]
    fn concurrent_adds_of_one_identity_leave_one_claim() {
        let api = FakeApi::default();
        running(&api, "a", "n1");
        running(&api, "b", "n2");
        let ra = req("shared", true, "a", "n1");
        let rb = req("shared", true, "b", "n2");
        // n1 plans on an empty store, then n2 completes first.
        let mut store_a = KubeStore::new(
            &api,
            "macnet",
            None,
            vec![Some("10.0.0.14".parse().unwrap())],
        );
        let insp_a = KubeInspector::new(&api, node("n1"));
        let (plan_a, _) = plan_add(&conf(), &mut store_a, &insp_a, &ra).unwrap();
        let got_b = add_once(&api, &rb).unwrap();
        let e = store_a.commit(&plan_a).unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
        assert_eq!(per_identity(&api)["shared"], 1);
        assert_eq!(
            api.claims.borrow().values().next().unwrap().claim.ip,
            got_b[0]
        );
        // Planned again, n1 finds the identity held by a running pod: 11.
        store_a.conflicted().unwrap();
        let e = cni::CniError::from(plan_add(&conf(), &mut store_a, &insp_a, &ra).unwrap_err());
        assert_eq!(e.code, cni::code::TRY_AGAIN_LATER);
        assert!(e.msg.contains("ns/b") && e.msg.contains("n2"), "{}", e.msg);
    }

    #[test]
    fn a_lost_race_mid_plan_is_rolled_back() {
        let api = FakeApi::default();
        let conf = IpamConfig::parse(
            "macnet",
            &json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/120"}]]}),
        )
        .unwrap();
        let r = req("dual", true, "p", "n1");
        let mut store = KubeStore::new(&api, "macnet", None, vec![None, None]);
        let insp = KubeInspector::new(&api, node("n1"));
        let (plan, _) = plan_add(&conf, &mut store, &insp, &r).unwrap();
        assert_eq!(plan.changes.len(), 2);
        // The v6 address is taken between planning and commit.
        let v6 = plan.changes[1].after.clone().unwrap();
        let mut other = v6.clone();
        other.identity = "someone-else".into();
        api.create_claim(&ClaimObject {
            network: "macnet".into(),
            claim: other,
            resource_version: None,
        })
        .unwrap();
        let e = store.commit(&plan).unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
        // The v4 claim it had created is gone again: nothing half-done.
        assert_eq!(api.claims.borrow().len(), 1);
        assert_eq!(per_identity(&api).get("dual"), None);
    }

    #[test]
    fn injected_conflicts_keep_the_invariants() {
        let api = FakeApi::default();
        for i in 0..10 {
            api.inject_conflicts.set(i % 3);
            let r = req(&format!("id-{i}"), false, &format!("p{i}"), "n1");
            let mut done = None;
            let mut store = KubeStore::new(&api, "macnet", None, vec![None]);
            for _ in 0..5 {
                let insp = KubeInspector::new(&api, node("n1"));
                match plan_add(&conf(), &mut store, &insp, &r).and_then(|(p, g)| {
                    store.commit(&p)?;
                    Ok(g)
                }) {
                    Ok(g) => {
                        done = Some(g);
                        break;
                    }
                    Err(crate::store::PlanError::Store(StoreError::Conflict(_))) => {
                        store.conflicted().unwrap()
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            assert!(done.is_some(), "ADD {i} never committed");
        }
        let claims = api.claims.borrow();
        assert_eq!(claims.len(), 10);
        assert!(per_identity(&api).values().all(|n| *n == 1));
    }

    #[test]
    fn node_offsets_spread() {
        let a = node_offset("node1", 250);
        let b = node_offset("node2", 250);
        assert!(a < 250 && b < 250 && a != b);
        assert_eq!(node_offset("x", 0), 0);
    }
}
