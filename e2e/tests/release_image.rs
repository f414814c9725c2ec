//! The release as scripts/image.sh builds it (scripts/cluster.sh build
//! makes it in target/cluster/release-image): the arm64 binaries run, under
//! Debian's qemu-user-static with the image's own arm64 file system as
//! their root, and answer as the x86_64 ones do; the image is an OCI index
//! of both platforms with its labels and entrypoint (read with skopeo).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use sticky_e2e::repo_root;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn release_dir() -> PathBuf {
    let dir = repo_root().join("target/cluster/release-image");
    assert!(
        dir.join("sticky-macvlan-image.tar").exists(),
        "{} has no image: scripts/cluster.sh build (or scripts/image.sh --out {}) makes it",
        dir.display(),
        dir.display()
    );
    dir
}

/// Runs `sticky-macvlan ARGS` of PLATFORM's image file system ("amd64"
/// natively, "arm64" under qemu), with ENV and STDIN; a CNI_NETNS that does
/// not exist, so that nothing can touch a network namespace.
fn run_plugin(platform: &str, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let rootfs = release_dir().join("rootfs").join(platform);
    let binary = rootfs.join("sticky-macvlan");
    let mut cmd = if platform == "amd64" {
        Command::new(&binary)
    } else {
        let mut c = Command::new("qemu-aarch64-static");
        c.arg("-L").arg(&rootfs).arg(&binary);
        c
    };
    cmd.args(args)
        .env_clear()
        .envs(env.iter().copied())
        .env("CNI_NETNS", "/nonexistent/sticky-macvlan-smoke")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?}: {e} (qemu-aarch64-static is Debian's qemu-user-static)")
    });
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(stdin.as_bytes());
    }
    child.wait_with_output().expect("wait for the plugin")
}

/// The ELF machine of a binary: 62 is x86-64, 183 AArch64.
fn elf_machine(path: &PathBuf) -> u16 {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is not ELF", path.display());
    u16::from_le_bytes([bytes[18], bytes[19]])
}

#[test]
fn the_arm64_binaries_run_and_answer_as_the_x86_64_ones() {
    let dir = release_dir();
    for (platform, machine) in [("amd64", 62), ("arm64", 183)] {
        for b in ["sticky-macvlan", "sticky-ipam"] {
            let path = dir.join("rootfs").join(platform).join(b);
            assert_eq!(elf_machine(&path), machine, "{}", path.display());
        }
    }
    for b in ["sticky-macvlan", "sticky-ipam"] {
        assert_eq!(
            std::fs::read(dir.join("bin-aarch64").join(b)).ok(),
            std::fs::read(dir.join("rootfs/arm64").join(b)).ok(),
            "bin-aarch64/{b} is the image's"
        );
    }

    let version = run_plugin("arm64", &["version"], &[], "");
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.status.success() && text.contains(VERSION),
        "arm64 sticky-macvlan version: {:?} {text:?} {}",
        version.status,
        String::from_utf8_lossy(&version.stderr)
    );

    // A config error: the same CNI error (code 7, the same message) and
    // exit status from both architectures, before any namespace is used.
    let config =
        r#"{"cniVersion":"1.0.0","name":"smoke","type":"sticky-macvlan","mode":"nonsense"}"#;
    let env = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "smoke"),
        ("CNI_IFNAME", "net1"),
        ("CNI_PATH", "/nonexistent"),
    ];
    let answers: Vec<(Option<i32>, Value)> = ["amd64", "arm64"]
        .iter()
        .map(|p| {
            let out = run_plugin(p, &[], &env, config);
            let reply: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "{p}: no CNI error on stdout ({e}): {:?} {}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            });
            (out.status.code(), reply)
        })
        .collect();
    assert_eq!(answers[0].1["code"], 7, "amd64: {:?}", answers[0]);
    assert_ne!(
        answers[0].0,
        Some(0),
        "a config error fails: {:?}",
        answers[0]
    );
    assert_eq!(answers[0], answers[1], "arm64 answers as amd64 does");
}

fn skopeo(args: &[&str]) -> Value {
    let archive = format!(
        "oci-archive:{}",
        release_dir().join("sticky-macvlan-image.tar").display()
    );
    let out = sticky_e2e::run(Command::new("skopeo").args(args).arg(&archive));
    serde_json::from_slice(&out.stdout).expect("skopeo prints JSON")
}

#[test]
fn the_image_is_an_index_of_both_platforms_with_its_labels_and_entrypoint() {
    let index = skopeo(&["inspect", "--raw"]);
    assert_eq!(
        index["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{index:#}"
    );
    let mut platforms: Vec<String> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap_or_default(),
                m["platform"]["architecture"].as_str().unwrap_or_default()
            )
        })
        .collect();
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{index:#}");
    for arch in ["amd64", "arm64"] {
        let config = skopeo(&[
            "--override-os",
            "linux",
            "--override-arch",
            arch,
            "inspect",
            "--config",
        ]);
        eprintln!("{arch}: {config}");
        assert_eq!(config["architecture"], arch, "{config:#}");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/sticky-macvlan"]),
            "{config:#}"
        );
        let labels = &config["config"]["Labels"];
        assert_eq!(
            labels["org.opencontainers.image.version"], VERSION,
            "{config:#}"
        );
        assert_eq!(
            labels["org.opencontainers.image.title"], "sticky-macvlan",
            "{config:#}"
        );
        let revision = labels["org.opencontainers.image.revision"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(
            revision.len(),
            40,
            "the commit it was built from: {config:#}"
        );
        // Reproducible: the commit's time, not the build's.
        let committed = sticky_e2e::run(
            Command::new("git")
                .args(["show", "-s", "--format=%ct", revision])
                .current_dir(repo_root()),
        );
        let epoch = String::from_utf8_lossy(&committed.stdout)
            .trim()
            .to_string();
        let date = sticky_e2e::run(Command::new("date").args([
            "-u",
            "-d",
            &format!("@{epoch}"),
            "+%Y-%m-%dT%H:%M:%SZ",
        ]));
        assert_eq!(
            config["created"],
            String::from_utf8_lossy(&date.stdout).trim(),
            "created at commit {revision}'s time: {config:#}"
        );
    }
}
