//! sticky-ops: everything a person, the installer DaemonSet or the
//! reconcile Deployment runs, as opposed to what the container runtime
//! runs (the CNI verbs, in `sticky-macvlan`).
//!
//! Layers, top down:
//! - `dispatch`: the one table of commands, the only source of their help;
//!   `kubectl` translates kubectl's flags onto it.
//! - one module per command: `claims`, `release`, `reconcile` (with
//!   `metrics` and `stop`), `import` (host-local, Whereabouts), `install`,
//!   `doctor`, `crd`.
//! - what the claim commands share: `options` (the flags, the store, the
//!   networks) and `judge` (whose evidence liveness uses).
//! - `admin`: the API requests only these commands make, on the hot
//!   path's `KubeClient` transport but apart from its `KubeApi`.
//!
//! Below it: `sticky_ipam` (identities, the engine, the stores, liveness)
//! and `cni` (the protocol). Above it: the binaries in `plugin/`, which
//! hand `doctor` their datapath (`doctor::Datapath`).

pub mod admin;
pub mod claims;
pub mod crd;
pub mod dispatch;
pub mod doctor;
pub mod import;
pub mod install;
pub mod judge;
pub mod kubectl;
pub mod metrics;
pub mod options;
pub mod reconcile;
pub mod release;
pub mod stop;

#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tests;
