use std::process::ExitCode;

use sticky_macvlan::cni::conf::sniff_version;
use sticky_macvlan::cni::skel::{fail, read_stdin, succeed};
use sticky_macvlan::cni::{CniEnv, CniVersion, Command};
use sticky_macvlan::{cli, commands};

const PROGRAM: &str = "sticky-macvlan";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("CNI_COMMAND").is_none() && !args.is_empty() {
        return cli::main(&args);
    }
    run_plugin()
}

fn run_plugin() -> ExitCode {
    let env = CniEnv::from_lookup(|k| std::env::var(k).ok());
    let wants_stdin = !matches!(env.as_ref().map(|e| e.command), Ok(Command::Version));
    let stdin = if wants_stdin {
        match read_stdin() {
            Ok(s) => s,
            Err(e) => return fail(PROGRAM, &e, CniVersion::LATEST),
        }
    } else {
        Vec::new()
    };
    let version = sniff_version(&stdin).unwrap_or(CniVersion::LATEST);
    let env = match env {
        Ok(env) => env,
        Err(e) => {
            if std::env::var_os("CNI_COMMAND").is_none() {
                eprintln!(
                    "{}\nrun `sticky-macvlan --help` for the operator commands",
                    cli::ABOUT
                );
            }
            return fail(PROGRAM, &e, version);
        }
    };
    match commands::run(&env, &stdin) {
        Ok(out) => succeed(PROGRAM, out.as_ref()),
        Err(e) => fail(PROGRAM, &e, version),
    }
}
