//! `sticky-macvlan install`: what the DaemonSet's container runs on every
//! node. It copies the binaries into the host's CNI bin directory and
//! writes a kubeconfig for the plugin (CNI plugins are exec'd by the
//! runtime on the host, outside any pod, so they have no in-cluster
//! credentials of their own). The token it writes is the service
//! account's, bound to the node (TokenRequest): one bound to this pod, as
//! its projected token is, would die with the pod, and every DaemonSet
//! rollout would leave the node unable to allocate until the new pod ran.
//! Where the API refuses that, it copies the pod's token and says what
//! that costs. With `--wait` it stays and renews the token at half its
//! life, or at once when the API server stops taking it (401): a
//! node-bound token names its Node's UID, so a Node object deleted and
//! registered again invalidates it long before it expires.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use sticky_ipam::kube::client::KubeClient;
use sticky_ipam::kube::ApiError;

use crate::admin::AdminApi;

pub const DESCRIPTION: &str = "\
Installs sticky-macvlan on this node (run by the DaemonSet of
deploy/40-daemonset.yaml): copies sticky-macvlan (and sticky-ipam when it
sits next to it) into the CNI bin directory, and writes
<conf dir>/sticky-macvlan.d/ with sticky-macvlan.kubeconfig, the service
account's token and CA, and the node name, for ipam.store.type
\"kubernetes\".";

pub const OPTIONS: &str =
    "  --cni-bin-dir DIR        where the binaries go (default /host/opt/cni/bin)
  --cni-conf-dir DIR       the host's CNI config dir as mounted here
                           (default /host/etc/cni/net.d)
  --host-cni-conf-dir DIR  the same directory as the host sees it, for the
                           paths inside the kubeconfig (default /etc/cni/net.d)
  --service-account DIR    token and ca.crt (default
                           /var/run/secrets/kubernetes.io/serviceaccount)
  --node-name NAME         this node's name (default: $NODE_NAME)
  --service-account-name NAME
                           the service account to ask a node-bound token of
                           (default: $SERVICE_ACCOUNT_NAME, else sticky-macvlan)
  --wait                   stay, renewing the token at half its life, or
                           at once when the API server rejects it (checked
                           every minute)
";

/// How long a node-bound token is asked for (the API server may cap it);
/// `--wait` renews it at half that.
const NODE_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

struct Opts {
    bin_dir: PathBuf,
    conf_dir: PathBuf,
    host_conf_dir: PathBuf,
    service_account: PathBuf,
    node_name: Option<String>,
    service_account_name: String,
    wait: bool,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        bin_dir: "/host/opt/cni/bin".into(),
        conf_dir: "/host/etc/cni/net.d".into(),
        host_conf_dir: "/etc/cni/net.d".into(),
        service_account: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
        node_name: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
        service_account_name: std::env::var("SERVICE_ACCOUNT_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "sticky-macvlan".into()),
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
            "--service-account-name" => o.service_account_name = v.clone(),
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

/// The token the plugin on this node uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credential {
    /// Bound to the node, issued and expiring at these Unix seconds.
    NodeBound { issued: i64, expiry: i64 },
    /// A copy of this pod's projected token (it dies with the pod).
    PodToken,
}

/// What the API server said of the installed token at the last check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenCheck {
    /// It answered a request made with the token.
    Accepted,
    /// 401: the token is no longer valid (its Node object was deleted and
    /// the node re-registered under a new UID, its service account was
    /// re-created, or it expired).
    Rejected,
    /// No answer, or any other error: nothing is known.
    Unknown,
}

/// Whether `--wait` should ask for a new token at `now`: a node-bound
/// one at half its life, or at once when the API server rejected it; a
/// pod token's copy every time (it rotates, and a node-bound token may
/// have become available).
fn renew_due(credential: Credential, now: i64, check: TokenCheck) -> bool {
    match credential {
        Credential::NodeBound { .. } if check == TokenCheck::Rejected => true,
        Credential::NodeBound { issued, expiry } => now >= issued + (expiry - issued) / 2,
        Credential::PodToken => true,
    }
}

/// Asks the API server who the plugin's installed token is (a
/// SelfSubjectReview, which any valid token may make): the plugin's own
/// requests would fail the same way.
fn check_token(o: &Opts, server: &str) -> TokenCheck {
    let own = kubeconfig(
        server,
        &o.service_account.join("ca.crt"),
        &o.conf_dir.join("sticky-macvlan.d").join("token"),
    );
    let answer = KubeClient::from_kubeconfig_text(&own, Duration::from_secs(10))
        .and_then(|client| client.who_am_i());
    match answer {
        Ok(_) => TokenCheck::Accepted,
        Err(ApiError::Unauthorized(why)) => {
            eprintln!(
                "sticky-macvlan install: the API server rejects the plugin's token ({why}): its Node object was re-created or it expired; writing a new one now"
            );
            TokenCheck::Rejected
        }
        Err(_) => TokenCheck::Unknown,
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The API server's address as this pod sees it.
fn server() -> Result<String, String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
        "KUBERNETES_SERVICE_HOST is not set: run install inside the DaemonSet pod (deploy/40-daemonset.yaml)".to_string()
    })?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
    Ok(if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    })
}

