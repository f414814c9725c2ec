//! Kubernetes Events on the pod for what an operator acts on: a refused
//! ADD (a live holder, an exhausted pool, a reserved address, an answer on
//! the wire, a namespace not allowed), and an address taken over from a
//! dead holder or reclaimed from another identity. `kubectl describe pod`
//! then shows ours beside kubelet's `FailedCreatePodSandBox`, whose text
//! Multus may have wrapped. Which events, with what reason and message, is
//! decided here without I/O; `StickyIpam` posts them, best effort
//! (`kube::client::EVENT_DEADLINE`), on the kubernetes store only.

use cni::{CniError, Refusal};

use crate::claim::Holder;
use crate::probe_policy::Origin;

/// Kubernetes keeps an Event's message short; ours name the address, the
/// identity and the old holder well within this.
const MAX_MESSAGE: usize = 1024;

pub const TAKEN_OVER: &str = "StickyAddressTakenOver";
pub const RECLAIMED: &str = "StickyAddressReclaimed";

/// The Event reason of a refusal (UpperCamelCase, as Kubernetes reasons
/// are); the protocol crate only classifies, this names it for the cluster.
pub fn refusal_reason(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::HolderAlive => "StickyAddressHeld",
        Refusal::PoolExhausted => "StickyPoolExhausted",
        Refusal::AddressReserved => "StickyAddressReserved",
        Refusal::AnsweredOnWire => "StickyAddressAnswered",
        Refusal::NamespaceNotAllowed => "StickyNamespaceNotAllowed",
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// The CNI network the ADD was for (labels the Event, for metrics).
    pub network: String,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: Option<String>,
    /// UpperCamelCase, as Kubernetes reasons are.
    pub reason: &'static str,
    pub message: String,
    /// Warning for refusals, Normal for the rest.
    pub warning: bool,
    /// Where it happened (the Event's source host).
    pub node: String,
}

/// One of our Events as the API lists it (for reconcile's metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenEvent {
    pub uid: String,
    pub network: String,
    pub reason: String,
    /// How many times it happened (`count`: a repeat bumps it).
    pub count: u64,
}

/// The Event's object name: the same for the same pod, network, reason
/// and message, so a refusal that every kubelet retry meets again is one
/// Event whose count grows ("x5 over 2m" in `kubectl describe`), as
/// kubelet's own Events are, not one more object per retry.
pub fn event_name(e: &PodEvent) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [
        e.pod_uid.as_deref().unwrap_or_default(),
        &e.network,
        e.reason,
        &e.message,
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let hex: String = h
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    // A name is at most 253 characters; a pod name may be as long.
    let pod: String = e.pod.chars().take(253 - 1 - hex.len()).collect();
    format!("{pod}.{hex}")
}

/// What the pod of `caller` is told of an address it was granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantNote {
    pub origin: Origin,
    pub reclaimed: bool,
    /// The engine's account: whose address it was and why it could move.
    pub note: Option<String>,
}

fn event(
    caller: &Holder,
    network: &str,
    reason: &'static str,
    message: String,
    warning: bool,
) -> Option<PodEvent> {
    let (Some(namespace), Some(pod)) = (caller.pod_namespace.clone(), caller.pod_name.clone())
    else {
        // No pod to attach it to (a runtime without K8S_POD_* args).
        return None;
    };
    let mut message = message;
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    Some(PodEvent {
        network: network.to_string(),
        namespace,
        pod,
        pod_uid: caller.pod_uid.clone(),
        reason,
        message,
        warning,
        node: caller.node.clone(),
    })
}

/// The Warning for a refused ADD, when the refusal is one a person acts
/// on (`CniError::refusal`); other failures (a bad config, an API error)
/// are kubelet's to report.
pub fn for_refusal(caller: &Holder, network: &str, err: &CniError) -> Option<PodEvent> {
    let refusal = err.refusal?;
    event(
        caller,
        network,
        refusal_reason(refusal),
        format!("network {network:?}: {}", err.msg),
        true,
    )
}

