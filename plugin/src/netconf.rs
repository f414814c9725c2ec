//! The network config (stdin), parsed and validated before anything is
//! touched. The keys every plugin shares are `cni::conf::CommonConf`; this
//! adds the macvlan ones. Unknown top-level keys are refused (code 2),
//! except those the spec, libcni and Multus add (`cni::keys`): a typo such
//! as `mastre` must not fall back to the default-route interface.

use serde::Deserialize;

use crate::datapath::arp::ProbeSpec;
pub use crate::datapath::MacvlanMode;

pub use crate::cni::conf::{sniff_version, IpamSection};
use crate::cni::conf::{typed, CommonConf};
use crate::cni::{CniError, CniResult};

#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// The keys every plugin reads (version, name, ipam, args, ...).
    pub common: CommonConf,
    pub master: Option<String>,
    pub mode: MacvlanMode,
    pub mtu: u32,
    pub mac: Option<String>,
    pub link_in_container: bool,
    pub bc_queue_len: Option<u32>,
    pub probe: ProbeConf,
    /// Derive the MAC from the workload's address (unless one is given).
    pub sticky_mac: bool,
    /// After ADD, each IPv4 gateway must answer ARP.
    pub gateway_check: bool,
}

/// `"probe"`: the wire check (ARP probe for IPv4, duplicate address
/// detection for IPv6) before an address the store cannot prove free is
/// bound. Which addresses those are is the IPAM's call
/// (`sticky_ipam::wire`); this is how to ask.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeConf {
    pub spec: ProbeSpec,
    /// Also probe freshly allocated addresses, not only taken-over ones.
    pub fresh: bool,
    /// `riskDuplicateAddresses: true`: no wire check at all. The only way
    /// to turn it off, so the config says what it gives up.
    pub off: bool,
}

impl ProbeConf {
    /// The top-level `probe` of a main plugin's config: ours, or the
    /// reference macvlan's for the standalone sticky-ipam (it ignores the
    /// key).
    pub fn from_config(value: &serde_json::Value) -> CniResult<ProbeConf> {
        let Some(probe) = value.get("probe") else {
            return Ok(ProbeConf::default());
        };
        crate::cni::keys::refuse_unknown_in(probe, "probe", PROBE_KEYS, &[])?;
        ProbeConf::parse(Some(typed(probe, "probe")?))
    }

    /// Whether addresses are checked on the wire at all.
    pub fn enabled(&self) -> bool {
        !self.off
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawProbe {
    count: Option<u32>,
    interval_ms: Option<u64>,
    fresh: Option<bool>,
    risk_duplicate_addresses: Option<bool>,
}

/// Our top-level keys (beside `CommonConf`'s own: logFile, logLevel).
pub const MACVLAN_KEYS: &[&str] = &[
    "master",
    "mode",
    "mtu",
    "mac",
    "linkInContainer",
    "bcqueuelen",
    "probe",
    "stickyMac",
    "gatewayCheck",
    "logFile",
    "logLevel",
];

pub const PROBE_KEYS: &[&str] = &["count", "intervalMs", "fresh", "riskDuplicateAddresses"];

fn refuse_unknown_keys(value: &serde_json::Value) -> CniResult<()> {
    use crate::cni::keys::{refuse_unknown_in, DNS_KEYS, KUBEVIRT_KEYS, MULTUS_KEYS, SPEC_KEYS};
    refuse_unknown_in(
        value,
        "the network config",
        MACVLAN_KEYS,
        &[SPEC_KEYS, MULTUS_KEYS, KUBEVIRT_KEYS],
    )?;
    if let Some(dns) = value.get("dns") {
        refuse_unknown_in(dns, "dns", DNS_KEYS, &[])?;
    }
    Ok(())
}

impl ProbeConf {
    fn parse(raw: Option<RawProbe>) -> CniResult<ProbeConf> {
        let Some(raw) = raw else {
            return Ok(ProbeConf::default());
        };
        let d = ProbeSpec::default();
        let count = match raw.count {
            None => d.count,
            Some(0) => {
                return Err(CniError::invalid_config(
                    "probe.count 0 would bind addresses without asking the wire whether a live host still uses them: use 1 to 10, or set \"riskDuplicateAddresses\": true in probe to turn the check off knowingly",
                ))
            }
            Some(n @ 1..=10) => n,
            Some(n) => {
                return Err(CniError::invalid_config(format!(
                    "probe.count {n} is too many: use 1 to 10"
                )))
            }
        };
        let interval = match raw.interval_ms {
            None => d.interval,
            Some(ms @ 10..=2000) => std::time::Duration::from_millis(ms),
            Some(ms) => {
                return Err(CniError::invalid_config(format!(
                    "probe.intervalMs {ms} is out of range: use 10 to 2000"
                )))
            }
        };
        Ok(ProbeConf {
            spec: ProbeSpec { count, interval },
            fresh: raw.fresh.unwrap_or(false),
            off: raw.risk_duplicate_addresses.unwrap_or(false),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMacvlan {
    master: Option<String>,
    mode: Option<String>,
    mtu: Option<i64>,
    mac: Option<String>,
    link_in_container: Option<bool>,
    bcqueuelen: Option<u32>,
    sticky_mac: Option<bool>,
    gateway_check: Option<bool>,
}

impl NetConf {
    pub fn parse(stdin: &[u8]) -> CniResult<NetConf> {
        let (common, value) = CommonConf::parse(stdin, "sticky-macvlan")?;
        refuse_unknown_keys(&value)?;
        let raw: RawMacvlan = typed(&value, "network config")?;
        let mtu = match raw.mtu.unwrap_or(0) {
            m if (0..=i64::from(u32::MAX)).contains(&m) => m as u32,
            m => {
                return Err(CniError::invalid_config(format!(
                "mtu {m} is invalid: it must be between 0 (inherit the master's) and the master's MTU"
            )))
            }
        };
        Ok(NetConf {
            common,
            master: raw.master.filter(|m| !m.is_empty()),
            mode: MacvlanMode::parse(raw.mode.as_deref().unwrap_or(""))?,
            mtu,
            mac: raw.mac.filter(|m| !m.is_empty()),
            link_in_container: raw.link_in_container.unwrap_or(false),
            bc_queue_len: raw.bcqueuelen,
            probe: ProbeConf::from_config(&value)?,
            sticky_mac: raw.sticky_mac.unwrap_or(false),
            gateway_check: raw.gateway_check.unwrap_or(false),
        })
    }
}

#[cfg(test)]
#[path = "netconf_tests.rs"]
mod tests;
