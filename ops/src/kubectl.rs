//! `kubectl sticky ...`: the binary run as `kubectl-sticky`, the claim
//! commands on the kubernetes store with kubectl's flags translated.

use std::process::ExitCode;

use crate::dispatch::{Program, STICKY_MACVLAN};
use crate::doctor::Datapath;

/// How the claim commands name themselves when kubectl runs them.
pub const KUBECTL_STICKY: Program = Program {
    name: "kubectl sticky",
    about: STICKY_MACVLAN.about,
    as_cni: "",
};

pub const KUBECTL_HELP: &str = "\
kubectl sticky: sticky-macvlan's claims on the cluster in kubectl's terms
(install: put the sticky-macvlan binary on your PATH as kubectl-sticky)

Usage: kubectl sticky <command> [options]

Commands:
  claims      list the IPClaims with their state judged from the API:
              network, IP, identity, sticky, pod, container, node, state, age
  release     remove a claim: --network NET (--ip IP | --identity ID) [--force]
  reconcile   release every holder the API proves dead (once)

Options, as kubectl takes them:
  --kubeconfig PATH        default: $KUBECONFIG, else ~/.kube/config
  --context NAME           a context of that kubeconfig
  -n, --namespace NS       only the claims of that namespace (the identity's,
                           or its holder pod's); default: every namespace
  -A, --all-namespaces     every namespace (the default)
  -o, --output FORMAT      json, yaml or wide (wide adds retention and the liveness reason)
  --network NET            only that network
";

pub fn main(args: &[String], datapath: &dyn Datapath) -> ExitCode {
    let command = args.first().map(String::as_str).unwrap_or("help");
    if matches!(command, "help" | "--help" | "-h") {
        print!("{KUBECTL_HELP}");
        return ExitCode::SUCCESS;
    }
    if !matches!(command, "claims" | "release" | "reconcile") {
        eprintln!("kubectl sticky: unknown command {command:?}; run `kubectl sticky --help`");
        return ExitCode::from(2);
    }
    let mut out: Vec<String> = Vec::new();
    for a in &args[1..] {
        // --output=json and -ojson, as kubectl accepts them.
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ if a.starts_with("-o") && a.len() > 2 => ("-o".to_string(), Some(a[2..].to_string())),
            _ => (a.clone(), None),
        };
        let flag = match flag.as_str() {
            "-o" => "--output".to_string(),
            "-n" => "--namespace".to_string(),
            "-A" | "--all-namespaces" => continue,
            _ => flag,
        };
        out.push(flag);
        out.extend(value);
    }
    if !out.iter().any(|a| a == "--kubeconfig") {
        let path = std::env::var("KUBECONFIG")
            .ok()
            .and_then(|v| v.split(':').find(|p| !p.is_empty()).map(str::to_string))
            .or_else(|| {
                std::env::var("HOME")
                    .ok()
                    .map(|h| format!("{h}/.kube/config"))
            });
        let Some(path) = path else {
            eprintln!("kubectl sticky: no kubeconfig: set KUBECONFIG or pass --kubeconfig");
            return ExitCode::from(2);
        };
        out.extend(["--kubeconfig".to_string(), path]);
    }
    let mut argv = vec![command.to_string()];
    argv.extend(out);
    crate::dispatch::main(&KUBECTL_STICKY, datapath, &argv)
}
