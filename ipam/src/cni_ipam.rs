//! sticky-ipam as a CNI IPAM: the verbs on one attachment, over the file
//! store, answering `CniOutput`. Used in-process by sticky-macvlan and by
//! the standalone `sticky-ipam` binary.

use std::collections::BTreeSet;
use std::net::IpAddr;

use cni::conf::CommonConf;
use cni::{CniArgs, CniEnv, CniError, CniOutput, CniResult, IpConfig};
use ipnet::IpNet;
use serde_json::{Map, Value};

use crate::addr::parse_ip_maybe_cidr;
use crate::claim::{now_secs, Holder};
use crate::config::IpamConfig;
use crate::config::StoreKind;
use crate::engine::{plan_add, plan_del, plan_gc, plan_undo, AddRequest, Grant};
use crate::identity::{self, Identity};
use crate::kube::client::KubeClient;
use crate::kube::liveness::KubeInspector;
use crate::kube::{ApiError, KubeApi, PodFacts};
use crate::liveness::{Caller, NodeFacts};
use crate::store::file::FileStore;
use crate::store::kube::{self as kube_store, KubeStore, STORE_CONFLICT, STORE_UNREACHABLE};
use crate::store::{Change, ClaimStore, Plan};
use crate::system::{netns_id, node_facts, LocalInspector};
use crate::wire::{needs_wire_check, Origin, StoreScope};

/// One invocation's view of the attachment.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    /// Raw `CNI_ARGS`.
    pub args: String,
    /// `args.cni` from the config.
    pub args_cni: Map<String, Value>,
    pub runtime_ips: Vec<String>,
}

pub struct StickyIpam {
    conf: IpamConfig,
    at: Attachment,
    node: NodeFacts,
    /// The kube client (kubernetes store only), or why it could not be
    /// built (reported by the verb that needs it).
    kube: Option<CniResult<KubeClient>>,
    /// The ADD request, resolved early by `prepare_add`.
    prepared: Option<AddRequest>,
    /// Set when the API did not answer while resolving the identity.
    unreachable: Option<String>,
    /// What the last ADD committed, for `undo_add`.
    committed: Option<Plan>,
    /// What the last ADD granted, and to which identity: what decides
    /// which addresses the wire must confirm (`wire`).
    granted: Vec<(IpAddr, Origin)>,
    granted_to: Option<Identity>,
}

/// This node's name: `nodeName` from the config, else (kubernetes store)
/// the `nodename` file `sticky-macvlan install` writes next to the
/// kubeconfig, else the hostname (`node_facts`).
fn node_name(conf: &IpamConfig) -> Option<String> {
    if conf.node_name.is_some() {
        return conf.node_name.clone();
    }
    let StoreKind::Kubernetes { kubeconfig, .. } = &conf.store else {
        return None;
    };
    let file = kubeconfig.parent()?.join("nodename");
    std::fs::read_to_string(file)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// How often a plan that lost a race is planned again before ADD gives up
/// with code 11 (kubelet retries the whole ADD later).
const MAX_ATTEMPTS: u32 = 8;

/// Plans with `plan` and commits, planning again after a conflict with
/// a jittered, bounded backoff.
fn with_retries<T>(
    store: &mut dyn ClaimStore,
    what: &str,
    mut plan: impl FnMut(&mut dyn ClaimStore) -> CniResult<(Plan, T)>,
) -> CniResult<(Plan, T)> {
    let mut last = String::new();
    for attempt in 0..MAX_ATTEMPTS {
        let outcome = plan(store).and_then(|(p, t)| {
            if !p.is_empty() {
                store.commit(&p)?;
            }
            Ok((p, t))
        });
        match outcome {
            Err(e) if e.code == STORE_CONFLICT => {
                cni::log::debug(&format!(
                    "{what}: attempt {} lost a race: {}",
                    attempt + 1,
                    e.msg
                ));
                last = e.msg;
                std::thread::sleep(backoff(attempt));
                match store.conflicted() {
                    // The reload raced too: the next attempt reads afresh.
                    Err(e) if e.code == STORE_CONFLICT => last = e.msg,
                    Err(e) => return Err(e),
                    Ok(()) => {}
                }
            }
            other => return other,
        }
    }
    Err(CniError::new(
        cni::code::TRY_AGAIN_LATER,
        format!("{what} gave up after {MAX_ATTEMPTS} conflicting writes (last: {last}); kubelet retries it"),
    ))
}

/// 5 ms doubling to 320 ms, each with up to 100% jitter so racing nodes
/// spread out.
fn backoff(attempt: u32) -> std::time::Duration {
    let base = 5u64 << attempt.min(6);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    std::time::Duration::from_millis(base + u64::from(seed) % (base + 1))
}

impl Attachment {
    pub fn new(env: &CniEnv, conf: &CommonConf) -> Attachment {
        Attachment {
            container_id: env.container_id.clone(),
            ifname: env.ifname.clone(),
            netns: env.netns.clone(),
            args: env.args.clone(),
            args_cni: conf.args_cni.clone(),
            runtime_ips: conf.runtime_ips.clone(),
        }
    }
}

fn requested_ips(at: &Attachment, args: &CniArgs) -> CniResult<Vec<IpAddr>> {
    let mut out: Vec<IpAddr> = Vec::new();
    let from_args_cni: Vec<String> = match at.args_cni.get("ips") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    CniError::invalid_config(format!("args.cni.ips entry {v} must be a string"))
                })
            })
            .collect::<CniResult<_>>()?,
        Some(other) => {
            return Err(CniError::invalid_config(format!(
                "args.cni.ips must be a list of addresses, not {other}"
            )))
        }
    };
    let sources = [
        ("runtimeConfig.ips", &at.runtime_ips),
        ("CNI_ARGS IP", &args.ips),
        ("args.cni.ips", &from_args_cni),
    ];
    for (source, list) in sources {
        for s in list {
            let ip = parse_ip_maybe_cidr(s).ok_or_else(|| {
                CniError::invalid_config(format!("{source} entry {s:?} is not an IP address"))
            })?;
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
    }
    Ok(out)
}

