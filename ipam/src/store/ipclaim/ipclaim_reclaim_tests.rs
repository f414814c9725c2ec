//! Reclaims on the kubernetes store: of another node's dead claim, of what
//! reconcile released, of an old orphan lock, and what a takeover costs.

use super::*;

#[test]
fn a_reclaim_of_another_nodes_dead_claim_takes_it_over_before_deleting_it() {
    let api = FakeApi::default();
    // The pool (10 addresses) filled by node n2's pods, which are then
    // gone (their node crashed, their DELs never came).
    for i in 0..10 {
        let pod = format!("old-{i}");
        running(&api, &pod, "n2");
        let key = dynamic_key(&format!("c-{pod}"), "net1");
        add(&api, None, &req(&key, false, &pod, "n2")).unwrap();
    }
    api.pods.borrow_mut().clear();
    assert!(
        api.locks
            .borrow()
            .values()
            .all(|l| l.node.as_deref() == Some("n2")),
        "a lock names the node that made it"
    );
    // n1 answers to the node-scope policy: n2's locks are not its to delete.
    *api.node_scope.borrow_mut() = Some("n1".into());
    running(&api, "new", "n1");
    let key = dynamic_key("c-new", "net1");
    let (got, calls) = counted(&api, || add(&api, None, &req(&key, false, "new", "n1")));
    let ip = got.unwrap()[0];
    let writes: Vec<&str> = calls
        .iter()
        .map(String::as_str)
        .filter(|c| !c.starts_with("get") && !c.starts_with("list"))
        .collect();
    // The old claim is n1's before its delete: a node deletes only
    // claims it holds (the admission policy's rule).
    let old = writes
        .iter()
        .find_map(|c| c.strip_prefix("delete macnet."))
        .expect("the reclaimed claim is deleted");
    let at = |w: &str| writes.iter().position(|c| *c == w);
    assert!(
        matches!(
            (at(&format!("replace macnet.{old}")), at(&format!("delete macnet.{old}"))),
            (Some(taken), Some(deleted)) if taken < deleted
        ),
        "{writes:?}"
    );
    // Its lock is never deleted: after the create that found it taken
    // (which started the reclaim), one re-key gives it to the new
    // identity, naming n1, before the old claim's delete.
    let lock = lock_name("macnet", ip);
    let lock_writes: Vec<&str> = writes
        .iter()
        .copied()
        .filter(|w| w.ends_with(&format!(" lock {lock}")))
        .collect();
    assert_eq!(
        lock_writes,
        [format!("create lock {lock}"), format!("rekey lock {lock}")],
        "{writes:?}"
    );
    assert!(
        writes
            .iter()
            .position(|w| *w == format!("rekey lock {lock}"))
            < at(&format!("delete macnet.{old}")),
        "{writes:?}"
    );
    let stored = api.claims.borrow();
    let mine = stored.values().find(|o| o.claim.ip == ip).unwrap();
    assert_eq!(mine.claim.identity, key);
    assert_eq!(mine.claim.holder.as_ref().unwrap().node, "n1");
    drop(stored);
    assert_eq!(api.locks.borrow()[&lock].node.as_deref(), Some("n1"));
    locks_match(&api);
}

#[test]
fn a_claim_reconcile_released_is_probed_when_the_recreated_pod_takes_it() {
    // Issue 26 item 1: db-0 runs on n1, whose API link is cut while its
    // fabric link is up; db-0 is force-deleted and re-created on n2,
    // whose takeover the probe refuses; reconcile then judges the old
    // holder dead ("no longer exists") and releases the claim.
    let api = FakeApi::default();
    let (n1, n2) = (Node::new(), Node::new());
    running(&api, "db-0", "n1");
    let mut r = req("ns/db-0", true, "db-0", "n1");
    r.identity.source = IdentitySource::StatefulSet;
    let first = grants(&api, &n1, &r);
    api.pods.borrow_mut().remove("ns/db-0");
    assert_eq!(reconcile(&api), 1);
    // kubelet's next retry on n2 finds the claim unheld: it must still
    // be probed, the old db-0 may answer on the fabric.
    let mut again = recreated("ns/db-0", "db-0", "n2");
    again.identity.source = IdentitySource::StatefulSet;
    api.pods.borrow_mut().insert(
        "ns/db-0".into(),
        PodFacts {
            uid: "uid-db-0-new".into(),
            node: Some("n2".into()),
            phase: Some("Running".into()),
            ..PodFacts::default()
        },
    );
    let g = grants(&api, &n2, &again);
    assert_eq!(g[0].ip, first[0].ip);
    assert!(probed(&g[0], &again), "{g:?}");
}

