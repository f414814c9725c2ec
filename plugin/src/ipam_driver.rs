//! IPAM drivers. `"type": "sticky-ipam"` runs in-process (the `sticky-ipam`
//! crate, no exec); any other `ipam.type` is a binary on CNI_PATH run with
//! the standard protocol by `DelegatedIpam`, exactly as the reference
//! macvlan does, so host-local, static and whereabouts work behind us.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use serde_json::Value;

use sticky_ipam::cni_ipam::{Attachment, Granted, PreparedAdd, StickyIpam};

use crate::cni::conf::IpamSection;
use crate::cni::{code, CniEnv, CniError, CniOutput, CniResult, CniVersion, Command};
use crate::datapath::macvlan::with_cleanup;
use crate::netconf::NetConf;

/// What `Ipam::prepare_add` checked before the plugin created anything;
/// `Ipam::add` takes it, so the order cannot be got wrong.
pub enum Prepared {
    /// A delegate checks nothing ahead.
    Nothing,
    Sticky(Box<PreparedAdd>),
}

/// What `Ipam::add` allocated: the result, the addresses the wire must
/// confirm free before they are bound, and how `Ipam::undo_add` undoes it.
pub struct Allocation {
    pub result: CniOutput,
    pub unproven: Vec<std::net::IpAddr>,
    undo: Undo,
}

impl Allocation {
    /// An allocation that only the IPAM's DEL can undo (a delegate's).
    pub fn undone_by_del(result: CniOutput, unproven: Vec<std::net::IpAddr>) -> Allocation {
        Allocation {
            result,
            unproven,
            undo: Undo::Delete,
        }
    }
}

enum Undo {
    /// A delegate only knows DEL.
    Delete,
    /// The in-process IPAM restores each claim exactly.
    Restore(Box<Granted>),
}

pub trait Ipam {
    /// Checks what ADD will ask for before the plugin creates anything.
    fn prepare_add(&mut self) -> CniResult<Prepared> {
        Ok(Prepared::Nothing)
    }
    /// `probe_fresh` is `probe.fresh`: whether every new address is
    /// unproven, not only those the IPAM cannot vouch for.
    fn add(&mut self, prepared: Prepared, probe_fresh: bool) -> CniResult<Allocation>;
    /// Undoes `allocation` after a later step of ADD failed.
    fn undo_add(&mut self, allocation: Allocation) -> CniResult<()>;
    /// The ADD succeeded with `allocation`, its unproven addresses
    /// confirmed on the wire: sticky-ipam records that confirmation (the
    /// claims' `unconfirmed` marks go) and tells the pod what it took from
    /// whom (Events). Best effort.
    fn succeeded(&mut self, _allocation: &Allocation) {}
    /// A later step refused the ADD (the wire answered): tell the pod.
    /// Best effort.
    fn report_refusal(&mut self, _err: &CniError) {}
    fn del(&mut self) -> CniResult<()>;
    fn check(&mut self) -> CniResult<()>;
    fn status(&mut self) -> CniResult<()>;
    /// `keep`: the (containerID, ifname) attachments the runtime still has.
    fn gc(&mut self, keep: &[(String, String)]) -> CniResult<()>;
}

/// The one ADD of an IPAM, for both binaries: allocate, hand the
/// allocation to `bind` (confirm its unproven addresses on the wire, put
/// them on the interface, make the answer), then record the success; when
/// `bind` fails, tell the pod and undo the allocation, so nothing stays
/// claimed for an address the wire refused or for an answer the runtime
/// never gets (invariant: a failed ADD leaves nothing behind).
pub fn add_and_bind<T>(
    ipam: &mut dyn Ipam,
    prepared: Prepared,
    probe_fresh: bool,
    bind: impl FnOnce(&Allocation) -> CniResult<T>,
) -> CniResult<T> {
    let allocation = ipam.add(prepared, probe_fresh)?;
    match bind(&allocation) {
        Ok(answer) => {
            ipam.succeeded(&allocation);
            Ok(answer)
        }
        Err(e) => {
            ipam.report_refusal(&e);
            let undo = ipam
                .undo_add(allocation)
                .map_err(|u| u.context("cannot release the IPAM after a failed ADD"));
            Err(with_cleanup(e, undo))
        }
    }
}

/// The `ipam.type` served in-process.
pub const IN_PROCESS: &str = "sticky-ipam";

/// The driver for an `ipam` section.
pub fn for_section(
    section: &IpamSection,
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
) -> CniResult<Box<dyn Ipam>> {
    if section.plugin_type == IN_PROCESS {
        let attachment = Attachment::new(env, &conf.common);
        return Ok(Box::new(StickyIpam::new(
            &conf.common.name,
            &section.raw,
            attachment,
        )?));
    }
    Ok(Box::new(DelegatedIpam::new(
        &section.plugin_type,
        &env.path,
        stdin,
        conf.common.cni_version,
    )))
}

impl Ipam for StickyIpam {
    fn prepare_add(&mut self) -> CniResult<Prepared> {
        StickyIpam::prepare_add(self).map(|p| Prepared::Sticky(Box::new(p)))
    }
    fn add(&mut self, prepared: Prepared, probe_fresh: bool) -> CniResult<Allocation> {
        let prepared = match prepared {
            Prepared::Sticky(p) => *p,
            Prepared::Nothing => StickyIpam::prepare_add(self)?,
        };
        let granted = StickyIpam::add(self, prepared)?;
        Ok(Allocation {
            result: granted.output.clone(),
            unproven: self.must_confirm(&granted, probe_fresh),
            undo: Undo::Restore(Box::new(granted)),
        })
    }
    fn undo_add(&mut self, allocation: Allocation) -> CniResult<()> {
        match allocation.undo {
            Undo::Restore(granted) => StickyIpam::undo_add(self, *granted),
            Undo::Delete => self.del(),
        }
    }
    fn succeeded(&mut self, allocation: &Allocation) {
        if let Undo::Restore(granted) = &allocation.undo {
            StickyIpam::succeeded(self, granted);
        }
    }
    fn report_refusal(&mut self, err: &CniError) {
        StickyIpam::report_refusal(self, err);
    }
    fn del(&mut self) -> CniResult<()> {
        StickyIpam::del(self)
    }
    fn check(&mut self) -> CniResult<()> {
        StickyIpam::check(self)
    }
    fn status(&mut self) -> CniResult<()> {
        StickyIpam::status(self)
    }
    fn gc(&mut self, keep: &[(String, String)]) -> CniResult<()> {
        StickyIpam::gc(self, keep)
    }
}

