//! "Once the old holder is confirmed dead" with the cluster's evidence
//! (docs/src/concepts/allocation-and-liveness.md). `judge_cluster` is pure; `KubeInspector` feeds it
//! from the API, after the node-local rules (same pod, rebooted node, netns
//! gone) that need no request.

use std::cell::RefCell;
use std::collections::BTreeMap;

use super::{ApiError, ClusterNode, KubeApi};
use crate::claim::{Holder, Owner};
use crate::liveness::{is_local, judge, Caller, Inspector, NetnsState, NodeFacts, Verdict};
use crate::pod::PodFacts;
use crate::retention::{self, OwnerState, StatefulSetFacts};
use crate::system::netns_state;

/// One API lookup's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T> {
    Found(T),
    Missing,
    Unreachable(String),
}

impl<T> From<Result<Option<T>, ApiError>> for Lookup<T> {
    fn from(r: Result<Option<T>, ApiError>) -> Lookup<T> {
        match r {
            Ok(Some(t)) => Lookup::Found(t),
            Ok(None) => Lookup::Missing,
            Err(e) => Lookup::Unreachable(e.to_string()),
        }
    }
}

/// The verdict from the holder's pod and, when the pod is terminating, its
/// node. `node` is None when it was not looked up.
pub fn judge_cluster(
    holder: &Holder,
    pod: &Lookup<PodFacts>,
    node: Option<&Lookup<ClusterNode>>,
) -> Verdict {
    let name = holder.pod().unwrap_or_default();
    let on = &holder.node;
    match pod {
        Lookup::Unreachable(why) => Verdict::Alive(format!(
            "pod {name} on node {on} cannot be checked because the kubernetes API did not answer ({why})"
        )),
        Lookup::Missing => Verdict::Dead(format!("pod {name} no longer exists")),
        Lookup::Found(p) => {
            if let Some(uid) = holder.pod_uid.as_deref().filter(|u| !u.is_empty()) {
                if p.uid != uid {
                    return Verdict::Dead(format!(
                        "pod {name} was re-created (UID {uid} is gone, the pod now has UID {})",
                        p.uid
                    ));
                }
            }
            if let Some(phase @ ("Succeeded" | "Failed")) = p.phase.as_deref() {
                return Verdict::Dead(format!("pod {name} has finished (phase {phase})"));
            }
            if !p.terminating {
                return Verdict::Alive(format!(
                    "pod {name} on node {on} is still running (phase {})",
                    p.phase.as_deref().unwrap_or("unknown")
                ));
            }
            match node {
                Some(Lookup::Missing) => Verdict::Dead(format!(
                    "pod {name} is terminating and its node {on} no longer exists"
                )),
                Some(Lookup::Found(n)) if n.out_of_service => Verdict::Dead(format!(
                    "pod {name} is terminating and node {on} is tainted node.kubernetes.io/out-of-service"
                )),
                Some(Lookup::Found(n)) => Verdict::Alive(format!(
                    "pod {name} is terminating on node {on}, which is {}; if that node is down for good, taint it node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
                    match n.ready {
                        Some(true) => "Ready",
                        Some(false) => "NotReady",
                        None => "of unknown readiness",
                    }
                )),
                Some(Lookup::Unreachable(why)) => Verdict::Alive(format!(
                    "pod {name} is terminating but node {on} cannot be checked ({why})"
                )),
                None => Verdict::Alive(format!(
                    "pod {name} is terminating on node {on}"
                )),
            }
        }
    }
}

/// Liveness with the API: node-local evidence first, then pods and nodes.
/// Lookups are cached for the inspector's life, so a reclaim asking about
/// many holders on one node asks once; make one per plan (the CLI makes
/// one per attempt and per network), so that no verdict rests on a lookup
/// older than the plan it feeds. A pod lookup judges only holders of the
/// pod UID it was made for: the absence of a pod's predecessor says
/// nothing of the pod re-created under its name.
pub struct KubeInspector<'a> {
    pub api: &'a dyn KubeApi,
    /// The node this process runs on, whose boot id and netns paths are
    /// evidence; None: the API alone judges (`api_only`).
    node: Option<NodeFacts>,
    /// (namespace/name, the holder's pod UID) -> the lookup made for it.
    pods: RefCell<BTreeMap<(String, String), Lookup<PodFacts>>>,
    /// Pods the caller read itself, by namespace/name (`know_pod`).
    known: RefCell<BTreeMap<String, PodFacts>>,
    nodes: RefCell<BTreeMap<String, Lookup<ClusterNode>>>,
    /// namespace/name -> the StatefulSet's UID, None when it is gone.
    owners: RefCell<BTreeMap<String, Lookup<StatefulSetFacts>>>,
}

