//! CNI errors: a code from the spec, a message for a person, details.

use std::fmt;

use super::version::CniVersion;

/// Every error code we answer, defined once: the spec's, then ours
/// (>= 100). `TABLE` lists them with their meaning; the fuzz test and the
/// code table of docs/src/reference/errors.md are checked against it.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const STATUS_UNAVAILABLE: u32 = 50;
    pub const STATUS_LIMITED_CONNECTIVITY: u32 = 51;
    /// A netlink operation on the node or in the pod netns failed.
    pub const DATAPATH: u32 = 100;
    /// A delegated IPAM plugin misbehaved (bad output, could not be run).
    pub const IPAM_DELEGATE: u32 = 101;
    /// CHECK found the attachment different from its ADD result.
    pub const CHECK_MISMATCH: u32 = 102;
    /// A stored record cannot be read: named, never guessed at.
    pub const STORE_DAMAGED: u32 = 110;
    /// A conditional write lost a race (only seen when retries ran out
    /// inside the plugin, or by the CLI).
    pub const STORE_CONFLICT: u32 = 111;
    /// The kubernetes API did not answer.
    pub const STORE_UNREACHABLE: u32 = 112;
    /// The kubernetes API refused a request, or no client could be built.
    pub const STORE_REFUSED: u32 = 113;
    /// A pod asked for an identity (or its reserved address) that belongs
    /// to another namespace.
    pub const NAMESPACE_NOT_ALLOWED: u32 = 114;

    /// Each code with what it means, for docs and tests.
    pub const TABLE: &[(u32, &str)] = &[
        (INCOMPATIBLE_VERSION, "incompatible CNI version"),
        (
            UNSUPPORTED_FIELD,
            "unsupported field in network configuration",
        ),
        (UNKNOWN_CONTAINER, "container unknown or does not exist"),
        (INVALID_ENV, "invalid necessary environment variables"),
        (IO_FAILURE, "I/O failure"),
        (DECODE_FAILURE, "failed to decode content"),
        (INVALID_CONFIG, "invalid network config"),
        (TRY_AGAIN_LATER, "try again later"),
        (STATUS_UNAVAILABLE, "plugin not available"),
        (STATUS_LIMITED_CONNECTIVITY, "limited connectivity"),
        (DATAPATH, "a netlink operation failed"),
        (IPAM_DELEGATE, "a delegated IPAM plugin misbehaved"),
        (CHECK_MISMATCH, "CHECK found a difference"),
        (STORE_DAMAGED, "a store record is damaged"),
        (STORE_CONFLICT, "a store write lost a race"),
        (STORE_UNREACHABLE, "the kubernetes API did not answer"),
        (STORE_REFUSED, "the kubernetes API refused, or no client"),
        (NAMESPACE_NOT_ALLOWED, "identity of another namespace"),
    ];

    /// Whether `code` is one we answer.
    pub fn is_known(code: u32) -> bool {
        TABLE.iter().any(|(c, _)| *c == code)
    }
}

/// Why an ADD was refused, for the refusals a person acts on: the pod's
/// Event names it (`sticky_ipam::events::refusal_reason`). Never part of
/// the CNI answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The address's holder may still be alive (liveness rules).
    HolderAlive,
    /// No free address in a range set.
    PoolExhausted,
    /// A requested address belongs to another sticky identity.
    AddressReserved,
    /// Another MAC answered the ARP or DAD probe for the address.
    AnsweredOnWire,
    /// A sticky identity of another namespace.
    NamespaceNotAllowed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
    /// Set on the refusals of `Refusal`; not printed.
    pub refusal: Option<Refusal>,
}

pub type CniResult<T> = Result<T, CniError>;

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
            refusal: None,
        }
    }

    /// Marks the error as a refusal of that kind.
    pub fn refused_as(mut self, refusal: Refusal) -> CniError {
        self.refusal = Some(refusal);
        self
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    pub fn invalid_config(msg: impl Into<String>) -> CniError {
        CniError::new(code::INVALID_CONFIG, msg)
    }

    pub fn invalid_env(msg: impl Into<String>) -> CniError {
        CniError::new(code::INVALID_ENV, msg)
    }

    pub fn decode(msg: impl Into<String>) -> CniError {
        CniError::new(code::DECODE_FAILURE, msg)
    }

    pub fn datapath(msg: impl Into<String>) -> CniError {
        CniError::new(code::DATAPATH, msg)
    }

    pub fn io(msg: impl Into<String>) -> CniError {
        CniError::new(code::IO_FAILURE, msg)
    }

    /// Puts context in front of the message, keeping code and details.
    pub fn context(mut self, context: impl fmt::Display) -> CniError {
        self.msg = format!("{context}: {}", self.msg);
        self
    }

    /// Several failures from a teardown: the first one's code, every message.
    pub fn combine(errors: Vec<CniError>) -> Option<CniError> {
        let mut iter = errors.into_iter();
        let mut first = iter.next()?;
        for other in iter {
            first.msg = format!("{}; also: {}", first.msg, other.msg);
        }
        Some(first)
    }

    pub fn to_json(&self, version: CniVersion) -> serde_json::Value {
        let mut obj = serde_json::json!({
            "cniVersion": version.as_str(),
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            obj["details"] = serde_json::Value::String(self.details.clone());
        }
        obj
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_carries_version_code_and_message() {
        let e = CniError::invalid_config("bad mtu").with_details("mtu 9000 > 1500");
        let j = e.to_json(CniVersion::V0_4_0);
        assert_eq!(j["cniVersion"], "0.4.0");
        assert_eq!(j["code"], 7);
        assert_eq!(j["msg"], "bad mtu");
        assert_eq!(j["details"], "mtu 9000 > 1500");
    }

    #[test]
    fn empty_details_are_omitted() {
        let j = CniError::io("x").to_json(CniVersion::V1_0_0);
        assert!(j.get("details").is_none());
    }

    #[test]
    fn combine_keeps_first_code_and_every_message() {
        let e = CniError::combine(vec![CniError::datapath("a"), CniError::io("b")]).unwrap();
        assert_eq!(e.code, code::DATAPATH);
        assert_eq!(e.msg, "a; also: b");
        assert!(CniError::combine(vec![]).is_none());
    }
}
