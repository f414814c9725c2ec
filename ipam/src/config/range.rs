//! Ranges and range sets: validated with u128 address arithmetic, never
//! enumerated.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

use super::bad;
use crate::addr::{to_u128, Family, Span};
use cni::CniResult;

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

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawRange {
    pub(super) subnet: String,
    pub(super) range_start: Option<String>,
    pub(super) range_end: Option<String>,
    pub(super) gateway: Option<String>,
}

fn parse_addr(field: &str, s: &str) -> CniResult<IpAddr> {
    s.trim()
        .parse::<IpAddr>()
        .map_err(|_| bad(format!("{field} {s:?} is not an IP address")))
}

pub(super) fn parse_range(field: &str, raw: &RawRange) -> CniResult<Range> {
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
pub(super) fn allocatable(range: &Range, exclude: &[Span]) -> u128 {
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
