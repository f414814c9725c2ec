//! Which granted addresses the wire must confirm before they are bound
//! (ARP probe for IPv4, duplicate address detection for IPv6).
//!
//! The rule (I7): every grant the store cannot prove free everywhere the
//! address could be in use is probed. A store proves an address free only
//! when nobody held it, or its holder released it with its own DEL of a
//! confirmed grant; whatever a judgement freed (a liveness verdict,
//! reconcile, CNI GC, an operator's release, retirement, a takeover whose
//! probe never ran) carries the claim's `unconfirmed` mark and is probed,
//! on both stores, sticky or dynamic, whatever its origin. A node-local
//! store (`file`) sees only its own node, so it proves nothing about a
//! sticky identity's address: another node's store may have handed the
//! same reservation or configured identity to a pod that is alive right
//! now. A takeover from a holder judged dead is always probed (a
//! partitioned node), and so is degraded mode's grant from the node-local
//! record (another node may have taken the address over meanwhile).
//! Dynamic fresh allocations on a node-local store keep host-local's
//! contract (each node is configured with its own range) and are not
//! probed unless `probe.fresh` says so.

use crate::claim::Holder;
use crate::identity::{Identity, IdentitySource};

/// How far a store's records reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreScope {
    /// Records of this node only (the file store).
    Node,
    /// Records of every node (the kubernetes store).
    Cluster,
}

/// Where a granted address came from, as the planner saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A new claim at an address the store read as free.
    Fresh,
    /// A claim that existed without a holder (a sticky identity's reserved
    /// address after its DEL, or an unheld claim reclaimed).
    Unheld,
    /// Already held by this very attachment (a retried ADD).
    SameAttachment,
    /// Held by an earlier sandbox of the caller's own pod (same pod UID),
    /// recorded on `node`.
    SamePod { node: String },
    /// Taken from another pod's holder that liveness judged dead.
    TakenOver,
    /// Served from the node-local record while the API did not answer
    /// (degraded mode): the record cannot know whether another node took
    /// the address over since.
    Recorded,
}

impl Origin {
    /// The origin of an address whose claim had `holder` before this ADD.
    pub fn from_holder(
        holder: Option<&Holder>,
        caller: &Holder,
        caller_pod_uid: Option<&str>,
    ) -> Origin {
        let Some(h) = holder else {
            return Origin::Unheld;
        };
        if h.is(&caller.container_id, &caller.ifname) {
            return Origin::SameAttachment;
        }
        match (h.pod_uid.as_deref(), caller_pod_uid) {
            (Some(theirs), Some(mine)) if !mine.is_empty() && theirs == mine => Origin::SamePod {
                node: h.node.clone(),
            },
            _ => Origin::TakenOver,
        }
    }
}

/// Whether one identity can be in use by a single pod only, so that the
/// same pod UID proves nobody else has it: a pod name is unique in its
/// namespace while the pod exists. A configured identity (cni-args, the
/// NAD, an annotation) may be shared by several pods on several nodes.
fn one_pod_at_a_time(source: IdentitySource) -> bool {
    matches!(
        source,
        IdentitySource::PodName | IdentitySource::StatefulSet
    )
}

