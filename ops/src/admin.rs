//! The operator commands' own requests to the API server: who the
//! credentials are, what RBAC grants them, the installer's token, the
//! DaemonSet, the NADs, our Events and Whereabouts' pools. None of them is
//! made on an ADD, so they live here, apart from the hot path's `KubeApi`
//! (`sticky_ipam::kube`), on the same `KubeClient` transport: the same
//! deadline and the same error classes.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use sticky_ipam::kube::client::KubeClient;
use sticky_ipam::kube::crd::{IPClaim, IPLock};
use sticky_ipam::kube::{ApiError, ApiResult, Permission, LABEL_NETWORK};

/// What `doctor` compares of the installer DaemonSet: the image its pods
/// run and how far its rollout got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonSetFacts {
    /// The first container's image.
    pub image: String,
    /// Nodes that should run it, and those running the latest template.
    pub desired: u64,
    pub updated: u64,
}

pub trait AdminApi {
    /// A token of service account `namespace/name` bound to node `node`
    /// (TokenRequest with a Node as bound object), valid for `lifetime` or
    /// what the API server caps it to, with its expiry in Unix seconds.
    /// The installer writes it for the plugin on the node: a token bound
    /// to the installer's own pod would die with that pod, leaving the
    /// node without credentials through every DaemonSet rollout.
    fn node_bound_token(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        lifetime: Duration,
    ) -> ApiResult<(String, i64)>;

    /// Every Whereabouts IPPool (v0.9, `whereabouts.cni.cncf.io/v1alpha1`)
    /// as JSON, for `import-whereabouts`; none when its CRD is absent.
    fn list_whereabouts_pools(&self) -> ApiResult<Vec<serde_json::Value>>;

    /// Who the API server takes these credentials for (a
    /// SelfSubjectReview, which every authenticated user may make): the
    /// first request `doctor` makes, so a rejected token shows as a 401.
    fn who_am_i(&self) -> ApiResult<String>;

    /// Whether these credentials may do `p`, cluster-wide (a
    /// SelfSubjectAccessReview; the API server's authorizer answers).
    fn may(&self, p: &Permission) -> ApiResult<bool>;

    /// The Events the plugins posted (`post_event`), every namespace, paged:
    /// for reconcile's metrics.
    fn our_events(&self) -> ApiResult<Vec<sticky_ipam::events::SeenEvent>>;

    /// The NetworkAttachmentDefinitions' configs (spec.config), every
    /// namespace; empty when their CRD is not installed.
    fn nad_configs(&self) -> ApiResult<Vec<String>>;

    /// The installer DaemonSet NAMESPACE/NAME, None when it does not exist
    /// (for `doctor`; the installer's Role grants this one get).
    fn daemon_set(&self, namespace: &str, name: &str) -> ApiResult<Option<DaemonSetFacts>>;

    /// Whether the IPClaim and IPLock resources are served: a one-object
    /// listing of each, whose 404 names the missing CRD.
    fn resources_served(&self) -> ApiResult<()>;
}

