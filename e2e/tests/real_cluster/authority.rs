//! What one node's credentials may do: RBAC's verbs, the node-scope
//! policy against another node's live claim, and the reclaim it allows.

use super::*;

#[test]
fn a_verb_missing_from_the_clusterrole_is_refused_by_the_real_authorizer() {
    let Some(c) = cluster("a_verb_missing_from_the_clusterrole_is_refused_by_the_real_authorizer")
    else {
        return;
    };
    let ns = c.namespace("rbac");
    let ns = ns.name.clone();
    // The examples' ClusterRole without `create` on ipclaims, bound to a
    // service account of its own, whose token the node's plugin uses.
    let sa = format!("limited-{ns}");
    c.apply(&format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {sa}, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {sa}}}
rules:
  - apiGroups: ["sticky-macvlan.io"]
    resources: ["ipclaims"]
    verbs: ["get", "list", "update", "delete"]
  - apiGroups: ["sticky-macvlan.io"]
    resources: ["iplocks"]
    verbs: ["get", "list", "create", "delete"]
  - apiGroups: [""]
    resources: ["pods", "nodes"]
    verbs: ["get"]
  - apiGroups: ["apps"]
    resources: ["statefulsets"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {sa}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {sa}}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]
"#
    ));
    let token = c.kubectl(&["-n", &ns, "create", "token", &sa, "--duration=1h"]);
    // On every node, next to the installer's files: a kubeconfig with
    // that token.
    c.write_node_kubeconfigs(&format!("{sa}.token"), |_| token.trim().to_string());
    c.write_node_kubeconfigs(&format!("{sa}.kubeconfig"), |kc| {
        kc.replace(
            "tokenFile: /etc/cni/net.d/sticky-macvlan.d/token",
            &format!("tokenFile: /etc/cni/net.d/sticky-macvlan.d/{sa}.token"),
        )
    });
    let nad = c
        .example("nad-k8s-statefulset.yaml")
        .replace("namespace: db", &format!("namespace: {ns}"))
        .replace("name: fabric\n", "name: fabric-limited\n")
        .replace("\"name\": \"fabric\"", "\"name\": \"fabric-limited\"")
        .replace("sticky-macvlan.kubeconfig", &format!("{sa}.kubeconfig"));
    c.apply(&nad);
    c.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: p
  namespace: {ns}
  annotations: {{k8s.v1.cni.cncf.io/networks: fabric-limited}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: c, image: localhost/testbox:1, imagePullPolicy: Never, command: ["sleep", "100000"]}}
"#
    ));
    let refused = c.wait("the ADD refused by the authorizer", 2 * MINUTE, || {
        let events = c.pod_events(&ns, "p");
        events
            .iter()
            .find(|e| e.starts_with("FailedCreatePodSandBox") && e.contains("forbidden"))
            .cloned()
            .ok_or_else(|| format!("events: {events:?}"))
    });
    eprintln!("rbac: {refused}");
    assert!(
        refused.contains(&format!("system:serviceaccount:{ns}:{sa}"))
            && refused.contains("cannot create resource")
            && refused.contains("ipclaims"),
        "the message names the user, the verb and the resource: {refused}"
    );
    assert!(
        c.bound_claims("fabric-limited").is_empty(),
        "no claim was made without the create verb"
    );
    let _ = c.try_kubectl(&["delete", "clusterrolebinding", &sa]);
    let _ = c.try_kubectl(&["delete", "clusterrole", &sa]);
}

/// A kubeconfig for the admin's server and CA with the token the installer
/// left on NODE for its plugin, in DIR.
fn node_plugin_kubeconfig(
    c: &LocalCluster,
    node: &str,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let admin = c.json(&["config", "view", "--raw", "--minify"]);
    let cluster = &admin["clusters"][0]["cluster"];
    let token = std::fs::read_to_string(
        c.node_disk(node)
            .join("etc-cni-net.d/sticky-macvlan.d/token"),
    )
    .expect("the plugin's token");
    let ca = match cluster["certificate-authority-data"].as_str() {
        Some(data) => format!("certificate-authority-data: {data}"),
        None => format!(
            "certificate-authority: {}",
            cluster["certificate-authority"].as_str().expect("a CA")
        ),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    {ca}\nusers:\n- name: u\n  user:\n    token: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        cluster["server"].as_str().expect("a server"),
        token.trim()
    );
    let path = dir.join(format!("{node}.kubeconfig"));
    std::fs::write(&path, text).expect("write the kubeconfig");
    path
}

