use super::*;
use crate::claim::Holder;
use crate::engine::plan_add;
use crate::engine::test_support::*;
use crate::liveness::{Caller, Inspector, Verdict};
use crate::store::memory::MemoryStore;
use crate::store::ClaimStore;
use cni::code;
use cni::CniError;

#[test]
fn retired_owners_free_their_sticky_claims_once_unheld() {
    /// Containers listed are alive; the StatefulSet "db" was deleted.
    struct DbGone(Alive);
    impl Inspector for DbGone {
        fn verdict(&self, h: &Holder, c: Option<&Caller>) -> Verdict {
            self.0.verdict(h, c)
        }
        fn owner_retired(&self, o: &crate::claim::Owner, identity: &str) -> Option<String> {
            use crate::retention::{retired, OwnerState};
            let state = if o.name == "db" {
                OwnerState::Missing
            } else {
                OwnerState::Unknown
            };
            retired(o, identity, &state)
        }
    }
    let c = small();
    let mut s = MemoryStore::default();
    let alive = DbGone(Alive(vec!["a"]));
    let owner = |name: &str| crate::claim::Owner {
        kind: "StatefulSet".into(),
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        retention: Default::default(),
    };
    for (id, cid, set) in [
        ("ns/db-0", "a", "db"),
        ("ns/db-1", "b", "db"),
        ("ns/web-0", "c", "web"),
    ] {
        let mut r = req(id, true, cid);
        r.identity.owner = Some(owner(set));
        add(&c, &mut s, &alive, &r).unwrap();
    }
    let (plan, out) = plan_retire(&mut s, &alive, 1).unwrap();
    // db-0's holder is alive: kept until it goes; db-1's is dead.
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].identity, "ns/db-1");
    assert!(out[0].why.contains("StatefulSet ns/db was deleted"));
    s.commit(&plan).unwrap();
    // db-1's identity is gone; its address waits for a probe.
    let db1 = s.claims.values().find(|c| c.identity == "ns/db-1").unwrap();
    assert!(db1.is_tombstone(), "{db1:?}");
    assert!(db1.owner.is_none());
    // A tombstone is not retired twice.
    let (again, out) = plan_retire(&mut s, &alive, 2).unwrap();
    assert!(again.is_empty() && out.is_empty(), "{out:?}");
    // db-0's holder leaves by its own DEL: proven free, deleted outright.
    let del = plan_del(&mut s, "a", "net1", 3).unwrap();
    s.commit(&del).unwrap();
    let (plan, out) = plan_retire(&mut s, &alive, 4).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(plan.changes[0].after.is_none(), "{plan:?}");
}

#[test]
fn retention_keeps_or_retires_the_claims_of_scaled_and_deleted_statefulsets() {
    use crate::claim::{Owner, Retention, RetentionPolicy::*};
    use crate::retention::{retired, OwnerState, StatefulSetFacts};
    /// "web" has 1 replica now; "db" was deleted.
    struct Scripted;
    impl Inspector for Scripted {
        fn verdict(&self, _h: &Holder, _c: Option<&Caller>) -> Verdict {
            Verdict::Dead("gone".into())
        }
        fn owner_retired(&self, o: &Owner, identity: &str) -> Option<String> {
            let state = match o.name.as_str() {
                "web" => OwnerState::Present(StatefulSetFacts {
                    uid: "uid-web".into(),
                    replicas: 1,
                    ordinal_start: 0,
                }),
                _ => OwnerState::Missing,
            };
            retired(o, identity, &state)
        }
    }
    // (identity, set, retention, retired)
    let cases = [
        (
            "ns/web-0",
            "web",
            Retention {
                when_scaled: Delete,
                when_deleted: Retain,
            },
            false,
        ),
        (
            "ns/web-1",
            "web",
            Retention {
                when_scaled: Delete,
                when_deleted: Retain,
            },
            true,
        ),
        ("ns/db-0", "db", Retention::default(), true),
        (
            "ns/db-1",
            "db",
            Retention {
                when_scaled: Delete,
                when_deleted: Retain,
            },
            false,
        ),
    ];
    let c = small();
    let mut s = MemoryStore::default();
    for (i, (id, set, retention, _)) in cases.iter().enumerate() {
        let mut r = req(id, true, &format!("c{i}"));
        r.identity.owner = Some(Owner {
            kind: crate::pod::STATEFUL_SET.into(),
            namespace: "ns".into(),
            name: (*set).into(),
            uid: format!("uid-{set}"),
            retention: *retention,
        });
        add(&c, &mut s, &Alive(vec![]), &r).unwrap();
    }
    let (plan, out) = plan_retire(&mut s, &Scripted, 1).unwrap();
    let gone: Vec<&str> = out.iter().map(|r| r.identity.as_str()).collect();
    let want: Vec<&str> = cases.iter().filter(|c| c.3).map(|c| c.0).collect();
    assert_eq!(gone, want, "{out:?}");
    assert!(
        out[0]
            .why
            .contains("replicas: 1 (ordinals 0..=0): ordinal 1 was scaled away"),
        "{}",
        out[0].why
    );
    assert!(out[1].why.contains("was deleted"), "{}", out[1].why);
    s.commit(&plan).unwrap();
    // Their holders were judged dead, not DEL'd: each address stays as a
    // tombstone, to be probed before it is bound again.
    let kept: Vec<&str> = s
        .claims
        .values()
        .filter(|c| !c.is_tombstone())
        .map(|c| c.identity.as_str())
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    for id in want {
        assert!(!kept.contains(&id), "{id} retired");
    }
    assert!(s.claims.values().filter(|c| c.is_tombstone()).all(|c| c
        .unconfirmed
        .as_ref()
        .is_some_and(|u| u.why.contains("retirement"))));
}

