//! Observe: what the build depends on that only the API server knows.

use super::ReconcileError;
use super::status::ModelState;
use crate::api::InferaDeployment;
use crate::api::PlatformVersion;
use crate::names;
use crate::plan::engine_platform::{PLATFORM_ANNOTATION, TEMPLATE_DIGEST_ANNOTATION};
use crate::plan::rollout::{LivePod, LiveWorkers};
use crate::plan::{EtcdClientTls, LiveEngines, Platform, PullSecretData};
use crate::render::Kind;
use crate::render::workers::REVISION_LABEL;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodSpec, Secret};
use kube::api::DynamicObject;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};

/// Whether the API server serves `leaderworkerset.x-k8s.io/v1` LeaderWorkerSets.
pub async fn lws_installed(client: &Client) -> bool {
    served(client, Kind::LeaderWorkerSet).await
}

/// Whether the API server serves `kind` (its CRD is installed).
pub async fn served(client: &Client, kind: Kind) -> bool {
    let ar = kind.api_resource();
    match client.list_api_group_resources(&ar.api_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == ar.plural),
        Err(_) => false,
    }
}

/// Whether the Gateway `namespace/name` (gateway.networking.k8s.io/v1) exists; `None`
/// when it cannot be read (Gateway API not installed, or no `get` on gateways there:
/// a namespaced install reads only its own namespace).
pub async fn gateway_exists(client: &Client, namespace: &str, name: &str) -> Option<bool> {
    let ar = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
        "gateways",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    match api.get_opt(name).await {
        Ok(found) => Some(found.is_some()),
        Err(e) => {
            tracing::debug!("reading Gateway {namespace}/{name}: {e}");
            None
        }
    }
}

/// `status.inferencePool`: the picker's Deployment and the HTTPRoute as applied (the
/// API server's answer carries their status), and whether the route's Gateway exists.
pub async fn fetch_pool_status(
    client: &Client,
    namespace: &str,
    name: &str,
    pool: &crate::api::InferencePoolSpec,
    applied: &[super::apply::Applied],
) -> crate::api::InferencePoolStatus {
    let picker = names::picker(name);
    let route = match &pool.gateway_ref {
        Some(gw) => {
            let gw_namespace = gw.namespace.as_deref().unwrap_or(namespace);
            let object = applied
                .iter()
                .find(|a| a.kind == Kind::HttpRoute)
                .and_then(|a| serde_json::to_value(&a.object).ok());
            let found = gateway_exists(client, gw_namespace, &gw.name).await;
            Some(super::pool_status::build_route_status(
                &names::http_route(name),
                object.as_ref(),
                (gw_namespace, &gw.name),
                found,
            ))
        }
        None => None,
    };
    let pool_object = applied
        .iter()
        .find(|a| a.kind == Kind::InferencePool)
        .and_then(|a| serde_json::to_value(&a.object).ok());
    crate::api::InferencePoolStatus {
        pool_accepted: super::pool_status::build_pool_accepted(pool_object.as_ref()),
        pool: names::inference_pool(name),
        picker_replicas: pool.picker_replicas,
        picker_ready_replicas: applied
            .iter()
            .find(|a| a.kind == Kind::Deployment && a.name == picker)
            .map(|a| super::count(&a.object, "readyReplicas"))
            .unwrap_or(0),
        picker,
        route,
    }
}

/// The cluster etcd's client certificate, when `idep` uses that etcd and it requires
/// one: the data of the Secret the chart named (None when it does not exist; the build
/// says so).
pub async fn etcd_client_tls(
    client: &Client,
    idep: &InferaDeployment,
    platform: &Platform,
) -> Result<Option<EtcdClientTls>, ReconcileError> {
    let Some((namespace, name)) = &platform.etcd_client_secret else {
        return Ok(None);
    };
    if !Platform::uses_cluster_etcd(&idep.spec) {
        return Ok(None);
    }
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::Observe {
            what: "the cluster etcd's client certificate",
            source,
        })?;
    Ok(secret.map(|s| s.data.unwrap_or_default()))
}

/// Annotation on the model-cache PVC naming the `<id>@<revision>` it holds complete.
pub const DOWNLOADED_ANNOTATION: &str = "infera.amd.com/downloaded";

/// What the cache must say it holds for the current spec.
pub fn wanted_download(hf: &crate::api::HuggingFaceSource) -> String {
    format!("{}@{}", hf.id, hf.revision.as_deref().unwrap_or("main"))
}

