//! The DaemonSet's install: its token through a rollout, the upgrade
//! from the previous release, and the helm chart's install, upgrade and
//! reinstall.

use super::*;

/// The claims of the token the installer left on NODE for the plugin.
fn plugin_token_claims(c: &LocalCluster, node: &str) -> serde_json::Value {
    use base64::Engine;
    let file = c
        .node_disk(node)
        .join("etc-cni-net.d/sticky-macvlan.d/token");
    let token =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let payload = token.split('.').nth(1).expect("a JWT has a payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .expect("base64url payload");
    serde_json::from_slice(&bytes).expect("JSON payload")
}

/// Puts the sticky-macvlan DaemonSet back as deploy/ has it on drop
/// (a test that patched it rolls it out again) and waits for the rollout.
struct DaemonSetRestore<'a>(&'a LocalCluster);

impl Drop for DaemonSetRestore<'_> {
    fn drop(&mut self) {
        let _ = self.0.try_kubectl(&[
            "-n",
            "kube-system",
            "patch",
            "daemonset",
            "sticky-macvlan",
            "--type=merge",
            "-p",
            r#"{"spec":{"template":{"spec":{"affinity":null}}}}"#,
        ]);
        self.0.settle_daemonset();
    }
}

/// The token the installer writes is bound to the node, so the plugin's
/// credentials outlive the installer pod: a DaemonSet rollout (a template
/// change) that also takes the installer off one node entirely, with pods
/// started on every node while it runs; all get their addresses, and so
/// does a pod started on the node whose installer pod is gone.
#[test]
fn the_plugins_token_outlives_the_installer_pod_through_a_daemonset_rollout() {
    let Some(c) =
        cluster("the_plugins_token_outlives_the_installer_pod_through_a_daemonset_rollout")
    else {
        return;
    };
    let ns = c.namespace("rollout");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    c.apply(&fabric_db_nad(&c, &ns));
    let nodes = c.nodes();
    for n in &nodes {
        let claims = plugin_token_claims(&c, n);
        assert_eq!(
            claims["kubernetes.io"]["node"]["name"],
            n.as_str(),
            "{n}: the plugin's token is bound to its node: {claims}"
        );
        assert!(
            claims["kubernetes.io"]["pod"].is_null(),
            "{n}: and not to the installer pod: {claims}"
        );
    }
    let spared = nodes[0].clone();
    let _restore = DaemonSetRestore(&c);
    let t = Instant::now();
    let affinity = format!(
        r#"{{"spec":{{"template":{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"kubernetes.io/hostname","operator":"NotIn","values":["{spared}"]}}]}}]}}}}}}}}}}}}}}"#
    );
    c.kubectl(&[
        "-n",
        "kube-system",
        "patch",
        "daemonset",
        "sticky-macvlan",
        "--type=merge",
        "-p",
        &affinity,
    ]);
    for n in &nodes {
        c.apply(&pinned_pod(&ns, &format!("during-{n}"), n, "fabric-db"));
    }
    c.wait(
        "no installer pod left on the spared node",
        2 * MINUTE,
        || match c.installer_pods(Some(&spared)) {
            Some(0) => Ok(()),
            n => Err(format!("{n:?} installer pods on {spared}")),
        },
    );
    let mut all = BTreeSet::new();
    for n in &nodes {
        let pod = format!("during-{n}");
        c.wait_running(&ns, &pod, &[], 2 * MINUTE);
        let addrs = c.pod_addrs(&ns, &pod, "net1");
        assert_dual_stack(&pod, &addrs);
        all.extend(addrs);
    }
    c.apply(&pinned_pod(&ns, "after", &spared, "fabric-db"));
    c.wait_running(&ns, "after", &[], 2 * MINUTE);
    let addrs = c.pod_addrs(&ns, "after", "net1");
    assert_dual_stack("after", &addrs);
    all.extend(addrs);
    assert_eq!(
        all.len(),
        2 * (nodes.len() + 1),
        "distinct addresses: {all:?}"
    );
    eprintln!(
        "rollout: {} pods started during a DaemonSet rollout and 1 on {spared} after its installer pod was gone, all attached, in {:.1} s",
        nodes.len(),
        t.elapsed().as_secs_f64()
    );
}

/// Puts this release's install back on drop, after the upgrade test took
/// it down to start from the previous release.
struct InstallRestored<'a>(&'a LocalCluster);

impl Drop for InstallRestored<'_> {
    fn drop(&mut self) {
        self.0.restore_install();
    }
}

