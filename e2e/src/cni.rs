//! Running a CNI plugin binary inside a node netns, as a runtime would.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[derive(Debug, Clone)]
pub struct CniCall {
    pub plugin: PathBuf,
    /// Empty: run the plugin in the caller's own netns.
    pub node_netns: String,
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub cni_path: String,
    pub config: Value,
    /// Variables to leave out entirely (to test missing env).
    pub unset: Vec<&'static str>,
    /// Run under GNU time, which writes the plugin's peak RSS here.
    pub rss_file: Option<PathBuf>,
    /// A command the plugin runs under (a profiler, a tracer).
    pub wrapper: Vec<String>,
    /// Further variables, e.g. `STICKY_FAULT` for a crash point.
    pub extra_env: Vec<(String, String)>,
    /// Namespaces the plugin is started in, entered after the fork: a
    /// node's netns, a simulated node's mount namespace (its boot id).
    pub namespaces: Vec<(PathBuf, libc::c_int)>,
    /// SIGALRM after this many seconds (0: none), which ends a plugin
    /// that hangs: the kernel keeps the alarm across exec.
    pub alarm_secs: u32,
}

#[derive(Debug, Clone)]
pub struct CniReply {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    pub json: Option<Value>,
    pub elapsed: Duration,
    /// The plugin's peak resident set in KiB, when run `measured`.
    pub max_rss_kib: Option<u64>,
}

impl CniReply {
    /// The error code, if the plugin failed with a CNI error.
    pub fn code(&self) -> Option<u64> {
        if self.success {
            return None;
        }
        self.json
            .as_ref()
            .and_then(|j| j.get("code"))
            .and_then(Value::as_u64)
    }