/// The model download's state: not needed (PVC or host path), running, failed, done.
/// A finished download is recorded on the cache PVC, so workers keep running when the
/// Job is gone (deleted, or replaced after an image change).
pub async fn model_state(
    client: &Client,
    idep: &InferaDeployment,
    namespace: &str,
) -> Result<ModelState, ReconcileError> {
    let Some(hf) = &idep.spec.model.source.hugging_face else {
        return Ok(ModelState::NotNeeded);
    };
    let instance = idep.metadata.name.clone().unwrap_or_default();
    let want = wanted_download(hf);
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let claim = names::model_cache(&instance);
    let pvc = pvcs
        .get_opt(&claim)
        .await
        .map_err(|source| ReconcileError::Observe {
            what: "the model cache PVC",
            source,
        })?;
    let recorded = pvc
        .as_ref()
        .and_then(|p| p.metadata.annotations.as_ref())
        .and_then(|a| a.get(DOWNLOADED_ANNOTATION));
    if recorded == Some(&want) {
        return Ok(ModelState::Ready);
    }
    let job = Api::<Job>::namespaced(client.clone(), namespace)
        .get_opt(&names::model_download(&instance))
        .await
        .map_err(|source| ReconcileError::Observe {
            what: "the model download Job",
            source,
        })?;
    let state = job_state(job.as_ref());
    if state == ModelState::Ready && pvc.is_some() {
        let patch = serde_json::json!({"metadata": {"annotations": {DOWNLOADED_ANNOTATION: want}}});
        pvcs.patch(&claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| ReconcileError::Record {
                what: "the download on the cache PVC",
                source,
            })?;
    }
    Ok(state)
}

/// The state a download Job reports (pure).
pub fn job_state(job: Option<&Job>) -> ModelState {
    let conditions = job
        .and_then(|j| j.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .cloned()
        .unwrap_or_default();
    let holds = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t && c.status == "True")
    };
    if holds("Complete").is_some() {
        ModelState::Ready
    } else if let Some(failed) = holds("Failed") {
        ModelState::Failed(format!(
            "the model download Job failed ({}): {}; check `kubectl logs job/{}`",
            failed.reason.clone().unwrap_or_default(),
            failed.message.clone().unwrap_or_default(),
            job.and_then(|j| j.metadata.name.clone())
                .unwrap_or_default()
        ))
    } else {
        ModelState::Downloading
    }
}

/// The pods of a deployment (engines, gateways, the model download), for what keeps
/// them from running.
pub async fn fetch_pods(
    client: &Client,
    namespace: &str,
    instance: &str,
) -> Result<Vec<Pod>, ReconcileError> {
    let selector = format!("{}={instance}", infera_proto::discovery::DEPLOYMENT_LABEL);
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|list| list.items)
        .map_err(|source| ReconcileError::Observe {
            what: "the deployment's pods",
            source,
        })
}

/// The deployment's engine workloads by name (its StatefulSets, and LeaderWorkerSets
/// where that CRD is served): what the operator recorded on each and its pods' images,
/// so a kept release renders the same template ([`crate::plan::engine_platform`]).
pub async fn engine_workloads(
    client: &Client,
    namespace: &str,
    instance: &str,
    lws: bool,
    pods: &[Pod],
) -> Result<std::collections::BTreeMap<String, LiveEngines>, ReconcileError> {
    let selector = format!(
        "{},{}=engine",
        names::children_selector(instance),
        names::COMPONENT_LABEL
    );
    let params = ListParams::default().labels(&selector);
    let mut out = std::collections::BTreeMap::new();
    let sets = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .list(&params)
        .await
        .map_err(|source| ReconcileError::Observe {
            what: "the engine StatefulSets",
            source,
        })?;
    for set in sets {
        let spec = set.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let name = set.metadata.name.clone().unwrap_or_default();
        let mut live = build_live_engines(set.metadata.annotations.as_ref(), spec);
        live.workers = Some(build_live_workers(&set, pods));
        out.insert(name, live);
    }
    if lws {
        let ar = Kind::LeaderWorkerSet.api_resource();
        let sets = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &ar)
            .list(&params)
            .await
            .map_err(|source| ReconcileError::Observe {
                what: "the engine LeaderWorkerSets",
                source,
            })?;
        for set in sets {
            let spec: Option<PodSpec> = serde_json::from_value(
                set.data["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"].clone(),
            )
            .ok();
            let name = set.metadata.name.clone().unwrap_or_default();
            out.insert(
                name,
                build_live_engines(set.metadata.annotations.as_ref(), spec.as_ref()),
            );
        }
    }
    Ok(out)
}

/// What an engine workload's annotations and pod spec say (pure).
pub fn build_live_engines(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    spec: Option<&PodSpec>,
) -> LiveEngines {
    let recorded = annotations.and_then(|a| a.get(PLATFORM_ANNOTATION));
    let image = |name: &str| {
        spec.and_then(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(&s.containers)
                .find(|c| c.name == name)
                .and_then(|c| c.image.clone())
        })
    };
    LiveEngines {
        version: recorded.and_then(|v| PlatformVersion::parse(v)),
        recorded: recorded.is_some(),
        template_digest: annotations.and_then(|a| a.get(TEMPLATE_DIGEST_ANNOTATION).cloned()),
        sidecar: image("sidecar"),
        kvd: image("kvd"),
        engine: image("engine"),
        frontend: image("frontend"),
        workers: None,
    }
}

