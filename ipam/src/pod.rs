//! What the IPAM knows of the pod an ADD is for, or of a holder's pod,
//! wherever it was learnt (the kubernetes API today): identity and
//! liveness read it, the kube client fills it.

use std::collections::BTreeMap;

/// A pod annotation naming its identity on every sticky-macvlan network.
pub const IDENTITY_ANNOTATION: &str = "sticky-macvlan.io/identity";

/// What liveness and identity need from a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub node: Option<String>,
    pub phase: Option<String>,
    pub terminating: bool,
    pub identity_annotation: Option<String>,
    /// The controller with stable, ordinal pod names that controls the
    /// pod (a StatefulSet, or OpenKruise's Advanced StatefulSet).
    pub stateful_set: Option<StableOwner>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// A controller whose pods keep their names across restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StableOwner {
    /// `STATEFUL_SET` (apps/v1), or `ADVANCED_STATEFUL_SET`.
    pub kind: &'static str,
    pub name: String,
    pub uid: String,
}

/// The built-in StatefulSet: the only owner whose deletion reconcile
/// checks (RBAC grants `get statefulsets.apps`), so its retired pods'
/// addresses can be reused.
pub const STATEFUL_SET: &str = "StatefulSet";
/// OpenKruise's Advanced StatefulSet (apps.kruise.io): its pods are named
/// by ordinal as StatefulSet's are; its claims are never retired (we do not
/// read its objects), so they are kept until released.
pub const ADVANCED_STATEFUL_SET: &str = "StatefulSet.apps.kruise.io";

/// The stable owner among a pod's controller references: (apiVersion,
/// kind) as the reference gives them.
pub fn stable_owner_kind(api_version: &str, kind: &str) -> Option<&'static str> {
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    match (group, kind) {
        ("apps", "StatefulSet") => Some(STATEFUL_SET),
        ("apps.kruise.io", "StatefulSet") => Some(ADVANCED_STATEFUL_SET),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_controllers_with_ordinal_names_are_stable_owners() {
        let cases = [
            ("apps/v1", "StatefulSet", Some(STATEFUL_SET)),
            (
                "apps.kruise.io/v1beta1",
                "StatefulSet",
                Some(ADVANCED_STATEFUL_SET),
            ),
            (
                "apps.kruise.io/v1alpha1",
                "StatefulSet",
                Some(ADVANCED_STATEFUL_SET),
            ),
            // A CloneSet's pod names are random: not stable.
            ("apps.kruise.io/v1alpha1", "CloneSet", None),
            ("apps/v1", "ReplicaSet", None),
            // Some other group's "StatefulSet" is not ours to trust.
            ("example.com/v1", "StatefulSet", None),
            ("v1", "StatefulSet", None),
        ];
        for (api_version, kind, want) in cases {
            assert_eq!(
                stable_owner_kind(api_version, kind),
                want,
                "{api_version} {kind}"
            );
        }
    }
}
