//! What a pod's interface looks like from inside its netns, from `ip -j`,
//! reduced to what must match between two plugins (no random MACs,
//! indexes, lifetimes or MAC-derived link-local addresses).

use std::process::Command;

use serde_json::{json, Value};

fn ip_json(netns: &str, args: &[&str]) -> Value {
    let out = Command::new("ip")
        .args(["-n", netns, "-j"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip: {e}"));
    if !out.status.success() {
        return Value::Null;
    }
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn pick(obj: &Value, keys: &[&str]) -> Value {
    let mut out = serde_json::Map::new();
    for k in keys {
        if let Some(v) = obj.get(*k) {
            out.insert((*k).to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// Link, addresses and routes of `ifname` in `netns`; Null if it is absent.
pub fn interface_state(netns: &str, ifname: &str) -> Value {
    let link = ip_json(netns, &["-d", "link", "show", "dev", ifname]);
    let Some(link) = link.as_array().and_then(|a| a.first()).cloned() else {
        return Value::Null;
    };
    let up = link["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "UP"));
    let info = &link["linkinfo"];
    let link_view = json!({
        "ifname": link["ifname"],
        "mtu": link["mtu"],
        "txqlen": link["txqlen"],
        "link_type": link["link_type"],
        "up": up,
        "kind": info["info_kind"],
        "mode": info["info_data"]["mode"],
    });

    let addrs = ip_json(netns, &["addr", "show", "dev", ifname]);
    let mut addr_view: Vec<Value> = addrs
        .as_array()
        .and_then(|a| a.first())
        .and_then(|l| l["addr_info"].as_array())
        .map(|infos| {
            infos
                .iter()
                .filter(|a| !(a["family"] == "inet6" && a["scope"] == "link"))
                .map(|a| pick(a, &["family", "local", "prefixlen", "broadcast", "scope"]))
                .collect()
        })
        .unwrap_or_default();
    addr_view.sort_by_key(|v| v.to_string());

    let mut route_view = Vec::new();
    for family in ["-4", "-6"] {
        if let Some(routes) = ip_json(netns, &[family, "route", "show", "table", "all"]).as_array()
        {
            for r in routes {
                let dst = r["dst"].as_str().unwrap_or("");
                if dst.starts_with("fe80:")
                    || dst.starts_with("ff00:")
                    || r["type"] == "local"
                    || r["type"] == "multicast"
                    || r["type"] == "broadcast"
                {
                    continue;
                }
                if r["dev"] != ifname {
                    continue;
                }
                route_view.push(pick(
                    r,
                    &[
                        "dst", "gateway", "dev", "protocol", "scope", "metric", "prefsrc", "table",
                        "type",
                    ],
                ));
            }
        }
    }
    route_view.sort_by_key(|v| v.to_string());
    json!({"link": link_view, "addrs": addr_view, "routes": route_view})
}

/// The MAC of `ifname` in `netns`.
pub fn mac_of(netns: &str, ifname: &str) -> Option<String> {
    let link = ip_json(netns, &["link", "show", "dev", ifname]);
    link.as_array()?
        .first()?
        .get("address")?
        .as_str()
        .map(str::to_string)
}

/// Every link name in `netns` except lo.
pub fn link_names(netns: &str) -> Vec<String> {
    let links = ip_json(netns, &["link", "show"]);
    links
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l["ifname"].as_str())
                .filter(|n| *n != "lo")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A result with what legitimately differs between runs removed: the
/// random MAC, the sandbox path, and an empty `dns` (the reference prints
/// `"dns":{}`, we omit it as the spec allows).
pub fn normalize_result(result: &Value) -> Value {
    let mut r = result.clone();
    if let Some(obj) = r.as_object_mut() {
        if obj
            .get("dns")
            .is_some_and(|d| d.as_object().is_some_and(|m| m.is_empty()))
        {
            obj.remove("dns");
        }
        if let Some(ifaces) = obj.get_mut("interfaces").and_then(Value::as_array_mut) {
            for i in ifaces {
                if let Some(o) = i.as_object_mut() {
                    o.remove("mac");
                    o.remove("sandbox");
                }
            }
        }
    }
    r
}
