//! The real `KubeApi`: the `kube` crate over HTTP(S), built from the
//! kubeconfig named in the CNI config (kubelet execs CNI plugins, so there
//! is no in-cluster environment). Each call blocks on a current-thread
//! runtime owned by the client; every request is bounded by the configured
//! timeout, because kubelet gives a whole sandbox only a few minutes.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::runtime::Runtime;

/// Objects per page when only the taken addresses are listed (what
/// kubectl uses: small enough to keep memory flat, large enough to keep
/// requests few).
const LIST_PAGE: u32 = 500;

/// The most an Event adds to an ADD: it is best effort, and kubelet's own
/// event carries the error anyway. On the connection the ADD already made
/// it takes a few milliseconds; an API that does not answer costs this.
/// 300 ms lost takeover Events on the loaded local cluster (kube-apiserver
/// logged the abandoned POSTs), where the same pod gets no second chance.
pub const EVENT_DEADLINE: Duration = Duration::from_secs(2);

/// Who reports our Events (`source.component`, `reportingComponent`).
pub const EVENT_COMPONENT: &str = "sticky-macvlan";

use super::crd::{from_lock, from_object, to_lock, to_object, IPClaim, IPLock};
use super::{
    lock_name, ApiError, ApiResult, ClaimObject, ClusterNode, KubeApi, LockObject,
    OUT_OF_SERVICE_TAINT,
};
use crate::claim::Unconfirmed;
use crate::events::PodEvent;
use crate::pod::{stable_owner_kind, PodFacts, StableOwner, IDENTITY_ANNOTATION};
use crate::retention::StatefulSetFacts;

pub struct KubeClient {
    runtime: Runtime,
    client: Client,
    timeout: Duration,
    server: String,
}

fn runtime() -> Result<Runtime, ApiError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ApiError::Client(format!("cannot start the kube client runtime: {e}")))
}

/// `server` is named when the API server itself did not answer, so the
/// operator knows which address failed.
fn classify(what: &str, server: &str, e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(status) => {
            let msg = format!(
                "{what}: {} {} ({})",
                status.code, status.reason, status.message
            );
            match status.code {
                409 | 404 => ApiError::Conflict(msg),
                429 | 500..=599 => ApiError::Unreachable(msg),
                401 => ApiError::Unauthorized(msg),
                _ => ApiError::Refused(msg),
            }
        }
        other => ApiError::Unreachable(format!("{what} at {server}: {}", chain(&other))),
    }
}

/// "client error (Connect): tcp connect error: Connection refused": the
/// outer errors alone do not say what happened.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let text = inner.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = inner.source();
    }
    out
}

impl KubeClient {
    /// From the pod's service account (the reconcile Deployment).
    pub fn in_cluster(timeout: Duration) -> Result<KubeClient, ApiError> {
        let runtime = runtime()?;
        let config = Config::incluster().map_err(|e| {
            ApiError::Client(format!(
                "no in-cluster configuration ({e}): --in-cluster works inside a pod; elsewhere pass --kubeconfig"
            ))
        })?;
        KubeClient::with_config(runtime, config, timeout)
    }

    pub fn from_kubeconfig(path: &Path, timeout: Duration) -> Result<KubeClient, ApiError> {
        KubeClient::from_kubeconfig_context(path, None, timeout)
    }

