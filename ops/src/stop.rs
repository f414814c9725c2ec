//! SIGTERM and SIGINT end `reconcile --interval` between sweeps. In a
//! container it runs as PID 1, to which the kernel delivers no signal whose
//! action is the default: without a handler a deleted reconcile pod would
//! sweep on until kubelet's SIGKILL, a grace period (30 s) later.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGTERM and SIGINT.
pub fn install() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Sleeps for `d`, or less when a stop is requested; returns whether one
/// was.
pub fn sleep_unless_stopped(d: Duration) -> bool {
    const SLICE: Duration = Duration::from_millis(100);
    let end = Instant::now() + d;
    while !requested() {
        let now = Instant::now();
        if now >= end {
            return false;
        }
        std::thread::sleep(SLICE.min(end - now));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requested_stop_cuts_the_sleep_short() {
        // One test owns the process-wide flag (a second one could race it).
        assert!(!sleep_unless_stopped(Duration::from_millis(10)));
        install();
        let t0 = Instant::now();
        // SAFETY: raise delivers SIGTERM to this thread, to the handler.
        unsafe {
            libc::raise(libc::SIGTERM);
        }
        assert!(requested());
        assert!(sleep_unless_stopped(Duration::from_secs(30)));
        assert!(t0.elapsed() < Duration::from_secs(30));
    }
}
