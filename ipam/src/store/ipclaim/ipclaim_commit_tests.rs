//! A plan's commit: its request counts, the node-local cache and its
//! preconditions, concurrent ADDs and a lost race rolled back.

use super::*;

#[test]
fn a_stale_node_local_cache_is_caught_by_the_precondition() {
    let api = FakeApi::default();
    let (n1, n2) = (Node::new(), Node::new());
    running(&api, "a", "n1");
    let first = add(&api, Some(&n1), &req("peer", true, "a", "n1")).unwrap();
    // The pod moves to n2 (its pod on n1 is gone), n2 takes the claim over.
    api.pods.borrow_mut().clear();
    running(&api, "b", "n2");
    assert_eq!(
        add(&api, Some(&n2), &req("peer", true, "b", "n2")).unwrap(),
        first
    );
    // n1's cache still says the claim is its pod's: its re-ADD for the
    // old pod must not be served from it.
    let e = add(&api, Some(&n1), &req("peer", true, "a", "n1")).unwrap_err();
    let e = cni::CniError::from(e);
    assert_eq!(e.code, cni::code::TRY_AGAIN_LATER, "{}", e.msg);
    assert!(e.msg.contains("ns/b"), "{}", e.msg);
    // And a retried ADD of the very attachment n1 recorded (the plan
    // writes nothing) is checked against the API too.
    let mut retried = req("peer", true, "a", "n1");
    retried.holder.container_id = "c-a".into();
    let e = cni::CniError::from(add(&api, Some(&n1), &retried).unwrap_err());
    assert_eq!(e.code, cni::code::TRY_AGAIN_LATER, "{}", e.msg);
    // n1's DEL of its old sandbox leaves n2's claim alone.
    del(&api, &n1, "c-a");
    let stored = api.claims.borrow().values().next().cloned().unwrap();
    assert_eq!(stored.claim.holder.unwrap().node, "n2");
}

/// Issue 26 (the review of I7): a confirmation whose write gets no
/// answer keeps the node-local cache entry, so the pod's next re-ADD
/// while the API is away is still served (probed) in degraded mode.
#[test]
fn a_confirmation_that_times_out_keeps_the_node_local_cache_entry() {
    let (api, n1) = (FakeApi::default(), Node::new());
    running(&api, "a", "n1");
    let ip = add(&api, Some(&n1), &req("peer", true, "a", "n1")).unwrap()[0];
    api.pods.borrow_mut().clear();
    running(&api, "b", "n1");
    add(&api, Some(&n1), &req("peer", true, "b", "n1")).unwrap();
    let mut store = n1.store(&api);
    let plan = crate::engine::plan_confirm(&mut store, &[ip], "c-b", "net1").unwrap();
    assert_eq!(plan.changes.len(), 1, "the takeover is marked: {plan:?}");
    *api.before.borrow_mut() = Some((
        "replace".into(),
        Box::new(|api: &FakeApi| api.unreachable.set(true)),
    ));
    let e = store.commit(&plan).unwrap_err();
    assert!(matches!(e, StoreError::Unreachable(_)), "{e:?}");
    drop(store);
    let local = LocalRecord::new(&n1.dir, "macnet").open().unwrap();
    assert!(confirmed_locally(&local, ip), "the cache entry was dropped");
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
    let got_b = add(&api, None, &rb).unwrap();
    let e = store_a.commit(&plan_a).unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    assert_eq!(per_identity(&api)["shared"], 1);
    assert_eq!(
        api.claims.borrow().values().next().unwrap().claim.ip,
        got_b[0]
    );
    // n1's lock on the address it planned is gone again.
    locks_match(&api);
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
    // The v6 address is locked by someone else between planning and commit.
    let v6 = plan.changes[1].after.clone().unwrap();
    api.create_lock(&LockObject {
        network: "macnet".into(),
        ip: v6.ip,
        identity: "someone-else".into(),
        created: 1,
        uid: None,
        node: None,
        unconfirmed: None,
        resource_version: None,
        adoptions: 0,
        written: None,
    })
    .unwrap();
    let e = store.commit(&plan).unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    // The v4 claim and lock it had created are gone again: nothing half-done.
    assert!(api.claims.borrow().is_empty());
    assert_eq!(api.locks.borrow().len(), 1);
    // The replan knows which addresses are taken and succeeds.
    store.conflicted().unwrap();
    let (plan, grants) = plan_add(&conf, &mut store, &insp, &r).unwrap();
    store.commit(&plan).unwrap();
    assert!(grants.iter().all(|g| g.ip != v6.ip));
    assert_eq!(per_identity(&api)["dual"], 2);
}