/// Whether a grant must be confirmed on the wire before it is bound.
/// `unconfirmed`: the claim carries the mark of a judgement the wire has
/// not confirmed. `probe_fresh` is the `probe.fresh` option: probe
/// everything the caller did not already hold.
pub fn needs_wire_check(
    origin: &Origin,
    unconfirmed: bool,
    identity: &Identity,
    scope: StoreScope,
    this_node: &str,
    probe_fresh: bool,
) -> bool {
    if unconfirmed {
        return true;
    }
    match origin {
        // Our own address: it is on our own (leftover) link if anywhere.
        Origin::SameAttachment => false,
        // kubelet replaces the pod's old sandbox itself; on a node-local
        // store only a one-pod identity recorded here proves that.
        Origin::SamePod { node } => match scope {
            StoreScope::Cluster => false,
            StoreScope::Node => !(node == this_node && one_pod_at_a_time(identity.source)),
        },
        Origin::TakenOver | Origin::Recorded => true,
        Origin::Fresh | Origin::Unheld => {
            probe_fresh || (scope == StoreScope::Node && identity.sticky)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(cid: &str, uid: Option<&str>, node: &str) -> Holder {
        Holder {
            container_id: cid.into(),
            ifname: "net1".into(),
            netns: String::new(),
            netns_id: None,
            pod_namespace: Some("ns".into()),
            pod_name: Some("p".into()),
            pod_uid: uid.map(str::to_string),
            node: node.into(),
            boot_id: String::new(),
            since: 0,
        }
    }

    fn identity(source: IdentitySource) -> Identity {
        Identity {
            key: "k".into(),
            sticky: source != IdentitySource::Container,
            source,
            owner: None,
        }
    }

    #[test]
    fn origins_from_the_previous_holder() {
        let me = holder("c1", Some("u1"), "n1");
        assert_eq!(Origin::from_holder(None, &me, Some("u1")), Origin::Unheld);
        assert_eq!(
            Origin::from_holder(Some(&me), &me, Some("u1")),
            Origin::SameAttachment
        );
        let old_sandbox = holder("c0", Some("u1"), "n1");
        assert_eq!(
            Origin::from_holder(Some(&old_sandbox), &me, Some("u1")),
            Origin::SamePod { node: "n1".into() }
        );
        let other = holder("c9", Some("u9"), "n2");
        assert_eq!(
            Origin::from_holder(Some(&other), &me, Some("u1")),
            Origin::TakenOver
        );
        // Without pod UIDs nothing proves it is the same pod.
        let anonymous = holder("c0", None, "n1");
        assert_eq!(
            Origin::from_holder(Some(&anonymous), &me, None),
            Origin::TakenOver
        );
        assert_eq!(
            Origin::from_holder(Some(&old_sandbox), &me, Some("")),
            Origin::TakenOver
        );
    }

    #[test]
    fn what_the_wire_must_confirm() {
        use IdentitySource::*;
        use StoreScope::*;
        let here = || Origin::SamePod { node: "n1".into() };
        let there = || Origin::SamePod { node: "n2".into() };
        // (origin, identity source, scope, probe.fresh, probed?) for a
        // claim without the `unconfirmed` mark.
        let cases: Vec<(Origin, IdentitySource, StoreScope, bool, bool)> = vec![
            // A node-local store proves no sticky address free.
            (Origin::Fresh, ArgsCni, Node, false, true),
            (Origin::Fresh, Config, Node, false, true),
            (Origin::Fresh, StatefulSet, Node, false, true),
            (Origin::Fresh, PodName, Node, false, true),
            (Origin::Unheld, ArgsCni, Node, false, true),
            (Origin::Unheld, PodName, Node, false, true),
            // Dynamic fresh addresses keep host-local's contract.
            (Origin::Fresh, Container, Node, false, false),
            (Origin::Fresh, Container, Node, true, true),
            // The cluster-wide store proves free what nobody held, and what
            // its holder released with its own DEL (no mark).
            (Origin::Fresh, ArgsCni, Cluster, false, false),
            (Origin::Unheld, StatefulSet, Cluster, false, false),
            (Origin::Fresh, Container, Cluster, false, false),
            (Origin::Fresh, ArgsCni, Cluster, true, true),
            // A dead verdict is never the last word.
            (Origin::TakenOver, ArgsCni, Node, false, true),
            (Origin::TakenOver, StatefulSet, Cluster, false, true),
            (Origin::TakenOver, Container, Node, false, true),
            // Degraded mode's record may be stale: always probed.
            (Origin::Recorded, StatefulSet, Cluster, false, true),
            (Origin::Recorded, PodName, Cluster, false, true),
            // The same attachment retrying: its own address.
            (Origin::SameAttachment, ArgsCni, Node, true, false),
            (Origin::SameAttachment, Container, Cluster, true, false),
            // The same pod's new sandbox.
            (here(), StatefulSet, Node, false, false),
            (here(), PodName, Node, false, false),
            (here(), ArgsCni, Node, false, true),
            (here(), Config, Node, false, true),
            (here(), Annotation, Node, false, true),
            (there(), PodName, Node, false, true),
            (here(), ArgsCni, Cluster, false, false),
            (there(), ArgsCni, Cluster, false, false),
        ];
        for (origin, source, scope, fresh, want) in cases {
            assert_eq!(
                needs_wire_check(&origin, false, &identity(source), scope, "n1", fresh),
                want,
                "{origin:?} {source:?} {scope:?} fresh={fresh}"
            );
            // Whatever a judgement freed is probed, whatever the origin: an
            // unheld sticky claim reconcile released, a dynamic tombstone, a
            // retried ADD whose takeover never reached its probe.
            assert!(
                needs_wire_check(&origin, true, &identity(source), scope, "n1", fresh),
                "{origin:?} {source:?} {scope:?} fresh={fresh} with the mark"
            );
        }
    }
}
