//! The link's life: the master, born in the pod netns under a temporary
//! name and renamed (retrying a clash), a retried ADD's own leftover, and
//! DEL's removal.

use super::{datapath, CreatedLink, LinkSpec, Master};
use crate::cni::{CniError, CniResult};
use crate::datapath::{format_mac, LinkState, Netlink, NewMacvlan, Ns};
use crate::log;
use cni::fault;

/// Attempts at a free temporary name before giving up (names are random,
/// so a clash twice in a row means something is very wrong).
const TMP_NAME_ATTEMPTS: usize = 5;

/// Finds the master (configured, or the interface of the default route) and
/// validates the requested MTU against it. `link_in_container` looks in the
/// pod netns instead of the node's.
pub fn resolve_master(
    nl: &mut dyn Netlink,
    master: Option<&str>,
    link_in_container: bool,
    mtu: u32,
) -> CniResult<Master> {
    let ns = if link_in_container { Ns::Pod } else { Ns::Node };
    let name = match master {
        Some(m) => m.to_string(),
        None => nl.default_route_link(ns).map_err(datapath)?.ok_or_else(|| {
            CniError::invalid_config(format!(
                "no \"master\" is configured and the {ns} has no default route to take it from: set \"master\" to the uplink interface"
            ))
        })?,
    };
    let link = nl.link_by_name(ns, &name).map_err(datapath)?.ok_or_else(|| {
        CniError::invalid_config(format!(
            "master interface {name:?} not found in the {ns}: set \"master\" to an existing interface"
        ))
    })?;
    if mtu > link.mtu {
        return Err(CniError::invalid_config(format!(
            "mtu {mtu} is invalid: it must be between 0 and the MTU of master {name:?} ({})",
            link.mtu
        )));
    }
    Ok(Master {
        name,
        index: link.index,
        mtu: link.mtu,
        ns,
    })
}

