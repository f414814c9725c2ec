//! Races around a tombstone or a re-key: an address a judgement freed is
//! never handed out fresh, and no node is left a lock it may delete under
//! another node's live claim.

use super::*;

/// n1's ADD reclaims the tombstone (exhausted pool: identity changes
/// at one IP); n2's next-fit lands right after n1's first write of
/// the lock. The address is never unlocked, so n2 finds it taken (or
/// gets it probed), never fresh.
#[test]
fn a_tombstone_reclaim_never_lets_another_nodes_next_fit_take_the_address_fresh() {
    let api = FakeApi::default();
    let (n1, n2, n3) = (Node::new(), Node::new(), Node::new());
    let ip = tombstone_on_the_only_address(&api, &n3);
    running(&api, "new1", "n1");
    running(&api, "new2", "n2");
    // n1 answers to the node-scope policy: n3's lock is re-keyed
    // naming n1.
    *api.node_scope.borrow_mut() = Some("n1".into());
    let stolen: Stolen = Default::default();
    after_lock_write(
        &api,
        lock_name("macnet", ip),
        n2s_add(n2.dir.clone(), stolen.clone()),
    );
    let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
    let g1 = grants_one(&api, &n1.dir, &r1);
    never_unprobed(&stolen, ip);
    let g1 = g1.unwrap();
    assert_eq!(g1[0].ip, ip);
    assert!(probed(&g1[0], &r1), "{g1:?}");
    locks_match(&api);
}

/// The same reclaim with the API gone after n1's first write of the
/// lock (and, second case, at the new claim's create): the address
/// stays locked; the next ADD elsewhere does not get it unprobed.
#[test]
fn a_timeout_in_the_middle_of_a_reclaim_leaves_the_address_locked() {
    for at_create in [false, true] {
        let api = FakeApi::default();
        let (n1, n2, n3) = (Node::new(), Node::new(), Node::new());
        let ip = tombstone_on_the_only_address(&api, &n3);
        running(&api, "new1", "n1");
        running(&api, "new2", "n2");
        let gone: crate::kube::fake::Race = Box::new(|api: &FakeApi| api.unreachable.set(true));
        if at_create {
            let name = claim_name("macnet", &dynamic_key("c-new1", "net1"), Family::V4);
            *api.before.borrow_mut() = Some((format!("create {name}"), gone));
        } else {
            after_lock_write(&api, lock_name("macnet", ip), gone);
        }
        let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
        assert!(grants_one(&api, &n1.dir, &r1).is_err());
        api.unreachable.set(false);
        assert!(
            api.locks.borrow().contains_key(&lock_name("macnet", ip)),
            "at_create {at_create}: {ip} was unlocked"
        );
        let r2 = req(&dynamic_key("c-new2", "net1"), false, "new2", "n2");
        if let Ok(g2) = grants_one(&api, &n2.dir, &r2) {
            assert_eq!(g2[0].ip, ip);
            assert!(
                probed(&g2[0], &r2),
                "at_create {at_create}: {ip} went to n2 unprobed: {g2:?}"
            );
        }
    }
}