#[test]
fn an_orphan_lock_keeps_its_address_until_reconcile_sweeps_it() {
    let api = FakeApi::default();
    let n1 = Node::new();
    // An ADD that crashed between its lock and its claim, long ago by
    // the API server's clock.
    let ip = old_orphan(&api, "crashed");
    // Next-fit from .12 skips the locked .13.
    running(&api, "x", "n1");
    running(&api, "y", "n1");
    let a = add(&api, Some(&n1), &req("x", true, "x", "n1")).unwrap();
    let b = add(&api, Some(&n1), &req("y", true, "y", "n1")).unwrap();
    assert!(!a.contains(&ip) && !b.contains(&ip), "{a:?} {b:?}");
    let mut store = n1.store(&api);
    let listing = store.list().unwrap();
    assert!(listing
        .claims
        .iter()
        .any(|c| c.ip == ip && c.identity == "crashed" && c.holder.is_none()));
    // A fresh lock survives the sweep, an old one does not.
    assert_eq!(
        store.sweep_locks(now_secs()).unwrap().freed,
        Vec::<IpAddr>::new()
    );
    assert_eq!(store.sweep_locks(60).unwrap().freed, vec![ip]);
    locks_match(&api);
}

#[test]
fn node_offsets_spread() {
    let a = node_offset("node1", 250);
    let b = node_offset("node2", 250);
    assert!(a < 250 && b < 250 && a != b);
    assert_eq!(node_offset("x", 0), 0);
}

/// A DEL deletes its claim, then the claim's lock. Between the two the
/// lock is an orphan, and old: another ADD may adopt or re-key it in place
/// (same UID) and create its own claim on it. The DEL's lock delete must
/// then fail, or that claim's address is left unlocked for a third
/// identity to lock and claim: one address, two claims.
#[test]
fn a_del_never_deletes_a_lock_rekeyed_or_adopted_after_its_claim_was_deleted() {
    // Each race: what another ADD did to the lock in place.
    type Change = fn(&mut LockObject);
    let races: [(&str, Change); 3] = [
        ("re-keyed to another identity", |l| {
            l.identity = "peer-b".into()
        }),
        ("adopted by the same identity on another node", |l| {
            l.adoptions += 1;
            l.node = Some("n2".into());
        }),
        ("adopted by the same identity on this node", |l| {
            l.adoptions += 1
        }),
    ];
    for (race, change) in races {
        let (api, n1) = (FakeApi::default(), Node::new());
        running(&api, "a", "n1");
        let key = dynamic_key("c-a", "net1");
        let ip = add(&api, Some(&n1), &req(&key, false, "a", "n1")).unwrap()[0];
        let name = crate::kube::lock_name("macnet", ip);
        let at = name.clone();
        *api.before.borrow_mut() = Some((
            "delete lock".into(),
            Box::new(move |api: &FakeApi| {
                let rv = api.next_rv();
                let mut locks = api.locks.borrow_mut();
                let lock = locks.get_mut(&at).expect("the DEL's lock");
                change(lock);
                lock.resource_version = Some(rv);
            }),
        ));
        let (_, calls) = counted(&api, || del(&api, &n1, "c-a"));
        assert!(
            api.locks.borrow().contains_key(&name),
            "{race}: the DEL deleted the lock another ADD holds now: {calls:?}"
        );
    }
}

/// The DEL of a claim this node made still costs two requests: the lock's
/// version is remembered from its create.
#[test]
fn a_del_of_a_claim_made_here_deletes_its_lock_at_the_version_it_was_made_at() {
    let (api, n1) = (FakeApi::default(), Node::new());
    running(&api, "a", "n1");
    let key = dynamic_key("c-a", "net1");
    add(&api, Some(&n1), &req(&key, false, "a", "n1")).unwrap();
    let (_, calls) = counted(&api, || del(&api, &n1, "c-a"));
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(api.locks.borrow().is_empty(), "{:?}", api.locks.borrow());
    assert!(api.claims.borrow().is_empty());
}
