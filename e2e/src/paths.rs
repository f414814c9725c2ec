//! Where the repository, the build and the reference plugins are, and
//! the binaries the scenarios run (built when missing, with the command
//! to build them named).

use std::path::{Path, PathBuf};

use std::process::Command;

/// The repository's root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The `.yaml` files directly in DIR, in name order: the order
/// `kubectl apply -f DIR` applies them in.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// Where the built binaries are: target/<profile>/ next to this crate's
/// test executable.
pub fn target_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("STICKY_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// PATH, which the tests need built: panics with the command that builds
/// it when it is missing.
#[track_caller]
pub fn built(path: PathBuf, build: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: build it first ({build})",
        path.display()
    );
    path
}

/// Our standalone IPAM binary, for the reference macvlan to exec.
pub fn our_ipam() -> PathBuf {
    built(
        target_dir().join("sticky-ipam"),
        "cargo build -p sticky-macvlan",
    )
}

pub fn our_plugin() -> PathBuf {
    built(
        target_dir().join("sticky-macvlan"),
        "cargo build -p sticky-macvlan",
    )
}

/// Debian's reference plugins (containernetworking-plugins 1.1.1).
pub const DEBIAN_REFERENCE_DIR: &str = "/usr/lib/cni";

/// Where the reference plugins are: Debian's, or the directory
/// `STICKY_REFERENCE_DIR` names (scripts/test.sh runs the conformance a
/// second time against the 1.10.0 build in target/cluster/cni).
pub fn reference_dir() -> String {
    std::env::var("STICKY_REFERENCE_DIR")
        .ok()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| DEBIAN_REFERENCE_DIR.to_string())
}

/// CNI_PATH with our built binaries first, then the reference plugins.
pub fn cni_path_with_ours() -> String {
    format!("{}:{}", target_dir().display(), reference_dir())
}

pub fn reference_plugin(name: &str) -> PathBuf {
    let p = PathBuf::from(reference_dir()).join(name);
    assert!(
        p.exists(),
        "{} is missing: install the Debian package containernetworking-plugins (or, for STICKY_REFERENCE_DIR, run scripts/cluster.sh build)",
        p.display()
    );
    p
}

/// The CNI versions the reference macvlan speaks (its VERSION answer).
pub fn reference_versions() -> Vec<String> {
    let out = Command::new(reference_plugin("macvlan"))
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("reference macvlan VERSION: {e}"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["supportedVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}
