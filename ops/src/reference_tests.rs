//! The manual's reference pages against the code they describe: the CLI
//! page against the dispatch table, the metrics page against what
//! `reconcile --metrics-addr` serves.

use std::collections::BTreeSet;

use crate::dispatch::{COMMANDS, STICKY_MACVLAN, STORE_OPTIONS};
use crate::metrics::Metrics;

fn page(name: &str) -> String {
    let path = format!(
        "{}/../docs/src/reference/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `--flags` a help text names.
fn flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_cli_reference_is_the_dispatch_table() {
    let cli = page("cli.md");
    let block = cli
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("cli.md starts with a ```text block of synopses");
    let want: String = COMMANDS
        .iter()
        .map(|c| format!("{} {}\n", STICKY_MACVLAN.name, c.synopsis))
        .collect();
    assert_eq!(
        block, want,
        "the synopses at the top of docs/src/reference/cli.md differ from ops/src/dispatch.rs; the block should read:\n{want}"
    );
    let mut missing = Vec::new();
    for c in COMMANDS
        .iter()
        .filter(|c| !matches!(c.name, "help" | "version"))
    {
        if !cli.contains(&format!("- `{}`", c.name)) {
            missing.push(format!(
                "an entry \"- `{}`\" describing the command",
                c.name
            ));
        }
        for flag in flags(c.options) {
            if !cli.contains(&format!("`{flag}")) {
                missing.push(format!("{flag} of {}", c.name));
            }
        }
    }
    for flag in flags(STORE_OPTIONS) {
        if !cli.contains(&format!("`{flag}")) {
            missing.push(format!("the store option {flag}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/src/reference/cli.md lacks: {}",
        missing.join("; ")
    );
}

#[test]
fn the_metrics_reference_names_what_reconcile_serves() {
    let served: BTreeSet<String> = Metrics::default()
        .render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    assert!(!served.is_empty());
    let doc = page("metrics.md");
    let documented: BTreeSet<String> = doc
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.starts_with("sticky_macvlan_"))
        .map(|w| w.split('{').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        documented, served,
        "docs/src/reference/metrics.md and ops/src/metrics.rs name different metrics"
    );
}
