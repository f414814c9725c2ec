//! Crash-safe file primitives for the file store: write to a temporary
//! file and rename (fsynced when it must survive a power loss), read
//! without following symlinks, and name damaged records so an operator can
//! remove them.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use serde::{de::DeserializeOwned, Serialize};

use super::{StoreError, StoreResult};

pub(super) fn io_err(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("cannot {what} {}: {e}", path.display()))
}

pub fn make_dir(path: &Path) -> StoreResult<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| io_err("create directory", path, e))
}

pub(super) fn fsync_dir(path: &Path) -> StoreResult<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsync directory", path, e))
}

/// Reads a file without following a symlink; None when it does not exist.
pub(super) fn read_file(path: &Path) -> StoreResult<Option<Vec<u8>>> {
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("open", path, e)),
    };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)
        .map_err(|e| io_err("read", path, e))?;
    Ok(Some(buf))
}

/// Writes via a temporary file and rename; fsyncs the file when `durable`.
pub fn write_atomic(path: &Path, bytes: &[u8], durable: bool) -> StoreResult<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| io_err("create", &tmp, e))?;
    f.write_all(bytes).map_err(|e| io_err("write", &tmp, e))?;
    if durable {
        f.sync_all().map_err(|e| io_err("fsync", &tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| io_err("rename into place", path, e))
}

pub(super) fn remove_file(path: &Path) -> StoreResult<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(io_err("remove", path, e)),
        _ => Ok(()),
    }
}

/// The network a record belongs to (the directory above `claims/`,
/// `identities/` or `holders/`) and the record's name for `release --file`
/// (a claim by its file name, an index with its directory).
pub(super) fn record_name(path: &Path) -> (String, String) {
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let dir = name(path.parent());
    let file = name(Some(path));
    let network = name(path.parent().and_then(Path::parent));
    let record = if dir == super::file::CLAIMS {
        file
    } else {
        format!("{dir}/{file}")
    };
    (network, record)
}

pub(super) fn damaged(path: &Path, why: impl std::fmt::Display) -> StoreError {
    let (network, record) = record_name(path);
    StoreError::Damaged(format!(
            "record {} is damaged ({why}): inspect it with `sticky-macvlan claims`, then repair it or remove it with `sticky-macvlan release --network {network} --file {record}` (the indexes are rebuilt from the claims)",
            path.display(),
    ))
}

pub(super) fn decode<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> StoreResult<T> {
    if bytes.is_empty() {
        return Err(damaged(path, "empty file"));
    }
    serde_json::from_slice(bytes).map_err(|e| damaged(path, e))
}

pub(super) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing our own plain structs cannot fail.
    let mut out = serde_json::to_vec_pretty(value).unwrap_or_default();
    out.push(b'\n');
    out
}
