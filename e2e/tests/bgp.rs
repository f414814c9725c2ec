//! The workload this plugin exists for: a BGP speaker (`gobgpd`) in a pod
//! peers over its sticky IP with a router (`bird2`) whose config names that
//! IP. The node crashes, the identity comes up on another node with
//! `gobgpd` again, and the session is Established again with the router's
//! config untouched; the speaker's route is in bird's table both times.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sticky_e2e::{configs, our_plugin, CniCall, Pod, Topology, SUBNET_PREFIX};

const SPEAKER_AS: u32 = 64512;
const ROUTER_AS: u32 = 64500;
const ADVERTISED: &str = "10.100.0.0/24";

/// A daemon in a netns, killed (and reaped) when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn need(binary: &str, package: &str) {
    assert!(
        Command::new("sh")
            .args(["-c", &format!("command -v {binary}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false),
        "{binary} is missing: install the Debian package {package} (scripts/test.sh does)"
    );
}

fn start(netns: &str, args: &[&str], log: &Path) -> Daemon {
    let log = std::fs::File::create(log).expect("daemon log");
    Daemon(
        Command::new("ip")
            .args(["netns", "exec", netns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {args:?}: {e}")),
    )
}

fn bird_config(peer: &str) -> String {
    format!(
        "router id {SUBNET_PREFIX}.1;\n\
         protocol device {{ scan time 1; }}\n\
         protocol bgp speaker {{\n\
           local {SUBNET_PREFIX}.1 as {ROUTER_AS};\n\
           neighbor {peer} as {SPEAKER_AS};\n\
           hold time 6; keepalive time 2; connect retry time 1; connect delay time 1; error wait time 1, 2;\n\
           ipv4 {{ import all; export none; }};\n\
         }}\n"
    )
}

fn gobgp_config(ip: &str) -> String {
    format!(
        "[global.config]\n  as = {SPEAKER_AS}\n  router-id = \"{ip}\"\n  local-address-list = [\"{ip}\"]\n\n\
         [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{SUBNET_PREFIX}.1\"\n    peer-as = {ROUTER_AS}\n\
         \x20 [neighbors.timers.config]\n    connect-retry = 1\n    hold-time = 6\n    keepalive-interval = 2\n"
    )
}

fn birdc(router: &str, sock: &Path, cmd: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", router, "birdc", "-s"])
        .arg(sock)
        .args(cmd.split(' '))
        .output()
        .expect("birdc");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Polls bird until `ok(output of cmd)`, at most `bound`; the time it took.
fn wait_for(
    router: &str,
    sock: &Path,
    cmd: &str,
    bound: Duration,
    ok: impl Fn(&str) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let out = birdc(router, sock, cmd);
        if ok(&out) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < bound,
            "bird: `{cmd}` never satisfied within {bound:?}; last:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the speaker's route is in bird's table.
fn wait_for_route(router: &str, sock: &Path) {
    let prefix = ADVERTISED.split('/').next().unwrap_or_default();
    wait_for(
        router,
        sock,
        "show route protocol speaker",
        Duration::from_secs(15),
        |o| o.contains(prefix),
    );
}

fn established(out: &str) -> bool {
    out.lines()
        .any(|l| l.starts_with("speaker") && l.contains("Established"))
}

/// Runs gobgpd in the pod and advertises a route from it.
fn speaker(topo: &Topology, pod: &Pod, ip: &str, tag: &str) -> Daemon {
    let conf = topo.file(&format!("gobgpd-{tag}.toml"));
    std::fs::write(&conf, gobgp_config(ip)).expect("gobgpd config");
    let conf = conf.display().to_string();
    start(
        &pod.netns,
        &[
            "gobgpd",
            "-f",
            &conf,
            "-t",
            "toml",
            "--api-hosts",
            "127.0.0.1:50051",
            "-l",
            "warn",
        ],
        &topo.file(&format!("gobgpd-{tag}.log")),
    )
}

fn advertise(pod: &Pod) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ok = Command::new("ip")
            .args([
                "netns",
                "exec",
                &pod.netns,
                "gobgp",
                "-u",
                "127.0.0.1",
                "-p",
                "50051",
            ])
            .args(["global", "rib", "add", ADVERTISED, "-a", "ipv4"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "gobgp could not add {ADVERTISED}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bgp_session_survives_a_reschedule() {
    need("gobgpd", "gobgpd");
    need("bird", "bird2");
    let mut topo = Topology::new(2);
    let peer = format!("{SUBNET_PREFIX}.50");
    let conf = configs::sticky(
        "uplink0",
        &topo.file("store"),
        json!({"reservations": {"bgp-peer-a": peer}}),
    );
    let add = |topo: &Topology, node: usize, pod: &Pod, cid: &str| {
        let mut c = conf.clone();
        c["args"] = json!({"cni": {"identity": "bgp-peer-a"}});
        CniCall::new(&our_plugin(), &topo.node(node).netns, "ADD", c)
            .container(cid)
            .netns(&pod.path)
            .run()
    };

    let router = topo.router.clone();
    let bird_conf = topo.file("bird.conf");
    std::fs::write(&bird_conf, bird_config(&peer)).expect("bird config");
    let sock = topo.file("bird.ctl");
    let bird_conf_text = std::fs::read_to_string(&bird_conf).expect("read bird config");
    let _bird = start(
        &router,
        &[
            "bird",
            "-f",
            "-c",
            &bird_conf.display().to_string(),
            "-s",
            &sock.display().to_string(),
            "-P",
            &topo.file("bird.pid").display().to_string(),
        ],
        &topo.file("bird.log"),
    );

    // First life on node1.
    let pod1 = topo.add_pod("speaker-a");
    let r = add(&topo, 0, &pod1, "speaker-a");
    assert_eq!(r.first_address(), peer);
    let gobgp1 = speaker(&topo, &pod1, &peer, "a");
    let first = wait_for(
        &router,
        &sock,
        "show protocols",
        Duration::from_secs(30),
        established,
    );
    advertise(&pod1);
    wait_for_route(&router, &sock);

    // node1 crashes: the speaker dies with it, nobody runs DEL.
    drop(gobgp1);
    topo.crash_node(0, &[&pod1]);

    // The same identity on node2, gobgpd again; bird's config is untouched.
    let pod2 = topo.add_pod("speaker-b");
    let started = Instant::now();
    let r = add(&topo, 1, &pod2, "speaker-b");
    assert_eq!(r.first_address(), peer, "the speaker's IP moved with it");
    let add_took = started.elapsed();
    let _gobgp2 = speaker(&topo, &pod2, &peer, "b");
    wait_for(
        &router,
        &sock,
        "show protocols",
        Duration::from_secs(30),
        established,
    );
    let to_established = started.elapsed();
    advertise(&pod2);
    wait_for_route(&router, &sock);
    assert_eq!(
        std::fs::read_to_string(&bird_conf).expect("read bird config"),
        bird_conf_text,
        "the router's config changed"
    );
    eprintln!(
        "BGP: first session Established {first:?} after gobgpd started; after the reschedule, ADD took {add_took:?} and ADD to Established took {to_established:?}"
    );
}
