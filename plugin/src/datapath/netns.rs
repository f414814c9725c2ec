//! Network namespaces. `setns` moves only the calling thread, so every piece
//! of work that must happen inside the pod netns runs on one dedicated OS
//! thread (`NsWorker`) that entered it once; nothing async ever calls setns.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;

use nix::sched::{setns, CloneFlags};

/// Opening a netns path: gone is not the same as broken.
#[derive(Debug)]
pub enum OpenNetnsError {
    Gone,
    Other(io::Error),
}

/// Opens a netns path (a bind mount under /var/run/netns or /proc/PID/ns/net).
pub fn open_netns(path: &Path) -> Result<OwnedFd, OpenNetnsError> {
    match File::open(path) {
        Ok(f) => Ok(OwnedFd::from(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(OpenNetnsError::Gone),
        Err(e) => Err(OpenNetnsError::Other(e)),
    }
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A thread that lives in one netns and runs closures there.
pub struct NsWorker {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl NsWorker {
    /// Starts the thread and enters `fd`'s netns; fails if `fd` is not a
    /// network namespace.
    pub fn start(fd: &OwnedFd) -> io::Result<NsWorker> {
        let fd = fd.as_fd().try_clone_to_owned()?;
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        let thread = std::thread::Builder::new()
            .name("pod-netns".into())
            .spawn(move || {
                let entered = setns(&fd, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| io::Error::from_raw_os_error(e as i32));
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if !ok {
                    return;
                }
                for job in jobs_rx {
                    job();
                }
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(NsWorker {
                jobs: Some(jobs_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(io::Error::other(
                "netns worker thread died while entering the netns",
            )),
        }
    }

    /// Runs `f` inside the netns and waits for its answer.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let (tx, rx) = mpsc::channel();
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| io::Error::other("netns worker is stopped"))?;
        jobs.send(Box::new(move || {
            let _ = tx.send(f());
        }))
        .map_err(|_| io::Error::other("netns worker thread is gone"))?;
        rx.recv()
            .map_err(|_| io::Error::other("netns worker thread died running a job"))
    }
}

impl Drop for NsWorker {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads a sysctl in the calling thread's netns.
pub fn read_sysctl_here(key: &str) -> io::Result<Option<String>> {
    match std::fs::read_to_string(Path::new("/proc/sys").join(key)) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn write_sysctl_here(key: &str, value: &str) -> io::Result<()> {
    std::fs::write(Path::new("/proc/sys").join(key), value)
}

/// The raw fd, for the netlink attribute that names a target netns.
pub fn raw(fd: &OwnedFd) -> i32 {
    fd.as_raw_fd()
}
