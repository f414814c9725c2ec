//! "Once the old holder is confirmed dead" (README, "Allocation and liveness"), for the
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

    #[test]
    fn locality() {
        let h = holder();
        assert!(is_local(&h, &node("n1", "b1")));
        assert!(!is_local(&h, &node("n1", "b2")));
        assert!(!is_local(&h, &node("n2", "b1")));
    }
}