#[test]
fn a_dynamic_address_reconcile_released_is_probed_when_it_is_handed_out_again() {
    let api = FakeApi::default();
    let (n1, n2) = (Node::new(), Node::new());
    // The pool (10 addresses) held by n2's Deployment pods, whose node
    // is cut from the API; they are force-deleted, reconcile frees them.
    let mut held = Vec::new();
    for i in 0..10 {
        let pod = format!("web-{i}");
        running(&api, &pod, "n2");
        let key = dynamic_key(&format!("c-{pod}"), "net1");
        held.extend(grants(&api, &n2, &req(&key, false, &pod, "n2")));
        api.pods.borrow_mut().remove(&format!("ns/{pod}"));
    }
    assert_eq!(reconcile(&api), 10);
    running(&api, "new", "n1");
    let key = dynamic_key("c-new", "net1");
    let r = req(&key, false, "new", "n1");
    let g = grants(&api, &n1, &r);
    assert!(held.iter().any(|h| h.ip == g[0].ip));
    assert!(probed(&g[0], &r), "{g:?}");
}

#[test]
fn an_exhausted_pool_reclaims_an_old_orphan_lock_probed_and_keeps_a_young_one() {
    // Issue 26 item 10: without the reconcile Deployment nothing removed
    // a lock an ADD left behind, and the exhaustion hint named a command
    // that cannot remove one.
    let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
    // 30 s old: an ADD may be between its lock and its claim.
    full_but_an_orphan(&api, &n2, 30);
    let e = add_new_pod(&api, &n1).1.unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    assert_eq!(api.locks.borrow().len(), 10);
    // Past the grace, the ADD that made it is long dead: the pool takes
    // the address back, takes n2's lock over (node scope) and probes the
    // address, since that ADD may have bound it unseen.
    let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
    full_but_an_orphan(&api, &n2, ORPHAN_LOCK_GRACE_SECS + 60);
    let (r, got) = add_new_pod(&api, &n1);
    let g = got.unwrap();
    assert_eq!(g[0].ip.to_string(), "10.0.0.19");
    assert!(g[0].reclaimed && probed(&g[0], &r), "{g:?}");
    let lock = api.locks.borrow()[&lock_name("macnet", g[0].ip)].clone();
    assert_eq!(lock.identity, r.identity.key);
    assert_eq!(lock.node.as_deref(), Some("n1"));
}

#[test]
fn a_reclaim_of_an_orphan_lock_an_add_adopts_meanwhile_plans_again() {
    let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
    let crashed = full_but_an_orphan(&api, &n2, ORPHAN_LOCK_GRACE_SECS + 60);
    // Between the reclaim's listing and its re-key, the crashed ADD's
    // retry adopts the lock (and is about to write its claim).
    *api.before.borrow_mut() = Some((
        "rekey lock".into(),
        Box::new(|api: &FakeApi| {
            let name = lock_name("macnet", "10.0.0.19".parse().unwrap());
            let lock = api.locks.borrow()[&name].clone();
            // n2's ADD, answering to the policy as n2.
            let caller = api.node_scope.replace(Some("n2".into()));
            api.adopt_lock(&lock, Some("n2")).unwrap();
            *api.node_scope.borrow_mut() = caller;
        }),
    ));
    // The adopted lock is young again: the pool is full.
    let e = add_new_pod(&api, &n1).1.unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    let name = lock_name("macnet", "10.0.0.19".parse().unwrap());
    assert_eq!(
        api.locks.borrow()[&name].identity,
        crashed,
        "the adopted lock stays"
    );
}

#[test]
fn a_takeover_from_another_node_and_its_confirmation_cost_five_requests() {
    // Found by review: the confirmation read the claim through its lock
    // (two GETs) instead of the cache the ADD had just written. The
    // lock is taken along (I14), before the claim: one request more.
    let api = FakeApi::default();
    let (n1, n2) = (Node::new(), Node::new());
    running(&api, "rs0-0", "n1");
    add(&api, Some(&n1), &req("peer-a", true, "rs0-0", "n1")).unwrap();
    api.pods.borrow_mut().clear();
    running(&api, "rs0-1", "n2");
    let r = req("peer-a", true, "rs0-1", "n2");
    let (g, mut calls) = counted(&api, || grants(&api, &n2, &r));
    assert!(g[0].unconfirmed);
    let (_, confirm) = counted(&api, || {
        let mut store = n2.store(&api);
        crate::store::retry::with_retries(&mut store, "confirm", |s| {
            crate::engine::plan_confirm(s, &[g[0].ip], &r.holder.container_id, "net1")
                .map(|p| (p, ()))
        })
        .unwrap()
    });
    assert_eq!(confirm.len(), 1, "one write: {confirm:?}");
    calls.extend(confirm);
    assert_eq!(calls.len(), 5, "{calls:?}");
    assert!(
        calls[2].starts_with("rekey lock ") && calls[3].starts_with("replace "),
        "{calls:?}"
    );
    let held = api.claims.borrow().values().next().unwrap().claim.clone();
    assert!(held.unconfirmed.is_none() && held.held_by(&r.holder.container_id, "net1"));
}