/// n1 reclaims the tombstone and its probe hears web-0 answer: the
/// undo gives the address back to the tombstone. n2's next-fit lands
/// right after the undo's first write of the lock: it must not get
/// the address a probe has just heard answer, unprobed.
#[test]
fn an_undo_after_an_answered_probe_never_hands_the_address_out_fresh() {
    let api = FakeApi::default();
    let (n1, n2, n3) = (Node::new(), Node::new(), Node::new());
    let ip = tombstone_on_the_only_address(&api, &n3);
    running(&api, "new1", "n1");
    running(&api, "new2", "n2");
    let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
    let (done, g1) = {
        let mut store = n1.store(&api);
        let inspector = KubeInspector::new(&api, node("n1"));
        crate::store::retry::with_retries(&mut store, "ADD", |s| {
            plan_add(&one_conf(), s, &inspector, &r1)
        })
        .unwrap()
    };
    assert!(probed(&g1[0], &r1));
    // n1 answers to the node-scope policy: its re-key back names itself.
    *api.node_scope.borrow_mut() = Some("n1".into());
    let stolen: Stolen = Default::default();
    after_lock_write(
        &api,
        lock_name("macnet", ip),
        n2s_add(n2.dir.clone(), stolen.clone()),
    );
    let mut store = n1.store(&api);
    crate::store::retry::with_retries(&mut store, "undo", |s| {
        crate::engine::plan_undo(s, &done).map(|p| (p, ()))
    })
    .unwrap();
    never_unprobed(&stolen, ip);
    // The tombstone is back, marked, and its lock names it.
    let k0 = dynamic_key("c-web-0", "net1");
    let back = api.claims.borrow()[&claim_name("macnet", &k0, Family::V4)]
        .claim
        .clone();
    assert!(
        back.unconfirmed.is_some() && back.holder.is_none(),
        "{back:?}"
    );
    locks_match(&api);
}

/// The reclaim's failure points past its re-key: a claim delete that
/// fails gives the lock back to the tombstone (and the plan is made
/// again); a claim create that fails leaves the lock to the new
/// identity (an orphan: a reservation), never unlocked.
#[test]
fn a_reclaim_that_fails_after_its_rekey_keeps_the_address_locked() {
    let api = FakeApi::default();
    let (n1, n3) = (Node::new(), Node::new());
    let ip = tombstone_on_the_only_address(&api, &n3);
    let lock = lock_name("macnet", ip);
    let k0 = dynamic_key("c-web-0", "net1");
    running(&api, "new1", "n1");
    let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
    // The old claim's delete answers 409 once: the lock goes back to
    // the tombstone, and the retry reclaims it again.
    let old = claim_name("macnet", &k0, Family::V4);
    *api.before.borrow_mut() = Some((
        format!("delete {old}"),
        Box::new(|api: &FakeApi| api.inject_conflicts.set(1)),
    ));
    let (g1, calls) = counted(&api, || grants_one(&api, &n1.dir, &r1));
    assert!(probed(&g1.unwrap()[0], &r1));
    let lock_writes: Vec<&String> = calls
        .iter()
        .filter(|c| *c == &format!("rekey lock {lock}") || c.starts_with("delete "))
        .collect();
    assert_eq!(
        lock_writes,
        [
            &format!("rekey lock {lock}"),
            &format!("delete {old}"),
            &format!("rekey lock {lock}"),
            &format!("rekey lock {lock}"),
            &format!("delete {old}"),
        ],
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.starts_with("delete lock")),
        "{calls:?}"
    );
    locks_match(&api);

    // Undo it, with the tombstone's create refused: the lock stays,
    // the tombstone's identity's, and n1's claim is gone.
    let api = FakeApi::default();
    let (n1, n3) = (Node::new(), Node::new());
    let ip = tombstone_on_the_only_address(&api, &n3);
    running(&api, "new1", "n1");
    let (done, _) = {
        let mut store = n1.store(&api);
        let inspector = KubeInspector::new(&api, node("n1"));
        crate::store::retry::with_retries(&mut store, "ADD", |s| {
            plan_add(&one_conf(), s, &inspector, &r1)
        })
        .unwrap()
    };
    *api.before.borrow_mut() = Some((
        format!("create {old}"),
        Box::new(|api: &FakeApi| api.unreachable.set(true)),
    ));
    let mut store = n1.store(&api);
    let undone = crate::engine::plan_undo(&mut store, &done)
        .and_then(|p| store.commit(&p).map_err(crate::store::PlanError::from));
    api.unreachable.set(false);
    assert!(undone.is_err());
    let mut locks = api.locks.borrow_mut();
    let left = locks.get_mut(&lock_name("macnet", ip)).unwrap();
    assert_eq!(left.identity, k0, "{left:?}");
    assert!(api.claims.borrow().is_empty());
    // Issue 26 (left by the re-key): that orphan was re-keyed on a
    // judgement, so it is marked, and reconcile's sweep keeps it long
    // past the grace: a tombstone probed before its address is bound.
    assert!(left.unconfirmed.is_some(), "{left:?}");
    left.created = now_secs() - 3600;
    left.written = Some(left.created);
    drop(locks);
    let mut sweeper = KubeStore::new(&api, "macnet", None, vec![None]);
    let swept = sweeper.sweep_locks(ORPHAN_LOCK_GRACE_SECS).unwrap();
    assert_eq!(swept, LockSweep::default());
    let stone = sweeper.claim(ip).unwrap().unwrap();
    assert!(stone.is_tombstone(), "{stone:?}");
}

