//! I7: what a judgement frees is probed before it is bound again, on
//! every path that frees an address, and the mark goes only once a probe
//! confirmed it. Each case is an interleaving of issue 26's item 1 (and
//! items 4 and 8), on the in-memory store with the real planners.

use super::*;
use crate::engine::test_support::*;
use crate::engine::{
    plan_add, plan_degraded, plan_gc, plan_reconcile, plan_release, Grant, ReleaseTarget,
};
use crate::probe_policy::StoreScope::{Cluster, Node};
use crate::store::memory::MemoryStore;
use cni::{code, CniError};
use serde_json::json;

/// One address, so that every ADD wants the same one.
fn one() -> crate::config::IpamConfig {
    conf(json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.10"}))
}

fn confirm(s: &mut MemoryStore, g: &[Grant], cid: &str) {
    let ips: Vec<IpAddr> = g.iter().map(|g| g.ip).collect();
    let plan = plan_confirm(s, &ips, cid, "net1").unwrap();
    s.commit(&plan).unwrap();
}

#[test]
fn a_sticky_address_reconcile_released_is_probed_on_its_next_grant() {
    let c = small();
    let mut s = MemoryStore::default();
    // db-0 runs as pod a; reconcile judges it dead (a partitioned node
    // whose pod was force-deleted looks exactly like this to the API).
    add(&c, &mut s, &Alive(vec![]), &req("ns/db-0", true, "a")).unwrap();
    let (plan, released, _) = plan_reconcile(&mut s, &Alive(vec![]), 5).unwrap();
    assert_eq!(released.len(), 1);
    s.commit(&plan).unwrap();
    // The re-created db-0 finds its claim unheld: probed all the same.
    let r = req("ns/db-0", true, "b");
    let g = add(&c, &mut s, &Alive(vec![]), &r).unwrap();
    assert!(probed(&g[0], &r, Cluster), "{g:?}");
    // The probe heard nobody: the mark goes, and after b's own DEL the
    // store alone proves the address free again.
    confirm(&mut s, &g, "b");
    assert!(s.claims.values().all(|c| c.unconfirmed.is_none()));
    del(&mut s, "b");
    let r = req("ns/db-0", true, "c");
    let g = add(&c, &mut s, &Alive(vec![]), &r).unwrap();
    assert!(!probed(&g[0], &r, Cluster), "{g:?}");
}

#[test]
fn a_dynamic_address_gc_released_is_probed_when_it_is_handed_out_again() {
    let c = one();
    let mut s = MemoryStore::default();
    add(&c, &mut s, &Alive(vec!["p1"]), &req("p1/net1", false, "p1")).unwrap();
    let gc = plan_gc(&mut s, "n1", &Default::default(), 5).unwrap();
    s.commit(&gc).unwrap();
    let r = req("p2/net1", false, "p2");
    let g = add(&c, &mut s, &Alive(vec!["p1"]), &r).unwrap();
    assert_eq!(ips(&g), ["10.0.0.10"]);
    // Even a dynamic grant on a node-local store, which host-local's
    // contract leaves unprobed when the address is fresh.
    assert!(probed(&g[0], &r, Node), "{g:?}");
    assert!(probed(&g[0], &r, Cluster), "{g:?}");
    assert_invariants(&s);
}

#[test]
fn an_address_an_operator_released_is_probed_before_another_identity_binds_it() {
    let c = one();
    let mut s = MemoryStore::default();
    let alive = Alive(vec!["a"]);
    add(&c, &mut s, &alive, &req("peer-a", true, "a")).unwrap();
    let (plan, _) = plan_release(
        &mut s,
        &alive,
        "net",
        &ReleaseTarget::Identity("peer-a".into()),
        true,
        5,
    )
    .unwrap();
    s.commit(&plan).unwrap();
    // The identity's reservation is gone, and with it its namespace's
    // hold on it (tenancy ignores a tombstone); the address stays...
    let stone = s.claims.values().next().unwrap().clone();
    assert!(stone.is_tombstone(), "{stone:?}");
    let peer = req("peer-a", true, "a3");
    crate::tenancy::check(&c, &peer.identity, &[stone], Some("other")).unwrap();
    // ...which the exhausted pool hands to another identity, probed.
    let r = req("p2/net1", false, "p2");
    let g = add(&c, &mut s, &alive, &r).unwrap();
    assert_eq!(ips(&g), ["10.0.0.10"]);
    assert!(g[0].reclaimed);
    assert!(probed(&g[0], &r, Cluster), "{g:?}");
}

#[test]
fn a_takeover_killed_before_its_probe_leaves_the_address_to_be_probed() {
    let c = small();
    let mut s = MemoryStore::default();
    add(&c, &mut s, &Alive(vec![]), &req("ns/db-0", true, "a")).unwrap();
    // b takes over from the dead-judged a and is killed before its probe
    // (no confirmation): its retried ADD probes...
    let r = req("ns/db-0", true, "b");
    let g = add(&c, &mut s, &Alive(vec![]), &r).unwrap();
    assert!(probed(&g[0], &r, Cluster));
    let g = add(&c, &mut s, &Alive(vec![]), &r).unwrap();
    assert!(
        probed(&g[0], &r, Cluster),
        "the retry is SameAttachment: {g:?}"
    );
    // ...and so does whoever comes after b's own DEL.
    del(&mut s, "b");
    let r = req("ns/db-0", true, "c");
    let g = add(&c, &mut s, &Alive(vec![]), &r).unwrap();
    assert!(probed(&g[0], &r, Cluster), "{g:?}");
}

#[test]
fn a_confirmation_clears_only_what_this_attachment_still_holds() {
    let c = small();
    let mut s = MemoryStore::default();
    add(&c, &mut s, &Alive(vec![]), &req("ns/db-0", true, "a")).unwrap();
    let g = add(&c, &mut s, &Alive(vec![]), &req("ns/db-0", true, "b")).unwrap();
    // c took it over from b meanwhile: b's late confirmation changes nothing.
    add(&c, &mut s, &Alive(vec![]), &req("ns/db-0", true, "c")).unwrap();
    let plan = plan_confirm(&mut s, &[g[0].ip], "b", "net1").unwrap();
    assert!(plan.is_empty(), "{plan:?}");
    // Nothing to clear on a claim without the mark.
    confirm(&mut s, &g, "c");
    assert!(plan_confirm(&mut s, &[g[0].ip], "c", "net1")
        .unwrap()
        .is_empty());
}

#[test]
fn degraded_mode_grants_are_probed() {
    let c = small();
    let mut s = MemoryStore::default();
    let mut r = req("ns/db-0", true, "a");
    r.caller.pod_uid = Some("uid-1".into());
    r.holder.pod_uid = Some("uid-1".into());
    add(&c, &mut s, &Alive(vec![]), &r).unwrap();
    let recorded: Vec<_> = s.claims.values().cloned().collect();
    let mut again = r.clone();
    again.holder.container_id = "a2".into();
    let (_, g) = plan_degraded(&c, &recorded, &again, "n1", "the API did not answer").unwrap();
    assert!(probed(&g[0], &again, Cluster), "{g:?}");
}

#[test]
fn a_second_attachment_of_one_pod_to_one_network_is_refused_not_taken_over() {
    let c = small();
    let mut s = MemoryStore::default();
    let net1 = req("ns/db-0", true, "a");
    add(&c, &mut s, &Alive(vec![]), &net1).unwrap();
    let before = s.claims.clone();
    // The same sandbox (container and pod UID), interface net2.
    let mut net2 = net1.clone();
    net2.holder.ifname = "net2".into();
    let e = plan_add(&c, &mut s, &Alive(vec![]), &net2)
        .map(drop)
        .map_err(CniError::from)
        .unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG, "{e}");
    assert!(
        e.msg.contains("interface net1") && e.msg.contains("identity"),
        "{}",
        e.msg
    );
    assert_eq!(s.claims, before);
    // Under an identity of its own, the second attachment gets its own address.
    let mut own = net2.clone();
    own.identity.key = "ns/db-0-second".into();
    let g = add(&c, &mut s, &Alive(vec![]), &own).unwrap();
    assert_ne!(g[0].ip, before.values().next().unwrap().ip);
}

