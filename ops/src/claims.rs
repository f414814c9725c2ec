//! `claims`: every claim of the chosen store with its state judged by
//! liveness, as a table (kubectl-like), JSON or YAML.

use cni::{CniError, CniResult};
use sticky_ipam::claim::{now_secs, Claim, Holder};
use sticky_ipam::liveness::{Inspector, Verdict};
use sticky_ipam::store::ClaimStore;

use crate::options::Opts;

pub(crate) fn age(since: u64, now: u64) -> String {
    let s = now.saturating_sub(since);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// A claim's state, from a fixed vocabulary, and why.
pub(crate) fn state(claim: &Claim, inspector: &dyn Inspector) -> (&'static str, String) {
    let probe = |what: String| match &claim.unconfirmed {
        Some(u) => format!(
            "{what}; probed on the wire before its next grant: {}",
            u.why
        ),
        None => what,
    };
    match &claim.holder {
        None if claim.sticky => (
            "reserved",
            probe("sticky, no holder: kept for its identity".into()),
        ),
        None if claim.is_tombstone() => (
            "released",
            probe("no holder, released on a judgement; an exhausted pool reuses it".into()),
        ),
        None => ("free", "no holder".into()),
        Some(h) => match inspector.verdict(h, None) {
            Verdict::Alive(why) => ("held", probe(why)),
            Verdict::Dead(why) => ("dead", probe(why)),
        },
    }
}

/// How `claims` prints: a table (`wide` adds the retention and the reason), JSON or YAML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

impl Opts {
    fn output(&self) -> CniResult<Output> {
        match self.values.get("--output").map(String::as_str) {
            None if self.flag("--json") => Ok(Output::Json),
            None => Ok(Output::Table),
            Some("json") => Ok(Output::Json),
            Some("yaml") => Ok(Output::Yaml),
            Some("wide") => Ok(Output::Wide),
            Some(other) => Err(CniError::invalid_config(format!(
                "--output {other:?} is not one of json, yaml, wide"
            ))),
        }
    }

    /// Whether `claim` is of the namespace `--namespace` names (its
    /// identity's, or its holder pod's); every claim when none is named.
    fn in_namespace(&self, claim: &Claim) -> bool {
        let Some(ns) = self.values.get("--namespace") else {
            return true;
        };
        claim.namespace.as_deref() == Some(ns.as_str())
            || claim
                .holder
                .as_ref()
                .is_some_and(|h| h.pod_namespace.as_deref() == Some(ns.as_str()))
    }
}

pub fn run(opts: &Opts) -> CniResult<()> {
    let output = opts.output()?;
    let backend = opts.backend()?;
    let judge = opts.judge(&backend)?;
    let judged_from = judge.from();
    let evidence = judge.describe();
    let now = now_secs();
    let mut rows = vec![[
        "NETWORK",
        "IP",
        "IDENTITY",
        "STICKY",
        "POD",
        "CONTAINER",
        "NODE",
        "STATE",
        "AGE",
        "RETENTION",
        "REASON",
    ]
    .map(String::from)];
    let mut json = Vec::new();
    for network in opts.networks(&backend)? {
        let mut store = backend.open(&network, vec![])?;
        let listing = store.list()?;
        let inspector = judge.inspector();
        for c in listing.claims.iter().filter(|c| opts.in_namespace(c)) {
            let h = c.holder.as_ref();
            let (st, reason) = state(c, inspector.as_ref());
            json.push(serde_json::json!({"network": network, "claim": c, "state": st, "reason": reason, "judgedFrom": judged_from, "evidence": evidence}));
            rows.push([
                network.clone(),
                c.ip.to_string(),
                c.identity.clone(),
                if c.sticky { "yes" } else { "no" }.into(),
                h.and_then(Holder::pod).unwrap_or_else(|| "-".into()),
                h.map(|h| {
                    let short: String = h.container_id.chars().take(12).collect();
                    format!("{short}/{}", h.ifname)
                })
                .unwrap_or_else(|| "-".into()),
                h.map(|h| h.node.clone()).unwrap_or_else(|| "-".into()),
                st.to_string(),
                age(c.updated, now),
                // Only a StatefulSet's claims have a retention to apply.
                c.owner
                    .as_ref()
                    .map(|o| o.retention.describe())
                    .unwrap_or_else(|| "-".into()),
                reason,
            ]);
        }
        // A damaged record has no namespace to filter by.
        let damaged = if opts.values.contains_key("--namespace") {
            &[][..]
        } else {
            &listing.damaged[..]
        };
        for d in damaged {
            let name = d
                .path
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            json.push(serde_json::json!({"network": network, "damaged": d.path, "state": "damaged", "reason": d.why}));
            rows.push([
                network.clone(),
                name,
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "damaged".into(),
                "-".into(),
                "-".into(),
                d.why.clone(),
            ]);
            eprintln!(
                "{network}: record {} is damaged: {}",
                d.path.display(),
                d.why
            );
        }
    }
    match output {
        Output::Json => {
            println!("{}", serde_json::Value::Array(json));
            return Ok(());
        }
        Output::Yaml => {
            let text = serde_saphyr::to_string(&serde_json::Value::Array(json))
                .map_err(|e| CniError::io(format!("cannot write YAML: {e}")))?;
            print!("{text}");
            return Ok(());
        }
        // RETENTION and REASON are wide's.
        Output::Table => rows.iter_mut().for_each(|r| {
            r[9].clear();
            r[10].clear();
        }),
        Output::Wide => {}
    }
    eprintln!("states judged from {evidence}");
    let widths: Vec<usize> = (0..11)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    Ok(())
}
