//! A recording in-memory `KubeApi` for unit tests: the API semantics the
//! store relies on (create-if-absent, resourceVersion preconditions, label
//! selectors), plus scripted 409s and an unreachable switch.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use super::crd::{to_lock, to_object};
use super::{ApiError, ApiResult, ClaimObject, ClusterNode, KubeApi, LockObject};
use crate::pod::PodFacts;

#[derive(Default)]
pub struct FakeApi {
    pub claims: RefCell<BTreeMap<String, ClaimObject>>,
    pub locks: RefCell<BTreeMap<String, LockObject>>,
    pub pods: RefCell<BTreeMap<String, PodFacts>>,
    pub nodes: RefCell<BTreeMap<String, ClusterNode>>,
    pub stateful_sets: RefCell<BTreeMap<String, crate::retention::StatefulSetFacts>>,
    pub events: RefCell<Vec<crate::events::PodEvent>>,
    /// IPAMClaim objects by "namespace/name", as JSON.
    pub ipam_claims: RefCell<BTreeMap<String, serde_json::Value>>,
    pub vmis: RefCell<BTreeMap<String, crate::ipamclaim::VmiFacts>>,
    /// Every call, as "verb target".
    pub calls: RefCell<Vec<String>>,
    /// The next N writes answer 409 without applying.
    pub inject_conflicts: Cell<usize>,
    pub unreachable: Cell<bool>,
    /// The node whose token the fake answers as under the node-scope
    /// policy (deploy/30-node-scope-policy.yaml), refusing what the API
    /// server refuses: a takeover of another node's claim without the
    /// unconfirmed mark, and the lock writes `lock_scope` lists.
    pub node_scope: RefCell<Option<String>>,
    /// Runs once, just before the first call whose "verb target" starts
    /// with the prefix: another client's requests slipped in between two
    /// of the caller's (an interleaving no real server can be made to
    /// produce on purpose).
    pub before: RefCell<Option<(String, Race)>>,
    /// The API server's clock (seconds): stamped on the locks it makes
    /// and changes, as creationTimestamp and managed fields' times are;
    /// None: the real time.
    pub clock: Cell<Option<u64>>,
    revision: Cell<u64>,
}

/// A concurrent change (another node's, a controller's) that lands
/// between two of the caller's requests (`FakeApi::before`).
pub type Race = Box<dyn FnOnce(&FakeApi)>;

fn labels_match(labels: BTreeMap<String, String>, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        labels.get(k).map(String::as_str) == Some(v)
    })
}

/// The lock rules of the node-scope policy for a node SCOPE (None: not
/// matched, as reconcile and operators are not): NEXT is the lock a write
/// leaves, None for a delete. A node deletes only its own unmarked locks,
/// names only itself, marks a lock it takes from another node, and never
/// drops a mark (the mark rules hold for node-less locks made before
/// 0.2.0 too, as in the YAML).
fn lock_scope(
    scope: Option<&str>,
    name: &str,
    cur: &LockObject,
    next: Option<&LockObject>,
) -> ApiResult<()> {
    let Some(me) = scope else {
        return Ok(());
    };
    let theirs = cur.node.as_deref().filter(|n| *n != me);
    let refused = match next {
        None => match theirs {
            Some(theirs) => Some(format!(
                "a node deletes only its own locks (made on {theirs})"
            )),
            None if cur.unconfirmed.is_some() => Some("it is marked unconfirmed".to_string()),
            None => None,
        },
        Some(next)
            if next.node.as_deref() != Some(me) && (next.node.is_some() || cur.node.is_some()) =>
        {
            Some(format!("a node names only itself, not {:?}", next.node))
        }
        Some(next)
            if theirs.is_some()
                && next.node.as_deref() == Some(me)
                && next.unconfirmed.is_none() =>
        {
            Some(format!(
                "taking it over from node {theirs:?} requires spec.unconfirmed"
            ))
        }
        Some(next) if cur.unconfirmed.is_some() && next.unconfirmed.is_none() => {
            Some("a node may not drop spec.unconfirmed".to_string())
        }
        Some(_) => None,
    };
    match refused {
        Some(why) => Err(ApiError::Refused(format!(
            "node {me} may not write IPLock {name}: {why}"
        ))),
        None => Ok(()),
    }
}