/// A StatefulSet's window of ordinals and its pods, for the rollout (pure).
pub fn build_live_workers(set: &StatefulSet, pods: &[Pod]) -> LiveWorkers {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    let spec = set.spec.as_ref();
    let owned = |pod: &&Pod| {
        pod.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "StatefulSet" && o.name == name && o.controller == Some(true))
    };
    LiveWorkers {
        start: spec
            .and_then(|s| s.ordinals.as_ref())
            .and_then(|o| o.start)
            .unwrap_or(0),
        replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
        pods: pods
            .iter()
            .filter(owned)
            .filter_map(|p| build_live_pod(name, p))
            .collect(),
    }
}

/// One pod of StatefulSet `set` (pure): its ordinal from `apps.kubernetes.io/pod-index`,
/// else from its name.
pub fn build_live_pod(set: &str, pod: &Pod) -> Option<LivePod> {
    let labels = pod.metadata.labels.as_ref();
    let ordinal = labels
        .and_then(|l| l.get("apps.kubernetes.io/pod-index"))
        .and_then(|i| i.parse().ok())
        .or_else(|| {
            pod.metadata
                .name
                .as_deref()?
                .strip_prefix(set)?
                .strip_prefix('-')?
                .parse()
                .ok()
        })?;
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let condition = |type_: &str| conditions.and_then(|c| c.iter().find(|c| c.type_ == type_));
    let unschedulable = condition("PodScheduled")
        .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .map(|c| {
            c.message
                .clone()
                .unwrap_or_else(|| "the pod cannot be scheduled".into())
        });
    Some(LivePod {
        ordinal,
        revision: labels.and_then(|l| l.get(REVISION_LABEL).cloned()),
        ready: condition("Ready").is_some_and(|c| c.status == "True"),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        unschedulable,
    })
}

/// The data of the operator's pull secrets that exist (in its own namespace), by name:
/// copied into each deployment's namespace.
pub async fn pull_secrets(
    client: &Client,
    platform: &Platform,
) -> Result<std::collections::BTreeMap<String, PullSecretData>, ReconcileError> {
    let mut out = std::collections::BTreeMap::new();
    let Some(namespace) = &platform.operator_namespace else {
        return Ok(out);
    };
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    for name in &platform.pull_secrets {
        let secret = api
            .get_opt(name)
            .await
            .map_err(|source| ReconcileError::Observe {
                what: "the operator's pull secrets",
                source,
            })?;
        if let Some(s) = secret {
            let type_ = s
                .type_
                .unwrap_or_else(|| "kubernetes.io/dockerconfigjson".into());
            out.insert(name.clone(), (type_, s.data.unwrap_or_default()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_statefulsets_window_and_its_pods_as_the_rollout_reads_them() {
        let set: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d-decode"},
            "spec": {"replicas": 2, "ordinals": {"start": 3}, "selector": {}, "serviceName": "d-decode",
                     "template": {}},
        }))
        .unwrap();
        let owner = serde_json::json!([{"apiVersion": "apps/v1", "kind": "StatefulSet",
            "name": "d-decode", "uid": "u", "controller": true}]);
        let pods = [
            pod(serde_json::json!({
                "metadata": {"name": "d-decode-3", "ownerReferences": owner,
                    "labels": {"apps.kubernetes.io/pod-index": "3", "infera.amd.com/engine-revision": "5b1"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
            pod(serde_json::json!({
                "metadata": {"name": "d-decode-4", "ownerReferences": owner,
                    "labels": {"infera.amd.com/engine-revision": "7c9"}},
                "status": {"conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/1 nodes are available: 1 Insufficient amd.com/gpu."}]}})),
            // Another workload's pod.
            pod(serde_json::json!({"metadata": {"name": "d-prefill-0",
                "labels": {"apps.kubernetes.io/pod-index": "0"}}})),
        ];
        let live = build_live_workers(&set, &pods);
        assert_eq!((live.start, live.replicas), (3, 2));
        assert_eq!(
            live.pods,
            [
                LivePod {
                    ordinal: 3,
                    revision: Some("5b1".into()),
                    ready: true,
                    terminating: false,
                    unschedulable: None,
                },
                LivePod {
                    ordinal: 4,
                    revision: Some("7c9".into()),
                    ready: false,
                    terminating: false,
                    unschedulable: Some(
                        "0/1 nodes are available: 1 Insufficient amd.com/gpu.".into()
                    ),
                },
            ]
        );
    }
}
