use super::*;
use crate::claim::Holder;
use crate::config::IpamConfig;
use crate::engine::{plan_add, plan_del, AddRequest};
use crate::identity::{dynamic_key, Identity, IdentitySource};
use crate::kube::fake::FakeApi;
use crate::kube::inspector::KubeInspector;
use crate::liveness::{Caller, NodeFacts};
use crate::pod::PodFacts;
use cni::{code, CniError};
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
            source: if sticky {
                IdentitySource::ArgsCni
            } else {
                IdentitySource::Container
            },
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

/// A node's local directory (the node-local record and its cache),
/// removed on drop.
struct Node {
    dir: PathBuf,
}

impl Node {
    fn new() -> Node {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sticky-ipam-kube-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Node { dir }
    }

    fn store<'a>(&self, api: &'a FakeApi) -> KubeStore<'a> {
        store_in(&self.dir, api)
    }
}

/// The store of the node whose directory is DIR.
fn store_in<'a>(dir: &std::path::Path, api: &'a FakeApi) -> KubeStore<'a> {
    let local = LocalRecord::new(dir, "macnet");
    KubeStore::new(
        api,
        "macnet",
        Some(local),
        vec![Some("10.0.0.12".parse().unwrap())],
    )
}

impl Node {}

/// ADD as cni_ipam does it, with its retries.
fn add(api: &FakeApi, on: Option<&Node>, r: &AddRequest) -> crate::store::PlanResult<Vec<IpAddr>> {
    let mut store = match on {
        Some(n) => n.store(api),
        None => KubeStore::new(api, "macnet", None, vec![None]),
    };
    let inspector = KubeInspector::new(api, node(&r.holder.node));
    let (_, grants) = crate::store::retry::with_retries(&mut store, "ADD", |s| {
        plan_add(&conf(), s, &inspector, r)
    })?;
    Ok(grants.iter().map(|g| g.ip).collect())
}

fn del(api: &FakeApi, on: &Node, cid: &str) {
    let mut store = on.store(api);
    crate::store::retry::with_retries(&mut store, "DEL", |s| {
        plan_del(s, cid, "net1", 2).map(|p| (p, ()))
    })
    .unwrap();
}

/// How many requests `f` makes, and which.
fn counted<T>(api: &FakeApi, f: impl FnOnce() -> T) -> (T, Vec<String>) {
    api.calls.borrow_mut().clear();
    let out = f();
    (out, api.calls.borrow().clone())
}

fn per_identity(api: &FakeApi) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for o in api.claims.borrow().values() {
        *n.entry(o.claim.identity.clone()).or_default() += 1;
    }
    n
}

/// Every claim's address is locked for its identity, and every lock
/// is named by a claim (no orphans after a clean run).
fn locks_match(api: &FakeApi) {
    let claims = api.claims.borrow();
    let locks = api.locks.borrow();
    assert_eq!(claims.len(), locks.len(), "{claims:?} {locks:?}");
    for o in claims.values() {
        let lock = &locks[&lock_name("macnet", o.claim.ip)];
        assert_eq!(lock.identity, o.claim.identity);
        assert_eq!(o.lock_uid, lock.uid);
    }
}

/// Whether the plugin probes `g` before binding it (kubernetes store).
fn probed(g: &crate::engine::Grant, r: &AddRequest) -> bool {
    crate::probe_policy::needs_wire_check(
        &g.origin,
        g.unconfirmed,
        &r.identity,
        crate::probe_policy::StoreScope::Cluster,
        &r.holder.node,
        false,
    )
}

/// ADD as cni_ipam does it, returning the grants.
fn grants(api: &FakeApi, on: &Node, r: &AddRequest) -> Vec<crate::engine::Grant> {
    let mut store = on.store(api);
    let inspector = KubeInspector::new(api, node(&r.holder.node));
    let (_, grants) = crate::store::retry::with_retries(&mut store, "ADD", |s| {
        plan_add(&conf(), s, &inspector, r)
    })
    .unwrap();
    grants
}

