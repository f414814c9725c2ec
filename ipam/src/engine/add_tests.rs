use super::*;
use crate::claim::{Claim, Holder};
use crate::engine::plan_del;
use crate::engine::test_support::*;
use crate::liveness::{Caller, Inspector, Verdict};
use crate::store::memory::MemoryStore;
use cni::{code, CniError, Refusal};
use serde_json::json;

#[test]
fn an_exhausted_pool_reclaims_sticky_claims_of_deleted_owners() {
    struct Retired;
    impl Inspector for Retired {
        fn verdict(&self, h: &Holder, _c: Option<&Caller>) -> Verdict {
            if h.container_id == "e" {
                Verdict::Alive("running".into())
            } else {
                Verdict::Dead("gone".into())
            }
        }
        fn owner_retired(&self, o: &crate::claim::Owner, identity: &str) -> Option<String> {
            use crate::retention::{retired, OwnerState};
            let state = if o.name == "old" {
                OwnerState::Missing
            } else {
                OwnerState::Unknown
            };
            retired(o, identity, &state)
        }
    }
    let c = small(); // four addresses
    let mut s = MemoryStore::default();
    let alive = Alive(vec!["a", "b", "c", "d"]);
    for (i, set) in ["keep", "keep", "old", "keep"].iter().enumerate() {
        let mut r = req(&format!("ns/db-{i}"), true, &format!("c{i}"));
        r.identity.owner = Some(crate::claim::Owner {
            kind: "StatefulSet".into(),
            namespace: "ns".into(),
            name: (*set).into(),
            uid: "u".into(),
            retention: Default::default(),
        });
        add(&c, &mut s, &alive, &r).unwrap();
        del(&mut s, &format!("c{i}"));
    }
    let g = add(&c, &mut s, &Retired, &req("new", false, "e")).unwrap();
    assert_eq!(ips(&g), ["10.0.0.12"]);
    let note = g[0].took_over.as_deref().unwrap_or_default();
    assert!(note.contains("StatefulSet ns/old was deleted"), "{note}");
    // With only live owners left, the sticky claims stay reserved.
    let e = add(&c, &mut s, &Retired, &req("new2", false, "f")).unwrap_err();
    assert!(e.msg.contains("reserved by sticky identities"), "{}", e.msg);
}

#[test]
fn a_full_pool_names_the_reservation_that_holds_an_address_back() {
    let c = conf(json!({
        "subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.12",
        "reservations": {"peer-b": "10.0.0.12"}
    }));
    let mut s = MemoryStore::default();
    let alive = Alive(vec!["a", "b", "c"]);
    add(&c, &mut s, &alive, &req("a", false, "a")).unwrap();
    add(&c, &mut s, &alive, &req("b", false, "b")).unwrap();
    let e = add(&c, &mut s, &alive, &req("c", false, "c")).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert_eq!(e.refusal, Some(Refusal::PoolExhausted));
    assert!(
        e.msg.contains("2 claimed, 2 by live holders")
            && e.msg
                .contains("1 held back by ipam.reservations (10.0.0.12 for \"peer-b\")"),
        "{}",
        e.msg
    );
}

#[test]
fn a_second_claim_of_one_identity_is_dropped_on_its_next_add() {
    let c = conf(json!({"subnet": "10.0.0.0/24"}));
    let mut s = MemoryStore::default();
    let twin = |s: &mut MemoryStore, ip: &str, cid: &str| {
        let mut claim = Claim {
            ip: ip.parse().unwrap(),
            identity: "peer".into(),
            sticky: true,
            holder: Some(holder(cid)),
            owner: None,
            namespace: None,
            created: 1,
            updated: 1,
            unconfirmed: None,
        };
        if cid.is_empty() {
            claim.holder = None;
        }
        s.claims.insert(claim.ip, claim);
    };
    twin(&mut s, "10.0.0.5", "old");
    twin(&mut s, "10.0.0.9", "");
    let alive = Alive(vec!["new"]);
    let g = add(&c, &mut s, &alive, &req("peer", true, "new")).unwrap();
    assert_eq!(ips(&g), ["10.0.0.5"]);
    assert_eq!(s.claims.len(), 1);
    assert_invariants(&s);
    // A live holder of the extra claim is not robbed: refused instead.
    twin(&mut s, "10.0.0.9", "other");
    let alive = Alive(vec!["new", "other"]);
    let e = add(&c, &mut s, &alive, &req("peer", true, "new")).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert_eq!(s.claims.len(), 2);
}