impl StickyIpam {
    /// Validates the `ipam` section of `network` up front.
    pub fn new(network: &str, ipam: &Value, at: Attachment) -> CniResult<StickyIpam> {
        let conf = IpamConfig::parse(network, ipam)?;
        let node = node_facts(node_name(&conf).as_deref());
        // Building the client reads the kubeconfig but connects nowhere.
        let kube = match &conf.store {
            StoreKind::Kubernetes {
                kubeconfig,
                timeout,
            } => Some(
                KubeClient::from_kubeconfig(kubeconfig, *timeout).map_err(kube_store::api_error),
            ),
            StoreKind::File => None,
        };
        Ok(StickyIpam {
            conf,
            at,
            node,
            kube,
            prepared: None,
            unreachable: None,
            committed: None,
            granted: Vec::new(),
            granted_to: None,
        })
    }

    pub fn config(&self) -> &IpamConfig {
        &self.conf
    }

    /// Addresses of the last ADD that the wire must confirm free before
    /// they are bound (`wire::needs_wire_check`): those this store cannot
    /// prove free everywhere they could be in use. `probe_fresh` is the
    /// plugin's `probe.fresh`.
    pub fn must_confirm(&self, probe_fresh: bool) -> Vec<IpAddr> {
        let Some(identity) = &self.granted_to else {
            return Vec::new();
        };
        let scope = match self.conf.store {
            StoreKind::File => StoreScope::Node,
            StoreKind::Kubernetes { .. } => StoreScope::Cluster,
        };
        self.granted
            .iter()
            .filter(|(_, origin)| {
                needs_wire_check(origin, identity, scope, &self.node.node, probe_fresh)
            })
            .map(|(ip, _)| *ip)
            .collect()
    }

    fn open(&self) -> CniResult<FileStore> {
        FileStore::open(&self.conf.store_dir, &self.conf.network)
    }

    /// The node-local record of the kubernetes store (degraded mode and
    /// next-fit cursors); it also serialises this node's ADDs on a network.
    fn open_local(&self) -> CniResult<FileStore> {
        FileStore::open(
            &kube_store::local_dir(&self.conf.store_dir),
            &self.conf.network,
        )
    }

    /// The kube client, or why there is none (kubernetes store only).
    fn client(&self) -> CniResult<&KubeClient> {
        match &self.kube {
            Some(Ok(client)) => Ok(client),
            Some(Err(e)) => Err(e.clone()),
            None => Err(CniError::invalid_config(
                "the file store has no kubernetes client",
            )),
        }
    }