/// The exhaustion reclaim across nodes under the node-scope policy: a
/// one-address pool held by a pod on node2 whose DEL never came (its
/// Multus cache gone) is reclaimed by a pod on node1, which takes the
/// claim over (marked), re-keys the lock naming itself (marked: the
/// policy refuses node1 deleting node2's lock, or taking it unmarked),
/// deletes the claim, and gets the address.
#[test]
fn an_exhausted_pool_reclaims_another_nodes_dead_claim_and_lock_under_node_scope() {
    let Some(c) =
        cluster("an_exhausted_pool_reclaims_another_nodes_dead_claim_and_lock_under_node_scope")
    else {
        return;
    };
    let ns = c.namespace("reclaim");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    let network = "fabric-one";
    c.apply(&format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{name: {network}, namespace: {ns}}}
spec:
  config: |
    {{"cniVersion": "1.0.0", "name": "{network}", "type": "sticky-macvlan", "master": "eth1",
      "logFile": "/var/log/sticky-macvlan.log",
      "ipam": {{"type": "sticky-ipam", "subnet": "172.31.79.0/24", "rangeStart": "172.31.79.10",
        "rangeEnd": "172.31.79.10", "gateway": "172.31.79.1",
        "store": {{"type": "kubernetes", "kubeconfig": "/etc/cni/net.d/sticky-macvlan.d/sticky-macvlan.kubeconfig", "timeoutMs": 10000}}}}}}
"#
    ));
    let nodes = c.nodes();
    let (me, other) = (nodes[0].clone(), nodes[1].clone());
    c.apply(&pinned_pod(&ns, "gone", &other, network));
    c.wait_running(&ns, "gone", &[], 2 * MINUTE);
    let lock_on = |ip: &str| -> serde_json::Value {
        c.json(&["get", "iplocks"])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["spec"]["network"] == network && l["spec"]["ip"] == ip)
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    };
    let lock = lock_on("172.31.79.10");
    assert_eq!(lock["spec"]["node"], other.as_str(), "{lock}");
    let container = c
        .ipclaims()
        .into_iter()
        .find(|k| k["spec"]["network"] == network && k["status"]["holder"]["podName"] == "gone")
        .and_then(|k| {
            k["status"]["holder"]["containerID"]
                .as_str()
                .map(str::to_string)
        })
        .expect("gone's claim records its sandbox");
    lose_the_del(&c, &ns, "gone", &other, &container);
    assert_eq!(
        c.bound_claims(network).len(),
        1,
        "the dead pod's claim is still held"
    );

    let t = Instant::now();
    c.apply(&pinned_pod(&ns, "new", &me, network));
    c.wait_running(&ns, "new", &[], 2 * MINUTE);
    let addrs = c.pod_addrs(&ns, "new", "net1");
    assert_eq!(
        addrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["172.31.79.10"],
        "the pod on {me} reclaimed the pool's one address; {me}'s log: {:#?}",
        plugin_log(&c, &me, &ns)
    );
    let held = c.bound_claims(network);
    assert!(
        held.len() == 1 && held[0].pod == format!("{ns}/new") && held[0].node == me,
        "{held:?}"
    );
    let lock = lock_on("172.31.79.10");
    assert_eq!(
        lock["spec"]["node"],
        me.as_str(),
        "the new lock is {me}'s: {lock}"
    );
    eprintln!(
        "reclaim under node scope: the pod on {me} took over the one address {other}'s dead pod held, claim and lock, Running {:.1} s after it was created",
        t.elapsed().as_secs_f64()
    );
}

