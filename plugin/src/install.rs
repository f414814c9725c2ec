//! `sticky-macvlan install`: what the DaemonSet's container runs on every
//! node. It copies the binaries into the host's CNI bin directory and
//! writes a kubeconfig for the plugin from the pod's service account (CNI
//! plugins are exec'd by the runtime on the host, outside any pod, so they
//! have no in-cluster credentials of their own). With `--wait` it stays
//! and refreshes the token copy, because projected service-account tokens
//! rotate.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

pub const HELP: &str = "\
Usage: sticky-macvlan install [options]

Installs sticky-macvlan on this node (run by the DaemonSet in examples/):
copies sticky-macvlan (and sticky-ipam when it sits next to it) into the
CNI bin directory, and writes <conf dir>/sticky-macvlan.d/ with
sticky-macvlan.kubeconfig, the service account's token and CA, and the node
name, for ipam.store.type \"kubernetes\".

Options:
  --cni-bin-dir DIR        where the binaries go (default /host/opt/cni/bin)
  --cni-conf-dir DIR       the host's CNI config dir as mounted here
                           (default /host/etc/cni/net.d)
  --host-cni-conf-dir DIR  the same directory as the host sees it, for the
                           paths inside the kubeconfig (default /etc/cni/net.d)
  --service-account DIR    token and ca.crt (default
                           /var/run/secrets/kubernetes.io/serviceaccount)
  --node-name NAME         this node's name (default: $NODE_NAME)
  --wait                   stay, refreshing the token every 60 seconds
";

struct Opts {
    bin_dir: PathBuf,
    conf_dir: PathBuf,
    host_conf_dir: PathBuf,
    service_account: PathBuf,
    node_name: Option<String>,
    wait: bool,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        bin_dir: "/host/opt/cni/bin".into(),
        conf_dir: "/host/etc/cni/net.d".into(),
        host_conf_dir: "/etc/cni/net.d".into(),
        service_account: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
        node_name: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
        wait: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--wait" {
            o.wait = true;
            continue;
        }
        let v = it
            .next()
            .ok_or_else(|| format!("option {a} needs a value"))?;
        match a.as_str() {
            "--cni-bin-dir" => o.bin_dir = v.into(),
            "--cni-conf-dir" => o.conf_dir = v.into(),
            "--host-cni-conf-dir" => o.host_conf_dir = v.into(),
            "--service-account" => o.service_account = v.into(),
            "--node-name" => o.node_name = Some(v.clone()),
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    Ok(o)
}

/// Write to a temp file in the same directory, then rename: the runtime
/// may exec the binary or read the kubeconfig at any moment.
fn put(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    fs::write(&tmp, bytes).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot chmod {}: {e}", tmp.display()))?;
    fs::rename(&tmp, path).map_err(|e| format!("cannot rename {} into place: {e}", path.display()))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn kubeconfig(server: &str, ca: &Path, token: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cluster\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: sticky-macvlan\n  user:\n    tokenFile: {}\ncontexts:\n- name: sticky-macvlan\n  context:\n    cluster: cluster\n    user: sticky-macvlan\ncurrent-context: sticky-macvlan\n",
        ca.display(),
        token.display()
    )
}

fn install(o: &Opts) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    fs::create_dir_all(&o.bin_dir)
        .map_err(|e| format!("cannot create {}: {e}", o.bin_dir.display()))?;
    put(&o.bin_dir.join("sticky-macvlan"), &read(&me)?, 0o755)?;
    if let Some(ipam) = me
        .parent()
        .map(|d| d.join("sticky-ipam"))
        .filter(|p| p.exists())
    {
        put(&o.bin_dir.join("sticky-ipam"), &read(&ipam)?, 0o755)?;
    }
    let dir = o.conf_dir.join("sticky-macvlan.d");
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))?;
    let host_dir = o.host_conf_dir.join("sticky-macvlan.d");
    let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
        "KUBERNETES_SERVICE_HOST is not set: run install inside the DaemonSet pod (examples/daemonset.yaml)".to_string()
    })?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
    let server = if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    };
    put(
        &dir.join("ca.crt"),
        &read(&o.service_account.join("ca.crt"))?,
        0o600,
    )?;
    put(
        &dir.join("token"),
        &read(&o.service_account.join("token"))?,
        0o600,
    )?;
    put(
        &dir.join("sticky-macvlan.kubeconfig"),
        kubeconfig(&server, &host_dir.join("ca.crt"), &host_dir.join("token")).as_bytes(),
        0o600,
    )?;
    match &o.node_name {
        Some(n) => put(&dir.join("nodename"), format!("{n}\n").as_bytes(), 0o644)?,
        None => eprintln!(
            "sticky-macvlan install: no --node-name or NODE_NAME: the plugin falls back to the hostname, which must then equal the node name"
        ),
    }
    println!(
        "installed sticky-macvlan into {} and its kubeconfig into {} (server {server})",
        o.bin_dir.display(),
        dir.display()
    );
    Ok(())
}

fn refresh_token(o: &Opts) -> Result<(), String> {
    let fresh = read(&o.service_account.join("token"))?;
    let copy = o.conf_dir.join("sticky-macvlan.d").join("token");
    if fs::read(&copy).ok().as_deref() != Some(&fresh[..]) {
        put(&copy, &fresh, 0o600)?;
        println!("refreshed the service account token");
    }
    Ok(())
}

pub fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sticky-macvlan install: {e}; run `sticky-macvlan install --help`");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = install(&o) {
        eprintln!("sticky-macvlan install: {e}");
        return ExitCode::from(1);
    }
    if !o.wait {
        return ExitCode::SUCCESS;
    }
    loop {
        std::thread::sleep(Duration::from_secs(60));
        if let Err(e) = refresh_token(&o) {
            eprintln!("sticky-macvlan install: {e}");
        }
    }
}
