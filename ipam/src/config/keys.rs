//! The keys of our `ipam` object; a typo among them is an error (code 2)
//! naming it, never a silent default: a misspelt `reservations` would hand
//! a reserved address to anyone.

use serde_json::Value;

use cni::CniResult;

/// The keys of an `ipam` section of ours.
pub const IPAM_KEYS: &[&str] = &[
    "type",
    "subnet",
    "rangeStart",
    "rangeEnd",
    "gateway",
    "ranges",
    "routes",
    "exclude",
    "reservations",
    "identity",
    "identityPolicy",
    "identityFrom",
    "dataDir",
    "store",
    "nodeName",
    "maxScan",
    "criSocket",
    "retention",
];

/// host-local keys accepted so a NAD converts by changing `type`, with no
/// effect here.
pub const HOST_LOCAL_ONLY_KEYS: &[&str] = &[
    // host-local reads DNS from this file; macvlan (ours and the
    // reference) never passes an IPAM's dns on, so it changes nothing.
    "resolvConf",
];

pub const STORE_KEYS: &[&str] = &["type", "dir", "kubeconfig", "timeoutMs"];
pub const RANGE_KEYS: &[&str] = &["subnet", "rangeStart", "rangeEnd", "gateway"];
pub const RESERVATION_KEYS: &[&str] = &["ip", "namespaces"];
pub const RETENTION_KEYS: &[&str] = &["whenScaled", "whenDeleted"];

/// A typo among our keys is an error (code 2) naming it, never a silent
/// default: a misspelt `reservations` would hand a reserved address to
/// anyone.
pub(super) fn refuse_unknown_keys(ipam: &Value) -> CniResult<()> {
    use cni::keys::{refuse_unknown_in, ROUTE_KEYS};
    refuse_unknown_in(ipam, "ipam", IPAM_KEYS, &[HOST_LOCAL_ONLY_KEYS])?;
    if let Some(store) = ipam.get("store") {
        refuse_unknown_in(store, "ipam.store", STORE_KEYS, &[])?;
    }
    if let Some(retention) = ipam.get("retention") {
        refuse_unknown_in(retention, "ipam.retention", RETENTION_KEYS, &[])?;
    }
    for (i, set) in ipam
        .get("ranges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (j, range) in set.as_array().into_iter().flatten().enumerate() {
            refuse_unknown_in(range, &format!("ipam.ranges[{i}][{j}]"), RANGE_KEYS, &[])?;
        }
    }
    for (i, route) in ipam
        .get("routes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        refuse_unknown_in(route, &format!("ipam.routes[{i}]"), ROUTE_KEYS, &[])?;
    }
    for (id, reservation) in ipam
        .get("reservations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        refuse_unknown_in(
            reservation,
            &format!("ipam.reservations[{id:?}]"),
            RESERVATION_KEYS,
            &[],
        )?;
    }
    Ok(())
}
