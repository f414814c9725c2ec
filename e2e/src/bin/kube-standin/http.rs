//! Request routing for the stand-in: which resource and object a path
//! names, label selectors, query parameters, `Status` replies.

use serde_json::{json, Value};
use tiny_http::Method;

pub(crate) fn verb_of(method: &Method, t: &Target) -> Option<&'static str> {
    Some(match (method, &t.name) {
        (Method::Get, None) => "list",
        (Method::Get, Some(_)) => "get",
        (Method::Post, None) => "create",
        (Method::Put, Some(_)) => "update",
        (Method::Delete, Some(_)) => "delete",
        _ => return None,
    })
}

pub(crate) struct Reply {
    pub(crate) code: u16,
    pub(crate) body: Value,
}

pub(crate) fn status(code: u16, reason: &str, message: String) -> Reply {
    Reply {
        code,
        body: json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": if code < 300 { "Success" } else { "Failure" },
            "message": message, "reason": reason, "code": code,
        }),
    }
}

pub(crate) fn not_found(what: &str, name: &str) -> Reply {
    status(404, "NotFound", format!("{what} \"{name}\" not found"))
}

/// A parsed request path: the collection and, maybe, one object.
pub(crate) struct Target {
    pub(crate) collection: String,
    pub(crate) name: Option<String>,
    /// The resource's plural, for counting and messages.
    pub(crate) resource: String,
    /// "group/version/plural" for a custom resource.
    pub(crate) custom: Option<String>,
}

pub(crate) fn parse_target(path: &str) -> Option<Target> {
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
pub(crate) fn selector_matches(selector: &str, labels: &Value) -> Result<bool, String> {
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

pub(crate) fn query_param(url: &str, key: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

pub(crate) fn percent_decode(s: &str) -> String {
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
