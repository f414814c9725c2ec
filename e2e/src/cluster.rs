//! Running the kubernetes scenarios against a real cluster instead of the
//! stand-in, when `STICKY_E2E_KUBECONFIG` names a kubeconfig. The harness
//! talks to the cluster with the `kube` client from this process; the
//! plugins, which run inside node netns that have no route out, reach it
//! through a forwarder: the stand-in binary in `--forward-unix` mode
//! listens at the stand-in's address in the API netns and hands each
//! connection to a unix socket (a path, so it crosses netns), which this
//! process connects to the real API server. Nothing on the host's
//! interfaces or routes changes. TLS passes through end to end; the node
//! kubeconfig keeps the cluster's CA and sets `tls-server-name`.

use std::io::Read;
use std::net::TcpStream;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value;

pub const ENV: &str = "STICKY_E2E_KUBECONFIG";

pub struct RealCluster {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    /// host:port of the real API server.
    pub target: String,
    stop: Arc<AtomicBool>,
    socket: PathBuf,
}

/// The kubeconfig the scenarios should use, if any.
pub fn requested() -> Option<PathBuf> {
    std::env::var_os(ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn current_cluster(kc: &Value) -> Option<(usize, String)> {
    let context = kc["current-context"].as_str()?;
    let ctx = kc["contexts"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == context)?;
    let cluster = ctx["context"]["cluster"].as_str()?;
    let index = kc["clusters"]
        .as_array()?
        .iter()
        .position(|c| c["name"] == cluster)?;
    let server = kc["clusters"][index]["cluster"]["server"]
        .as_str()?
        .to_string();
    Some((index, server))
}

/// (scheme, host, port) of a server URL.
fn split_server(server: &str) -> Option<(String, String, u16)> {
    let (scheme, rest) = server.split_once("://")?;
    let authority = rest.split('/').next()?;
    let default = if scheme == "https" { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, p) = v6.split_once(']')?;
        (
            h.to_string(),
            p.strip_prefix(':')
                .map(|p| p.parse().ok())
                .unwrap_or(Some(default))?,
        )
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (authority.to_string(), default),
        }
    };
    Some((scheme.to_string(), host, port))
}

/// The user's kubeconfig as the node netns see it: the server is the
/// forwarder, TLS still names the real server, file paths are absolute.
pub fn node_kubeconfig(user: &Path, forwarder: &str) -> (Value, String) {
    let text = std::fs::read_to_string(user)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", user.display()));
    let mut kc: Value = serde_saphyr::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a kubeconfig: {e}", user.display()));
    let (index, server) = current_cluster(&kc).unwrap_or_else(|| {
        panic!(
            "{}: no current-context cluster with a server",
            user.display()
        )
    });
    let (scheme, host, port) =
        split_server(&server).unwrap_or_else(|| panic!("cannot parse server {server:?}"));
    let base = user.parent().unwrap_or(Path::new("/"));
    let absolute = |v: &mut Value| {
        if let Some(p) = v.as_str() {
            if !p.starts_with('/') {
                *v = Value::String(base.join(p).display().to_string());
            }
        }
    };
    if let Some(clusters) = kc["clusters"].as_array_mut() {
        for c in clusters {
            absolute(&mut c["cluster"]["certificate-authority"]);
        }
    }
    if let Some(users) = kc["users"].as_array_mut() {
        for u in users {
            for key in ["client-certificate", "client-key", "tokenFile"] {
                absolute(&mut u["user"][key]);
            }
        }
    }
    let cluster = &mut kc["clusters"][index]["cluster"];
    cluster["server"] = Value::String(format!("{scheme}://{forwarder}"));
    if scheme == "https" && cluster.get("tls-server-name").is_none() {
        cluster["tls-server-name"] = Value::String(host.clone());
    }
    (kc, format!("{host}:{port}"))
}

/// Copies one direction, then closes the other side's writing half so
/// the peer sees the end.
fn pipe(mut from: impl Read, mut to: impl std::io::Write, close: impl FnOnce()) {
    let _ = std::io::copy(&mut from, &mut to);
    close();
}

impl RealCluster {
    /// Connects to the cluster and serves `socket` for the forwarder.
    pub fn connect(user: &Path, socket: &Path, target: String) -> RealCluster {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let client = runtime.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(user).expect("read kubeconfig");
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .expect("kubeconfig");
            kube::Client::try_from(config).expect("kube client")
        });
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("bind the forward socket");
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, target2) = (stop.clone(), target.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(inbound) = conn else { continue };
                let target = target2.clone();
                // Connect off the accept loop, so a slow connect never
                // stalls accepting.
                std::thread::spawn(move || {
                    let outbound = match TcpStream::connect(&target) {
                        Ok(o) => o,
                        Err(e) => {
                            eprintln!("forwarder: cannot connect to {target}: {e}");
                            return;
                        }
                    };
                    let (Ok(in2), Ok(out2)) = (inbound.try_clone(), outbound.try_clone()) else {
                        return;
                    };
                    std::thread::spawn(move || {
                        let close = in2.try_clone();
                        pipe(out2, in2, move || {
                            if let Ok(i) = close {
                                let _ = i.shutdown(std::net::Shutdown::Write);
                            }
                        })
                    });
                    let close = outbound.try_clone();
                    pipe(inbound, outbound, move || {
                        if let Ok(o) = close {
                            let _ = o.shutdown(std::net::Shutdown::Write);
                        }
                    });
                });
            }
        });
        RealCluster {
            runtime,
            client,
            target,
            stop,
            socket: socket.to_path_buf(),
        }
    }

    /// One raw request; (HTTP status, JSON body).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", "application/json")
            .body(bytes)
            .expect("request");
        let client = self.client.clone();
        match self.runtime.block_on(client.request_text(req)) {
            Ok(text) => (
                if method == "POST" { 201 } else { 200 },
                serde_json::from_str(&text).unwrap_or(Value::Null),
            ),
            Err(kube::Error::Api(status)) => (
                status.code,
                serde_json::to_value(&*status).unwrap_or(Value::Null),
            ),
            Err(e) => panic!("{method} {path} on the real cluster: {e}"),
        }
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_split() {
        let cases = [
            ("https://10.0.0.1:6443", ("https", "10.0.0.1", 6443)),
            ("https://api.example.com", ("https", "api.example.com", 443)),
            ("http://127.0.0.1:8080/", ("http", "127.0.0.1", 8080)),
            ("https://[fd00::1]:6443", ("https", "fd00::1", 6443)),
        ];
        for (url, (s, h, p)) in cases {
            assert_eq!(split_server(url), Some((s.into(), h.into(), p)), "{url}");
        }
    }
}
