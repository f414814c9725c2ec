//! Bad input through the real binary: the right CNI code, a message naming
//! the problem, no panic, and nothing left behind (no link in the pod, no
//! address held by the IPAM). Where the check lives in libcni's skel, the
//! reference plugin must answer with the same code.

use std::os::unix::fs::PermissionsExt;

use serde_json::{json, Value};
use sticky_e2e::configs::{self, OUR_TYPE, REF_TYPE};
use sticky_e2e::state::link_names;
use sticky_e2e::{ip, our_plugin, reference_plugin, CniCall, CniReply, Topology};

struct Env<'a> {
    topo: &'a mut Topology,
    n: usize,
}

impl Env<'_> {
    /// A fresh pod and a host-local dir for one case.
    fn call(
        &mut self,
        plugin_type: &str,
        version: &str,
        extra: Value,
    ) -> (CniCall, String, std::path::PathBuf) {
        self.n += 1;
        let pod = self.topo.add_pod(&format!("bad{}-{plugin_type}", self.n));
        let dir = self.topo.file(&format!("bad{}-{plugin_type}", self.n));
        let mut config =
            configs::macvlan(plugin_type, version, "uplink0", configs::host_local(&dir));
        configs::merge(&mut config, &extra);
        let plugin = if plugin_type == OUR_TYPE {
            our_plugin()
        } else {
            reference_plugin("macvlan")
        };
        let call = CniCall::new(&plugin, &self.topo.node(0).netns, "ADD", config).netns(&pod.path);
        (call, pod.netns, dir)
    }
}

mod ipam_input;
mod plugin_input;
