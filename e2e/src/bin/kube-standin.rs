//! A stand-in for the Kubernetes API server, for the e2e tests (DESIGN.md
//! section 9): real HTTP/JSON for the real kube client, faithful on what
//! the kubernetes store relies on — 404/409 `Status` objects with
//! `reason`, create-if-absent (AlreadyExists), resourceVersion
//! preconditions on PUT and DELETE, label selectors, finalizers (so a
//! deleted pod can be left Terminating), and custom resources that exist
//! only once their CRD is created. It counts requests by verb and can
//! answer writes with 409s on purpose.
//!
//! It listens on `--listen ADDR` (inside the test's API netns) for the
//! plugins, and on the unix socket `--control PATH` for the test harness,
//! which also serves `/standin/stats`, `/standin/reset` and
//! `/standin/faults`.
//!
//! With `--forward-unix PATH` instead of `--control`, it serves nothing
//! itself: every connection to `--listen` is piped to that unix socket,
//! where the harness connects it to a real cluster (e2e/src/cluster.rs).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tiny_http::{Header, Method, Request, Response, Server};

#[derive(Default)]
struct State {
    /// collection path -> name -> object
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    /// "group/version/plural" of registered CRDs -> has status subresource
    crds: BTreeMap<String, bool>,
    revision: u64,
    uid: u64,
    /// (verb, resource) -> requests
    counts: BTreeMap<String, u64>,
    /// The next N writes to custom resources answer 409 Conflict.
    conflicts: u64,
    /// Every Nth write to custom resources answers 409 Conflict (0: never).
    conflict_every: u64,
    writes: u64,
    /// Transport and server faults on chosen verbs.
    fault: Option<FaultPlan>,
    fault_matches: u64,
    /// xorshift state for `FaultPlan::chance`.
    fault_rng: u64,
}

/// A fault the stand-in injects on every `every`th request whose verb is
/// in `verbs`: `before` handling it (the request has no effect) or
/// `after` (its effect is applied and only the answer goes wrong, as
/// when a connection drops between "claim created" and the client
/// hearing so).
#[derive(Clone)]
struct FaultPlan {
    kind: FaultKind,
    verbs: Vec<String>,
    every: u64,
    /// Instead of every Nth: each matching request with this chance, from
    /// a fixed-seed generator (repeatable, but not in step with the
    /// client's own request pattern, as a period would be).
    chance: Option<f64>,
    after: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum FaultKind {
    /// 500 InternalError.
    ServerError,
    /// The answer is held back this long (past the client's deadline, a
    /// timeout).
    Slow(u64),
    /// The connection ends mid-answer.
    Drop,
}

fn verb_of(method: &Method, t: &Target) -> Option<&'static str> {
    Some(match (method, &t.name) {
        (Method::Get, None) => "list",
        (Method::Get, Some(_)) => "get",
        (Method::Post, None) => "create",
        (Method::Put, Some(_)) => "update",
        (Method::Delete, Some(_)) => "delete",
        _ => return None,
    })
}

struct Reply {
    code: u16,
    body: Value,
}

fn status(code: u16, reason: &str, message: String) -> Reply {
    Reply {
        code,
        body: json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": if code < 300 { "Success" } else { "Failure" },
            "message": message, "reason": reason, "code": code,
        }),
    }
}

fn not_found(what: &str, name: &str) -> Reply {
    status(404, "NotFound", format!("{what} \"{name}\" not found"))
}

/// A parsed request path: the collection and, maybe, one object.
struct Target {
    collection: String,
    name: Option<String>,
    /// The resource's plural, for counting and messages.
    resource: String,
    /// "group/version/plural" for a custom resource.
    custom: Option<String>,
}

