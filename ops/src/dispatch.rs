//! The operator commands of both binaries (run without CNI_COMMAND): one
//! table, the only source of their help text. `--help`, `COMMAND --help`
//! and docs/src/reference/cli.md (checked by `the_cli_reference_is_the_dispatch_table`)
//! are all made from it.

use std::process::ExitCode;

use cni::version::SUPPORTED_VERSIONS;
use cni::CniResult;

use crate::doctor::Datapath;
use crate::options::{parse_opts, Opts};

/// Which binary is running: its name and how it introduces itself.
pub struct Program {
    pub name: &'static str,
    /// The first line of `version` and `--help`.
    pub about: &'static str,
    /// How the runtime runs it, for `--help`.
    pub as_cni: &'static str,
}

pub const STICKY_MACVLAN: Program = Program {
    name: "sticky-macvlan",
    about: concat!(
        "sticky-macvlan ",
        env!("CARGO_PKG_VERSION"),
        ": CNI macvlan plugin with sticky, identity-keyed IPs"
    ),
    as_cni: "As a CNI plugin it is run by the container runtime with CNI_COMMAND set
(ADD, DEL, CHECK, STATUS, GC, VERSION) and the network config on stdin.",
};

pub const STICKY_IPAM: Program = Program {
    name: "sticky-ipam",
    about: concat!(
        "sticky-ipam ",
        env!("CARGO_PKG_VERSION"),
        ": sticky, identity-keyed IPAM for CNI"
    ),
    as_cni: "As a CNI IPAM plugin (\"ipam\": {\"type\": \"sticky-ipam\"}) it is run by the main
plugin with CNI_COMMAND set and the network config on stdin.",
};

/// What a command runs with: the binary, and the node's datapath for
/// `doctor`'s checks of the main plugin's config and master.
pub struct Context<'a> {
    pub program: &'a Program,
    pub datapath: &'a dyn Datapath,
}

pub struct Subcommand {
    pub name: &'static str,
    /// For the command list of `--help`; lines after the first are
    /// indented there.
    pub summary: &'static str,
    /// What follows the program's name on the usage line.
    pub synopsis: &'static str,
    /// `COMMAND --help`'s description.
    pub description: &'static str,
    /// The command's own options, if it has any beyond the store options.
    pub options: &'static str,
    /// Whether it takes the store options (`STORE_OPTIONS`).
    pub store_options: bool,
    /// Only this binary runs it (`install` copies the running binary).
    pub only: Option<&'static str>,
    pub run: fn(&Context, &[String]) -> ExitCode,
}