/// Issue 26 (the review of I7): a sticky identity whose holder on n1
/// is judged dead moves to an address its ADD on n2 asks for: n2 takes
/// the old claim over and leaves a tombstone on its address (a re-key,
/// under the node-scope policy), never a free address.
#[test]
fn an_identity_moving_from_a_dead_holder_elsewhere_leaves_a_tombstone() {
    let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
    *api.node_scope.borrow_mut() = Some("n1".into());
    running(&api, "db-0", "n1");
    let old = add(&api, Some(&n1), &req("db", true, "db-0", "n1")).unwrap()[0];
    // db-0 is re-created on n2 and asks for another address.
    *api.node_scope.borrow_mut() = Some("n2".into());
    let mut moved = req("db", true, "db-0b", "n2");
    moved.requested = vec!["10.0.0.15".parse().unwrap()];
    running(&api, "db-0b", "n2");
    api.pods.borrow_mut().remove("ns/db-0");
    let got = add(&api, Some(&n2), &moved).unwrap();
    assert_eq!(got, vec!["10.0.0.15".parse::<IpAddr>().unwrap()]);
    let mut store = KubeStore::new(&api, "macnet", None, vec![None]);
    let stone = store.claim(old).unwrap().unwrap();
    assert!(stone.is_tombstone(), "{stone:?}");
    assert_eq!(stone.identity, crate::identity::displaced_key("db", old));
    let lock = api.locks.borrow()[&lock_name("macnet", old)].clone();
    assert!(
        lock.unconfirmed.is_some() && lock.node.as_deref() == Some("n2"),
        "{lock:?}"
    );
    locks_match(&api);
}

/// Issue 26 item 6, found by the review of its fix: a node that
/// renames itself onto the lock of another node's live claim keeps it
/// marked through reconcile (the mark clears only for the node holding
/// the claim), and a sticky identity taken over on another node takes
/// its lock along, so the old node never has an unmarked lock to delete.
#[test]
fn no_node_is_left_a_deletable_lock_under_another_nodes_live_claim() {
    let (api, n2) = (FakeApi::default(), Node::new());
    *api.node_scope.borrow_mut() = Some("n2".into());
    running(&api, "db-0", "n2");
    let ip = add(&api, Some(&n2), &req("db", true, "db-0", "n2")).unwrap()[0];
    let name = lock_name("macnet", ip);
    // n1 renames itself onto n2's lock (allowed only marked).
    *api.node_scope.borrow_mut() = Some("n1".into());
    let theirs = api.locks.borrow()[&name].clone();
    let renamed = api.adopt_lock(&theirs, Some("n1")).unwrap();
    assert!(renamed.unconfirmed.is_some(), "{renamed:?}");
    *api.node_scope.borrow_mut() = None;
    let mut sweeper = KubeStore::new(&api, "macnet", None, vec![None]);
    let swept = sweeper.sweep_locks(ORPHAN_LOCK_GRACE_SECS).unwrap();
    assert_eq!(
        swept,
        LockSweep::default(),
        "reconcile cleared the renamer's mark"
    );
    *api.node_scope.borrow_mut() = Some("n1".into());
    let uid = renamed.uid.clone().unwrap();
    let e = api.delete_lock(&name, &uid, None).unwrap_err();
    assert!(matches!(e, ApiError::Refused(_)), "{e:?}");

    // db-0 moves to n1 (its pod on n2 gone): n1's takeover takes the
    // lock along, marked, so n2 has nothing of its own to delete.
    let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
    *api.node_scope.borrow_mut() = Some("n2".into());
    running(&api, "db-0", "n2");
    let ip = add(&api, Some(&n2), &req("db", true, "db-0", "n2")).unwrap()[0];
    api.pods.borrow_mut().clear();
    *api.node_scope.borrow_mut() = Some("n1".into());
    running(&api, "db-0b", "n1");
    assert_eq!(
        add(&api, Some(&n1), &req("db", true, "db-0b", "n1")).unwrap(),
        vec![ip]
    );
    let lock = api.locks.borrow()[&lock_name("macnet", ip)].clone();
    assert_eq!(lock.node.as_deref(), Some("n1"), "{lock:?}");
    assert!(lock.unconfirmed.is_some(), "{lock:?}");
    *api.node_scope.borrow_mut() = Some("n2".into());
    let e = api
        .delete_lock(&lock_name("macnet", ip), lock.uid.as_deref().unwrap(), None)
        .unwrap_err();
    assert!(matches!(e, ApiError::Refused(_)), "{e:?}");
    locks_match(&api);
}