    pub fn msg(&self) -> String {
        self.json
            .as_ref()
            .and_then(|j| j.get("msg"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    }

    /// Every address of a successful ADD, in CIDR form.
    #[track_caller]
    pub fn addresses(&self) -> Vec<String> {
        self.expect_ok()["ips"]
            .as_array()
            .map(|ips| {
                ips.iter()
                    .filter_map(|i| i["address"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The first address of a successful ADD, without its prefix length.
    #[track_caller]
    pub fn first_address(&self) -> String {
        self.expect_ok()["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .unwrap_or_default()
            .to_string()
    }

    /// A refusal: this code, and a message naming every one of `needles`;
    /// the message, for more checks.
    #[track_caller]
    pub fn expect_refused(&self, code: u64, needles: &[&str]) -> String {
        assert_eq!(
            self.code(),
            Some(code),
            "expected code {code}: stdout={} stderr={}",
            self.stdout,
            self.stderr
        );
        let msg = self.msg();
        for needle in needles {
            assert!(
                msg.contains(needle),
                "the refusal does not name {needle:?}: {msg}"
            );
        }
        msg
    }

    #[track_caller]
    pub fn expect_ok(&self) -> &Value {
        assert!(
            self.success,
            "plugin failed: stdout={} stderr={}",
            self.stdout, self.stderr
        );
        self.json.as_ref().unwrap_or(&Value::Null)
    }
}

impl CniCall {
    pub fn new(plugin: &Path, node_netns: &str, command: &str, config: Value) -> CniCall {
        CniCall {
            plugin: plugin.to_path_buf(),
            node_netns: node_netns.to_string(),
            command: command.to_string(),
            container_id: "ctr1".into(),
            netns: String::new(),
            ifname: "net1".into(),
            args: String::new(),
            cni_path: crate::reference_dir(),
            config,
            unset: vec![],
            rss_file: None,
            wrapper: vec![],
            extra_env: vec![],
            namespaces: vec![],
            alarm_secs: 0,
        }
    }

    /// Starts the plugin in the namespace the file `ns` names (a
    /// `/proc/PID/ns/mnt` or `/var/run/netns/NAME`) of this `kind`
    /// (`CLONE_NEWNS`, `CLONE_NEWNET`), entered in the child before exec.
    pub fn enter(mut self, ns: &Path, kind: libc::c_int) -> Self {
        self.namespaces.push((ns.to_path_buf(), kind));
        self
    }

    /// Ends the plugin with SIGALRM after `secs` seconds.
    pub fn alarm(mut self, secs: u32) -> Self {
        self.alarm_secs = secs;
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.extra_env.push((key.into(), value.into()));
        self
    }

    /// Runs the plugin under GNU time (`/usr/bin/time -f %M`), which forks
    /// it from its own small process: ru_maxrss taken straight from our
    /// fork would include this (much larger) process's pages.
    /// Runs the plugin as the last argument of this command line.
    pub fn wrapped(mut self, argv: &[&str]) -> Self {
        self.wrapper = argv.iter().map(|a| a.to_string()).collect();
        self
    }

    pub fn measured(mut self, rss_file: &Path) -> Self {
        self.rss_file = Some(rss_file.to_path_buf());
        self
    }

    pub fn container(mut self, id: &str) -> Self {
        self.container_id = id.into();
        self
    }

    pub fn netns(mut self, path: &str) -> Self {
        self.netns = path.into();
        self
    }

    pub fn ifname(mut self, name: &str) -> Self {
        self.ifname = name.into();
        self
    }

    pub fn args(mut self, args: &str) -> Self {
        self.args = args.into();
        self
    }

    pub fn cni_path(mut self, path: &str) -> Self {
        self.cni_path = path.into();
        self
    }

    pub fn command(mut self, command: &str) -> Self {
        self.command = command.into();
        self
    }

    pub fn without(mut self, var: &'static str) -> Self {
        self.unset.push(var);
        self
    }

    pub fn run(&self) -> CniReply {
        self.run_raw(self.config.to_string().as_bytes())
    }

    /// Starts the plugin with exactly these stdin bytes, as a runtime does.
    pub fn spawn(&self, stdin: &[u8]) -> Child {
        // An empty node_netns means the caller already entered it (the bench
        // does, so `ip netns exec` is not in its figures).
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if !self.node_netns.is_empty() {
            argv.extend(["ip", "netns", "exec", &self.node_netns].map(Into::into));
        }
        argv.extend(self.wrapper.iter().map(Into::into));
        if let Some(file) = &self.rss_file {
            argv.extend(["/usr/bin/time", "-f", "%M", "-o"].map(Into::into));
            argv.push(file.into());
        }
        argv.push(self.plugin.clone().into());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        for var in [
            "CNI_COMMAND",
            "CNI_CONTAINERID",
            "CNI_NETNS",
            "CNI_IFNAME",
            "CNI_ARGS",
            "CNI_PATH",
        ] {
            cmd.env_remove(var);
        }
        let vars = [
            ("CNI_COMMAND", &self.command),
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_ARGS", &self.args),
            ("CNI_PATH", &self.cni_path),
        ];
        for (k, v) in vars {
            if !self.unset.contains(&k) {
                cmd.env(k, v);
            }
        }
        cmd.env_remove("STICKY_FAULT");
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Opened here, held until the child runs: only their numbers cross
        // the fork.
        let files: Vec<(std::fs::File, libc::c_int)> = self
            .namespaces
            .iter()
            .map(|(path, kind)| {
                let f = std::fs::File::open(path)
                    .unwrap_or_else(|e| panic!("open namespace {}: {e}", path.display()));
                (f, *kind)
            })
            .collect();
        if !files.is_empty() || self.alarm_secs > 0 {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fds: Vec<(libc::c_int, libc::c_int)> =
                files.iter().map(|(f, k)| (f.as_raw_fd(), *k)).collect();
            let alarm = self.alarm_secs;
            // SAFETY: between fork and exec the closure calls only setns
            // and alarm, both async-signal-safe, on fds the parent keeps
            // open until spawn returns; it allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    for (fd, kind) in &fds {
                        if libc::setns(*fd, *kind) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    if alarm > 0 {
                        libc::alarm(alarm);
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.plugin.display()));
        drop(files);
        if let Some(mut pipe) = child.stdin.take() {
            // A plugin may exit before reading (e.g. on a bad env); ignore EPIPE.
            let _ = pipe.write_all(stdin);
        }
        child
    }

    /// Starts the call and kills it (SIGKILL) after `delay`; true when it
    /// was still running then.
    pub fn run_and_kill(&self, delay: Duration) -> bool {
        let mut child = self.spawn(self.config.to_string().as_bytes());
        std::thread::sleep(delay);
        let _ = child.kill();
        !child.wait().expect("wait for the plugin").success()
    }

    /// Runs with exactly these stdin bytes (for malformed configs).
    pub fn run_raw(&self, stdin: &[u8]) -> CniReply {
        let start = Instant::now();
        let child = self.spawn(stdin);
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("cannot wait for {}: {e}", self.plugin.display()));
        let elapsed = start.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let max_rss_kib = self.rss_file.as_ref().and_then(|f| {
            std::fs::read_to_string(f)
                .ok()?
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .next_back()
        });
        CniReply {
            success: out.status.success(),
            json: serde_json::from_str(stdout.trim()).ok(),
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).to_string(),
            elapsed,
            max_rss_kib,
        }
    }
}
