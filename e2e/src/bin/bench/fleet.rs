//! Simulated nodes for section 10: each has a name, a directory of its own
//! (our node-local record, or Whereabouts' flat configuration file), and
//! a boot id of its own, seen by its plugin processes only: a long-lived
//! holder process per node owns a mount namespace in which a file is bound
//! over `/proc/sys/kernel/random/boot_id`, and every plugin call of that
//! node enters it (and the node netns) between fork and exec. No kubelet:
//! the IPAM binary is exec'd as Multus execs a delegate's, CNI variables
//! and the network config on stdin, from a bounded pool of workers.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use sticky_e2e::{CniCall, Topology};

/// A plugin call still running after this long is ended by SIGALRM
/// (Whereabouts gives up on its own after 120 s, ours after its retries).
pub const CALL_ALARM_SECS: u32 = 180;

pub struct SimNode {
    pub name: String,
    pub dir: PathBuf,
    holder: Child,
    mount_ns: PathBuf,
}

/// The simulated nodes of one storm, all in one node netns of `topo`
/// (the one with the management link to its API server).
pub struct Fleet {
    pub nodes: Vec<SimNode>,
    netns: PathBuf,
}

/// Binds `file` over the boot id in a new mount namespace; the holder
/// (`tail --pid`) ends with the bench process even if it aborts.
fn hold_boot_id(file: &Path) -> Child {
    let script = r#"mount --bind "$0" /proc/sys/kernel/random/boot_id && echo ready && exec tail -f --pid="$1" /dev/null >/dev/null"#;
    let mut child = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
        ])
        .arg(file)
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("unshare for a node's boot id: {e}"));
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    if line.trim() != "ready" {
        let _ = child.kill();
        let out = child.wait_with_output().ok();
        panic!(
            "cannot bind a boot id over /proc/sys/kernel/random/boot_id: {}",
            out.map(|o| String::from_utf8_lossy(&o.stderr).to_string())
                .unwrap_or_default()
        );
    }
    child
}

impl Fleet {
    pub fn new(topo: &Topology, n: usize) -> Fleet {
        let nodes = (1..=n)
            .map(|k| {
                let name = node_name(k);
                let dir = topo.file(&format!("{name}-disk"));
                std::fs::create_dir_all(&dir)
                    .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
                let boot_id = format!("{:08x}-{:04x}-4000-8000-{:012x}", std::process::id(), k, k);
                let file = dir.join("boot_id");
                std::fs::write(&file, format!("{boot_id}\n")).expect("write a boot id");
                let holder = hold_boot_id(&file);
                let mount_ns = PathBuf::from(format!("/proc/{}/ns/mnt", holder.id()));
                let seen = std::fs::read_to_string(format!(
                    "/proc/{}/root/proc/sys/kernel/random/boot_id",
                    holder.id()
                ))
                .unwrap_or_default();
                assert_eq!(seen.trim(), boot_id, "{name}'s mount namespace");
                SimNode {
                    name,
                    dir,
                    holder,
                    mount_ns,
                }
            })
            .collect();
        Fleet {
            nodes,
            netns: PathBuf::from(format!("/var/run/netns/{}", topo.node(0).netns)),
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            let _ = n.holder.kill();
            let _ = n.holder.wait();
        }
    }
}

pub fn node_name(k: usize) -> String {
    format!("n{k}")
}

/// One plugin call of a simulated node.
pub struct Call {
    pub node: usize,
    pub verb: &'static str,
    pub cid: String,
    pub args: String,
}

/// What became of it.
pub struct Done {
    pub verb: &'static str,
    pub ok: bool,
    pub ms: f64,
    /// The address an ADD returned.
    pub ip: Option<String>,
    pub msg: String,
}

/// The outcome of a batch: every call made, how long the batch took, and
/// how many tasks were never started because `limit` had passed.
pub struct Batch {
    pub done: Vec<Done>,
    pub wall: Duration,
    pub skipped: usize,
}

/// Runs `tasks` (each a sequence of calls, in order) on `in_flight`
/// workers: at most that many plugin processes at once. No task starts
/// after `limit`.
pub fn run_bounded(
    fleet: &Fleet,
    plugin: &Path,
    conf_of: &(dyn Fn(usize) -> Value + Sync),
    tasks: &[Vec<Call>],
    in_flight: usize,
    limit: Duration,
) -> Batch {
    let next = AtomicUsize::new(0);
    let skipped = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..in_flight.min(tasks.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(task) = tasks.get(i) else {
                    return;
                };
                if start.elapsed() > limit {
                    skipped.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                for (j, call) in task.iter().enumerate() {
                    let node = &fleet.nodes[call.node];
                    let reply = CniCall::new(plugin, "", call.verb, conf_of(call.node))
                        .container(&call.cid)
                        .netns(&format!("/var/run/netns/none-{i}-{j}"))
                        .args(&call.args)
                        .enter(&fleet.netns, libc::CLONE_NEWNET)
                        .enter(&node.mount_ns, libc::CLONE_NEWNS)
                        .alarm(CALL_ALARM_SECS)
                        .run();
                    let ip = (reply.success && call.verb == "ADD")
                        .then(|| reply.first_address())
                        .filter(|a| !a.is_empty());
                    let msg = if reply.success {
                        String::new()
                    } else {
                        format!("{}{}", reply.stdout.trim(), reply.stderr.trim())
                    };
                    done.lock().unwrap_or_else(|p| p.into_inner()).push(Done {
                        verb: call.verb,
                        ok: reply.success,
                        ms: reply.elapsed.as_secs_f64() * 1e3,
                        ip,
                        msg,
                    });
                }
            });
        }
    });
    Batch {
        done: done.into_inner().unwrap_or_else(|p| p.into_inner()),
        wall: start.elapsed(),
        skipped: skipped.into_inner(),
    }
}
