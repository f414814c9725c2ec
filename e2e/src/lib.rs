//! End-to-end harness: real network namespaces (ARCHITECTURE.md, code map: e2e).
//!
//! A `Topology` owns a fabric netns (a Linux bridge as the physical switch),
//! node netns whose veth uplink into the fabric is the macvlan master, a
//! router netns on the fabric, and pod netns. Every name carries a prefix
//! unique to this process and topology; `Drop` deletes everything, also when
//! a test panics, and `sweep_stale` removes leftovers of dead test runs.
//! Veths are created inside the fabric netns with their peer born in the
//! node netns, so the host's own namespace is never touched.

pub mod cni;
pub mod kube_api;
pub mod local_cluster;
pub mod multus_overhead;
pub mod paths;
pub mod pod_start;
pub mod report;
pub mod requests;
pub mod runtime;
pub mod scenario;
pub mod state;
pub mod store;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub use cni::{CniCall, CniReply};
pub use paths::*;

/// All our namespaces start with this; the pid after it tells `sweep_stale`
/// whether the run that made them is still alive.
pub const NETNS_PREFIX: &str = "smvt-";
pub const SUBNET_PREFIX: &str = "10.213.0";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Fails loudly unless root: these tests need namespaces, and CI runs them
/// as root, so skipping would hide a broken run.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "e2e tests need root (network namespaces); run them with sudo or as root (CI=true never skips)");
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

pub fn ip(args: &[&str]) -> Output {
    run(Command::new("ip").args(args))
}

pub fn ip_ok(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The links in a netns, by name (peers' "@..." suffix dropped).
pub fn links_in(netns: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["-n", netns, "-o", "link", "show"])
        .output()
        .expect("ip link");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect()
}

/// Removes what test runs whose process is gone left behind: their
/// namespaces and their API servers.
pub fn sweep_stale() {
    let alive = |pid: u32| pid == 0 || PathBuf::from(format!("/proc/{pid}")).exists();
    for (name, pid) in our_netns() {
        if !alive(pid) {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
    for (server, pid) in api_servers() {
        if !alive(pid) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(server, libc::SIGKILL) };
        }
    }
    for (process, pid) in runtime::run_processes() {
        if !alive(pid) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(process, libc::SIGKILL) };
        }
    }
    runtime::sweep_leftovers(|pid| !alive(pid));
}

/// Removes everything of the run with this pid, for a run that cannot
/// unwind (the release profile aborts on panic, so no `Drop` runs): called
/// from the benchmark's panic hook.
pub fn remove_run(pid: u32) {
    for (server, owner) in api_servers() {
        if owner == pid {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(server, libc::SIGKILL) };
        }
    }
    for (process, owner) in runtime::run_processes() {
        if owner == pid {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(process, libc::SIGKILL) };
        }
    }
    runtime::sweep_leftovers(|owner| owner == pid);
    for (name, owner) in our_netns() {
        if owner == pid {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
    let ours = format!("{NETNS_PREFIX}{pid}-");
    if let Ok(dirs) = std::fs::read_dir(std::env::temp_dir()) {
        for d in dirs.filter_map(|e| e.ok()) {
            if d.file_name().to_string_lossy().starts_with(&ours) {
                let _ = std::fs::remove_dir_all(d.path());
            }
        }
    }
}

/// Our namespaces and the pid of the run that made each.
fn our_netns() -> Vec<(String, u32)> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return vec![];
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let name = line.split_whitespace().next()?;
            let pid = run_pid(name.strip_prefix(NETNS_PREFIX)?);
            Some((name.to_string(), pid))
        })
        .collect()
}

pub(crate) fn run_pid(after_prefix: &str) -> u32 {
    after_prefix
        .split('-')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// Running API servers of test runs (the real etcd and kube-apiserver, or
/// the stand-in) and the pid of the run that started each: every one of
/// them names a file under the run's state directory, which carries the
/// run's prefix.
fn api_servers() -> Vec<(libc::pid_t, u32)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    procs
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: libc::pid_t = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).to_string())
                .collect();
            let program = args.first()?;
            if !["kube-standin", "kube-apiserver", "etcd"]
                .iter()
                .any(|name| program.ends_with(name))
            {
                return None;
            }
            let owner = args.iter().skip(1).find_map(|arg| {
                arg.split(['/', '='])
                    .find_map(|part| part.strip_prefix(NETNS_PREFIX).map(run_pid))
            })?;
            Some((pid, owner))
        })
        .collect()
}

