//! The real `KubeApi`: the `kube` crate over HTTP(S), built from the
//! kubeconfig named in the CNI config (kubelet execs CNI plugins, so there
//! is no in-cluster environment). Each call blocks on a current-thread
//! runtime owned by the client; every request is bounded by the configured
//! timeout, because kubelet gives a whole sandbox only a few minutes.

use std::path::Path;
use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::runtime::Runtime;

mod facts;
mod requests;

pub use facts::{cluster_node, pod_facts, stateful_set_facts};

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

use super::crd::{IPClaim, IPLock};
use super::{ApiError, ApiResult};

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
        self.read_opt(what, fut, |_| true)
    }

    /// `get_opt` for an object of a CRD: only a 404 naming the object
    /// means "not there". A 404 for the resource itself (its CRD not
    /// installed, or not served at this version) says nothing of the
    /// object, and freeing what it owns on that would free them all.
    pub fn get_crd_object_opt<T>(
        &self,
        what: &str,
        name: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> ApiResult<Option<T>> {
        self.read_opt(what, fut, |s| {
            s.details.as_ref().is_some_and(|d| d.name == name)
        })
    }

    /// A read whose 404 means "not there" when `names_object` says the
    /// answer is about the object, else that the resource is not served.
    fn read_opt<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
        names_object: impl Fn(&kube::core::Status) -> bool,
    ) -> ApiResult<Option<T>> {
        match self.bounded(what, fut)? {
            Ok(v) => Ok(Some(v)),
            Err(kube::Error::Api(s)) if s.code == 404 && names_object(&s) => Ok(None),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(ApiError::Refused(format!(
                "{what}: the API server does not serve the resource ({}): is its CRD installed?",
                s.message
            ))),
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
