//! Logging to stderr (warnings and errors) and, when the config names one,
//! to a log file (at the configured level). Never to stdout: stdout carries
//! the CNI result.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{CniError, CniResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    pub fn parse(s: &str) -> CniResult<LogLevel> {
        Ok(match s {
            "error" => LogLevel::Error,
            "warn" | "warning" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            other => {
                return Err(CniError::invalid_config(format!(
                    "unknown logLevel {other:?}: use error, warn, info or debug"
                )))
            }
        })
    }
}

struct Sink {
    program: &'static str,
    file: Option<Mutex<File>>,
    file_level: LogLevel,
    context: String,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Sets up the file sink once per process. A log file that cannot be opened
/// is reported on stderr and otherwise ignored: logging must not fail an ADD.
pub fn init(program: &'static str, path: Option<&Path>, level: LogLevel, context: String) {
    let file = path.and_then(|p| {
        match OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(p)
        {
            Ok(f) => Some(Mutex::new(f)),
            Err(e) => {
                eprintln!(
                    "{program}: warning: cannot open log file {}: {e}",
                    p.display()
                );
                None
            }
        }
    });
    let _ = SINK.set(Sink {
        program,
        file,
        file_level: level,
        context,
    });
}

fn level_name(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
    }
}

pub fn log(level: LogLevel, msg: &str) {
    let sink = SINK.get();
    let context = sink.map(|s| s.context.as_str()).unwrap_or("");
    let program = sink.map(|s| s.program).unwrap_or("cni");
    if level <= LogLevel::Warn {
        eprintln!("{program}: {}: {context}{msg}", level_name(level));
    }
    if let Some(sink) = sink {
        if let (Some(file), true) = (&sink.file, level <= sink.file_level) {
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            if let Ok(mut f) = file.lock() {
                let _ = writeln!(f, "{ts:.3} {} {context}{msg}", level_name(level));
            }
        }
    }
}

pub fn warn(msg: &str) {
    log(LogLevel::Warn, msg)
}

pub fn info(msg: &str) {
    log(LogLevel::Info, msg)
}

pub fn debug(msg: &str) {
    log(LogLevel::Debug, msg)
}

pub fn error(msg: &str) {
    log(LogLevel::Error, msg)
}
