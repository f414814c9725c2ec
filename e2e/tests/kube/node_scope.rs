//! The node-scope admission policy: the walk-arounds a node's token might
//! try, refused in sequences, and the plugin's own writes allowed.

use super::*;

const CLAIMS: &str = "/apis/sticky-macvlan.io/v1alpha1/ipclaims";

const LOCKS: &str = "/apis/sticky-macvlan.io/v1alpha1/iplocks";

/// An IPClaim as the plugin writes it: identity ID on IP, held on NODE
/// (None: by nobody), with the unconfirmed mark or not.
fn claim_json(name: &str, ip: &str, id: &str, node: Option<&str>, marked: bool) -> Value {
    let mut status =
        json!({"phase": if node.is_some() { "Bound" } else { "Released" }, "updated": 1});
    if let Some(node) = node {
        status["holder"] = json!({"containerID": format!("c-{name}-{node}"), "ifname": "net1",
                                  "node": node, "since": 1, "podName": name, "podNamespace": NS});
        status["node"] = json!(node);
    }
    if marked {
        status["unconfirmed"] = json!({"since": 1, "why": "taken over on a judgement"});
    }
    json!({"apiVersion": "sticky-macvlan.io/v1alpha1", "kind": "IPClaim",
           "metadata": {"name": name},
           "spec": {"network": "macnet", "ip": ip, "identity": id, "sticky": true, "created": 1},
           "status": status})
}

fn lock_json(name: &str, ip: &str, id: &str, node: &str) -> Value {
    json!({"apiVersion": "sticky-macvlan.io/v1alpha1", "kind": "IPLock",
           "metadata": {"name": name},
           "spec": {"network": "macnet", "ip": ip, "identity": id, "node": node, "created": 1}})
}

