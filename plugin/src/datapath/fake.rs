//! A recording, in-memory `Netlink` for unit tests: two namespaces with
//! links, addresses, routes and sysctls, a log of every call, and failures
//! injected by operation name.

use std::collections::HashMap;

use ipnet::IpNet;

use super::{
    AddrState, LinkState, Mac, Netlink, NewMacvlan, NewRoute, NlError, NlResult, Ns, RouteState,
};

#[derive(Debug, Clone)]
pub struct FakeLink {
    pub state: LinkState,
    pub addrs: Vec<IpNet>,
}

#[derive(Debug, Default)]
pub struct FakeNetlink {
    pub links: HashMap<Ns, Vec<FakeLink>>,
    pub routes: HashMap<Ns, Vec<(NewRoute, u32)>>,
    pub sysctls: HashMap<(Ns, String), String>,
    pub default_route: HashMap<Ns, String>,
    /// Every call, as "op arg..." strings, in order.
    pub calls: Vec<String>,
    /// Op name -> errno to fail with (once per listed entry).
    pub failures: Vec<(&'static str, i32)>,
    /// Addresses another host answers ARP probes for, and its MAC.
    pub arp_owners: HashMap<std::net::Ipv4Addr, Mac>,
    /// IPv6 neighbours that answer solicitations.
    pub ndp_owners: HashMap<std::net::Ipv6Addr, Mac>,
    next_index: u32,
}

impl FakeNetlink {
    pub fn new() -> FakeNetlink {
        FakeNetlink {
            next_index: 10,
            ..FakeNetlink::default()
        }
    }

    /// A plain (non-macvlan) device, e.g. the master uplink.
    pub fn with_device(mut self, ns: Ns, name: &str, mtu: u32) -> FakeNetlink {
        let index = self.alloc_index();
        self.links.entry(ns).or_default().push(FakeLink {
            state: LinkState {
                index,
                name: name.into(),
                mtu,
                mac: Some([2, 0, 0, 0, 0, index as u8]),
                kind: Some("veth".into()),
                macvlan_mode: None,
                up: true,
                alias: None,
                port_kind: None,
            },
            addrs: vec![],
        });
        self
    }

    pub fn with_default_route(mut self, ns: Ns, dev: &str) -> FakeNetlink {
        self.default_route.insert(ns, dev.into());
        self
    }

    pub fn fail(mut self, op: &'static str, errno: i32) -> FakeNetlink {
        self.failures.push((op, errno));
        self
    }

    fn alloc_index(&mut self) -> u32 {
        self.next_index += 1;
        self.next_index
    }

    fn maybe_fail(&mut self, op: &'static str, call: String) -> NlResult<()> {
        self.calls.push(call);
        if let Some(pos) = self.failures.iter().position(|(o, _)| *o == op) {
            let (_, errno) = self.failures.remove(pos);
            return Err(NlError::from_errno(op, errno));
        }
        Ok(())
    }

    pub fn link(&self, ns: Ns, name: &str) -> Option<&FakeLink> {
        self.links.get(&ns)?.iter().find(|l| l.state.name == name)
    }

    fn link_mut(&mut self, ns: Ns, index: u32) -> NlResult<&mut FakeLink> {
        self.links
            .get_mut(&ns)
            .and_then(|v| v.iter_mut().find(|l| l.state.index == index))
            .ok_or_else(|| NlError::from_errno("find link", libc::ENODEV))
    }

    pub fn link_names(&self, ns: Ns) -> Vec<String> {
        self.links
            .get(&ns)
            .map(|v| v.iter().map(|l| l.state.name.clone()).collect())
            .unwrap_or_default()
    }
}

impl Netlink for FakeNetlink {
    fn link_by_name(&mut self, ns: Ns, name: &str) -> NlResult<Option<LinkState>> {
        self.maybe_fail("link_by_name", format!("link_by_name {ns:?} {name}"))?;
        Ok(self.link(ns, name).map(|l| l.state.clone()))
    }