fn parse_target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let core = |collection: String, plural: &str, name: Option<&&str>| Target {
        collection,
        name: name.map(|s| s.to_string()),
        resource: plural.to_string(),
        custom: None,
    };
    match parts.as_slice() {
        ["api", "v1", "nodes", rest @ ..] if rest.len() <= 1 => {
            Some(core("/api/v1/nodes".into(), "nodes", rest.first()))
        }
        ["api", "v1", "namespaces", ns, "pods", rest @ ..] if rest.len() <= 1 => Some(core(
            format!("/api/v1/namespaces/{ns}/pods"),
            "pods",
            rest.first(),
        )),
        ["apis", "apps", "v1", "namespaces", ns, "statefulsets", rest @ ..] if rest.len() <= 1 => {
            Some(core(
                format!("/apis/apps/v1/namespaces/{ns}/statefulsets"),
                "statefulsets",
                rest.first(),
            ))
        }
        ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", rest @ ..]
            if rest.len() <= 1 =>
        {
            Some(core(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions".into(),
                "customresourcedefinitions",
                rest.first(),
            ))
        }
        ["apis", group, version, plural, rest @ ..] if rest.len() <= 1 => Some(Target {
            collection: format!("/apis/{group}/{version}/{plural}"),
            name: rest.first().map(|s| s.to_string()),
            resource: plural.to_string(),
            custom: Some(format!("{group}/{version}/{plural}")),
        }),
        _ => None,
    }
}

