//! The fault matrix: the plugin is killed (SIGKILL, from a crash point the
//! debug build honours through `STICKY_FAULT`) at every step of ADD and
//! DEL, on the file store and on the kubernetes store, and then kubelet's
//! next step runs: a retried ADD, or DEL followed by a new sandbox.
//! Afterwards I1-I5 (ARCHITECTURE.md) are checked against what was written and
//! what is in the namespaces: no duplicate address, one address per
//! identity, no claim left held by a sandbox that is gone, no leaked link,
//! and an identity that had an address still has it.
//!
//! Prints the matrix: faults injected, recovered, violations.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sticky_e2e::kube_api::ApiServer;
use sticky_e2e::{configs, links_in, our_plugin, CniCall, CniReply, Pod, Topology};

#[derive(Clone, Copy, PartialEq)]
enum Store {
    File,
    Kube,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::File => "file",
            Store::Kube => "kubernetes",
        }
    }
}

/// One claim as either store holds it, for the invariant check.
struct Seen {
    ip: String,
    identity: String,
    sticky: bool,
    holder: Option<String>,
}

/// The stand-in's IPClaim objects of the test network, as `Seen`.
fn seen_objects(api: &ApiServer) -> Vec<Seen> {
    api.claims()
        .iter()
        .map(|c| Seen {
            ip: c["spec"]["ip"].as_str().unwrap_or_default().into(),
            identity: c["spec"]["identity"].as_str().unwrap_or_default().into(),
            sticky: c["spec"]["sticky"].as_bool().unwrap_or(false),
            holder: c["status"]["holder"]["containerID"]
                .as_str()
                .map(String::from),
        })
        .collect()
}

/// Section 3's invariants, with every sandbox gone: each problem, named.
fn violations(claims: &[Seen], kept: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut per_ip: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_identity: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in claims {
        *per_ip.entry(&c.ip).or_default() += 1;
        per_identity.entry(&c.identity).or_default().push(&c.ip);
        if let Some(h) = &c.holder {
            out.push(format!(
                "{} is still held by {h}, whose sandbox is gone",
                c.ip
            ));
        }
        if !c.sticky {
            out.push(format!("{} is a dynamic claim left behind", c.ip));
        }
    }
    for (ip, n) in per_ip.iter().filter(|(_, n)| **n > 1) {
        out.push(format!("{ip} is claimed {n} times"));
    }
    for (id, ips) in per_identity.iter().filter(|(_, ips)| ips.len() > 1) {
        out.push(format!("identity {id} holds {ips:?}"));
    }
    for (id, ip) in kept {
        if per_identity.get(id.as_str()).map(|v| v.as_slice()) != Some(&[ip.as_str()][..]) {
            out.push(format!("identity {id} lost its address {ip}"));
        }
    }
    out
}

mod api_faults;
mod crash_points;
mod load;