impl FakeApi {
    fn record(&self, call: String) -> ApiResult<()> {
        let due = matches!(&*self.before.borrow(), Some((prefix, _)) if call.starts_with(prefix.as_str()));
        if due {
            let hook = self.before.borrow_mut().take();
            if let Some((_, hook)) = hook {
                hook(self);
            }
        }
        self.calls.borrow_mut().push(call);
        if self.unreachable.get() {
            return Err(ApiError::Unreachable("connection refused".into()));
        }
        Ok(())
    }

    fn injected(&self) -> ApiResult<()> {
        let n = self.inject_conflicts.get();
        if n > 0 {
            self.inject_conflicts.set(n - 1);
            return Err(ApiError::Conflict("injected 409".into()));
        }
        Ok(())
    }

    /// A new resourceVersion, as the API server gives one on every write.
    pub fn next_rv(&self) -> String {
        self.revision.set(self.revision.get() + 1);
        self.revision.get().to_string()
    }

    fn name(obj: &ClaimObject) -> String {
        super::claim_name(
            &obj.network,
            &obj.claim.identity,
            crate::addr::Family::of(obj.claim.ip),
        )
    }

    fn now(&self) -> u64 {
        self.clock.get().unwrap_or_else(crate::claim::now_secs)
    }

    pub fn count(&self, verb: &str) -> usize {
        self.calls
            .borrow()
            .iter()
            .filter(|c| c.starts_with(verb))
            .count()
    }
}

impl KubeApi for FakeApi {
    fn get_claim(&self, name: &str) -> ApiResult<Option<ClaimObject>> {
        self.record(format!("get {name}"))?;
        Ok(self.claims.borrow().get(name).cloned())
    }

    fn list_claims(&self, selector: &str) -> ApiResult<Vec<ClaimObject>> {
        self.record(format!("list {selector}"))?;
        Ok(self
            .claims
            .borrow()
            .values()
            .filter(|o| labels_match(to_object(o).metadata.labels.unwrap_or_default(), selector))
            .cloned()
            .collect())
    }

    fn get_lock(&self, name: &str) -> ApiResult<Option<LockObject>> {
        self.record(format!("get lock {name}"))?;
        Ok(self.locks.borrow().get(name).cloned())
    }

    fn list_locks(&self, selector: &str) -> ApiResult<Vec<LockObject>> {
        self.record(format!("list locks {selector}"))?;
        Ok(self
            .locks
            .borrow()
            .values()
            .filter(|l| labels_match(to_lock(l).metadata.labels.unwrap_or_default(), selector))
            .cloned()
            .collect())
    }

    fn create_lock(&self, lock: &LockObject) -> ApiResult<LockObject> {
        let name = super::lock_name(&lock.network, lock.ip);
        self.record(format!("create lock {name}"))?;
        self.injected()?;
        let mut locks = self.locks.borrow_mut();
        if locks.contains_key(&name) {
            return Err(ApiError::Conflict(format!("{name} already exists")));
        }
        let mut stored = lock.clone();
        let rv = self.next_rv();
        stored.uid = Some(format!("lock-uid-{rv}"));
        stored.resource_version = Some(rv);
        // The server's clock, whatever the writer's said.
        stored.created = self.now();
        stored.written = Some(stored.created);
        locks.insert(name, stored.clone());
        Ok(stored)
    }

    fn delete_lock(&self, name: &str, uid: &str, resource_version: Option<&str>) -> ApiResult<()> {
        self.record(format!("delete lock {name}"))?;
        self.injected()?;
        let mut locks = self.locks.borrow_mut();
        let scope = self.node_scope.borrow();
        match locks.get(name) {
            None => Err(ApiError::Conflict(format!("{name} not found"))),
            Some(cur) if cur.uid.as_deref() != Some(uid) => {
                Err(ApiError::Conflict(format!("{name} is another lock")))
            }
            Some(cur)
                if resource_version.is_some()
                    && cur.resource_version.as_deref() != resource_version =>
            {
                Err(ApiError::Conflict(format!("{name} was modified")))
            }
            Some(cur) if lock_scope(scope.as_deref(), name, cur, None).is_err() => {
                lock_scope(scope.as_deref(), name, cur, None)
            }
            Some(_) => {
                locks.remove(name);
                Ok(())
            }
        }
    }

