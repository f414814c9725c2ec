//! The local real cluster of `scripts/cluster.sh` (kube-apiserver on etcd,
//! the controllers, the scheduler, kubelets with containerd, Multus), as
//! the tests see it: `kubectl` with the admin kubeconfig for everything
//! the API says, `scripts/cluster.sh` for what happens to a machine
//! (crash, restart, a cut management link), and the router netns for what
//! the fabric sees. The tests assert on what kubectl reads back (pods,
//! IPClaims, events) and on what the pods' own `ip` prints, never on the
//! plugin's view of itself.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod install;

/// Set to 1 by scripts/test.sh's cluster step.
pub const ENV: &str = "STICKY_E2E_CLUSTER";

/// One scenario at a time on the one cluster, whatever `--test-threads`
/// says: they crash and cut nodes.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub struct LocalCluster {
    _turn: std::sync::MutexGuard<'static, ()>,
    root: PathBuf,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
}

impl LocalCluster {
    /// The cluster `scripts/cluster.sh up` started, when `STICKY_E2E_CLUSTER=1`.
    /// Then, under `CI=true`, a missing cluster fails the test; elsewhere
    /// the test is skipped with a line saying how to run it.
    pub fn require(test: &str) -> Option<LocalCluster> {
        crate::require_root();
        if std::env::var(ENV).map_or(true, |v| v != "1") {
            // `cargo test --workspace` reaches these too; scripts/test.sh
            // runs them in its cluster step, after `scripts/cluster.sh up`,
            // with this set (and fails the run if the cluster does not come
            // up), so here they only say where they run.
            eprintln!("{test}: runs in scripts/test.sh's cluster step ({ENV}=1 with a cluster up)");
            return None;
        }
        let root = crate::repo_root();
        let kubeconfig = root.join(".cluster/admin.kubeconfig");
        let kubectl = root.join(".cluster/bin/kubectl");
        if !kubeconfig.exists() || !kubectl.exists() {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            assert!(
                !ci,
                "{test}: no local cluster (.cluster/admin.kubeconfig is missing): scripts/test.sh starts one with scripts/cluster.sh up; under CI=true this is a failure, not a skip"
            );
            eprintln!("{test}: skipped: no local cluster; run scripts/cluster.sh up first");
            return None;
        }
        let turn = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(LocalCluster {
            _turn: turn,
            root,
            kubeconfig,
            kubectl,
        })
    }

    fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        c
    }

    /// The admin kubeconfig (the CLI's `--kubeconfig` on the host).
    pub fn admin_kubeconfig(&self) -> &std::path::Path {
        &self.kubeconfig
    }

    /// The kubectl the harness runs (built from the pins), for a test that
    /// runs it with another kubeconfig.
    pub fn kubectl_binary(&self) -> &std::path::Path {
        &self.kubectl
    }

    /// kubectl ARGS: its stdout, or its stderr as the error.
    pub fn try_kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .kubectl_cmd(args)
            .output()
            .map_err(|e| format!("cannot run kubectl: {e}"))?;
        stdout_or_stderr(out)
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args)
            .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
    }

    /// kubectl ARGS -o json, parsed.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let text = self.kubectl(&a);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("kubectl {}: not JSON ({e}): {text}", args.join(" ")))
    }

    /// `kubectl apply -f -` with MANIFEST on stdin.
    pub fn apply(&self, manifest: &str) {
        use std::io::Write;
        let mut child = self
            .kubectl_cmd(&["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run kubectl apply: {e}"));
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(manifest.as_bytes())
                .unwrap_or_else(|e| panic!("kubectl apply: cannot write the manifest: {e}"));
        }
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("kubectl apply: {e}"));
        assert!(
            out.status.success(),
            "kubectl apply failed: {}\n{manifest}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A sample of examples/ (a NAD or a workload), as text.
    pub fn example(&self, name: &str) -> String {
        read_manifest(&self.examples_dir().join(name))
    }

    /// A file of deploy/ (the install set; `optional/...` for the reconcile
    /// Deployment), as text.
    pub fn deploy_file(&self, name: &str) -> String {
        read_manifest(&self.root.join("deploy").join(name))
    }

    /// scripts/cluster.sh ARGS (crash, restart, cut, heal).
    /// scripts/cluster.sh ARGS (crash, restart, cut, control, exec): its
    /// stdout; panics when it fails.
    pub fn script(&self, args: &[&str]) -> String {
        let out = crate::run(
            Command::new("bash")
                .arg(self.root.join("scripts/cluster.sh"))
                .args(args),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The same for cleanup on drop: a failure is reported, not raised.
    pub fn script_best_effort(&self, args: &[&str]) {
        let status = Command::new("bash")
            .arg(self.root.join("scripts/cluster.sh"))
            .args(args)
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("cleanup: scripts/cluster.sh {} failed", args.join(" "));
        }
    }

    /// NODE's disk (`.cluster/nodes/NODE/disk`), which its mount namespace
    /// binds over /etc/cni/net.d (`etc-cni-net.d`), /var/log (`var-log`),
    /// /var/lib/cni (`var-lib-cni`) and the rest.
    pub fn node_disk(&self, node: &str) -> PathBuf {
        self.root.join(".cluster/nodes").join(node).join("disk")
    }

    /// The pid of the process holding NODE's namespaces (for `nsenter -t`).
    pub fn node_pid(&self, node: &str) -> String {
        let file = self
            .root
            .join(".cluster/nodes")
            .join(node)
            .join("holder.pid");
        std::fs::read_to_string(&file)
            .map(|p| p.trim().to_string())
            .unwrap_or_else(|e| panic!("{node} is not running ({}: {e})", file.display()))
    }

    /// On every node, `NAME` next to the installer's kubeconfig in
    /// /etc/cni/net.d/sticky-macvlan.d: that kubeconfig passed through EDIT.
    pub fn write_node_kubeconfigs(&self, name: &str, edit: impl Fn(&str) -> String) {
        for node in self.nodes() {
            let dir = self.node_disk(&node).join("etc-cni-net.d/sticky-macvlan.d");
            let kc = std::fs::read_to_string(dir.join("sticky-macvlan.kubeconfig"))
                .unwrap_or_else(|e| panic!("{node}: the installer's kubeconfig: {e}"));
            std::fs::write(dir.join(name), edit(&kc))
                .unwrap_or_else(|e| panic!("{node}: write {name}: {e}"));
        }
    }

    /// Polls F every half second until it returns Some, or panics with
    /// WHAT and the last state after LIMIT.
    pub fn wait<T>(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut() -> Result<T, String>,
    ) -> T {
        let t0 = Instant::now();
        loop {
            match f() {
                Ok(v) => return v,
                Err(state) if t0.elapsed() >= limit => {
                    panic!("{what}: not within {limit:?}; last seen: {state}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// The pod, or None when the API has no such pod.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        let text = self
            .try_kubectl(&[
                "-n",
                ns,
                "get",
                "pod",
                name,
                "-o",
                "json",
                "--ignore-not-found",
            ])
            .ok()?;
        if text.trim().is_empty() {
            return None;
        }
        serde_json::from_str(&text).ok()
    }

    /// Waits until NS/NAME is Running and ready, and not on a node in
    /// NOT_ON; returns its node.
    pub fn wait_running(&self, ns: &str, name: &str, not_on: &[&str], limit: Duration) -> String {
        self.wait(&format!("pod {ns}/{name} Running"), limit, || {
            let pod = self.pod(ns, name).ok_or("no such pod")?;
            let node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_string();
            let phase = pod["status"]["phase"].as_str().unwrap_or("");
            let ready = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let deleting = !pod["metadata"]["deletionTimestamp"].is_null();
            if phase == "Running"
                && ready
                && !deleting
                && !node.is_empty()
                && !not_on.contains(&node.as_str())
            {
                Ok(node)
            } else {
                let events = self.pod_events(ns, name);
                let last = events
                    .iter()
                    .rev()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" | ");
                Err(format!(
                    "{phase} on {node:?} ready={ready} deleting={deleting}; latest events: {last}"
                ))
            }
        })
    }

    pub fn wait_gone(&self, ns: &str, name: &str, limit: Duration) {
        self.wait(&format!("pod {ns}/{name} gone"), limit, || {
            match self.pod(ns, name) {
                None => Ok(()),
                Some(p) => Err(format!("uid {}", p["metadata"]["uid"])),
            }
        })
    }

    /// `kubectl exec` in NS/POD.
    pub fn exec(&self, ns: &str, pod: &str, cmd: &[&str]) -> Result<String, String> {
        let mut a = vec!["-n", ns, "exec", pod, "--"];
        a.extend_from_slice(cmd);
        self.try_kubectl(&a)
    }

    /// The global addresses on the pod's IFNAME, as the pod's own `ip` prints them.
    pub fn pod_addrs(&self, ns: &str, pod: &str, ifname: &str) -> BTreeSet<IpAddr> {
        let out = self
            .exec(ns, pod, &["ip", "-o", "addr", "show", "dev", ifname])
            .unwrap_or_else(|e| panic!("ip addr in {ns}/{pod}: {e}"));
        parse_ip_o_addr(&out)
    }

    /// Every IPClaim, as the API has it.
    pub fn ipclaims(&self) -> Vec<Value> {
        self.json(&["get", "ipclaims.sticky-macvlan.io"])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The IPClaims of NETWORK that are Bound, as (ip, identity, holder
    /// pod "ns/name", node).
    pub fn bound_claims(&self, network: &str) -> Vec<BoundClaim> {
        self.ipclaims()
            .iter()
            .filter(|c| c["spec"]["network"] == network && c["status"]["phase"] == "Bound")
            .filter_map(|c| {
                Some(BoundClaim {
                    ip: c["spec"]["ip"].as_str()?.parse().ok()?,
                    identity: c["spec"]["identity"].as_str().unwrap_or("").to_string(),
                    pod: c["status"]["pod"].as_str().unwrap_or("").to_string(),
                    pod_uid: c["status"]["holder"]["podUID"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                    node: c["status"]["node"].as_str().unwrap_or("").to_string(),
                })
            })
            .collect()
    }

    /// Whether the router netns on the fabric gets an answer from ADDR.
    pub fn router_pings(&self, addr: IpAddr) -> bool {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                "smc-router",
                "ping",
                "-c1",
                "-W1",
                &addr.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A namespace for one test, deleted (with everything in it) on drop.
    pub fn namespace(&self, prefix: &str) -> TestNamespace<'_> {
        let name = format!("{prefix}-{}", std::process::id());
        self.kubectl(&["create", "namespace", &name]);
        TestNamespace {
            cluster: self,
            name,
        }
    }

    pub fn nodes(&self) -> Vec<String> {
        self.json(&["get", "nodes"])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    }

    /// Events about NS/POD, oldest first, as "Reason: message".
    pub fn pod_events(&self, ns: &str, pod: &str) -> Vec<String> {
        let sel = format!("involvedObject.name={pod}");
        self.json(&["-n", ns, "get", "events", "--field-selector", &sel])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                format!(
                    "{}: {}",
                    e["reason"].as_str().unwrap_or(""),
                    e["message"].as_str().unwrap_or("")
                )
            })
            .collect()
    }

    /// Deletes the IPClaims of namespace NS and then their addresses'
    /// IPLocks, as a release does (sticky claims outlive their pods, and a
    /// test or benchmark round cleans up after itself).
    pub fn release_claims_of_namespace(&self, ns: &str) {
        for claim in self.ipclaims() {
            if claim["spec"]["namespace"] != ns {
                continue;
            }
            if let Some(name) = claim["metadata"]["name"].as_str() {
                let _ = self.try_kubectl(&["delete", "ipclaim", name, "--wait=false"]);
            }
            let network = claim["spec"]["network"].as_str().unwrap_or_default();
            if let Ok(ip) = claim["spec"]["ip"].as_str().unwrap_or_default().parse() {
                let lock = sticky_ipam::kube::lock_name(network, ip);
                let _ = self.try_kubectl(&["delete", "iplock", &lock, "--wait=false"]);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundClaim {
    pub ip: IpAddr,
    pub identity: String,
    pub pod: String,
    pub pod_uid: String,
    pub node: String,
}

pub struct TestNamespace<'a> {
    cluster: &'a LocalCluster,
    pub name: String,
}

impl Drop for TestNamespace<'_> {
    fn drop(&mut self) {
        // Best effort: a failed test must still leave the cluster clean for
        // the next; the namespace's finalizer deletes its pods (and their
        // DELs release the dynamic claims).
        let _ = self
            .cluster
            .try_kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// The global addresses of `ip -o addr show` output.
pub fn parse_ip_o_addr(out: &str) -> BTreeSet<IpAddr> {
    out.lines()
        .filter(|l| l.contains(" scope global"))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet" || *w == "inet6")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

fn read_manifest(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// A finished command's stdout, or its stderr as the error.
fn stdout_or_stderr(out: std::process::Output) -> Result<String, String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ip_o_addr;

    #[test]
    fn reads_the_global_addresses_of_both_families() {
        let out = "3: net1    inet 172.31.62.10/24 brd 172.31.62.255 scope global net1\\       valid_lft forever\n\
                   3: net1    inet6 fd00:31:62::10/64 scope global \\       valid_lft forever\n\
                   3: net1    inet6 fe80::1/64 scope link \\       valid_lft forever\n";
        let got: Vec<String> = parse_ip_o_addr(out).iter().map(|a| a.to_string()).collect();
        assert_eq!(got, ["172.31.62.10", "fd00:31:62::10"]);
    }
}
