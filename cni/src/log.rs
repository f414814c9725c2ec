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
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let ts = rfc3339(now.as_secs(), now.subsec_millis());
            if let Ok(mut f) = file.lock() {
                let _ = writeln!(f, "{ts} {} {context}{msg}", level_name(level));
            }
        }
    }
}

/// "2026-12-03T07:21:59.123Z" for a time in seconds since the epoch (UTC,
/// the proleptic Gregorian calendar).
pub fn rfc3339(secs: u64, millis: u32) -> String {
    let (date, time) = civil(secs);
    format!("{date}T{time}.{millis:03}Z")
}

/// "2026-12-03T07:21:59Z": the same to the second, as Kubernetes writes
/// timestamps.
pub fn rfc3339_seconds(secs: u64) -> String {
    let (date, time) = civil(secs);
    format!("{date}T{time}Z")
}

/// ("YYYY-MM-DD", "hh:mm:ss") of a time in seconds since the epoch; days
/// to a date after Howard Hinnant's civil_from_days.
fn civil(secs: u64) -> (String, String) {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_282_519, 123), "2026-12-03T07:21:59.123Z");
        assert_eq!(rfc3339(4_102_444_799, 999), "2099-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_seconds(1_796_282_519), "2026-12-03T07:21:59Z");
    }
}
