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
use crate::backend::Backend;
use crate::claim::{now_secs, Holder};
use crate::config::{IpamConfig, StoreKind};
use crate::engine::{
    plan_add, plan_confirm, plan_degraded, plan_del, plan_gc, plan_undo, AddRequest, Grant,
};
use crate::events::{self, GrantNote, PodEvent};
use crate::identity::{self, Identity};
use crate::ipamclaim;
use crate::kube::{ApiError, KubeApi};
use crate::liveness::{Caller, NodeFacts};
use crate::pod::PodFacts;
use crate::probe_policy::{needs_wire_check, Origin};
use crate::store::ipclaim::{confirmed_locally, node_offset, Holds};
use crate::store::retry::with_retries;
use crate::store::{api_unreachable, ClaimStore, Plan, PlanError, PlanResult, StoreError};
use crate::system::{netns_id, node_facts};

mod del_check_gc;
mod ipam_claims;

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
    /// The network's `allowPersistentIPs`: the pod's `ipam-claim-reference`
    /// names its identity.
    pub persistent_ips: bool,
}

pub struct StickyIpam {
    conf: IpamConfig,
    at: Attachment,
    node: NodeFacts,
    /// Where claims live and who judges liveness.
    backend: Backend,
    /// The holder the last ADD was for: whom a refusal's Event is about.
    caller: Option<Holder>,
    /// The IPAMClaim the last ADD was bound to: whose status tells its
    /// outcome.
    claim: Option<ipam_claims::AdmittedClaim>,
}

/// An ADD resolved and validated (identity, requested addresses) before
/// anything is created or written: what `StickyIpam::add` takes.
#[derive(Debug, Clone)]
pub struct PreparedAdd {
    req: AddRequest,
    /// Set when the API did not answer while resolving the identity: the
    /// ADD can then only be served in degraded mode.
    unreachable: Option<String>,
    /// The caller's pod as the API gave it for the identity: when the old
    /// holder has the same name (a StatefulSet pod), this answers its
    /// liveness without a second GET.
    pod: Option<PodFacts>,
    claim: Option<ipam_claims::AdmittedClaim>,
}