/// deploy/30-node-scope-policy.yaml on the real API server: node1's plugin
/// token may not release, redirect or delete a claim node2 holds, nor
/// create one naming node2, nor take it over without the unconfirmed
/// mark, nor move a claim's address; it may change its own. The same for the
/// locks, which name the node that made them; and node1's token may mint
/// the account's token only bound to node1. (Server-side dry runs:
/// admission runs, nothing is stored.)
#[test]
fn one_nodes_token_is_refused_when_it_rewrites_another_nodes_live_claim() {
    let Some(c) = cluster("one_nodes_token_is_refused_when_it_rewrites_another_nodes_live_claim")
    else {
        return;
    };
    let ns = c.namespace("scope");
    let ns = ns.name.clone();
    let _claims = ClaimsOf {
        c: &c,
        ns: ns.clone(),
    };
    c.apply(&fabric_db_nad(&c, &ns));
    let nodes = c.nodes();
    let (me, other) = (nodes[0].clone(), nodes[1].clone());
    c.apply(&pinned_pod(&ns, "theirs", &other, "fabric-db"));
    c.apply(&pinned_pod(&ns, "mine", &me, "fabric-db"));
    c.wait_running(&ns, "theirs", &[], 2 * MINUTE);
    c.wait_running(&ns, "mine", &[], 2 * MINUTE);
    let claim_of = |pod: &str| -> serde_json::Value {
        c.ipclaims()
            .into_iter()
            .find(|k| {
                k["status"]["holder"]["podName"] == pod
                    && k["status"]["holder"]["podNamespace"] == ns.as_str()
            })
            .unwrap_or_else(|| panic!("no claim held by {pod}"))
    };
    let dir = std::env::temp_dir().join(format!("sticky-scope-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = node_plugin_kubeconfig(&c, &me, &dir);
    let as_me = |args: &[&str], stdin: Option<&serde_json::Value>| -> (bool, String) {
        use std::io::Write;
        let mut cmd = std::process::Command::new(c.kubectl_binary());
        cmd.arg("--kubeconfig").arg(&kubeconfig).args(args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(v) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(v.to_string().as_bytes())
                .expect("write stdin");
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("kubectl");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let theirs = claim_of("theirs");
    let name = theirs["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let refused = |what: &str, (ok, said): (bool, String), says: &str| {
        assert!(!ok, "{what} was allowed: {said}");
        assert!(
            said.contains("sticky-macvlan-node-scope") && said.contains(says),
            "{what}: {said}"
        );
    };
    // Release it (no holder), redirect it to a third node, delete it.
    let mut released = theirs.clone();
    released["status"]
        .as_object_mut()
        .expect("status")
        .remove("holder");
    refused(
        "releasing node2's claim",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&released)),
        "may not release, redirect or delete",
    );
    let mut redirected = theirs.clone();
    redirected["status"]["holder"]["node"] = serde_json::json!(nodes[2]);
    refused(
        "redirecting node2's claim",
        as_me(
            &["replace", "--dry-run=server", "-f", "-"],
            Some(&redirected),
        ),
        "may not",
    );
    refused(
        "deleting node2's claim",
        as_me(&["delete", "--dry-run=server", "ipclaim", &name], None),
        "may not release, redirect or delete",
    );
    let mut forged = theirs.clone();
    let meta = forged["metadata"].as_object_mut().expect("metadata");
    for k in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
        "managedFields",
    ] {
        meta.remove(k);
    }
    meta.insert("name".into(), serde_json::json!(format!("{name}-forged")));
    refused(
        "creating a claim held on node2",
        as_me(&["create", "--dry-run=server", "-f", "-"], Some(&forged)),
        "a node names only itself",
    );
    // A takeover must carry the unconfirmed mark (so the address is
    // probed before anyone binds it), and a claim's address never moves.
    let mut unmarked = theirs.clone();
    unmarked["status"]["holder"]["node"] = serde_json::json!(me);
    if let Some(status) = unmarked["status"].as_object_mut() {
        status.remove("unconfirmed");
    }
    refused(
        "taking node2's claim over without the mark",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&unmarked)),
        "without setting status.unconfirmed",
    );
    let mut marked = unmarked.clone();
    marked["status"]["unconfirmed"] = serde_json::json!({"since": 1, "why": "scope test"});
    let (ok, said) = as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&marked));
    assert!(ok, "node1 taking node2's claim over, marked: {said}");
    let mut moved = claim_of("mine");
    moved["spec"]["ip"] = serde_json::json!("172.31.59.250");
    refused(
        "moving node1's own claim to another address",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&moved)),
        "never change",
    );
    // Its own claim: allowed (the policy is not a blanket refusal).
    let mut own = claim_of("mine");
    own["metadata"]["labels"]["scope-test"] = serde_json::json!("1");
    let (ok, said) = as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&own));
    assert!(ok, "node1 changing its own claim: {said}");

    // The locks: each names the node that made it; node1 may not delete
    // node2's, change its identity, or forge one naming node2; it may
    // delete its own, and take node2's over (the reclaim's first step).
    let lock_of = |claim: &serde_json::Value| -> serde_json::Value {
        let mut lock = c.json(&["get", "iplocks"])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["metadata"]["uid"] == claim["spec"]["lockUID"])
            .cloned()
            .unwrap_or_else(|| panic!("no IPLock under {}", claim["metadata"]["name"]));
        lock["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("managedFields");
        lock
    };
    let their_lock = lock_of(&theirs);
    let lock_name = their_lock["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    assert_eq!(
        their_lock["spec"]["node"],
        other.as_str(),
        "a lock names the node that made it: {their_lock}"
    );
    refused(
        "deleting node2's lock",
        as_me(&["delete", "--dry-run=server", "iplock", &lock_name], None),
        "may not delete IPLock",
    );
    // Giving an address to another identity is one conditional update of
    // its lock (the exhaustion reclaim's re-key): allowed only to a node
    // that names itself, as a takeover is.
    let mut stolen = their_lock.clone();
    stolen["spec"]["identity"] = serde_json::json!(format!("{ns}/someone-else"));
    refused(
        "giving node2's lock to another identity while it still names node2",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&stolen)),
        "a node names only itself",
    );
    stolen["spec"]["node"] = serde_json::json!(me);
    refused(
        "re-keying node2's lock naming itself, unmarked",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&stolen)),
        "without setting spec.unconfirmed",
    );
    let lock_mark = serde_json::json!({"since": 1, "why": "a dead holder's address reclaimed"});
    stolen["spec"]["unconfirmed"] = lock_mark.clone();
    let (ok, said) = as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&stolen));
    assert!(
        ok,
        "re-keying node2's lock naming itself, marked (the reclaim's write), is allowed: {said}"
    );
    let mut forged_lock = their_lock.clone();
    let meta = forged_lock["metadata"].as_object_mut().expect("metadata");
    for k in ["resourceVersion", "uid", "creationTimestamp", "generation"] {
        meta.remove(k);
    }
    meta.insert(
        "name".into(),
        serde_json::json!(format!("{lock_name}-forged")),
    );
    refused(
        "creating a lock naming node2",
        as_me(
            &["create", "--dry-run=server", "-f", "-"],
            Some(&forged_lock),
        ),
        "a node names only itself",
    );
    // Issue 26 item 6: renaming oneself onto node2's lock (to delete it
    // while node2's live claim names the address) must mark it, and a
    // marked lock is no node's to delete.
    let mut taken = their_lock.clone();
    taken["spec"]["node"] = serde_json::json!(me);
    refused(
        "taking node2's lock over unmarked",
        as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&taken)),
        "without setting spec.unconfirmed",
    );
    taken["spec"]["unconfirmed"] = lock_mark;
    let (ok, said) = as_me(&["replace", "--dry-run=server", "-f", "-"], Some(&taken));
    assert!(ok, "node1 taking node2's lock over, marked: {said}");
    let own_lock = lock_of(&claim_of("mine"));
    let (ok, said) = as_me(
        &[
            "delete",
            "--dry-run=server",
            "iplock",
            own_lock["metadata"]["name"].as_str().expect("name"),
        ],
        None,
    );
    assert!(ok, "node1 deleting its own lock: {said}");

    // The node in a token stays true: node1's token may mint the
    // account's token bound to node1 (the installer's renewal), not one
    // bound to node2 (which would pass the policies as node2) or unbound.
    let mint = |bound: Option<&str>| {
        let mut args = vec!["-n", "kube-system", "create", "token", "sticky-macvlan"];
        if let Some(node) = bound {
            args.extend(["--bound-object-kind", "Node", "--bound-object-name", node]);
        }
        as_me(&args, None)
    };
    refused(
        "minting a token bound to node2",
        mint(Some(&other)),
        "may mint a token bound only to the node it runs on",
    );
    refused(
        "minting an unbound token",
        mint(None),
        "may mint a token bound only to the node it runs on",
    );
    let (ok, said) = mint(Some(&me));
    assert!(ok, "node1 minting a token bound to itself: {said}");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "node scope: {me}'s plugin token refused releasing, redirecting, deleting and forging {other}'s claim, taking it over unmarked, moving its own claim's address, deleting {other}'s lock, giving it to another identity and forging one, taking it over or re-keying it unmarked, minting a token bound to {other} or to nothing; allowed on its own claim and lock, to take {other}'s lock over marked, and to mint a token bound to {me}"
    );
}
