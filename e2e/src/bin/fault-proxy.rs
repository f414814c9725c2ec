//! A TCP proxy that misbehaves on purpose, put between the plugin and the
//! real kube-apiserver of the local cluster (`e2e/tests/real_cluster/`):
//! each new connection reads the mode from the `--mode-file` and is then
//! passed through, delayed, reset, or accepted and never answered. TLS
//! passes through untouched (the plugin still verifies the API server).
//!
//!   fault-proxy --listen ADDR:PORT --upstream ADDR:PORT --mode-file PATH
//!
//! Modes (the file's first word): `pass`, `delay MS` (the upstream
//! connection is made MS late), `reset` (the client's first bytes reach the
//! server, then both sides get a TCP reset: the request may or may not have
//! been acted on), `drop` (accepted, never answered, closed after 60 s).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Pass,
    Delay(u64),
    Reset,
    Drop,
}

fn parse_mode(text: &str) -> Mode {
    let mut words = text.split_whitespace();
    match (words.next(), words.next().and_then(|w| w.parse().ok())) {
        (Some("delay"), Some(ms)) => Mode::Delay(ms),
        (Some("reset"), _) => Mode::Reset,
        (Some("drop"), _) => Mode::Drop,
        _ => Mode::Pass,
    }
}

/// Closes with a TCP reset instead of a FIN (SO_LINGER with a zero timeout).
fn reset(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a correctly sized linger struct.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

fn serve(client: TcpStream, upstream: &str, mode: Mode) {
    match mode {
        Mode::Drop => {
            std::thread::sleep(Duration::from_secs(60));
        }
        Mode::Reset => {
            let Ok(mut server) = TcpStream::connect(upstream) else {
                return;
            };
            let mut buf = [0u8; 4096];
            let mut client = client;
            if let Ok(n) = client.read(&mut buf) {
                let _ = server.write_all(&buf[..n]);
            }
            reset(&client);
            reset(&server);
        }
        Mode::Pass | Mode::Delay(_) => {
            if let Mode::Delay(ms) = mode {
                std::thread::sleep(Duration::from_millis(ms));
            }
            let Ok(server) = TcpStream::connect(upstream) else {
                return;
            };
            let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                return;
            };
            std::thread::spawn(move || pipe(s2, c2));
            pipe(client, server);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some(listen), Some(upstream), Some(mode_file)) =
        (flag("--listen"), flag("--upstream"), flag("--mode-file"))
    else {
        eprintln!("usage: fault-proxy --listen ADDR:PORT --upstream ADDR:PORT --mode-file PATH");
        std::process::exit(2);
    };
    let listener = match TcpListener::bind(&listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fault-proxy: cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("fault-proxy: {listen} -> {upstream}, mode from {mode_file}");
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        let mode = parse_mode(&std::fs::read_to_string(&mode_file).unwrap_or_default());
        eprintln!("fault-proxy: connection in mode {mode:?}");
        let upstream = upstream.clone();
        std::thread::spawn(move || serve(client, &upstream, mode));
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_mode, Mode};

    #[test]
    fn reads_each_mode_and_defaults_to_pass() {
        for (text, want) in [
            ("pass\n", Mode::Pass),
            ("delay 2500\n", Mode::Delay(2500)),
            ("reset", Mode::Reset),
            ("drop", Mode::Drop),
            ("", Mode::Pass),
            ("delay soon", Mode::Pass),
        ] {
            assert_eq!(parse_mode(text), want, "{text:?}");
        }
    }
}
