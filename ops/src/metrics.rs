//! Prometheus metrics of `reconcile --metrics-addr`. The plugin is a
//! short-lived process on every node, so its counts are not kept by it:
//! the reconcile Deployment reads them from what the API already holds,
//! with no request added to any ADD. Per network, the IPClaims give the
//! addresses held, reserved and dead, and the NetworkAttachmentDefinitions
//! the size of the ranges; the Events the plugins post (`events.rs`, one
//! per refusal, takeover and reclaim, labelled with the network) give the
//! counters, by how much each Event's count grew (a repeated refusal is
//! one Event whose count rises), keyed by its UID. Counters start at the
//! Events the API still holds when the process starts (kube-apiserver keeps
//! them an hour by default) and only grow after that, as Prometheus
//! counters do across a restart of their process. Rendering is pure and
//! tested here; `serve` is the HTTP side.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// What one sweep saw of a network.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkGauges {
    /// Addresses in the network's ranges (from its NADs), when known.
    pub range: Option<f64>,
    pub held: u64,
    pub reserved: u64,
    /// Held by an attachment liveness judged dead (reconcile frees them).
    pub dead: u64,
    /// Released on a judgement and kept until a probe confirms them
    /// (tombstones): only an exhausted pool reuses them, so not free.
    pub released: u64,
}

/// Network name -> addresses in its ranges, from NAD configs (a plugin
/// config or a conflist; the `ipam` of type sticky-ipam). A config that
/// does not parse is skipped: the plugin refuses it at ADD anyway.
pub fn ranges_of(configs: &[String]) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for text in configs {
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(text) else {
            continue;
        };
        let name = doc["name"].as_str().unwrap_or_default().to_string();
        let plugins = match doc["plugins"].as_array() {
            Some(list) => list.clone(),
            None => vec![doc.clone()],
        };
        for p in plugins {
            if p["ipam"]["type"] != "sticky-ipam" {
                continue;
            }
            let Ok(conf) = sticky_ipam::config::IpamConfig::parse(&name, &p["ipam"]) else {
                continue;
            };
            let size = conf.allocatable_addresses() as f64;
            let e = out.entry(name.clone()).or_default();
            *e = e.max(size);
        }
    }
    out
}

pub use sticky_ipam::events::SeenEvent;

#[derive(Debug, Default)]
pub struct Metrics {
    pub networks: BTreeMap<String, NetworkGauges>,
    /// (network, reason) -> Events counted.
    events: BTreeMap<(String, String), u64>,
    /// Event UID -> the count already added.
    seen: BTreeMap<String, u64>,
    /// network -> holders reconcile released.
    released: BTreeMap<String, u64>,
    sweeps: u64,
    failed_sweeps: u64,
    api_errors: u64,
    last_sweep_seconds: f64,
}

