//! sticky-ipam: identity-keyed IP address management. Everything an ADD,
//! DEL, CHECK, STATUS or GC decides about addresses, for sticky-macvlan
//! (in-process) and for the standalone `sticky-ipam` binary alike.
//!
//! Layers, from the entry point down; each uses only those below it:
//! - `cni_ipam`: `StickyIpam`, the verbs on one attachment.
//! - `backend`: which store and which liveness judge, chosen once.
//! - `engine`: the decisions as `Plan`s (`plan_add`, `plan_del`, ...),
//!   pure over `store::ClaimStore`; with `identity`, `tenancy`, `probe_policy`
//!   (which grants the wire must confirm) and `retention`, also pure.
//! - `liveness`: the `Inspector` seam and its pure verdicts; `system`
//!   (this node's evidence), `kube::inspector` (the API's), `cri` (the
//!   container runtime's).
//! - `store`: `ClaimStore` and its two stores, `file` and `ipclaim` (the
//!   kubernetes store), with `retry` for a plan that lost a race.
//! - `kube`: the `KubeApi` seam (the requests the verbs make), its real
//!   client and a recording fake; `events` says what a pod is told.
//! - `config`, `claim`, `pod`, `addr`: the records and their parsing.
//!
//! API boundaries: the CNI protocol comes from `cni`; the operator
//! commands (claims, release, reconcile, importers, install, doctor) are
//! the `sticky-ops` crate's, which uses this one through `backend`,
//! `engine`, `liveness` and the `kube` client; probing the wire is the
//! plugin's (`sticky-macvlan`), told what to probe by `probe_policy`.

pub mod addr;
pub mod backend;
pub mod claim;
pub mod cni_ipam;
pub mod config;
pub mod cri;
pub mod engine;
pub mod events;
pub mod identity;
pub mod ipamclaim;
pub mod kube;
pub mod liveness;
pub mod pod;
pub mod probe_policy;
pub mod retention;
pub mod store;
pub mod system;
pub mod tenancy;
