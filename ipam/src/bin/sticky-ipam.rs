//! The standalone CNI IPAM plugin: `"ipam": {"type": "sticky-ipam"}` behind
//! the reference macvlan/ipvlan. Without CNI_COMMAND and with arguments it
//! is the operator CLI.

use std::process::ExitCode;

use cni::conf::{gc_attachments, CommonConf};
use cni::skel::{fail, log_outcome, require_verb, start_log, succeed, Invocation};
use cni::{CniEnv, CniError, CniResult, CniVersion, Command};
use serde_json::Value;
use sticky_ipam::cli;
use sticky_ipam::cni_ipam::{Attachment, StickyIpam};

const PROGRAM: &str = "sticky-ipam";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("CNI_COMMAND").is_none() && !args.is_empty() {
        return cli::main(PROGRAM, &args);
    }
    let call = match Invocation::read() {
        Ok(call) => call,
        Err(e) => return fail(PROGRAM, &e, CniVersion::LATEST),
    };
    match call.env.and_then(|env| run(&env, &call.stdin)) {
        Ok(out) => succeed(PROGRAM, out.as_ref()),
        Err(e) => fail(PROGRAM, &e, call.version),
    }
}

fn run(env: &CniEnv, stdin: &[u8]) -> CniResult<Option<Value>> {
    if env.command == Command::Version {
        return Ok(Some(cni::version::version_info()));
    }
    let (conf, _) = CommonConf::parse(stdin, "the main plugin's type")?;
    start_log(PROGRAM, &conf, env);
    require_verb(env.command, conf.cni_version)?;
    let section = conf.ipam.as_ref().ok_or_else(|| {
        CniError::invalid_config(format!(
            "network {:?} has no ipam section: sticky-ipam is configured as \"ipam\": {{\"type\": \"sticky-ipam\", ...}}",
            conf.name
        ))
    })?;
    let attachment = Attachment::new(env, &conf);
    let mut ipam = StickyIpam::new(&conf.name, &section.raw, attachment)?;
    let result = match env.command {
        Command::Add => ipam
            .add()
            .and_then(|out| match out.to_json(conf.cni_version) {
                Ok(json) => Ok(Some(json)),
                // Nothing may stay claimed for an answer the caller never gets.
                Err(e) => Err(match ipam.undo_add() {
                    Ok(()) => e,
                    Err(undo) => e.context(format!("(and undoing the claim failed: {undo})")),
                }),
            }),
        Command::Del => ipam.del().map(|()| None),
        Command::Check => ipam.check().map(|()| None),
        Command::Status => ipam.status().map(|()| None),
        Command::Gc => ipam.gc(&gc_attachments(stdin)?).map(|()| None),
        Command::Version => Ok(Some(cni::version::version_info())),
    };
    log_outcome(env.command, &result);
    result
}
