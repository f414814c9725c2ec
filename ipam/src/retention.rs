//! Whether a StatefulSet pod's sticky claim has outlived its purpose
//! (`ipam.retention`, recorded on the claim's `Owner`): its StatefulSet
//! was deleted, or scaled below the pod's ordinal, and the policy for
//! that is Delete. Decided here without I/O from what the API said of the
//! StatefulSet; reconcile deletes such claims once their holder is dead,
//! and an ADD of an exhausted pool may reuse their addresses.

use crate::claim::{Owner, RetentionPolicy};
use crate::pod::STATEFUL_SET;

/// What retention needs of a StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatefulSetFacts {
    pub uid: String,
    /// `spec.replicas` (1 when unset).
    pub replicas: u32,
    /// `spec.ordinals.start` (0 when unset).
    pub ordinal_start: u32,
}

/// What the API said of a claim's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerState {
    Present(StatefulSetFacts),
    Missing,
    /// Not known (the API did not answer, or the kind is one we cannot
    /// read): nothing retires on a guess.
    Unknown,
}

/// The ordinal of `identity` ("namespace/name-ordinal") as a pod of
/// `owner`, if it is one.
pub fn ordinal(owner: &Owner, identity: &str) -> Option<u32> {
    let pod = identity.strip_prefix(&format!("{}/", owner.namespace))?;
    let digits = pod.strip_prefix(&format!("{}-", owner.name))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether the StatefulSet of `owner`'s name in `state` is a successor
/// (another UID: the old one was deleted, say with `--cascade=orphan`, and
/// a new one made) that has adopted the identity's pod: the pod now exists
/// under it, controlled by `pod_controller` (the UID in its
/// ownerReferences). Its claim is then the successor's, not a retired one:
/// a pod restarting its sandbox while reconcile sweeps keeps its address.
pub fn adopted_by_successor(
    owner: &Owner,
    state: &OwnerState,
    pod_controller: Option<&str>,
) -> bool {
    match (state, pod_controller) {
        (OwnerState::Present(facts), Some(controller)) => {
            facts.uid != owner.uid && controller == facts.uid
        }
        _ => false,
    }
}

/// Why the claim of `identity`, owned by `owner`, is retired, or None
/// while it is kept.
pub fn retired(owner: &Owner, identity: &str, state: &OwnerState) -> Option<String> {
    // Only apps/v1 StatefulSets are read (RBAC grants `get statefulsets`).
    if owner.kind != STATEFUL_SET {
        return None;
    }
    let set = format!("{} {}/{}", owner.kind, owner.namespace, owner.name);
    let policy = owner.retention;
    match state {
        OwnerState::Unknown => None,
        OwnerState::Missing => (policy.when_deleted == RetentionPolicy::Delete)
            .then(|| format!("its {set} was deleted (retention whenDeleted=Delete)")),
        // A re-created StatefulSet names new pods: the old one is deleted.
        OwnerState::Present(facts) if !owner.uid.is_empty() && facts.uid != owner.uid => {
            (policy.when_deleted == RetentionPolicy::Delete).then(|| {
                format!("its {set} was deleted and re-created (retention whenDeleted=Delete)")
            })
        }
        OwnerState::Present(facts) => {
            if policy.when_scaled != RetentionPolicy::Delete {
                return None;
            }
            let n = ordinal(owner, identity)?;
            let end = u64::from(facts.ordinal_start) + u64::from(facts.replicas);
            let beyond = n < facts.ordinal_start || u64::from(n) >= end;
            beyond.then(|| {
                let kept = if facts.replicas == 0 {
                    "no ordinal".to_string()
                } else {
                    format!("ordinals {}..={}", facts.ordinal_start, end - 1)
                };
                format!(
                    "its {set} has replicas: {} ({kept}): ordinal {n} was scaled away (retention whenScaled=Delete)",
                    facts.replicas
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{Retention, RetentionPolicy::*};

    fn owner(when_scaled: RetentionPolicy, when_deleted: RetentionPolicy) -> Owner {
        Owner {
            kind: STATEFUL_SET.into(),
            namespace: "db".into(),
            name: "pg".into(),
            uid: "u1".into(),
            retention: Retention {
                when_scaled,
                when_deleted,
            },
        }
    }

    fn present(uid: &str, replicas: u32, ordinal_start: u32) -> OwnerState {
        OwnerState::Present(StatefulSetFacts {
            uid: uid.into(),
            replicas,
            ordinal_start,
        })
    }

    #[test]
    fn ordinals_are_read_only_from_the_owners_own_pod_names() {
        let o = owner(Retain, Delete);
        for (identity, want) in [
            ("db/pg-0", Some(0)),
            ("db/pg-12", Some(12)),
            ("db/pg-", None),
            ("db/pg-x", None),
            ("db/pg-+1", None),
            ("db/pg-web-1", None),
            ("other/pg-1", None),
            ("db/pgx-1", None),
            ("db/pg-99999999999", None),
        ] {
            assert_eq!(ordinal(&o, identity), want, "{identity}");
        }
    }

    #[test]
    fn retention_decides_from_the_policy_and_the_statefulset() {
        // (name, policy, identity, state, retired, reason says)
        let cases = [
            (
                "deleted, default",
                owner(Retain, Delete),
                "db/pg-1",
                OwnerState::Missing,
                true,
                "was deleted",
            ),
            (
                "deleted, Retain",
                owner(Retain, Retain),
                "db/pg-1",
                OwnerState::Missing,
                false,
                "",
            ),
            (
                "re-created, default",
                owner(Retain, Delete),
                "db/pg-1",
                present("u2", 3, 0),
                true,
                "re-created",
            ),
            (
                "re-created, Retain",
                owner(Delete, Retain),
                "db/pg-1",
                present("u2", 3, 0),
                false,
                "",
            ),
            (
                "unknown",
                owner(Delete, Delete),
                "db/pg-9",
                OwnerState::Unknown,
                false,
                "",
            ),
            (
                "within replicas",
                owner(Delete, Delete),
                "db/pg-2",
                present("u1", 3, 0),
                false,
                "",
            ),
            (
                "scaled away",
                owner(Delete, Delete),
                "db/pg-3",
                present("u1", 3, 0),
                true,
                "(ordinals 0..=2): ordinal 3 was scaled away",
            ),
            (
                "scaled away, Retain",
                owner(Retain, Delete),
                "db/pg-3",
                present("u1", 3, 0),
                false,
                "",
            ),
            (
                "scaled to zero",
                owner(Delete, Retain),
                "db/pg-0",
                present("u1", 0, 0),
                true,
                "replicas: 0 (no ordinal)",
            ),
            (
                "below ordinals.start",
                owner(Delete, Delete),
                "db/pg-1",
                present("u1", 3, 5),
                true,
                "ordinals 5..=7",
            ),
            (
                "within ordinals.start",
                owner(Delete, Delete),
                "db/pg-7",
                present("u1", 3, 5),
                false,
                "",
            ),
            (
                "not an ordinal pod",
                owner(Delete, Delete),
                "db/other",
                present("u1", 0, 0),
                false,
                "",
            ),
            (
                "no recorded uid",
                owner(Delete, Delete),
                "db/pg-0",
                present("u9", 1, 0),
                false,
                "",
            ),
        ];
        for (name, mut o, identity, state, want, says) in cases {
            if name == "no recorded uid" {
                o.uid.clear();
            }
            let got = retired(&o, identity, &state);
            assert_eq!(got.is_some(), want, "{name}: {got:?}");
            if let Some(why) = got {
                assert!(why.contains(says), "{name}: {why}");
                assert!(why.contains("StatefulSet db/pg"), "{name}: {why}");
            }
        }
    }

    #[test]
    fn only_statefulsets_retire() {
        let mut o = owner(Delete, Delete);
        o.kind = crate::pod::ADVANCED_STATEFUL_SET.into();
        assert_eq!(retired(&o, "db/pg-5", &OwnerState::Missing), None);
    }

    #[test]
    fn claims_stored_before_retention_read_the_old_rules() {
        let old = r#"{"kind":"StatefulSet","namespace":"db","name":"pg","uid":"u1"}"#;
        let o: Owner = serde_json::from_str(old).unwrap();
        assert_eq!(o.retention, Retention::default());
        assert_eq!(
            o.retention.describe(),
            "whenScaled=Retain,whenDeleted=Delete"
        );
        let partial = r#"{"kind":"StatefulSet","namespace":"db","name":"pg","uid":"u1","retention":{"whenScaled":"Delete"}}"#;
        let o: Owner = serde_json::from_str(partial).unwrap();
        assert_eq!(o.retention.when_deleted, Delete);
        assert_eq!(o.retention.when_scaled, Delete);
    }

    #[test]
    fn a_successor_that_adopted_the_pod_keeps_its_claim() {
        let o = owner(Retain, Delete);
        // (state, the pod's controller now, adopted?)
        let cases = [
            (present("u2", 3, 0), Some("u2"), true),
            // The pod is still the old set's (or gone): a re-creation.
            (present("u2", 3, 0), Some("u1"), false),
            (present("u2", 3, 0), None, false),
            // The same set: nothing to adopt.
            (present("u1", 3, 0), Some("u1"), false),
            (OwnerState::Missing, Some("u2"), false),
            (OwnerState::Unknown, Some("u2"), false),
        ];
        for (state, controller, want) in cases {
            assert_eq!(
                adopted_by_successor(&o, &state, controller),
                want,
                "{state:?} {controller:?}"
            );
        }
    }
}
