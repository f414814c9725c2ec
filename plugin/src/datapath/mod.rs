//! The kernel side: a narrow netlink seam (`Netlink`), its real client over
//! rtnetlink, a recording fake for tests, and the macvlan logic on top.

pub mod arp;
pub mod conflict;
pub mod fake;
pub mod macvlan;
pub mod ndp;
pub mod netns;
mod packet;
pub mod rtnl;
mod rtnl_decode;

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// Which network namespace an operation runs in. The plugin process itself
/// lives in the node's netns (kubelet, or `ip netns exec` in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ns {
    Node,
    Pod,
}

impl fmt::Display for Ns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ns::Node => "node netns",
            Ns::Pod => "pod netns",
        })
    }
}

pub type Mac = [u8; 6];

pub fn format_mac(mac: &Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with `-`) into a unicast Ethernet MAC.
pub fn parse_mac(s: &str) -> Result<Mac, String> {
    let parsed: macaddr::MacAddr6 = s
        .parse()
        .map_err(|_| "it is not a 6-byte MAC address like 02:00:00:00:00:01".to_string())?;
    let bytes = parsed.into_array();
    if bytes[0] & 1 == 1 {
        return Err("it is a multicast address; an interface needs a unicast MAC".into());
    }
    if bytes == [0; 6] {
        return Err("it is all zeros".into());
    }
    Ok(bytes)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: Option<Mac>,
    /// `IFLA_INFO_KIND`, e.g. "macvlan", "veth"; None for plain devices.
    pub kind: Option<String>,
    pub macvlan_mode: Option<MacvlanMode>,
    pub up: bool,
    /// `IFLA_IFALIAS`: ours carry the attachment that made them.
    pub alias: Option<String>,
    /// `IFLA_INFO_PORT_KIND`: "bond" or "bridge" when the link is a port
    /// of one (no macvlan can sit on it).
    pub port_kind: Option<String>,
}

/// A macvlan to create, under a temporary name, in the pod netns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMacvlan {
    pub tmp_name: String,
    pub master_index: u32,
    /// Where the master is and the request is sent from; the link is always
    /// born in the pod netns.
    pub master_ns: Ns,
    pub mode: MacvlanMode,
    pub mtu: Option<u32>,
    pub mac: Option<Mac>,
    pub bc_queue_len: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrState {
    pub addr: IpNet,
    pub tentative: bool,
    pub dad_failed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRoute {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub oif: u32,
    pub mtu: Option<u32>,
    pub adv_mss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    pub scope: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteState {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
}

/// A failed kernel operation: what was attempted and the errno, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlError {
    pub op: String,
    pub errno: Option<i32>,
    pub detail: String,
}

impl NlError {
    pub fn new(op: impl Into<String>, errno: Option<i32>, detail: impl Into<String>) -> NlError {
        NlError {
            op: op.into(),
            errno,
            detail: detail.into(),
        }
    }

    pub fn from_errno(op: impl Into<String>, errno: i32) -> NlError {
        let detail = std::io::Error::from_raw_os_error(errno)
            .to_string()
            .to_lowercase();
        NlError::new(op, Some(errno), detail)
    }

    pub fn is_exists(&self) -> bool {
        self.errno == Some(libc::EEXIST)
    }

    pub fn is_no_device(&self) -> bool {
        self.errno == Some(libc::ENODEV)
    }
}

impl fmt::Display for NlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.detail)
    }
}

/// The macvlan mode of a link (`mode` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacvlanMode {
    Bridge,
    Private,
    Vepa,
    Passthru,
}

