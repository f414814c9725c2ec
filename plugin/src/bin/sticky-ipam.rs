//! The standalone CNI IPAM plugin: `"ipam": {"type": "sticky-ipam"}` behind
//! the reference macvlan/ipvlan. Without CNI_COMMAND and with arguments it
//! is the operator CLI. Addresses it cannot prove free are confirmed on the
//! wire from the interface the main plugin created (`standalone`).

use std::process::ExitCode;

use serde_json::Value;
use sticky_ipam::cni_ipam::{Attachment, StickyIpam};
use sticky_macvlan::cni::conf::{gc_attachments, CommonConf};
use sticky_macvlan::cni::skel::{fail, log_outcome, require_verb, start_log, succeed, Invocation};
use sticky_macvlan::cni::{self as cni, CniEnv, CniError, CniResult, CniVersion, Command};
use sticky_macvlan::doctor_datapath::NodeDatapath;
use sticky_macvlan::ipam_driver::{add_and_bind, Ipam};
use sticky_macvlan::netconf::ProbeConf;
use sticky_macvlan::standalone::confirm_on_wire;
use sticky_ops::dispatch::STICKY_IPAM;

const PROGRAM: &str = "sticky-ipam";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("CNI_COMMAND").is_none() && !args.is_empty() {
        return sticky_ops::dispatch::main(&STICKY_IPAM, &NodeDatapath, &args);
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
    let (conf, whole) = CommonConf::parse(stdin, "the main plugin's type")?;
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
    let probe = if env.command == Command::Add {
        ProbeConf::from_config(&whole)?
    } else {
        ProbeConf::default()
    };
    let result = match env.command {
        Command::Add => Ipam::prepare_add(&mut ipam).and_then(|prepared| {
            add_and_bind(&mut ipam, prepared, probe.fresh, |allocation| {
                confirm_on_wire(env, &probe, &allocation.unproven)?;
                allocation.result.to_json(conf.cni_version)
            })
            .map(Some)
        }),
        Command::Del => Ipam::del(&mut ipam).map(|()| None),
        Command::Check => Ipam::check(&mut ipam).map(|()| None),
        Command::Status => Ipam::status(&mut ipam).map(|()| None),
        Command::Gc => Ipam::gc(&mut ipam, &gc_attachments(stdin)?).map(|()| None),
        Command::Version => Ok(Some(cni::version::version_info())),
    };
    log_outcome(env.command, &result);
    result
}
