//! What `doctor` (in sticky-ops) asks of this plugin: its config parsed as
//! a pod start parses it, and this netns's links read over netlink.

use serde_json::Value;
use sticky_ops::doctor::{Datapath, LinkFacts, Network};

use crate::commands::connect;
use crate::datapath::{Netlink, Ns};
use crate::ipam_driver::IN_PROCESS;
use crate::netconf::NetConf;

/// The node's netns, as the doctor process sees it.
pub struct NodeDatapath;

impl Datapath for NodeDatapath {
    fn plugin_type(&self) -> &'static str {
        "sticky-macvlan"
    }

    fn network(&self, entry: &[u8]) -> Result<Network, String> {
        let conf = NetConf::parse(entry).map_err(|e| e.msg)?;
        let ipam: Option<Value> = conf
            .common
            .ipam
            .as_ref()
            .filter(|section| section.plugin_type == IN_PROCESS)
            .map(|section| section.raw.clone());
        Ok(Network {
            name: conf.common.name,
            master: conf.master,
            link_in_container: conf.link_in_container,
            ipam,
        })
    }

    fn default_route_link(&self) -> Result<Option<String>, String> {
        let mut nl = connect(None).map_err(|e| e.msg)?;
        nl.default_route_link(Ns::Node).map_err(|e| e.to_string())
    }

    fn link(&self, name: &str) -> Result<Option<LinkFacts>, String> {
        let mut nl = connect(None).map_err(|e| e.msg)?;
        let link = nl.link_by_name(Ns::Node, name).map_err(|e| e.to_string())?;
        Ok(link.map(|l| LinkFacts {
            mtu: l.mtu,
            up: l.up,
            port_kind: l.port_kind,
        }))
    }
}
