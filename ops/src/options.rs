//! The options of the claim commands (claims, release, reconcile, the
//! importers): one parser, and what they decide once per command: which
//! store, who judges liveness, which networks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cni::{CniError, CniResult};
use sticky_ipam::backend::Backend;
use sticky_ipam::config::DEFAULT_STORE_DIR;
use sticky_ipam::kube::client::KubeClient;
use sticky_ipam::kube::KubeApi;
use sticky_ipam::store::StoreError;
use sticky_ipam::system::here;

use crate::judge::Judge;

pub struct Opts {
    pub dir: PathBuf,
    pub network: Option<String>,
    pub node: Option<String>,
    pub values: BTreeMap<String, String>,
    pub flags: Vec<String>,
}

const VALUE_OPTS: [&str; 16] = [
    "--metrics-addr",
    "--context",
    "--namespace",
    "--output",
    "--cri-socket",
    "--dir",
    "--kubeconfig",
    "--timeout-ms",
    "--network",
    "--node",
    "--ip",
    "--identity",
    "--from",
    "--range",
    "--interval",
    "--file",
];
const FLAG_OPTS: [&str; 4] = ["--force", "--json", "--keep-retired", "--in-cluster"];

pub fn parse_opts(args: &[String]) -> Result<Opts, String> {
    let mut values = BTreeMap::new();
    let mut flags = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if VALUE_OPTS.contains(&a.as_str()) {
            let v = it
                .next()
                .ok_or_else(|| format!("option {a} needs a value"))?;
            values.insert(a.clone(), v.clone());
        } else if FLAG_OPTS.contains(&a.as_str()) {
            flags.push(a.clone());
        } else {
            return Err(format!("unknown argument {a:?}"));
        }
    }
    Ok(Opts {
        dir: values
            .remove("--dir")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STORE_DIR)),
        network: values.remove("--network"),
        node: values.remove("--node"),
        values,
        flags,
    })
}

impl Opts {
    pub fn flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }

    /// The CRI socket that judges holders without a netns ("" for none).
    pub fn cri_socket(&self) -> Option<PathBuf> {
        match self.values.get("--cri-socket").map(String::as_str) {
            None => Some(PathBuf::from(sticky_ipam::cri::DEFAULT_CRI_SOCKET)),
            Some("") => None,
            Some(path) => Some(PathBuf::from(path)),
        }
    }

    pub fn backend(&self) -> CniResult<Backend> {
        let in_cluster = self.flag("--in-cluster");
        let path = self.values.get("--kubeconfig");
        if !in_cluster && path.is_none() {
            return Ok(Backend::File {
                dir: self.dir.clone(),
                cri_socket: self.cri_socket(),
            });
        }
        let timeout = match self.values.get("--timeout-ms") {
            None => Duration::from_millis(sticky_ipam::config::DEFAULT_KUBE_TIMEOUT_MS),
            Some(ms) => Duration::from_millis(ms.parse().map_err(|_| {
                CniError::invalid_config(format!(
                    "--timeout-ms {ms:?} must be a number of milliseconds"
                ))
            })?),
        };
        let context = self.values.get("--context").map(String::as_str);
        let client = match path {
            Some(path) => {
                KubeClient::from_kubeconfig_context(std::path::Path::new(path), context, timeout)
            }
            None => KubeClient::in_cluster(timeout),
        }
        .map_err(StoreError::from)?;
        Ok(Backend::Kube {
            client: Ok(client),
            local: None,
        })
    }

    /// The liveness judge and where it judges from, decided once. The file
    /// store is one node's: its evidence is this node's. On the kubernetes
    /// store the API alone decides unless a node is named and this machine
    /// provably is that node (`liveness::node_evidence`), so a command run
    /// anywhere else says what any node would.
    pub fn judge<'b>(&self, backend: &'b Backend) -> CniResult<Judge<'b>> {
        let here = here(self.values.get("--kubeconfig").map(std::path::Path::new));
        Ok(match backend {
            Backend::File { cri_socket, .. } => {
                Judge::file(self.node.as_deref(), &here, cri_socket.clone())
            }
            Backend::Kube { .. } => {
                let api: &dyn KubeApi = backend.client()?;
                Judge::kube(api, self.node.as_deref(), &here)
            }
        })
    }

    /// The networks to act on; a named one must already have claims (a
    /// typo must not create an empty store).
    pub fn networks(&self, backend: &Backend) -> CniResult<Vec<String>> {
        let known = backend.networks()?;
        match &self.network {
            None => Ok(known),
            Some(n) if known.contains(n) => Ok(vec![n.clone()]),
            Some(n) => Err(CniError::invalid_config(format!(
                "network {n:?} has no claims in {} (networks there: {}): check --network, and --dir against the ipam section's dataDir",
                backend.describe(),
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ))),
        }
    }

    pub fn network(&self, command: &str) -> Result<String, CniError> {
        self.network
            .clone()
            .ok_or_else(|| CniError::invalid_config(format!("{command} needs --network NAME")))
    }
}
