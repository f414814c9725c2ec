//! The `ipam` section: host-local's keys (so a NAD converts by changing
//! `type`) plus reservations, identity policy and the store. Everything is
//! validated here, before any claim is read or written.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use cni::{CniError, CniResult, Route};
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::addr::{parse_ip_maybe_cidr, parse_span, to_u128, Family, Span};
use crate::claim::validate_identity;

pub const DEFAULT_STORE_DIR: &str = "/var/lib/cni/sticky-ipam";

/// How many candidates one allocation looks at before it gives up. Larger
/// ranges are fine: allocation never enumerates a range, it steps from a
/// cursor, so a /64 costs what a /24 costs.
pub const DEFAULT_MAX_SCAN: u128 = 1 << 18;

/// One allocatable range inside a subnet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: Option<IpAddr>,
}

impl Range {
    pub fn span(&self) -> Span {
        Span::new(self.start, self.end)
    }

    pub fn family(&self) -> Family {
        Family::of(self.start)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.span().contains(ip)
    }

    /// Addresses that are never handed out: the network and broadcast
    /// addresses of a v4 subnet, and the gateway.
    pub fn is_special(&self, ip: IpAddr) -> bool {
        if Some(ip) == self.gateway {
            return true;
        }
        match self.family() {
            Family::V4 => ip == self.subnet.network() || ip == self.subnet.broadcast(),
            // v6 has no broadcast; the subnet-router anycast address is the
            // network address, never a host's.
            Family::V6 => ip == self.subnet.network(),
        }
    }

    pub fn describe(&self) -> String {
        format!("{}-{}", self.start, self.end)
    }
}

/// A set of ranges of one family; a claim takes one address per set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    pub ranges: Vec<Range>,
}

impl RangeSet {
    pub fn family(&self) -> Family {
        self.ranges[0].family()
    }

    pub fn range_of(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_of(ip).is_some()
    }

    pub fn size(&self) -> u128 {
        self.ranges.iter().map(|r| r.span().count()).sum()
    }

    /// The `n`th address of the set, counting range by range.
    pub fn address_at(&self, mut n: u128) -> Option<IpAddr> {
        for r in &self.ranges {
            let span = r.span();
            if n < span.count() {
                return Some(crate::addr::from_u128(r.family(), span.first + n));
            }
            n -= span.count();
        }
        None
    }