pub struct Node {
    pub netns: String,
    /// The macvlan master inside the node netns.
    pub uplink: String,
}

pub struct Pod {
    pub netns: String,
    pub path: String,
}

pub struct Topology {
    pub prefix: String,
    pub fabric: String,
    pub router: String,
    pub nodes: Vec<Node>,
    pub state_dir: PathBuf,
    namespaces: Vec<String>,
    links: u32,
    /// The management bridge's netns, once `start_api` made one.
    mgmt: Option<String>,
}

impl Topology {
    /// A fabric bridge, a router at .1 and `nodes` node netns.
    pub fn new(nodes: usize) -> Topology {
        require_root();
        sweep_stale();
        let prefix = format!(
            "{NETNS_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let state_dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&state_dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", state_dir.display()));
        let mut topo = Topology {
            fabric: format!("{prefix}-fabric"),
            router: format!("{prefix}-router"),
            prefix,
            nodes: vec![],
            state_dir,
            namespaces: vec![],
            links: 0,
            mgmt: None,
        };
        let fabric = topo.fabric.clone();
        topo.add_netns(&fabric);
        ip(&["-n", &fabric, "link", "add", "br0", "type", "bridge"]);
        // No STP forwarding delay: the "switch" forwards at once.
        ip(&[
            "-n",
            &fabric,
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "forward_delay",
            "0",
            "stp_state",
            "0",
        ]);
        ip(&["-n", &fabric, "link", "set", "br0", "up"]);
        let router = topo.router.clone();
        topo.add_netns(&router);
        topo.uplink(&router, "eth0");
        ip(&[
            "-n",
            &router,
            "addr",
            "add",
            &format!("{SUBNET_PREFIX}.1/24"),
            "dev",
            "eth0",
        ]);
        ip(&[
            "-n",
            &router,
            "addr",
            "add",
            "fd00:213::1/64",
            "dev",
            "eth0",
            "nodad",
        ]);
        for _ in 0..nodes {
            topo.add_node();
        }
        topo
    }

    pub(crate) fn add_netns(&mut self, name: &str) {
        ip(&["netns", "add", name]);
        self.namespaces.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"]);
    }

    /// A veth from `netns` (named `ifname` there) into the fabric bridge.
    pub fn uplink(&mut self, netns: &str, ifname: &str) {
        self.links += 1;
        let fab_end = format!("p{}", self.links);
        ip(&[
            "-n",
            &self.fabric,
            "link",
            "add",
            &fab_end,
            "type",
            "veth",
            "peer",
            "name",
            ifname,
            "netns",
            netns,
        ]);
        ip(&[
            "-n",
            &self.fabric,
            "link",
            "set",
            &fab_end,
            "master",
            "br0",
            "up",
        ]);
        ip(&["-n", netns, "link", "set", ifname, "up"]);
    }

    pub fn add_node(&mut self) -> usize {
        let netns = format!("{}-node{}", self.prefix, self.nodes.len() + 1);
        self.add_netns(&netns);
        self.uplink(&netns, "uplink0");
        let index = self.nodes.len();
        self.mgmt_link(&netns, &format!("192.168.254.{}/24", 10 + index));
        self.nodes.push(Node {
            netns,
            uplink: "uplink0".into(),
        });
        self.nodes.len() - 1
    }

    pub fn add_pod(&mut self, name: &str) -> Pod {
        let netns = format!("{}-{name}", self.prefix);
        self.add_netns(&netns);
        Pod {
            path: format!("/var/run/netns/{netns}"),
            netns,
        }
    }

    /// Deletes a netns: for a node, a crash (its uplink and every macvlan on
    /// it die with it).
    ///
    /// Its links go first, synchronously: the kernel tears a deleted netns
    /// down asynchronously, and until then its macvlans still answer ARP,
    /// which a crashed machine does not (and which the plugin's probe
    /// would rightly refuse to take over from).
    pub fn delete_netns(&mut self, name: &str) {
        for link in links_in(name).iter().filter(|l| l.as_str() != "lo") {
            let _ = Command::new("ip")
                .args(["-n", name, "link", "del", link])
                .output();
        }
        ip(&["netns", "del", name]);
        self.namespaces.retain(|n| n != name);
    }

    /// A node crash: its netns goes (uplink and every macvlan on it), and
    /// so do its pods' netns; no DEL is ever run.
    pub fn crash_node(&mut self, node: usize, pods: &[&Pod]) {
        let netns = self.nodes[node].netns.clone();
        self.delete_netns(&netns);
        for pod in pods {
            self.delete_netns(&pod.netns);
        }
    }

    /// Pings from `netns` up to `tries` times (a takeover may need the
    /// peer's neighbour entry to move first).
    pub fn ping_eventually(&self, netns: &str, target: &str, tries: u32) -> bool {
        (0..tries).any(|_| self.ping_from(netns, target))
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.state_dir.join(name)
    }

    pub fn ping_from(&self, netns: &str, target: &str) -> bool {
        Command::new("ip")
            .args(["netns", "exec", netns, "ping", "-c", "1", "-W", "2", target])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// Config builders shared by the tests and the benchmark.
pub mod configs {
    use serde_json::{json, Value};
    use std::path::Path;

    pub const OUR_TYPE: &str = "sticky-macvlan";
    pub const REF_TYPE: &str = "macvlan";

    pub fn macvlan(plugin_type: &str, version: &str, master: &str, ipam: Value) -> Value {
        json!({
            "cniVersion": version,
            "name": "macnet",
            "type": plugin_type,
            "master": master,
            "ipam": ipam,
        })
    }

    pub fn host_local(data_dir: &Path) -> Value {
        json!({
            "type": "host-local",
            "subnet": format!("{}.0/24", super::SUBNET_PREFIX),
            "rangeStart": format!("{}.10", super::SUBNET_PREFIX),
            "rangeEnd": format!("{}.200", super::SUBNET_PREFIX),
            "gateway": format!("{}.1", super::SUBNET_PREFIX),
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.214.0.0/16", "gw": format!("{}.254", super::SUBNET_PREFIX)}],
            "dataDir": data_dir,
        })
    }

    pub fn host_local_dual_stack(data_dir: &Path) -> Value {
        json!({
            "type": "host-local",
            "ranges": [
                [{"subnet": format!("{}.0/24", super::SUBNET_PREFIX), "rangeStart": format!("{}.10", super::SUBNET_PREFIX), "gateway": format!("{}.1", super::SUBNET_PREFIX)}],
                [{"subnet": "fd00:213::/64", "rangeStart": "fd00:213::10", "rangeEnd": "fd00:213::ff", "gateway": "fd00:213::1"}]
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            "dataDir": data_dir,
        })
    }

    pub fn static_ipam() -> Value {
        json!({
            "type": "static",
            "addresses": [{"address": format!("{}.50/24", super::SUBNET_PREFIX), "gateway": format!("{}.1", super::SUBNET_PREFIX)}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {"nameservers": ["10.213.0.53"], "search": ["svc.example"]},
        })
    }

    /// Copies `extra`'s keys over `target`'s (both JSON objects; anything
    /// else leaves `target` as it is).
    pub fn merge(target: &mut Value, extra: &Value) {
        if let (Some(t), Some(e)) = (target.as_object_mut(), extra.as_object()) {
            t.extend(e.clone());
        }
    }

    /// Our plugin with the in-process sticky IPAM; `extra` is merged into
    /// the ipam section.
    pub fn sticky(master: &str, store: &Path, extra: Value) -> Value {
        let mut ipam = json!({
            "type": "sticky-ipam",
            "subnet": format!("{}.0/24", super::SUBNET_PREFIX),
            "rangeStart": format!("{}.10", super::SUBNET_PREFIX),
            "rangeEnd": format!("{}.200", super::SUBNET_PREFIX),
            "gateway": format!("{}.1", super::SUBNET_PREFIX),
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": store,
        });
        merge(&mut ipam, &extra);
        macvlan(OUR_TYPE, "1.0.0", master, ipam)
    }

    /// IP files host-local holds in `dir` (empty when nothing is allocated).
    pub fn host_local_allocations(dir: &Path) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(dir.join("macnet")) else {
            return vec![];
        };
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
            .collect()
    }
}

/// Moves the calling thread into netns `name` (`/var/run/netns/<name>`);
/// threads it spawns later start there too.
pub fn enter_netns(name: &str) {
    use std::os::fd::AsRawFd;
    let path = format!("/var/run/netns/{name}");
    let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: setns on this thread with a valid netns fd.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns into {path} failed");
}
