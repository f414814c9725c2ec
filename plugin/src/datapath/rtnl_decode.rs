//! Kernel messages read into the datapath's own states (links, routes,
//! addresses) and macvlan modes mapped both ways: pure conversions, apart
//! from the socket work in `rtnl`.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoMacVlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, MacVlanMode,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::AddressFamily;

use super::MacvlanMode as Mode;
use super::{AddrState, LinkState, RouteState};

pub(super) fn to_kernel_mode(mode: Mode) -> MacVlanMode {
    match mode {
        Mode::Bridge => MacVlanMode::Bridge,
        Mode::Private => MacVlanMode::Private,
        Mode::Vepa => MacVlanMode::Vepa,
        Mode::Passthru => MacVlanMode::Passthrough,
    }
}

pub(super) fn from_kernel_mode(mode: &MacVlanMode) -> Option<Mode> {
    Some(match mode {
        MacVlanMode::Bridge => Mode::Bridge,
        MacVlanMode::Private => Mode::Private,
        MacVlanMode::Vepa => Mode::Vepa,
        MacVlanMode::Passthrough => Mode::Passthru,
        _ => return None,
    })
}

pub(super) fn link_state(msg: &LinkMessage) -> LinkState {
    let mut state = LinkState {
        index: msg.header.index,
        name: String::new(),
        mtu: 0,
        mac: None,
        kind: None,
        macvlan_mode: None,
        up: msg.header.flags.contains(LinkFlags::Up),
        alias: None,
        port_kind: None,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => state.name = n.clone(),
            LinkAttribute::IfAlias(a) => state.alias = Some(a.clone()),
            LinkAttribute::Mtu(m) => state.mtu = *m,
            LinkAttribute::Address(a) if a.len() == 6 => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(a);
                state.mac = Some(mac);
            }
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(kind) => state.kind = Some(kind.to_string()),
                        LinkInfo::PortKind(port) => state.port_kind = Some(port.to_string()),
                        LinkInfo::Data(InfoData::MacVlan(data)) => {
                            for d in data {
                                if let InfoMacVlan::Mode(m) = d {
                                    state.macvlan_mode = from_kernel_mode(m);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    state
}

pub(super) fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

pub(super) fn route_state(msg: &RouteMessage) -> Option<RouteState> {
    let mut dst = None;
    let mut gw = None;
    let mut oif = None;
    let mut table = u32::from(msg.header.table);
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = route_addr(a),
            RouteAttribute::Gateway(a) => gw = route_addr(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    let len = msg.header.destination_prefix_length;
    let dst = match (dst, msg.header.address_family) {
        (Some(a), _) => IpNet::new(a, len).ok()?,
        (None, AddressFamily::Inet) => IpNet::new(IpAddr::V4(0.into()), len).ok()?,
        (None, AddressFamily::Inet6) => IpNet::new(IpAddr::V6(0u128.into()), len).ok()?,
        _ => return None,
    };
    Some(RouteState {
        dst,
        gw,
        oif,
        table,
    })
}

pub(super) fn addr_state(msg: &AddressMessage) -> Option<AddrState> {
    let mut addr = None;
    let mut local = None;
    let mut flags = msg.header.flags.bits() as u32;
    for attr in &msg.attributes {
        match attr {
            AddressAttribute::Address(a) => addr = Some(*a),
            AddressAttribute::Local(a) => local = Some(*a),
            AddressAttribute::Flags(f) => flags = f.bits(),
            _ => {}
        }
    }
    // For IPv4 IFA_LOCAL is the interface's own address.
    let ip = local.or(addr)?;
    let net = IpNet::new(ip, msg.header.prefix_len).ok()?;
    Some(AddrState {
        addr: net,
        tentative: flags & u32::from(AddressHeaderFlags::Tentative.bits()) != 0,
        dad_failed: flags & u32::from(AddressHeaderFlags::Dadfailed.bits()) != 0,
    })
}