#[test]
fn grants_say_whom_they_displaced() {
    let c = small();
    let mut s = MemoryStore::default();
    add(&c, &mut s, &Alive(vec![]), &req("peer", true, "a")).unwrap();
    // Another pod takes it over (a is dead): displaced, from another pod.
    let g = add(&c, &mut s, &Alive(vec![]), &req("peer", true, "b")).unwrap();
    assert_eq!(
        g[0].displaced.as_ref().map(|h| h.container_id.as_str()),
        Some("a")
    );
    assert_eq!(g[0].origin, Origin::TakenOver);
    // The same pod's new sandbox: displaced, but not another pod.
    let mut same = req("peer", true, "b2");
    same.caller.pod_uid = Some("uid-b".into());
    same.holder.pod_uid = Some("uid-b".into());
    let g = add(&c, &mut s, &Alive(vec!["b"]), &same).unwrap();
    assert!(g[0].displaced.is_some());
    assert_eq!(g[0].origin, Origin::SamePod { node: "n1".into() });
    // A retried ADD by the holder displaces nobody.
    let g = add(&c, &mut s, &Alive(vec!["b2"]), &same).unwrap();
    assert!(g[0].displaced.is_none());
    assert_eq!(g[0].origin, Origin::SameAttachment);
    // After its DEL the sticky claim is unheld; a fresh identity is fresh.
    let del = plan_del(&mut s, "b2", "net1", 200).unwrap();
    crate::store::ClaimStore::commit(&mut s, &del).unwrap();
    let g = add(&c, &mut s, &Alive(vec![]), &same).unwrap();
    assert_eq!(g[0].origin, Origin::Unheld);
    let g = add(&c, &mut s, &Alive(vec![]), &req("other", true, "z")).unwrap();
    assert_eq!(g[0].origin, Origin::Fresh);
}

#[test]
fn next_fit_walks_on_and_skips_gateway_and_taken() {
    let c = conf(json!({"subnet": "10.0.0.0/29"}));
    let mut s = MemoryStore::default();
    let a = Alive(vec!["a", "b", "c", "d", "e", "f"]);
    let got: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|cid| {
            ips(&add(&c, &mut s, &a, &req(&format!("id-{cid}"), false, cid)).unwrap())[0].clone()
        })
        .collect();
    // .0 network, .1 gateway (host-local default), .7 broadcast.
    assert_eq!(got, ["10.0.0.2", "10.0.0.3", "10.0.0.4"]);
    // A freed address is not handed straight back out.
    del(&mut s, "a");
    let next = add(&c, &mut s, &a, &req("id-d", false, "d")).unwrap();
    assert_eq!(ips(&next), ["10.0.0.5"]);
    let next = add(&c, &mut s, &a, &req("id-e", false, "e")).unwrap();
    assert_eq!(ips(&next), ["10.0.0.6"]);
    let wrapped = add(&c, &mut s, &a, &req("id-f", false, "f")).unwrap();
    assert_eq!(
        ips(&wrapped),
        ["10.0.0.2"],
        "wraps to the freed address last"
    );
    assert_invariants(&s);
}

#[test]
fn sticky_identity_keeps_its_address_across_del_and_others() {
    let c = small();
    let mut s = MemoryStore::default();
    let a = Alive(vec!["p1", "x", "y"]);
    let first = add(&c, &mut s, &a, &req("db-0", true, "p1")).unwrap();
    del(&mut s, "p1");
    assert!(
        s.claims.values().all(|c| c.holder.is_none()),
        "released, still reserved"
    );
    add(&c, &mut s, &a, &req("other-1", true, "x")).unwrap();
    add(&c, &mut s, &a, &req("other-2", false, "y")).unwrap();
    let again = add(&c, &mut s, &a, &req("db-0", true, "p2")).unwrap();
    assert_eq!(ips(&first), ips(&again));
    assert_invariants(&s);
}

#[test]
fn a_retried_add_is_idempotent_and_writes_nothing() {
    let c = small();
    let mut s = MemoryStore::default();
    let a = Alive(vec!["p1"]);
    let r = req("db-0", true, "p1");
    let one = add(&c, &mut s, &a, &r).unwrap();
    let (plan, two) = plan_add(&c, &mut s, &a, &r).unwrap();
    assert!(plan.is_empty(), "{plan:?}");
    assert_eq!(one[0].origin, Origin::Fresh);
    // The same grant, now known to be this attachment's own.
    let mut same = one.clone();
    same[0].origin = Origin::SameAttachment;
    assert_eq!(same, two);
}

#[test]
fn live_holder_refuses_with_code_11_and_changes_nothing() {
    let c = small();
    let mut s = MemoryStore::default();
    let a = Alive(vec!["p1", "p2"]);
    add(&c, &mut s, &a, &req("peer-a", true, "p1")).unwrap();
    let before = s.claims.clone();
    let e = add(&c, &mut s, &a, &req("peer-a", true, "p2")).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert_eq!(e.refusal, Some(Refusal::HolderAlive));
    assert!(
        e.msg.contains("10.0.0.10")
            && e.msg.contains("pod ns/p1")
            && e.msg.contains("still exists"),
        "{}",
        e.msg
    );
    assert_eq!(s.claims, before);
}

