//! Installing the plugin on the local cluster: the install set of
//! deploy/, the chart with helm, the previous release for the upgrade
//! test, and the waits that make each scenario start from a node whose
//! plugin works.

use super::*;

impl LocalCluster {
    /// "thin" or "thick": how the cluster runs Multus (`up --multus`).
    pub fn multus_mode(&self) -> String {
        std::fs::read_to_string(self.root.join(".cluster/multus.mode"))
            .map(|m| m.trim().to_string())
            .unwrap_or_else(|_| "thin".into())
    }

    /// Installs sticky-macvlan as the README tells a user to
    /// (`kubectl apply -f deploy/`: the CRDs, the RBAC, the node-scope
    /// policy and the DaemonSet), then waits until every node's installer
    /// has run.
    pub fn install(&self) {
        self.install_release(&self.install_set());
    }

    /// This release's examples/ (NADs and workloads).
    pub fn examples_dir(&self) -> PathBuf {
        self.root.join("examples")
    }

    /// This release's install set: the files directly in deploy/, in the
    /// order their numeric prefixes give (the order `kubectl apply -f
    /// deploy/` applies them in); deploy/optional/ is not part of it.
    pub fn install_set(&self) -> Vec<PathBuf> {
        crate::yaml_files(&self.root.join("deploy"))
    }

    /// The same from MANIFESTS (a release's install set), then waits for
    /// the DaemonSet's rollout to reach every node.
    pub fn install_release(&self, manifests: &[PathBuf]) {
        self.apply_release(manifests);
        self.wait_rolled_out();
    }

    /// Applies MANIFESTS in order; a file the release did not ship is
    /// skipped.
    pub fn apply_release(&self, manifests: &[PathBuf]) {
        for path in manifests {
            if path.exists() {
                self.kubectl(&["apply", "-f", &path.to_string_lossy()]);
            }
        }
    }

    /// Puts this release's install back after a test that took it down,
    /// for the tests after it; a cleanup, so failures are reported, not
    /// raised.
    pub fn restore_install(&self) {
        for path in self.install_set() {
            if let Err(e) = self.try_kubectl(&["apply", "-f", &path.to_string_lossy()]) {
                eprintln!("cleanup: kubectl apply -f {}: {e}", path.display());
            }
        }
        self.settle_daemonset();
    }