/// A token of the service account bound to this node, asked with this
/// pod's own credentials.
fn node_bound_token(o: &Opts, server: &str) -> Result<(String, i64), String> {
    let node = o
        .node_name
        .as_deref()
        .ok_or("no --node-name or NODE_NAME to bind it to")?;
    let namespace_file = o.service_account.join("namespace");
    let namespace = fs::read_to_string(&namespace_file)
        .map_err(|e| format!("cannot read {}: {e}", namespace_file.display()))?;
    let own = kubeconfig(
        server,
        &o.service_account.join("ca.crt"),
        &o.service_account.join("token"),
    );
    let client = KubeClient::from_kubeconfig_text(&own, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    client
        .node_bound_token(
            namespace.trim(),
            &o.service_account_name,
            node,
            NODE_TOKEN_LIFETIME,
        )
        .map_err(|e| e.to_string())
}

/// Writes the plugin's token: node-bound when the API grants one, else a
/// copy of this pod's.
fn write_token(o: &Opts, server: &str, quiet: bool) -> Result<Credential, String> {
    let path = o.conf_dir.join("sticky-macvlan.d").join("token");
    match node_bound_token(o, server) {
        Ok((token, expiry)) => {
            put(&path, token.as_bytes(), 0o600)?;
            if !quiet {
                println!(
                    "wrote a token bound to node {}, valid {} s",
                    o.node_name.as_deref().unwrap_or_default(),
                    expiry - now_unix()
                );
            }
            Ok(Credential::NodeBound {
                issued: now_unix(),
                expiry,
            })
        }
        Err(why) => {
            let fresh = read(&o.service_account.join("token"))?;
            if fs::read(&path).ok().as_deref() != Some(&fresh[..]) {
                put(&path, &fresh, 0o600)?;
                eprintln!(
                    "sticky-macvlan install: no node-bound token ({why}); copied this pod's token instead, which stops working when this pod is deleted: during a DaemonSet rollout this node cannot allocate until the new pod has run; grant `create serviceaccounts/token` (deploy/20-rbac.yaml, Role sticky-macvlan-installer) to fix"
                );
            }
            Ok(Credential::PodToken)
        }
    }
}

fn install(o: &Opts) -> Result<Credential, String> {
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
    let server = server()?;
    put(
        &dir.join("ca.crt"),
        &read(&o.service_account.join("ca.crt"))?,
        0o600,
    )?;
    let credential = write_token(o, &server, false)?;
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
    Ok(credential)
}

pub fn main(program: &str, args: &[String]) -> ExitCode {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{program} install: {e}; run `{program} install --help`");
            return ExitCode::from(2);
        }
    };
    let mut credential = match install(&o) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sticky-macvlan install: {e}");
            return ExitCode::from(1);
        }
    };
    if !o.wait {
        return ExitCode::SUCCESS;
    }
    loop {
        std::thread::sleep(Duration::from_secs(60));
        let check = match (credential, server()) {
            (Credential::NodeBound { .. }, Ok(s)) => check_token(&o, &s),
            _ => TokenCheck::Unknown,
        };
        if !renew_due(credential, now_unix(), check) {
            continue;
        }
        // A failed renewal keeps the token in place, valid for the other
        // half of its life; the next minute tries again.
        match server().and_then(|s| write_token(&o, &s, true)) {
            Ok(c) => credential = c,
            Err(e) => eprintln!("sticky-macvlan install: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{renew_due, Credential, TokenCheck};

    #[test]
    fn a_token_is_renewed_at_half_its_life_or_at_once_when_the_api_server_rejects_it() {
        use TokenCheck::*;
        let bound = Credential::NodeBound {
            issued: 1000,
            expiry: 1000 + 86400,
        };
        let cases = [
            // (now, check, due)
            (1000, Accepted, false),
            (1000, Unknown, false),
            (1000 + 43199, Accepted, false),
            (1000 + 43200, Accepted, true),
            (1000 + 90000, Unknown, true),
            // Its Node was re-created: the token is dead however young.
            (1000, Rejected, true),
            (1000 + 60, Rejected, true),
        ];
        for (now, check, due) in cases {
            assert_eq!(renew_due(bound, now, check), due, "{now} {check:?}");
        }
        for check in [Accepted, Rejected, Unknown] {
            assert!(renew_due(Credential::PodToken, 0, check));
        }
    }
}