#[test]
fn del_gc_reconcile_and_undo() {
    let c = small();
    let mut s = MemoryStore::default();
    let a = Alive(vec!["p1", "p2", "p3"]);
    add(&c, &mut s, &a, &req("sticky", true, "p1")).unwrap();
    add(&c, &mut s, &a, &req("dyn", false, "p2")).unwrap();
    // DEL by a stranger is a no-op.
    assert!(plan_del(&mut s, "stranger", "net1", 1).unwrap().is_empty());
    // GC keeps p1 only: p2's dynamic claim is released on the runtime's
    // word, so its address stays as a tombstone until a probe confirms it.
    let keep: BTreeSet<(String, String)> = [("p1".to_string(), "net1".to_string())].into();
    let gc = plan_gc(&mut s, "n1", &keep, 1).unwrap();
    s.commit(&gc).unwrap();
    let dynamic = s.claims.values().find(|c| c.identity == "dyn").unwrap();
    assert!(dynamic.is_tombstone(), "{dynamic:?}");
    assert!(dynamic.unconfirmed.as_ref().unwrap().why.contains("CNI GC"));
    // Reconcile leaves a tombstone alone (deleting it would free the
    // address unconfirmed).
    let (plan, released, _) = plan_reconcile(&mut s, &a, 1).unwrap();
    assert!(plan.is_empty() && released.is_empty(), "{released:?}");
    s.claims.retain(|_, c| c.identity != "dyn");
    // GC for another node touches nothing.
    assert!(plan_gc(&mut s, "n2", &BTreeSet::new(), 1)
        .unwrap()
        .is_empty());
    // Reconcile: p1 dies -> released but still reserved to "sticky",
    // marked for the wire.
    let (plan, released, alive) = plan_reconcile(&mut s, &Alive(vec![]), 1).unwrap();
    assert_eq!((released.len(), alive), (1, 0));
    s.commit(&plan).unwrap();
    let sticky = s.claims.values().next().unwrap();
    assert!(sticky.holder.is_none() && sticky.sticky);
    assert!(sticky
        .unconfirmed
        .as_ref()
        .unwrap()
        .why
        .contains("reconcile"));
    // Undo of a takeover restores the old holder exactly.
    let before = s.claims.clone();
    let (plan, _) = plan_add(&c, &mut s, &a, &req("sticky", true, "p3")).unwrap();
    s.commit(&plan).unwrap();
    let undo = plan_undo(&mut s, &plan).unwrap();
    s.commit(&undo).unwrap();
    assert_eq!(s.claims, before);
}

#[test]
fn an_operator_release_is_planned_like_any_other_change() {
    let c = small();
    let mut s = MemoryStore::default();
    let alive = Alive(vec!["a"]);
    add(&c, &mut s, &alive, &req("peer-a", true, "a")).unwrap();
    add(&c, &mut s, &alive, &req("peer-b", true, "b")).unwrap();
    let ip_a = s
        .claims
        .values()
        .find(|c| c.identity == "peer-a")
        .unwrap()
        .ip;
    let release = |s: &mut MemoryStore, target: &ReleaseTarget, force: bool| {
        plan_release(s, &alive, "net", target, force, 1).map_err(CniError::from)
    };
    // (target, force, released identities or the refusal's code and text)
    type Case<'a> = (ReleaseTarget, bool, Result<Vec<&'a str>, (u32, &'a str)>);
    let cases: Vec<Case> = vec![
        (
            ReleaseTarget::Address(ip_a),
            false,
            Err((code::TRY_AGAIN_LATER, "considered alive")),
        ),
        (
            ReleaseTarget::Identity("peer-a".into()),
            false,
            Err((code::TRY_AGAIN_LATER, "--force")),
        ),
        (ReleaseTarget::Address(ip_a), true, Ok(vec!["peer-a"])),
        (
            ReleaseTarget::Identity("peer-b".into()),
            false,
            Ok(vec!["peer-b"]),
        ),
        (
            ReleaseTarget::Identity("nobody".into()),
            false,
            Err((code::INVALID_CONFIG, "has no claim")),
        ),
        (
            ReleaseTarget::Address("192.0.2.7".parse().unwrap()),
            true,
            Err((code::INVALID_CONFIG, "nothing was released")),
        ),
    ];
    for (target, force, want) in cases {
        let got = release(&mut s.clone(), &target, force);
        match (got, want) {
            (Ok((plan, claims)), Ok(ids)) => {
                let released: Vec<&str> = claims.iter().map(|c| c.identity.as_str()).collect();
                assert_eq!(released, ids, "{target:?}");
                // Held claims (the operator's word on a holder) become
                // tombstones whose addresses the wire confirms first.
                assert!(
                    plan.changes
                        .iter()
                        .all(|ch| ch.after.as_ref().is_some_and(Claim::is_tombstone)),
                    "{plan:?}"
                );
            }
            (Err(e), Err((code, says))) => {
                assert_eq!(e.code, code, "{target:?}: {e}");
                assert!(e.msg.contains(says), "{target:?}: {}", e.msg);
            }
            (got, want) => panic!("{target:?}: got {got:?}, want {want:?}"),
        }
    }
}