/// How many times kubelet reported a failed sandbox for NS/POD: each is an
/// ADD that failed and was retried.
fn failed_sandboxes(c: &LocalCluster, ns: &str, pod: &str) -> u64 {
    let sel = format!("involvedObject.name={pod},reason=FailedCreatePodSandBox");
    c.json(&["-n", ns, "get", "events", "--field-selector", &sel])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["count"].as_u64().unwrap_or(1))
        .sum()
}

/// A running cluster upgraded from the previous release (0.1.0, built from
/// its commit by scripts/cluster.sh build, installed from the manifests it
/// shipped) by applying this release's deploy/ as the README says, with
/// pods started on every node while the DaemonSet rolls: the running pods
/// keep their addresses, the claims 0.1.0 wrote (held and reserved) hand
/// the same addresses back to this release's plugin, which adds what 0.1.0
/// did not write (conditions; the retention defaults come from the CRD);
/// `doctor` on every node then finds nothing wrong.
#[test]
fn upgrading_a_running_cluster_from_the_previous_release_keeps_every_address() {
    let Some(c) =
        cluster("upgrading_a_running_cluster_from_the_previous_release_keeps_every_address")
    else {
        return;
    };
    let previous = c.previous_release();
    let nodes = c.nodes();
    let _restore = InstallRestored(&c);
    c.uninstall();
    c.install_release(&previous.manifests);
    for n in &nodes {
        let v = c.installed_version(n);
        assert!(
            v.contains(&previous.version),
            "{n}: {} installed {v:?}, not {}",
            previous.image,
            previous.version
        );
    }
    let ns = c.namespace("upgrade");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    let nad = "nad-sticky-statefulset.yaml";
    let old_nad = std::fs::read_to_string(previous.examples.join(nad)).unwrap_or_default();
    assert_eq!(
        old_nad,
        c.example(nad),
        "a NAD written for {} works unchanged",
        previous.version
    );
    c.apply(&fabric_db_nad(&c, &ns));
    c.apply(&statefulset(&ns, "db", 3, "fabric-db"));
    for p in sts_pods(3) {
        c.wait_running(&ns, &p, &[], 2 * MINUTE);
    }
    let before = db_attached_distinct(&c, &ns, 3, &format!("{} installed", previous.version));
    // db-2's claims are left reserved by the previous release.
    scale_db(&c, &ns, 2);
    c.wait_gone(&ns, "db-2", 2 * MINUTE);
    c.wait("db-2's claims reserved", MINUTE, || {
        let k = claims_of_identity(&c, &format!("{ns}/db-2"));
        if k.len() == 2 && k.values().all(|k| k["status"]["phase"] == "Reserved") {
            Ok(())
        } else {
            Err(format!("{k:?}"))
        }
    });
    let untouched_uids: Vec<String> = ["db-0", "db-1"].iter().map(|p| uid(&c, &ns, p)).collect();
    for k in claims_of_identity(&c, &format!("{ns}/db-1")).values() {
        assert!(
            k["status"]["conditions"].is_null(),
            "{} writes no conditions: {k}",
            previous.version
        );
    }

    // The upgrade: this release's deploy/, in its files' order.
    let t = Instant::now();
    c.apply_release(&c.install_set());
    for n in &nodes {
        c.apply(&pinned_pod(&ns, &format!("during-{n}"), n, "fabric-db"));
    }
    c.wait_rolled_out();
    let rolled = t.elapsed();
    let version = env!("CARGO_PKG_VERSION");
    for n in &nodes {
        let v = c.installed_version(n);
        assert!(v.contains(version), "{n}: {v:?} installed, not {version}");
        let claims = plugin_token_claims(&c, n);
        assert_eq!(
            claims["kubernetes.io"]["node"]["name"],
            n.as_str(),
            "{n}: the upgraded installer wrote a node-bound token: {claims}"
        );
    }
    let mut during = BTreeSet::new();
    let mut retried = Vec::new();
    for n in &nodes {
        let pod = format!("during-{n}");
        c.wait_running(&ns, &pod, &[], 2 * MINUTE);
        let addrs = c.pod_addrs(&ns, &pod, "net1");
        assert_dual_stack(&pod, &addrs);
        during.extend(addrs);
        retried.push(failed_sandboxes(&c, &ns, &pod));
    }
    let attached = t.elapsed();
    let db_addrs: BTreeSet<IpAddr> = before.values().flatten().copied().collect();
    assert_eq!(
        during.len(),
        2 * nodes.len(),
        "distinct addresses for the pods started during the rollout: {during:?}"
    );
    assert!(
        during.is_disjoint(&db_addrs),
        "no pod started during the rollout got a db address: {during:?} vs {db_addrs:?}"
    );

    // The pods that ran through the upgrade were not touched.
    for (p, was) in ["db-0", "db-1"].iter().zip(&untouched_uids) {
        assert_eq!(&uid(&c, &ns, p), was, "{p} ran through the upgrade");
        assert_eq!(
            Some(&c.pod_addrs(&ns, p, "net1")),
            before.get(*p),
            "{p} keeps its addresses"
        );
    }
    // The claims the previous release wrote give the same addresses back:
    // db-2's reserved ones, and db-0's held ones once db-0 is replaced.
    scale_db(&c, &ns, 3);
    c.kubectl(&["-n", &ns, "delete", "pod", "db-0", "--wait=true"]);
    for p in sts_pods(3) {
        c.wait_running(&ns, &p, &[], 2 * MINUTE);
    }
    let after = db_attached_distinct(&c, &ns, 3, "the upgrade");
    assert_eq!(
        after, before,
        "every db pod on its addresses from before the upgrade"
    );
    for p in ["db-0", "db-2"] {
        for k in claims_of_identity(&c, &format!("{ns}/{p}")).values() {
            let types: Vec<&str> = k["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["type"].as_str())
                .collect();
            assert_eq!(
                types,
                ["Held", "Reserved"],
                "{p}: rewritten by {version}: {k}"
            );
        }
    }
    for k in claims_of_identity(&c, &format!("{ns}/db-1")).values() {
        assert_eq!(
            k["spec"]["owner"]["retention"],
            serde_json::json!({"whenScaled": "Retain", "whenDeleted": "Delete"}),
            "db-1's claim, written by {} only, reads the CRD's retention defaults: {k}",
            previous.version
        );
    }
    // doctor on every node, with the plugin's own kubeconfig: the node's
    // binaries are the DaemonSet's image, and nothing is wrong.
    for n in &nodes {
        let out = std::process::Command::new("nsenter")
            .args(["-t", &c.node_pid(n), "-n", "-m", "-u", "--"])
            .args(["/opt/cni/bin/sticky-macvlan", "doctor", "--json"])
            .output()
            .expect("run doctor on the node");
        let findings: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{n}: doctor printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let daemonset = findings
            .as_array()
            .into_iter()
            .flatten()
            .find(|f| f["check"] == "daemonset")
            .cloned()
            .unwrap_or_default();
        assert!(
            daemonset["severity"] == "ok"
                && daemonset["what"]
                    .as_str()
                    .is_some_and(|w| w.contains(&format!("this node has {version}"))),
            "{n}: doctor compares the DaemonSet with the node: {findings:#}"
        );
        assert_eq!(out.status.code(), Some(0), "{n}: doctor: {findings:#}");
    }
    let table = c.kubectl(&["get", "ipclaims"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.contains("NETWORK") && header.contains("STATE"),
        "the new columns: {header}"
    );
    eprintln!(
        "upgrade {} -> {version}: DaemonSet rolled out on {} nodes in {:.1} s; {} pods started during it attached within {:.1} s (failed sandboxes retried by kubelet per pod: {retried:?}); db-0..2 kept their addresses",
        previous.version,
        nodes.len(),
        rolled.as_secs_f64(),
        nodes.len(),
        attached.as_secs_f64()
    );
}

/// The release name the chart's docs give.
const HELM_RELEASE: &str = "sticky-macvlan";

/// Uninstalls the helm release a test made (whatever it left), before the
/// plain install is put back for the tests after it.
struct HelmReleaseRemoved<'a>(&'a LocalCluster);

impl Drop for HelmReleaseRemoved<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.try_helm(&[
            "uninstall",
            HELM_RELEASE,
            "--namespace",
            "kube-system",
            "--ignore-not-found",
            "--wait",
            "--timeout=120s",
        ]) {
            eprintln!("cleanup: helm uninstall {HELM_RELEASE}: {e}");
        }
    }
}

