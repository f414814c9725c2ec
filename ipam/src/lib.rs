//! Identity-keyed IP address management.
//!
//! Empty for now: the sticky-ipam issue fills this crate with identity
//! resolution, allocation, claim stores and liveness verdicts. Until then
//! `sticky-macvlan` delegates every `ipam.type` to a binary on `CNI_PATH`.