    /// After a cleanup changed the DaemonSet: waits (up to 3 minutes) for
    /// its rollout, reporting rather than raising a failure.
    pub fn settle_daemonset(&self) {
        if let Err(e) = self.try_kubectl(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "daemonset/sticky-macvlan",
            "--timeout=180s",
        ]) {
            eprintln!("cleanup: the sticky-macvlan DaemonSet did not roll out: {e}");
        }
    }

    /// Waits until the DaemonSet's latest template runs, ready, on every
    /// node.
    pub fn wait_rolled_out(&self) {
        let nodes = self.nodes().len();
        self.wait(
            "the sticky-macvlan DaemonSet rolled out and ready on every node",
            Duration::from_secs(180),
            || {
                let ds = self.json(&["-n", "kube-system", "get", "daemonset", "sticky-macvlan"]);
                let ready = ds["status"]["numberReady"].as_u64().unwrap_or(0) as usize;
                let updated = ds["status"]["updatedNumberScheduled"].as_u64().unwrap_or(0) as usize;
                let observed = ds["status"]["observedGeneration"] == ds["metadata"]["generation"];
                if ready >= nodes && updated >= nodes && observed {
                    Ok(())
                } else {
                    Err(format!(
                        "{ready}/{nodes} ready, {updated} updated, generation observed: {observed}"
                    ))
                }
            },
        );
        for node in self.nodes() {
            self.wait_plugin_credentials(&node);
        }
    }

    /// Waits until the plugin on NODE can use its credentials: a request
    /// made in the node's namespaces with the kubeconfig the installer
    /// wrote there is answered, not refused with a 401. A rolled-out DaemonSet is not enough: a node
    /// whose Node object was deleted and registered again keeps a token
    /// naming the old Node's UID, which the API server refuses (401) until
    /// the installer writes a new one, and no scenario may depend on how
    /// long ago the one before it did that to a node.
    pub fn wait_plugin_credentials(&self, node: &str) {
        let kubeconfig = "/etc/cni/net.d/sticky-macvlan.d/sticky-macvlan.kubeconfig";
        self.wait(
            &format!("{node}: the plugin's credentials ({kubeconfig}) accepted by the API server"),
            Duration::from_secs(180),
            || {
                let out = Command::new("nsenter")
                    .args(["-t", &self.node_pid(node), "-n", "-m", "-u", "--"])
                    .arg(&self.kubectl)
                    .args(["--kubeconfig", kubeconfig, "--request-timeout=10s"])
                    // A SelfSubjectReview: any valid token may make one, so
                    // only a rejected token (401) fails it, whatever the
                    // release's RBAC.
                    .args(["auth", "whoami", "-o", "json"])
                    .output()
                    .map_err(|e| format!("nsenter: {e}"))?;
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
                }
            },
        );
    }

    /// Removes what `install_release` applied (the installed binaries stay
    /// on the nodes, as after a user's `kubectl delete`); deleting the CRDs
    /// deletes every IPClaim and IPLock.
    pub fn uninstall(&self) {
        for path in self.install_set().iter().rev() {
            self.kubectl(&[
                "delete",
                "--ignore-not-found",
                "--wait=true",
                "--timeout=120s",
                "-f",
                &path.to_string_lossy(),
            ]);
        }
        self.wait_installer_pods_gone("the install set deleted");
    }

    /// Waits (up to 2 minutes) until no sticky-macvlan installer pod is
    /// left, AFTER what removed the DaemonSet.
    pub fn wait_installer_pods_gone(&self, after: &str) {
        self.wait(
            &format!("no sticky-macvlan installer pod left after {after}"),
            Duration::from_secs(120),
            || match self.installer_pods(None) {
                Some(0) => Ok(()),
                n => Err(format!("{n:?} pods")),
            },
        );
    }

    /// How many sticky-macvlan installer pods exist (on NODE, if given);
    /// None for a listing without items.
    pub fn installer_pods(&self, node: Option<&str>) -> Option<usize> {
        let mut args = vec![
            "-n".to_string(),
            "kube-system".into(),
            "get".into(),
            "pods".into(),
            "-l".into(),
            "app.kubernetes.io/name=sticky-macvlan".into(),
        ];
        if let Some(node) = node {
            args.extend(["--field-selector".into(), format!("spec.nodeName={node}")]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.json(&args)["items"].as_array().map(Vec::len)
    }

    /// The previous release `scripts/cluster.sh build` made from this
    /// repository's history, for the upgrade test.
    pub fn previous_release(&self) -> PreviousRelease {
        let dir = self.root.join("target/cluster/previous");
        let file = dir.join("release");
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: scripts/cluster.sh build makes the previous release",
                file.display()
            )
        });
        let mut words = text.split_whitespace();
        PreviousRelease {
            version: words.next().unwrap_or_default().to_string(),
            image: words.next().unwrap_or_default().to_string(),
            manifests: PREVIOUS_RELEASE_MANIFESTS
                .iter()
                .map(|f| dir.join("examples").join(f))
                .collect(),
            examples: dir.join("examples"),
        }
    }

    /// The chart a user installs with helm.
    pub fn chart_dir(&self) -> PathBuf {
        self.root.join("charts/sticky-macvlan")
    }

    /// helm ARGS against this cluster: helm from its pinned module
    /// (`scripts/cluster.sh build`), its state in .cluster/helm rather than
    /// in the home directory. Its stdout, or its stderr as the error.
    pub fn try_helm(&self, args: &[&str]) -> Result<String, String> {
        let state = self.root.join(".cluster/helm");
        let out = Command::new(self.root.join("target/cluster/bin/helm"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HELM_CACHE_HOME", state.join("cache"))
            .env("HELM_CONFIG_HOME", state.join("config"))
            .env("HELM_DATA_HOME", state.join("data"))
            .output()
            .map_err(|e| format!("cannot run helm (scripts/cluster.sh build makes it): {e}"))?;
        stdout_or_stderr(out)
    }

    pub fn helm(&self, args: &[&str]) -> String {
        self.try_helm(args)
            .unwrap_or_else(|e| panic!("helm {}: {e}", args.join(" ")))
    }

    /// `sticky-macvlan version` of the binary installed on NODE.
    pub fn installed_version(&self, node: &str) -> String {
        let binary = self.node_disk(node).join("opt-cni-bin/sticky-macvlan");
        let out = crate::run(Command::new(&binary).arg("version"));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// The files of the previous release's examples/ that installed it, in its
/// README's order (0.1.0 kept its install set in examples/; this release's
/// is deploy/).
const PREVIOUS_RELEASE_MANIFESTS: [&str; 4] = [
    "ipclaim-crd.yaml",
    "rbac.yaml",
    "node-scope-policy.yaml",
    "daemonset.yaml",
];

/// A release built from history: its version, the image its DaemonSet
/// names (imported into every node), its install set and its examples/.
pub struct PreviousRelease {
    pub version: String,
    pub image: String,
    pub manifests: Vec<PathBuf>,
    pub examples: PathBuf,
}
