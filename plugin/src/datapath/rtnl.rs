//! The real `Netlink`: rtnetlink on a current-thread tokio runtime. One
//! socket in the node netns (this process's), one opened inside the pod
//! netns on the `NsWorker` thread and then driven from here.

use std::net::IpAddr;
use std::os::fd::OwnedFd;

use futures_util::stream::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use netlink_packet_core::{NetlinkMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST};
use netlink_packet_route::link::{InfoMacVlan, LinkAttribute};
use netlink_packet_route::route::{
    RouteAttribute, RouteMetric, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::{Handle, LinkMacVlan, LinkUnspec, RouteMessageBuilder};
use tokio::runtime::Runtime;

use super::netns::{read_sysctl_here, write_sysctl_here, NsWorker};
use super::rtnl_decode::{addr_state, link_state, route_state, to_kernel_mode};
use super::Mac;
use super::{
    AddrState, LinkState, Netlink, NewMacvlan, NewRoute, NlError, NlResult, Ns, RouteState,
};

struct PodSide {
    fd: OwnedFd,
    worker: NsWorker,
    handle: Option<Handle>,
}

pub struct RtnlClient {
    rt: Runtime,
    node: Option<Handle>,
    pod: Option<PodSide>,
}

fn nl_err(op: &str, e: rtnetlink::Error) -> NlError {
    match e {
        rtnetlink::Error::NetlinkError(msg) => {
            let errno = msg.to_io().raw_os_error();
            match errno {
                Some(n) => NlError::from_errno(op, n),
                None => NlError::new(op, None, msg.to_string()),
            }
        }
        other => NlError::new(op, None, other.to_string()),
    }
}

fn io_err(op: &str, e: std::io::Error) -> NlError {
    match e.raw_os_error() {
        Some(n) => NlError::from_errno(op, n),
        None => NlError::new(op, None, e.to_string()),
    }
}

impl RtnlClient {
    /// One RTM_SETLINK, its failure named by `op`.
    fn set_link(
        &mut self,
        ns: Ns,
        msg: netlink_packet_route::link::LinkMessage,
        op: &str,
    ) -> NlResult<()> {
        let handle = self.handle(ns)?;
        self.rt.block_on(async {
            handle
                .link()
                .set(msg)
                .execute()
                .await
                .map_err(|e| nl_err(op, e))
        })
    }

    /// Runs `f` on the pod netns's worker thread (the only thread that
    /// entered it).
    fn on_pod_thread<T: Send + 'static>(
        &self,
        op: &str,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> NlResult<T> {
        let pod = self
            .pod
            .as_ref()
            .ok_or_else(|| NlError::new(op, None, "no pod netns was given"))?;
        pod.worker.run(f).and_then(|r| r).map_err(|e| io_err(op, e))
    }

    /// `pod_netns` is None for commands that never enter the pod (STATUS).
    pub fn new(pod_netns: Option<OwnedFd>) -> NlResult<RtnlClient> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|e| io_err("start the netlink runtime", e))?;
        let pod = match pod_netns {
            None => None,
            Some(fd) => {
                let worker = NsWorker::start(&fd).map_err(|e| io_err("enter the pod netns", e))?;
                Some(PodSide {
                    fd,
                    worker,
                    handle: None,
                })
            }
        };
        Ok(RtnlClient {
            rt,
            node: None,
            pod,
        })
    }

    fn handle(&mut self, ns: Ns) -> NlResult<Handle> {
        match ns {
            Ns::Node => {
                if let Some(h) = &self.node {
                    return Ok(h.clone());
                }
                let _guard = self.rt.enter();
                let (conn, handle, _) = rtnetlink::new_connection()
                    .map_err(|e| io_err("open a netlink socket in the node netns", e))?;
                self.rt.spawn(conn);
                self.node = Some(handle.clone());
                Ok(handle)
            }
            Ns::Pod => {
                let pod = self.pod.as_mut().ok_or_else(|| {
                    NlError::new("use the pod netns", None, "no pod netns was given")
                })?;
                if let Some(h) = &pod.handle {
                    return Ok(h.clone());
                }
                // The socket is bound to the netns it is created in; create
                // it on the worker thread, then drive it from this runtime.
                let rt = self.rt.handle().clone();
                let opened = pod
                    .worker
                    .run(move || {
                        let _guard = rt.enter();
                        rtnetlink::new_connection()
                    })
                    .map_err(|e| io_err("open a netlink socket in the pod netns", e))?;
                let (conn, handle, _) =
                    opened.map_err(|e| io_err("open a netlink socket in the pod netns", e))?;
                self.rt.spawn(conn);
                pod.handle = Some(handle.clone());
                Ok(handle)
            }
        }
    }

    fn pod_fd(&self) -> NlResult<i32> {
        self.pod
            .as_ref()
            .map(|p| super::netns::raw(&p.fd))
            .ok_or_else(|| NlError::new("use the pod netns", None, "no pod netns was given"))
    }

    fn request_ack(
        &mut self,
        ns: Ns,
        op: &str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> NlResult<()> {
        let mut handle = self.handle(ns)?;
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = flags;
        self.rt.block_on(async {
            let mut resp = handle.request(req).map_err(|e| nl_err(op, e))?;
            while let Some(m) = resp.next().await {
                if let netlink_packet_core::NetlinkPayload::Error(e) = m.payload {
                    return Err(nl_err(op, rtnetlink::Error::NetlinkError(e)));
                }
            }
            Ok(())
        })
    }
}