impl AdminApi for KubeClient {
    fn node_bound_token(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        lifetime: Duration,
    ) -> ApiResult<(String, i64)> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        use k8s_openapi::api::core::v1::ServiceAccount;
        let api: Api<ServiceAccount> = Api::namespaced(self.kube(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                // The API server's own audience: the default.
                audiences: None,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.into()),
                    uid: None,
                }),
                expiration_seconds: Some(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX)),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let what =
            format!("create token for serviceaccount {namespace}/{name} bound to node {node}");
        let granted = self
            .bounded(
                &what,
                api.create_token_request(name, &PostParams::default(), &request),
            )?
            .map_err(|e| self.classify(&what, e))?;
        let no_token = || ApiError::Refused(format!("{what}: the answer has no token"));
        let status = granted.status.ok_or_else(no_token)?;
        let token = status
            .token
            .filter(|t| !t.is_empty())
            .ok_or_else(no_token)?;
        let expiry = status
            .expiration_timestamp
            .map(|t| t.0.as_second())
            .ok_or_else(no_token)?;
        Ok((token, expiry))
    }

    fn list_whereabouts_pools(&self) -> ApiResult<Vec<serde_json::Value>> {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("whereabouts.cni.cncf.io", "v1alpha1", "IPPool"),
            "ippools",
        );
        let api: Api<DynamicObject> = Api::all_with(self.kube(), &resource);
        let what = "list whereabouts ippools";
        match self.bounded(what, api.list(&ListParams::default()))? {
            Ok(list) => list
                .items
                .into_iter()
                .map(|o| {
                    serde_json::to_value(o).map_err(|e| ApiError::Refused(format!("{what}: {e}")))
                })
                .collect(),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
            Err(e) => Err(self.classify(what, e)),
        }
    }

    fn who_am_i(&self) -> ApiResult<String> {
        use k8s_openapi::api::authentication::v1::SelfSubjectReview;
        let api: Api<SelfSubjectReview> = Api::all(self.kube());
        let review = self.run(
            "create selfsubjectreview",
            api.create(&PostParams::default(), &SelfSubjectReview::default()),
        )?;
        Ok(review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_default())
    }

    fn may(&self, p: &Permission) -> ApiResult<bool> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.kube());
        // "ipamclaims/status" is a subresource to the review, as to RBAC.
        let (resource, subresource) = p
            .resource
            .split_once('/')
            .map_or((p.resource, None), |(r, s)| (r, Some(s.to_string())));
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(p.group.into()),
                    resource: Some(resource.into()),
                    subresource,
                    verb: Some(p.verb.into()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = self.run(
            &format!("create selfsubjectaccessreview ({})", p.describe()),
            api.create(&PostParams::default(), &review),
        )?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }

    fn our_events(&self) -> ApiResult<Vec<sticky_ipam::events::SeenEvent>> {
        let api: Api<Event> = Api::all(self.kube());
        let mut out = Vec::new();
        self.paged(&api, "list events", LABEL_NETWORK, |e| {
            let network = e
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LABEL_NETWORK).cloned())
                .unwrap_or_default();
            out.push(sticky_ipam::events::SeenEvent {
                uid: e.metadata.uid.clone().unwrap_or_default(),
                network,
                reason: e.reason.clone().unwrap_or_default(),
                count: e.count.and_then(|c| u64::try_from(c).ok()).unwrap_or(1),
            });
            Ok(())
        })?;
        Ok(out)
    }

    fn nad_configs(&self) -> ApiResult<Vec<String>> {
        use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
        let gvk = GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "network-attachment-definitions");
        let api: Api<DynamicObject> = Api::all_with(self.kube(), &resource);
        let mut out = Vec::new();
        let listed = self.paged(&api, "list network-attachment-definitions", "", |o| {
            if let Some(config) = o.data["spec"]["config"].as_str() {
                out.push(config.to_string());
            }
            Ok(())
        });
        match listed {
            Ok(()) => Ok(out),
            Err(ApiError::Refused(m)) if m.contains("does not know this resource") => {
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }

    fn daemon_set(&self, namespace: &str, name: &str) -> ApiResult<Option<DaemonSetFacts>> {
        use k8s_openapi::api::apps::v1::DaemonSet;
        let api: Api<DaemonSet> = Api::namespaced(self.kube(), namespace);
        let what = format!("get daemonset {namespace}/{name}");
        Ok(self.get_opt(&what, api.get(name))?.map(|ds| {
            let image = ds
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            let status = ds.status.unwrap_or_default();
            let count = |n: Option<i32>| u64::try_from(n.unwrap_or(0)).unwrap_or(0);
            DaemonSetFacts {
                image,
                desired: count(Some(status.desired_number_scheduled)),
                updated: count(status.updated_number_scheduled),
            }
        }))
    }

    fn resources_served(&self) -> ApiResult<()> {
        let lp = ListParams::default().limit(1);
        let what = "list ipclaims";
        self.bounded(what, Api::<IPClaim>::all(self.kube()).list(&lp))?
            .map_err(|e| self.collection_error(what, e))?;
        let what = "list iplocks";
        self.bounded(what, Api::<IPLock>::all(self.kube()).list(&lp))?
            .map_err(|e| self.collection_error(what, e))?;
        Ok(())
    }
}