/// Issue 26 item 6, closed in the data model: a lock that changed
/// hands from another node is marked, no node may delete a marked
/// lock, so its claim's own DEL leaves it a tombstone (no other node's
/// next-fit binds its address fresh) until reconcile, seeing the claim
/// confirmed, clears the mark.
#[test]
fn a_lock_taken_from_another_node_outlives_its_claim_until_reconcile_clears_it() {
    for reconcile_first in [false, true] {
        let api = FakeApi::default();
        let (n1, n3) = (Node::new(), Node::new());
        *api.node_scope.borrow_mut() = Some("n3".into());
        let ip = tombstone_on_the_only_address(&api, &n3);
        *api.node_scope.borrow_mut() = Some("n1".into());
        running(&api, "new1", "n1");
        let r1 = req(&dynamic_key("c-new1", "net1"), false, "new1", "n1");
        let g = grants_one(&api, &n1.dir, &r1).unwrap();
        assert_eq!(g[0].ip, ip);
        let name = lock_name("macnet", ip);
        let taken = api.locks.borrow()[&name].clone();
        assert_eq!(taken.node.as_deref(), Some("n1"));
        assert!(taken.unconfirmed.is_some(), "{taken:?}");
        // Its probe heard nobody: the plugin's confirmation.
        let mut store = n1.store(&api);
        let plan = crate::engine::plan_confirm(&mut store, &[ip], "c-new1", "net1").unwrap();
        store.commit(&plan).unwrap();
        drop(store);
        if reconcile_first {
            *api.node_scope.borrow_mut() = None;
            let mut sweeper = KubeStore::new(&api, "macnet", None, vec![None]);
            let swept = sweeper.sweep_locks(ORPHAN_LOCK_GRACE_SECS).unwrap();
            assert_eq!(swept.cleared, vec![ip]);
            *api.node_scope.borrow_mut() = Some("n1".into());
        }
        del(&api, &n1, "c-new1");
        assert!(api.claims.borrow().is_empty(), "the DEL freed its claim");
        let left = api.locks.borrow().get(&name).cloned();
        if reconcile_first {
            assert_eq!(left, None, "a confirmed lock is freed by its DEL");
            continue;
        }
        let left = left.expect("a marked lock outlives its claim");
        assert!(left.unconfirmed.is_some(), "{left:?}");
        // Until it is older than an ADD can take it reserves the
        // address for its identity (an ADD between a re-key and its
        // claim looks the same); say the pod ran for an hour.
        if let Some(l) = api.locks.borrow_mut().get_mut(&name) {
            l.written = Some(now_secs() - 3600);
            l.created = now_secs() - 3600;
        }
        // Another node's next ADD finds the address taken, and its
        // exhausted pool's reclaim probes it.
        let n2 = Node::new();
        *api.node_scope.borrow_mut() = Some("n2".into());
        running(&api, "new2", "n2");
        let r2 = req(&dynamic_key("c-new2", "net1"), false, "new2", "n2");
        let g = grants_one(&api, &n2.dir, &r2).unwrap();
        assert_eq!(g[0].ip, ip);
        assert!(probed(&g[0], &r2), "{g:?}");
    }
}

