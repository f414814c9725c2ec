//! sticky-macvlan: a CNI main plugin that puts a macvlan into the pod's
//! netns. See ARCHITECTURE.md for the map.

pub mod attach;
pub use cni;
pub mod commands;
pub mod datapath;
pub mod doctor_datapath;
pub mod ipam_driver;
pub mod netconf;
pub mod standalone;
pub use cni::log;

#[cfg(test)]
mod reference_tests;
