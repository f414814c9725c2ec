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
use crate::engine::{plan_add, plan_del, plan_gc, plan_undo, AddRequest, Grant};
use crate::identity;
use crate::liveness::Caller;
use crate::store::file::FileStore;
use crate::store::{ClaimStore, Plan};
use crate::system::{netns_id, node_facts, LocalInspector};

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
    inspector: LocalInspector,
    /// The ADD request, resolved early by `prepare_add`.
    prepared: Option<AddRequest>,
    /// What the last ADD committed, for `undo_add`.
    committed: Option<Plan>,
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
        let inspector = LocalInspector {
            node: node_facts(conf.node_name.as_deref()),
        };
        Ok(StickyIpam {
            conf,
            at,
            inspector,
            prepared: None,
            committed: None,
        })
    }

    pub fn config(&self) -> &IpamConfig {
        &self.conf
    }

    fn open(&self) -> CniResult<FileStore> {
        FileStore::open(&self.conf.store_dir, &self.conf.network)
    }

    fn request(&self) -> CniResult<AddRequest> {
        let args = CniArgs::parse(&self.at.args)?;
        let identity = identity::resolve(
            &self.conf,
            &self.at.args_cni,
            &args,
            &self.at.container_id,
            &self.at.ifname,
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
                node: self.inspector.node.node.clone(),
                boot_id: self.inspector.node.boot_id.clone(),
                since: now,
            },
            identity,
            now,
        })
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
    /// without touching the store, so a bad identity fails before the
    /// plugin creates anything.
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
        let mut store = self.open()?;
        let (plan, grants) = plan_add(&self.conf, &mut store, &self.inspector, &req)?;
        if !plan.is_empty() {
            store.commit(&plan)?;
        }
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
        Ok(self.output(&grants))
    }

    /// Undoes this process's ADD after a later step failed: the claims go
    /// back to exactly what they were (invariant 5), unlike DEL, which
    /// would leave a taken-over claim without its old holder.
    pub fn undo_add(&mut self) -> CniResult<()> {
        let Some(done) = self.committed.take() else {
            return Ok(());
        };
        let mut store = self.open()?;
        let undo = plan_undo(&mut store, &done)?;
        if !undo.is_empty() {
            store.commit(&undo)?;
        }
        Ok(())
    }

    /// A release that a power loss undoes is harmless: the claim comes back
    /// with a holder recorded in an earlier boot, which every verdict finds
    /// dead. So releases skip the fsyncs that grants need.
    fn open_for_release(&self) -> CniResult<FileStore> {
        let mut store = self.open()?;
        store.set_durable(false);
        Ok(store)
    }

    pub fn del(&mut self) -> CniResult<()> {
        let mut store = self.open_for_release()?;
        let plan = plan_del(
            &mut store,
            &self.at.container_id,
            &self.at.ifname,
            now_secs(),
        )?;
        if !plan.is_empty() {
            store.commit(&plan)?;
            for c in plan.changes.iter().filter_map(|c| c.before.as_ref()) {
                cni::log::info(&format!("released {} of identity {:?}", c.ip, c.identity));
            }
        }
        Ok(())
    }

    pub fn check(&mut self) -> CniResult<()> {
        let mut store = self.open()?;
        let held = store.claims_of_holder(&self.at.container_id, &self.at.ifname)?;
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

    /// STATUS: the store can be opened and locked.
    pub fn status(&mut self) -> CniResult<()> {
        self.open().map(drop).map_err(|e| {
            CniError::new(
                cni::code::STATUS_UNAVAILABLE,
                format!("sticky-ipam cannot use its store: {}", e.msg),
            )
        })
    }

    pub fn gc(&mut self, keep: &[(String, String)]) -> CniResult<()> {
        let keep: BTreeSet<(String, String)> = keep.iter().cloned().collect();
        let mut store = self.open_for_release()?;
        let plan = plan_gc(&mut store, &self.inspector.node.node, &keep, now_secs())?;
        if !plan.is_empty() {
            store.commit(&plan)?;
            cni::log::info(&format!("GC released {} claims", plan.changes.len()));
        }
        Ok(())
    }
}
