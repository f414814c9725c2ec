//! What the IPAM knows of the pod an ADD is for, or of a holder's pod,
//! wherever it was learnt (the kubernetes API today): identity and
//! liveness read it, the kube client fills it.

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
    /// (name, uid) of the StatefulSet that controls the pod.
    pub stateful_set: Option<(String, String)>,
}