    fn first_cursors(&self) -> Vec<Option<IpAddr>> {
        self.conf
            .range_sets
            .iter()
            .map(|set| {
                let n = kube_store::node_offset(&self.node.node, set.size());
                // next-fit starts after the cursor
                set.address_at(n)
            })
            .collect()
    }

    fn request(&mut self) -> CniResult<AddRequest> {
        let args = CniArgs::parse(&self.at.args)?;
        let pod = self.pod_for_identity(&args)?;
        let identity = identity::resolve(
            &self.conf,
            &self.at.args_cni,
            &args,
            &self.at.container_id,
            &self.at.ifname,
            pod.as_ref(),
        )?;
        let now = now_secs();
        Ok(AddRequest {
            requested: requested_ips(&self.at, &args)?,
            caller: Caller {
                pod_uid: args.pod_uid.clone(),
            },
            holder: Holder {
                container_id: self.at.container_id.clone(),
                ifname: self.at.ifname.clone(),
                netns: self.at.netns.clone(),
                netns_id: netns_id(&self.at.netns),
                pod_namespace: args.pod_namespace,
                pod_name: args.pod_name,
                pod_uid: args.pod_uid,
                node: self.node.node.clone(),
                boot_id: self.node.boot_id.clone(),
                since: now,
            },
            identity,
            now,
        })
    }

    /// The pod, when the identity may come from it (annotation or a
    /// StatefulSet owner): kubernetes store only, and only when neither
    /// args.cni nor the config names the identity.
    fn pod_for_identity(&mut self, args: &CniArgs) -> CniResult<Option<PodFacts>> {
        if self
            .at
            .args_cni
            .get("identity")
            .is_some_and(|v| !v.is_null())
            || self.conf.identity.is_some()
        {
            return Ok(None);
        }
        let (Some(ns), Some(name)) = (args.pod_namespace.clone(), args.pod_name.clone()) else {
            return Ok(None);
        };
        if self.kube.is_none() {
            return Ok(None);
        }
        match self.client()?.get_pod(&ns, &name) {
            Ok(pod) => Ok(pod),
            Err(ApiError::Unreachable(why)) => {
                self.unreachable = Some(why);
                Ok(None)
            }
            Err(e) => Err(kube_store::api_error(e)),
        }
    }

    fn output(&self, grants: &[Grant]) -> CniOutput {
        CniOutput {
            ips: grants
                .iter()
                .map(|g| IpConfig {
                    interface: None,
                    // The prefix comes from a validated subnet of the same family.
                    address: IpNet::new(g.ip, g.range.subnet.prefix_len())
                        .unwrap_or_else(|_| IpNet::from(g.ip)),
                    gateway: g.range.gateway,
                })
                .collect(),
            routes: self.conf.routes.clone(),
            ..CniOutput::default()
        }
    }

    /// Resolves and validates the ADD (identity, requested addresses)
    /// without writing, so a bad identity fails before the plugin creates
    /// anything.
    pub fn prepare_add(&mut self) -> CniResult<()> {
        if self.prepared.is_none() {
            self.prepared = Some(self.request()?);
        }
        Ok(())
    }

    pub fn add(&mut self) -> CniResult<CniOutput> {
        let req = match self.prepared.take() {
            Some(req) => req,
            None => self.request()?,
        };
        let (plan, grants) = match self.conf.store {
            StoreKind::File => {
                let mut store = self.open()?;
                let inspector =
                    LocalInspector::new(self.node.clone(), self.conf.cri_socket.as_deref());
                let conf = &self.conf;
                with_retries(&mut store, "ADD", |s| plan_add(conf, s, &inspector, &req))?
            }
            StoreKind::Kubernetes { .. } => self.add_kube(&req)?,
        };
        for g in &grants {
            match &g.took_over {
                Some(note) => cni::log::info(&format!("identity {:?}: {note}", req.identity.key)),
                None => cni::log::info(&format!(
                    "identity {:?} ({}) has {}",
                    req.identity.key,
                    req.identity.source.as_str(),
                    g.ip
                )),
            }
        }
        self.committed = Some(plan);
        self.granted = grants.iter().map(|g| (g.ip, g.origin.clone())).collect();
        self.granted_to = Some(req.identity.clone());
        Ok(self.output(&grants))
    }