    fn rekey_lock(
        &self,
        lock: &LockObject,
        identity: &str,
        node: Option<&str>,
        judged: &crate::claim::Unconfirmed,
    ) -> ApiResult<LockObject> {
        let name = super::lock_name(&lock.network, lock.ip);
        self.record(format!("rekey lock {name}"))?;
        self.injected()?;
        let scope = self.node_scope.borrow().clone();
        let (rv, now) = (self.next_rv(), self.now());
        let mut locks = self.locks.borrow_mut();
        match locks.get_mut(&name) {
            None => Err(ApiError::Conflict(format!("{name} not found"))),
            Some(cur)
                if lock.uid.is_none() || cur.uid != lock.uid || cur.identity != lock.identity =>
            {
                Err(ApiError::Conflict(format!(
                    "{name} is another lock, or another identity's"
                )))
            }
            Some(cur)
                if lock.resource_version.is_some()
                    && cur.resource_version != lock.resource_version =>
            {
                Err(ApiError::Conflict(format!("{name} was modified")))
            }
            Some(cur) => {
                let next = cur.rewritten(identity, node, Some(judged));
                lock_scope(scope.as_deref(), &name, cur, Some(&next))?;
                *cur = LockObject {
                    resource_version: Some(rv),
                    written: Some(now),
                    ..next
                };
                Ok(cur.clone())
            }
        }
    }

    fn adopt_lock(&self, lock: &LockObject, node: Option<&str>) -> ApiResult<LockObject> {
        let name = super::lock_name(&lock.network, lock.ip);
        self.record(format!("adopt lock {name}"))?;
        self.injected()?;
        let scope = self.node_scope.borrow().clone();
        let (rv, now) = (self.next_rv(), self.now());
        let mut locks = self.locks.borrow_mut();
        match locks.get_mut(&name) {
            Some(cur)
                if lock.resource_version.is_some()
                    && cur.resource_version == lock.resource_version =>
            {
                let next = cur.rewritten(&cur.identity, node, None);
                lock_scope(scope.as_deref(), &name, cur, Some(&next))?;
                *cur = LockObject {
                    adoptions: lock.adoptions + 1,
                    resource_version: Some(rv),
                    written: Some(now),
                    ..next
                };
                Ok(cur.clone())
            }
            Some(_) => Err(ApiError::Conflict(format!("{name} was modified"))),
            None => Err(ApiError::Conflict(format!("{name} not found"))),
        }
    }

    fn clear_lock_mark(&self, lock: &LockObject) -> ApiResult<LockObject> {
        let name = super::lock_name(&lock.network, lock.ip);
        self.record(format!("clear lock {name}"))?;
        self.injected()?;
        let scope = self.node_scope.borrow().clone();
        let (rv, now) = (self.next_rv(), self.now());
        let mut locks = self.locks.borrow_mut();
        match locks.get_mut(&name) {
            Some(cur)
                if lock.resource_version.is_some()
                    && cur.resource_version == lock.resource_version =>
            {
                let next = LockObject {
                    unconfirmed: None,
                    ..cur.clone()
                };
                lock_scope(scope.as_deref(), &name, cur, Some(&next))?;
                *cur = LockObject {
                    resource_version: Some(rv),
                    written: Some(now),
                    ..next
                };
                Ok(cur.clone())
            }
            Some(_) => Err(ApiError::Conflict(format!("{name} was modified"))),
            None => Err(ApiError::Conflict(format!("{name} not found"))),
        }
    }

    fn create_claim(&self, obj: &ClaimObject) -> ApiResult<ClaimObject> {
        let name = Self::name(obj);
        self.record(format!("create {name}"))?;
        self.injected()?;
        let mut claims = self.claims.borrow_mut();
        if claims.contains_key(&name) {
            return Err(ApiError::Conflict(format!("{name} already exists")));
        }
        let mut stored = obj.clone();
        stored.resource_version = Some(self.next_rv());
        claims.insert(name, stored.clone());
        Ok(stored)
    }