/// Equality-based selectors (`a=b`, `a==b`, `a!=b`, `a`, `!a`), as the
/// store uses them.
fn selector_matches(selector: &str, labels: &Value) -> Result<bool, String> {
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        let ok = if let Some((k, v)) = term.split_once("!=") {
            label(k.trim()) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            label(k.trim()) == Some(v.trim())
        } else if let Some(k) = term.strip_prefix('!') {
            label(k).is_none()
        } else if term.contains(' ') || term.contains('(') {
            return Err(format!("unsupported label selector term {term:?}"));
        } else {
            label(term).is_some()
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn query_param(url: &str, key: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The "group/version/plural" resources a CRD object serves, and whether
/// each has the status subresource.
fn served_by(crd: &Value) -> Vec<(String, bool)> {
    let text = |p: &str| {
        crd.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (group, plural) = (text("/spec/group"), text("/spec/names/plural"));
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|versions| {
            versions
                .iter()
                .map(|v| {
                    let version = v.get("name").and_then(Value::as_str).unwrap_or("");
                    (
                        format!("{group}/{version}/{plural}"),
                        v.pointer("/subresources/status").is_some(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl State {
    fn count(&mut self, verb: &str, resource: &str) {
        *self.counts.entry(format!("{verb} {resource}")).or_default() += 1;
    }

    fn next_rv(&mut self) -> String {
        self.revision += 1;
        self.revision.to_string()
    }

    /// The fault for this request, if the plan picks it.
    fn next_fault(&mut self, method: &Method, url: &str) -> Option<FaultPlan> {
        let plan = self.fault.clone()?;
        let t = parse_target(url.split('?').next().unwrap_or(""))?;
        let verb = verb_of(method, &t)?;
        if !plan.verbs.is_empty() && !plan.verbs.iter().any(|v| v == verb) {
            return None;
        }
        self.fault_matches += 1;
        let hit = match plan.chance {
            Some(p) => {
                let mut x = self.fault_rng;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                self.fault_rng = x;
                ((x >> 11) as f64 / (1u64 << 53) as f64) < p
            }
            None => self.fault_matches.is_multiple_of(plan.every),
        };
        if !hit {
            return None;
        }
        let key = match plan.kind {
            FaultKind::ServerError => "injected 500",
            FaultKind::Slow(_) => "injected slow answer",
            FaultKind::Drop => "injected dropped connection",
        };
        *self.counts.entry(key.into()).or_default() += 1;
        Some(plan)
    }

    fn injected_conflict(&mut self, t: &Target) -> Option<Reply> {
        t.custom.as_ref()?;
        self.writes += 1;
        let hit = if self.conflicts > 0 {
            self.conflicts -= 1;
            true
        } else {
            self.conflict_every > 0 && self.writes.is_multiple_of(self.conflict_every)
        };
        hit.then(|| {
            *self.counts.entry("injected 409".into()).or_default() += 1;
            status(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} (injected by the stand-in)",
                    t.resource
                ),
            )
        })
    }

    /// The object an update or delete applies to, after the injected
    /// faults and the resourceVersion precondition, or the refusal, worded
    /// as kube-apiserver words it.
    fn writable(
        &mut self,
        t: &Target,
        name: &str,
        want: Option<&str>,
        delete: bool,
    ) -> Result<Value, Reply> {
        let Some(current) = self
            .objects
            .get(&t.collection)
            .and_then(|m| m.get(name))
            .cloned()
        else {
            return Err(not_found(&t.resource, name));
        };
        if let Some(r) = self.injected_conflict(t) {
            return Err(r);
        }
        let have = current
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        match want {
            Some(w) if w != have => {
                let why = if delete {
                    format!("Precondition failed: ResourceVersion in precondition: {w}, ResourceVersion in object meta: {have}")
                } else {
                    "the object has been modified; please apply your changes to the latest version and try again".to_string()
                };
                Err(status(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{name}\": {why}",
                        t.resource
                    ),
                ))
            }
            _ => Ok(current),
        }
    }

    /// `counted` is false for the harness's own requests.
    fn handle(&mut self, method: &Method, url: &str, body: &[u8], counted: bool) -> Reply {
        let path = url.split('?').next().unwrap_or("");
        let Some(t) = parse_target(path) else {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource".into(),
            );
        };
        let Some(verb) = verb_of(method, &t) else {
            return status(
                405,
                "MethodNotAllowed",
                format!("{method} {path} is not supported"),
            );
        };
        if counted {
            self.count(verb, &t.resource);
        }
        let mut status_subresource = false;
        if let Some(custom) = &t.custom {
            match self.crds.get(custom) {
                Some(sub) => status_subresource = *sub,
                None => {
                    return status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource".into(),
                    )
                }
            }
        }
        let parsed: Option<Value> = if body.is_empty() {
            None
        } else {
            match serde_json::from_slice(body) {
                Ok(v) => Some(v),
                Err(e) => return status(400, "BadRequest", format!("invalid JSON body: {e}")),
            }
        };
        match verb {
            "list" => {
                let selector = query_param(url, "labelSelector").unwrap_or_default();
                // Pages in name order; the continue token is the last name
                // served (opaque to clients, as the real one's is).
                let limit = query_param(url, "limit")
                    .and_then(|l| l.parse::<usize>().ok())
                    .filter(|l| *l > 0);
                let after = query_param(url, "continue").unwrap_or_default();
                let mut items = Vec::new();
                let mut more = None;
                // A range from the token, as etcd reads from a key: a page
                // costs what it holds, not what precedes it.
                use std::ops::Bound::{Excluded, Unbounded};
                let start = if after.is_empty() {
                    Unbounded
                } else {
                    Excluded(after)
                };
                let objects = self
                    .objects
                    .get(&t.collection)
                    .into_iter()
                    .flat_map(|m| m.range::<String, _>((start.clone(), Unbounded)));
                for (_, obj) in objects {
                    let labels = obj.pointer("/metadata/labels").unwrap_or(&Value::Null);
                    match selector_matches(&selector, labels) {
                        Ok(true) if limit.is_some_and(|l| items.len() >= l) => {
                            more = items
                                .last()
                                .and_then(|o: &Value| o.pointer("/metadata/name"))
                                .cloned();
                            break;
                        }
                        Ok(true) => items.push(obj.clone()),
                        Ok(false) => {}
                        Err(e) => return status(400, "BadRequest", e),
                    }
                }
                let mut metadata = json!({"resourceVersion": self.revision.to_string()});
                if let Some(token) = more {
                    metadata["continue"] = token;
                }
                Reply {
                    code: 200,
                    body: json!({
                        "apiVersion": "v1", "kind": "List",
                        "metadata": metadata,
                        "items": items,
                    }),
                }
            }
            "get" => {
                let name = t.name.clone().unwrap_or_default();
                match self.objects.get(&t.collection).and_then(|m| m.get(&name)) {
                    Some(obj) => Reply {
                        code: 200,
                        body: obj.clone(),
                    },
                    None => not_found(&t.resource, &name),
                }
            }
            "create" => {
                let Some(mut obj) = parsed else {
                    return status(400, "BadRequest", "create needs a body".into());
                };
                let name = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if !valid_name(&name) {
                    return status(
                        422,
                        "Invalid",
                        format!("{} \"{name}\" is invalid: metadata.name: must be a lowercase RFC 1123 subdomain", t.resource),
                    );
                }
                if let Some(r) = self.injected_conflict(&t) {
                    return r;
                }
                if self
                    .objects
                    .get(&t.collection)
                    .is_some_and(|m| m.contains_key(&name))
                {
                    return status(
                        409,
                        "AlreadyExists",
                        format!("{} \"{name}\" already exists", t.resource),
                    );
                }
                self.uid += 1;
                let rv = self.next_rv();
                let meta = obj.pointer_mut("/metadata").and_then(Value::as_object_mut);
                if let Some(meta) = meta {
                    meta.insert("resourceVersion".into(), json!(rv));
                    meta.insert("uid".into(), json!(format!("standin-uid-{}", self.uid)));
                    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
                    meta.remove("deletionTimestamp");
                }
                if t.resource == "customresourcedefinitions" {
                    self.crds.extend(served_by(&obj));
                }
                self.objects
                    .entry(t.collection.clone())
                    .or_default()
                    .insert(name, obj.clone());
                Reply {
                    code: 201,
                    body: obj,
                }
            }
            "update" => {
                let name = t.name.clone().unwrap_or_default();
                let Some(mut obj) = parsed else {
                    return status(400, "BadRequest", "update needs a body".into());
                };
                let want = obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let current = match self.writable(&t, &name, want.as_deref(), false) {
                    Ok(current) => current,
                    Err(reply) => return reply,
                };
                let rv = self.next_rv();
                if let Some(meta) = obj.pointer_mut("/metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), json!(rv));
                    for keep in ["uid", "creationTimestamp", "deletionTimestamp"] {
                        match current.pointer(&format!("/metadata/{keep}")) {
                            Some(v) => meta.insert(keep.into(), v.clone()),
                            None => meta.remove(keep),
                        };
                    }
                }
                if status_subresource {
                    if let Some(o) = obj.as_object_mut() {
                        match current.get("status") {
                            Some(s) => o.insert("status".into(), s.clone()),
                            None => o.remove("status"),
                        };
                    }
                }
                // An object being deleted goes once its last finalizer is removed.
                let finalizers_left = obj
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| !f.is_empty());
                let deleting = obj.pointer("/metadata/deletionTimestamp").is_some();
                let coll = self.objects.entry(t.collection.clone()).or_default();
                if deleting && !finalizers_left {
                    coll.remove(&name);
                } else {
                    coll.insert(name, obj.clone());
                }
                Reply {
                    code: 200,
                    body: obj,
                }
            }
            "delete" => {
                let name = t.name.clone().unwrap_or_default();
                let want = parsed
                    .as_ref()
                    .and_then(|b| b.pointer("/preconditions/resourceVersion"))
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let current = match self.writable(&t, &name, want.as_deref(), true) {
                    Ok(current) => current,
                    Err(reply) => return reply,
                };
                let has_finalizers = current
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| !f.is_empty());
                if has_finalizers {
                    let rv = self.next_rv();
                    let mut obj = current;
                    if let Some(meta) = obj.pointer_mut("/metadata").and_then(Value::as_object_mut)
                    {
                        meta.entry("deletionTimestamp")
                            .or_insert(json!(now_rfc3339()));
                        meta.insert("resourceVersion".into(), json!(rv));
                    }
                    self.objects
                        .entry(t.collection.clone())
                        .or_default()
                        .insert(name, obj.clone());
                    return Reply {
                        code: 200,
                        body: obj,
                    };
                }
                if let Some(m) = self.objects.get_mut(&t.collection) {
                    m.remove(&name);
                }
                if t.resource == "customresourcedefinitions" {
                    for (key, _) in served_by(&current) {
                        self.crds.remove(&key);
                    }
                }
                self.revision += 1;
                status(200, "", format!("{} \"{name}\" deleted", t.resource))
            }
            _ => status(405, "MethodNotAllowed", verb.to_string()),
        }
    }

    fn control(&mut self, method: &Method, path: &str, body: &[u8]) -> Option<Reply> {
        let reply = match (method, path) {
            (Method::Get, "/standin/stats") => Reply {
                code: 200,
                body: json!(self.counts),
            },
            (Method::Post, "/standin/reset") => {
                self.counts.clear();
                Reply {
                    code: 200,
                    body: json!({}),
                }
            }
            (Method::Post, "/standin/faults") => {
                let v: Value = serde_json::from_slice(body).unwrap_or(json!({}));
                self.conflicts = v.get("conflicts").and_then(Value::as_u64).unwrap_or(0);
                self.conflict_every = v.get("conflictEvery").and_then(Value::as_u64).unwrap_or(0);
                self.writes = 0;
                let kind = match v.get("fault").and_then(Value::as_str) {
                    Some("error500") => Some(FaultKind::ServerError),
                    Some("slow") => Some(FaultKind::Slow(
                        v.get("delayMs").and_then(Value::as_u64).unwrap_or(3000),
                    )),
                    Some("drop") => Some(FaultKind::Drop),
                    _ => None,
                };
                self.fault = kind.map(|kind| FaultPlan {
                    kind,
                    verbs: v
                        .get("verbs")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|x| x.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default(),
                    every: v.get("every").and_then(Value::as_u64).unwrap_or(1).max(1),
                    chance: v.get("chance").and_then(Value::as_f64),
                    after: v.get("after").and_then(Value::as_bool).unwrap_or(false),
                });
                self.fault_matches = 0;
                self.fault_rng = 0x9e37_79b9_7f4a_7c15;
                Reply { code: 200, body: v }
            }
            _ => return None,
        };
        Some(reply)
    }
}

fn serve(server: Arc<Server>, state: Arc<Mutex<State>>, control: bool) {
    loop {
        let Ok(mut req) = server.recv() else { return };
        let mut body = Vec::new();
        if req.as_reader().read_to_end(&mut body).is_err() {
            continue;
        }
        let start = std::time::Instant::now();
        let lock = || match state.lock() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        let fault = if control {
            None
        } else {
            lock().next_fault(req.method(), req.url())
        };
        if let Some(plan) = fault.as_ref().filter(|p| !p.after) {
            // Before handling: the request has no effect.
            if let FaultKind::Slow(ms) = plan.kind {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            } else {
                misbehave(req, plan.kind);
                continue;
            }
        }
        let reply = {
            let mut st = lock();
            let path = req.url().split('?').next().unwrap_or("").to_string();
            let ctl = if control {
                st.control(req.method(), &path, &body)
            } else {
                None
            };
            match ctl {
                Some(r) => r,
                None => st.handle(req.method(), req.url(), &body, !control),
            }
        };
        if std::env::var_os("STANDIN_TRACE").is_some() && !control {
            eprintln!(
                "{} {} -> {}{}",
                req.method(),
                req.url(),
                reply.code,
                if fault.is_some() { " (faulted)" } else { "" }
            );
        }
        match fault.filter(|p| p.after) {
            // After handling: the effect stands, the answer goes wrong.
            Some(FaultPlan {
                kind: FaultKind::Slow(ms),
                ..
            }) => {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                respond(req, reply);
            }
            Some(plan) => {
                misbehave(req, plan.kind);
                continue;
            }
            None => respond(req, reply),
        }
        if !control {
            // The server's own share of a request's latency, so a benchmark
            // can tell the plugin's cost from this stand-in's.
            let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            let mut st = match state.lock() {
                Ok(st) => st,
                Err(poisoned) => poisoned.into_inner(),
            };
            *st.counts.entry(SERVER_MICROS.into()).or_default() += micros;
        }
    }
}

/// The stats key carrying the time spent serving requests (not a count).
const SERVER_MICROS: &str = "server busy us";

/// A 500, or a connection that ends in the middle of the answer.
fn misbehave(req: Request, kind: FaultKind) {
    if kind == FaultKind::Drop {
        let mut w = req.into_writer();
        let _ = w.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\nConnection: close\r\n\r\n{\"kind\":",
        );
        let _ = w.flush();
        return;
    }
    respond(
        req,
        status(500, "InternalError", "injected by the stand-in".into()),
    );
}

fn respond(req: Request, reply: Reply) {
    let body = serde_json::to_vec(&reply.body).unwrap_or_default();
    let mut resp = Response::from_data(body).with_status_code(reply.code);
    if let Ok(h) = Header::from_bytes("Content-Type", "application/json") {
        resp.add_header(h);
    }
    let _ = req.respond(resp);
}

/// A listener whose connections have TCP_NODELAY (Linux hands it on to
/// accepted sockets), as Go's net/http and so kube-apiserver have: without
/// it, Nagle and delayed ACKs add 40 ms to every answer written in two parts.
fn listen_nodelay(addr: &str) -> Result<Server, Box<dyn std::error::Error + Send + Sync>> {
    use std::os::fd::AsRawFd;
    let listener = std::net::TcpListener::bind(addr)?;
    let one: libc::c_int = 1;
    // SAFETY: a valid socket fd and a c_int option value of the right size.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            std::ptr::addr_of!(one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Server::from_listener(listener, None)
}

/// Pipes every TCP connection on `listen` to the unix socket `socket`.
fn forward(listen: &str, socket: &str) -> ! {
    let listener = match std::net::TcpListener::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kube-standin: cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("kube-standin: forwarding {listen} to {socket}");
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        let socket = socket.to_string();
        // Connect off the accept loop, so a slow peer never stalls accepting.
        std::thread::spawn(move || {
            let unix = match std::os::unix::net::UnixStream::connect(&socket) {
                Ok(u) => u,
                Err(e) => {
                    eprintln!("kube-standin: cannot reach {socket}: {e}; dropping the connection");
                    return;
                }
            };
            let (Ok(tcp2), Ok(unix2)) = (tcp.try_clone(), unix.try_clone()) else {
                return;
            };
            std::thread::spawn(move || {
                let (mut a, mut b) = (unix2, tcp2);
                let _ = std::io::copy(&mut a, &mut b);
                let _ = b.shutdown(std::net::Shutdown::Write);
            });
            let (mut a, mut b) = (tcp, unix);
            let _ = std::io::copy(&mut a, &mut b);
            let _ = b.shutdown(std::net::Shutdown::Write);
        });
    }
    std::process::exit(1)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let (Some(listen), Some(socket)) = (flag("--listen"), flag("--forward-unix")) {
        forward(&listen, &socket);
    }
    let (Some(listen), Some(control)) = (flag("--listen"), flag("--control")) else {
        eprintln!(
            "usage: kube-standin --listen ADDR:PORT (--control SOCKET | --forward-unix SOCKET)"
        );
        std::process::exit(2);
    };
    let _ = std::fs::remove_file(&control);
    let api = match listen_nodelay(&listen) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("kube-standin: cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    let ctl = match Server::http_unix(std::path::Path::new(&control)) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("kube-standin: cannot listen on {control}: {e}");
            std::process::exit(1);
        }
    };
    let state = Arc::new(Mutex::new(State::default()));
    let mut workers = Vec::new();
    for i in 0..8 {
        let (server, st, is_ctl) = if i < 6 {
            (api.clone(), state.clone(), false)
        } else {
            (ctl.clone(), state.clone(), true)
        };
        workers.push(std::thread::spawn(move || serve(server, st, is_ctl)));
    }
    eprintln!("kube-standin: serving on {listen} and {control}");
    for w in workers {
        let _ = w.join();
    }
}
