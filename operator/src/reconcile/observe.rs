//! Observe: what the build depends on that only the API server knows.

use super::ReconcileError;
use super::status::ModelState;
use crate::api::InferaDeployment;
use crate::names;
use crate::plan::{EtcdClientTls, Platform};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};

/// Whether the API server serves `leaderworkerset.x-k8s.io/v1` LeaderWorkerSets.
pub async fn lws_installed(client: &Client) -> bool {
    match client
        .list_api_group_resources("leaderworkerset.x-k8s.io/v1")
        .await
    {
        Ok(list) => list.resources.iter().any(|r| r.name == "leaderworkersets"),
        Err(_) => false,
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