/// The chart as a user installs it: `helm install` of charts/sticky-macvlan
/// (the image this build made, already on every node) where the plain
/// install was removed. A StatefulSet gets its addresses; `helm upgrade`
/// with changed values rolls the DaemonSet while the pods run and keeps
/// every address; `helm uninstall` removes the release but leaves the
/// CRDs and every claim (helm.sh/resource-policy: keep); installing again
/// under the same name adopts the CRDs, and the StatefulSet's pods,
/// replaced, come back on their addresses.
#[test]
fn the_helm_chart_installs_upgrades_and_reinstalls_keeping_every_address() {
    let Some(c) = cluster("the_helm_chart_installs_upgrades_and_reinstalls_keeping_every_address")
    else {
        return;
    };
    let _restore = InstallRestored(&c);
    c.uninstall();
    let _release = HelmReleaseRemoved(&c);
    let chart = c.chart_dir();
    let chart = chart.to_string_lossy();
    let install = [
        "install",
        HELM_RELEASE,
        &chart,
        "--namespace",
        "kube-system",
    ];
    c.helm(&install);
    c.wait_rolled_out();
    let daemonset = || c.json(&["-n", "kube-system", "get", "daemonset", "sticky-macvlan"]);
    assert_eq!(
        daemonset()["metadata"]["annotations"]["meta.helm.sh/release-name"],
        HELM_RELEASE,
        "the DaemonSet is the release's"
    );
    let (test_ns, _claims) = setup_statefulset(&c, "helm", 3);
    let ns = test_ns.name.clone();
    let before = db_attached_distinct(&c, &ns, 3, "installed by helm");
    let uids: Vec<String> = sts_pods(3).iter().map(|p| uid(&c, &ns, p)).collect();

    // An upgrade that changes the DaemonSet's pod template, pods running.
    let generation = daemonset()["metadata"]["generation"].as_u64().unwrap_or(0);
    c.helm(&[
        "upgrade",
        HELM_RELEASE,
        &chart,
        "--namespace",
        "kube-system",
        "--set",
        "installer.resources.requests.cpu=6m",
        "--set",
        "reconcile.interval=30",
    ]);
    c.wait_rolled_out();
    let rolled = daemonset()["metadata"]["generation"].as_u64().unwrap_or(0);
    assert!(
        rolled > generation,
        "the upgrade changed the DaemonSet's template: generation {generation} -> {rolled}"
    );
    let reconcile = c.json(&[
        "-n",
        "kube-system",
        "get",
        "deployment",
        "sticky-macvlan-reconcile",
    ]);
    let command = reconcile["spec"]["template"]["spec"]["containers"][0]["command"].to_string();
    assert!(
        command.contains(r#""--interval","30""#),
        "the upgraded values: {command}"
    );
    for (p, was) in sts_pods(3).iter().zip(&uids) {
        assert_eq!(&uid(&c, &ns, p), was, "{p} ran through the upgrade");
        assert_eq!(
            Some(&c.pod_addrs(&ns, p, "net1")),
            before.get(p.as_str()),
            "{p} keeps its addresses through the upgrade"
        );
    }

    // Uninstall: the release goes, the CRDs and the claims stay.
    c.helm(&[
        "uninstall",
        HELM_RELEASE,
        "--namespace",
        "kube-system",
        "--wait",
        "--timeout=120s",
    ]);
    c.wait_installer_pods_gone("helm uninstall");
    assert!(
        c.try_kubectl(&["-n", "kube-system", "get", "daemonset", "sticky-macvlan"])
            .is_err(),
        "helm uninstall removed the DaemonSet"
    );
    for crd in ["ipclaims.sticky-macvlan.io", "iplocks.sticky-macvlan.io"] {
        c.try_kubectl(&["get", "crd", crd])
            .unwrap_or_else(|e| panic!("helm uninstall must keep the CRD {crd}: {e}"));
    }
    for p in sts_pods(3) {
        let kept = claims_of_identity(&c, &format!("{ns}/{p}"));
        assert_eq!(
            kept.len(),
            2,
            "{p}: its v4 and v6 claims outlive the release: {kept:?}"
        );
    }

    // Reinstall under the same name: the kept CRDs are adopted, and the
    // pods, replaced, get their addresses back.
    c.helm(&install);
    c.wait_rolled_out();
    let pods = sts_pods(3);
    let mut delete = vec!["-n", ns.as_str(), "delete", "pod", "--wait=true"];
    delete.extend(pods.iter().map(String::as_str));
    c.kubectl(&delete);
    for p in &pods {
        c.wait_running(&ns, p, &[], 2 * MINUTE);
    }
    let after = db_attached_distinct(&c, &ns, 3, "reinstalled by helm");
    assert_eq!(
        after, before,
        "every db pod back on its addresses after the reinstall"
    );
}