#[test]
fn dead_holder_or_same_pod_is_taken_over_and_its_late_del_is_a_no_op() {
    let c = small();
    let mut s = MemoryStore::default();
    add(&c, &mut s, &Alive(vec![]), &req("peer-a", true, "old")).unwrap();
    let g = add(&c, &mut s, &Alive(vec![]), &req("peer-a", true, "new")).unwrap();
    assert!(g[0]
        .took_over
        .as_deref()
        .unwrap()
        .contains("no longer exists"));
    del(&mut s, "old");
    assert_eq!(
        s.claims
            .values()
            .next()
            .unwrap()
            .holder
            .as_ref()
            .unwrap()
            .container_id,
        "new"
    );
    // Same pod UID, new sandbox: taken over even though the old netns lives.
    let mut r = req("peer-a", true, "newer");
    r.caller.pod_uid = Some("uid-new".into());
    let g = add(&c, &mut s, &Alive(vec!["new"]), &r).unwrap();
    assert!(g[0].took_over.as_deref().unwrap().contains("same pod"));
}

#[test]
fn exhausted_pool_reclaims_dead_dynamic_claims_only() {
    let c = small();
    let mut s = MemoryStore::default();
    let everyone = Alive(vec!["a", "b", "c", "d"]);
    add(&c, &mut s, &everyone, &req("sticky-a", true, "a")).unwrap();
    for cid in ["b", "c", "d"] {
        add(
            &c,
            &mut s,
            &everyone,
            &req(&format!("dyn-{cid}"), false, cid),
        )
        .unwrap();
    }
    let e = add(&c, &mut s, &everyone, &req("dyn-e", false, "e")).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert_eq!(e.refusal, Some(Refusal::PoolExhausted));
    assert!(
        e.msg.contains("10.0.0.10-10.0.0.13")
            && e.msg.contains("\"net\"")
            && e.msg.contains("4 by live holders"),
        "{}",
        e.msg
    );
    // a (sticky) and c (dynamic) die: only c's address is reclaimed.
    let some_dead = Alive(vec!["b", "d"]);
    let g = add(&c, &mut s, &some_dead, &req("dyn-e", false, "e")).unwrap();
    assert_eq!(ips(&g), ["10.0.0.12"]);
    assert!(g[0].reclaimed, "the pod is told it was reclaimed");
    assert!(g[0]
        .took_over
        .as_deref()
        .unwrap()
        .contains("pool exhausted"));
    let e = add(
        &c,
        &mut s,
        &Alive(vec!["b", "d", "e"]),
        &req("dyn-f", false, "f"),
    )
    .unwrap_err();
    assert!(
        e.msg
            .contains("1 reserved by sticky identities without a live holder (sticky-a)"),
        "{}",
        e.msg
    );
    assert_invariants(&s);
}

#[test]
fn reservations_and_requests() {
    let c = conf(
        json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.20",
                        "reservations": {"peer-a": "10.0.0.15"}}),
    );
    let mut s = MemoryStore::default();
    let a = Alive(vec!["p1", "p2", "p3"]);
    assert_eq!(
        ips(&add(&c, &mut s, &a, &req("peer-a", true, "p1")).unwrap()),
        ["10.0.0.15"]
    );
    let mut r = req("web", false, "p2");
    r.requested = vec!["10.0.0.18".parse().unwrap()];
    assert_eq!(ips(&add(&c, &mut s, &a, &r).unwrap()), ["10.0.0.18"]);
    // Reserved addresses are never handed to others by next-fit.
    let mut s2 = MemoryStore::default();
    s2.cursors.insert(0, "10.0.0.14".parse().unwrap());
    assert_eq!(
        ips(&add(&c, &mut s2, &a, &req("x", false, "p3")).unwrap()),
        ["10.0.0.16"]
    );
    for (ip, want) in [
        ("10.0.0.15", "reserved for identity \"peer-a\""),
        ("10.0.1.5", "outside every range"),
        ("10.0.0.18", "held by"),
    ] {
        let mut r = req("y", false, "p3");
        r.requested = vec![ip.parse().unwrap()];
        let e = CniError::from(plan_add(&c, &mut s, &a, &r).unwrap_err());
        assert!(e.msg.contains(want), "{ip}: {}", e.msg);
    }
}