    /// "10.0.0.10-10.0.0.20,10.0.1.10-10.0.1.20", as host-local names a set.
    pub fn describe(&self) -> String {
        self.ranges
            .iter()
            .map(Range::describe)
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityPolicy {
    /// Pods without a configured identity are keyed by container + ifname.
    Dynamic,
    /// Every pod name on this network is stable (StatefulSet-like): pods are
    /// keyed by namespace/name from `K8S_POD_*`, no API needed.
    PodName,
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
    pub policy: IdentityPolicy,
    pub store_dir: PathBuf,
    pub store: StoreKind,
    pub node_name: Option<String>,
    pub max_scan: u128,
    /// The container runtime's CRI socket, asked whether the sandbox of a
    /// holder with no netns (adopted from host-local) still exists; None
    /// when `criSocket` is "" (such holders then stay held).
    pub cri_socket: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRange {
    subnet: String,
    range_start: Option<String>,
    range_end: Option<String>,
    gateway: Option<String>,
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
    data_dir: Option<String>,
    store: Option<RawStore>,
    node_name: Option<String>,
    max_scan: Option<u64>,
    cri_socket: Option<String>,
}

/// A DNS-1123 label, what a Kubernetes namespace name is.
fn is_namespace_name(s: &str) -> bool {
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

fn parse_addr(field: &str, s: &str) -> CniResult<IpAddr> {
    s.trim()
        .parse::<IpAddr>()
        .map_err(|_| bad(format!("{field} {s:?} is not an IP address")))
}

fn parse_range(field: &str, raw: &RawRange) -> CniResult<Range> {
    let subnet: IpNet = raw
        .subnet
        .trim()
        .parse()
        .map_err(|_| bad(format!("{field}.subnet {:?} is not a CIDR", raw.subnet)))?;
    if subnet.trunc() != subnet {
        return Err(bad(format!(
            "{field}.subnet {subnet} has host bits set: use {}",
            subnet.trunc()
        )));
    }
    let family = Family::of(subnet.addr());
    let max = subnet.max_prefix_len();
    if subnet.prefix_len() + 2 > max {
        return Err(bad(format!(
            "{field}.subnet {subnet} is too small to allocate from: use /{} or larger",
            max - 2
        )));
    }
    let net_span = Span::of_net(&subnet);
    let first = net_span.first + 1;
    let last = match family {
        Family::V4 => net_span.last - 1,
        Family::V6 => net_span.last,
    };
    let bound = |name: &str, v: &Option<String>, default: u128| -> CniResult<IpAddr> {
        match v.as_deref().filter(|s| !s.is_empty()) {
            None => Ok(crate::addr::from_u128(family, default)),
            Some(s) => {
                let ip = parse_addr(&format!("{field}.{name}"), s)?;
                let n = to_u128(ip);
                if Family::of(ip) != family || n < first || n > last {
                    return Err(bad(format!(
                        "{field}.{name} {ip} is outside subnet {subnet}'s usable addresses"
                    )));
                }
                Ok(ip)
            }
        }
    };
    let start = bound("rangeStart", &raw.range_start, first)?;
    let end = bound("rangeEnd", &raw.range_end, last)?;
    if to_u128(start) > to_u128(end) {
        return Err(bad(format!(
            "{field}: rangeStart {start} is after rangeEnd {end}"
        )));
    }
    let gateway = match raw.gateway.as_deref().filter(|s| !s.is_empty()) {
        // host-local's default: the subnet's first address.
        None => Some(crate::addr::from_u128(family, net_span.first + 1)),
        Some(s) => {
            let gw = parse_addr(&format!("{field}.gateway"), s)?;
            if !subnet.contains(&gw) {
                return Err(bad(format!(
                    "{field}.gateway {gw} is outside its subnet {subnet}: the pod could not reach it"
                )));
            }
            Some(gw)
        }
    };
    Ok(Range {
        subnet,
        start,
        end,
        gateway,
    })
}

/// Allocatable addresses of a range (u128 arithmetic, no enumeration).
fn allocatable(range: &Range, exclude: &[Span]) -> u128 {
    let span = range.span();
    let mut cut: Vec<Span> = exclude.iter().filter_map(|e| e.clip(&span)).collect();
    cut.sort_by_key(|s| s.first);
    let mut merged: Vec<Span> = Vec::new();
    for s in cut {
        match merged.last_mut() {
            Some(m) if s.first <= m.last.saturating_add(1) => m.last = m.last.max(s.last),
            _ => merged.push(s),
        }
    }
    let excluded: u128 = merged.iter().map(Span::count).sum();
    let is_excluded = |n: u128| merged.iter().any(|m| (m.first..=m.last).contains(&n));
    let mut specials = vec![to_u128(range.subnet.network())];
    if range.family() == Family::V4 {
        specials.push(to_u128(range.subnet.broadcast()));
    }
    if let Some(gw) = range.gateway {
        specials.push(to_u128(gw));
    }
    specials.sort_unstable();
    specials.dedup();
    let special = specials
        .iter()
        .filter(|n| span.first <= **n && **n <= span.last && !is_excluded(**n))
        .count() as u128;
    span.count()
        .saturating_sub(excluded)
        .saturating_sub(special)
}

/// The keys of an `ipam` section of ours.
const IPAM_KEYS: &[&str] = &[
    "type",
    "subnet",
    "rangeStart",
    "rangeEnd",
    "gateway",
    "ranges",
    "routes",
    "exclude",
    "reservations",
    "identity",
    "identityPolicy",
    "dataDir",
    "store",
    "nodeName",
    "maxScan",
    "criSocket",
];

/// host-local keys accepted so a NAD converts by changing `type`, with no
/// effect here.
const HOST_LOCAL_ONLY_KEYS: &[&str] = &[
    // host-local reads DNS from this file; macvlan (ours and the
    // reference) never passes an IPAM's dns on, so it changes nothing.
    "resolvConf",
];

const STORE_KEYS: &[&str] = &["type", "dir", "kubeconfig", "timeoutMs"];
const RANGE_KEYS: &[&str] = &["subnet", "rangeStart", "rangeEnd", "gateway"];
const RESERVATION_KEYS: &[&str] = &["ip", "namespaces"];

/// A typo among our keys is an error (code 2) naming it, never a silent
/// default: a misspelt `reservations` would hand a reserved address to
/// anyone.
fn refuse_unknown_keys(ipam: &Value) -> CniResult<()> {
    use cni::keys::{refuse_unknown_in, ROUTE_KEYS};
    refuse_unknown_in(ipam, "ipam", IPAM_KEYS, &[HOST_LOCAL_ONLY_KEYS])?;
    if let Some(store) = ipam.get("store") {
        refuse_unknown_in(store, "ipam.store", STORE_KEYS, &[])?;
    }
    for (i, set) in ipam
        .get("ranges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (j, range) in set.as_array().into_iter().flatten().enumerate() {
            refuse_unknown_in(range, &format!("ipam.ranges[{i}][{j}]"), RANGE_KEYS, &[])?;
        }
    }
    for (i, route) in ipam
        .get("routes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        refuse_unknown_in(route, &format!("ipam.routes[{i}]"), ROUTE_KEYS, &[])?;
    }
    for (id, reservation) in ipam
        .get("reservations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        refuse_unknown_in(
            reservation,
            &format!("ipam.reservations[{id:?}]"),
            RESERVATION_KEYS,
            &[],
        )?;
    }
    Ok(())
}

impl IpamConfig {
    /// Parses and validates `ipam` of network `network`.
    pub fn parse(network: &str, ipam: &Value) -> CniResult<IpamConfig> {
        refuse_unknown_keys(ipam)?;
        let raw: RawIpam = serde_path_to_error::deserialize(ipam).map_err(|e| {
            let path = e.path().to_string();
            bad(format!("ipam.{path} is invalid: {}", e.into_inner()))
        })?;

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
                "ipam has no ranges: set \"subnet\" (with optional rangeStart/rangeEnd) or \"ranges\"".into(),
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

        let mut reservations = BTreeMap::new();
        let mut identity_namespaces = BTreeMap::new();
        let mut reserved_by: BTreeMap<IpAddr, String> = BTreeMap::new();
        for (id, value) in raw.reservations.unwrap_or_default() {
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
                if let Some(ns) = namespaces.iter().find(|ns| !is_namespace_name(ns)) {
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

        let policy = match raw.identity_policy.as_deref().unwrap_or("dynamic") {
            "" | "dynamic" => IdentityPolicy::Dynamic,
            "podName" => IdentityPolicy::PodName,
            other => {
                return Err(bad(format!(
                    "ipam.identityPolicy {other:?} is unknown: use \"dynamic\" or \"podName\""
                )))
            }
        };

        let mut store_kind = StoreKind::File;
        let store_dir = match raw.store {
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
                store.dir.or(raw.data_dir)
            }
            None => raw.data_dir,
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
            policy,
            store_dir,
            store: store_kind,
            node_name: raw.node_name.filter(|n| !n.is_empty()),
            max_scan,
            cri_socket,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> CniResult<IpamConfig> {
        IpamConfig::parse("net", &v)
    }

    fn err(v: Value) -> String {
        let e = parse(v).unwrap_err();
        assert_eq!(e.code, cni::code::INVALID_CONFIG, "{}", e.msg);
        e.msg
    }

    #[test]
    fn host_local_single_subnet_defaults() {
        let c = parse(json!({"type": "sticky-ipam", "subnet": "10.0.0.0/24"})).unwrap();
        let r = &c.range_sets[0].ranges[0];
        assert_eq!(r.start.to_string(), "10.0.0.1");
        assert_eq!(r.end.to_string(), "10.0.0.254");
        assert_eq!(r.gateway.unwrap().to_string(), "10.0.0.1");
        assert_eq!(c.store_dir, PathBuf::from(DEFAULT_STORE_DIR));
        assert_eq!(c.policy, IdentityPolicy::Dynamic);
    }

    #[test]
    fn dual_stack_ranges_and_data_dir() {
        let c = parse(json!({
            "ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.20"}],
                       [{"subnet": "fd00::/64"}]],
            "dataDir": "/tmp/x",
            "reservations": {"peer-a": ["10.0.0.12", "fd00::12"]},
        }))
        .unwrap();
        assert_eq!(c.range_sets.len(), 2);
        assert_eq!(c.range_sets[1].family(), Family::V6);
        assert_eq!(c.store_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.reserved_for("fd00::12".parse().unwrap()), Some("peer-a"));
        assert_eq!(c.set_of("fd00::ffff".parse().unwrap()), Some(1));
        assert_eq!(c.store, StoreKind::File);
    }

    #[test]
    fn kubernetes_store_defaults() {
        let c = parse(json!({"subnet": "10.0.0.0/24", "store": {"type": "kubernetes"}})).unwrap();
        assert_eq!(
            c.store,
            StoreKind::Kubernetes {
                kubeconfig: PathBuf::from(DEFAULT_KUBECONFIG),
                timeout: std::time::Duration::from_millis(DEFAULT_KUBE_TIMEOUT_MS),
            }
        );
        assert_eq!(c.store_dir, PathBuf::from(DEFAULT_STORE_DIR));
    }

    #[test]
    fn a_single_address_range_is_valid() {
        let c = parse(json!({"subnet": "172.31.59.0/24", "rangeStart": "172.31.59.2", "rangeEnd": "172.31.59.2", "gateway": "172.31.59.1"})).unwrap();
        assert_eq!(c.range_sets[0].describe(), "172.31.59.2-172.31.59.2");
    }

    #[test]
    fn huge_v6_ranges_are_accepted_without_enumeration() {
        let c = parse(json!({"subnet": "fd00::/48"})).unwrap();
        assert_eq!(c.range_sets[0].ranges[0].span().count(), (1u128 << 80) - 1);
    }

    #[test]
    fn invalid_configs_name_the_field_and_reason() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({}), "no ranges"),
            (
                json!({"subnet": "nope"}),
                "ipam.subnet \"nope\" is not a CIDR",
            ),
            (json!({"subnet": "10.0.0.5/24"}), "host bits"),
            (json!({"subnet": "10.0.0.0/31"}), "too small"),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"}),
                "rangeStart 10.0.1.5 is outside",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.5"}),
                "after rangeEnd",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "rangeEnd": "x"}),
                "rangeEnd \"x\" is not an IP",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}),
                "gateway 10.0.1.1 is outside its subnet",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/25"}]]}),
                "overlap",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}),
                "mixes address families",
            ),
            (json!({"ranges": [[]]}), "empty range set"),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.1", "rangeEnd": "10.0.0.1"}),
                "no allocatable address",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.4", "rangeEnd": "10.0.0.7", "exclude": ["10.0.0.4/30"]}),
                "no allocatable address",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "exclude": ["zz"]}),
                "exclude entry \"zz\"",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "reservations": {"a": "10.0.1.2"}}),
                "outside every configured range",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "reservations": {"a": "10.0.0.1"}}),
                "gateway",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "reservations": {"a": "10.0.0.2", "b": "10.0.0.2"}}),
                "gives 10.0.0.2 to both",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "reservations": {"a": ["10.0.0.2", "10.0.0.3"]}}),
                "same range set",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "reservations": {"": "10.0.0.2"}}),
                "reservations key",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "identity": "a\u{0}b"}),
                "ipam.identity",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "identityPolicy": "magic"}),
                "identityPolicy \"magic\"",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "store": {"type": "etcd"}}),
                "ipam.store.type \"etcd\"",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "store": {"type": "kubernetes", "kubeconfig": "kc"}}),
                "ipam.store.kubeconfig kc",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "store": {"type": "kubernetes", "timeoutMs": 5}}),
                "ipam.store.timeoutMs 5",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "dataDir": "relative/dir"}),
                "absolute",
            ),
            (json!({"subnet": 5}), "ipam.subnet is invalid"),
            (json!({"subnet": "10.0.0.0/24", "maxScan": 0}), "maxScan"),
        ];
        for (input, want) in cases {
            let msg = err(input.clone());
            assert!(msg.contains(want), "{input}: {msg:?} lacks {want:?}");
        }
    }
}