impl Netlink for RtnlClient {
    fn link_by_name(&mut self, ns: Ns, name: &str) -> NlResult<Option<LinkState>> {
        let handle = self.handle(ns)?;
        let op = format!("look up link {name:?} in the {ns}");
        self.rt.block_on(async {
            let mut links = handle.link().get().match_name(name.to_string()).execute();
            match links.try_next().await {
                Ok(Some(msg)) => Ok(Some(link_state(&msg))),
                Ok(None) => Ok(None),
                Err(e) => {
                    let e = nl_err(&op, e);
                    if e.is_no_device() {
                        Ok(None)
                    } else {
                        Err(e)
                    }
                }
            }
        })
    }

    fn links(&mut self, ns: Ns) -> NlResult<Vec<LinkState>> {
        let handle = self.handle(ns)?;
        let op = format!("list links in the {ns}");
        self.rt.block_on(async {
            let mut dump = handle.link().get().execute();
            let mut out = Vec::new();
            while let Some(msg) = dump.try_next().await.map_err(|e| nl_err(&op, e))? {
                out.push(link_state(&msg));
            }
            Ok(out)
        })
    }

    fn default_route_link(&mut self, ns: Ns) -> NlResult<Option<String>> {
        let handle = self.handle(ns)?;
        let op = format!("list routes in the {ns}");
        let index = self.rt.block_on(async {
            for family in [
                RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
                RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
            ] {
                let mut routes = handle.route().get(family).execute();
                while let Some(r) = routes.try_next().await.map_err(|e| nl_err(&op, e))? {
                    if r.header.destination_prefix_length != 0
                        || r.header.kind != RouteType::Unicast
                    {
                        continue;
                    }
                    if let Some(oif) = r.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Oif(i) => Some(*i),
                        _ => None,
                    }) {
                        return Ok(Some(oif));
                    }
                }
            }
            Ok::<_, NlError>(None)
        })?;
        let Some(index) = index else { return Ok(None) };
        let op = format!("look up link {index} in the {ns}");
        self.rt.block_on(async {
            let mut links = handle.link().get().match_index(index).execute();
            match links.try_next().await.map_err(|e| nl_err(&op, e))? {
                Some(msg) => Ok(Some(link_state(&msg).name)),
                None => Ok(None),
            }
        })
    }

    fn create_macvlan(&mut self, req: &NewMacvlan) -> NlResult<()> {
        let mut builder =
            LinkMacVlan::new(&req.tmp_name, req.master_index, to_kernel_mode(req.mode))
                // txqueuelen 0 like the reference: a macvlan queues on its master.
                .txqueuelen(0);
        if req.master_ns == Ns::Node {
            // Born directly in the pod netns: no move step, no name clash
            // with the node's own interfaces.
            builder = builder.setns_by_fd(self.pod_fd()?);
        }
        if let Some(mtu) = req.mtu {
            builder = builder.mtu(mtu);
        }
        if let Some(mac) = req.mac {
            builder = builder.address(mac.to_vec());
        }
        if let Some(q) = req.bc_queue_len {
            builder = builder.append_info_data(InfoMacVlan::BcQueueLen(q));
        }
        let msg = builder.build();
        let handle = self.handle(req.master_ns)?;
        let op = format!(
            "create macvlan {:?} on master index {}",
            req.tmp_name, req.master_index
        );
        self.rt.block_on(async {
            handle
                .link()
                .add(msg)
                .execute()
                .await
                .map_err(|e| nl_err(&op, e))
        })
    }

    fn rename_link(&mut self, ns: Ns, index: u32, name: &str, alias: &str) -> NlResult<()> {
        let mut msg = LinkUnspec::new_with_index(index)
            .name(name.to_string())
            .build();
        msg.attributes
            .push(LinkAttribute::IfAlias(alias.to_string()));
        self.set_link(
            ns,
            msg,
            &format!("rename link {index} to {name:?} in the {ns}"),
        )
    }

    fn set_link_up(&mut self, ns: Ns, index: u32) -> NlResult<()> {
        let msg = LinkUnspec::new_with_index(index).up().build();
        self.set_link(ns, msg, &format!("set link {index} up in the {ns}"))
    }

    fn set_link_mac(&mut self, ns: Ns, index: u32, mac: Mac) -> NlResult<()> {
        let msg = LinkUnspec::new_with_index(index)
            .address(mac.to_vec())
            .build();
        self.set_link(ns, msg, &format!("set the MAC of link {index} in the {ns}"))
    }

    fn delete_link(&mut self, ns: Ns, index: u32) -> NlResult<()> {
        let handle = self.handle(ns)?;
        let op = format!("delete link {index} in the {ns}");
        self.rt.block_on(async {
            handle
                .link()
                .del(index)
                .execute()
                .await
                .map_err(|e| nl_err(&op, e))
        })
    }

    fn add_address(&mut self, ns: Ns, index: u32, addr: IpNet) -> NlResult<()> {
        let handle = self.handle(ns)?;
        let op = format!("add address {addr} to link {index} in the {ns}");
        self.rt.block_on(async {
            handle
                .address()
                .add(index, addr.addr(), addr.prefix_len())
                .execute()
                .await
                .map_err(|e| nl_err(&op, e))
        })
    }

    fn addresses(&mut self, ns: Ns, index: u32) -> NlResult<Vec<AddrState>> {
        let handle = self.handle(ns)?;
        let op = format!("list addresses of link {index} in the {ns}");
        self.rt.block_on(async {
            let mut out = Vec::new();
            let mut addrs = handle
                .address()
                .get()
                .set_link_index_filter(index)
                .execute();
            while let Some(msg) = addrs.try_next().await.map_err(|e| nl_err(&op, e))? {
                if let Some(a) = addr_state(&msg) {
                    out.push(a);
                }
            }
            Ok(out)
        })
    }

    fn add_route(&mut self, ns: Ns, route: &NewRoute) -> NlResult<()> {
        let op = match route.gw {
            Some(gw) => format!(
                "add route {} via {gw} dev index {} in the {ns}",
                route.dst, route.oif
            ),
            None => format!(
                "add route {} dev index {} in the {ns}",
                route.dst, route.oif
            ),
        };
        let mut builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(route.dst.network(), route.dst.prefix_len())
            .map_err(|e| NlError::new(&op, None, e.to_string()))?
            .output_interface(route.oif)
            // Same protocol as the reference plugin's routes ("boot").
            .protocol(RouteProtocol::Boot);
        if let Some(gw) = route.gw {
            builder = builder
                .gateway(gw)
                .map_err(|e| NlError::new(&op, None, e.to_string()))?;
        }
        if let Some(p) = route.priority {
            builder = builder.priority(p);
        }
        if let Some(t) = route.table {
            builder = builder.table_id(t);
        }
        if let Some(s) = route.scope {
            builder = builder.scope(RouteScope::from(s));
        }
        let mut msg = builder.build();
        let mut metrics = Vec::new();
        if let Some(m) = route.mtu {
            metrics.push(RouteMetric::Mtu(m));
        }
        if let Some(m) = route.adv_mss {
            metrics.push(RouteMetric::Advmss(m));
        }
        if !metrics.is_empty() {
            msg.attributes.push(RouteAttribute::Metrics(metrics));
        }
        // CREATE without EXCL, like the reference: a second default route
        // via another gateway is added as a multipath entry, not refused.
        self.request_ack(
            ns,
            &op,
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        )
    }

    fn routes(&mut self, ns: Ns) -> NlResult<Vec<RouteState>> {
        let handle = self.handle(ns)?;
        let op = format!("list routes in the {ns}");
        self.rt.block_on(async {
            let mut out = Vec::new();
            for family in [
                RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
                RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
            ] {
                let mut routes = handle.route().get(family).execute();
                while let Some(r) = routes.try_next().await.map_err(|e| nl_err(&op, e))? {
                    if let Some(s) = route_state(&r) {
                        out.push(s);
                    }
                }
            }
            Ok(out)
        })
    }

    fn read_sysctl(&mut self, ns: Ns, key: &str) -> NlResult<Option<String>> {
        let op = format!("read sysctl {key} in the {ns}");
        match ns {
            Ns::Node => read_sysctl_here(key).map_err(|e| io_err(&op, e)),
            Ns::Pod => {
                let key = key.to_string();
                self.on_pod_thread(&op, move || read_sysctl_here(&key))
            }
        }
    }

    fn write_sysctl(&mut self, ns: Ns, key: &str, value: &str) -> NlResult<()> {
        let op = format!("set sysctl {key}={value} in the {ns}");
        match ns {
            Ns::Node => write_sysctl_here(key, value).map_err(|e| io_err(&op, e)),
            Ns::Pod => {
                let (key, value) = (key.to_string(), value.to_string());
                self.on_pod_thread(&op, move || write_sysctl_here(&key, &value))
            }
        }
    }

    fn probe_addresses(
        &mut self,
        index: u32,
        ours: Mac,
        ips: &[IpAddr],
        spec: super::arp::ProbeSpec,
    ) -> NlResult<Option<(IpAddr, Mac)>> {
        let list: Vec<String> = ips.iter().map(ToString::to_string).collect();
        let op = format!("probe {} on the wire in the pod netns", list.join(", "));
        let ips = ips.to_vec();
        self.on_pod_thread(&op, move || {
            use super::conflict::{first_conflict, probe_all_here, Until};
            let heard = probe_all_here(index, ours, &ips, spec, Until::FirstConflict)?;
            Ok(first_conflict(&ips, &heard))
        })
    }

    fn arp_resolve(
        &mut self,
        index: u32,
        ours: Mac,
        our_ip: std::net::Ipv4Addr,
        target: std::net::Ipv4Addr,
        spec: super::arp::ProbeSpec,
    ) -> NlResult<Option<Mac>> {
        let op = format!("resolve {target} by ARP in the pod netns");
        self.on_pod_thread(&op, move || {
            super::arp::resolve_here(index, ours, our_ip, target, spec)
        })
    }

    fn ndp_resolve(
        &mut self,
        index: u32,
        ours: Mac,
        target: std::net::Ipv6Addr,
        spec: super::arp::ProbeSpec,
    ) -> NlResult<Option<Option<Mac>>> {
        let op = format!("solicit {target} in the pod netns");
        self.on_pod_thread(&op, move || {
            super::ndp::resolve_here(index, ours, target, spec)
        })
    }

    fn arp_announce(&mut self, index: u32, ours: Mac, ip: std::net::Ipv4Addr) -> NlResult<()> {
        let op = format!("announce {ip} in the pod netns");
        self.on_pod_thread(&op, move || {
            super::arp::announce_here(index, ours, ip, ANNOUNCE_COUNT, ANNOUNCE_INTERVAL)
        })
    }
}

/// Two gratuitous ARPs (RFC 5227's ANNOUNCE_NUM), the second for a peer
/// that dropped the first. Nearly back to back, because ADD waits for them:
/// a frame lost to independent loss is as likely 2 ms later as 2 s later
/// (the probe schedule's measurement, BENCHMARKS.md section 9), and
/// the gap only keeps the two out of one transmit burst.
const ANNOUNCE_COUNT: u32 = 2;
const ANNOUNCE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(2);
