//! "Once the old holder is confirmed dead" (docs/src/concepts/allocation-and-liveness.md), for the
//! evidence a node has without the Kubernetes API. `judge` is pure; what it
//! needs from the system comes in as `NodeFacts` and `NetnsState`.

use crate::claim::Holder;
use crate::cri::SandboxState;

/// What this process knows about the node it runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub node: String,
    pub boot_id: String,
}

/// What this machine says of itself (read by `system::here`), from which
/// an operator command decides whose node-local evidence it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Here {
    pub hostname: String,
    /// Empty when it could not be read.
    pub boot_id: String,
    /// The installer's `nodename` file: where it was read and the node it
    /// names; None when there is none.
    pub nodename: Option<(String, String)>,
    /// Where that file was looked for, for the messages.
    pub looked: Vec<String>,
}

/// What the API says of the boot of the node an operator command names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeBoot {
    /// The Node's `status.nodeInfo.bootID`.
    Reported(String),
    /// The Node exists and reports none.
    NotReported,
    /// The API has no Node of that name.
    NoNode,
    /// The Node could not be read (why).
    Unknown(String),
}

/// Where an operator command's verdicts on the kubernetes store get their
/// evidence, decided once per command by `node_evidence`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// This machine is proven to be `facts.node`: its boot id and netns
    /// paths are evidence about that node's holders, then the API.
    ThisNode { facts: NodeFacts, proof: String },
    /// The API alone: no machine's boot id or netns paths are looked at.
    ApiOnly { why: String },
}

impl Evidence {
    /// What verdicts are judged from, and why, for the command's output.
    pub fn describe(&self) -> String {
        match self {
            Evidence::ThisNode { facts, proof } => format!(
                "node {}'s own evidence (its boot id and netns paths) and the kubernetes API: this machine is {}: {proof}",
                facts.node, facts.node
            ),
            Evidence::ApiOnly { why } => format!("the kubernetes API only: {why}"),
        }
    }
}

/// Whether this machine (`here`) may judge holders of `requested` (the
/// command's `--node`) by its own boot id and netns paths. Only when it
/// provably is that node: the installer's nodename file names it, and the
/// Node's boot id (`boot`, from the API) is this machine's or unreported.
/// A boot id alone proves nothing, since nodes that share one kernel (the
/// local cluster's, kind's) share it. Anything else: the API alone.
pub fn node_evidence(requested: Option<&str>, here: &Here, boot: &NodeBoot) -> Evidence {
    let api_only = |why: String| Evidence::ApiOnly { why };
    let Some(node) = requested else {
        return api_only("no --node was given".into());
    };
    if here.boot_id.is_empty() {
        return api_only(format!(
            "this machine's boot id could not be read, so nothing proves it is {node}"
        ));
    }
    match boot {
        NodeBoot::Reported(theirs) if *theirs != here.boot_id => {
            return api_only(format!(
                "this machine is not {node} (boot id differs: this machine's is {}, Node {node} reports {theirs})",
                here.boot_id
            ))
        }
        NodeBoot::NoNode => {
            return api_only(format!(
                "the kubernetes API has no Node {node}: check --node"
            ))
        }
        _ => {}
    }
    let path = match &here.nodename {
        None => {
            return api_only(format!(
                "this machine is not proven to be {node}: it has no nodename file of the installer ({}); run the command on {node} to use its netns paths",
                if here.looked.is_empty() { "none looked for".into() } else { here.looked.join(", ") }
            ))
        }
        Some((path, name)) if name != node => {
            return api_only(format!(
                "this machine is {name} (the installer's nodename file {path}), not {node}"
            ))
        }
        Some((path, _)) => path,
    };
    let proof = match boot {
        NodeBoot::Unknown(why) => {
            return api_only(format!(
                "Node {node} could not be read to compare its boot id with this machine's ({why})"
            ))
        }
        NodeBoot::Reported(_) => format!(
            "the installer's nodename file {path} names it, and Node {node} reports this machine's boot id"
        ),
        _ => format!(
            "the installer's nodename file {path} names it (Node {node} reports no boot id to compare)"
        ),
    };
    Evidence::ThisNode {
        facts: NodeFacts {
            node: node.to_string(),
            boot_id: here.boot_id.clone(),
        },
        proof,
    }
}

