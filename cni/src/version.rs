//! CNI spec versions and what each one allows.

use std::fmt;

/// The versions this plugin speaks, oldest first, exactly as the spec spells
/// them (runtimes compare the strings, not a parsed semver).
pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// A config with no `cniVersion` is, by the spec, a 0.1.0 config.
pub const IMPLICIT_VERSION: CniVersion = CniVersion::V0_1_0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    V0_1_0,
    V0_2_0,
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

/// The shape of a result on the wire; several versions share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultShape {
    /// 0.1.0 / 0.2.0: `ip4` / `ip6` objects.
    Legacy,
    /// 0.3.0 .. 0.4.0: `interfaces` / `ips` with a `version` key per ip.
    Versioned,
    /// 1.0.0 and later: `interfaces` / `ips` without `version`.
    Current,
}

impl CniVersion {
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    pub fn parse(s: &str) -> Option<CniVersion> {
        Some(match s {
            "0.1.0" => CniVersion::V0_1_0,
            "0.2.0" => CniVersion::V0_2_0,
            "0.3.0" => CniVersion::V0_3_0,
            "0.3.1" => CniVersion::V0_3_1,
            "0.4.0" => CniVersion::V0_4_0,
            "1.0.0" => CniVersion::V1_0_0,
            "1.1.0" => CniVersion::V1_1_0,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_1_0 => "0.1.0",
            CniVersion::V0_2_0 => "0.2.0",
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    pub fn allows_check(self) -> bool {
        self >= CniVersion::V0_4_0
    }

    /// STATUS and GC arrived together in 1.1.0.
    pub fn allows_status_and_gc(self) -> bool {
        self >= CniVersion::V1_1_0
    }

    pub fn result_shape(self) -> ResultShape {
        match self {
            CniVersion::V0_1_0 | CniVersion::V0_2_0 => ResultShape::Legacy,
            CniVersion::V0_3_0 | CniVersion::V0_3_1 | CniVersion::V0_4_0 => ResultShape::Versioned,
            CniVersion::V1_0_0 | CniVersion::V1_1_0 => ResultShape::Current,
        }
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The VERSION answer.
pub fn version_info() -> serde_json::Value {
    serde_json::json!({
        "cniVersion": CniVersion::LATEST.as_str(),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_string_round_trips() {
        for s in SUPPORTED_VERSIONS {
            assert_eq!(CniVersion::parse(s).map(CniVersion::as_str), Some(s));
        }
    }

    #[test]
    fn near_misses_are_not_versions() {
        for s in ["1.0", "v1.0.0", "1.0.0 ", "0.3", "", "1.2.0", "0.0.0"] {
            assert_eq!(CniVersion::parse(s), None, "{s:?}");
        }
    }

    #[test]
    fn verbs_by_version() {
        let cases = [
            ("0.1.0", false, false, ResultShape::Legacy),
            ("0.2.0", false, false, ResultShape::Legacy),
            ("0.3.0", false, false, ResultShape::Versioned),
            ("0.3.1", false, false, ResultShape::Versioned),
            ("0.4.0", true, false, ResultShape::Versioned),
            ("1.0.0", true, false, ResultShape::Current),
            ("1.1.0", true, true, ResultShape::Current),
        ];
        for (s, check, gc, shape) in cases {
            let v = CniVersion::parse(s).unwrap();
            assert_eq!(v.allows_check(), check, "{s}");
            assert_eq!(v.allows_status_and_gc(), gc, "{s}");
            assert_eq!(v.result_shape(), shape, "{s}");
        }
    }
}