    fn add_kube(&mut self, req: &AddRequest) -> CniResult<(Plan, Vec<Grant>)> {
        let local = self.open_local()?;
        let first = self.first_cursors();
        let node = self.node.clone();
        if let Some(why) = self.unreachable.clone() {
            return self.add_degraded(local, req, &why);
        }
        let client = self.client()?;
        let mut store = KubeStore::new(client, &self.conf.network, Some(local), first);
        let inspector = KubeInspector::new(client, node);
        let conf = &self.conf;
        match with_retries(&mut store, "ADD", |s| plan_add(conf, s, &inspector, req)) {
            Err(e) if e.code == STORE_UNREACHABLE => {
                let why = e.msg.clone();
                let local = store.into_local();
                match local {
                    Some(local) => self.add_degraded(local, req, &why),
                    None => Err(e),
                }
            }
            other => other,
        }
    }

    /// The API is unreachable: only a pod re-ADDing what this node already
    /// holds for it (same pod UID) is served, from the node-local record;
    /// nothing is written to the API (DESIGN.md section 5).
    fn add_degraded(
        &self,
        mut local: FileStore,
        req: &AddRequest,
        why: &str,
    ) -> CniResult<(Plan, Vec<Grant>)> {
        let refuse = |detail: &str| {
            CniError::new(
                cni::code::TRY_AGAIN_LATER,
                format!(
                    "network {:?}: {why}; {detail}: nothing is allocated while the API is unreachable, and kubelet retries this ADD",
                    self.conf.network
                ),
            )
        };
        let Some(uid) = req.caller.pod_uid.as_deref().filter(|u| !u.is_empty()) else {
            return Err(refuse("the ADD names no pod UID (K8S_POD_UID)"));
        };
        let listing = local.list()?;
        let mine: Vec<&crate::claim::Claim> = listing
            .claims
            .iter()
            .filter(|c| {
                c.holder
                    .as_ref()
                    .is_some_and(|h| h.pod_uid.as_deref() == Some(uid) && h.node == self.node.node)
            })
            .collect();
        let mut grants = Vec::new();
        let mut plan = Plan::default();
        for set in &self.conf.range_sets {
            let Some(claim) = mine.iter().find(|c| set.contains(c.ip)) else {
                return Err(refuse(&format!(
                    "this node holds no address of range set {} for pod UID {uid}",
                    set.describe()
                )));
            };
            let range = set
                .range_of(claim.ip)
                .cloned()
                .unwrap_or_else(|| set.ranges[0].clone());
            plan.changes.push(Change {
                before: Some((*claim).clone()),
                after: Some(crate::claim::Claim {
                    holder: Some(req.holder.clone()),
                    updated: req.now,
                    ..(*claim).clone()
                }),
            });
            grants.push(Grant {
                ip: claim.ip,
                range,
                took_over: None,
                displaced: None,
                origin: Origin::SamePod {
                    node: self.node.node.clone(),
                },
            });
        }
        local.commit(&plan)?;
        cni::log::warn(&format!(
            "network {:?}: degraded mode, re-ADD of pod UID {uid} served from the node-local record; the API is not updated",
            self.conf.network
        ));
        // Nothing reached the API, so there is nothing for undo_add to undo there.
        Ok((Plan::default(), grants))
    }

    /// Undoes this process's ADD after a later step failed: the claims go
    /// back to exactly what they were (invariant 5), unlike DEL, which
    /// would leave a taken-over claim without its old holder.
    pub fn undo_add(&mut self) -> CniResult<()> {
        let Some(done) = self.committed.take() else {
            return Ok(());
        };
        if done.is_empty() {
            return Ok(());
        }
        self.with_store(true, |s| {
            let undo = plan_undo(s, &done)?;
            Ok((undo, ()))
        })
        .map(drop)
    }