    fn replace_claim(&self, obj: &ClaimObject) -> ApiResult<ClaimObject> {
        let name = Self::name(obj);
        self.record(format!("replace {name}"))?;
        self.injected()?;
        let mut claims = self.claims.borrow_mut();
        match claims.get(&name) {
            None => Err(ApiError::Conflict(format!("{name} not found"))),
            Some(cur) if cur.resource_version != obj.resource_version => {
                Err(ApiError::Conflict(format!("{name} was modified")))
            }
            // The policy's takeover rule: naming itself the holder of
            // another node's claim, a node sets status.unconfirmed.
            Some(cur)
                if self.node_scope.borrow().as_ref().is_some_and(|me| {
                    cur.claim.holder_node().is_some_and(|theirs| theirs != me)
                        && obj.claim.unconfirmed.is_none()
                }) =>
            {
                Err(ApiError::Refused(format!(
                    "may not take IPClaim {name} over without setting status.unconfirmed"
                )))
            }
            Some(_) => {
                let mut stored = obj.clone();
                stored.resource_version = Some(self.next_rv());
                claims.insert(name, stored.clone());
                Ok(stored)
            }
        }
    }

    fn delete_claim(&self, name: &str, resource_version: &str) -> ApiResult<()> {
        self.record(format!("delete {name}"))?;
        self.injected()?;
        let mut claims = self.claims.borrow_mut();
        match claims.get(name) {
            None => Err(ApiError::Conflict(format!("{name} not found"))),
            Some(cur) if cur.resource_version.as_deref() != Some(resource_version) => {
                Err(ApiError::Conflict(format!("{name} was modified")))
            }
            Some(_) => {
                claims.remove(name);
                Ok(())
            }
        }
    }

    fn get_pod(&self, namespace: &str, name: &str) -> ApiResult<Option<PodFacts>> {
        let key = format!("{namespace}/{name}");
        self.record(format!("get pod {key}"))?;
        Ok(self.pods.borrow().get(&key).cloned())
    }

    fn get_node(&self, name: &str) -> ApiResult<Option<ClusterNode>> {
        self.record(format!("get node {name}"))?;
        Ok(self.nodes.borrow().get(name).cloned())
    }

    fn get_stateful_set(
        &self,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Option<crate::retention::StatefulSetFacts>> {
        let key = format!("{namespace}/{name}");
        self.record(format!("get statefulset {key}"))?;
        Ok(self.stateful_sets.borrow().get(&key).cloned())
    }

    fn post_event(&self, event: &crate::events::PodEvent) -> ApiResult<()> {
        self.record(format!(
            "event {}/{} {}",
            event.namespace, event.pod, event.reason
        ))?;
        self.events.borrow_mut().push(event.clone());
        Ok(())
    }

    fn get_ipam_claim(&self, namespace: &str, name: &str) -> ApiResult<Option<serde_json::Value>> {
        let key = format!("{namespace}/{name}");
        self.record(format!("get ipamclaim {key}"))?;
        Ok(self.ipam_claims.borrow().get(&key).cloned())
    }

    fn replace_ipam_claim_status(
        &self,
        namespace: &str,
        claim: &serde_json::Value,
    ) -> ApiResult<()> {
        let name = claim["metadata"]["name"].as_str().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        self.record(format!("update ipamclaim/status {key}"))?;
        self.injected()?;
        let mut claims = self.ipam_claims.borrow_mut();
        let Some(cur) = claims.get_mut(&key) else {
            return Err(ApiError::Conflict(format!("IPAMClaim {key} is gone")));
        };
        let version = &cur["metadata"]["resourceVersion"];
        if claim["metadata"]["resourceVersion"] != *version {
            return Err(ApiError::Conflict(format!("IPAMClaim {key} changed")));
        }
        let next = self.revision.get() + 1;
        self.revision.set(next);
        cur["status"] = claim["status"].clone();
        cur["metadata"]["resourceVersion"] = serde_json::json!(next.to_string());
        Ok(())
    }

    fn get_vmi(
        &self,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Option<crate::ipamclaim::VmiFacts>> {
        let key = format!("{namespace}/{name}");
        self.record(format!("get vmi {key}"))?;
        Ok(self.vmis.borrow().get(&key).cloned())
    }
}
