//! The `ipam` section: host-local's keys (so a NAD converts by changing
//! `type`) plus reservations, identity policy and the store. Everything is
//! validated here, before any claim is read or written.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use cni::{CniError, CniResult, Route};
use serde::Deserialize;
use serde_json::Value;

use crate::addr::{parse_ip_maybe_cidr, parse_span, Family, Span};
use crate::claim::{validate_identity, Retention};

pub const DEFAULT_STORE_DIR: &str = "/var/lib/cni/sticky-ipam";

/// How many candidates one allocation looks at before it gives up. Larger
/// ranges are fine: allocation never enumerates a range, it steps from a
/// cursor, so a /64 costs what a /24 costs.
pub const DEFAULT_MAX_SCAN: u128 = 1 << 18;

pub mod keys;
mod range;

use keys::refuse_unknown_keys;
use range::{allocatable, parse_range, RawRange};
pub use range::{Range, RangeSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityPolicy {
    /// Pods without a configured identity are keyed by container + ifname.
    Dynamic,
    /// Every pod name on this network is stable (StatefulSet-like): pods are
    /// keyed by namespace/name from `K8S_POD_*`, no API needed.
    PodName,
}

/// `identityFrom`: a pod label or annotation whose value, prefixed with
/// the pod's namespace, is its identity (for controllers other than
/// StatefulSet whose pods carry a stable name or ordinal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityFrom {
    Label(String),
    Annotation(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConfig {
    pub network: String,
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    pub exclude: Vec<Span>,
    /// identity -> addresses pinned to it (one per family at most).
    pub reservations: BTreeMap<String, Vec<IpAddr>>,
    /// identity -> the only namespaces whose pods may take it
    /// (`reservations.<identity>.namespaces`); see `tenancy`.
    pub identity_namespaces: BTreeMap<String, Vec<String>>,
    pub identity: Option<String>,
    pub identity_from: Option<IdentityFrom>,
    pub policy: IdentityPolicy,
    pub store_dir: PathBuf,
    pub store: StoreKind,
    pub node_name: Option<String>,
    pub max_scan: u128,
    /// The container runtime's CRI socket, asked whether the sandbox of a
    /// holder with no netns (adopted from host-local) still exists; None
    /// when `criSocket` is "" (such holders then stay held).
    pub cri_socket: Option<PathBuf>,
    /// What becomes of a StatefulSet pod's claim when its StatefulSet is
    /// scaled below the pod or deleted; recorded on each claim's owner.
    pub retention: Retention,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A reservation: an address (or one per range set), optionally bound to
/// the namespaces whose pods may take it.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawReservation {
    Addresses(OneOrMany),
    Bound {
        ip: OneOrMany,
        #[serde(default)]
        namespaces: Vec<String>,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStore {
    #[serde(rename = "type")]
    store_type: Option<String>,
    dir: Option<String>,
    kubeconfig: Option<String>,
    timeout_ms: Option<u64>,
}

pub const DEFAULT_KUBECONFIG: &str = "/etc/cni/net.d/sticky-macvlan.d/sticky-macvlan.kubeconfig";
pub const DEFAULT_KUBE_TIMEOUT_MS: u64 = 10_000;

/// Where claims live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// One node: the directory `store_dir`.
    File,
    /// Cluster-wide: `IPClaim` objects; `store_dir` keeps the node-local
    /// record for degraded mode.
    Kubernetes {
        kubeconfig: PathBuf,
        timeout: std::time::Duration,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawIpam {
    subnet: Option<String>,
    range_start: Option<String>,
    range_end: Option<String>,
    gateway: Option<String>,
    ranges: Option<Vec<Vec<RawRange>>>,
    routes: Option<Vec<Route>>,
    exclude: Option<Vec<String>>,
    reservations: Option<BTreeMap<String, RawReservation>>,
    identity: Option<String>,
    identity_policy: Option<String>,
    identity_from: Option<BTreeMap<String, String>>,
    data_dir: Option<String>,
    store: Option<RawStore>,
    node_name: Option<String>,
    max_scan: Option<u64>,
    cri_socket: Option<String>,
    retention: Option<Retention>,
}

/// A DNS-1123 label, what a Kubernetes namespace name is, and each
/// dot-separated part of an object name.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn bad(msg: String) -> CniError {
    CniError::invalid_config(msg)
}

impl IpamConfig {
    /// Parses and validates `ipam` of network `network`.
    pub fn parse(network: &str, ipam: &Value) -> CniResult<IpamConfig> {
        refuse_unknown_keys(ipam)?;
        let raw: RawIpam = serde_path_to_error::deserialize(ipam).map_err(|e| {
            let path = e.path().to_string();
            bad(format!("ipam.{path} is invalid: {}", e.into_inner()))
        })?;

        let range_sets = parse_range_sets(&raw)?;
        let all: Vec<&Range> = range_sets.iter().flat_map(|s| &s.ranges).collect();

        let exclude = raw
            .exclude
            .unwrap_or_default()
            .iter()
            .map(|s| {
                parse_span(s).ok_or_else(|| {
                    bad(format!(
                        "ipam.exclude entry {s:?} is not an IP address or CIDR"
                    ))
                })
            })
            .collect::<CniResult<Vec<_>>>()?;
        for range in &all {
            if allocatable(range, &exclude) == 0 {
                return Err(bad(format!(
                    "ipam range {} has no allocatable address (after the network, broadcast and gateway addresses and ipam.exclude)",
                    range.describe()
                )));
            }
        }

        let identity = match raw.identity.filter(|s| !s.is_empty()) {
            None => None,
            Some(id) => {
                validate_identity(&id).map_err(|why| bad(format!("ipam.identity {why}")))?;
                Some(id)
            }
        };

        let (reservations, identity_namespaces) =
            parse_reservations(raw.reservations.unwrap_or_default(), &range_sets, &exclude)?;

        let policy = match raw.identity_policy.as_deref().unwrap_or("dynamic") {
            "" | "dynamic" => IdentityPolicy::Dynamic,
            "podName" => IdentityPolicy::PodName,
            other => {
                return Err(bad(format!(
                    "ipam.identityPolicy {other:?} is unknown: use \"dynamic\" or \"podName\""
                )))
            }
        };

        let (store_kind, store_dir) = parse_store(raw.store, raw.data_dir)?;
        if matches!(store_kind, StoreKind::Kubernetes { .. }) {
            let top = raw.subnet.as_deref().is_some_and(|s| !s.is_empty());
            one_set_per_family(&range_sets, top)?;
        }
        let identity_from = parse_identity_from(raw.identity_from, &store_kind)?;

        let max_scan = match raw.max_scan {
            None => DEFAULT_MAX_SCAN,
            Some(0) => return Err(bad("ipam.maxScan must be at least 1".into())),
            Some(n) => u128::from(n),
        };

        let cri_socket = match raw.cri_socket.as_deref() {
            None => Some(PathBuf::from(crate::cri::DEFAULT_CRI_SOCKET)),
            Some("") => None,
            Some(path) if path.starts_with('/') => Some(PathBuf::from(path)),
            Some(path) => {
                return Err(bad(format!(
                    "ipam.criSocket {path:?} must be an absolute path (or \"\" to ask no runtime)"
                )))
            }
        };

        Ok(IpamConfig {
            network: network.to_string(),
            range_sets,
            routes: raw.routes.unwrap_or_default(),
            exclude,
            reservations,
            identity_namespaces,
            identity,
            identity_from,
            policy,
            store_dir,
            store: store_kind,
            node_name: raw.node_name.filter(|n| !n.is_empty()),
            max_scan,
            cri_socket,
            retention: raw.retention.unwrap_or_default(),
        })
    }

    /// How many addresses the ranges can hand out: no network, broadcast
    /// or gateway address, nothing in `exclude`.
    pub fn allocatable_addresses(&self) -> u128 {
        self.range_sets
            .iter()
            .flat_map(|s| &s.ranges)
            .map(|r| allocatable(r, &self.exclude))
            .sum()
    }

    /// The identity an address is reserved for, if any.
    pub fn reserved_for(&self, ip: IpAddr) -> Option<&str> {
        self.reservations
            .iter()
            .find(|(_, ips)| ips.contains(&ip))
            .map(|(id, _)| id.as_str())
    }

    /// Index of the range set holding `ip`.
    pub fn set_of(&self, ip: IpAddr) -> Option<usize> {
        self.range_sets.iter().position(|s| s.contains(ip))
    }

    pub fn is_excluded(&self, ip: IpAddr) -> bool {
        self.exclude.iter().any(|e| e.contains(ip))
    }
}

/// The range sets: the top-level `subnet` (host-local's single range)
/// and `ranges`, each of one family, none overlapping.
fn parse_range_sets(raw: &RawIpam) -> CniResult<Vec<RangeSet>> {
    let mut range_sets = Vec::new();
    if let Some(subnet) = raw.subnet.as_deref().filter(|s| !s.is_empty()) {
        let top = RawRange {
            subnet: subnet.to_string(),
            range_start: raw.range_start.clone(),
            range_end: raw.range_end.clone(),
            gateway: raw.gateway.clone(),
        };
        range_sets.push(RangeSet {
            ranges: vec![parse_range("ipam", &top)?],
        });
    }
    for (i, set) in raw.ranges.iter().flatten().enumerate() {
        if set.is_empty() {
            return Err(bad(format!("ipam.ranges[{i}] is an empty range set")));
        }
        let ranges = set
            .iter()
            .enumerate()
            .map(|(j, r)| parse_range(&format!("ipam.ranges[{i}][{j}]"), r))
            .collect::<CniResult<Vec<_>>>()?;
        if let Some(mixed) = ranges.iter().find(|r| r.family() != ranges[0].family()) {
            return Err(bad(format!(
                "ipam.ranges[{i}] mixes address families ({} and {}): put each family in its own range set",
                ranges[0].subnet, mixed.subnet
            )));
        }
        range_sets.push(RangeSet { ranges });
    }
    if range_sets.is_empty() {
        return Err(bad(
            "ipam has no ranges: set \"subnet\" (with optional rangeStart/rangeEnd) or \"ranges\""
                .into(),
        ));
    }
    let all: Vec<&Range> = range_sets.iter().flat_map(|s| &s.ranges).collect();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.span().overlaps(&b.span()) {
                return Err(bad(format!(
                    "ipam ranges {} and {} overlap: an address must belong to one range",
                    a.describe(),
                    b.describe()
                )));
            }
        }
    }

    Ok(range_sets)
}

/// `reservations`: identity -> its addresses (one per range set, inside
/// a range, never special or excluded, never given twice), and the
/// namespaces bound to each identity that names them.
type Reservations = (BTreeMap<String, Vec<IpAddr>>, BTreeMap<String, Vec<String>>);

fn parse_reservations(
    raw: BTreeMap<String, RawReservation>,
    range_sets: &[RangeSet],
    exclude: &[Span],
) -> CniResult<Reservations> {
    let all: Vec<&Range> = range_sets.iter().flat_map(|s| &s.ranges).collect();
    let mut reservations = BTreeMap::new();
    let mut identity_namespaces = BTreeMap::new();
    let mut reserved_by: BTreeMap<IpAddr, String> = BTreeMap::new();
    for (id, value) in raw {
        validate_identity(&id).map_err(|why| bad(format!("ipam.reservations key {why}")))?;
        let (addresses, namespaces) = match value {
            RawReservation::Addresses(a) => (a, None),
            RawReservation::Bound { ip, namespaces } => (ip, Some(namespaces)),
        };
        if let Some(namespaces) = namespaces {
            let field = format!("ipam.reservations[{id:?}].namespaces");
            if namespaces.is_empty() {
                return Err(bad(format!(
                    "{field} is empty: list the namespaces whose pods may take {id:?}, or leave the key out (the first namespace to claim it keeps it)"
                )));
            }
            if let Some(ns) = namespaces.iter().find(|ns| !is_dns_label(ns)) {
                return Err(bad(format!(
                    "{field} entry {ns:?} is not a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)"
                )));
            }
            identity_namespaces.insert(id.clone(), namespaces);
        }
        let list = match addresses {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        };
        let mut ips: Vec<IpAddr> = Vec::new();
        for s in list {
            let field = format!("ipam.reservations[{id:?}]");
            let ip = parse_ip_maybe_cidr(&s)
                .ok_or_else(|| bad(format!("{field} {s:?} is not an IP address")))?;
            let Some(range) = all.iter().find(|r| r.contains(ip)) else {
                return Err(bad(format!(
                    "{field} {ip} is outside every configured range: reserve an address inside one"
                )));
            };
            if range.is_special(ip) || exclude.iter().any(|e| e.contains(ip)) {
                return Err(bad(format!(
                    "{field} {ip} is the gateway, network or broadcast address or excluded: it cannot be handed out"
                )));
            }
            let set = range_sets.iter().position(|s| s.contains(ip));
            if ips
                .iter()
                .any(|o| range_sets.iter().position(|s| s.contains(*o)) == set)
            {
                return Err(bad(format!(
                    "{field} names two addresses in the same range set: an identity has one address per range set"
                )));
            }
            if let Some(other) = reserved_by.insert(ip, id.clone()) {
                return Err(bad(format!(
                    "ipam.reservations gives {ip} to both {other:?} and {id:?}"
                )));
            }
            ips.push(ip);
        }
        reservations.insert(id, ips);
    }

    Ok((reservations, identity_namespaces))
}

/// `store` (and host-local's `dataDir`): where claims live, and the
/// directory of the file store or of the node-local record.
/// `identityFrom`: exactly one of `label` or `annotation`, a key; only
/// with the kubernetes store, which reads the pod.
fn parse_identity_from(
    raw: Option<BTreeMap<String, String>>,
    store: &StoreKind,
) -> CniResult<Option<IdentityFrom>> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let mut entries = raw.into_iter();
    let from = match (entries.next(), entries.next()) {
        (Some((kind, key)), None) if !key.is_empty() => match kind.as_str() {
            "label" => IdentityFrom::Label(key),
            "annotation" => IdentityFrom::Annotation(key),
            other => {
                return Err(bad(format!(
                    "ipam.identityFrom.{other} is unknown: use {{\"label\": \"KEY\"}} or {{\"annotation\": \"KEY\"}}"
                )))
            }
        },
        _ => {
            return Err(bad(
                "ipam.identityFrom takes one non-empty key: {\"label\": \"KEY\"} or {\"annotation\": \"KEY\"}".into(),
            ))
        }
    };
    if !matches!(store, StoreKind::Kubernetes { .. }) {
        return Err(bad(
            "ipam.identityFrom reads the pod from the kubernetes API: it needs \"store\": {\"type\": \"kubernetes\", ...}".into(),
        ));
    }
    Ok(Some(from))
}

/// The kubernetes store keeps one IPClaim per (network, identity, family),
/// so it holds one address per family: a second range set of a family
/// would have every ADD fight itself for that one object. TOP: the first
/// set is the top-level `subnet`, the others are `ranges`.
fn one_set_per_family(range_sets: &[RangeSet], top: bool) -> CniResult<()> {
    let field = |i: usize| match (top, i) {
        (true, 0) => "ipam.subnet".to_string(),
        (true, i) => format!("ipam.ranges[{}]", i - 1),
        (false, i) => format!("ipam.ranges[{i}]"),
    };
    for (i, set) in range_sets.iter().enumerate() {
        if let Some(first) = range_sets[..i]
            .iter()
            .position(|s| s.family() == set.family())
        {
            let family = match set.family() {
                Family::V4 => "IPv4",
                Family::V6 => "IPv6",
            };
            return Err(bad(format!(
                "{} is a second {family} range set ({} is one): the kubernetes store keeps one address per identity and family (ipam.ranges: at most one range set per family); put both sets' ranges into one, or use the file store",
                field(i),
                field(first)
            )));
        }
    }
    Ok(())
}

fn parse_store(
    store: Option<RawStore>,
    data_dir: Option<String>,
) -> CniResult<(StoreKind, PathBuf)> {
    let mut store_kind = StoreKind::File;
    let store_dir = match store {
        Some(store) => {
            match store.store_type.as_deref().unwrap_or("file") {
                "file" => {}
                "kubernetes" => {
                    let kubeconfig = PathBuf::from(
                        store
                            .kubeconfig
                            .as_deref()
                            .filter(|k| !k.is_empty())
                            .unwrap_or(DEFAULT_KUBECONFIG),
                    );
                    if !kubeconfig.is_absolute() {
                        return Err(bad(format!(
                            "ipam.store.kubeconfig {} must be an absolute path",
                            kubeconfig.display()
                        )));
                    }
                    let timeout_ms = match store.timeout_ms {
                        None => DEFAULT_KUBE_TIMEOUT_MS,
                        Some(ms @ 100..=120_000) => ms,
                        Some(ms) => {
                            return Err(bad(format!(
                                "ipam.store.timeoutMs {ms} is out of range: use 100 to 120000 (kubelet gives a whole sandbox a few minutes)"
                            )))
                        }
                    };
                    store_kind = StoreKind::Kubernetes {
                        kubeconfig,
                        timeout: std::time::Duration::from_millis(timeout_ms),
                    };
                }
                other => {
                    return Err(bad(format!(
                        "ipam.store.type {other:?} is unknown: use \"file\" or \"kubernetes\""
                    )))
                }
            }
            store.dir.or(data_dir)
        }
        None => data_dir,
    }
    .filter(|d| !d.is_empty())
    .map(PathBuf::from)
    .unwrap_or_else(|| PathBuf::from(DEFAULT_STORE_DIR));
    if !store_dir.is_absolute() {
        return Err(bad(format!(
            "ipam.dataDir (or ipam.store.dir) {:?} must be an absolute path",
            store_dir.display().to_string()
        )));
    }

    Ok((store_kind, store_dir))
}

#[cfg(test)]
mod tests;