    /// Runs a release-like operation (`plan` then commit, retried) on the
    /// configured store. For the kubernetes store an unreachable API is
    /// not an error: the holder's claim is later found dead by liveness.
    fn with_store<T>(
        &mut self,
        release: bool,
        plan: impl FnMut(&mut dyn ClaimStore) -> CniResult<(Plan, T)>,
    ) -> CniResult<Option<(Plan, T)>> {
        match self.conf.store {
            StoreKind::File => {
                let mut store = self.open()?;
                // A release that a power loss undoes is harmless: the claim
                // comes back with a holder recorded in an earlier boot,
                // which every verdict finds dead. So releases skip fsyncs.
                store.set_durable(!release);
                with_retries(&mut store, "release", plan).map(Some)
            }
            StoreKind::Kubernetes { .. } => {
                let local = self.open_local()?;
                let first = self.first_cursors();
                let network = self.conf.network.clone();
                let client = self.client()?;
                let mut store = KubeStore::new(client, &network, Some(local), first);
                match with_retries(&mut store, "release", plan) {
                    Err(e) if e.code == STORE_UNREACHABLE => {
                        cni::log::warn(&format!(
                            "network {network:?}: {}; the claim is left for liveness to release",
                            e.msg
                        ));
                        Ok(None)
                    }
                    other => other.map(Some),
                }
            }
        }
    }

    pub fn del(&mut self) -> CniResult<()> {
        let (cid, ifname) = (self.at.container_id.clone(), self.at.ifname.clone());
        let done = self.with_store(true, |s| {
            let plan = plan_del(s, &cid, &ifname, now_secs())?;
            Ok((plan, ()))
        })?;
        if let Some((plan, ())) = done {
            for c in plan.changes.iter().filter_map(|c| c.before.as_ref()) {
                cni::log::info(&format!("released {} of identity {:?}", c.ip, c.identity));
            }
        }
        if matches!(self.conf.store, StoreKind::Kubernetes { .. }) {
            self.release_local(&cid, &ifname);
        }
        Ok(())
    }

    /// The node-local record must not serve a released claim in degraded
    /// mode; best effort.
    fn release_local(&self, cid: &str, ifname: &str) {
        let outcome = self.open_local().and_then(|mut local| {
            local.set_durable(false);
            let plan = plan_del(&mut local, cid, ifname, now_secs())?;
            local.commit(&plan)
        });
        if let Err(e) = outcome {
            cni::log::warn(&format!("node-local record not updated: {}", e.msg));
        }
    }

    pub fn check(&mut self) -> CniResult<()> {
        let (cid, ifname) = (self.at.container_id.clone(), self.at.ifname.clone());
        let held = match self.with_store(false, |s| {
            let held = s.claims_of_holder(&cid, &ifname)?;
            Ok((Plan::default(), held))
        })? {
            Some((_, held)) => held,
            // API unreachable: what this node recorded.
            None => self.open_local()?.claims_of_holder(&cid, &ifname)?,
        };
        if held.len() < self.conf.range_sets.len() {
            return Err(CniError::new(
                cni::code::UNKNOWN_CONTAINER,
                format!(
                    "network {:?} has {} of {} claims for container {}/{}: it holds {}",
                    self.conf.network,
                    held.len(),
                    self.conf.range_sets.len(),
                    self.at.container_id,
                    self.at.ifname,
                    if held.is_empty() {
                        "none (released, or taken over by a newer holder)".to_string()
                    } else {
                        held.iter()
                            .map(|c| c.ip.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            ));
        }
        Ok(())
    }

    /// STATUS: the store can be used (the file store locked, the API
    /// answering a GET).
    pub fn status(&mut self) -> CniResult<()> {
        let unavailable = |msg: String| {
            CniError::new(
                cni::code::STATUS_UNAVAILABLE,
                format!("sticky-ipam cannot use its store: {msg}"),
            )
        };
        match self.conf.store {
            StoreKind::File => self.open().map(drop).map_err(|e| unavailable(e.msg)),
            StoreKind::Kubernetes { .. } => {
                let name = format!("{}.status-probe", crate::kube::slug(&self.conf.network));
                self.client()
                    .and_then(|c| c.get_claim(&name).map_err(kube_store::api_error))
                    .map(drop)
                    .map_err(|e| unavailable(e.msg))
            }
        }
    }

    pub fn gc(&mut self, keep: &[(String, String)]) -> CniResult<()> {
        let keep: BTreeSet<(String, String)> = keep.iter().cloned().collect();
        let node = self.node.node.clone();
        if let Some((plan, ())) =
            self.with_store(true, |s| Ok((plan_gc(s, &node, &keep, now_secs())?, ())))?
        {
            if !plan.is_empty() {
                cni::log::info(&format!("GC released {} claims", plan.changes.len()));
            }
        }
        Ok(())
    }
}
