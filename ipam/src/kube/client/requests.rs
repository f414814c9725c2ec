//! The hot path's requests: `KubeApi` on the real API server, what an
//! ADD, DEL, CHECK or GC of the kubernetes store asks.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};

use super::facts::{cluster_node, pod_facts, stateful_set_facts};
use super::{classify, collection_error, KubeClient, EVENT_COMPONENT, EVENT_DEADLINE};
use crate::claim::Unconfirmed;
use crate::events::PodEvent;
use crate::kube::crd::{from_lock, from_object, to_lock, to_object, IPClaim};
use crate::kube::{lock_name, ApiError, ApiResult, ClaimObject, ClusterNode, KubeApi, LockObject};
use crate::pod::PodFacts;
use crate::retention::StatefulSetFacts;

/// A dynamic object as the JSON the pure layer reads.
fn as_json(what: &str, o: &DynamicObject) -> ApiResult<serde_json::Value> {
    serde_json::to_value(o).map_err(|e| ApiError::Refused(format!("{what}: {e}")))
}

impl KubeClient {
    /// A namespaced resource of a CRD this crate has no type for.
    fn dynamic(
        &self,
        namespace: &str,
        (group, version, kind, plural): (&str, &str, &str, &str),
    ) -> Api<DynamicObject> {
        let resource = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: kind.into(),
            plural: plural.into(),
        };
        Api::namespaced_with(self.client.clone(), namespace, &resource)
    }

    fn ipam_claims(&self, namespace: &str) -> Api<DynamicObject> {
        use crate::ipamclaim::{GROUP, KIND, PLURAL, VERSION};
        self.dynamic(namespace, (GROUP, VERSION, KIND, PLURAL))
    }

    fn vmis(&self, namespace: &str) -> Api<DynamicObject> {
        use crate::ipamclaim::{VMI_GROUP, VMI_KIND, VMI_PLURAL, VMI_VERSION};
        self.dynamic(namespace, (VMI_GROUP, VMI_VERSION, VMI_KIND, VMI_PLURAL))
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

    fn get_ipam_claim(&self, namespace: &str, name: &str) -> ApiResult<Option<serde_json::Value>> {
        let api = self.ipam_claims(namespace);
        let what = format!("get ipamclaim {namespace}/{name}");
        self.get_crd_object_opt(&what, name, api.get(name))?
            .map(|o| as_json(&what, &o))
            .transpose()
    }

    fn replace_ipam_claim_status(
        &self,
        namespace: &str,
        claim: &serde_json::Value,
    ) -> ApiResult<()> {
        let api = self.ipam_claims(namespace);
        let name = claim["metadata"]["name"].as_str().unwrap_or_default();
        let what = format!("update ipamclaim/status {namespace}/{name}");
        let object: DynamicObject = serde_json::from_value(claim.clone())
            .map_err(|e| ApiError::Refused(format!("{what}: {e}")))?;
        self.run(
            &what,
            api.replace_status(name, &PostParams::default(), &object),
        )
        .map(drop)
    }

    fn get_vmi(
        &self,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Option<crate::ipamclaim::VmiFacts>> {
        use crate::ipamclaim::VmiFacts;
        let api = self.vmis(namespace);
        let what = format!("get vmi {namespace}/{name}");
        self.get_crd_object_opt(&what, name, api.get(name))?
            .map(|o| as_json(&what, &o).map(|v| VmiFacts::parse(&v)))
            .transpose()
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
                        crate::kube::LABEL_NETWORK.to_string(),
                        crate::kube::slug(&event.network),
                    )]
                    .into(),
                ),
                annotations: Some(
                    [(
                        crate::kube::LABEL_NETWORK.to_string(),
                        event.network.clone(),
                    )]
                    .into(),
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
