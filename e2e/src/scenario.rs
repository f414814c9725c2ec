//! The steps every scenario repeats: a CNI call from a node for a pod, as
//! kubelet (through Multus) would make it.

use serde_json::Value;

use crate::{CniCall, CniReply, Pod, Topology};

/// `cmd` by our plugin from node `node` for `pod`.
pub fn call(
    topo: &Topology,
    node: usize,
    cmd: &str,
    conf: &Value,
    cid: &str,
    pod: &Pod,
    args: &str,
) -> CniReply {
    CniCall::new(
        &crate::our_plugin(),
        &topo.node(node).netns,
        cmd,
        conf.clone(),
    )
    .container(cid)
    .netns(&pod.path)
    .args(args)
    .run()
}

/// `CNI_ARGS` as Multus passes them for a pod (`IgnoreUnknown` twice, as
/// it does).
pub fn pod_args(namespace: &str, name: &str, uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=infra;K8S_POD_UID={uid};IgnoreUnknown=1")
}

/// The operator CLI (`sticky-macvlan ARGS`) on this machine, outside any
/// CNI call: (success, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(crate::our_plugin())
        .args(args)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run the operator CLI");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}
