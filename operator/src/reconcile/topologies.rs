//! The `PDTopology` controller: each topology's `usedBy` and `Valid` condition
//! ([`super::topology_status`], pure), written when they change. It watches the
//! deployments through a reflector of its own, so a topology's status follows every
//! deployment that starts, stops or changes referencing it (a deployment deleted or
//! pointed elsewhere leaves no stale `usedBy`), and a topology nothing references gets
//! its status too.

use super::ReconcileError;
use super::topology_status::topology_status;
use crate::api::{InferaDeployment, PDTopology};
use futures::StreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// How often a topology is looked at again without a change (a safety net; changes
/// arrive as watch events).
const RECHECK: Duration = Duration::from_secs(300);

struct Context {
    client: Client,
    deployments: Store<InferaDeployment>,
}

async fn reconcile(topology: Arc<PDTopology>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    // Not before the first list of deployments is complete (the store swaps it in at
    // its end): an early look would write usedBy [] and flip Valid.
    if ctx.deployments.wait_until_ready().await.is_err() {
        return Ok(Action::await_change());
    }
    let namespace = topology.namespace().unwrap_or_default();
    let deployments = ctx.deployments.state();
    let new = topology_status(
        &topology,
        deployments.iter().map(|d| d.as_ref()),
        &crate::clock::now(),
    );
    if topology.status.as_ref() != Some(&new) {
        let api = Api::<PDTopology>::namespaced(ctx.client.clone(), &namespace);
        super::apply_status(&api, &topology.name_any(), &new).await?;
    }
    Ok(Action::requeue(RECHECK))
}

fn error_policy(topology: Arc<PDTopology>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(topology = %topology.name_any(), namespace = ?topology.namespace(), step = error.step(), "topology status: {error}");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let deployments_api = super::api_for::<InferaDeployment>(&client, namespace);
    let (deployments, writer) = reflector::store();
    // The reflector updates the store before it passes a change on as a trigger, so a
    // topology is reconciled with the deployment that woke it already counted (or gone);
    // a (re)list is swapped in whole at its end, and reconciles wait for the first.
    let changes = reflector::reflector(
        writer,
        watcher(deployments_api, watcher::Config::default()).default_backoff(),
    )
    .touched_objects();
    let ctx = Arc::new(Context {
        client: client.clone(),
        deployments,
    });
    // Any deployment's change looks at every topology again: the one it references now,
    // and the one it referenced before (which the event no longer names). Topologies
    // are few; each look is one comparison unless the status changed.
    Controller::new(
        super::api_for::<PDTopology>(&client, namespace),
        watcher::Config::default(),
    )
    .reconcile_all_on(changes.filter_map(|change| async move { change.ok().map(|_| ()) }))
    .graceful_shutdown_on(shutdown)
    .run(reconcile, error_policy, ctx)
    .for_each(|result| async move {
        if let Err(e) = result {
            tracing::debug!("topology controller: {e}");
        }
    })
    .await;
}
