//! Creating, configuring, checking and removing the pod's macvlan, on any
//! `Netlink`. No I/O of its own, so every rollback path is unit-tested
//! against the fake. `link`: the link's life (master, create and rename,
//! leftovers, removal); `l3`: addresses, up, routes and DAD; `probe`: the
//! wire (probes before binding, announcements, the sticky MAC, the gateway
//! check); `check`: CHECK against a previous result.

use super::{format_mac, Mac, MacvlanMode, NlError, Ns};
use crate::cni::CniError;

mod check;
mod l3;
mod link;
mod probe;

pub use check::{check_link, Expected};
pub use l3::{configure_l2, configure_l3, fallback_gateways, settle_ipv6};
pub use link::{
    create_link, discard_link, owner_alias, remove_link, replace_own_leftover, resolve_master,
    tmp_name, with_cleanup,
};
pub use probe::{announce_addresses, check_gateways, probe_addresses, sticky_mac};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    pub name: String,
    pub index: u32,
    pub mtu: u32,
    pub ns: Ns,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub mode: MacvlanMode,
    /// 0 inherits the master's MTU.
    pub mtu: u32,
    pub mac: Option<Mac>,
    pub bc_queue_len: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedLink {
    pub index: u32,
    pub name: String,
    pub mac: Option<Mac>,
}

impl CreatedLink {
    pub fn mac_string(&self) -> Option<String> {
        self.mac.as_ref().map(format_mac)
    }
}

fn datapath(e: NlError) -> CniError {
    CniError::datapath(e.to_string())
}

#[cfg(test)]
mod tests;