/// reconcile's sweep of the network, from a pod on no node of ours.
fn reconcile(api: &FakeApi) -> usize {
    let mut store = KubeStore::new(api, "macnet", None, vec![]);
    let inspector = KubeInspector::new(api, node("reconcile-pod"));
    let (_, released) = crate::store::retry::with_retries(&mut store, "reconcile", |s| {
        crate::engine::plan_reconcile(s, &inspector, 5).map(|(p, r, _)| (p, r))
    })
    .unwrap();
    released.len()
}

/// The same pod name, re-created with a new UID on `node`.
fn recreated(identity: &str, pod: &str, node: &str) -> AddRequest {
    let mut r = req(identity, true, pod, node);
    r.holder.container_id = format!("c-{pod}-new");
    r.holder.pod_uid = Some(format!("uid-{pod}-new"));
    r.caller.pod_uid = r.holder.pod_uid.clone();
    r
}

/// A lock an ADD on `node` made at `ip` for `identity`, `age` seconds
/// ago by the API server's clock, whose claim never followed.
fn orphan(api: &FakeApi, ip: &str, identity: &str, node: &str, age: u64) -> LockObject {
    api.clock.set(Some(now_secs() - age));
    let lock = api
        .create_lock(&LockObject {
            network: "macnet".into(),
            ip: ip.parse().unwrap(),
            identity: identity.into(),
            created: 0,
            uid: None,
            node: Some(node.into()),
            unconfirmed: None,
            resource_version: None,
            adoptions: 0,
            written: None,
        })
        .unwrap();
    api.clock.set(None);
    lock
}

/// The pool's tenth address (10.0.0.19) locked by an ADD of n2's that
/// never made its claim, `age` seconds ago; the other nine held by live
/// pods on n2. The caller answers to the node-scope policy as n1.
fn full_but_an_orphan(api: &FakeApi, n2: &Node, age: u64) -> String {
    let crashed = dynamic_key("c-crashed", "net1");
    orphan(api, "10.0.0.19", &crashed, "n2", age);
    *api.node_scope.borrow_mut() = Some("n2".into());
    for i in 0..9 {
        let pod = format!("live-{i}");
        running(api, &pod, "n2");
        let key = dynamic_key(&format!("c-{pod}"), "net1");
        grants(api, n2, &req(&key, false, &pod, "n2"));
    }
    *api.node_scope.borrow_mut() = Some("n1".into());
    crashed
}

/// A new Deployment pod's ADD on n1, with its retries.
fn add_new_pod(
    api: &FakeApi,
    n1: &Node,
) -> (AddRequest, Result<Vec<crate::engine::Grant>, CniError>) {
    running(api, "new", "n1");
    let r = req(&dynamic_key("c-new", "net1"), false, "new", "n1");
    let mut store = n1.store(api);
    let inspector = KubeInspector::new(api, node("n1"));
    let got = crate::store::retry::with_retries(&mut store, "ADD", |s| {
        plan_add(&conf(), s, &inspector, &r)
    })
    .map(|(_, g)| g)
    .map_err(CniError::from);
    (r, got)
}

// ---- an address changing identity on the kubernetes store ----

/// A one-address network.
fn one_conf() -> IpamConfig {
    IpamConfig::parse(
        "macnet",
        &json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.10"}),
    )
    .unwrap()
}

/// ADD on the one-address network, with its retries.
fn grants_one(
    api: &FakeApi,
    dir: &std::path::Path,
    r: &AddRequest,
) -> crate::store::PlanResult<Vec<crate::engine::Grant>> {
    let mut store = store_in(dir, api);
    let inspector = KubeInspector::new(api, node(&r.holder.node));
    crate::store::retry::with_retries(&mut store, "ADD", |s| {
        plan_add(&one_conf(), s, &inspector, r)
    })
    .map(|(_, g)| g)
}

/// Runs RACE just before the first request that follows a write of
/// the existing lock LOCK (a delete, a re-key, a takeover; not a
/// create, which a collision makes before any reclaim): another
/// client's requests landing between two of the caller's.
fn after_lock_write(api: &FakeApi, lock: String, race: crate::kube::fake::Race) {
    *api.before.borrow_mut() = Some((
        String::new(),
        Box::new(move |api: &FakeApi| {
            let last = api.calls.borrow().last().cloned().unwrap_or_default();
            let wrote = ["delete", "rekey", "adopt", "take"]
                .iter()
                .any(|verb| last == format!("{verb} lock {lock}"));
            if wrote {
                race(api)
            } else {
                after_lock_write(api, lock, race)
            }
        }),
    ));
}

