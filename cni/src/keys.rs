//! Unknown keys among the keys we own are refused, so a typo fails loudly
//! instead of falling back to a default: `"mastre"` would otherwise put the
//! macvlan on the default-route interface, `"reservation"` would hand a
//! reserved address to someone else. Code 2 ("unsupported field"), the key
//! and its value named, and the key meant when one is close.

use serde_json::{Map, Value};

use crate::error::{code, CniError, CniResult};

/// An object's keys, when `value` is one (a non-object is left to the
/// typed parse, which names what it expected).
pub fn refuse_unknown_in(
    value: &Value,
    at: &str,
    ours: &[&str],
    foreign: &[&[&str]],
) -> CniResult<()> {
    match value.as_object() {
        Some(object) => refuse_unknown(object, at, ours, foreign),
        None => Ok(()),
    }
}

/// Keys the CNI spec itself defines for every plugin's network config, and
/// those libcni adds when it runs one plugin of a list.
pub const SPEC_KEYS: &[&str] = &[
    // CNI spec, section "Plugin configuration objects".
    "cniVersion",
    "name",
    "type",
    "args",
    "capabilities",
    "ipam",
    "dns",
    // Added by libcni (InjectConf) for capability args and chained results.
    "runtimeConfig",
    "prevResult",
    // GC (spec 1.1); older spec text and libcni used the second name.
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
];

/// A route object's keys (CNI spec, "Result": routes; mtu and the rest
/// since 1.1).
pub const ROUTE_KEYS: &[&str] = &["dst", "gw", "mtu", "advmss", "priority", "table", "scope"];

/// A DNS object's keys (CNI spec, "DNS").
pub const DNS_KEYS: &[&str] = &["nameservers", "domain", "search", "options"];

/// Keys Multus adds to a delegate's config.
pub const MULTUS_KEYS: &[&str] = &[
    // pkg/types/conf.go delegateAddDeviceID, for device-plugin resources.
    "deviceID", "pciBusID",
];

/// Keys kubevirt/ipam-extensions reads from a NAD's config, at its top
/// level, beside the plugin's own.
pub const KUBEVIRT_KEYS: &[&str] = &[
    // pkg/config/types.go RelevantConfig: with true, its controller
    // creates an IPAMClaim per VM and network, and its webhook puts the
    // claim's name in the launcher pod's network selection element.
    "allowPersistentIPs",
];

/// Refuses the first key of `object` that is neither one of `ours` nor in
/// a `foreign` list (keys others add to configs we receive; each list says
/// where its keys come from). `at` names the object for the message ("the
/// network config", "ipam", "ipam.store").
pub fn refuse_unknown(
    object: &Map<String, Value>,
    at: &str,
    ours: &[&str],
    foreign: &[&[&str]],
) -> CniResult<()> {
    let known = |k: &str| ours.contains(&k) || foreign.iter().any(|list| list.contains(&k));
    let Some((key, value)) = object.iter().find(|(k, _)| !known(k)) else {
        return Ok(());
    };
    let hint = match closest(key, ours) {
        Some(meant) => format!("did you mean {meant:?}?"),
        None => format!("known keys: {}", ours.join(", ")),
    };
    Err(CniError::new(
        code::UNSUPPORTED_FIELD,
        format!(
            "unsupported field {key:?} in {at} (value {}): {hint}",
            shortened(value)
        ),
    ))
}

/// The value as JSON, cut to a length a log line can carry.
fn shortened(value: &Value) -> String {
    const MAX: usize = 80;
    let text = value.to_string();
    if text.chars().count() <= MAX {
        return text;
    }
    let cut: String = text.chars().take(MAX).collect();
    format!("{cut}...")
}

/// The known key a typo most likely meant: same letters but for case, or
/// within a small edit distance (a transposition counts as one edit).
pub fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = key.to_ascii_lowercase();
    if let Some(k) = known.iter().find(|k| k.to_ascii_lowercase() == lower) {
        return Some(k);
    }
    let allowed = (key.chars().count() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| (edit_distance(&lower, &k.to_ascii_lowercase()), *k))
        .filter(|(d, _)| *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Optimal string alignment distance: insertions, deletions,
/// substitutions and adjacent transpositions.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const OURS: &[&str] = &["reservations", "rangeStart", "rangeEnd", "store", "subnet"];

    fn check(v: Value) -> CniResult<()> {
        refuse_unknown(v.as_object().unwrap(), "ipam", OURS, &[&["type"]])
    }

    #[test]
    fn typos_are_refused_with_the_key_meant() {
        for (typo, meant) in [
            ("reservation", "reservations"),
            ("rangeStrat", "rangeStart"),
            ("stroe", "store"),
            ("RangeEnd", "rangeEnd"),
            ("subnett", "subnet"),
        ] {
            let e = check(json!({ typo: 1 })).unwrap_err();
            assert_eq!(e.code, code::UNSUPPORTED_FIELD, "{typo}");
            assert!(e.msg.contains(&format!("{typo:?}")), "{}", e.msg);
            assert!(
                e.msg.contains(&format!("did you mean {meant:?}")),
                "{}",
                e.msg
            );
            assert!(e.msg.contains("(value 1)"), "{}", e.msg);
        }
    }

    #[test]
    fn far_keys_list_what_is_known_and_long_values_are_cut() {
        let e = check(json!({"colour": "x".repeat(500)})).unwrap_err();
        assert!(e.msg.contains("known keys: reservations"), "{}", e.msg);
        assert!(e.msg.len() < 300, "{}", e.msg);
    }

    #[test]
    fn known_and_foreign_keys_pass() {
        assert!(check(json!({"type": "sticky-ipam", "subnet": "10.0.0.0/24"})).is_ok());
    }

    #[test]
    fn distances() {
        assert_eq!(edit_distance("stroe", "store"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("mastre", "master"), 1);
        assert_eq!(closest("mdoe", &["mac", "mode"]), Some("mode"));
        assert_eq!(closest("mtu", &["mac", "mode"]), None);
        assert_eq!(closest("zzzzzz", &["master"]), None);
    }
}