    fn links(&mut self, ns: Ns) -> NlResult<Vec<LinkState>> {
        self.maybe_fail("links", format!("links {ns:?}"))?;
        Ok(self
            .links
            .get(&ns)
            .map(|l| l.iter().map(|l| l.state.clone()).collect())
            .unwrap_or_default())
    }

    fn default_route_link(&mut self, ns: Ns) -> NlResult<Option<String>> {
        self.maybe_fail("default_route_link", format!("default_route_link {ns:?}"))?;
        Ok(self.default_route.get(&ns).cloned())
    }

    fn create_macvlan(&mut self, req: &NewMacvlan) -> NlResult<()> {
        self.maybe_fail(
            "create_macvlan",
            format!(
                "create_macvlan {} master={} from={:?}",
                req.tmp_name, req.master_index, req.master_ns
            ),
        )?;
        if self.link(Ns::Pod, &req.tmp_name).is_some() {
            return Err(NlError::from_errno("create_macvlan", libc::EEXIST));
        }
        let master = self
            .links
            .get(&req.master_ns)
            .and_then(|v| v.iter().find(|l| l.state.index == req.master_index))
            .ok_or_else(|| NlError::from_errno("create_macvlan", libc::ENODEV))?;
        let mtu = req.mtu.unwrap_or(master.state.mtu);
        let index = self.alloc_index();
        let mac = req.mac.unwrap_or([0x0a, 0, 0, 0, 0, index as u8]);
        self.links.entry(Ns::Pod).or_default().push(FakeLink {
            state: LinkState {
                index,
                name: req.tmp_name.clone(),
                mtu,
                mac: Some(mac),
                kind: Some("macvlan".into()),
                macvlan_mode: Some(req.mode),
                up: false,
                alias: None,
                port_kind: None,
            },
            addrs: vec![],
        });
        Ok(())
    }

    fn rename_link(&mut self, ns: Ns, index: u32, name: &str, alias: &str) -> NlResult<()> {
        self.maybe_fail("rename_link", format!("rename_link {ns:?} {index} {name}"))?;
        if self.link(ns, name).is_some() {
            return Err(NlError::from_errno("rename_link", libc::EEXIST));
        }
        let link = self.link_mut(ns, index)?;
        link.state.name = name.into();
        link.state.alias = Some(alias.into());
        Ok(())
    }

    fn set_link_up(&mut self, ns: Ns, index: u32) -> NlResult<()> {
        self.maybe_fail("set_link_up", format!("set_link_up {ns:?} {index}"))?;
        self.link_mut(ns, index)?.state.up = true;
        Ok(())
    }

    fn set_link_mac(&mut self, ns: Ns, index: u32, mac: Mac) -> NlResult<()> {
        self.maybe_fail("set_link_mac", format!("set_link_mac {ns:?} {index}"))?;
        self.link_mut(ns, index)?.state.mac = Some(mac);
        Ok(())
    }

    fn delete_link(&mut self, ns: Ns, index: u32) -> NlResult<()> {
        self.maybe_fail("delete_link", format!("delete_link {ns:?} {index}"))?;
        let links = self.links.entry(ns).or_default();
        let before = links.len();
        links.retain(|l| l.state.index != index);
        if links.len() == before {
            return Err(NlError::from_errno("delete_link", libc::ENODEV));
        }
        if let Some(r) = self.routes.get_mut(&ns) {
            r.retain(|(route, _)| route.oif != index);
        }
        Ok(())
    }

    fn add_address(&mut self, ns: Ns, index: u32, addr: IpNet) -> NlResult<()> {
        self.maybe_fail("add_address", format!("add_address {ns:?} {index} {addr}"))?;
        let link = self.link_mut(ns, index)?;
        if link.addrs.contains(&addr) {
            return Err(NlError::from_errno("add_address", libc::EEXIST));
        }
        link.addrs.push(addr);
        Ok(())
    }