impl MacvlanMode {
    pub fn parse(s: &str) -> crate::cni::CniResult<MacvlanMode> {
        Ok(match s {
            "" | "bridge" => MacvlanMode::Bridge,
            "private" => MacvlanMode::Private,
            "vepa" => MacvlanMode::Vepa,
            "passthru" => MacvlanMode::Passthru,
            other => {
                return Err(crate::cni::CniError::invalid_config(format!(
                "unknown macvlan mode {other:?}: set \"mode\" to bridge, private, vepa or passthru"
            )))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MacvlanMode::Bridge => "bridge",
            MacvlanMode::Private => "private",
            MacvlanMode::Vepa => "vepa",
            MacvlanMode::Passthru => "passthru",
        }
    }
}

pub type NlResult<T> = Result<T, NlError>;

/// Everything the plugin asks of the kernel. Kept small so the macvlan
/// logic can run against `fake::FakeNetlink` in unit tests.
pub trait Netlink {
    fn link_by_name(&mut self, ns: Ns, name: &str) -> NlResult<Option<LinkState>>;
    /// Every link in the namespace (a dump; DEL's sweep of leftovers).
    fn links(&mut self, ns: Ns) -> NlResult<Vec<LinkState>>;
    /// The interface of the first default route (IPv4, then IPv6).
    fn default_route_link(&mut self, ns: Ns) -> NlResult<Option<String>>;
    fn create_macvlan(&mut self, req: &NewMacvlan) -> NlResult<()>;
    /// Renames the link and sets its alias in the same request.
    fn rename_link(&mut self, ns: Ns, index: u32, name: &str, alias: &str) -> NlResult<()>;
    fn set_link_up(&mut self, ns: Ns, index: u32) -> NlResult<()>;
    /// Sets the MAC of a link that is still down.
    fn set_link_mac(&mut self, ns: Ns, index: u32, mac: Mac) -> NlResult<()>;
    fn delete_link(&mut self, ns: Ns, index: u32) -> NlResult<()>;
    fn add_address(&mut self, ns: Ns, index: u32, addr: IpNet) -> NlResult<()>;
    fn addresses(&mut self, ns: Ns, index: u32) -> NlResult<Vec<AddrState>>;
    fn add_route(&mut self, ns: Ns, route: &NewRoute) -> NlResult<()>;
    fn routes(&mut self, ns: Ns) -> NlResult<Vec<RouteState>>;
    /// `key` is relative to /proc/sys, e.g. "net/ipv4/conf/net1/arp_notify".
    fn read_sysctl(&mut self, ns: Ns, key: &str) -> NlResult<Option<String>>;
    fn write_sysctl(&mut self, ns: Ns, key: &str, value: &str) -> NlResult<()>;
    /// Asks the wire at once whether another host uses any of `ips`, from
    /// the up link `index` in the pod netns that has none of them yet: an
    /// RFC 5227 ARP probe for each IPv4 address, RFC 4862 duplicate
    /// address detection for each IPv6 one, in the same rounds. The first
    /// address (in the order given) a host answered for, with its MAC.
    fn probe_addresses(
        &mut self,
        index: u32,
        ours: Mac,
        ips: &[IpAddr],
        spec: arp::ProbeSpec,
    ) -> NlResult<Option<(IpAddr, Mac)>>;
    /// Resolves `target` by ARP from link `index` (address `our_ip`) in the
    /// pod netns: the MAC that answered, if any.
    fn arp_resolve(
        &mut self,
        index: u32,
        ours: Mac,
        our_ip: std::net::Ipv4Addr,
        target: std::net::Ipv4Addr,
        spec: arp::ProbeSpec,
    ) -> NlResult<Option<Mac>>;
    /// Solicits the IPv6 neighbour `target` from link `index` in the pod
    /// netns: Some when it answered (with its MAC when it said).
    fn ndp_resolve(
        &mut self,
        index: u32,
        ours: Mac,
        target: std::net::Ipv6Addr,
        spec: arp::ProbeSpec,
    ) -> NlResult<Option<Option<Mac>>>;
    /// Gratuitous ARPs for `ip` from link `index` in the pod netns.
    fn arp_announce(&mut self, index: u32, ours: Mac, ip: std::net::Ipv4Addr) -> NlResult<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("02:00:00:00:00:01").unwrap(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(
            parse_mac("02-AB-00-00-00-01").unwrap(),
            [2, 0xab, 0, 0, 0, 1]
        );
        for bad in [
            "",
            "02:00:00:00:00",
            "zz:00:00:00:00:01",
            "01:00:5e:00:00:01",
            "00:00:00:00:00:00",
            "02:00:00:00:00:01:02",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
        assert_eq!(format_mac(&[2, 0xab, 0, 0, 0, 1]), "02:ab:00:00:00:01");
    }
}