/// Under the node-scope policy a re-key names the node that writes it.
#[test]
fn a_rekey_naming_another_node_is_refused_under_node_scope() {
    let api = FakeApi::default();
    let n3 = Node::new();
    let ip = tombstone_on_the_only_address(&api, &n3);
    let read = api.locks.borrow()[&lock_name("macnet", ip)].clone();
    *api.node_scope.borrow_mut() = Some("n1".into());
    let judged = Unconfirmed {
        since: 1,
        why: "test".into(),
    };
    let e = api
        .rekey_lock(&read, "other", Some("n2"), &judged)
        .unwrap_err();
    assert!(matches!(e, ApiError::Refused(_)), "{e:?}");
    let got = api.rekey_lock(&read, "other", Some("n1"), &judged).unwrap();
    assert_eq!(
        (got.identity.as_str(), got.node.as_deref()),
        ("other", Some("n1"))
    );
    assert!(got.unconfirmed.is_some(), "a re-key marks the lock");
    // At the version read, once: the next one conflicts.
    let e = api
        .rekey_lock(&read, "third", Some("n1"), &judged)
        .unwrap_err();
    assert!(matches!(e, ApiError::Conflict(_)), "{e:?}");
}

#[test]
fn request_counts_on_the_common_paths() {
    let api = FakeApi::default();
    let n1 = Node::new();
    running(&api, "rs0-0", "n1");
    // Sticky, first ADD ever: look for the identity's claim, lock, claim.
    let (first, calls) = counted(&api, || {
        add(&api, Some(&n1), &req("peer-a", true, "rs0-0", "n1")).unwrap()
    });
    assert_eq!(calls.len(), 3, "{calls:?}");
    // Same pod, new sandbox: one write, on the cached resourceVersion.
    let mut again = req("peer-a", true, "rs0-0", "n1");
    again.holder.container_id = "c-new".into();
    let (second, calls) = counted(&api, || add(&api, Some(&n1), &again).unwrap());
    assert_eq!(second, first);
    assert_eq!(
        calls,
        vec![format!(
            "replace {}",
            claim_name("macnet", "peer-a", Family::V4)
        )]
    );
    // DEL: one write (sticky: reserved).
    let ((), calls) = counted(&api, || del(&api, &n1, "c-new"));
    assert_eq!(calls.len(), 1, "{calls:?}");
    let stored = api.claims.borrow().values().next().cloned().unwrap();
    assert!(stored.claim.holder.is_none() && stored.claim.sticky);
    // A second DEL of the same attachment: nothing to ask.
    let ((), calls) = counted(&api, || del(&api, &n1, "c-new"));
    assert!(calls.is_empty(), "{calls:?}");
    // Dynamic: lock and claim; its DEL deletes both.
    let key = dynamic_key("c-web", "net1");
    let (_, calls) = counted(&api, || {
        add(&api, Some(&n1), &req(&key, false, "web", "n1")).unwrap()
    });
    assert_eq!(calls.len(), 2, "{calls:?}");
    let ((), calls) = counted(&api, || del(&api, &n1, "c-web"));
    assert_eq!(calls.len(), 2, "{calls:?}");
    // Takeover on another node, old pod gone: the claim, the old pod, one write.
    api.pods.borrow_mut().clear();
    running(&api, "rs0-1", "n2");
    let n2 = Node::new();
    let (moved, calls) = counted(&api, || {
        add(&api, Some(&n2), &req("peer-a", true, "rs0-1", "n2")).unwrap()
    });
    assert_eq!(moved, first);
    assert_eq!(
        calls.len(),
        2,
        "the claim is reserved, so no pod lookup: {calls:?}"
    );
    locks_match(&api);
    // No listing anywhere on these paths.
    assert_eq!(api.count("list"), 0);
}