/// web-0 on n3 had the one address; reconcile judged it dead and left
/// a tombstone. Returns the address.
fn tombstone_on_the_only_address(api: &FakeApi, n3: &Node) -> IpAddr {
    running(api, "web-0", "n3");
    let k0 = dynamic_key("c-web-0", "net1");
    let first = grants_one(api, &n3.dir, &req(&k0, false, "web-0", "n3")).unwrap();
    api.pods.borrow_mut().remove("ns/web-0");
    assert_eq!(reconcile(api), 1);
    let ip = first[0].ip;
    let lock = &api.locks.borrow()[&lock_name("macnet", ip)];
    assert_eq!(lock.identity, k0, "the tombstone keeps its lock");
    ip
}

/// The ADD another node (n2) makes in the middle of n1's writes: it
/// must not get the address unprobed. Returns whether it ran.
type Stolen =
    std::rc::Rc<std::cell::RefCell<Option<crate::store::PlanResult<Vec<crate::engine::Grant>>>>>;

fn n2s_add(n2dir: PathBuf, out: Stolen) -> crate::kube::fake::Race {
    Box::new(move |api: &FakeApi| {
        let r2 = req(&dynamic_key("c-new2", "net1"), false, "new2", "n2");
        *out.borrow_mut() = Some(grants_one(api, &n2dir, &r2));
    })
}

fn never_unprobed(stolen: &Stolen, ip: IpAddr) {
    let r2 = req(&dynamic_key("c-new2", "net1"), false, "new2", "n2");
    match stolen.borrow().as_ref().expect("n2's ADD ran") {
        Ok(g2) => {
            assert_eq!(g2[0].ip, ip);
            assert!(probed(&g2[0], &r2), "{ip} went to n2 unprobed: {g2:?}");
        }
        Err(e) => eprintln!("n2's ADD, in the middle: {e:?}"),
    }
}

/// An ADD that crashed between its lock and its claim, long ago: the
/// orphan the sweep removes unless its identity's ADD adopts it.
fn old_orphan(api: &FakeApi, identity: &str) -> IpAddr {
    // Made at second 1 of the API server's clock.
    orphan(api, "10.0.0.13", identity, "n1", now_secs() - 1).ip
}

/// The ADD that adopts the orphan on IP: its identity asks for it.
fn adopt(api: &FakeApi, dir: &std::path::Path, identity: &str, ip: IpAddr) -> Vec<IpAddr> {
    running(api, "adopter", "n1");
    let mut r = req(identity, true, "adopter", "n1");
    r.requested = vec![ip];
    let mut store = store_in(dir, api);
    let inspector = KubeInspector::new(api, node("n1"));
    let (_, grants) = crate::store::retry::with_retries(&mut store, "ADD", |s| {
        plan_add(&conf(), s, &inspector, &r)
    })
    .unwrap();
    grants.iter().map(|g| g.ip).collect()
}

/// The lock on IP is still there, the identity's claim names IP.
fn adopted_and_locked(api: &FakeApi, identity: &str, ip: IpAddr) {
    let claims = api.claims.borrow();
    let claim = claims
        .get(&claim_name("macnet", identity, Family::V4))
        .expect("the adopting ADD made its claim");
    assert_eq!(claim.claim.ip, ip);
    let locks = api.locks.borrow();
    let lock = locks.get(&lock_name("macnet", ip));
    assert!(
        lock.is_some_and(|l| l.identity == identity),
        "the claim on {ip} lost its lock: the address is free for a second identity ({locks:?})"
    );
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[path = "ipclaim_commit_tests.rs"]
mod commit;
#[path = "ipclaim_node_tests.rs"]
mod node_local;
#[path = "ipclaim_orphans_tests.rs"]
mod orphans;
#[path = "ipclaim_reclaim_tests.rs"]
mod reclaim;
#[path = "ipclaim_tombstone_tests.rs"]
mod tombstone;
