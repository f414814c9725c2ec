//! What every CNI binary of ours does around its verbs: read stdin, answer
//! on stdout (the result or an error JSON), and refuse a verb the config's
//! version does not have.

use std::io::{Read, Write};
use std::process::ExitCode;

use crate::conf::{sniff_version, CommonConf};
use crate::env::{CniEnv, Command};
use crate::error::{code, CniError, CniResult};
use crate::version::CniVersion;

/// What a plugin process starts from: its environment (or why it is
/// unusable), the config bytes, and the version to answer errors in.
pub struct Invocation {
    pub env: CniResult<CniEnv>,
    pub stdin: Vec<u8>,
    pub version: CniVersion,
}

impl Invocation {
    /// Reads the CNI_* variables and, unless the verb is VERSION, stdin.
    pub fn read() -> Result<Invocation, CniError> {
        let env = CniEnv::from_lookup(|k| std::env::var(k).ok());
        let wants_stdin = !matches!(env.as_ref().map(|e| e.command), Ok(Command::Version));
        let stdin = if wants_stdin {
            read_stdin()?
        } else {
            Vec::new()
        };
        let version = sniff_version(&stdin).unwrap_or(CniVersion::LATEST);
        Ok(Invocation {
            env,
            stdin,
            version,
        })
    }
}

pub fn read_stdin() -> CniResult<Vec<u8>> {
    let mut stdin = Vec::new();
    std::io::stdin()
        .read_to_end(&mut stdin)
        .map_err(|e| CniError::io(format!("cannot read the network config from stdin: {e}")))?;
    Ok(stdin)
}

pub fn emit(value: &serde_json::Value) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Prints `err` as CNI error JSON in `version` and returns the exit code.
pub fn fail(program: &str, err: &CniError, version: CniVersion) -> ExitCode {
    if let Err(e) = emit(&err.to_json(version)) {
        eprintln!("{program}: {err} (and stdout failed: {e})");
    }
    ExitCode::from(1)
}

/// Prints a successful answer (if any).
pub fn succeed(program: &str, out: Option<&serde_json::Value>) -> ExitCode {
    match out.map(emit) {
        Some(Err(e)) => {
            eprintln!("{program}: cannot write the result to stdout: {e}");
            ExitCode::from(1)
        }
        _ => ExitCode::SUCCESS,
    }
}

/// Points the log at the config's `logFile`, every line tagged with the
/// attachment it is about.
pub fn start_log(program: &'static str, conf: &CommonConf, env: &CniEnv) {
    crate::log::init(
        program,
        conf.log_file.as_deref(),
        conf.log_level,
        format!(
            "net={} container={} ifname={} ",
            conf.name, env.container_id, env.ifname
        ),
    );
}

/// One line per invocation saying how the verb ended.
pub fn log_outcome<T>(command: Command, result: &CniResult<T>) {
    match result {
        Ok(_) => crate::log::info(&format!("{} ok", command.as_str())),
        Err(e) => crate::log::error(&format!("{} failed: {e}", command.as_str())),
    }
}

/// CHECK needs 0.4.0, STATUS and GC need 1.1.0.
pub fn require_verb(command: Command, version: CniVersion) -> CniResult<()> {
    let (allowed, needs) = match command {
        Command::Check => (version.allows_check(), "0.4.0"),
        Command::Status | Command::Gc => (version.allows_status_and_gc(), "1.1.0"),
        _ => return Ok(()),
    };
    if allowed {
        return Ok(());
    }
    Err(CniError::new(
        code::INCOMPATIBLE_VERSION,
        format!(
            "config version {version} does not allow {}: it needs cniVersion {needs} or later",
            command.as_str()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_refused_below_their_version() {
        let e = require_verb(Command::Check, CniVersion::V0_3_1).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.msg.contains("CHECK") && e.msg.contains("0.3.1"));
        assert!(require_verb(Command::Gc, CniVersion::V1_0_0).is_err());
        assert!(require_verb(Command::Status, CniVersion::V1_1_0).is_ok());
        assert!(require_verb(Command::Add, CniVersion::V0_1_0).is_ok());
    }
}
