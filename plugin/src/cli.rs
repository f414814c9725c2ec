//! The operator CLI: the same binary run by a person (no CNI_COMMAND).

use std::io::Write;
use std::process::ExitCode;

use crate::cni::version::SUPPORTED_VERSIONS;

pub const ABOUT: &str = concat!(
    "sticky-macvlan ",
    env!("CARGO_PKG_VERSION"),
    ": CNI macvlan plugin with sticky, identity-keyed IPs"
);

fn usage() -> String {
    format!(
        "{ABOUT}

As a CNI plugin it is run by the container runtime with CNI_COMMAND set
(ADD, DEL, CHECK, STATUS, GC, VERSION) and the network config on stdin.
CNI protocol versions supported: {}

Usage: sticky-macvlan <command>

Commands:
  version     print the plugin version and supported CNI versions
  help        print this help
  install     install onto this node from the DaemonSet (see install --help)
  doctor      check this node and a network's config; every problem with its
              fix (see doctor --help)
  crd         print the IPClaim and IPLock CustomResourceDefinitions (YAML)

{}
Set CNI_COMMAND to run as a plugin, e.g.
  echo '{{\"cniVersion\":\"1.0.0\"}}' | CNI_COMMAND=VERSION sticky-macvlan
",
        SUPPORTED_VERSIONS.join(", "),
        format_args!(
            "{}{}",
            sticky_ipam::cli::COMMANDS_HELP,
            sticky_ipam::cli::STORE_OPTIONS
        )
    )
}

pub fn main(args: &[String]) -> ExitCode {
    match args.first().map(String::as_str) {
        None | Some("help" | "--help" | "-h") => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Some("version" | "--version" | "-V") => {
            println!("{ABOUT}");
            println!(
                "CNI protocol versions supported: {}",
                SUPPORTED_VERSIONS.join(", ")
            );
            ExitCode::SUCCESS
        }
        Some("install") => crate::install::main(&args[1..]),
        Some("doctor") => crate::doctor::main(&args[1..]),
        Some("crd") if args[1..].iter().any(|a| a == "--help" || a == "-h") => {
            println!("sticky-macvlan crd\n  Prints the IPClaim and IPLock CustomResourceDefinitions as YAML, for kubectl apply -f -.");
            ExitCode::SUCCESS
        }
        Some("crd") => match sticky_ipam::kube::crd::definitions()
            .iter()
            .map(serde_saphyr::to_string)
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(docs) => {
                print!("{}", docs.join("---\n"));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sticky-macvlan crd: {e}");
                ExitCode::from(1)
            }
        },
        Some(other) => {
            if let Some(code) = sticky_ipam::cli::run("sticky-macvlan", other, &args[1..]) {
                return code;
            }
            let _ = writeln!(
                std::io::stderr(),
                "sticky-macvlan: unknown command {other:?}; run `sticky-macvlan --help`"
            );
            ExitCode::from(2)
        }
    }
}