    /// The same with `context` instead of the kubeconfig's current one
    /// (kubectl's `--context`).
    pub fn from_kubeconfig_context(
        path: &Path,
        context: Option<&str>,
        timeout: Duration,
    ) -> Result<KubeClient, ApiError> {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
            ApiError::Client(format!(
                "cannot read kubeconfig {}: {e}: install it with `sticky-macvlan install` or fix ipam.store.kubeconfig",
                path.display()
            ))
        })?;
        KubeClient::from_parsed(kubeconfig, context, &path.display().to_string(), timeout)
    }

    /// From a kubeconfig's text (the installer's, naming the pod's own
    /// service-account files).
    pub fn from_kubeconfig_text(text: &str, timeout: Duration) -> Result<KubeClient, ApiError> {
        let kubeconfig = Kubeconfig::from_yaml(text)
            .map_err(|e| ApiError::Client(format!("cannot read the kubeconfig: {e}")))?;
        KubeClient::from_parsed(kubeconfig, None, "(generated)", timeout)
    }

    fn from_parsed(
        kubeconfig: Kubeconfig,
        context: Option<&str>,
        source: &str,
        timeout: Duration,
    ) -> Result<KubeClient, ApiError> {
        let runtime = runtime()?;
        let config = runtime
            .block_on(Config::from_custom_kubeconfig(
                kubeconfig,
                &KubeConfigOptions {
                    context: context.map(str::to_string),
                    ..KubeConfigOptions::default()
                },
            ))
            .map_err(|e| ApiError::Client(format!("kubeconfig {source}: {e}")))?;
        KubeClient::with_config(runtime, config, timeout)
    }

    fn with_config(
        runtime: Runtime,
        mut config: Config,
        timeout: Duration,
    ) -> Result<KubeClient, ApiError> {
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        let server = config.cluster_url.to_string();
        let client = {
            // Building the client spawns nothing but needs a runtime context.
            let _guard = runtime.enter();
            nodelay_client(config)
                .map_err(|e| ApiError::Client(format!("kube client for {server}: {e}")))?
        };
        Ok(KubeClient {
            runtime,
            client,
            timeout,
            server,
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// The `kube` client underneath, for requests outside `KubeApi` (the
    /// operator commands' admin client builds on it with `run`, `get_opt`
    /// and `paged`, so every request keeps the same deadline and errors).
    pub fn kube(&self) -> Client {
        self.client.clone()
    }

    /// An error of request `what` as the API's answer classifies it.
    pub fn classify(&self, what: &str, e: kube::Error) -> ApiError {
        classify(what, &self.server, e)
    }

    /// An error of a request on a whole collection: a 404 names the
    /// missing CRD.
    pub fn collection_error(&self, what: &str, e: kube::Error) -> ApiError {
        collection_error(what, &self.server, e)
    }

    /// Runs one request with the overall deadline (connect + read can
    /// otherwise add up); a missed deadline is "unreachable".
    pub fn bounded<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> ApiResult<Result<T, kube::Error>> {
        self.bounded_by(self.timeout, what, fut)
    }

    /// `bounded` with a deadline of its own (an Event's is shorter).
    fn bounded_by<T>(
        &self,
        deadline: Duration,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> ApiResult<Result<T, kube::Error>> {
        self.runtime
            .block_on(async { tokio::time::timeout(deadline, fut).await })
            .map_err(|_| {
                ApiError::Unreachable(format!(
                    "{what}: no answer from {} within {} ms",
                    self.server,
                    deadline.as_millis()
                ))
            })
    }

    pub fn run<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> ApiResult<T> {
        self.bounded(what, fut)?
            .map_err(|e| classify(what, &self.server, e))
    }

    /// A read where 404 means "not there".
    pub fn get_opt<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> ApiResult<Option<T>> {
        match self.bounded(what, fut)? {
            Ok(v) => Ok(Some(v)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(match classify(what, &self.server, e) {
                // A 409 on a read is not a write conflict.
                ApiError::Conflict(m) => ApiError::Refused(m),
                other => other,
            }),
        }
    }

    fn claims(&self) -> Api<IPClaim> {
        Api::all(self.client.clone())
    }

    fn locks(&self) -> Api<IPLock> {
        Api::all(self.client.clone())
    }

    /// Every selected object, a page of `LIST_PAGE` at a time, each page
    /// handed to `each` and dropped.
    pub fn paged<K>(
        &self,
        api: &Api<K>,
        what: &str,
        selector: &str,
        mut each: impl FnMut(&K) -> ApiResult<()>,
    ) -> ApiResult<()>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    {
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().labels(selector).limit(LIST_PAGE);
            if let Some(t) = &token {
                lp = lp.continue_token(t);
            }
            let page = self
                .bounded(what, api.list(&lp))?
                .map_err(|e| collection_error(what, &self.server, e))?;
            for o in &page.items {
                each(o)?;
            }
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(());
            }
        }
    }
}

/// The kube crate's client stack (base URI, credentials, impersonation
/// headers) over a connector with TCP_NODELAY. Its own builder leaves Nagle
/// on, and the TLS Finished and the first request then go out as two small
/// writes: the request waits for the server's delayed ACK, 40 ms on Linux,
/// which was most of an ADD's time against kube-apiserver (BENCHMARKS.md 5).
fn nodelay_client(config: Config) -> Result<Client, kube::Error> {
    use kube::client::ConfigExt;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

/// A 404 on the collection itself (list, create) means the resource type
/// does not exist: the CRD is not installed, which no retry fixes.
fn collection_error(what: &str, server: &str, e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(s) if s.code == 404 => ApiError::Refused(format!(
            "{what}: the API server does not know this resource of {} ({}): install the CRDs with `sticky-macvlan crd | kubectl apply -f -` (deploy/10-ipclaim-crd.yaml)",
            super::GROUP,
            s.message
        )),
        other => classify(what, server, other),
    }
}

fn decoded(o: &IPClaim) -> ApiResult<ClaimObject> {
    from_object(o).map_err(ApiError::Refused)
}

impl KubeApi for KubeClient {
    fn get_claim(&self, name: &str) -> ApiResult<Option<ClaimObject>> {
        let api = self.claims();
        self.get_opt(&format!("get ipclaim {name}"), api.get(name))?
            .map(|o| decoded(&o))
            .transpose()
    }

    fn list_claims(&self, selector: &str) -> ApiResult<Vec<ClaimObject>> {
        let mut out = Vec::new();
        self.paged(
            &self.claims(),
            &format!("list ipclaims {selector}"),
            selector,
            |o| {
                out.push(decoded(o)?);
                Ok(())
            },
        )?;
        Ok(out)
    }

    fn get_lock(&self, name: &str) -> ApiResult<Option<LockObject>> {
        let api = self.locks();
        self.get_opt(&format!("get iplock {name}"), api.get(name))?
            .map(|o| from_lock(&o).map_err(ApiError::Refused))
            .transpose()
    }

    fn list_locks(&self, selector: &str) -> ApiResult<Vec<LockObject>> {
        let mut out = Vec::new();
        self.paged(
            &self.locks(),
            &format!("list iplocks {selector}"),
            selector,
            |o| {
                out.push(from_lock(o).map_err(ApiError::Refused)?);
                Ok(())
            },
        )?;
        Ok(out)
    }

    fn taken_addresses(&self, selector: &str) -> ApiResult<BTreeSet<IpAddr>> {
        let mut taken = BTreeSet::new();
        self.paged(
            &self.locks(),
            &format!("list iplocks {selector}"),
            selector,
            |o| {
                taken.insert(from_lock(o).map_err(ApiError::Refused)?.ip);
                Ok(())
            },
        )?;
        Ok(taken)
    }

    fn create_lock(&self, lock: &LockObject) -> ApiResult<LockObject> {
        let api = self.locks();
        let mut o = to_lock(lock);
        o.metadata.uid = None;
        o.metadata.resource_version = None;
        o.metadata.creation_timestamp = None;
        let what = format!(
            "create iplock {}",
            o.metadata.name.clone().unwrap_or_default()
        );
        let created = self
            .bounded(&what, api.create(&PostParams::default(), &o))?
            .map_err(|e| collection_error(&what, &self.server, e))?;
        from_lock(&created).map_err(ApiError::Refused)
    }

    fn delete_lock(&self, name: &str, uid: &str, resource_version: Option<&str>) -> ApiResult<()> {
        let api = self.locks();
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: resource_version.map(str::to_string),
                uid: Some(uid.to_string()),
            }),
            ..DeleteParams::default()
        };
        self.run(&format!("delete iplock {name}"), api.delete(name, &dp))
            .map(drop)
    }

    fn adopt_lock(&self, lock: &LockObject, node: Option<&str>) -> ApiResult<LockObject> {
        let api = self.locks();
        let mut o = to_lock(lock);
        let name = o.metadata.name.clone().unwrap_or_default();
        let what = format!("adopt iplock {name}");
        if o.metadata.resource_version.is_none() {
            return Err(ApiError::Conflict(format!(
                "{what}: no resourceVersion was read"
            )));
        }
        // The server keeps its creationTimestamp and managed fields, and
        // stamps this write's time on the latter.
        o.metadata.creation_timestamp = None;
        let written = lock.rewritten(&lock.identity, node, None);
        o.spec.adoptions = lock.adoptions.saturating_add(1);
        o.spec.node = written.node;
        o.spec.unconfirmed = written.unconfirmed;
        let replaced = self.run(&what, api.replace(&name, &PostParams::default(), &o))?;
        from_lock(&replaced).map_err(ApiError::Refused)
    }

    fn rekey_lock(
        &self,
        lock: &LockObject,
        identity: &str,
        node: Option<&str>,
        judged: &Unconfirmed,
    ) -> ApiResult<LockObject> {
        let api = self.locks();
        let name = lock_name(&lock.network, lock.ip);
        let what = format!("re-key iplock {name} to identity {identity:?}");
        let Some(uid) = lock.uid.as_deref() else {
            return Err(ApiError::Conflict(format!("{what}: no UID was read")));
        };
        // The resourceVersion read is the precondition; without one, the
        // GET's (at the same UID).
        let read = match lock.resource_version {
            Some(_) => lock.clone(),
            None => {
                let Some(o) = self.get_opt(&what, api.get(&name))? else {
                    return Err(ApiError::Conflict(format!("{what}: it is gone")));
                };
                from_lock(&o).map_err(ApiError::Refused)?
            }
        };
        if read.uid.as_deref() != Some(uid) || read.identity != lock.identity {
            return Err(ApiError::Conflict(format!(
                "{what}: it is another lock now, or another identity's"
            )));
        }
        let mut o = to_lock(&read.rewritten(identity, node, Some(judged)));
        // The server keeps its creationTimestamp and managed fields, and
        // stamps this write's time on the latter (the lock is young again).
        o.metadata.creation_timestamp = None;
        let replaced = self.run(&what, api.replace(&name, &PostParams::default(), &o))?;
        from_lock(&replaced).map_err(ApiError::Refused)
    }

    fn clear_lock_mark(&self, lock: &LockObject) -> ApiResult<LockObject> {
        let api = self.locks();
        let mut o = to_lock(lock);
        let name = o.metadata.name.clone().unwrap_or_default();
        let what = format!("clear the mark of iplock {name}");
        if o.metadata.resource_version.is_none() {
            return Err(ApiError::Conflict(format!(
                "{what}: no resourceVersion was read"
            )));
        }
        o.metadata.creation_timestamp = None;
        o.spec.unconfirmed = None;
        let replaced = self.run(&what, api.replace(&name, &PostParams::default(), &o))?;
        from_lock(&replaced).map_err(ApiError::Refused)
    }

    fn create_claim(&self, obj: &ClaimObject) -> ApiResult<ClaimObject> {
        let api = self.claims();
        let mut o = to_object(obj);
        o.metadata.resource_version = None;
        let what = format!(
            "create ipclaim {}",
            o.metadata.name.clone().unwrap_or_default()
        );
        let created = self
            .bounded(&what, api.create(&PostParams::default(), &o))?
            .map_err(|e| collection_error(&what, &self.server, e))?;
        decoded(&created)
    }

    fn replace_claim(&self, obj: &ClaimObject) -> ApiResult<ClaimObject> {
        let api = self.claims();
        let o = to_object(obj);
        let name = o.metadata.name.clone().unwrap_or_default();
        let replaced = self.run(
            &format!("replace ipclaim {name}"),
            api.replace(&name, &PostParams::default(), &o),
        )?;
        decoded(&replaced)
    }

    fn delete_claim(&self, name: &str, resource_version: &str) -> ApiResult<()> {
        let api = self.claims();
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(resource_version.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        self.run(&format!("delete ipclaim {name}"), api.delete(name, &dp))
            .map(drop)
    }

    fn get_pod(&self, namespace: &str, name: &str) -> ApiResult<Option<PodFacts>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = self.get_opt(&format!("get pod {namespace}/{name}"), api.get(name))?;
        Ok(pod.map(|p| pod_facts(&p)))
    }

    fn get_node(&self, name: &str) -> ApiResult<Option<ClusterNode>> {
        let api: Api<Node> = Api::all(self.client.clone());
        let node = self.get_opt(&format!("get node {name}"), api.get(name))?;
        Ok(node.map(|n| cluster_node(&n)))
    }

    fn get_stateful_set(&self, namespace: &str, name: &str) -> ApiResult<Option<StatefulSetFacts>> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), namespace);
        let set = self.get_opt(
            &format!("get statefulset {namespace}/{name}"),
            api.get(name),
        )?;
        Ok(set.map(|s| stateful_set_facts(&s)))
    }

    fn post_event(&self, event: &PodEvent) -> ApiResult<()> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &event.namespace);
        let started = std::time::Instant::now();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let name = crate::events::event_name(event);
        let object = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(event.namespace.clone()),
                // What reconcile's metrics select and count them by.
                labels: Some(
                    [(
                        super::LABEL_NETWORK.to_string(),
                        super::slug(&event.network),
                    )]
                    .into(),
                ),
                annotations: Some(
                    [(super::LABEL_NETWORK.to_string(), event.network.clone())].into(),
                ),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(event.pod.clone()),
                namespace: Some(event.namespace.clone()),
                uid: event.pod_uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some(event.reason.into()),
            message: Some(event.message.clone()),
            type_: Some(if event.warning { "Warning" } else { "Normal" }.into()),
            source: Some(EventSource {
                component: Some(EVENT_COMPONENT.into()),
                host: Some(event.node.clone()),
            }),
            reporting_component: Some(EVENT_COMPONENT.into()),
            reporting_instance: Some(event.node.clone()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now.clone()),
            count: Some(1),
            ..Event::default()
        };
        // One deadline for the whole post, however many requests it takes.
        let left = || EVENT_DEADLINE.saturating_sub(started.elapsed());
        let what = format!(
            "create event {name} on pod {}/{}",
            event.namespace, event.pod
        );
        match self.bounded_by(left(), &what, api.create(&PostParams::default(), &object))? {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(classify(&what, &self.server, e)),
        }
        // Told before: count it, as kubelet's event recorder does.
        let what = format!(
            "count event {name} on pod {}/{}",
            event.namespace, event.pod
        );
        // Two nodes bumping the same Event at once (the same refusal seen
        // on both): the later patch fails its resourceVersion precondition
        // with a 409, so it reads the count again, for as long as the same
        // deadline allows (each round one bump wins, so all get through).
        let mut lost = None;
        while !left().is_zero() {
            let seen = self
                .bounded_by(left(), &what, api.get(&name))?
                .map_err(|e| classify(&what, &self.server, e))?;
            let bump = serde_json::json!({
                "metadata": {"resourceVersion": seen.metadata.resource_version},
                "count": seen.count.unwrap_or(1).saturating_add(1),
                "lastTimestamp": now,
            });
            match self.bounded_by(
                left(),
                &what,
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&bump)),
            )? {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    lost = Some(classify(&what, &self.server, kube::Error::Api(s)));
                }
                Err(e) => return Err(classify(&what, &self.server, e)),
            }
        }
        Err(lost.unwrap_or_else(|| {
            ApiError::Unreachable(format!("{what}: no answer within {EVENT_DEADLINE:?}"))
        }))
    }
}