impl<'a> KubeInspector<'a> {
    /// The judge of a process that runs on `node` (the plugin's).
    pub fn new(api: &'a dyn KubeApi, node: NodeFacts) -> KubeInspector<'a> {
        KubeInspector::with(api, Some(node))
    }

    /// The judge of a process not proven to run on any node (the CLI
    /// elsewhere, `Evidence::ApiOnly`): it never reads this machine's boot
    /// id or netns paths, and asks the API about every holder.
    pub fn api_only(api: &'a dyn KubeApi) -> KubeInspector<'a> {
        KubeInspector::with(api, None)
    }

    fn with(api: &'a dyn KubeApi, node: Option<NodeFacts>) -> KubeInspector<'a> {
        KubeInspector {
            api,
            node,
            pods: RefCell::default(),
            known: RefCell::default(),
            nodes: RefCell::default(),
            owners: RefCell::default(),
        }
    }

    /// The pod `ns/name` as seen for a holder of pod UID `uid`.
    fn pod(&self, ns: &str, name: &str, uid: &str) -> Lookup<PodFacts> {
        let key = format!("{ns}/{name}");
        if let Some(pod) = self.known.borrow().get(&key) {
            return Lookup::Found(pod.clone());
        }
        let slot = (key, uid.to_string());
        if let Some(hit) = self.pods.borrow().get(&slot) {
            return hit.clone();
        }
        let got: Lookup<PodFacts> = self.api.get_pod(ns, name).into();
        self.pods.borrow_mut().insert(slot, got.clone());
        got
    }

    /// Seeds the inspector with a pod the caller read moments ago (an ADD
    /// reads its own pod before it plans): it answers for every holder of
    /// that name, as the pod is now, so a takeover from the pod's
    /// predecessor costs no second GET.
    pub fn know_pod(&self, key: &str, pod: PodFacts) {
        self.known.borrow_mut().insert(key.to_string(), pod);
    }

    fn cluster_node(&self, name: &str) -> Lookup<ClusterNode> {
        if let Some(hit) = self.nodes.borrow().get(name) {
            return hit.clone();
        }
        let got: Lookup<ClusterNode> = self.api.get_node(name).into();
        self.nodes
            .borrow_mut()
            .insert(name.to_string(), got.clone());
        got
    }
}

/// What retention reads of the owner's lookup: a failed one is unknown.
pub fn owner_state(found: Lookup<StatefulSetFacts>) -> OwnerState {
    match found {
        Lookup::Found(facts) => OwnerState::Present(facts),
        Lookup::Missing => OwnerState::Missing,
        Lookup::Unreachable(_) => OwnerState::Unknown,
    }
}

impl Inspector for KubeInspector<'_> {
    fn owner_retired(&self, owner: &Owner, identity: &str) -> Option<String> {
        if owner.kind == crate::ipamclaim::OWNER_KIND {
            use crate::ipamclaim::{retired, ClaimState};
            let found = self.api.get_ipam_claim(&owner.namespace, &owner.name);
            let uid = |o: &serde_json::Value| o["metadata"]["uid"].as_str().map(str::to_string);
            return match found {
                Ok(Some(obj)) => retired(
                    owner,
                    ClaimState::Present {
                        uid: uid(&obj).as_deref().unwrap_or_default(),
                    },
                ),
                Ok(None) => retired(owner, ClaimState::Missing),
                Err(e) => {
                    cni::log::warn(&format!(
                        "IPAMClaim {}/{} could not be read ({e}): the address of identity {identity:?} is kept until it can be",
                        owner.namespace, owner.name
                    ));
                    retired(owner, ClaimState::Unknown)
                }
            };
        }
        // Only an apps/v1 StatefulSet is asked about: a GET of another
        // kind's name as a StatefulSet would say "missing".
        if owner.kind != crate::pod::STATEFUL_SET {
            return None;
        }
        let key = format!("{}/{}", owner.namespace, owner.name);
        let cached = self.owners.borrow().get(&key).cloned();
        let found = cached.unwrap_or_else(|| {
            let got: Lookup<StatefulSetFacts> = self
                .api
                .get_stateful_set(&owner.namespace, &owner.name)
                .into();
            self.owners.borrow_mut().insert(key, got.clone());
            got
        });
        let state = owner_state(found);
        // A successor of the same name that adopted the pod owns the claim
        // now (its next ADD records that); only then is the pod looked up.
        let successor = match &state {
            OwnerState::Present(facts) if facts.uid != owner.uid => {
                let controller =
                    identity
                        .split_once('/')
                        .and_then(|(ns, name)| match self.pod(ns, name, "") {
                            Lookup::Found(p) => p.stateful_set.map(|s| s.uid),
                            _ => None,
                        });
                retention::adopted_by_successor(owner, &state, controller.as_deref()).then(|| {
                    Owner {
                        uid: facts.uid.clone(),
                        ..owner.clone()
                    }
                })
            }
            _ => None,
        };
        retention::retired(successor.as_ref().unwrap_or(owner), identity, &state)
    }

    fn verdict(&self, holder: &Holder, caller: Option<&Caller>) -> Verdict {
        // Node-local evidence only on the node this process runs on.
        if let Some(node) = &self.node {
            if is_local(holder, node) {
                let netns = netns_state(holder);
                // A present netns is proof of life; nothing the API says beats it.
                if netns != NetnsState::Unknown {
                    return judge(holder, caller, node, netns);
                }
            }
            let same_pod = judge(holder, caller, node, NetnsState::Unknown);
            if same_pod.is_dead() {
                return same_pod;
            }
        }
        let (Some(ns), Some(name)) = (&holder.pod_namespace, &holder.pod_name) else {
            return Verdict::Alive(format!(
                "{} names no pod the kubernetes API can be asked about: it is released by its own DEL or `sticky-macvlan release`",
                holder.describe()
            ));
        };
        let pod = self.pod(ns, name, holder.pod_uid.as_deref().unwrap_or_default());
        let node = match &pod {
            Lookup::Found(p) if p.terminating => Some(self.cluster_node(&holder.node)),
            _ => None,
        };
        judge_cluster(holder, &pod, node.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder() -> Holder {
        Holder {
            container_id: "c1".into(),
            ifname: "net1".into(),
            netns: "/run/netns/p1".into(),
            netns_id: None,
            pod_namespace: Some("bgp".into()),
            pod_name: Some("rs0-0".into()),
            pod_uid: Some("uid-1".into()),
            node: "node1".into(),
            boot_id: "b".into(),
            since: 0,
        }
    }

    fn pod(phase: &str, terminating: bool) -> Lookup<PodFacts> {
        Lookup::Found(PodFacts {
            uid: "uid-1".into(),
            phase: Some(phase.into()),
            terminating,
            ..PodFacts::default()
        })
    }

    fn node(out_of_service: bool, ready: bool) -> Lookup<ClusterNode> {
        Lookup::Found(ClusterNode {
            out_of_service,
            ready: Some(ready),
            boot_id: None,
        })
    }

    /// (name, pod, node, dead?, the reason says)
    type Case = (
        &'static str,
        Lookup<PodFacts>,
        Option<Lookup<ClusterNode>>,
        bool,
        &'static str,
    );

    #[test]
    fn the_evidence_table() {
        let replaced = Lookup::Found(PodFacts {
            uid: "uid-2".into(),
            phase: Some("Running".into()),
            ..PodFacts::default()
        });
        let cases: Vec<Case> = vec![
            ("pod gone", Lookup::Missing, None, true, "no longer exists"),
            ("new UID", replaced, None, true, "re-created"),
            ("succeeded", pod("Succeeded", false), None, true, "finished"),
            ("failed", pod("Failed", true), None, true, "finished"),
            (
                "running",
                pod("Running", false),
                None,
                false,
                "still running",
            ),
            ("pending", pod("Pending", false), None, false, "node1"),
            (
                "terminating, node gone",
                pod("Running", true),
                Some(Lookup::Missing),
                true,
                "no longer exists",
            ),
            (
                "terminating, out-of-service",
                pod("Running", true),
                Some(node(true, false)),
                true,
                "out-of-service",
            ),
            (
                "terminating, merely NotReady",
                pod("Running", true),
                Some(node(false, false)),
                false,
                "NotReady",
            ),
            (
                "terminating, node ready",
                pod("Running", true),
                Some(node(false, true)),
                false,
                "taint it",
            ),
            (
                "API down",
                Lookup::Unreachable("connection refused".into()),
                None,
                false,
                "did not answer",
            ),
            (
                "terminating, node lookup failed",
                pod("Running", true),
                Some(Lookup::Unreachable("timeout".into())),
                false,
                "cannot be checked",
            ),
        ];
        for (name, p, n, dead, says) in cases {
            let v = judge_cluster(&holder(), &p, n.as_ref());
            assert_eq!(v.is_dead(), dead, "{name}: {v:?}");
            assert!(v.reason().contains(says), "{name}: {v:?}");
            assert!(v.reason().contains("bgp/rs0-0"), "{name}: {v:?}");
        }
    }

    #[test]
    fn an_unanswered_owner_lookup_retires_nothing() {
        assert_eq!(owner_state(Lookup::Missing), OwnerState::Missing);
        assert_eq!(
            owner_state(Lookup::Unreachable("timeout".into())),
            OwnerState::Unknown
        );
    }

    #[test]
    fn a_pod_lookup_judges_only_holders_of_the_uid_it_was_made_for() {
        use crate::kube::fake::FakeApi;
        let api = FakeApi::default();
        let inspector = KubeInspector::api_only(&api);
        // The old rs0-0 (uid-1) is gone...
        let v = inspector.verdict(&holder(), None);
        assert!(
            v.is_dead() && v.reason().contains("no longer exists"),
            "{v:?}"
        );
        // ...and the new one (uid-2) runs and holds an address: the
        // predecessor's absence says nothing of it.
        api.pods.borrow_mut().insert(
            "bgp/rs0-0".into(),
            PodFacts {
                uid: "uid-2".into(),
                phase: Some("Running".into()),
                ..PodFacts::default()
            },
        );
        let mut successor = holder();
        successor.pod_uid = Some("uid-2".into());
        successor.container_id = "c2".into();
        let v = inspector.verdict(&successor, None);
        assert!(
            !v.is_dead() && v.reason().contains("still running"),
            "{v:?}"
        );
        assert_eq!(api.count("get pod"), 2, "{:?}", api.calls.borrow());
        // A holder of the UID already looked up is judged from the cache.
        assert!(inspector.verdict(&holder(), None).is_dead());
        assert_eq!(api.count("get pod"), 2, "{:?}", api.calls.borrow());
    }

    #[test]
    fn inspector_uses_local_evidence_and_caches_lookups() {
        use crate::kube::fake::FakeApi;
        let api = FakeApi::default();
        api.pods.borrow_mut().insert(
            "bgp/rs0-0".into(),
            PodFacts {
                uid: "uid-1".into(),
                phase: Some("Running".into()),
                ..PodFacts::default()
            },
        );
        let me = NodeFacts {
            node: "node2".into(),
            boot_id: "b".into(),
        };
        let inspector = KubeInspector::new(&api, me);
        let other_pod = Caller {
            pod_uid: Some("uid-9".into()),
        };
        assert!(!inspector.verdict(&holder(), Some(&other_pod)).is_dead());
        assert!(!inspector.verdict(&holder(), None).is_dead());
        assert_eq!(api.count("get pod"), 1, "{:?}", api.calls.borrow());
        // The same pod's new sandbox needs no request.
        let same_pod = Caller {
            pod_uid: Some("uid-1".into()),
        };
        assert!(inspector.verdict(&holder(), Some(&same_pod)).is_dead());
        assert_eq!(api.calls.borrow().len(), 1);
        // An Advanced StatefulSet is never judged deleted: we cannot read
        // it, and a GET of an apps/v1 StatefulSet of its name would say
        // "gone" and free its pods' reserved addresses.
        let kruise = Owner {
            kind: crate::pod::ADVANCED_STATEFUL_SET.into(),
            namespace: "ns".into(),
            name: "rs0".into(),
            uid: "asts-uid".into(),
            retention: Default::default(),
        };
        assert_eq!(inspector.owner_retired(&kruise, "ns/rs0-0"), None);
        assert_eq!(api.calls.borrow().len(), 1, "no request for it");
        let gone = Owner {
            kind: crate::pod::STATEFUL_SET.into(),
            ..kruise
        };
        assert!(
            inspector.owner_retired(&gone, "ns/rs0-0").is_some(),
            "an apps/v1 StatefulSet the API lacks"
        );
        // On its own node, a holder whose netns is gone is dead without the API.
        let local = KubeInspector::new(
            &api,
            NodeFacts {
                node: "node1".into(),
                boot_id: "b".into(),
            },
        );
        let mut h = holder();
        h.netns = "/nonexistent/netns/for/test".into();
        let v = local.verdict(&h, Some(&other_pod));
        assert!(
            v.is_dead() && v.reason().contains("no longer exists"),
            "{v:?}"
        );
        // Only the StatefulSet lookup above was added.
        assert_eq!(api.calls.borrow().len(), 2, "{:?}", api.calls.borrow());
        // Not proven to run on any node, it asks the API even about a
        // holder whose netns path is missing here or whose boot id is
        // another: the pod runs.
        let elsewhere = KubeInspector::api_only(&api);
        h.boot_id = "another-boot".into();
        let v = elsewhere.verdict(&h, None);
        assert!(
            !v.is_dead() && v.reason().contains("still running"),
            "{v:?}"
        );
        assert_eq!(api.count("get pod"), 2, "{:?}", api.calls.borrow());
    }

    #[test]
    fn a_statefulset_recreated_over_its_orphaned_pods_keeps_their_claims() {
        // Issue 26 item 10: `kubectl delete sts db --cascade=orphan`, then
        // the same StatefulSet applied again: it adopts the running pods.
        // Their claims name the old UID until each pod's next ADD, and under
        // the default whenDeleted=Delete they looked retired, so a pod whose
        // sandbox restarted during a sweep lost its address.
        use crate::kube::fake::FakeApi;
        use crate::pod::StableOwner;
        use crate::retention::StatefulSetFacts;
        let api = FakeApi::default();
        api.stateful_sets.borrow_mut().insert(
            "db/db".into(),
            StatefulSetFacts {
                uid: "sts-2".into(),
                replicas: 2,
                ordinal_start: 0,
            },
        );
        let controlled_by = |uid: &str| PodFacts {
            uid: "pod-uid".into(),
            phase: Some("Pending".into()),
            stateful_set: Some(StableOwner {
                kind: crate::pod::STATEFUL_SET,
                name: "db".into(),
                uid: uid.into(),
            }),
            ..PodFacts::default()
        };
        api.pods
            .borrow_mut()
            .insert("db/db-0".into(), controlled_by("sts-2"));
        api.pods
            .borrow_mut()
            .insert("db/db-1".into(), controlled_by("sts-1"));
        let old = Owner {
            kind: crate::pod::STATEFUL_SET.into(),
            namespace: "db".into(),
            name: "db".into(),
            uid: "sts-1".into(),
            retention: Default::default(),
        };
        let inspector = KubeInspector::new(
            &api,
            NodeFacts {
                node: "node1".into(),
                boot_id: "b".into(),
            },
        );
        assert_eq!(inspector.owner_retired(&old, "db/db-0"), None, "adopted");
        // Not adopted (still the old set's, or no pod): a re-creation.
        assert!(inspector.owner_retired(&old, "db/db-1").is_some());
        assert!(inspector.owner_retired(&old, "db/db-5").is_some());
    }

    #[test]
    fn an_ipamclaim_owner_is_asked_about_as_an_ipamclaim_and_kept_while_the_api_is_silent() {
        let api = crate::kube::fake::FakeApi::default();
        let me = NodeFacts {
            node: "node1".into(),
            boot_id: "b".into(),
        };
        let inspector = KubeInspector::new(&api, me);
        let facts = crate::ipamclaim::ClaimFacts {
            name: "vm1.phys".into(),
            uid: "uid-1".into(),
            network: "phys".into(),
            deleting: false,
            vm: Some("vm1".into()),
        };
        let owner = crate::ipamclaim::owner("vms", &facts);
        let identity = "ipamclaim:vms/vm1.phys";
        api.ipam_claims.borrow_mut().insert(
            "vms/vm1.phys".into(),
            serde_json::json!({"metadata": {"name": "vm1.phys", "uid": "uid-1"}}),
        );
        assert_eq!(inspector.owner_retired(&owner, identity), None);
        assert_eq!(api.count("get ipamclaim vms/vm1.phys"), 1);
        assert_eq!(api.count("get statefulset"), 0);
        api.unreachable.set(true);
        api.ipam_claims.borrow_mut().clear();
        assert_eq!(inspector.owner_retired(&owner, identity), None);
        api.unreachable.set(false);
        assert!(inspector
            .owner_retired(&owner, identity)
            .is_some_and(|why| why.contains("IPAMClaim vms/vm1.phys was deleted")));
    }
}
