//! Orphan locks: kept until reconcile's sweep, adopted by their identity,
//! and safe against a sweep racing an adoption.

use super::*;

#[test]
fn an_adoption_between_the_sweeps_read_and_its_delete_keeps_the_lock() {
    let api = FakeApi::default();
    let n1 = Node::new();
    let ip = old_orphan(&api, "peer");
    // The sweep lists the locks and finds no claim of "peer"; the
    // adopting ADD runs before the sweep's delete.
    let lock = lock_name("macnet", ip);
    let adopted = std::rc::Rc::new(std::cell::Cell::new(Vec::new()));
    let (seen, dir) = (adopted.clone(), n1.dir.clone());
    let hook = Box::new(move |api: &FakeApi| seen.set(adopt(api, &dir, "peer", ip)));
    *api.before.borrow_mut() = Some((format!("delete lock {lock}"), hook));
    // The sweep is reconcile's: no node-local record.
    let mut sweeper = KubeStore::new(&api, "macnet", None, vec![None]);
    let freed = sweeper.sweep_locks(60).unwrap().freed;
    assert_eq!(adopted.take(), vec![ip], "the ADD adopted the orphan");
    assert_eq!(freed, Vec::<IpAddr>::new(), "the sweep missed the adoption");
    adopted_and_locked(&api, "peer", ip);
    locks_match(&api);
}

#[test]
fn a_sweep_between_an_adoptions_lock_write_and_its_claim_keeps_the_lock() {
    let api = FakeApi::default();
    let n1 = Node::new();
    let ip = old_orphan(&api, "peer");
    // The whole sweep runs between the adopting ADD's write of the
    // lock (if any) and its claim create.
    let freed = std::rc::Rc::new(std::cell::Cell::new(Vec::new()));
    let seen = freed.clone();
    let hook = Box::new(move |api: &FakeApi| {
        let mut sweeper = KubeStore::new(api, "macnet", None, vec![None]);
        seen.set(sweeper.sweep_locks(60).unwrap().freed);
    });
    let claim = claim_name("macnet", "peer", Family::V4);
    *api.before.borrow_mut() = Some((format!("create {claim}"), hook));
    assert_eq!(adopt(&api, &n1.dir, "peer", ip), vec![ip]);
    assert_eq!(
        freed.take(),
        Vec::<IpAddr>::new(),
        "the sweep took an adopted lock"
    );
    adopted_and_locked(&api, "peer", ip);
    locks_match(&api);
}

#[test]
fn a_lock_made_by_a_node_whose_clock_is_behind_is_not_old() {
    let api = FakeApi::default();
    let n1 = Node::new();
    // A node an hour behind: its lock says it was made an hour ago,
    // the API server made it just now.
    api.create_lock(&LockObject {
        network: "macnet".into(),
        ip: "10.0.0.13".parse().unwrap(),
        identity: "in-flight".into(),
        created: now_secs() - 3600,
        uid: None,
        node: Some("n1".into()),
        unconfirmed: None,
        resource_version: None,
        adoptions: 0,
        written: None,
    })
    .unwrap();
    let freed = n1
        .store(&api)
        .sweep_locks(ORPHAN_LOCK_GRACE_SECS)
        .unwrap()
        .freed;
    assert_eq!(freed, Vec::<IpAddr>::new(), "a fresh lock was swept");
    assert_eq!(api.locks.borrow().len(), 1);
}

#[test]
fn injected_conflicts_keep_the_invariants() {
    let api = FakeApi::default();
    for i in 0..10 {
        api.inject_conflicts.set(i % 3);
        let r = req(&format!("id-{i}"), false, &format!("p{i}"), "n1");
        assert!(add(&api, None, &r).is_ok(), "ADD {i} never committed");
    }
    assert_eq!(api.claims.borrow().len(), 10);
    assert!(per_identity(&api).values().all(|n| *n == 1));
    locks_match(&api);
}