pub fn stateful_set_facts(s: &StatefulSet) -> StatefulSetFacts {
    // Negative counts are refused by the API; read them as unset.
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok());
    StatefulSetFacts {
        uid: s.metadata.uid.clone().unwrap_or_default(),
        replicas: count(s.spec.replicas).unwrap_or(1),
        ordinal_start: count(s.spec.ordinals.as_ref().and_then(|o| o.start)).unwrap_or(0),
    }
}

pub fn pod_facts(p: &Pod) -> PodFacts {
    let stateful_set = p.metadata.owner_references.as_ref().and_then(|owners| {
        owners
            .iter()
            .filter(|o| o.controller == Some(true))
            .find_map(|o| {
                Some(StableOwner {
                    kind: stable_owner_kind(&o.api_version, &o.kind)?,
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                })
            })
    });
    PodFacts {
        uid: p.metadata.uid.clone().unwrap_or_default(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        phase: p.status.as_ref().and_then(|s| s.phase.clone()),
        terminating: p.metadata.deletion_timestamp.is_some(),
        identity_annotation: p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(IDENTITY_ANNOTATION).cloned()),
        stateful_set,
        labels: p.metadata.labels.clone().unwrap_or_default(),
        annotations: p.metadata.annotations.clone().unwrap_or_default(),
    }
}

pub fn cluster_node(n: &Node) -> ClusterNode {
    let spec = n.spec.as_ref();
    ClusterNode {
        out_of_service: spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT)),
        ready: n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status == "True"),
        boot_id: n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.trim().to_string())
            .filter(|b| !b.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    fn answer(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: reason.into(),
            ..kube::core::Status::default()
        }))
    }

    #[test]
    fn a_401_says_the_token_is_no_longer_valid_not_rbac() {
        let e = classify(
            "get iplock migr.172.31.77.10",
            "https://10.0.0.1:6443",
            answer(401, "Unauthorized"),
        );
        let msg = cni::CniError::from(StoreError::from(e)).msg;
        assert!(msg.contains("get iplock migr.172.31.77.10"), "{msg}");
        assert!(
            msg.contains("token") && msg.contains("no longer valid") && msg.contains("installer"),
            "{msg}"
        );
        assert!(!msg.contains("RBAC"), "{msg}");
        // A 403 is still the RBAC's (or the node-scope policy's) answer.
        let e = classify("get iplock x", "https://a", answer(403, "Forbidden"));
        let msg = cni::CniError::from(StoreError::from(e)).msg;
        assert!(msg.contains("RBAC"), "{msg}");
    }
}
