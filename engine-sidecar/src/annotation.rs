//! Kubernetes discovery: the worker record in the engine Pod's
//! `infera.amd.com/worker-info` annotation instead of etcd. The annotation is written once
//! the engine is healthy, written again when the record changes, re-asserted periodically
//! (someone may strip it), and removed on
//! shutdown before the drain; a Pod being deleted leaves routing through its
//! `deletionTimestamp` anyway.

use crate::registration::RegistrationState;
use infera_proto::discovery::WORKER_INFO_ANNOTATION;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;
use tokio::sync::watch;

/// How often the annotation is re-asserted.
pub const REASSERT_INTERVAL: Duration = Duration::from_secs(30);

/// Where the record goes.
#[derive(Debug, Clone)]
pub struct PodTarget {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
}

async fn set(api: &Api<Pod>, name: &str, value: serde_json::Value) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {WORKER_INFO_ANNOTATION: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Keeps the annotation on the Pod until `stop`, then removes it.
pub async fn run_annotation(
    target: PodTarget,
    mut record_json: watch::Receiver<String>,
    state: watch::Sender<RegistrationState>,
    mut stop: watch::Receiver<bool>,
) {
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(
                "kubernetes discovery: no API client ({e}); the worker is not registered"
            );
            return;
        }
    };
    let api: Api<Pod> = Api::namespaced(client, &target.namespace);
    // Once every sender is gone the record cannot change: only the re-assertion remains.
    let mut changes = true;
    loop {
        let value = record_json.borrow_and_update().clone();
        match set(&api, &target.name, json!(value)).await {
            Ok(()) => {
                if !state.borrow().registered {
                    tracing::info!(
                        "registered in the annotation of pod {}/{}",
                        target.namespace,
                        target.name
                    );
                    state.send_modify(|s| {
                        s.registered = true;
                        s.registrations += 1;
                    });
                }
            }
            Err(e) => tracing::warn!(
                "annotating pod {}/{}: {e}; retrying",
                target.namespace,
                target.name
            ),
        }
        let wait = if state.borrow().registered {
            REASSERT_INTERVAL
        } else {
            Duration::from_secs(2)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            changed = record_json.changed(), if changes => changes = changed.is_ok(),
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    match set(&api, &target.name, serde_json::Value::Null).await {
        Ok(()) => tracing::info!(
            "removed the worker annotation of pod {}/{}",
            target.namespace,
            target.name
        ),
        Err(e) => tracing::warn!(
            "removing the worker annotation of pod {}/{}: {e}",
            target.namespace,
            target.name
        ),
    }
    state.send_modify(|s| s.registered = false);
}
