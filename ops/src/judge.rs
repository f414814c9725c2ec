//! Who judges liveness for an operator command: the file store with this
//! machine's evidence, or the kubernetes store with the API's, and a named
//! node's own only where the command provably runs on it
//! (`liveness::node_evidence`). Decided once per command;
//! `Judge::inspector` makes the inspector one plan judges with.

use std::path::PathBuf;

use sticky_ipam::kube::inspector::KubeInspector;
use sticky_ipam::kube::KubeApi;
use sticky_ipam::liveness::{node_evidence, Evidence, Here, Inspector, NodeBoot, NodeFacts};
use sticky_ipam::system::LocalInspector;

pub enum Judge<'a> {
    /// The file store is this machine's: its evidence is the store's node's.
    File {
        facts: NodeFacts,
        cri_socket: Option<PathBuf>,
    },
    Kube {
        api: &'a dyn KubeApi,
        evidence: Evidence,
    },
}

impl<'a> Judge<'a> {
    /// The file store's judge: this machine, named `requested` or by its
    /// hostname, with the container runtime at `cri_socket`.
    pub fn file(requested: Option<&str>, here: &Here, cri_socket: Option<PathBuf>) -> Judge<'a> {
        Judge::File {
            facts: NodeFacts {
                node: requested.unwrap_or(&here.hostname).to_string(),
                boot_id: here.boot_id.clone(),
            },
            cri_socket,
        }
    }

    /// The kubernetes store's judge; `requested` is `--node`, whose Node
    /// is read for its boot id.
    pub fn kube(api: &'a dyn KubeApi, requested: Option<&str>, here: &Here) -> Judge<'a> {
        let boot = match requested.map(|node| api.get_node(node)) {
            None => NodeBoot::NotReported,
            Some(Ok(Some(node))) => node
                .boot_id
                .map_or(NodeBoot::NotReported, NodeBoot::Reported),
            Some(Ok(None)) => NodeBoot::NoNode,
            Some(Err(e)) => NodeBoot::Unknown(e.to_string()),
        };
        Judge::Kube {
            api,
            evidence: node_evidence(requested, here, &boot),
        }
    }

    /// An inspector with lookups of its own: one per plan.
    pub fn inspector(&self) -> Box<dyn Inspector + 'a> {
        match self {
            Judge::File { facts, cri_socket } => {
                Box::new(LocalInspector::new(facts.clone(), cri_socket.as_deref()))
            }
            Judge::Kube {
                api,
                evidence: Evidence::ThisNode { facts, .. },
            } => Box::new(KubeInspector::new(*api, facts.clone())),
            Judge::Kube { api, .. } => Box::new(KubeInspector::api_only(*api)),
        }
    }

    /// Where verdicts come from, in a few words (`claims`' judgedFrom).
    pub fn from(&self) -> String {
        match self {
            Judge::File { facts, .. } => format!("node {}", facts.node),
            Judge::Kube {
                evidence: Evidence::ThisNode { facts, .. },
                ..
            } => format!("node {} and the kubernetes API", facts.node),
            Judge::Kube { .. } => "the kubernetes API".into(),
        }
    }

    /// The same, and why: what the commands print.
    pub fn describe(&self) -> String {
        match self {
            Judge::File { facts, .. } => format!(
                "this machine's evidence as node {} (its boot id, netns paths and container runtime): the file store is this machine's",
                facts.node
            ),
            Judge::Kube { evidence, .. } => evidence.describe(),
        }
    }
}