/// Finds `plugin` in a colon-separated CNI_PATH.
pub fn find_in_path(plugin: &str, cni_path: &str) -> CniResult<PathBuf> {
    for dir in cni_path.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(plugin);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(CniError::invalid_config(format!(
        "ipam plugin {plugin:?} not found in CNI_PATH {cni_path:?}: install it there or fix ipam.type"
    )))
}

pub struct DelegatedIpam {
    plugin: String,
    cni_path: String,
    stdin: Vec<u8>,
    version: CniVersion,
}

impl DelegatedIpam {
    pub fn new(plugin: &str, cni_path: &str, stdin: &[u8], version: CniVersion) -> DelegatedIpam {
        DelegatedIpam {
            plugin: plugin.into(),
            cni_path: cni_path.into(),
            stdin: stdin.to_vec(),
            version,
        }
    }

    /// Runs the delegate with our environment and CNI_COMMAND set to `cmd`,
    /// returning its stdout on success.
    fn exec(&self, cmd: Command) -> CniResult<Vec<u8>> {
        let path = find_in_path(&self.plugin, &self.cni_path)?;
        let context = format!("ipam plugin {:?} {}", self.plugin, cmd.as_str());
        let mut child = Process::new(&path)
            .env("CNI_COMMAND", cmd.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                CniError::new(
                    code::IPAM_DELEGATE,
                    format!("{context}: cannot run {}: {e}", path.display()),
                )
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            // A delegate that exits without reading stdin is not our error.
            let _ = stdin.write_all(&self.stdin);
        }
        let out = child.wait_with_output().map_err(|e| {
            CniError::new(
                code::IPAM_DELEGATE,
                format!("{context}: cannot wait for it: {e}"),
            )
        })?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        Err(decode_delegate_error(
            &out.stdout,
            &context,
            out.status.code(),
        ))
    }
}

/// Turns a delegate's error output into our error, keeping its code so
/// kubelet sees e.g. "try again later" from the IPAM unchanged.
fn decode_delegate_error(stdout: &[u8], context: &str, exit: Option<i32>) -> CniError {
    if let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(stdout) {
        if let Some(code) = obj.get("code").and_then(Value::as_u64) {
            let msg = obj.get("msg").and_then(Value::as_str).unwrap_or("");
            let details = obj.get("details").and_then(Value::as_str).unwrap_or("");
            return CniError::new(
                u32::try_from(code).unwrap_or(code::IPAM_DELEGATE),
                format!("{context}: {msg}"),
            )
            .with_details(details);
        }
    }
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    let exit = exit
        .map(|c| format!("exit code {c}"))
        .unwrap_or_else(|| "killed by a signal".into());
    CniError::new(
        code::IPAM_DELEGATE,
        format!(
            "{context} failed ({exit}) without a CNI error: {:.300}",
            text
        ),
    )
}

impl Ipam for DelegatedIpam {
    /// A delegate cannot say how it chose its addresses: with
    /// `probe.fresh` every one is unproven, else none (host-local's
    /// contract: a range per node).
    fn add(&mut self, _prepared: Prepared, probe_fresh: bool) -> CniResult<Allocation> {
        let result = self.add_result()?;
        let unproven = if probe_fresh {
            result.ips.iter().map(|i| i.address.addr()).collect()
        } else {
            Vec::new()
        };
        Ok(Allocation::undone_by_del(result, unproven))
    }

    fn undo_add(&mut self, _allocation: Allocation) -> CniResult<()> {
        self.del()
    }

    fn del(&mut self) -> CniResult<()> {
        self.exec(Command::Del).map(drop)
    }

    fn check(&mut self) -> CniResult<()> {
        self.exec(Command::Check).map(drop)
    }

    fn status(&mut self) -> CniResult<()> {
        self.exec(Command::Status).map(drop)
    }

    fn gc(&mut self, keep: &[(String, String)]) -> CniResult<()> {
        self.gc_delegate(keep)
    }
}

impl DelegatedIpam {
    fn add_result(&mut self) -> CniResult<CniOutput> {
        let out = self.exec(Command::Add)?;
        let context = format!("ipam plugin {:?} ADD", self.plugin);
        let value: Value = serde_json::from_slice(&out).map_err(|e| {
            CniError::new(
                code::IPAM_DELEGATE,
                format!("{context} printed a result that is not JSON: {e}"),
            )
        })?;
        let result =
            CniOutput::from_json(&value, self.version, &format!("the result of {context}"))?;
        if result.ips.is_empty() {
            return Err(CniError::new(
                code::IPAM_DELEGATE,
                format!("{context} returned no IP addresses"),
            ));
        }
        Ok(result)
    }

    fn gc_delegate(&mut self, _keep: &[(String, String)]) -> CniResult<()> {
        // The delegate reads the attachments from the config itself.
        self.exec(Command::Gc).map(drop)
    }
}

#[cfg(test)]
#[path = "ipam_driver_tests.rs"]
mod tests;
