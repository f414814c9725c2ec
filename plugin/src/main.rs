use std::io::{Read, Write};
use std::process::ExitCode;

use sticky_macvlan::cni::{CniEnv, CniError, CniVersion, Command};
use sticky_macvlan::config::sniff_version;
use sticky_macvlan::{cli, commands};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("CNI_COMMAND").is_none() && !args.is_empty() {
        return cli::main(&args);
    }
    run_plugin()
}

fn run_plugin() -> ExitCode {
    let env = CniEnv::from_lookup(|k| std::env::var(k).ok());
    let mut stdin = Vec::new();
    let wants_stdin = !matches!(env.as_ref().map(|e| e.command), Ok(Command::Version));
    if wants_stdin {
        if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
            return fail(
                &CniError::io(format!("cannot read the network config from stdin: {e}")),
                CniVersion::LATEST,
            );
        }
    }
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
            return fail(&e, version);
        }
    };
    match commands::run(&env, &stdin) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(out)) => match emit(&out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sticky-macvlan: cannot write the result to stdout: {e}");
                ExitCode::from(1)
            }
        },
        Err(e) => fail(&e, version),
    }
}

fn emit(value: &serde_json::Value) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn fail(err: &CniError, version: CniVersion) -> ExitCode {
    if let Err(e) = emit(&err.to_json(version)) {
        eprintln!("sticky-macvlan: {err} (and stdout failed: {e})");
    }
    ExitCode::from(1)
}
