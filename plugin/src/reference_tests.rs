//! docs/src/reference/config.md against the key lists the parsers refuse
//! unknown keys with: a key the code takes is documented, and a documented
//! key is one the code takes.

use std::collections::BTreeSet;

use sticky_ipam::config::keys::{IPAM_KEYS, RETENTION_KEYS, STORE_KEYS};

use crate::cni::keys::{KUBEVIRT_KEYS, SPEC_KEYS};
use crate::netconf::{MACVLAN_KEYS, PROBE_KEYS};

fn reference() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/src/reference/config.md"
    );
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The section of the page under the heading that starts with `heading`.
fn section<'a>(page: &'a str, heading: &str) -> &'a str {
    let start = page
        .find(heading)
        .unwrap_or_else(|| panic!("config.md has no heading {heading:?}"));
    let rest = &page[start + heading.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// The keys a table names in its first column (`a` / `b`, `a.b`).
fn first_column(section: &str) -> BTreeSet<String> {
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('|').nth(1))
        .flat_map(|cell| {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn documented(section: &str, key: &str) -> bool {
    section.contains(&format!("`{key}`"))
}

#[test]
fn the_config_reference_names_every_key_the_plugin_takes() {
    let page = reference();
    let plugin = section(&page, "## The plugin");
    let table = first_column(plugin);
    for key in
        MACVLAN_KEYS
            .iter()
            .chain(&["cniVersion", "name", "type", "ipam", "dns", "capabilities"])
    {
        assert!(
            table.contains(*key),
            "config.md, The plugin: no row for {key:?}"
        );
    }
    for key in PROBE_KEYS {
        assert!(
            documented(plugin, key),
            "config.md: the probe row does not name {key:?}"
        );
    }
    for row in &table {
        let top = row.split('.').next().unwrap_or_default();
        assert!(
            MACVLAN_KEYS.contains(&top) || SPEC_KEYS.contains(&top) || KUBEVIRT_KEYS.contains(&top),
            "config.md, The plugin documents {row:?}, which the plugin refuses as unknown"
        );
    }
    let ipam = section(&page, "## `ipam`");
    let table = first_column(ipam);
    for key in IPAM_KEYS {
        let nested = format!("{key}.");
        assert!(
            table
                .iter()
                .any(|row| row == key || row.starts_with(&nested)),
            "config.md, ipam: no row for {key:?}"
        );
    }
    for key in STORE_KEYS {
        let row = format!("store.{key}");
        assert!(table.contains(&row), "config.md, ipam: no row for {row:?}");
    }
    for key in RETENTION_KEYS {
        assert!(
            documented(ipam, key),
            "config.md: the retention row does not name {key:?}"
        );
    }
    for row in &table {
        let (top, sub) = row.split_once('.').unwrap_or((row, ""));
        assert!(
            IPAM_KEYS.contains(&top) && (top != "store" || STORE_KEYS.contains(&sub)),
            "config.md, ipam documents {row:?}, which sticky-ipam refuses as unknown"
        );
    }
}