#[test]
fn a_requested_address_moves_the_identity() {
    let c = small();
    let mut s = MemoryStore::default();
    let a = Alive(vec!["p1"]);
    add(&c, &mut s, &a, &req("db", true, "p1")).unwrap();
    let mut r = req("db", true, "p1");
    r.requested = vec!["10.0.0.12".parse().unwrap()];
    assert_eq!(ips(&add(&c, &mut s, &a, &r).unwrap()), ["10.0.0.12"]);
    assert_eq!(s.claims.len(), 1);
    assert_invariants(&s);
}

/// Issue 26 (the review of I7): an identity that leaves an address whose
/// holder was only judged dead, or whose mark no probe has cleared, leaves
/// a tombstone there, and the next grant of that address is probed; one
/// whose holder released it, or is the caller, frees it.
#[test]
fn an_identity_leaving_an_unconfirmed_address_leaves_a_tombstone() {
    let c = small();
    let requested = |cid: &str| {
        let mut r = req("db", true, cid);
        r.requested = vec!["10.0.0.12".parse().unwrap()];
        r
    };
    let outside = conf(
        json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.12", "rangeEnd": "10.0.0.13", "gateway": "10.0.0.1"}),
    );
    // (how the identity moves on, the caller, whether the old holder was
    // only judged dead, whether 10.0.0.10 stays a tombstone)
    type Leave = Box<dyn Fn(&mut MemoryStore) -> Vec<Grant>>;
    let cases: Vec<(&str, Leave, bool)> = vec![
        (
            "a requested address, the old holder judged dead",
            Box::new(move |s| add(&small(), s, &Alive(vec![]), &requested("p2")).unwrap()),
            true,
        ),
        (
            "a requested address, asked by the holder itself",
            Box::new(move |s| add(&small(), s, &Alive(vec!["p1"]), &requested("p1")).unwrap()),
            false,
        ),
        (
            "the ranges no longer hold it, the old holder judged dead",
            Box::new(move |s| add(&outside, s, &Alive(vec![]), &req("db", true, "p2")).unwrap()),
            true,
        ),
    ];
    for (case, leave, stays) in cases {
        let mut s = MemoryStore::default();
        add(&c, &mut s, &Alive(vec![]), &req("db", true, "p1")).unwrap();
        let old: std::net::IpAddr = "10.0.0.10".parse().unwrap();
        let g = leave(&mut s);
        assert_ne!(g[0].ip, old, "{case}");
        assert_eq!(
            s.claims.get(&old).is_some_and(|t| t.is_tombstone()),
            stays,
            "{case}: {:?}",
            s.claims
        );
        assert_invariants(&s);
        if !stays {
            continue;
        }
        // The pool runs out: the tombstone's address is reclaimed, probed.
        let live = Alive(vec!["p1", "p2", "f1", "f2"]);
        for cid in ["f1", "f2"] {
            add(&c, &mut s, &live, &req(cid, false, cid)).unwrap();
        }
        let r = req("late", false, "f3");
        let g = add(&c, &mut s, &live, &r);
        let g = g.unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(g[0].ip, old, "{case}");
        assert!(
            probed(&g[0], &r, crate::probe_policy::StoreScope::Cluster),
            "{case}: {g:?}"
        );
    }
}

#[test]
fn dual_stack_is_all_or_nothing() {
    let c = conf(json!({"ranges": [
        [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.11"}],
        [{"subnet": "fd00::/64", "rangeStart": "fd00::10", "rangeEnd": "fd00::10"}]]}));
    let mut s = MemoryStore::default();
    let a = Alive(vec!["p1", "p2"]);
    assert_eq!(
        ips(&add(&c, &mut s, &a, &req("a", true, "p1")).unwrap()),
        ["10.0.0.10", "fd00::10"]
    );
    let before = s.claims.clone();
    let e = add(&c, &mut s, &a, &req("b", true, "p2")).unwrap_err();
    assert!(e.msg.contains("fd00::10-fd00::10"), "{}", e.msg);
    assert_eq!(s.claims, before, "the v4 address was not taken either");
}

#[test]
fn huge_v6_range_allocates_without_enumerating() {
    let c = conf(json!({"subnet": "fd00::/48"}));
    let mut s = MemoryStore::default();
    let a = Alive(vec![]);
    assert_eq!(
        ips(&add(&c, &mut s, &a, &req("a", false, "p1")).unwrap()),
        ["fd00::2"]
    );
}

#[test]
fn damaged_records_are_skipped_by_next_fit() {
    let c = small();
    let mut s = MemoryStore {
        damaged: vec!["10.0.0.10".parse().unwrap()],
        ..MemoryStore::default()
    };
    assert_eq!(
        ips(&add(&c, &mut s, &Alive(vec![]), &req("a", false, "p1")).unwrap()),
        ["10.0.0.11"]
    );
}