fn random_suffix() -> u32 {
    let mut buf = [0u8; 4];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == buf.len() as isize {
        return u32::from_ne_bytes(buf);
    }
    // getrandom cannot fail for 4 bytes on a booted kernel; stay unique anyway.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

pub fn tmp_name() -> String {
    format!("{TMP_PREFIX}{:08x}", random_suffix())
}

const TMP_PREFIX: &str = "smv";

/// A macvlan only we name this way: created, never renamed, because the
/// ADD died in between (kill -9, a node crash).
pub(super) fn is_our_leftover(link: &LinkState) -> bool {
    link.kind.as_deref() == Some("macvlan")
        && link.name.len() == TMP_PREFIX.len() + 8
        && link
            .name
            .strip_prefix(TMP_PREFIX)
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Creates the macvlan in the pod netns under a temporary name (a name
/// clash with the node's interfaces is impossible that way, and a clash in
/// the pod is retried) and renames it to `ifname`. On any failure nothing
/// is left behind.
/// The alias our links carry: which attachment made them, so a retried
/// ADD of that same attachment knows a link it finds is its own.
pub fn owner_alias(container_id: &str, ifname: &str) -> String {
    // IFALIASZ is 256 bytes with the NUL; container IDs are 64 hex digits.
    let mut alias = format!("sticky-macvlan {container_id}/{ifname}");
    alias.truncate(alias.floor_char_boundary(255));
    alias
}

/// An ADD of this attachment that was killed after the rename left its
/// interface behind: the runtime's retry replaces it instead of failing on
/// "already exists". A link of that name made by anyone else is left
/// alone, and the create below refuses.
pub fn replace_own_leftover(nl: &mut dyn Netlink, ifname: &str, alias: &str) -> CniResult<()> {
    let Some(link) = nl.link_by_name(Ns::Pod, ifname).map_err(datapath)? else {
        return Ok(());
    };
    if link.kind.as_deref() != Some("macvlan") || link.alias.as_deref() != Some(alias) {
        return Ok(());
    }
    log::info(&format!(
        "{ifname:?} in the pod netns is left from an earlier, interrupted ADD of this attachment: replacing it"
    ));
    remove_by_index(nl, link.index, ifname)
}

pub fn create_link(
    nl: &mut dyn Netlink,
    ifname: &str,
    alias: &str,
    master: &Master,
    spec: &LinkSpec,
) -> CniResult<CreatedLink> {
    let mut created = None;
    for _ in 0..TMP_NAME_ATTEMPTS {
        let req = NewMacvlan {
            tmp_name: tmp_name(),
            master_index: master.index,
            master_ns: master.ns,
            mode: spec.mode,
            mtu: (spec.mtu != 0).then_some(spec.mtu),
            mac: spec.mac,
            bc_queue_len: spec.bc_queue_len,
        };
        match nl.create_macvlan(&req) {
            Ok(()) => {
                created = Some(req.tmp_name);
                break;
            }
            Err(e) if e.is_exists() => {
                if let Some(mac) = spec.mac {
                    // EEXIST also means another macvlan on this master uses the MAC.
                    if nl
                        .link_by_name(Ns::Pod, &req.tmp_name)
                        .map_err(datapath)?
                        .is_none()
                    {
                        return Err(CniError::datapath(format!(
                            "cannot create macvlan on master {:?}: MAC {} is already used by another macvlan on it; choose another \"mac\"",
                            master.name,
                            format_mac(&mac)
                        )));
                    }
                }
                continue;
            }
            Err(e) => {
                return Err(CniError::datapath(format!(
                    "cannot create macvlan on master {:?}: {e}",
                    master.name
                )));
            }
        }
    }
    fault::point(fault::ADD_LINK_CREATED);
    let tmp = created.ok_or_else(|| {
        CniError::datapath(format!("cannot create macvlan on master {:?}: {TMP_NAME_ATTEMPTS} temporary names were all taken", master.name))
    })?;
    let link = match nl.link_by_name(Ns::Pod, &tmp) {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Err(CniError::datapath(format!(
                "macvlan {tmp:?} vanished from the pod netns right after creation"
            )))
        }
        Err(e) => return Err(datapath(e)),
    };
    if let Err(e) = nl.rename_link(Ns::Pod, link.index, ifname, alias) {
        let err = if e.is_exists() {
            CniError::datapath(format!(
                "interface {ifname:?} already exists in the pod netns: each attachment needs its own CNI_IFNAME"
            ))
        } else {
            CniError::datapath(format!("cannot rename macvlan {tmp:?} to {ifname:?}: {e}"))
        };
        return Err(with_cleanup(err, remove_by_index(nl, link.index, &tmp)));
    }
    fault::point(fault::ADD_LINK_RENAMED);
    Ok(CreatedLink {
        index: link.index,
        name: ifname.to_string(),
        mac: link.mac,
    })
}

fn remove_by_index(nl: &mut dyn Netlink, index: u32, name: &str) -> CniResult<()> {
    match nl.delete_link(Ns::Pod, index) {
        Ok(()) => Ok(()),
        Err(e) if e.is_no_device() => Ok(()),
        Err(e) => Err(CniError::datapath(format!(
            "cannot remove macvlan {name:?} after a failed ADD: {e}"
        ))),
    }
}

/// Appends a cleanup failure to the error that caused the cleanup.
pub fn with_cleanup(err: CniError, cleanup: CniResult<()>) -> CniError {
    match cleanup {
        Ok(()) => err,
        Err(c) => {
            CniError::combine(vec![err, c]).unwrap_or_else(|| CniError::datapath("unreachable"))
        }
    }
}

/// Rolls back a created link (for failures after `create_link`).
pub fn discard_link(nl: &mut dyn Netlink, link: &CreatedLink) -> CniResult<()> {
    remove_by_index(nl, link.index, &link.name)
}

/// DEL: removes `ifname` from the pod netns; already gone is success.
/// DEL's link work: the interface, and any macvlan an ADD that died
/// between creating and renaming it left under a temporary name (such a
/// link would otherwise stay in a live pod until its netns goes).
pub fn remove_link(nl: &mut dyn Netlink, ifname: &str) -> CniResult<()> {
    let mut doomed: Vec<LinkState> = nl
        .links(Ns::Pod)
        .map_err(datapath)?
        .into_iter()
        .filter(|l| l.name == ifname || is_our_leftover(l))
        .collect();
    // The interface first: it is what the caller is waiting for.
    doomed.sort_by_key(|l| l.name != ifname);
    let mut errors = Vec::new();
    for link in doomed {
        match nl.delete_link(Ns::Pod, link.index) {
            Ok(()) => {}
            Err(e) if e.is_no_device() => {}
            Err(e) => errors.push(CniError::datapath(format!(
                "cannot delete {:?} from the pod netns: {e}",
                link.name
            ))),
        }
    }
    CniError::combine(errors).map_or(Ok(()), Err)
}
