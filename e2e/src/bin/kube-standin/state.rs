//! What the stand-in stores and how it answers each request: objects by
//! resource, resourceVersions, finalizers, counters and planned faults.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use tiny_http::Method;

use crate::http::*;

#[derive(Default)]
pub(crate) struct State {
    /// collection path -> name -> object
    pub(crate) objects: BTreeMap<String, BTreeMap<String, Value>>,
    /// "group/version/plural" of registered CRDs -> has status subresource
    pub(crate) crds: BTreeMap<String, bool>,
    pub(crate) revision: u64,
    pub(crate) uid: u64,
    /// (verb, resource) -> requests
    pub(crate) counts: BTreeMap<String, u64>,
    /// The next N writes to custom resources answer 409 Conflict.
    pub(crate) conflicts: u64,
    /// Every Nth write to custom resources answers 409 Conflict (0: never).
    pub(crate) conflict_every: u64,
    pub(crate) writes: u64,
    /// Transport and server faults on chosen verbs.
    pub(crate) fault: Option<FaultPlan>,
    pub(crate) fault_matches: u64,
    /// xorshift state for `FaultPlan::chance`.
    pub(crate) fault_rng: u64,
}

/// A fault the stand-in injects on every `every`th request whose verb is
/// in `verbs`: `before` handling it (the request has no effect) or
/// `after` (its effect is applied and only the answer goes wrong, as
/// when a connection drops between "claim created" and the client
/// hearing so).
#[derive(Clone)]
pub(crate) struct FaultPlan {
    pub(crate) kind: FaultKind,
    pub(crate) verbs: Vec<String>,
    pub(crate) every: u64,
    /// Instead of every Nth: each matching request with this chance, from
    /// a fixed-seed generator (repeatable, but not in step with the
    /// client's own request pattern, as a period would be).
    pub(crate) chance: Option<f64>,
    pub(crate) after: bool,
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum FaultKind {
    /// 500 InternalError.
    ServerError,
    /// The answer is held back this long (past the client's deadline, a
    /// timeout).
    Slow(u64),
    /// The connection ends mid-answer.
    Drop,
}

/// The "group/version/plural" resources a CRD object serves, and whether
/// each has the status subresource.
pub(crate) fn served_by(crd: &Value) -> Vec<(String, bool)> {
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

pub(crate) fn valid_name(name: &str) -> bool {
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

pub(crate) fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    sticky_macvlan::cni::log::rfc3339_seconds(secs)
}

impl State {
    pub(crate) fn count(&mut self, verb: &str, resource: &str) {
        *self.counts.entry(format!("{verb} {resource}")).or_default() += 1;
    }

    pub(crate) fn next_rv(&mut self) -> String {
        self.revision += 1;
        self.revision.to_string()
    }

    /// The fault for this request, if the plan picks it.
    pub(crate) fn next_fault(&mut self, method: &Method, url: &str) -> Option<FaultPlan> {
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

    pub(crate) fn injected_conflict(&mut self, t: &Target) -> Option<Reply> {
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
    pub(crate) fn writable(
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
    pub(crate) fn handle(
        &mut self,
        method: &Method,
        url: &str,
        body: &[u8],
        counted: bool,
    ) -> Reply {
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
                let want_uid = parsed
                    .as_ref()
                    .and_then(|b| b.pointer("/preconditions/uid"))
                    .and_then(Value::as_str);
                let have_uid = current
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if let Some(w) = want_uid.filter(|w| *w != have_uid) {
                    return status(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {w}, UID in object meta: {have_uid}",
                            t.resource
                        ),
                    );
                }
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

    pub(crate) fn control(&mut self, method: &Method, path: &str, body: &[u8]) -> Option<Reply> {
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
