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
mod tests {
    use super::*;

    fn event(uid: &str, network: &str, reason: &str) -> SeenEvent {
        SeenEvent {
            uid: uid.into(),
            network: network.into(),
            reason: reason.into(),
            count: 1,
        }
    }

    #[test]
    fn a_repeated_events_count_adds_only_what_it_grew_by() {
        let mut m = Metrics::default();
        let seen = |count| SeenEvent {
            count,
            ..event("u1", "fabric", "StickyAddressHeld")
        };
        let total = |m: &Metrics| m.events.values().sum::<u64>();
        m.observe_events(&[seen(1)]);
        m.observe_events(&[seen(1)]);
        assert_eq!(total(&m), 1);
        m.observe_events(&[seen(4)]);
        assert_eq!(total(&m), 4);
        // First seen with a count already (reconcile started late).
        m.observe_events(&[SeenEvent {
            count: 3,
            ..event("u2", "fabric", "StickyAddressHeld")
        }]);
        assert_eq!(total(&m), 7);
    }

    #[test]
    fn gauges_counters_and_the_text_format() {
        let mut m = Metrics::default();
        m.networks.insert(
            "fabric".into(),
            NetworkGauges {
                range: Some(10.0),
                held: 6,
                reserved: 2,
                dead: 0,
                released: 1,
            },
        );
        m.networks.insert(
            "nad-less".into(),
            NetworkGauges {
                held: 1,
                ..NetworkGauges::default()
            },
        );
        m.observe_events(&[
            event("u1", "fabric", "StickyPoolExhausted"),
            event("u2", "fabric", "StickyPoolExhausted"),
            event("u3", "fabric", "StickyAddressTakenOver"),
            event("u4", "fabric", "StickyAddressReclaimed"),
        ]);
        // Listed again next sweep: counted once.
        m.observe_events(&[
            event("u1", "fabric", "StickyPoolExhausted"),
            event("u5", "fabric", "StickyAddressHeld"),
        ]);
        m.released("fabric", 3);
        m.swept(0.25, true);
        m.swept(0.5, false);
        m.api_error();
        m.api_error();
        let text = m.render();
        for line in [
            "sticky_macvlan_range_addresses{network=\"fabric\"} 10",
            "sticky_macvlan_addresses{network=\"fabric\",state=\"held\"} 6",
            "sticky_macvlan_addresses{network=\"fabric\",state=\"reserved\"} 2",
            "sticky_macvlan_addresses{network=\"fabric\",state=\"released\"} 1",
            "sticky_macvlan_addresses{network=\"nad-less\",state=\"held\"} 1",
            "sticky_macvlan_free_addresses{network=\"fabric\"} 1",
            "sticky_macvlan_refusals_total{network=\"fabric\",reason=\"StickyPoolExhausted\"} 2",
            "sticky_macvlan_refusals_total{network=\"fabric\",reason=\"StickyAddressHeld\"} 1",
            "sticky_macvlan_takeovers_total{network=\"fabric\"} 1",
            "sticky_macvlan_reclaims_total{network=\"fabric\"} 1",
            "sticky_macvlan_reconcile_released_total{network=\"fabric\"} 3",
            "sticky_macvlan_reconcile_sweeps_total 2",
            "sticky_macvlan_reconcile_failed_sweeps_total 1",
            "sticky_macvlan_api_errors_total 2",
            "sticky_macvlan_reconcile_sweep_duration_seconds 0.5",
            "# TYPE sticky_macvlan_refusals_total counter",
            "# TYPE sticky_macvlan_addresses gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        // No range known: no range or free sample for that network.
        assert!(!text.contains("sticky_macvlan_free_addresses{network=\"nad-less\"}"));
        // Every sample line is `name{labels} value` or `name value`.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = l.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "{l}");
        }
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }

    #[test]
    fn ranges_come_from_the_nads_sticky_ipam_sections() {
        let configs = [
            r#"{"cniVersion":"1.0.0","name":"fabric","type":"sticky-macvlan","master":"eth1","ipam":{"type":"sticky-ipam","subnet":"10.0.0.0/24","rangeStart":"10.0.0.10","rangeEnd":"10.0.0.13"}}"#,
            // The same network defined wider in another namespace: the larger.
            r#"{"cniVersion":"1.0.0","name":"fabric","type":"sticky-macvlan","master":"eth1","ipam":{"type":"sticky-ipam","subnet":"10.0.0.0/24","rangeStart":"10.0.0.10","rangeEnd":"10.0.0.19"}}"#,
            r#"{"cniVersion":"1.0.0","name":"listed","plugins":[{"type":"sticky-macvlan","master":"eth1","ipam":{"type":"sticky-ipam","ranges":[[{"subnet":"10.1.0.0/29"}],[{"subnet":"fd00::/126"}]]}}]}"#,
            r#"{"cniVersion":"1.0.0","name":"theirs","type":"macvlan","ipam":{"type":"whereabouts","range":"10.2.0.0/24"}}"#,
            // Excluded addresses are not in the pool: 10 less the /30.
            r#"{"cniVersion":"1.0.0","name":"cut","type":"sticky-macvlan","master":"eth1","ipam":{"type":"sticky-ipam","subnet":"10.3.0.0/24","rangeStart":"10.3.0.10","rangeEnd":"10.3.0.19","exclude":["10.3.0.12/30"]}}"#,
            "not json",
        ]
        .map(String::from);
        let r = ranges_of(&configs);
        // 10.0.0.10-19: ten addresses, none of them special.
        assert_eq!(r.get("fabric"), Some(&10.0));
        assert!(r.get("listed").is_some_and(|n| *n > 0.0));
        assert_eq!(r.get("theirs"), None);
        assert_eq!(r.get("cut"), Some(&6.0));
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn the_server_answers_metrics_and_nothing_else() {
        let page = Arc::new(Mutex::new(
            "sticky_macvlan_reconcile_sweeps_total 1\n".to_string(),
        ));
        // A free port on loopback.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        serve(&format!("127.0.0.1:{port}"), page).unwrap();
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut out = String::new();
            std::io::Read::read_to_string(&mut s, &mut out).unwrap();
            out
        };
        let ok = get("/metrics");
        assert!(
            ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("sweeps_total 1\n"),
            "{ok}"
        );
        assert!(ok.contains("text/plain; version=0.0.4"));
        assert!(get("/").starts_with("HTTP/1.1 404"));
    }
}