// Found by an adversarial review of the change above.

#[test]
fn a_released_identity_taken_up_in_another_namespace_is_bound_there() {
    let c = one();
    let mut s = MemoryStore::default();
    let alive = Alive(vec![]);
    add(&c, &mut s, &alive, &req("peer-a", true, "a")).unwrap();
    let (plan, _) = plan_release(
        &mut s,
        &alive,
        "net",
        &ReleaseTarget::Identity("peer-a".into()),
        false,
        5,
    )
    .unwrap();
    s.commit(&plan).unwrap();
    // A pod of namespace "other" takes the identity up (a tombstone binds
    // no namespace); the claim is "other"'s now, so its pod's next sandbox
    // is served and "ns" may no longer take it back.
    let mut other = req("peer-a", true, "b");
    other.holder.pod_namespace = Some("other".into());
    add(&c, &mut s, &alive, &other).unwrap();
    let got = s.claims.values().next().unwrap().clone();
    assert_eq!(got.namespace.as_deref(), Some("other"), "{got:?}");
    del(&mut s, "b");
    let mut again = req("peer-a", true, "b2");
    again.holder.pod_namespace = Some("other".into());
    add(&c, &mut s, &alive, &again).unwrap();
    let e = add(&c, &mut s, &alive, &req("peer-a", true, "a2"))
        .map(drop)
        .unwrap_err();
    assert_eq!(e.code, code::NAMESPACE_NOT_ALLOWED, "{e}");
}

#[test]
fn an_address_whose_probe_was_answered_is_not_the_pools_next_candidate_again() {
    // Two tombstones fill the pool; the first one's address answers on
    // the wire (its judged-dead pod is alive after all), so that reclaim
    // is undone. The next ADD must try the other one, not the same again.
    let c =
        conf(json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.11"}));
    let mut s = MemoryStore::default();
    let both = Alive(vec!["p1", "p2"]);
    add(&c, &mut s, &both, &req("p1/net1", false, "p1")).unwrap();
    add(&c, &mut s, &both, &req("p2/net1", false, "p2")).unwrap();
    let gc = plan_gc(&mut s, "n1", &Default::default(), 5).unwrap();
    s.commit(&gc).unwrap();
    let mut tried = Vec::new();
    for i in 0..2 {
        let r = req(&format!("q{i}/net1"), false, &format!("q{i}"));
        let (plan, g) = plan_add(&c, &mut s, &Alive(vec![]), &r).unwrap();
        s.commit(&plan).unwrap();
        tried.push(g[0].ip.to_string());
        let undo = crate::engine::plan_undo(&mut s, &plan).unwrap();
        s.commit(&undo).unwrap();
    }
    assert_ne!(tried[0], tried[1], "{tried:?}");
}
