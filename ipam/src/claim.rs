//! A claim binds (network, IP) to an identity and names its current holder
//! (I1-I3 in ARCHITECTURE.md). These are the records the stores keep.

use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Longer identities are refused: a namespace (63) + '/' + a pod name
/// (253) fits, a 10 KB blob does not.
pub const MAX_IDENTITY_LEN: usize = 320;

/// Identity strings come from users and runtimes; they are hashed before
/// they touch a path, and bounded and printable here.
pub fn validate_identity(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("is empty: an identity needs at least one character".into());
    }
    if id.len() > MAX_IDENTITY_LEN {
        return Err(format!(
            "is {} bytes long: identities are at most {MAX_IDENTITY_LEN} bytes",
            id.len()
        ));
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{:.40?} contains the control character {c:?}: identities must be printable",
            id
        ));
    }
    Ok(())
}

/// The attachment that currently uses a claim's address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    /// The pod's netns path as CNI_NETNS gave it.
    #[serde(default)]
    pub netns: String,
    /// "dev:inode" of that netns at ADD, so a re-created path is not
    /// mistaken for the old holder's netns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, rename = "podUID", skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    pub node: String,
    /// The kernel boot the holder was recorded in: a holder from an earlier
    /// boot of this node cannot be alive.
    #[serde(default)]
    pub boot_id: String,
    pub since: u64,
}

impl Holder {
    pub fn is(&self, container_id: &str, ifname: &str) -> bool {
        self.container_id == container_id && self.ifname == ifname
    }

    pub fn pod(&self) -> Option<String> {
        match (&self.pod_namespace, &self.pod_name) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            (None, Some(name)) => Some(name.clone()),
            _ => None,
        }
    }

    /// "pod bgp/rs0-0 (container abc123…/net1) on node n1", for messages.
    pub fn describe(&self) -> String {
        let short: String = self.container_id.chars().take(12).collect();
        let attachment = format!("container {short}/{}", self.ifname);
        match self.pod() {
            Some(pod) => format!("pod {pod} ({attachment}) on node {}", self.node),
            None => format!("{attachment} on node {}", self.node),
        }
    }
}

/// The controller whose lifetime bounds a sticky identity; `retention`
/// says what becomes of the claim when the controller is scaled below the
/// pod's ordinal or deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The network's ipam.retention at the claim's last grant, recorded
    /// so that reconcile, which reads no network config, applies it. A
    /// claim stored without it reads the defaults.
    #[serde(default)]
    pub retention: Retention,
}

/// What to do with a StatefulSet pod's claim once the pod is gone for
/// good, named after StatefulSet's `persistentVolumeClaimRetentionPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RetentionPolicy {
    /// The address stays reserved for the identity until released.
    #[default]
    Retain,
    /// The claim is deleted once its holder is dead, the address freed.
    Delete,
}

/// `ipam.retention`. The defaults keep a scaled-down pod's address for
/// its return and free those of a deleted StatefulSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// The StatefulSet was scaled below the pod's ordinal.
    #[serde(default)]
    pub when_scaled: RetentionPolicy,
    /// The StatefulSet was deleted (or re-created under a new UID).
    #[serde(default = "delete")]
    pub when_deleted: RetentionPolicy,
}

fn delete() -> RetentionPolicy {
    RetentionPolicy::Delete
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            when_scaled: RetentionPolicy::Retain,
            when_deleted: RetentionPolicy::Delete,
        }
    }
}

impl Retention {
    /// "whenScaled=Retain,whenDeleted=Delete", for tables.
    pub fn describe(&self) -> String {
        format!(
            "whenScaled={:?},whenDeleted={:?}",
            self.when_scaled, self.when_deleted
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub ip: IpAddr,
    pub identity: String,
    /// Sticky claims stay reserved to their identity when released.
    pub sticky: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// The namespace of the pod that first claimed the identity: pods of
    /// other namespaces may not take it (`tenancy`). None for claims made
    /// outside Kubernetes or stored before namespaces were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub created: u64,
    pub updated: u64,
    /// Set while the wire has not confirmed the address since a holder was
    /// released or displaced by a judgement (I7): such a grant is probed
    /// before it is bound, and the mark is cleared only once a probe heard
    /// nobody (`engine::plan_confirm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unconfirmed: Option<Unconfirmed>,
}

/// Why a claim's address may still be live on the wire for someone else:
/// its holder was released, or taken over, on a judgement (liveness,
/// reconcile, GC, an operator's release, a takeover whose probe has not
/// passed yet) rather than by its own DEL of a confirmed grant. A verdict
/// can be wrong (a partitioned node whose pod was force-deleted); the wire
/// is the last witness (design brief, invariant 6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unconfirmed {
    /// When the judgement was made (seconds since the epoch).
    pub since: u64,
    /// Who was released or displaced, by what, and why.
    pub why: String,
}

impl Claim {
    /// A claim kept only so that its address is probed before it is bound
    /// again: no holder, not reserved for its identity, and released on a
    /// judgement. It binds no namespace and is reclaimed like any dead
    /// dynamic claim when the pool runs out.
    pub fn is_tombstone(&self) -> bool {
        self.holder.is_none() && !self.sticky && self.unconfirmed.is_some()
    }

    /// The node of its holder: the node that writes the claim (None for
    /// an unheld claim, which only the CLI's operator commands write).
    pub fn holder_node(&self) -> Option<&str> {
        self.holder.as_ref().map(|h| h.node.as_str())
    }

    pub fn held_by(&self, container_id: &str, ifname: &str) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|h| h.is(container_id, ifname))
    }
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