    fn addresses(&mut self, ns: Ns, index: u32) -> NlResult<Vec<AddrState>> {
        self.maybe_fail("addresses", format!("addresses {ns:?} {index}"))?;
        Ok(self
            .link_mut(ns, index)?
            .addrs
            .iter()
            .map(|a| AddrState {
                addr: *a,
                tentative: false,
                dad_failed: false,
            })
            .collect())
    }

    fn add_route(&mut self, ns: Ns, route: &NewRoute) -> NlResult<()> {
        let gw = route.gw.map(|g| format!(" via {g}")).unwrap_or_default();
        self.maybe_fail(
            "add_route",
            format!("add_route {ns:?} {}{gw} dev {}", route.dst, route.oif),
        )?;
        self.routes
            .entry(ns)
            .or_default()
            .push((route.clone(), route.table.unwrap_or(254)));
        Ok(())
    }

    fn routes(&mut self, ns: Ns) -> NlResult<Vec<RouteState>> {
        self.maybe_fail("routes", format!("routes {ns:?}"))?;
        Ok(self
            .routes
            .get(&ns)
            .map(|v| {
                v.iter()
                    .map(|(r, table)| RouteState {
                        dst: r.dst,
                        gw: r.gw,
                        oif: Some(r.oif),
                        table: *table,
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    fn read_sysctl(&mut self, ns: Ns, key: &str) -> NlResult<Option<String>> {
        self.maybe_fail("read_sysctl", format!("read_sysctl {ns:?} {key}"))?;
        Ok(self.sysctls.get(&(ns, key.to_string())).cloned())
    }

    fn write_sysctl(&mut self, ns: Ns, key: &str, value: &str) -> NlResult<()> {
        self.maybe_fail("write_sysctl", format!("write_sysctl {ns:?} {key}={value}"))?;
        self.sysctls
            .insert((ns, key.to_string()), value.to_string());
        Ok(())
    }

    fn probe_addresses(
        &mut self,
        index: u32,
        _ours: Mac,
        ips: &[std::net::IpAddr],
        spec: super::arp::ProbeSpec,
    ) -> NlResult<Option<(std::net::IpAddr, Mac)>> {
        let list: Vec<String> = ips.iter().map(ToString::to_string).collect();
        self.maybe_fail(
            "probe_addresses",
            format!("probe_addresses {index} {} x{}", list.join(","), spec.count),
        )?;
        let heard: Vec<Option<Mac>> = ips
            .iter()
            .map(|ip| match ip {
                std::net::IpAddr::V4(v4) => self.arp_owners.get(v4).copied(),
                std::net::IpAddr::V6(v6) => self.ndp_owners.get(v6).copied(),
            })
            .collect();
        Ok(super::conflict::first_conflict(ips, &heard))
    }

    fn arp_resolve(
        &mut self,
        index: u32,
        _ours: Mac,
        _our_ip: std::net::Ipv4Addr,
        target: std::net::Ipv4Addr,
        _spec: super::arp::ProbeSpec,
    ) -> NlResult<Option<Mac>> {
        self.maybe_fail("arp_resolve", format!("arp_resolve {index} {target}"))?;
        Ok(self.arp_owners.get(&target).copied())
    }

    fn ndp_resolve(
        &mut self,
        index: u32,
        _ours: Mac,
        target: std::net::Ipv6Addr,
        _spec: super::arp::ProbeSpec,
    ) -> NlResult<Option<Option<Mac>>> {
        self.maybe_fail("ndp_resolve", format!("ndp_resolve {index} {target}"))?;
        Ok(self.ndp_owners.get(&target).map(|m| Some(*m)))
    }

    fn arp_announce(&mut self, index: u32, _ours: Mac, ip: std::net::Ipv4Addr) -> NlResult<()> {
        self.maybe_fail("arp_announce", format!("arp_announce {index} {ip}"))
    }
}