/// What the caller is, when a verdict is asked for on its behalf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    pub pod_uid: Option<String>,
}

/// The holder's netns as seen now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetnsState {
    /// The path does not exist (or is no longer a netns mount).
    Gone,
    /// The path exists but is another netns than the one recorded at ADD.
    Replaced,
    /// The recorded netns is still there.
    Present,
    /// Not checked: the holder is not on this node or names no netns.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Dead(String),
    Alive(String),
}

impl Verdict {
    pub fn is_dead(&self) -> bool {
        matches!(self, Verdict::Dead(_))
    }

    pub fn reason(&self) -> &str {
        match self {
            Verdict::Dead(r) | Verdict::Alive(r) => r,
        }
    }
}

/// The liveness seam: the real one looks at netns paths, tests script it.
pub trait Inspector {
    fn verdict(&self, holder: &Holder, caller: Option<&Caller>) -> Verdict;
    /// Why the sticky claim of `identity` has outlived its `owner` (a
    /// StatefulSet deleted, or scaled below its ordinal, under a Delete
    /// retention: `crate::retention`), so its address may go back to the
    /// pool; None while it is kept. Without the API nothing is known, so
    /// nothing retires.
    fn owner_retired(&self, _owner: &crate::claim::Owner, _identity: &str) -> Option<String> {
        None
    }
}

/// Whether the holder's netns is worth looking at from here.
pub fn is_local(holder: &Holder, node: &NodeFacts) -> bool {
    holder.node == node.node && holder.boot_id == node.boot_id && !holder.netns.is_empty()
}

pub fn judge(
    holder: &Holder,
    caller: Option<&Caller>,
    node: &NodeFacts,
    netns: NetnsState,
) -> Verdict {
    if let (Some(mine), Some(theirs)) = (
        caller.and_then(|c| c.pod_uid.as_deref()),
        holder.pod_uid.as_deref(),
    ) {
        if !mine.is_empty() && mine == theirs {
            return Verdict::Dead(format!(
                "the same pod (UID {mine}) has a new sandbox, so the old one is gone"
            ));
        }
    }
    if holder.node != node.node {
        return Verdict::Alive(format!(
            "it is on node {}, whose pods this node cannot inspect without the kubernetes store: it is released by its own DEL or `sticky-macvlan release`",
            holder.node
        ));
    }
    if !holder.boot_id.is_empty() && holder.boot_id != node.boot_id {
        return Verdict::Dead("node rebooted since it was recorded".into());
    }
    match netns {
        NetnsState::Gone => Verdict::Dead(format!("its netns {} no longer exists", holder.netns)),
        NetnsState::Replaced => Verdict::Dead(format!(
            "its netns {} was replaced by another network namespace",
            holder.netns
        )),
        NetnsState::Present => Verdict::Alive(format!(
            "its netns {} still exists, so it is still running",
            holder.netns
        )),
        NetnsState::Unknown => Verdict::Alive(
            "it names no netns this node can check (imported or recorded without one)".into(),
        ),
    }
}

/// Whether a holder with no netns to check (adopted from host-local,
/// whose files name only the sandbox) is judged by the container runtime:
/// only on the node that recorded it, in the same boot.
pub fn needs_runtime(holder: &Holder, node: &NodeFacts, verdict: &Verdict) -> bool {
    holder.netns.is_empty()
        && holder.node == node.node
        && (holder.boot_id.is_empty() || holder.boot_id == node.boot_id)
        && !verdict.is_dead()
}

