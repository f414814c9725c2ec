//! The CNI_* environment, validated the way the spec and libcni's skel do.

use super::error::{code, CniError, CniResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    /// Verbs that act on one attachment (container + ifname).
    fn is_per_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// Everything a plugin invocation learns from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: String,
    /// Empty for DEL when the runtime no longer has a netns, and for
    /// STATUS/GC/VERSION.
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: String,
}

/// The spec's rule for container IDs and network names.
pub fn is_valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

pub const MAX_IFNAME_LEN: usize = 15;

pub fn validate_ifname(ifname: &str) -> CniResult<()> {
    let bad = |why: &str| CniError::invalid_env(format!("CNI_IFNAME {ifname:?} is invalid: {why}"));
    if ifname.is_empty() {
        return Err(bad("it is empty"));
    }
    if ifname.len() > MAX_IFNAME_LEN {
        return Err(bad(&format!(
            "it is {} bytes long, the kernel allows at most {MAX_IFNAME_LEN}",
            ifname.len()
        )));
    }
    if ifname == "." || ifname == ".." {
        return Err(bad("it may not be . or .."));
    }
    if ifname
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(bad("it may not contain '/', ':' or whitespace"));
    }
    Ok(())
}

impl CniEnv {
    /// Reads and validates the environment through `get` (a seam for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> CniResult<CniEnv> {
        let var = |name: &str| get(name).unwrap_or_default();
        let command_str = var("CNI_COMMAND");
        if command_str.is_empty() {
            return Err(CniError::invalid_env(
                "required environment variable CNI_COMMAND is missing; this binary is a CNI plugin, run it from a container runtime or see --help",
            ));
        }
        let command = Command::parse(&command_str).ok_or_else(|| {
            CniError::invalid_env(format!(
                "unknown CNI_COMMAND {command_str:?}: expected ADD, DEL, CHECK, STATUS, GC or VERSION"
            ))
        })?;
        let env = CniEnv {
            command,
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
            args: var("CNI_ARGS"),
            path: var("CNI_PATH"),
        };
        env.validate()?;
        Ok(env)
    }

    fn required(&self) -> Vec<(&'static str, &str)> {
        match self.command {
            Command::Add | Command::Check => vec![
                ("CNI_CONTAINERID", &self.container_id),
                ("CNI_NETNS", &self.netns),
                ("CNI_IFNAME", &self.ifname),
                ("CNI_PATH", &self.path),
            ],
            Command::Del => vec![
                ("CNI_CONTAINERID", &self.container_id),
                ("CNI_IFNAME", &self.ifname),
                ("CNI_PATH", &self.path),
            ],
            Command::Status | Command::Gc => vec![("CNI_PATH", &self.path)],
            Command::Version => vec![],
        }
    }

    fn validate(&self) -> CniResult<()> {
        let missing: Vec<&str> = self
            .required()
            .into_iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| k)
            .collect();
        if !missing.is_empty() {
            let plural = if missing.len() == 1 {
                "variable"
            } else {
                "variables"
            };
            return Err(CniError::invalid_env(format!(
                "required environment {plural} {} missing for {}",
                missing.join(", "),
                self.command.as_str()
            )));
        }
        if self.command.is_per_attachment() {
            if !is_valid_name(&self.container_id) {
                return Err(CniError::invalid_env(format!(
                    "CNI_CONTAINERID {:?} is invalid: it must start with a letter or digit and contain only letters, digits, '_', '.' and '-'",
                    self.container_id
                )));
            }
            validate_ifname(&self.ifname)?;
        }
        Ok(())
    }

    /// A DEL for a container that was never given an id is a runtime bug.
    pub fn unknown_container() -> CniError {
        CniError::new(code::UNKNOWN_CONTAINER, "unknown container")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> CniResult<CniEnv> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CniEnv::from_lookup(|k| map.get(k).cloned())
    }

    const FULL: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "net1"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    fn without(key: &str) -> Vec<(&'static str, &'static str)> {
        FULL.iter().copied().filter(|(k, _)| *k != key).collect()
    }

    fn with(key: &'static str, value: &'static str) -> Vec<(&'static str, &'static str)> {
        FULL.iter()
            .copied()
            .map(|(k, v)| if k == key { (k, value) } else { (k, v) })
            .collect()
    }

    #[test]
    fn full_add_env_parses() {
        let e = env(&FULL).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.ifname, "net1");
    }

    #[test]
    fn each_missing_required_var_is_named_with_code_4() {
        for key in [
            "CNI_COMMAND",
            "CNI_CONTAINERID",
            "CNI_NETNS",
            "CNI_IFNAME",
            "CNI_PATH",
        ] {
            let err = env(&without(key)).unwrap_err();
            assert_eq!(err.code, code::INVALID_ENV, "{key}");
            assert!(err.msg.contains(key), "{key}: {}", err.msg);
        }
    }

    #[test]
    fn del_does_not_need_a_netns() {
        let e = env(&with("CNI_COMMAND", "DEL")
            .into_iter()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .collect::<Vec<_>>());
        assert!(e.is_ok());
    }

    #[test]
    fn version_needs_nothing_else() {
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
    }

    #[test]
    fn status_and_gc_need_only_the_path() {
        for cmd in ["STATUS", "GC"] {
            assert!(env(&[("CNI_COMMAND", cmd), ("CNI_PATH", "/x")]).is_ok());
            let err = env(&[("CNI_COMMAND", cmd)]).unwrap_err();
            assert!(err.msg.contains("CNI_PATH"));
        }
    }

    #[test]
    fn unknown_command_is_code_4() {
        let err = env(&with("CNI_COMMAND", "FROB")).unwrap_err();
        assert_eq!(err.code, code::INVALID_ENV);
        assert!(err.msg.contains("FROB"));
    }

    #[test]
    fn ifname_rules() {
        let cases = [
            ("eth0", true),
            ("net1", true),
            ("a23456789012345", true),
            ("a234567890123456", false),
            (".", false),
            ("..", false),
            ("a/b", false),
            ("a:b", false),
            ("a b", false),
            ("a\tb", false),
            ("...", true),
        ];
        for (name, ok) in cases {
            assert_eq!(validate_ifname(name).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn container_id_rules() {
        let cases = [
            ("abc", true),
            ("A-b_c.d", true),
            ("0", true),
            ("-abc", false),
            ("_abc", false),
            ("a b", false),
            ("a/b", false),
            ("ä", false),
        ];
        for (id, ok) in cases {
            assert_eq!(is_valid_name(id), ok, "{id:?}");
            let r = env(&with("CNI_CONTAINERID", id));
            assert_eq!(r.is_ok(), ok, "{id:?}");
            if let Err(e) = r {
                assert_eq!(e.code, code::INVALID_ENV);
                assert!(e.msg.contains("CNI_CONTAINERID"));
            }
        }
    }
}
