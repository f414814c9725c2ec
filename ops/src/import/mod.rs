//! The importers: a node's host-local allocations or a Whereabouts range,
//! adopted as claims so a live cluster switches without IP conflicts.

mod adoption;
pub mod host_local;
pub mod whereabouts;