/// The verdict from what the runtime (`from`) says of the holder's
/// sandbox: gone is dead; present, or no answer, is alive.
pub fn judge_by_runtime(holder: &Holder, state: &SandboxState, from: &str) -> Verdict {
    let short: String = holder.container_id.chars().take(12).collect();
    match state {
        SandboxState::Absent => Verdict::Dead(format!(
            "{from} has no pod sandbox {short} any more"
        )),
        SandboxState::Present(s) => Verdict::Alive(format!(
            "{from} still has its pod sandbox {short} (pod {}/{}{})",
            s.namespace,
            s.name,
            if s.ready { "" } else { ", not ready" }
        )),
        SandboxState::Unknown(why) => Verdict::Alive(format!(
            "it names no netns, and {from} could not be asked whether its sandbox {short} exists ({why})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_judges_holders_without_a_netns() {
        use crate::cri::Sandbox;
        let mut imported = holder();
        imported.netns = String::new();
        let here = node("n1", "b1");
        let alive = Verdict::Alive("x".into());
        assert!(needs_runtime(&imported, &here, &alive));
        assert!(
            !needs_runtime(&holder(), &here, &alive),
            "it has a netns to check"
        );
        assert!(
            !needs_runtime(&imported, &node("n2", "b1"), &alive),
            "another node's"
        );
        assert!(
            !needs_runtime(&imported, &node("n1", "b2"), &alive),
            "an earlier boot"
        );
        assert!(!needs_runtime(&imported, &here, &Verdict::Dead("x".into())));
        let from = "the container runtime at /run/cri.sock";
        let cases = [
            (SandboxState::Absent, true, "has no pod sandbox c1"),
            (
                SandboxState::Present(Sandbox {
                    id: "c1".into(),
                    name: "db-0".into(),
                    namespace: "db".into(),
                    ..Sandbox::default()
                }),
                false,
                "pod db/db-0, not ready",
            ),
            (
                SandboxState::Unknown("refused".into()),
                false,
                "could not be asked",
            ),
        ];
        for (state, dead, says) in cases {
            let v = judge_by_runtime(&imported, &state, from);
            assert_eq!(v.is_dead(), dead, "{v:?}");
            assert!(
                v.reason().contains(says) && v.reason().contains(from),
                "{v:?}"
            );
        }
    }

    fn holder() -> Holder {
        Holder {
            container_id: "c1".into(),
            ifname: "net1".into(),
            netns: "/run/netns/p1".into(),
            netns_id: Some("4:100".into()),
            pod_namespace: Some("default".into()),
            pod_name: Some("rs0-0".into()),
            pod_uid: Some("uid-1".into()),
            node: "n1".into(),
            boot_id: "b1".into(),
            since: 0,
        }
    }

    fn node(name: &str, boot: &str) -> NodeFacts {
        NodeFacts {
            node: name.into(),
            boot_id: boot.into(),
        }
    }

    #[test]
    fn verdict_table() {
        let same_pod = Caller {
            pod_uid: Some("uid-1".into()),
        };
        let other_pod = Caller {
            pod_uid: Some("uid-2".into()),
        };
        let empty_uid = Caller {
            pod_uid: Some(String::new()),
        };
        let n1 = node("n1", "b1");
        let cases: Vec<(Option<&Caller>, NodeFacts, NetnsState, bool, &str)> = vec![
            (
                Some(&same_pod),
                node("n2", "b9"),
                NetnsState::Present,
                true,
                "same pod",
            ),
            (
                Some(&other_pod),
                n1.clone(),
                NetnsState::Present,
                false,
                "still exists",
            ),
            (
                Some(&other_pod),
                n1.clone(),
                NetnsState::Gone,
                true,
                "no longer exists",
            ),
            (None, n1.clone(), NetnsState::Replaced, true, "replaced"),
            (
                None,
                n1.clone(),
                NetnsState::Unknown,
                false,
                "names no netns",
            ),
            (
                Some(&empty_uid),
                n1.clone(),
                NetnsState::Present,
                false,
                "still exists",
            ),
            (
                None,
                node("n2", "b1"),
                NetnsState::Gone,
                false,
                "on node n1",
            ),
            (
                None,
                node("n1", "b2"),
                NetnsState::Present,
                true,
                "rebooted",
            ),
        ];
        for (caller, facts, ns, dead, why) in cases {
            let v = judge(&holder(), caller, &facts, ns);
            assert_eq!(v.is_dead(), dead, "{v:?}");
            assert!(v.reason().contains(why), "{v:?} lacks {why:?}");
        }
    }

    /// (case, --node, this machine, the Node's boot, this node's evidence?,
    /// the output says)
    type EvidenceCase = (
        &'static str,
        Option<&'static str>,
        Here,
        NodeBoot,
        bool,
        &'static str,
    );

    #[test]
    fn where_the_evidence_comes_from() {
        let here = |nodename: Option<&str>, boot: &str| Here {
            hostname: "host".into(),
            boot_id: boot.into(),
            nodename: nodename
                .map(|n| ("/etc/cni/net.d/sticky-macvlan.d/nodename".into(), n.into())),
            looked: vec!["/etc/cni/net.d/sticky-macvlan.d/nodename".into()],
        };
        let reported = NodeBoot::Reported("b2".into());
        let cases: Vec<EvidenceCase> = vec![
            (
                "no --node",
                None,
                here(Some("node2"), "b2"),
                NodeBoot::NotReported,
                false,
                "no --node was given",
            ),
            (
                "on node2, boot ids equal",
                Some("node2"),
                here(Some("node2"), "b2"),
                reported.clone(),
                true,
                "reports this machine's boot id",
            ),
            (
                "on node2, no boot id reported",
                Some("node2"),
                here(Some("node2"), "b2"),
                NodeBoot::NotReported,
                true,
                "reports no boot id to compare",
            ),
            (
                "a workstation",
                Some("node2"),
                here(None, "b9"),
                reported.clone(),
                false,
                "this machine is not node2 (boot id differs",
            ),
            (
                "a copied nodename file",
                Some("node2"),
                here(Some("node2"), "b9"),
                reported.clone(),
                false,
                "boot id differs",
            ),
            (
                "a host sharing node2's kernel",
                Some("node2"),
                here(None, "b2"),
                reported.clone(),
                false,
                "no nodename file of the installer (/etc/cni/net.d/sticky-macvlan.d/nodename)",
            ),
            (
                "another node",
                Some("node2"),
                here(Some("node1"), "b2"),
                reported.clone(),
                false,
                "this machine is node1 (the installer's nodename file",
            ),
            (
                "no such Node",
                Some("node9"),
                here(Some("node9"), "b2"),
                NodeBoot::NoNode,
                false,
                "has no Node node9: check --node",
            ),
            (
                "the Node unreadable",
                Some("node2"),
                here(Some("node2"), "b2"),
                NodeBoot::Unknown("timeout".into()),
                false,
                "could not be read to compare its boot id with this machine's (timeout)",
            ),
            (
                "no boot id here",
                Some("node2"),
                here(Some("node2"), ""),
                reported.clone(),
                false,
                "boot id could not be read",
            ),
        ];
        for (case, requested, here, boot, local, says) in cases {
            let evidence = node_evidence(requested, &here, &boot);
            match &evidence {
                Evidence::ThisNode { facts, .. } => {
                    assert!(local, "{case}: {evidence:?}");
                    assert_eq!(facts, &node("node2", "b2"), "{case}");
                    assert!(
                        evidence.describe().starts_with("node node2's own evidence"),
                        "{case}"
                    );
                }
                Evidence::ApiOnly { .. } => {
                    assert!(!local, "{case}: {evidence:?}");
                    assert!(
                        evidence.describe().starts_with("the kubernetes API only: "),
                        "{case}"
                    );
                }
            }
            assert!(
                evidence.describe().contains(says),
                "{case}: {evidence:?} lacks {says:?}"
            );
        }
    }

    #[test]
    fn locality() {
        let h = holder();
        assert!(is_local(&h, &node("n1", "b1")));
        assert!(!is_local(&h, &node("n1", "b2")));
        assert!(!is_local(&h, &node("n2", "b1")));
    }
}