/// deploy/30-node-scope-policy.yaml on the real kube-apiserver (its
/// admission chain: ValidatingAdmissionPolicy, RBAC), requests made as the
/// `sticky-macvlan` service account with a node-bound token's node name
/// (impersonated by the harness's admin). Replays the walk-arounds of
/// issue 26 item 6 as request sequences, each refused at the step that
/// would free or rewrite another node's live claim, and every write
/// sequence of the plugin's own, each allowed. One sequence stays allowed
/// and is asserted so (docs/src/concepts/node-scope.md: what CEL cannot express):
/// taking another node's lock over and deleting it.
#[test]
fn the_node_scope_policy_refuses_walk_arounds_in_sequences_and_allows_the_plugins_writes() {
    let (_topo, api) = nodes_on_api(1);
    for doc in sticky_e2e::kube_api::deploy_docs("30-node-scope-policy.yaml") {
        let plural = match doc["kind"].as_str() {
            Some("ValidatingAdmissionPolicy") => "validatingadmissionpolicies",
            Some("ValidatingAdmissionPolicyBinding") => "validatingadmissionpolicybindings",
            other => panic!("unexpected {other:?} in the policy file"),
        };
        api.create(
            &format!("/apis/admissionregistration.k8s.io/v1/{plural}"),
            doc,
        );
    }
    let (me, other, third) = ("node1", "node2", "node3");
    let as_node = |node: &str, method: &str, path: &str, body: Option<&Value>| {
        api.request_as_plugin(Some(node), method, path, body)
    };
    // The policies are in force once node1 naming node2 is refused (a
    // rule every version of the file has); dry runs store nothing.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, _) = as_node(
            me,
            "POST",
            &format!("{CLAIMS}?dryRun=All"),
            Some(&claim_json(
                "probe",
                "10.9.0.1",
                "probe",
                Some(other),
                false,
            )),
        );
        if code == 403 || code == 422 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the policy never came into force"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut said = Vec::new();
    let mut refused = |what: &str, (code, out): (u16, Value), says: &str| {
        let msg = out["message"].as_str().unwrap_or_default().to_string();
        assert!(
            (code == 403 || code == 422)
                && msg.contains("sticky-macvlan-node-scope")
                && msg.contains(says),
            "{what}: expected the node-scope policy to refuse it ({says:?}), got {code}: {out}"
        );
        said.push(format!("{what}: {msg}"));
    };
    let allowed = |what: &str, (code, out): (u16, Value)| {
        assert!(
            code == 200 || code == 201,
            "{what} was refused: {code}: {out}"
        );
        out
    };
    // A claim and lock node2's live pod holds (made as node2's plugin).
    let theirs = |name: &str, ip: &str| -> Value {
        allowed(
            "node2 locking its address",
            as_node(
                other,
                "POST",
                LOCKS,
                Some(&lock_json(&format!("lock-{name}"), ip, name, other)),
            ),
        );
        allowed(
            "node2 claiming its address",
            as_node(
                other,
                "POST",
                CLAIMS,
                Some(&claim_json(name, ip, name, Some(other), false)),
            ),
        )
    };
    // OBJ changed by EDIT, PUT as NODE at the resourceVersion read.
    let put = |node: &str, obj: &Value, edit: &dyn Fn(&mut Value)| -> (u16, Value) {
        let mut o = obj.clone();
        edit(&mut o);
        let name = o["metadata"]["name"].as_str().expect("name").to_string();
        let base = if o["kind"] == "IPLock" { LOCKS } else { CLAIMS };
        as_node(node, "PUT", &format!("{base}/{name}"), Some(&o))
    };
    // The same as a dry run: what a refusal is checked with, so that a
    // policy that allows it changes nothing for the next step.
    let put_dry = |node: &str, obj: &Value, edit: &dyn Fn(&mut Value)| -> (u16, Value) {
        let mut o = obj.clone();
        edit(&mut o);
        let name = o["metadata"]["name"].as_str().expect("name").to_string();
        let base = if o["kind"] == "IPLock" { LOCKS } else { CLAIMS };
        as_node(node, "PUT", &format!("{base}/{name}?dryRun=All"), Some(&o))
    };
    let take_over = |o: &mut Value| {
        o["status"]["holder"]["node"] = json!("node1");
        o["status"]["holder"]["containerID"] = json!("c-new");
        o["status"]["node"] = json!("node1");
    };
    let mark =
        |o: &mut Value| o["status"]["unconfirmed"] = json!({"since": 2, "why": "took it over"});
    let lock_mark =
        |o: &mut Value| o["spec"]["unconfirmed"] = json!({"since": 2, "why": "took it over"});
    let release = |o: &mut Value| {
        let status = o["status"].as_object_mut().expect("status");
        status.remove("holder");
        status.remove("node");
        status.remove("unconfirmed");
        status.insert("phase".into(), json!("Reserved"));
    };

    // 1. Take over, then release: the unmarked takeover is refused; a
    //    marked one is allowed, and the release may not drop the mark.
    let a = theirs("a", "10.9.0.10");
    refused(
        "node1 taking node2's claim over without the mark",
        put_dry(me, &a, &take_over),
        "without setting status.unconfirmed",
    );
    let a = allowed(
        "node1 taking node2's (dead) claim over, marked",
        put(me, &a, &|o| {
            take_over(o);
            mark(o)
        }),
    );
    refused(
        "node1 releasing the claim it took over, dropping the mark",
        put_dry(me, &a, &release),
        "drop its status.unconfirmed",
    );
    // 2. After a takeover, or on its own claim: spec never moves.
    refused(
        "node1 moving the claim it took over to another address",
        put_dry(me, &a, &|o| o["spec"]["ip"] = json!("10.9.0.99")),
        "never change",
    );
    refused(
        "node1 giving the claim it took over to another identity",
        put_dry(me, &a, &|o| o["spec"]["identity"] = json!("someone-else")),
        "never change",
    );
    refused(
        "node1 moving the claim it took over to another network",
        put_dry(me, &a, &|o| o["spec"]["network"] = json!("othernet")),
        "never change",
    );
    let own = allowed(
        "node1 claiming an address for itself",
        as_node(
            me,
            "POST",
            CLAIMS,
            Some(&claim_json("own", "10.9.0.11", "own", Some(me), false)),
        ),
    );
    let own = allowed(
        "node1 binding its claim's namespace (unset to set, as keep() does) and its stickiness",
        put(me, &own, &|o| {
            o["spec"]["namespace"] = json!("tenant-a");
            o["spec"]["sticky"] = json!(false);
        }),
    );
    refused(
        "node1 moving its own claim to another namespace",
        put_dry(me, &own, &|o| o["spec"]["namespace"] = json!("tenant-b")),
        "spec.namespace, once set, never changes",
    );
    refused(
        "node1 unsetting its own claim's namespace",
        put_dry(me, &own, &|o| {
            o["spec"].as_object_mut().expect("spec").remove("namespace");
        }),
        "spec.namespace, once set, never changes",
    );
    // 3. A token of the account that names no node: refused, not exempted.
    refused(
        "a token naming no node creating a claim",
        api.request_as_plugin(
            None,
            "POST",
            &format!("{CLAIMS}?dryRun=All"),
            Some(&claim_json(
                "nodeless",
                "10.9.0.12",
                "nodeless",
                None,
                false,
            )),
        ),
        "names no node",
    );
    refused(
        "a token naming no node releasing node2's claim",
        api.request_as_plugin(
            None,
            "PUT",
            &format!("{CLAIMS}/a?dryRun=All"),
            Some(&{
                let mut o = a.clone();
                release(&mut o);
                o
            }),
        ),
        "names no node",
    );
    refused(
        "a token naming no node deleting node2's lock",
        api.request_as_plugin(None, "DELETE", &format!("{LOCKS}/lock-a?dryRun=All"), None),
        "names no node",
    );

    // The plugin's own sequences, allowed.
    // Its release of the claim it took over keeps the mark (a tombstone:
    // no holder, not sticky, marked), and its own DEL of its own claim.
    let a = allowed(
        "node1 releasing the claim it took over, keeping the mark (tombstone)",
        put(me, &a, &|o| {
            let unconfirmed = o["status"]["unconfirmed"].clone();
            release(o);
            o["spec"]["sticky"] = json!(false);
            o["status"]["unconfirmed"] = unconfirmed;
        }),
    );
    assert!(a["status"]["unconfirmed"].is_object(), "{a}");
    allowed(
        "node1 releasing its own confirmed claim (its own DEL)",
        put(me, &own, &release),
    );
    // The handback of a takeover whose probe was answered (plan_undo):
    // the claim goes back to node2's holder, as it was.
    let b = theirs("b", "10.9.0.13");
    let taken = allowed(
        "node1 taking node2's claim over, marked",
        put(me, &b, &|o| {
            take_over(o);
            mark(o)
        }),
    );
    allowed(
        "node1 handing it back to node2 (its probe heard node2's pod)",
        put(me, &taken, &|o| {
            o["status"] = b["status"].clone();
        }),
    );
    // Confirmation: the holder clears the mark once its probe heard nobody.
    let c = theirs("c", "10.9.0.14");
    let c = allowed(
        "node1 taking a dead holder's claim over, marked",
        put(me, &c, &|o| {
            take_over(o);
            mark(o)
        }),
    );
    let c = allowed(
        "node1 confirming it (clears the mark, keeps the holder)",
        put(me, &c, &|o| {
            o["status"]
                .as_object_mut()
                .expect("status")
                .remove("unconfirmed");
        }),
    );
    // CNI GC's tombstone of its own holder: no holder, marked.
    allowed(
        "node1's GC releasing its own holder on a judgement (marked)",
        put(me, &c, &|o| {
            release(o);
            mark(o)
        }),
    );
    // The exhaustion reclaim of a dead holder's address on node2: claim
    // taken over (marked), its lock re-keyed in place to the new identity
    // naming node1 (never deleted, so no other node's next-fit can lock
    // the address in between), the claim deleted, a claim (marked) of its
    // own.
    let d = theirs("d", "10.9.0.15");
    let d = allowed(
        "reclaim: node1 taking the dead holder's claim over, marked",
        put(me, &d, &|o| {
            take_over(o);
            mark(o)
        }),
    );
    let rv = d["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    refused(
        "reclaim: node1 deleting node2's lock outright",
        as_node(me, "DELETE", &format!("{LOCKS}/lock-d?dryRun=All"), None),
        "may not delete IPLock",
    );
    let (_, lock) = api.request("GET", &format!("{LOCKS}/lock-d"), None);
    refused(
        "node1 re-keying node2's lock to another identity, still naming node2",
        put_dry(me, &lock, &|o| o["spec"]["identity"] = json!("d-new")),
        "may not name node",
    );
    refused(
        "node1 re-keying node2's lock to another identity, naming node3",
        put_dry(me, &lock, &|o| {
            o["spec"]["identity"] = json!("d-new");
            o["spec"]["node"] = json!(third);
        }),
        "may not name node",
    );
    refused(
        "node1 moving a lock it names itself on to another address",
        put_dry(me, &lock, &|o| {
            o["spec"]["node"] = json!("node1");
            o["spec"]["ip"] = json!("10.9.0.99");
        }),
        "may not change its spec.network or spec.ip",
    );
    refused(
        "node1 moving a lock it names itself on to another network",
        put_dry(me, &lock, &|o| {
            o["spec"]["node"] = json!("node1");
            o["spec"]["network"] = json!("othernet");
        }),
        "may not change its spec.network or spec.ip",
    );
    refused(
        "reclaim: node1 re-keying node2's lock naming itself, unmarked",
        put_dry(me, &lock, &|o| {
            o["spec"]["identity"] = json!("d-new");
            o["spec"]["node"] = json!("node1");
        }),
        "without setting spec.unconfirmed",
    );
    let rekeyed = allowed(
        "reclaim: node1 re-keying node2's lock to the new identity, naming itself, marked",
        put(me, &lock, &|o| {
            o["spec"]["identity"] = json!("d-new");
            o["spec"]["node"] = json!("node1");
            lock_mark(o);
        }),
    );
    assert_eq!(rekeyed["spec"]["identity"], json!("d-new"), "{rekeyed}");
    assert_eq!(
        rekeyed["metadata"]["uid"], lock["metadata"]["uid"],
        "the same lock, never deleted: {rekeyed}"
    );
    allowed(
        "reclaim: node1 deleting the claim it took over",
        as_node(
            me,
            "DELETE",
            &format!("{CLAIMS}/d"),
            Some(&json!({"preconditions": {"resourceVersion": rv}})),
        ),
    );
    allowed(
        "reclaim: node1 claiming it, marked",
        as_node(
            me,
            "POST",
            CLAIMS,
            Some(&claim_json("d-new", "10.9.0.15", "d-new", Some(me), true)),
        ),
    );
    // The undo of a reclaim whose probe was answered: the lock re-keyed
    // back to the old identity (node1 naming itself), node1's claim
    // deleted, the tombstone (no holder, marked) created again.
    refused(
        "undo: node1 re-keying the lock back, dropping its mark",
        put_dry(me, &rekeyed, &|o| {
            o["spec"]["identity"] = json!("d");
            o["spec"]
                .as_object_mut()
                .expect("spec")
                .remove("unconfirmed");
        }),
        "drop its spec.unconfirmed",
    );
    allowed(
        "undo: node1 re-keying the lock back to the old identity (marked still)",
        put(me, &rekeyed, &|o| o["spec"]["identity"] = json!("d")),
    );
    allowed(
        "undo: node1 deleting its claim",
        as_node(me, "DELETE", &format!("{CLAIMS}/d-new"), None),
    );
    allowed(
        "undo: node1 putting the tombstone back, marked",
        as_node(
            me,
            "POST",
            CLAIMS,
            Some(&claim_json("d", "10.9.0.15", "d", None, true)),
        ),
    );
    // Adoption of a lock node2's crashed ADD left with no claim.
    allowed(
        "node2 locking an address it never claims (a crash)",
        as_node(
            other,
            "POST",
            LOCKS,
            Some(&lock_json("lock-e", "10.9.0.16", "e", other)),
        ),
    );
    let (_, orphan) = api.request("GET", &format!("{LOCKS}/lock-e"), None);
    refused(
        "node1 adopting node2's orphan lock, unmarked",
        put_dry(me, &orphan, &|o| {
            o["spec"]["node"] = json!("node1");
            o["spec"]["adoptions"] = json!(1);
        }),
        "without setting spec.unconfirmed",
    );
    allowed(
        "node1 adopting node2's orphan lock for its identity, marked",
        put(me, &orphan, &|o| {
            o["spec"]["node"] = json!("node1");
            o["spec"]["adoptions"] = json!(1);
            lock_mark(o);
        }),
    );
    allowed(
        "node1 claiming the adopted address",
        as_node(
            me,
            "POST",
            CLAIMS,
            Some(&claim_json("e", "10.9.0.16", "e", Some(me), false)),
        ),
    );
    // A failed ADD's rollback on its own node, and the rules every
    // version had: node1 may not release, redirect or delete node2's claim.
    let f = theirs("f", "10.9.0.17");
    refused(
        "node1 releasing node2's claim",
        put_dry(me, &f, &release),
        "may not release, redirect or delete",
    );
    refused(
        "node1 redirecting node2's claim to node3",
        put_dry(me, &f, &|o| o["status"]["holder"]["node"] = json!(third)),
        "may not",
    );

    // Issue 26 item 6: renaming oneself onto the lock of another node's
    // live claim, then deleting it (after which an honest node's next-fit
    // would bind the address fresh). The rename must mark the lock, and a
    // marked lock is no node's to delete or unmark, not even its own.
    let (_, lock) = api.request("GET", &format!("{LOCKS}/lock-f"), None);
    refused(
        "node1 renaming itself onto the lock of node2's live claim, unmarked",
        put_dry(me, &lock, &|o| o["spec"]["node"] = json!("node1")),
        "without setting spec.unconfirmed",
    );
    let taken = allowed(
        "node1 renaming itself onto the lock of node2's live claim, marked",
        put(me, &lock, &|o| {
            o["spec"]["node"] = json!("node1");
            lock_mark(o);
        }),
    );
    refused(
        "node1 deleting the lock it renamed itself onto",
        as_node(me, "DELETE", &format!("{LOCKS}/lock-f?dryRun=All"), None),
        "is marked unconfirmed",
    );
    refused(
        "node1 clearing the mark of the lock it renamed itself onto",
        put_dry(me, &taken, &|o| {
            o["spec"]
                .as_object_mut()
                .expect("spec")
                .remove("unconfirmed");
        }),
        "drop its spec.unconfirmed",
    );
    refused(
        "node1 re-keying it to another identity, then (dry) dropping the mark",
        put_dry(me, &taken, &|o| {
            o["spec"]["identity"] = json!("f-new");
            o["spec"]
                .as_object_mut()
                .expect("spec")
                .remove("unconfirmed");
        }),
        "drop its spec.unconfirmed",
    );
    let (_, mine) = api.request("GET", &format!("{LOCKS}/lock-e"), None);
    refused(
        "node1 deleting its own lock, marked since its adoption",
        as_node(me, "DELETE", &format!("{LOCKS}/lock-e?dryRun=All"), None),
        "is marked unconfirmed",
    );
    // Reconcile (another user, not matched) clears a mark once the claim
    // naming the address carries none.
    let (code, out) = api.request(
        "PUT",
        &format!("{LOCKS}/lock-e"),
        Some(&{
            let mut o = mine.clone();
            o["spec"]
                .as_object_mut()
                .expect("spec")
                .remove("unconfirmed");
            o
        }),
    );
    assert_eq!(code, 200, "reconcile clearing a mark: {out}");
    allowed(
        "node1 deleting its own lock once reconcile cleared its mark (dry run)",
        as_node(me, "DELETE", &format!("{LOCKS}/lock-e?dryRun=All"), None),
    );
    eprintln!(
        "node scope, refusals by the real admission chain:\n  {}",
        said.join("\n  ")
    );
}