/// The Event reasons that are refusals (`cni::Refusal::reason`), and the
/// two that report a handover.
fn kind_of(reason: &str) -> &'static str {
    match reason {
        sticky_ipam::events::TAKEN_OVER => "takeover",
        sticky_ipam::events::RECLAIMED => "reclaim",
        _ => "refusal",
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Adds what each Event's count grew by since it was last seen (a
    /// repeated refusal bumps one Event's count).
    pub fn observe_events(&mut self, events: &[SeenEvent]) {
        for e in events {
            let count = e.count.max(1);
            let before = self.seen.insert(e.uid.clone(), count).unwrap_or(0);
            if count > before {
                *self
                    .events
                    .entry((e.network.clone(), e.reason.clone()))
                    .or_default() += count - before;
            }
        }
    }

    pub fn released(&mut self, network: &str, n: u64) {
        *self.released.entry(network.to_string()).or_default() += n;
    }

    /// A sweep ended: `ok` false when it stopped on an error.
    pub fn swept(&mut self, seconds: f64, ok: bool) {
        self.sweeps += 1;
        if !ok {
            self.failed_sweeps += 1;
        }
        self.last_sweep_seconds = seconds;
    }

    /// A request to the API failed.
    pub fn api_error(&mut self) {
        self.api_errors += 1;
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let net = |n: &str| format!("{{network=\"{}\"}}", escape(n));
        family(
            "sticky_macvlan_range_addresses",
            "gauge",
            "Addresses the network's ranges can hand out (less network, broadcast, gateway and excluded addresses), from its NetworkAttachmentDefinitions (the largest when several define it).",
            self.networks
                .iter()
                .filter_map(|(n, g)| Some((net(n), g.range?)))
                .collect(),
        );
        let mut by_state = Vec::new();
        for (n, g) in &self.networks {
            for (state, v) in [
                ("held", g.held),
                ("reserved", g.reserved),
                ("dead", g.dead),
                ("released", g.released),
            ] {
                by_state.push((
                    format!("{{network=\"{}\",state=\"{state}\"}}", escape(n)),
                    v as f64,
                ));
            }
        }
        family(
            "sticky_macvlan_addresses",
            "gauge",
            "Claimed addresses by state: held by a live attachment, reserved for a sticky identity with no holder, held by an attachment judged dead, or released on a judgement and kept until a probe confirms the address (an exhausted pool reuses those).",
            by_state,
        );
        family(
            "sticky_macvlan_free_addresses",
            "gauge",
            "Addresses of the ranges no claim takes (range less claims; excluded addresses and gateways count as free here).",
            self.networks
                .iter()
                .filter_map(|(n, g)| {
                    let claimed = (g.held + g.reserved + g.dead + g.released) as f64;
                    Some((net(n), (g.range? - claimed).max(0.0)))
                })
                .collect(),
        );
        for (kind, name, help) in [
            (
                "refusal",
                "sticky_macvlan_refusals_total",
                "ADDs refused with a reason a person acts on, from the plugins' Warning Events.",
            ),
            (
                "takeover",
                "sticky_macvlan_takeovers_total",
                "Addresses taken over from another pod's holder judged dead, from the plugins' Events.",
            ),
            (
                "reclaim",
                "sticky_macvlan_reclaims_total",
                "Addresses reclaimed from another identity on an exhausted pool, from the plugins' Events.",
            ),
        ] {
            let samples = self
                .events
                .iter()
                .filter(|((_, reason), _)| kind_of(reason) == kind)
                .map(|((n, reason), v)| {
                    let labels = if kind == "refusal" {
                        format!("{{network=\"{}\",reason=\"{}\"}}", escape(n), escape(reason))
                    } else {
                        net(n)
                    };
                    (labels, *v as f64)
                })
                .collect();
            family(name, "counter", help, samples);
        }
        family(
            "sticky_macvlan_reconcile_released_total",
            "counter",
            "Holders confirmed dead that reconcile released.",
            self.released
                .iter()
                .map(|(n, v)| (net(n), *v as f64))
                .collect(),
        );
        family(
            "sticky_macvlan_reconcile_sweeps_total",
            "counter",
            "Sweeps reconcile made.",
            vec![(String::new(), self.sweeps as f64)],
        );
        family(
            "sticky_macvlan_reconcile_failed_sweeps_total",
            "counter",
            "Sweeps that stopped on an error.",
            vec![(String::new(), self.failed_sweeps as f64)],
        );
        family(
            "sticky_macvlan_api_errors_total",
            "counter",
            "Kubernetes API requests of reconcile that failed.",
            vec![(String::new(), self.api_errors as f64)],
        );
        family(
            "sticky_macvlan_reconcile_sweep_duration_seconds",
            "gauge",
            "How long the last sweep took.",
            vec![(String::new(), self.last_sweep_seconds)],
        );
        out
    }
}

/// Serves `GET /metrics` from `page` on `addr`, on a thread of its own;
/// anything else is 404. Errors binding are returned, later ones logged.
pub fn serve(addr: &str, page: Arc<Mutex<String>>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let mut line = String::new();
            let Ok(reader) = conn.try_clone() else {
                continue;
            };
            let mut reader = BufReader::new(reader);
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // The headers are read and dropped: nothing in them matters.
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = if line.starts_with("GET ")
                && (path == "/metrics" || path.starts_with("/metrics?"))
            {
                let body = page.lock().map(|p| p.clone()).unwrap_or_default();
                ("200 OK", body)
            } else {
                ("404 Not Found", "only /metrics is served\n".to_string())
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(())
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
