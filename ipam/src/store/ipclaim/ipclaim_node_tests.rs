//! One node's ADDs of a network at once (issue 29): the node-local
//! record's flock is not held across a request, so they do not take turns
//! for each other's round trips, and they try different candidates.

use super::*;
use std::os::unix::io::AsRawFd;

/// Whether another open of `path` could take its flock now (it is free).
fn flock_free(path: &std::path::Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return true;
    };
    // SAFETY: flock on a descriptor we own, released when it is closed.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

#[test]
fn a_commit_leaves_the_record_unlocked_but_holds_its_address_across_its_requests() {
    let (api, n1) = (FakeApi::default(), Node::new());
    running(&api, "a", "n1");
    let r = req("peer", true, "a", "n1");
    let mut store = n1.store(&api);
    let inspector = KubeInspector::new(&api, node("n1"));
    let (plan, grants) = plan_add(&conf(), &mut store, &inspector, &r).unwrap();
    let ip = grants[0].ip;
    let seen = std::rc::Rc::new(std::cell::Cell::new(None));
    let (root, out) = (n1.dir.join("macnet"), seen.clone());
    *api.before.borrow_mut() = Some((
        "create lock".into(),
        Box::new(move |_: &FakeApi| {
            out.set(Some((
                flock_free(&root.join("lock")),
                flock_free(&root.join("holds").join(ip.to_string())),
            )))
        }),
    ));
    store.commit(&plan).unwrap();
    let (record_free, address_free) = seen.get().expect("the lock create was made");
    assert!(
        record_free,
        "the node-local record stayed locked while the request was out"
    );
    assert!(
        !address_free,
        "{ip} was not held while its claim was written"
    );
    assert!(flock_free(
        &n1.dir.join("macnet/holds").join(ip.to_string())
    ));
}

#[test]
fn two_adds_on_one_node_planned_at_once_try_different_addresses() {
    let (api, n1) = (FakeApi::default(), Node::new());
    running(&api, "a", "n1");
    running(&api, "b", "n1");
    let (ra, rb) = (
        req(&dynamic_key("c-a", "net1"), false, "a", "n1"),
        req(&dynamic_key("c-b", "net1"), false, "b", "n1"),
    );
    let inspector = KubeInspector::new(&api, node("n1"));
    let (mut store_a, mut store_b) = (n1.store(&api), n1.store(&api));
    let (plan_a, got_a) = plan_add(&conf(), &mut store_a, &inspector, &ra).unwrap();
    let (plan_b, got_b) = plan_add(&conf(), &mut store_b, &inspector, &rb).unwrap();
    assert_ne!(got_a[0].ip, got_b[0].ip, "both tried one candidate");
    let (_, calls) = counted(&api, || {
        store_b.commit(&plan_b).unwrap();
        store_a.commit(&plan_a).unwrap();
    });
    assert_eq!(calls.len(), 4, "two creates each, no collision: {calls:?}");
    locks_match(&api);
    drop((store_a, store_b));
    let inflight = n1.dir.join("macnet/inflight");
    let left = std::fs::read_dir(&inflight).map_or(0, |d| d.count());
    assert_eq!(left, 0, "reservations left in {}", inflight.display());
    // The one that finished last did not move the cursor back onto the
    // other's address: the next ADD's first candidate is free.
    running(&api, "c", "n1");
    let rc = req(&dynamic_key("c-c", "net1"), false, "c", "n1");
    let (got_c, calls) = counted(&api, || add(&api, Some(&n1), &rc).unwrap());
    assert_eq!(calls.len(), 2, "a collision after the burst: {calls:?}");
    assert!(![got_a[0].ip, got_b[0].ip].contains(&got_c[0]));
}

#[test]
fn a_reservation_is_only_a_hint_the_lock_create_still_decides() {
    // Another node's ADD takes the candidate this node reserved: the
    // reservation does not make it ours, the 409 sends us on.
    let (api, n1, n2) = (FakeApi::default(), Node::new(), Node::new());
    running(&api, "a", "n1");
    running(&api, "b", "n2");
    let ra = req(&dynamic_key("c-a", "net1"), false, "a", "n1");
    let inspector = KubeInspector::new(&api, node("n1"));
    let mut store_a = n1.store(&api);
    let (plan_a, got_a) = plan_add(&conf(), &mut store_a, &inspector, &ra).unwrap();
    let rb = req(&dynamic_key("c-b", "net1"), false, "b", "n2");
    assert_eq!(add(&api, Some(&n2), &rb).unwrap(), vec![got_a[0].ip]);
    let e = store_a.commit(&plan_a).unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    drop(store_a);
    let again = add(&api, Some(&n1), &ra).unwrap();
    assert_ne!(again[0], got_a[0].ip);
    locks_match(&api);
    assert_eq!(per_identity(&api).len(), 2);
}

#[test]
fn addresses_another_add_is_trying_do_not_make_the_pool_exhausted() {
    // The only address is reserved by another ADD of the node, still in
    // flight: this one plans again later, it is not told the pool is full.
    let (api, n1) = (FakeApi::default(), Node::new());
    running(&api, "a", "n1");
    running(&api, "b", "n1");
    let inspector = KubeInspector::new(&api, node("n1"));
    let (mut store_a, mut store_b) = (n1.store(&api), n1.store(&api));
    let ra = req(&dynamic_key("c-a", "net1"), false, "a", "n1");
    let rb = req(&dynamic_key("c-b", "net1"), false, "b", "n1");
    let (plan_a, _) = plan_add(&one_conf(), &mut store_a, &inspector, &ra).unwrap();
    let e = plan_add(&one_conf(), &mut store_b, &inspector, &rb).unwrap_err();
    assert!(
        matches!(e, crate::store::PlanError::Store(StoreError::Conflict(_))),
        "{e:?}"
    );
    store_a.commit(&plan_a).unwrap();
    drop(store_a);
    // Once that ADD is done, the pool is full for real, and says so.
    store_b.conflicted().unwrap();
    let e = crate::store::retry::with_retries(&mut store_b, "ADD", |s| {
        plan_add(&one_conf(), s, &inspector, &rb)
    })
    .unwrap_err();
    let e = CniError::from(e);
    assert!(e.msg.contains("no free address"), "{e:?}");
}
