//! What the liveness rules need from this machine: who the node is, which
//! boot this is, and whether a holder's netns is still the one it recorded.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::claim::Holder;
use crate::cri::{CriClient, SandboxRuntime};
use crate::liveness::{
    is_local, judge, judge_by_runtime, needs_runtime, Caller, Here, Inspector, NetnsState,
    NodeFacts, Verdict,
};

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The node name (`nodeName` from the config, else the hostname) and boot id.
pub fn node_facts(node_name: Option<&str>) -> NodeFacts {
    NodeFacts {
        node: node_name
            .map(str::to_string)
            .or_else(|| read_trimmed("/proc/sys/kernel/hostname"))
            .unwrap_or_else(|| "localhost".into()),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
    }
}

/// Where `sticky-macvlan install` writes the node's name on the host,
/// beside the plugin's kubeconfig (`--host-conf-dir`'s default).
pub const INSTALLED_NODENAME: &str = "/etc/cni/net.d/sticky-macvlan.d/nodename";

/// What this machine says of itself: hostname, boot id, and the
/// installer's `nodename` file, looked for beside `kubeconfig` (as the
/// plugin reads it) and then at `INSTALLED_NODENAME`.
pub fn here(kubeconfig: Option<&Path>) -> Here {
    let beside = kubeconfig.map(|k| match k.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("nodename"),
        _ => PathBuf::from("nodename"),
    });
    let mut looked = Vec::new();
    let mut nodename = None;
    for path in beside
        .into_iter()
        .chain([PathBuf::from(INSTALLED_NODENAME)])
    {
        let shown = path.display().to_string();
        if looked.contains(&shown) {
            continue;
        }
        looked.push(shown.clone());
        let name = std::fs::read_to_string(&path)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        if let Some(name) = name {
            nodename = Some((shown, name));
            break;
        }
    }
    Here {
        hostname: read_trimmed("/proc/sys/kernel/hostname").unwrap_or_else(|| "localhost".into()),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
        nodename,
        looked,
    }
}

/// "dev:inode" of a netns path: the identity of the namespace behind it.
pub fn netns_id(path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    std::fs::metadata(path)
        .ok()
        .map(|m| format!("{}:{}", m.dev(), m.ino()))
}

pub fn netns_state(holder: &Holder) -> NetnsState {
    match std::fs::metadata(Path::new(&holder.netns)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => NetnsState::Gone,
        // Unreadable: we cannot prove it dead, so it counts as present.
        Err(_) => NetnsState::Present,
        Ok(m) => match &holder.netns_id {
            Some(id) if *id != format!("{}:{}", m.dev(), m.ino()) => NetnsState::Replaced,
            _ => NetnsState::Present,
        },
    }
}

/// Liveness from this node's own evidence (no Kubernetes API).
pub struct LocalInspector {
    pub node: NodeFacts,
    /// Asked about holders that name no netns (adopted from host-local).
    pub runtime: Option<Box<dyn SandboxRuntime>>,
}

impl LocalInspector {
    /// This node's evidence, with the CRI runtime at `cri_socket` (None:
    /// not asked).
    pub fn new(node: NodeFacts, cri_socket: Option<&Path>) -> LocalInspector {
        LocalInspector {
            node,
            runtime: cri_socket
                .map(|s| Box::new(CriClient::new(s, CRI_TIMEOUT)) as Box<dyn SandboxRuntime>),
        }
    }
}

/// A CRI call answers in milliseconds; this bounds an ADD that asks one.
const CRI_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Inspector for LocalInspector {
    fn verdict(&self, holder: &Holder, caller: Option<&Caller>) -> Verdict {
        let netns = if is_local(holder, &self.node) {
            netns_state(holder)
        } else {
            NetnsState::Unknown
        };
        let verdict = judge(holder, caller, &self.node, netns);
        match &self.runtime {
            Some(runtime) if needs_runtime(holder, &self.node, &verdict) => judge_by_runtime(
                holder,
                &runtime.sandbox(&holder.container_id),
                &runtime.describe(),
            ),
            _ => verdict,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::SandboxState;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A runtime that knows the listed sandboxes and records every ask.
    struct Scripted {
        present: Vec<&'static str>,
        asked: Rc<RefCell<Vec<String>>>,
    }

    impl SandboxRuntime for Scripted {
        fn sandbox(&self, id: &str) -> SandboxState {
            self.asked.borrow_mut().push(id.to_string());
            if self.present.contains(&id) {
                SandboxState::Present(crate::cri::Sandbox::default())
            } else {
                SandboxState::Absent
            }
        }
        fn describe(&self) -> String {
            "the scripted runtime".into()
        }
    }

    fn imported(cid: &str, node: &str) -> Holder {
        Holder {
            container_id: cid.into(),
            ifname: "net1".into(),
            netns: String::new(),
            netns_id: None,
            pod_namespace: None,
            pod_name: None,
            pod_uid: None,
            node: node.into(),
            boot_id: "b1".into(),
            since: 0,
        }
    }

    #[test]
    fn the_runtime_is_asked_only_about_this_nodes_holders_without_a_netns() {
        let asked = Rc::new(RefCell::new(Vec::new()));
        let inspector = LocalInspector {
            node: NodeFacts {
                node: "n1".into(),
                boot_id: "b1".into(),
            },
            runtime: Some(Box::new(Scripted {
                present: vec!["live"],
                asked: Rc::clone(&asked),
            })),
        };
        assert!(inspector.verdict(&imported("gone", "n1"), None).is_dead());
        assert!(!inspector.verdict(&imported("live", "n1"), None).is_dead());
        // Another node's holder: this node's runtime knows nothing of it.
        assert!(!inspector.verdict(&imported("gone", "n2"), None).is_dead());
        // A holder with a netns is judged by its netns, not the runtime.
        let mut with_netns = imported("gone", "n1");
        with_netns.netns = "/proc/self/ns/net".into();
        assert!(!inspector.verdict(&with_netns, None).is_dead());
        assert_eq!(
            *asked.borrow(),
            vec!["gone".to_string(), "live".to_string()]
        );
        let without = LocalInspector::new(inspector.node.clone(), None);
        assert!(
            !without.verdict(&imported("gone", "n1"), None).is_dead(),
            "with no runtime to ask, nothing is concluded"
        );
    }
}
