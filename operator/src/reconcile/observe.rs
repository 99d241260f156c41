//! Observe: what the build depends on that only the API server knows.

use super::ReconcileError;
use super::status::ModelState;
use crate::api::InferaDeployment;
use crate::render::names;
use k8s_openapi::api::batch::v1::Job;
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

/// The model download's state: not needed (PVC or host path), running, failed, done.
pub async fn model_state(
    client: &Client,
    idep: &InferaDeployment,
    namespace: &str,
) -> Result<ModelState, ReconcileError> {
    if idep.spec.model.source.hugging_face.is_none() {
        return Ok(ModelState::NotNeeded);
    }
    let name = names::model_download(&idep.metadata.name.clone().unwrap_or_default());
    let job = Api::<Job>::namespaced(client.clone(), namespace)
        .get_opt(&name)
        .await
        .map_err(|e| ReconcileError::Read("reading the model download Job", e))?;
    Ok(job_state(job.as_ref()))
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