/// The options every claim command takes.
pub const STORE_OPTIONS: &str =
    "  --dir DIR           store directory (default /var/lib/cni/sticky-ipam;
                      the ipam section's dataDir or store.dir)
  --kubeconfig PATH   use the kubernetes store (IPClaim objects) of that cluster
  --in-cluster        the same, with the pod's service account (reconcile Deployment)
  --context NAME      the kubeconfig's context to use (default: its current one)
  --timeout-ms MS     per-request timeout for the kubernetes API (default 10000)
  --network NAME      only this network (required by release and import)
  --node NAME         this node's name for liveness (file store default: the
                      hostname; kubernetes store default: none, the API decides;
                      its boot id and netns paths count only where this machine
                      is proven to be NAME: the installer's nodename file, beside
                      --kubeconfig or in /etc/cni/net.d/sticky-macvlan.d/, names
                      it, and Node NAME reports no other boot id)
  --cri-socket PATH   the container runtime's CRI socket, asked whether the
                      sandbox of an imported host-local holder still exists
                      (default /run/containerd/containerd.sock; \"\" asks none)
";

pub const COMMANDS: &[Subcommand] = &[
    Subcommand {
        name: "claims",
        summary: "list claims: network, IP, identity, sticky, holder, node, state, age",
        synopsis: "claims [store options] [--network NET] [--namespace NS] [--output json|yaml|wide | --json]",
        description: "\
Lists every claim: network, IP, identity, sticky, holder pod and container,
node, state and age. STATE is one of held, dead, reserved, released, free,
damaged (released: a claim freed on a judgement, kept until a probe of its
address at its next grant). --json gives each claim with \"state\", \"reason\"
and \"judgedFrom\". On the kubernetes store the state is judged from the API
alone, as any node would, so it does not depend on where the command runs;
--node NAME adds that node's own evidence (its boot id and netns paths), as
an ADD there does, only when this machine is proven to be NAME (see --node);
stderr, and \"evidence\" in --json, say which was used.",
        options: "  --namespace NS      only the claims of namespace NS (the identity's
                      namespace, or the holder pod's)
  --output FORMAT     json, yaml or wide (adds retention, liveness reason)
  --json              the same as --output json
",
        store_options: true,
        only: None,
        run: |ctx, args| claim_command(ctx, "claims", args, crate::claims::run),
    },
    Subcommand {
        name: "release",
        summary: "remove a claim: --ip IP or --identity ID (with --network);
refuses while its holder is alive unless --force;
--file NAME removes a damaged record reported by `claims`",
        synopsis: "release --network NET (--ip IP | --identity ID | --file NAME) [--force] [store options]",
        description: "\
Removes a claim. A claim that had a holder (or was already released on a
judgement) is kept as released instead, its identity's reservation gone, so
that its address is probed on the wire before it is bound again. Refused
while its holder is considered alive, unless --force; liveness as for claims
(a node's own evidence only on that node, and stderr says which). --file
removes a damaged record named by `claims` or by an error (a claim's file
name, or identities/NAME, holders/NAME) and rebuilds the network's indexes.",
        options: "  --ip IP             the claim of this address
  --identity ID       the claim of this identity
  --file NAME         a damaged record of the file store
  --force             release even while the holder is alive
",
        store_options: true,
        only: None,
        run: |ctx, args| claim_command(ctx, "release", args, crate::release::run),
    },
    Subcommand {
        name: "reconcile",
        summary: "release every holder confirmed dead, once or every
--interval SECONDS, printing a summary line per sweep;
with --kubeconfig it also retires the sticky claims of
deleted StatefulSets (unless --keep-retired)",
        synopsis: "reconcile [store options] [--network NET] [--interval SECONDS] [--keep-retired] [--metrics-addr ADDR]",
        description: "\
Releases every holder confirmed dead, once or every --interval seconds,
printing a summary line per sweep (the addresses it frees are probed before
they are bound again); SIGTERM stops it between sweeps. Liveness as for
claims (stderr says which evidence); every network, and every attempt after
a lost race, is judged by lookups of its own. On the kubernetes store it
also retires the sticky claims their network's ipam.retention gives up (by
default those of deleted StatefulSets) unless --keep-retired, and with
--metrics-addr serves Prometheus metrics: per network the range size (from
the NetworkAttachmentDefinitions), addresses held, reserved, dead and free,
and counters of refusals by reason, takeovers and reclaims (from the
plugins' Events), releases, sweeps, failed sweeps and API errors. With
--interval a failed sweep is logged and counted, and the next one runs.",
        options: "  --interval SECONDS  sweep again every SECONDS (at least 1) until SIGTERM
  --keep-retired      kubernetes store: retire no sticky claim
  --metrics-addr ADDR serve Prometheus metrics at http://ADDR/metrics
                      (e.g. 0.0.0.0:9402), refreshed every sweep
",
        store_options: true,
        only: None,
        run: |ctx, args| claim_command(ctx, "reconcile", args, crate::reconcile::run),
    },
    Subcommand {
        name: "import-host-local",
        summary: "adopt a host-local directory (--from DIR/NETWORK) into
--network, so a live node switches without IP conflicts",
        synopsis: "import-host-local --network NET --from /var/lib/cni/networks/NET [store options]",
        description: "\
Adopts host-local's allocations of one network on this node (the directory
that holds one file per address, `lock` and `last_reserved_ip.N`) as dynamic
claims held by their containers, naming their pods (from the container
runtime), into the file store (--dir) or the kubernetes store (--kubeconfig
or --in-cluster, with --node). Safe to rerun; an address claimed by another
holder is a conflict, listed, and the exit code is non-zero.",
        options: "  --from DIR          host-local's directory of the network
",
        store_options: true,
        only: None,
        run: |ctx, args| {
            claim_command(
                ctx,
                "import-host-local",
                args,
                crate::import::host_local::run,
            )
        },
    },
    Subcommand {
        name: "import-whereabouts",
        summary: "adopt a Whereabouts range's allocations (--range CIDR)
into --network on the kubernetes store",
        synopsis: "import-whereabouts --network NET --range CIDR (--kubeconfig PATH | --in-cluster)",
        description: "\
Adopts the allocations of the Whereabouts IPPool of range CIDR (v0.9's
whereabouts.cni.cncf.io/v1alpha1, any namespace) whose pods still exist as
dynamic claims naming those pods and their nodes, into the kubernetes store.
Multus keeps sending those pods' DELs to Whereabouts, so their claims are
freed by liveness once they are gone. Safe to rerun; conflicts as
import-host-local. Needs list on ippools and get on pods.",
        options: "  --range CIDR        the IPPool's range
",
        store_options: true,
        only: None,
        run: |ctx, args| {
            claim_command(
                ctx,
                "import-whereabouts",
                args,
                crate::import::whereabouts::run,
            )
        },
    },
    Subcommand {
        name: "install",
        summary: "install onto this node from the DaemonSet",
        synopsis: "install [--cni-bin-dir DIR] [--cni-conf-dir DIR] [--host-cni-conf-dir DIR] [--service-account DIR] [--node-name NAME] [--service-account-name NAME] [--wait]",
        description: crate::install::DESCRIPTION,
        options: crate::install::OPTIONS,
        store_options: false,
        only: Some("sticky-macvlan"),
        run: |ctx, args| crate::install::main(ctx.program.name, args),
    },
    Subcommand {
        name: "doctor",
        summary: "check this node and a network's config; every problem
with its fix",
        synopsis: "doctor [--network NET | --config FILE] [--bin-dir DIR] [--conf-dir DIR] [--kubeconfig PATH] [--daemonset NS/NAME] [--json]",
        description: crate::doctor::DESCRIPTION,
        options: crate::doctor::OPTIONS,
        store_options: false,
        only: None,
        run: |ctx, args| crate::doctor::main(ctx.program.name, args, ctx.datapath),
    },
    Subcommand {
        name: "crd",
        summary: "print the IPClaim and IPLock CustomResourceDefinitions (YAML)",
        synopsis: "crd",
        description: "Prints the IPClaim and IPLock CustomResourceDefinitions as YAML, for
`kubectl apply -f -`.",
        options: "",
        store_options: false,
        only: None,
        run: |ctx, _| crate::crd::main(ctx.program.name),
    },
    Subcommand {
        name: "version",
        summary: "print the version and the CNI versions supported",
        synopsis: "version",
        description: "Prints the version and the CNI protocol versions supported.",
        options: "",
        store_options: false,
        only: None,
        run: |ctx, _| {
            println!("{}", ctx.program.about);
            println!(
                "CNI protocol versions supported: {}",
                SUPPORTED_VERSIONS.join(", ")
            );
            ExitCode::SUCCESS
        },
    },
    Subcommand {
        name: "help",
        summary: "print this help",
        synopsis: "help",
        description: "Prints the commands.",
        options: "",
        store_options: false,
        only: None,
        run: |ctx, _| {
            print!("{}", usage(ctx.program));
            ExitCode::SUCCESS
        },
    },
];

