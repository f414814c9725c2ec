//! Address arithmetic on one number line per family, so ranges of any size
//! (a v6 /64 included) are handled without enumerating them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

pub fn from_u128(family: Family, n: u128) -> IpAddr {
    match family {
        // Callers stay inside a v4 range, so the value fits in 32 bits.
        Family::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// An inclusive interval of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub family: Family,
    pub first: u128,
    pub last: u128,
}

impl Span {
    pub fn new(first: IpAddr, last: IpAddr) -> Span {
        Span {
            family: Family::of(first),
            first: to_u128(first),
            last: to_u128(last),
        }
    }

    pub fn of_net(net: &IpNet) -> Span {
        Span::new(net.network(), net.broadcast())
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family && (self.first..=self.last).contains(&to_u128(ip))
    }

    pub fn overlaps(&self, other: &Span) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// Number of addresses; saturates for a whole v6 space.
    pub fn count(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    pub fn clip(&self, other: &Span) -> Option<Span> {
        if !self.overlaps(other) {
            return None;
        }
        Some(Span {
            family: self.family,
            first: self.first.max(other.first),
            last: self.last.min(other.last),
        })
    }
}

/// Parses "10.0.0.5" or "10.0.0.5/24" (the prefix is ignored).
pub fn parse_ip_maybe_cidr(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<IpNet>().ok().map(|n| n.addr()))
}

/// Parses "10.0.0.5" (a single address) or "10.0.0.64/28" (a block).
pub fn parse_span(s: &str) -> Option<Span> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(Span::new(ip, ip));
    }
    s.parse::<IpNet>().ok().map(|n| Span::of_net(&n.trunc()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn spans_of_both_families() {
        let s = Span::of_net(&"10.0.0.0/24".parse().unwrap());
        assert_eq!(s.count(), 256);
        assert!(s.contains(ip("10.0.0.255")) && !s.contains(ip("10.0.1.0")));
        assert!(!s.contains(ip("::a00:1")), "families never mix");
        let v6 = Span::of_net(&"fd00::/64".parse().unwrap());
        assert_eq!(v6.count(), 1u128 << 64);
        let all = Span::of_net(&"::/0".parse().unwrap());
        assert_eq!(all.count(), u128::MAX, "saturates");
        assert_eq!(from_u128(Family::V6, to_u128(ip("fd00::5"))), ip("fd00::5"));
    }

    #[test]
    fn overlap_and_clip() {
        let a = Span::new(ip("10.0.0.10"), ip("10.0.0.20"));
        let b = Span::new(ip("10.0.0.20"), ip("10.0.0.30"));
        let c = Span::new(ip("10.0.0.21"), ip("10.0.0.30"));
        assert!(a.overlaps(&b) && !a.overlaps(&c));
        assert_eq!(a.clip(&b).unwrap().count(), 1);
    }

    #[test]
    fn parsing_addresses_and_blocks() {
        assert_eq!(parse_ip_maybe_cidr("10.0.0.5/24"), Some(ip("10.0.0.5")));
        assert_eq!(parse_ip_maybe_cidr(" fd00::1 "), Some(ip("fd00::1")));
        assert_eq!(parse_ip_maybe_cidr("nope"), None);
        assert_eq!(parse_span("10.0.0.64/28").unwrap().count(), 16);
        assert_eq!(
            parse_span("10.0.0.70/28").unwrap().first,
            to_u128(ip("10.0.0.64"))
        );
    }
}