/// What an ADD granted and wrote: the result to answer, what decides
/// which addresses the wire must confirm (`must_confirm`), and what
/// `undo_add` restores.
#[derive(Debug, Clone)]
pub struct Granted {
    pub output: CniOutput,
    committed: Plan,
    /// Each address's origin, and whether its claim carries the
    /// `unconfirmed` mark (`probe_policy::needs_wire_check`).
    origins: Vec<(IpAddr, Origin, bool)>,
    identity: Identity,
    /// What the pod is told once the ADD succeeded (`StickyIpam::announce`).
    events: Vec<PodEvent>,
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

impl Attachment {
    pub fn new(env: &CniEnv, conf: &CommonConf) -> Attachment {
        Attachment {
            container_id: env.container_id.clone(),
            ifname: env.ifname.clone(),
            netns: env.netns.clone(),
            args: env.args.clone(),
            args_cni: conf.args_cni.clone(),
            runtime_ips: conf.runtime_ips.clone(),
            persistent_ips: conf.allow_persistent_ips,
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
        let backend = Backend::for_config(&conf);
        Ok(StickyIpam {
            conf,
            at,
            node,
            backend,
            caller: None,
            claim: None,
        })
    }

    pub fn config(&self) -> &IpamConfig {
        &self.conf
    }

    /// Addresses of `granted` that the wire must confirm free before they
    /// are bound (`probe_policy::needs_wire_check`): those this store cannot prove
    /// free everywhere they could be in use. `probe_fresh` is the plugin's
    /// `probe.fresh`.
    pub fn must_confirm(&self, granted: &Granted, probe_fresh: bool) -> Vec<IpAddr> {
        let scope = self.backend.scope();
        granted
            .origins
            .iter()
            .filter(|(_, origin, unconfirmed)| {
                needs_wire_check(
                    origin,
                    *unconfirmed,
                    &granted.identity,
                    scope,
                    &self.node.node,
                    probe_fresh,
                )
            })
            .map(|(ip, _, _)| *ip)
            .collect()
    }

    fn first_cursors(&self) -> Vec<Option<IpAddr>> {
        self.conf
            .range_sets
            .iter()
            .map(|set| {
                let n = node_offset(&self.node.node, set.size());
                // next-fit starts after the cursor
                set.address_at(n)
            })
            .collect()
    }

    fn request(&self) -> CniResult<PreparedAdd> {
        let args = CniArgs::parse(&self.at.args)?;
        // ADD only: a DEL under the same config must still release.
        if self.at.persistent_ips {
            ipam_claims::refuse_persistent_ips_without_claims(&self.conf)?;
        }
        let (pod, unreachable) = self.pod_for_identity(&args)?;
        let claim = self.ipam_claim(&args, pod.as_ref())?;
        let identity = match &claim {
            Some(c) => identity::for_ipam_claim(&self.at.args_cni, &c.namespace, &c.facts)?,
            None => identity::resolve(
                &self.conf,
                &self.at.args_cni,
                &args,
                &self.at.container_id,
                &self.at.ifname,
                pod.as_ref(),
            )?,
        };
        let now = now_secs();
        let req = AddRequest {
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
        };
        Ok(PreparedAdd {
            req,
            unreachable,
            pod,
            claim,
        })
    }

    /// The pod, when the identity may come from it (annotation or a
    /// StatefulSet owner): kubernetes store only, and only when neither
    /// args.cni nor the config names the identity. The second value says
    /// why the API did not answer, if it did not.
    fn pod_for_identity(&self, args: &CniArgs) -> CniResult<(Option<PodFacts>, Option<String>)> {
        // With allowPersistentIPs the pod is read anyway: its element may
        // reference an IPAMClaim, which a cni-args identity contradicts.
        let named = self
            .at
            .args_cni
            .get("identity")
            .is_some_and(|v| !v.is_null())
            || self.conf.identity.is_some();
        if named && !self.at.persistent_ips {
            return Ok((None, None));
        }
        let (Some(ns), Some(name)) = (args.pod_namespace.clone(), args.pod_name.clone()) else {
            return Ok((None, None));
        };
        if !self.backend.is_kube() {
            return Ok((None, None));
        }
        let client = self.backend.client().map_err(CniError::from)?;
        match client.get_pod(&ns, &name) {
            Ok(pod) => Ok((pod, None)),
            Err(ApiError::Unreachable(why)) => Ok((None, Some(why))),
            Err(e) => Err(StoreError::from(e).into()),
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
    pub fn prepare_add(&self) -> CniResult<PreparedAdd> {
        self.request()
    }

    pub fn add(&mut self, prepared: PreparedAdd) -> CniResult<Granted> {
        let PreparedAdd {
            req,
            unreachable,
            pod,
            claim,
        } = prepared;
        self.caller = Some(req.holder.clone());
        self.claim = claim;
        let _attachment = self.hold_attachment()?;
        let (plan, grants) = match self.add_planned(&req, unreachable, pod) {
            Ok(done) => done,
            Err(e) => {
                self.report_refusal(&e);
                return Err(e);
            }
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
        let notes: Vec<GrantNote> = grants
            .iter()
            .map(|g| GrantNote {
                origin: g.origin.clone(),
                reclaimed: g.reclaimed,
                note: g.took_over.clone(),
            })
            .collect();
        Ok(Granted {
            output: self.output(&grants),
            committed: plan,
            origins: grants
                .iter()
                .map(|g| (g.ip, g.origin.clone(), g.unconfirmed))
                .collect(),
            identity: req.identity,
            events: events::for_grants(&req.holder, &self.conf.network, &notes),
        })
    }

    /// The ADD succeeded, its addresses confirmed on the wire: clears the
    /// `unconfirmed` marks of the claims it holds (one write each, only on
    /// a takeover or a grant of what a judgement freed), then tells the pod
    /// what it took from whom (Events). A mark left by a failed write only
    /// costs the address's next grant a probe.
    pub fn succeeded(&mut self, granted: &Granted) {
        let marked: Vec<IpAddr> = granted
            .origins
            .iter()
            .filter(|(_, _, unconfirmed)| *unconfirmed)
            .map(|(ip, _, _)| *ip)
            .collect();
        if !marked.is_empty() {
            let (cid, ifname) = (self.at.container_id.clone(), self.at.ifname.clone());
            let outcome = self.with_store(
                true,
                "the mark stays, and the next grant probes the address again",
                |s| Ok((plan_confirm(s, &marked, &cid, &ifname)?, ())),
            );
            if let Err(e) = outcome {
                cni::log::warn(&format!(
                    "network {:?}: could not record that the wire confirmed {}: {}; the next grant of {} probes it again",
                    self.conf.network,
                    list_ips(&marked),
                    e.msg,
                    if marked.len() == 1 { "it" } else { "them" }
                ));
            }
        }
        self.post_events(&granted.events);
        let ips = granted
            .output
            .ips
            .iter()
            .map(|ip| ip.address.to_string())
            .collect();
        let pod = self
            .caller
            .as_ref()
            .and_then(|c| c.pod_name.clone())
            .unwrap_or_default();
        self.write_claim_status(&ipamclaim::Outcome::Allocated { ips, pod });
    }

    /// Tells the pod why its ADD was refused, when a person can act on it
    /// (`events::for_refusal`): called for the IPAM's own refusals, and by
    /// the plugin for the wire's.
    pub fn report_refusal(&mut self, err: &CniError) {
        let Some(caller) = &self.caller else {
            return;
        };
        if let Some(event) = events::for_refusal(caller, &self.conf.network, err) {
            self.post_events(&[event]);
        }
        // Refused because another pod holds the address: the address is
        // allocated (to that pod), so the claim's condition is not turned
        // False; the refused pod is told by its Event.
        if err.refusal != Some(cni::Refusal::HolderAlive) {
            self.write_claim_status(&ipamclaim::Outcome::Failed {
                reason: ipamclaim::failure_reason(err),
                message: err.msg.clone(),
            });
        }
    }

    /// Best effort, kubernetes store only: a lost Event is logged, never an
    /// error, and each is bounded by `kube::client::EVENT_DEADLINE`.
    fn post_events(&self, list: &[PodEvent]) {
        if list.is_empty() || !self.backend.is_kube() {
            return;
        }
        let Ok(client) = self.backend.client() else {
            return;
        };
        for event in list {
            if let Err(e) = client.post_event(event) {
                cni::log::warn(&format!(
                    "event {} on pod {}/{} not posted: {e}",
                    event.reason, event.namespace, event.pod
                ));
            }
        }
    }

    /// Plans and commits the ADD on the configured store; on the
    /// kubernetes store an API that does not answer falls back to
    /// degraded mode. Returns what reached the store, for `undo_add`.
    fn add_planned(
        &mut self,
        req: &AddRequest,
        unreachable: Option<String>,
        pod: Option<PodFacts>,
    ) -> CniResult<(Plan, Vec<Grant>)> {
        if let Some(why) = unreachable {
            let why = api_unreachable(&why);
            return self.add_degraded(req, &why);
        }
        let first = self.first_cursors();
        let mut store = self.backend.open(&self.conf.network, first)?;
        let known = match (&req.holder.pod_namespace, &req.holder.pod_name, pod) {
            (Some(ns), Some(name), Some(pod)) => Some((format!("{ns}/{name}"), pod)),
            _ => None,
        };
        let inspector = self.backend.inspector_knowing(self.node.clone(), known)?;
        let conf = &self.conf;
        match with_retries(&mut store, "ADD", |s| {
            plan_add(conf, s, inspector.as_ref(), req)
        }) {
            Err(PlanError::Store(StoreError::Unreachable(why))) if self.backend.is_kube() => {
                let why = api_unreachable(&why);
                drop((store, inspector));
                self.add_degraded(req, &why)
            }
            other => other.map_err(CniError::from),
        }
    }

    /// The API does not answer: `plan_degraded` on the node-local record;
    /// nothing is written to the API (ARCHITECTURE.md, "Never allocate
    /// blindly").
    fn add_degraded(&self, req: &AddRequest, why: &str) -> CniResult<(Plan, Vec<Grant>)> {
        let Some(record) = self.backend.local_record(&self.conf.network) else {
            return Err(CniError::new(
                cni::code::TRY_AGAIN_LATER,
                format!(
                    "network {:?}: {why}; kubelet retries this ADD",
                    self.conf.network
                ),
            ));
        };
        // Held like a commit through the API, so a DEL of the pod's old
        // sandbox that the API took is mirrored before this reads it.
        let (_, grants) = record.commit_held(|local| {
            let mut listing = local.list()?;
            // Only what the API confirmed, never an ADD's recorded intent.
            listing.claims.retain(|c| confirmed_locally(local, c.ip));
            plan_degraded(&self.conf, &listing.claims, req, &self.node.node, why)
        })?;
        cni::log::warn(&format!(
            "network {:?}: degraded mode, re-ADD of pod UID {} served from the node-local record; the API is not updated",
            self.conf.network,
            req.caller.pod_uid.as_deref().unwrap_or_default()
        ));
        // Nothing reached the API, so there is nothing for undo_add to undo there.
        Ok((Plan::default(), grants))
    }

    /// Undoes this process's ADD after a later step failed: the claims go
    /// back to exactly what they were (I5), unlike DEL, which
    /// would leave a taken-over claim without its old holder.
    pub fn undo_add(&mut self, granted: Granted) -> CniResult<()> {
        let done = granted.committed;
        if done.is_empty() {
            return Ok(());
        }
        let _attachment = self.hold_attachment()?;
        self.with_store(true, LEFT_FOR_LIVENESS, |s| {
            let undo = plan_undo(s, &done)?;
            Ok((undo, ()))
        })
        .map(drop)
    }

    /// This attachment's hold on the kubernetes store's node-local record,
    /// for the whole command (`LocalRecord::hold_attachment`).
    pub(super) fn hold_attachment(&self) -> CniResult<Option<Holds>> {
        Ok(self.backend.hold_attachment(
            &self.conf.network,
            &self.at.container_id,
            &self.at.ifname,
        )?)
    }

    /// Runs a release-like operation (`plan` then commit, retried) on the
    /// configured store. On the kubernetes store an unreachable API is not
    /// an error: `left` says what becomes of the claim then (a holder's
    /// claim is later found dead by liveness).
    fn with_store<T>(
        &mut self,
        release: bool,
        left: &str,
        plan: impl FnMut(&mut dyn ClaimStore) -> PlanResult<(Plan, T)>,
    ) -> CniResult<Option<(Plan, T)>> {
        let network = self.conf.network.clone();
        // Releases, undo and CHECK never run next-fit: no start cursors.
        let mut store = self.backend.open(&network, vec![])?;
        store.set_durable(!release);
        match with_retries(&mut store, "release", plan) {
            Err(PlanError::Store(StoreError::Unreachable(why))) if self.backend.is_kube() => {
                cni::log::warn(&format!(
                    "network {network:?}: {}; {left}",
                    api_unreachable(&why)
                ));
                Ok(None)
            }
            other => other.map(Some).map_err(CniError::from),
        }
    }
}

/// What becomes of a claim whose release the API did not answer.
const LEFT_FOR_LIVENESS: &str = "the claim is left for liveness to release";

fn list_ips(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
