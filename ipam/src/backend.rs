//! The one place that chooses where claims live and who judges liveness,
//! for the CNI verbs and the operator CLI alike: the file store with this
//! node's evidence, or `IPClaim` objects with the cluster's. A kube client
//! that could not be built is a value, reported by the first verb that
//! needs it.

use std::net::IpAddr;
use std::path::PathBuf;

use crate::config::{IpamConfig, StoreKind};
use crate::kube::client::KubeClient;
use crate::kube::inspector::KubeInspector;
use crate::kube::KubeApi;
use crate::liveness::{Inspector, NodeFacts};
use crate::probe_policy::StoreScope;
use crate::store::file::FileStore;
use crate::store::ipclaim::{local_dir, Holds, KubeStore, LocalRecord};
use crate::store::{ClaimStore, Listing, Plan, StoreError, StoreResult};
use crate::system::LocalInspector;

pub enum Backend {
    /// Claims in a directory on this node.
    File {
        dir: PathBuf,
        /// The container runtime asked about holders without a netns.
        cri_socket: Option<PathBuf>,
    },
    /// `IPClaim` objects; `local` is the node-local record's directory
    /// (degraded mode, next-fit cursors), None for the CLI.
    Kube {
        client: Result<KubeClient, StoreError>,
        local: Option<PathBuf>,
    },
}

/// One network's store, as the backend opened it.
pub enum Store<'a> {
    File(FileStore),
    Kube(Box<KubeStore<'a>>),
}

impl Backend {
    /// The store an `ipam` section names. Building the kube client reads
    /// the kubeconfig but connects nowhere.
    pub fn for_config(conf: &IpamConfig) -> Backend {
        match &conf.store {
            StoreKind::File => Backend::File {
                dir: conf.store_dir.clone(),
                cri_socket: conf.cri_socket.clone(),
            },
            StoreKind::Kubernetes {
                kubeconfig,
                timeout,
            } => Backend::Kube {
                client: KubeClient::from_kubeconfig(kubeconfig, *timeout).map_err(StoreError::from),
                local: Some(local_dir(&conf.store_dir)),
            },
        }
    }

    pub fn scope(&self) -> StoreScope {
        match self {
            Backend::File { .. } => StoreScope::Node,
            Backend::Kube { .. } => StoreScope::Cluster,
        }
    }

    pub fn is_kube(&self) -> bool {
        matches!(self, Backend::Kube { .. })
    }

    /// The kube client, or why there is none.
    pub fn client(&self) -> StoreResult<&KubeClient> {
        match self {
            Backend::Kube { client: Ok(c), .. } => Ok(c),
            Backend::Kube { client: Err(e), .. } => Err(e.clone()),
            Backend::File { .. } => Err(StoreError::Invalid(
                "the file store has no kubernetes client".into(),
            )),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Backend::File { dir, .. } => dir.display().to_string(),
            Backend::Kube { client: Ok(c), .. } => format!("the kubernetes API at {}", c.server()),
            Backend::Kube { .. } => "the kubernetes API".into(),
        }
    }

    /// The node-local record of the kubernetes store for `network`.
    pub fn local_record(&self, network: &str) -> Option<LocalRecord> {
        match self {
            Backend::Kube {
                local: Some(dir), ..
            } => Some(LocalRecord::new(dir, network)),
            _ => None,
        }
    }

    /// The node-local record of the kubernetes store for `network`, open.
    pub fn open_local(&self, network: &str) -> StoreResult<Option<FileStore>> {
        self.local_record(network).map(|r| r.open()).transpose()
    }

    /// One attachment's hold for a whole command on the kubernetes store
    /// (`LocalRecord::hold_attachment`); the file store's lock, held for
    /// the whole command, already orders them.
    pub fn hold_attachment(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> StoreResult<Option<Holds>> {
        self.local_record(network)
            .map(|r| r.hold_attachment(container_id, ifname))
            .transpose()
    }

    /// `network`'s store. `first_cursors`: where next-fit starts on this
    /// node before it has a cursor (kubernetes store).
    pub fn open(
        &self,
        network: &str,
        first_cursors: Vec<Option<IpAddr>>,
    ) -> StoreResult<Store<'_>> {
        match self {
            Backend::File { dir, .. } => FileStore::open(dir, network).map(Store::File),
            Backend::Kube { .. } => {
                let local = self.local_record(network);
                // Opened once now, so a record that cannot be used fails
                // the command here, saying why, rather than each use
                // quietly doing without it.
                if let Some(record) = &local {
                    drop(record.open()?);
                }
                let client = self.client()?;
                Ok(Store::Kube(Box::new(KubeStore::new(
                    client,
                    network,
                    local,
                    first_cursors,
                ))))
            }
        }
    }

