use std::process::ExitCode;

use sticky_macvlan::cni::skel::{fail, succeed, Invocation};
use sticky_macvlan::cni::CniVersion;
use sticky_macvlan::commands;
use sticky_macvlan::doctor_datapath::NodeDatapath;
use sticky_ops::dispatch::STICKY_MACVLAN;

const PROGRAM: &str = "sticky-macvlan";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // kubectl runs its plugins by name: `kubectl sticky` is this binary
    // installed (or linked) as kubectl-sticky.
    let invoked_as = std::env::args().next().unwrap_or_default();
    if std::path::Path::new(&invoked_as)
        .file_name()
        .is_some_and(|n| n == "kubectl-sticky")
    {
        return sticky_ops::kubectl::main(&args, &NodeDatapath);
    }
    if std::env::var_os("CNI_COMMAND").is_none() && !args.is_empty() {
        return sticky_ops::dispatch::main(&STICKY_MACVLAN, &NodeDatapath, &args);
    }
    run_plugin()
}

fn run_plugin() -> ExitCode {
    let call = match Invocation::read() {
        Ok(call) => call,
        Err(e) => return fail(PROGRAM, &e, CniVersion::LATEST),
    };
    let env = match call.env {
        Ok(env) => env,
        Err(e) => {
            if std::env::var_os("CNI_COMMAND").is_none() {
                eprintln!(
                    "{}\nrun `sticky-macvlan --help` for the operator commands",
                    STICKY_MACVLAN.about
                );
            }
            return fail(PROGRAM, &e, call.version);
        }
    };
    match commands::run(&env, &call.stdin) {
        Ok(out) => succeed(PROGRAM, out.as_ref()),
        Err(e) => fail(PROGRAM, &e, call.version),
    }
}