/// The Normal events for the addresses an ADD was granted: one for each
/// taken over from another pod's dead holder or reclaimed from another
/// identity. A pod's own earlier sandbox, a reserved or fresh address is
/// routine and says nothing.
pub fn for_grants(caller: &Holder, network: &str, grants: &[GrantNote]) -> Vec<PodEvent> {
    grants
        .iter()
        .filter_map(|g| {
            let reason = if g.reclaimed {
                RECLAIMED
            } else if g.origin == Origin::TakenOver {
                TAKEN_OVER
            } else {
                return None;
            };
            let note = g.note.as_deref().unwrap_or("its holder was judged dead");
            event(
                caller,
                network,
                reason,
                format!("network {network:?}: {note}"),
                false,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni::{code, Refusal};

    fn caller(ns: Option<&str>) -> Holder {
        Holder {
            container_id: "c2".into(),
            ifname: "net1".into(),
            netns: "/run/netns/x".into(),
            netns_id: None,
            pod_namespace: ns.map(str::to_string),
            pod_name: ns.map(|_| "db-0".to_string()),
            pod_uid: Some("uid-2".into()),
            node: "node2".into(),
            boot_id: "b".into(),
            since: 1,
        }
    }

    #[test]
    fn a_repeated_event_keeps_its_name_and_a_different_one_does_not() {
        let held = CniError::new(code::TRY_AGAIN_LATER, "172.31.59.2 is held by pod db/db-0")
            .refused_as(Refusal::HolderAlive);
        let e = for_refusal(&caller(Some("db")), "fabric", &held).unwrap();
        let name = event_name(&e);
        assert!(
            name.starts_with("db-0.") && name.len() == "db-0.".len() + 16,
            "{name}"
        );
        assert_eq!(event_name(&e.clone()), name);
        for other in [
            PodEvent {
                message: "another".into(),
                ..e.clone()
            },
            PodEvent {
                network: "other".into(),
                ..e.clone()
            },
            PodEvent {
                reason: "StickyPoolExhausted",
                ..e.clone()
            },
            PodEvent {
                pod_uid: Some("uid-9".into()),
                ..e.clone()
            },
        ] {
            assert_ne!(event_name(&other), name, "{other:?}");
        }
        let long = PodEvent {
            pod: "p".repeat(253),
            ..e
        };
        assert_eq!(event_name(&long).len(), 253);
    }

    #[test]
    fn refusals_a_person_acts_on_become_warnings() {
        let held = CniError::new(code::TRY_AGAIN_LATER, "172.31.59.2 is held by pod db/db-0")
            .refused_as(Refusal::HolderAlive);
        let cases: Vec<(CniError, Option<&str>)> = vec![
            (held.clone(), Some("StickyAddressHeld")),
            (
                CniError::new(code::TRY_AGAIN_LATER, "no free address")
                    .refused_as(Refusal::PoolExhausted),
                Some("StickyPoolExhausted"),
            ),
            (
                CniError::new(code::TRY_AGAIN_LATER, "answered")
                    .refused_as(Refusal::AnsweredOnWire),
                Some("StickyAddressAnswered"),
            ),
            (
                CniError::new(code::NAMESPACE_NOT_ALLOWED, "other namespace")
                    .refused_as(Refusal::NamespaceNotAllowed),
                Some("StickyNamespaceNotAllowed"),
            ),
            (
                CniError::new(code::TRY_AGAIN_LATER, "reserved")
                    .refused_as(Refusal::AddressReserved),
                Some("StickyAddressReserved"),
            ),
            // Not a refusal: kubelet's event says it already.
            (CniError::invalid_config("bad subnet"), None),
            (CniError::new(code::STORE_UNREACHABLE, "no answer"), None),
        ];
        for (err, want) in cases {
            let got = for_refusal(&caller(Some("db")), "fabric", &err);
            assert_eq!(got.as_ref().map(|e| e.reason), want, "{err:?}");
            if let Some(e) = got {
                assert!(e.warning);
                assert_eq!((e.namespace.as_str(), e.pod.as_str()), ("db", "db-0"));
                assert_eq!(e.pod_uid.as_deref(), Some("uid-2"));
                assert_eq!(e.node, "node2");
                assert!(
                    e.message.starts_with("network \"fabric\": "),
                    "{}",
                    e.message
                );
                assert!(e.message.ends_with(&err.msg));
            }
        }
        // No pod to tell.
        assert_eq!(for_refusal(&caller(None), "fabric", &held), None);
    }

    #[test]
    fn takeovers_and_reclaims_are_told_and_routine_grants_are_not() {
        let note = |origin: Origin, reclaimed: bool| GrantNote {
            origin,
            reclaimed,
            note: Some(
                "took 172.31.59.2 over from pod db/db-0 on node node1: its node is gone".into(),
            ),
        };
        let cases = [
            (note(Origin::TakenOver, false), Some(TAKEN_OVER)),
            (note(Origin::TakenOver, true), Some(RECLAIMED)),
            (note(Origin::Unheld, true), Some(RECLAIMED)),
            (note(Origin::Fresh, false), None),
            (note(Origin::Unheld, false), None),
            (note(Origin::SameAttachment, false), None),
            (
                note(
                    Origin::SamePod {
                        node: "node1".into(),
                    },
                    false,
                ),
                None,
            ),
        ];
        for (grant, want) in cases {
            let got = for_grants(&caller(Some("db")), "fabric", std::slice::from_ref(&grant));
            assert_eq!(got.first().map(|e| e.reason), want, "{grant:?}");
            assert!(got
                .iter()
                .all(|e| !e.warning && e.message.contains("took 172.31.59.2 over")));
        }
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let err = CniError::new(code::TRY_AGAIN_LATER, "é".repeat(2000))
            .refused_as(Refusal::PoolExhausted);
        let e = for_refusal(&caller(Some("db")), "fabric", &err).unwrap();
        assert!(e.message.len() <= MAX_MESSAGE && e.message.ends_with("..."));
    }
}
