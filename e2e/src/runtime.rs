//! A real container runtime on a test node: containerd (Debian's) with its
//! CRI plugin and runc, started inside the node's netns with its own root,
//! state, socket and cgroup parent, driven with crictl (built by
//! scripts/tools.sh). Pod sandboxes here use the node's network, so no CNI
//! is involved: the tests need a runtime that knows which sandboxes exist.
//!
//! Dropping it removes every sandbox, stops containerd and its shims,
//! unmounts what they mounted and removes the cgroups, also after a panic.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::{target_dir, Topology, NETNS_PREFIX};

static SEQ: AtomicU32 = AtomicU32::new(0);

pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    cgroup_parent: String,
    child: Child,
}

/// Where scripts/tools.sh puts what it builds: target/tools.
pub fn tools_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("STICKY_TOOLS_DIR") {
        return PathBuf::from(dir);
    }
    let profile = target_dir();
    profile.parent().unwrap_or(&profile).join("tools")
}

fn tool(name: &str) -> PathBuf {
    let p = tools_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/tools.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

impl Containerd {
    /// Starts containerd in node `node`'s netns and imports the pause image.
    pub fn start(topo: &Topology, node: usize) -> Containerd {
        crate::require_root();
        let name = format!(
            "{NETNS_PREFIX}{}-ctr{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let dir = topo.file(&name);
        for sub in ["root", "state", "cni-bin", "cni-conf", "logs"] {
            std::fs::create_dir_all(dir.join(sub)).expect("containerd directories");
        }
        let socket = dir.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:3.10"
  # These machines lack CAP_SYS_RESOURCE: a negative oom_score_adj fails.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni-bin"
    conf_dir = "{d}/cni-conf"
"#,
            d = dir.display()
        );
        std::fs::write(dir.join("config.toml"), config).expect("containerd config");
        let log = std::fs::File::create(dir.join("containerd.log")).expect("containerd log");
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", topo.node(node).netns))
            .arg("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start containerd (Debian package containerd)");
        let c = Containerd {
            socket,
            cgroup_parent: format!("/{name}"),
            dir,
            child,
        };
        c.wait_ready();
        let import = Command::new("ctr")
            .arg("--address")
            .arg(&c.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tools_dir().join("images").join("pause.tar"))
            .output()
            .expect("ctr images import");
        assert!(
            import.status.success(),
            "import the pause image: {}",
            String::from_utf8_lossy(&import.stderr)
        );
        c
    }

    fn wait_ready(&self) {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if self.crictl(&["version"]).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "containerd did not answer on {} within 30 s: {}",
            self.socket.display(),
            std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
        );
    }

    pub fn crictl(&self, args: &[&str]) -> std::process::Output {
        self.try_crictl(&tool("crictl"), args).expect("run crictl")
    }

    fn try_crictl(&self, crictl: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
        Command::new(crictl)
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", self.socket.display()))
            .args(["--timeout", "30s"])
            .args(args)
            .output()
    }

    /// Runs a pod sandbox (node network) as kubelet would; its ID.
    pub fn run_sandbox(&self, namespace: &str, name: &str, uid: &str) -> String {
        let config = serde_json::json!({
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "attempt": 0},
            "linux": {
                "cgroup_parent": self.cgroup_parent,
                // NODE: the sandbox shares the node's netns, so no CNI runs.
                "security_context": {"namespace_options": {"network": 2}}
            },
            "log_directory": self.dir.join("logs"),
        });
        let file = self.dir.join(format!("{name}.json"));
        std::fs::write(&file, config.to_string()).expect("sandbox config");
        let out = self.crictl(&["runp", &file.to_string_lossy()]);
        assert!(
            out.status.success(),
            "crictl runp: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Stops and removes a sandbox, as kubelet does when a pod goes.
    pub fn remove_sandbox(&self, id: &str) {
        let out = self.crictl(&["rmp", "-f", id]);
        assert!(
            out.status.success(),
            "crictl rmp: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Processes whose command line mentions `needle` (the shims name the
/// containerd socket they serve).
fn processes_mentioning(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// Removes a cgroup tree bottom-up in every hierarchy mounted under
/// /sys/fs/cgroup (cgroup v1 here: one per controller).
fn remove_cgroups(parent: &str) {
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let root = hierarchy.path().join(parent.trim_start_matches('/'));
        remove_tree(&root);
    }
}

/// Kills what is left in a cgroup tree (a sandbox whose shim died before
/// it), then removes the tree's directories, retrying while the kernel
/// finishes the kills.
fn remove_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path());
        }
    }
    for _ in 0..50 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) on a pid listed in our own cgroup.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// containerd and shim processes of test runs, with the pid of the run
/// (their command lines name the run's directory under the temp dir).
pub fn run_processes() -> Vec<(i32, u32)> {
    let marker = format!("{}/{NETNS_PREFIX}", std::env::temp_dir().display());
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(
            &std::fs::read(entry.path().join("cmdline")).unwrap_or_default(),
        )
        .to_string();
        let first = cmdline.split('\0').next().unwrap_or_default();
        if !first.contains("containerd") {
            continue;
        }
        if let Some(at) = cmdline.find(&marker) {
            out.push((pid, crate::run_pid(&cmdline[at + marker.len()..])));
        }
    }
    out
}

/// Mounts and cgroups that runtimes of runs `gone(pid)` left behind.
pub fn sweep_leftovers(gone: impl Fn(u32) -> bool) {
    let marker = format!("{}/{NETNS_PREFIX}", std::env::temp_dir().display());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut stale: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| {
            m.strip_prefix(&marker)
                .is_some_and(|rest| gone(crate::run_pid(rest)))
        })
        .collect();
    stale.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in stale {
        let _ = Command::new("umount").args(["-l", m]).output();
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for hierarchy in hierarchies.flatten() {
        for group in std::fs::read_dir(hierarchy.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = group.file_name().to_string_lossy().to_string();
            if name
                .strip_prefix(NETNS_PREFIX)
                .is_some_and(|rest| gone(crate::run_pid(rest)))
            {
                remove_tree(&group.path());
            }
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Never panic here: a panicking test is already unwinding.
        if let Ok(crictl) = std::fs::canonicalize(tools_dir().join("crictl")) {
            let _ = self.try_crictl(&crictl, &["rmp", "-f", "-a"]);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = self.dir.to_string_lossy().to_string();
        for pid in processes_mentioning(&dir) {
            // SAFETY: kill(2) on a pid we found; a stale pid is harmless.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        // Mounts under our directories (shm, rootfs), deepest first.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&dir))
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in ours {
            let _ = Command::new("umount").args(["-l", m]).output();
        }
        remove_cgroups(&self.cgroup_parent);
    }
}