/// The command named `name` (also by `--version`, `-h` and the like).
pub fn command(name: &str) -> Option<&'static Subcommand> {
    let name = match name {
        "--help" | "-h" => "help",
        "--version" | "-V" => "version",
        other => other,
    };
    COMMANDS.iter().find(|c| c.name == name)
}

/// The whole `--help` of `program`.
pub fn usage(program: &Program) -> String {
    let mut list = String::new();
    for c in COMMANDS.iter().filter(|c| runs_on(c, program)) {
        let mut lines = c.summary.lines();
        list += &format!("  {:<20}{}\n", c.name, lines.next().unwrap_or_default());
        for more in lines {
            list += &format!("  {:<20}{more}\n", "");
        }
    }
    format!(
        "{about}

{as_cni}
CNI protocol versions supported: {versions}

Usage: {name} <command> [options]   (`{name} COMMAND --help` for one command's)

Commands:
{list}
Store options (claims, release, reconcile, import-*: the file store under
--dir, or the kubernetes store with --kubeconfig or --in-cluster):
{STORE_OPTIONS}
Set CNI_COMMAND to run as a plugin, e.g.
  echo '{{\"cniVersion\":\"1.0.0\"}}' | CNI_COMMAND=VERSION {name}
",
        about = program.about,
        as_cni = program.as_cni,
        versions = SUPPORTED_VERSIONS.join(", "),
        name = program.name,
    )
}

/// `COMMAND --help`.
pub fn command_usage(program: &str, c: &Subcommand) -> String {
    let mut out = format!("Usage: {program} {}\n\n{}\n", c.synopsis, c.description);
    if !c.options.is_empty() {
        out += &format!("\nOptions:\n{}", c.options);
    }
    if c.store_options {
        out += &format!("\nStore options:\n{STORE_OPTIONS}");
    }
    out
}

fn runs_on(c: &Subcommand, program: &Program) -> bool {
    c.only.is_none_or(|only| only == program.name)
}

/// Runs `args` (a command and its arguments) as `program` would.
pub fn main(program: &Program, datapath: &dyn Datapath, args: &[String]) -> ExitCode {
    let name = args.first().map(String::as_str).unwrap_or("help");
    let Some(c) = command(name) else {
        eprintln!(
            "{}: unknown command {name:?}; run `{} --help`",
            program.name, program.name
        );
        return ExitCode::from(2);
    };
    if !runs_on(c, program) {
        eprintln!(
            "{}: {name} is a command of {}, the DaemonSet's binary: run `{} {name}`",
            program.name,
            c.only.unwrap_or_default(),
            c.only.unwrap_or_default()
        );
        return ExitCode::from(2);
    }
    let rest = &args[args.len().min(1)..];
    if c.name != "help" && rest.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", command_usage(program.name, c));
        return ExitCode::SUCCESS;
    }
    (c.run)(&Context { program, datapath }, rest)
}

/// A claim command: its options parsed, then `run`; an error is printed
/// with the command's name and exits 1 (2 for usage).
pub(crate) fn claim_command(
    ctx: &Context,
    name: &str,
    args: &[String],
    run: fn(&Opts) -> CniResult<()>,
) -> ExitCode {
    let program = ctx.program.name;
    let opts = match parse_opts(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{program} {name}: {e}; run `{program} {name} --help`");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program} {name}: {}", e.msg);
            ExitCode::from(1)
        }
    }
}
