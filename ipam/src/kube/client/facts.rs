//! What the store reads of Kubernetes objects (a pod, a node, a
//! StatefulSet), converted from the API's types at the client's edge.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::kube::{ClusterNode, OUT_OF_SERVICE_TAINT};
use crate::pod::{stable_owner_kind, PodFacts, StableOwner, IDENTITY_ANNOTATION};
use crate::retention::StatefulSetFacts;

pub fn stateful_set_facts(s: &StatefulSet) -> StatefulSetFacts {
    // Negative counts are refused by the API; read them as unset.
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok());
    StatefulSetFacts {
        uid: s.metadata.uid.clone().unwrap_or_default(),
        replicas: count(s.spec.replicas).unwrap_or(1),
        ordinal_start: count(s.spec.ordinals.as_ref().and_then(|o| o.start)).unwrap_or(0),
    }
}

pub fn pod_facts(p: &Pod) -> PodFacts {
    let stateful_set = p.metadata.owner_references.as_ref().and_then(|owners| {
        owners
            .iter()
            .filter(|o| o.controller == Some(true))
            .find_map(|o| {
                Some(StableOwner {
                    kind: stable_owner_kind(&o.api_version, &o.kind)?,
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                })
            })
    });
    PodFacts {
        uid: p.metadata.uid.clone().unwrap_or_default(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        phase: p.status.as_ref().and_then(|s| s.phase.clone()),
        terminating: p.metadata.deletion_timestamp.is_some(),
        identity_annotation: p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(IDENTITY_ANNOTATION).cloned()),
        stateful_set,
        labels: p.metadata.labels.clone().unwrap_or_default(),
        annotations: p.metadata.annotations.clone().unwrap_or_default(),
    }
}

pub fn cluster_node(n: &Node) -> ClusterNode {
    let spec = n.spec.as_ref();
    ClusterNode {
        out_of_service: spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT)),
        ready: n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status == "True"),
        boot_id: n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.trim().to_string())
            .filter(|b| !b.is_empty()),
    }
}
