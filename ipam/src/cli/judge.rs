//! Who judges liveness for an operator command: the file store with this
//! machine's evidence, or the kubernetes store with the API's (and a named
//! node's). Decided once per command; `Judge::inspector` makes the
//! inspector a plan judges with.

use std::path::PathBuf;

use crate::kube::liveness::KubeInspector;
use crate::kube::KubeApi;
use crate::liveness::{Here, Inspector, NodeFacts};
use crate::system::LocalInspector;

pub enum Judge<'a> {
    /// The file store is this machine's.
    File {
        facts: NodeFacts,
        cri_socket: Option<PathBuf>,
    },
    Kube {
        api: &'a dyn KubeApi,
        facts: NodeFacts,
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

    /// The kubernetes store's judge; `requested` is `--node`.
    pub fn kube(api: &'a dyn KubeApi, requested: Option<&str>, here: &Here) -> Judge<'a> {
        let facts = match requested {
            None => NodeFacts::default(),
            Some(node) => NodeFacts {
                node: node.to_string(),
                boot_id: here.boot_id.clone(),
            },
        };
        Judge::Kube { api, facts }
    }

    /// An inspector with lookups of its own.
    pub fn inspector(&self) -> Box<dyn Inspector + 'a> {
        match self {
            Judge::File { facts, cri_socket } => {
                Box::new(LocalInspector::new(facts.clone(), cri_socket.as_deref()))
            }
            Judge::Kube { api, facts } => Box::new(KubeInspector::new(*api, facts.clone())),
        }
    }

    /// Where verdicts come from, in a few words (`claims`' judgedFrom).
    pub fn from(&self) -> String {
        match self {
            Judge::File { facts, .. } => format!("node {}", facts.node),
            Judge::Kube { facts, .. } if facts.node.is_empty() => "the kubernetes API".into(),
            Judge::Kube { facts, .. } => format!("node {} and the kubernetes API", facts.node),
        }
    }
}