    /// Whether `network`'s store can be used now (STATUS): the file store
    /// opened and locked, the API answering a GET.
    pub fn usable(&self, network: &str) -> StoreResult<()> {
        match self {
            Backend::File { dir, .. } => FileStore::open(dir, network).map(drop),
            Backend::Kube { .. } => {
                let name = format!("{}.status-probe", crate::kube::slug(network));
                self.client()?.get_claim(&name)?;
                Ok(())
            }
        }
    }

    /// The networks that have claims.
    pub fn networks(&self) -> StoreResult<Vec<String>> {
        match self {
            Backend::File { dir, .. } => {
                if !dir.is_dir() {
                    return Err(StoreError::Invalid(format!(
                        "there is no sticky-ipam store at {}: pass --dir with the ipam section's dataDir (or store.dir), or --kubeconfig for the kubernetes store",
                        dir.display()
                    )));
                }
                FileStore::networks(dir)
            }
            Backend::Kube { .. } => {
                let all = self.client()?.list_claims("")?;
                let set: std::collections::BTreeSet<String> =
                    all.into_iter().map(|o| o.network).collect();
                Ok(set.into_iter().collect())
            }
        }
    }

    /// The liveness judge of this node (`node`, the plugin's own), knowing
    /// one pod already ("namespace/name" and its facts, read moments ago
    /// by this ADD): the kubernetes judge asks no more about it. The CLI,
    /// which may run anywhere, judges through `cli::judge` instead.
    pub fn inspector_knowing(
        &self,
        node: NodeFacts,
        known: Option<(String, crate::pod::PodFacts)>,
    ) -> StoreResult<Box<dyn Inspector + '_>> {
        Ok(match self {
            Backend::File { cri_socket, .. } => {
                Box::new(LocalInspector::new(node, cri_socket.as_deref()))
            }
            Backend::Kube { .. } => {
                let inspector = KubeInspector::new(self.client()?, node);
                if let Some((key, pod)) = known {
                    inspector.know_pod(&key, pod);
                }
                Box::new(inspector)
            }
        })
    }
}

impl<'a> Store<'a> {
    fn inner(&mut self) -> &mut dyn ClaimStore {
        match self {
            Store::File(s) => s,
            Store::Kube(s) => s.as_mut(),
        }
    }

    /// Releases skip fsyncs on the file store: a release a power loss
    /// undoes brings back a holder from an earlier boot, which every
    /// verdict finds dead.
    pub fn set_durable(&mut self, durable: bool) {
        if let Store::File(s) = self {
            s.set_durable(durable);
        }
    }
}

impl ClaimStore for Store<'_> {
    fn claim(&mut self, ip: IpAddr) -> StoreResult<Option<crate::claim::Claim>> {
        self.inner().claim(ip)
    }
    fn candidate_taken(&mut self, ip: IpAddr) -> StoreResult<bool> {
        self.inner().candidate_taken(ip)
    }
    fn claims_of_identity(&mut self, identity: &str) -> StoreResult<Vec<crate::claim::Claim>> {
        self.inner().claims_of_identity(identity)
    }
    fn claims_of_holder(
        &mut self,
        container_id: &str,
        ifname: &str,
    ) -> StoreResult<Vec<crate::claim::Claim>> {
        self.inner().claims_of_holder(container_id, ifname)
    }
    fn list(&mut self) -> StoreResult<Listing> {
        self.inner().list()
    }
    fn cursor(&mut self, set: usize) -> StoreResult<Option<IpAddr>> {
        self.inner().cursor(set)
    }
    fn commit(&mut self, plan: &Plan) -> StoreResult<()> {
        self.inner().commit(plan)
    }
    fn conflicted(&mut self) -> StoreResult<()> {
        self.inner().conflicted()
    }
}
