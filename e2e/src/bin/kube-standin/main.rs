//! A stand-in for the Kubernetes API server, for the e2e tests: real HTTP/JSON for the real kube client, faithful on what
//! the kubernetes store relies on — 404/409 `Status` objects with
//! `reason`, create-if-absent (AlreadyExists), resourceVersion
//! preconditions on PUT and DELETE, label selectors, finalizers (so a
//! deleted pod can be left Terminating), and custom resources that exist
//! only once their CRD is created. It counts requests by verb and can
//! answer writes with 409s on purpose.
//!
//! It listens on `--listen ADDR` (inside the test's API netns) for the
//! plugins, and on the unix socket `--control PATH` for the test harness,
//! which also serves `/standin/stats`, `/standin/reset` and
//! `/standin/faults`.

use std::sync::{Arc, Mutex};

use tiny_http::{Header, Request, Response, Server};

mod http;
mod state;

use http::*;
use state::*;

fn serve(server: Arc<Server>, state: Arc<Mutex<State>>, control: bool) {
    loop {
        let Ok(mut req) = server.recv() else { return };
        let mut body = Vec::new();
        if req.as_reader().read_to_end(&mut body).is_err() {
            continue;
        }
        let start = std::time::Instant::now();
        let lock = || match state.lock() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        let fault = if control {
            None
        } else {
            lock().next_fault(req.method(), req.url())
        };
        if let Some(plan) = fault.as_ref().filter(|p| !p.after) {
            // Before handling: the request has no effect.
            if let FaultKind::Slow(ms) = plan.kind {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            } else {
                misbehave(req, plan.kind);
                continue;
            }
        }
        let reply = {
            let mut st = lock();
            let path = req.url().split('?').next().unwrap_or("").to_string();
            let ctl = if control {
                st.control(req.method(), &path, &body)
            } else {
                None
            };
            match ctl {
                Some(r) => r,
                None => st.handle(req.method(), req.url(), &body, !control),
            }
        };
        if std::env::var_os("STANDIN_TRACE").is_some() && !control {
            eprintln!(
                "{} {} -> {}{}",
                req.method(),
                req.url(),
                reply.code,
                if fault.is_some() { " (faulted)" } else { "" }
            );
        }
        match fault.filter(|p| p.after) {
            // After handling: the effect stands, the answer goes wrong.
            Some(FaultPlan {
                kind: FaultKind::Slow(ms),
                ..
            }) => {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                respond(req, reply);
            }
            Some(plan) => {
                misbehave(req, plan.kind);
                continue;
            }
            None => respond(req, reply),
        }
        if !control {
            // The server's own share of a request's latency, so a benchmark
            // can tell the plugin's cost from this stand-in's.
            let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            let mut st = match state.lock() {
                Ok(st) => st,
                Err(poisoned) => poisoned.into_inner(),
            };
            *st.counts.entry(SERVER_MICROS.into()).or_default() += micros;
        }
    }
}

/// The stats key carrying the time spent serving requests (not a count).
const SERVER_MICROS: &str = "server busy us";

/// A 500, or a connection that ends in the middle of the answer.
fn misbehave(req: Request, kind: FaultKind) {
    if kind == FaultKind::Drop {
        let mut w = req.into_writer();
        let _ = w.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\nConnection: close\r\n\r\n{\"kind\":",
        );
        let _ = w.flush();
        return;
    }
    respond(
        req,
        status(500, "InternalError", "injected by the stand-in".into()),
    );
}

fn respond(req: Request, reply: Reply) {
    let body = serde_json::to_vec(&reply.body).unwrap_or_default();
    let mut resp = Response::from_data(body).with_status_code(reply.code);
    if let Ok(h) = Header::from_bytes("Content-Type", "application/json") {
        resp.add_header(h);
    }
    let _ = req.respond(resp);
}

/// A listener whose connections have TCP_NODELAY (Linux hands it on to
/// accepted sockets), as Go's net/http and so kube-apiserver have: without
/// it, Nagle and delayed ACKs add 40 ms to every answer written in two parts.
fn listen_nodelay(addr: &str) -> Result<Server, Box<dyn std::error::Error + Send + Sync>> {
    use std::os::fd::AsRawFd;
    let listener = std::net::TcpListener::bind(addr)?;
    let one: libc::c_int = 1;
    // SAFETY: a valid socket fd and a c_int option value of the right size.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            std::ptr::addr_of!(one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Server::from_listener(listener, None)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some(listen), Some(control)) = (flag("--listen"), flag("--control")) else {
        eprintln!("usage: kube-standin --listen ADDR:PORT --control SOCKET");
        std::process::exit(2);
    };
    let _ = std::fs::remove_file(&control);
    let api = match listen_nodelay(&listen) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("kube-standin: cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    let ctl = match Server::http_unix(std::path::Path::new(&control)) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("kube-standin: cannot listen on {control}: {e}");
            std::process::exit(1);
        }
    };
    let state = Arc::new(Mutex::new(State::default()));
    let mut workers = Vec::new();
    for i in 0..8 {
        let (server, st, is_ctl) = if i < 6 {
            (api.clone(), state.clone(), false)
        } else {
            (ctl.clone(), state.clone(), true)
        };
        workers.push(std::thread::spawn(move || serve(server, st, is_ctl)));
    }
    eprintln!("kube-standin: serving on {listen} and {control}");
    for w in workers {
        let _ = w.join();
    }
}
