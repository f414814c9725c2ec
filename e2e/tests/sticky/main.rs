//! sticky-ipam through the real binaries on real namespaces: the field
//! reports in the docs/src/developer/tested.md, restarts, scale-down/up, refusals,
//! concurrency, kill -9 at varied points, and the standalone IPAM behind
//! the reference macvlan.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sticky_e2e::scenario::{call, pod_args};
use sticky_e2e::store::{assert_invariants, claims, holder_of};
use sticky_e2e::{
    configs, links_in, our_ipam, our_plugin, reference_plugin, CniCall, CniReply, Pod, Topology,
    SUBNET_PREFIX,
};

const NET: &str = "macnet";

fn default_pod_args(name: &str, uid: &str) -> String {
    pod_args("default", name, uid)
}

mod crashes;
mod field_reports;
mod refusals;
mod standalone;
