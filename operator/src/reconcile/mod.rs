//! The controllers. Deployments: observe -> validate and build ([`crate::render`],
//! pure) -> apply (server-side apply, [`apply`]) -> prune -> status ([`status`], pure;
//! one patch, only when it changed); they watch the deployments, their owned children
//! and the `PDTopology` objects they reference. Topologies ([`topologies`]): each
//! one's `usedBy` and `Valid`, following the deployments.

pub mod apply;
pub mod gateway_tokenizer;
pub mod observe;
pub mod pod_problems;
pub mod pool_status;
pub mod status;
pub mod topologies;
pub mod topology_status;

use crate::api::{
    InferaDeployment, InferaDeploymentStatus, PDTopology, RolloutStatus, ServingMode,
};
use crate::metrics::Metrics;
use crate::names::{self, MANAGED_BY};
use crate::plan::{Observed, Platform, validate};
use crate::render::engine::ENGINE_PORT;
use crate::render::{Kind, Rendered, build};
use apply::{Applied, ApplyError, apply_child, prune};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use observe::model_state;
use status::{ModelState, Observation, RoleObservation, compute_status};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a deployment that is not ready is looked at again (its pods' problems reach
/// the `Ready` condition within this).
const NOT_READY_RECHECK: Duration = Duration::from_secs(15);

/// How long a LeaderWorkerSet CRD check is trusted when no deployment needs one.
const LWS_RECHECK: Duration = Duration::from_secs(30);

/// Operator settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Images, and the cluster's own etcd and NATS.
    pub platform: Platform,
    /// Only this namespace (None: all).
    pub namespace: Option<String>,
    /// Deployments reconciled at once.
    pub concurrency: u16,
    /// This replica's name in Events.
    pub instance: String,
}

/// Shared state of reconciles.
pub struct Context {
    client: Client,
    settings: Settings,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    /// What each deployment (by uid) was last pruned against: a prune is only needed
    /// when the rendered set changes (or after a restart).
    pruned: Mutex<HashMap<String, BTreeSet<(Kind, String)>>>,
    /// Whether each optional kind's CRD was served, and when that was checked.
    served: Mutex<BTreeMap<Kind, (Instant, bool)>>,
}

/// A failed reconcile (retried with backoff), by the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Observing what the build depends on: `what` (the topology, the model cache, the
    /// download Job, the etcd client certificate, the pods).
    #[error("reading {what}: {source}")]
    Observe {
        /// What was being read.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Applying or pruning a child.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Recording a fact on an object (a finished download on the cache PVC).
    #[error("recording {what}: {source}")]
    Record {
        /// What was being recorded.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Writing the status of `object` (InferaDeployment or PDTopology).
    #[error("writing the {object} status: {source}")]
    WriteStatus {
        /// The kind.
        object: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError {
    /// The step that failed, for logs.
    pub fn step(&self) -> &'static str {
        match self {
            Self::Observe { .. } => "observe",
            Self::Apply(_) => "apply",
            Self::Record { .. } => "record",
            Self::WriteStatus { .. } => "status",
        }
    }
}

/// A count from an object's `status` (0 when absent).
pub(crate) fn count(object: &DynamicObject, field: &str) -> i32 {
    object
        .data
        .get("status")
        .and_then(|s| s.get(field))
        .and_then(serde_json::Value::as_i64)
        .and_then(|v| i32::try_from(v).ok())
        .unwrap_or(0)
}

fn problem_event(reason: &str, message: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    }
}

impl Context {
    /// A context for `client`.
    pub fn new(client: Client, settings: Settings, metrics: Arc<Metrics>) -> Arc<Self> {
        let reporter = Reporter {
            controller: MANAGED_BY.into(),
            instance: Some(settings.instance.clone()),
        };
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            metrics,
            pruned: Mutex::new(HashMap::new()),
            served: Mutex::new(BTreeMap::new()),
        })
    }

    /// Whether the API server serves LeaderWorkerSets (see [`Context::served`]).
    async fn lws_installed(&self, fresh: bool) -> bool {
        self.served(Kind::LeaderWorkerSet, fresh).await
    }

    /// Whether the API server serves `kind`: asked afresh when `fresh` (a deployment
    /// needs one), else remembered for [`LWS_RECHECK`].
    async fn served(&self, kind: Kind, fresh: bool) -> bool {
        let cached = self.served.lock().ok().and_then(|c| c.get(&kind).copied());
        if let Some((at, installed)) = cached
            && !fresh
            && at.elapsed() < LWS_RECHECK
        {
            return installed;
        }
        let installed = observe::served(&self.client, kind).await;
        if let Ok(mut c) = self.served.lock() {
            c.insert(kind, (Instant::now(), installed));
        }
        installed
    }

    async fn publish(&self, idep: &InferaDeployment, event: Event) {
        if let Err(e) = self.recorder.publish(&event, &idep.object_ref(&())).await {
            tracing::warn!("publishing event {}: {e}", event.reason);
        }
    }
}

async fn topology_of(
    ctx: &Context,
    idep: &InferaDeployment,
    namespace: &str,
) -> Result<Option<PDTopology>, ReconcileError> {
    let Some(name) = idep
        .spec
        .serving
        .topology_ref
        .as_deref()
        .filter(|_| idep.spec.serving.mode == ServingMode::Disaggregated)
    else {
        return Ok(None);
    };
    Api::<PDTopology>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::Observe {
            what: "the PDTopology",
            source,
        })
}

/// Why a child of an optional kind was not applied: its CRD is not served.
fn missing_crd(kind: Kind) -> (String, String) {
    let (reason, message) = match kind {
        Kind::InferencePool => (
            "InferencePoolCrdMissing",
            "spec.gateway.inferencePool needs GAIE's InferencePool CRD (inference.networking.k8s.io/v1, from gateway-api-inference-extension v1.0 or later); install it and the operator renders the pool (the picker runs meanwhile)",
        ),
        Kind::HttpRoute => (
            "GatewayApiCrdMissing",
            "spec.gateway.inferencePool.gatewayRef needs Gateway API's HTTPRoute CRD (gateway.networking.k8s.io/v1); install Gateway API (a Gateway implementation brings it) and the operator renders the route",
        ),
        // Kind::LeaderWorkerSet, the one other optional kind.
        _ => (
            "LeaderWorkerSetMissing",
            "a worker spans nodes (nodesPerWorker > 1), which needs the LeaderWorkerSet CRD (leaderworkerset.x-k8s.io/v1); install LWS (https://lws.sigs.k8s.io) and the operator renders the workers",
        ),
    };
    (reason.to_owned(), message.to_owned())
}

/// Applies the build; returns the applied objects, the optional kinds it needs whose
/// CRDs are missing (everything else is applied), and the Degraded reason of the first.
async fn apply_all(
    ctx: &Context,
    namespace: &str,
    rendered: &Rendered,
) -> Result<(Vec<Applied>, Vec<Kind>, Option<(String, String)>), ReconcileError> {
    let mut missing = Vec::new();
    for kind in Kind::OPTIONAL {
        if rendered.children.iter().any(|c| c.kind == kind) && !ctx.served(kind, true).await {
            missing.push(kind);
        }
    }
    let mut applied = Vec::new();
    for child in &rendered.children {
        if missing.contains(&child.kind) {
            continue;
        }
        if let Some(a) = apply_child(&ctx.client, namespace, child).await? {
            applied.push(a);
        }
    }
    ctx.metrics.record_applies(applied.len());
    let problem = missing.first().map(|k| missing_crd(*k));
    Ok((applied, missing, problem))
}

async fn prune_if_changed(
    ctx: &Context,
    idep: &InferaDeployment,
    namespace: &str,
    rendered: &Rendered,
    missing: &[Kind],
) -> Result<(), ReconcileError> {
    let uid = idep.uid().unwrap_or_default();
    let keep: BTreeSet<(Kind, String)> = rendered
        .children
        .iter()
        .map(|c| (c.kind, c.name.clone()))
        .collect();
    let unchanged = ctx
        .pruned
        .lock()
        .map(|m| m.get(&uid) == Some(&keep))
        .unwrap_or(false);
    if unchanged {
        return Ok(());
    }
    // A kind whose CRD is served is pruned (a LeaderWorkerSet left from a multi-node
    // shape, an InferencePool no longer asked for), unless this build found it missing.
    let mut kinds = Vec::new();
    for kind in Kind::ALL {
        if missing.contains(&kind) {
            continue;
        }
        if !Kind::OPTIONAL.contains(&kind) || ctx.served(kind, false).await {
            kinds.push(kind);
        }
    }
    let deleted = prune(
        &ctx.client,
        namespace,
        &idep.name_any(),
        &uid,
        &kinds,
        &keep,
    )
    .await?;
    if !deleted.is_empty() {
        let list = deleted
            .iter()
            .map(|(kind, name)| format!("{kind:?} {name}"))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::info!(deployment = %idep.name_any(), "deleted what is no longer part of the deployment: {list}");
        // One event per prune: the recorder folds events of one reason into a series.
        ctx.publish(
            idep,
            Event {
                type_: EventType::Normal,
                reason: "Pruned".into(),
                note: Some(format!("deleted, no longer part of the deployment: {list}")),
                action: "Prune".into(),
                secondary: None,
            },
        )
        .await;
    }
    if let Ok(mut m) = ctx.pruned.lock() {
        m.insert(uid, keep);
    }
    Ok(())
}

fn observe_roles(rendered: &Rendered, applied: &[Applied]) -> Vec<RoleObservation> {
    rendered
        .roles
        .iter()
        .map(|r| {
            let object = applied
                .iter()
                .find(|a| a.kind == r.kind && a.name == r.name);
            RoleObservation {
                role: r.role,
                desired: r.desired,
                current: object.map(|o| count(&o.object, "replicas")).unwrap_or(0),
                ready: object
                    .map(|o| count(&o.object, "readyReplicas"))
                    .unwrap_or(0),
                per_unit: rendered
                    .unit
                    .iter()
                    .find(|(role, _)| *role == r.role)
                    .map(|(_, n)| *n)
                    .unwrap_or(1),
                platform: r.platform,
                progress: r.progress.clone(),
            }
        })
        .collect()
}

/// Writes `status` on object `name` of `api`'s kind (server-side apply, this
/// operator's field manager).
pub(crate) async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|source| ReconcileError::WriteStatus {
        object: K::kind(&()).into_owned(),
        source,
    })
}

/// Writes the status when it changed; returns the `Ready` condition's reason (`AllReady`
/// when ready). Ready turning true is a Normal Event; a pod problem becoming the reason
/// it is not, a Warning with that reason.
async fn write_status(
    ctx: &Context,
    idep: &InferaDeployment,
    namespace: &str,
    obs: &Observation,
) -> Result<String, ReconcileError> {
    let new = compute_status(idep.status.as_ref(), obs, &crate::clock::now());
    let ready = new.conditions.iter().find(|c| c.type_ == "Ready").cloned();
    let is_ready = ready.as_ref().is_some_and(|c| c.status == "True");
    let reason = ready.as_ref().map(|c| c.reason.clone()).unwrap_or_default();
    if idep.status.as_ref() == Some(&new) {
        return Ok(reason);
    }
    let previous = idep
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status.clone(), c.reason.clone()));
    // `status.autoscaling` belongs to the autoscaler's field manager.
    let written = InferaDeploymentStatus {
        autoscaling: None,
        ..new.clone()
    };
    apply_status(
        &Api::<InferaDeployment>::namespaced(ctx.client.clone(), namespace),
        &idep.name_any(),
        &written,
    )
    .await?;
    let before = idep.status.as_ref().and_then(|s| s.rollout.as_ref());
    for event in rollout_events(before, new.rollout.as_ref(), new.revision.as_deref()) {
        ctx.publish(idep, event).await;
    }
    let Some(ready) = ready else {
        return Ok(reason);
    };
    let changed = previous.as_ref() != Some(&(ready.status.clone(), ready.reason.clone()));
    if changed && is_ready {
        ctx.publish(
            idep,
            Event {
                type_: EventType::Normal,
                reason: "Ready".into(),
                note: Some(ready.message.clone()),
                action: "Reconcile".into(),
                secondary: None,
            },
        )
        .await;
    } else if changed && pod_problems::PodProblemKind::REASONS.contains(&ready.reason.as_str()) {
        tracing::warn!(deployment = %idep.name_any(), namespace, "{}: {}", ready.reason, ready.message);
        ctx.publish(idep, problem_event(&ready.reason, &ready.message))
            .await;
    }
    Ok(reason)
}

/// The Events of a rollout's steps: started, blocked (with the scheduler's reason),
/// complete.
fn rollout_events(
    before: Option<&RolloutStatus>,
    after: Option<&RolloutStatus>,
    revision: Option<&str>,
) -> Vec<Event> {
    let normal = |reason: &str, note: String| Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note),
        action: "Rollout".into(),
        secondary: None,
    };
    let mut events = Vec::new();
    match (before, after) {
        (None, Some(r)) => events.push(normal("RolloutStarted", status::rollout_summary(r))),
        (Some(_), None) => events.push(normal(
            "RolloutComplete",
            format!(
                "every worker runs revision {}",
                revision.unwrap_or_default()
            ),
        )),
        _ => {}
    }
    let blocked = after.and_then(status::rollout_blocked);
    if blocked.is_some() && blocked != before.and_then(status::rollout_blocked) {
        let mut event = problem_event("RolloutBlocked", &blocked.unwrap_or_default());
        event.action = "Rollout".into();
        events.push(event);
    }
    events
}

/// When to look at a deployment again. Owned children wake the controller when they
/// change, but a pod that cannot be scheduled, pulled or started changes none of them:
/// while workers or gateways are not ready, soon; a download runs its Job (which wakes
/// the controller) but its pod's problems do not; a missing LeaderWorkerSet CRD may be
/// installed.
fn build_requeue(ready_reason: &str, crd_missing: bool) -> Duration {
    match ready_reason {
        "WorkersNotReady" | "GatewayNotReady" => NOT_READY_RECHECK,
        r if pod_problems::PodProblemKind::REASONS.contains(&r) => NOT_READY_RECHECK,
        "ModelDownloading" => Duration::from_secs(60),
        _ if crd_missing => Duration::from_secs(30),
        _ => Duration::from_secs(600),
    }
}

async fn reconcile(
    idep: Arc<InferaDeployment>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let result = reconcile_inner(&idep, &ctx).await;
    ctx.metrics
        .observe_reconcile(started.elapsed(), result.is_ok());
    result
}

async fn reconcile_inner(idep: &InferaDeployment, ctx: &Context) -> Result<Action, ReconcileError> {
    if idep.meta().deletion_timestamp.is_some() {
        // Owner references garbage-collect the children.
        if let (Ok(mut m), Some(uid)) = (ctx.pruned.lock(), idep.uid()) {
            m.remove(&uid);
        }
        return Ok(Action::await_change());
    }
    let namespace = idep.namespace().unwrap_or_default();
    let name = idep.name_any();
    let topology = topology_of(ctx, idep, &namespace).await?;
    let model = model_state(&ctx.client, idep, &namespace).await?;
    let etcd_client_tls =
        observe::etcd_client_tls(&ctx.client, idep, &ctx.settings.platform).await?;
    let lws = ctx.lws_installed(false).await;
    // The pods before the build: the rollout moves on what they are.
    let pods = observe::fetch_pods(&ctx.client, &namespace, &name).await?;
    let engines = observe::engine_workloads(&ctx.client, &namespace, &name, lws, &pods).await?;
    let pull_secrets = observe::pull_secrets(&ctx.client, &ctx.settings.platform).await?;
    let observed = Observed {
        topology: topology.as_ref(),
        model_ready: !matches!(model, ModelState::Downloading | ModelState::Failed(_)),
        etcd_client_tls: etcd_client_tls.as_ref(),
        engines: Some(&engines),
        pull_secrets: Some(&pull_secrets),
    };
    let selector = names::engine_selector_string(&name);
    let rendered = match validate(idep, observed, &ctx.settings.platform).and_then(|p| build(&p)) {
        Ok(rendered) => rendered,
        Err(e) => {
            let (reason, message) = (e.reason().to_owned(), e.to_string());
            tracing::warn!(deployment = %name, namespace = %namespace, "{reason}: {message}");
            if !idep.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Degraded" && c.reason == reason && c.message == message)
            }) {
                ctx.publish(idep, problem_event(&reason, &message)).await;
            }
            let obs = Observation {
                generation: idep.metadata.generation,
                roles: None,
                gateway: (0, 0),
                model,
                problem: Some((reason, message)),
                selector,
                endpoint: None,
                pod_problems: Vec::new(),
                tokenizer: None,
                autoscaled: idep.spec.autoscaling.is_some(),
                revision: None,
                inference_pool: None,
                missing_crds: Vec::new(),
            };
            write_status(ctx, idep, &namespace, &obs).await?;
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
    };
    let (applied, missing, problem) = match apply_all(ctx, &namespace, &rendered).await {
        Ok(r) => r,
        Err(e) => {
            // Say so in the status (not only in the operator's log), then retry.
            let obs = Observation {
                generation: idep.metadata.generation,
                roles: None,
                gateway: (0, 0),
                model,
                problem: Some(("ApplyFailed".to_owned(), e.to_string())),
                selector,
                endpoint: None,
                pod_problems: Vec::new(),
                tokenizer: None,
                autoscaled: idep.spec.autoscaling.is_some(),
                revision: None,
                inference_pool: None,
                missing_crds: Vec::new(),
            };
            write_status(ctx, idep, &namespace, &obs).await?;
            return Err(e);
        }
    };
    prune_if_changed(ctx, idep, &namespace, &rendered, &missing).await?;
    if let Some((reason, message)) = &problem
        && !idep.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Degraded" && &c.reason == reason)
        })
    {
        ctx.publish(idep, problem_event(reason, message)).await;
    }
    let gateway = applied
        .iter()
        .find(|a| a.kind == Kind::Deployment && a.name == rendered.gateway)
        .map(|a| {
            (
                idep.spec.gateway.replicas,
                count(&a.object, "readyReplicas"),
            )
        })
        .unwrap_or((idep.spec.gateway.replicas, 0));
    let crd_missing = problem.is_some();
    let inference_pool = match &idep.spec.gateway.inference_pool {
        Some(pool) => {
            Some(observe::fetch_pool_status(&ctx.client, &namespace, &name, pool, &applied).await)
        }
        None => None,
    };
    let tokenizer = match rendered.tokenizer_from_workers {
        true => Some(
            gateway_tokenizer::observe_gateway_tokenizer(&pods, ENGINE_PORT, rendered.gateway_tls)
                .await,
        ),
        false => None,
    };
    let obs = Observation {
        generation: idep.metadata.generation,
        roles: Some(observe_roles(&rendered, &applied)),
        gateway,
        model,
        problem,
        selector,
        endpoint: Some(rendered.gateway_endpoint.clone()),
        pod_problems: pod_problems::build_pod_problems(&pods),
        tokenizer,
        autoscaled: idep.spec.autoscaling.is_some(),
        revision: Some(rendered.revision.clone()),
        inference_pool,
        missing_crds: missing.clone(),
    };
    let ready_reason = write_status(ctx, idep, &namespace, &obs).await?;
    let mut requeue = build_requeue(&ready_reason, crd_missing);
    if obs
        .inference_pool
        .as_ref()
        .is_some_and(|p| !pool_status::pool_condition(p, &obs.missing_crds).0)
    {
        // Nothing the operator watches changes when a Gateway's controller accepts the
        // route or the Gateway is created.
        requeue = requeue.min(NOT_READY_RECHECK);
    }
    if rendered.roles.iter().any(|r| r.progress.rolling) {
        // Pods turning ready wake the controller through their StatefulSet; this is the
        // net under it.
        requeue = requeue.min(Duration::from_secs(5));
    }
    if obs.tokenizer.as_ref().is_some_and(|t| !t.loaded()) {
        // Nothing the operator watches changes when the gateway loads it.
        requeue = requeue.min(NOT_READY_RECHECK);
    }
    Ok(Action::requeue(requeue))
}

fn error_policy(idep: Arc<InferaDeployment>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(deployment = %idep.name_any(), namespace = ?idep.namespace(), step = error.step(), "reconcile failed: {error}");
    Action::requeue(Duration::from_secs(5))
}

pub(crate) fn api_for<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = settings.namespace.clone();
    let owned =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGED_BY}"));
    let lws = observe::lws_installed(&client).await;
    let controller = Controller::new(
        api_for::<InferaDeployment>(&client, ns.as_deref()),
        watcher::Config::default(),
    )
    .with_config(ControllerConfig::default().concurrency(settings.concurrency));
    let store = controller.store();
    let ctx = Context::new(client.clone(), settings.clone(), metrics.clone());
    let mut controller = controller
        .owns(
            api_for::<StatefulSet>(&client, ns.as_deref()),
            owned.clone(),
        )
        .owns(api_for::<Deployment>(&client, ns.as_deref()), owned.clone())
        .owns(api_for::<Job>(&client, ns.as_deref()), owned.clone())
        .owns(api_for::<Service>(&client, ns.as_deref()), owned.clone())
        .watches(
            api_for::<PDTopology>(&client, ns.as_deref()),
            watcher::Config::default(),
            move |topology| {
                let (tname, tns) = (topology.name_any(), topology.namespace());
                store
                    .state()
                    .into_iter()
                    .filter(|d| {
                        d.namespace() == tns
                            && d.spec.serving.topology_ref.as_deref() == Some(tname.as_str())
                    })
                    .map(|d| ObjectRef::from_obj(&*d))
                    .collect::<Vec<_>>()
            },
        );
    if lws {
        let ar = Kind::LeaderWorkerSet.api_resource();
        let api: Api<DynamicObject> = match ns.as_deref() {
            Some(n) => Api::namespaced_with(client.clone(), n, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        controller = controller.owns_with(api, ar, owned.clone());
    } else {
        tracing::info!(
            "the LeaderWorkerSet CRD is not installed: multi-node workers are reported as Degraded until it is"
        );
    }
    tracing::info!(namespace = ?ns, concurrency = settings.concurrency, "controllers started");
    let shutdown = shutdown.shared();
    let deployments = controller
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!("controller: {e}");
            }
        });
    let topologies = topologies::run(client.clone(), ns.as_deref(), shutdown.clone());
    let autoscaler = crate::autoscale::run(
        client.clone(),
        ns.clone(),
        settings.instance.clone(),
        shutdown,
    );
    futures::join!(deployments, topologies, autoscaler);
    tracing::info!("controllers stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RoleRolloutStatus;

    #[test]
    fn a_rollout_tells_when_it_starts_blocks_and_completes() {
        let rolling = |blocked: Option<&str>| RolloutStatus {
            revision: "r2".into(),
            roles: vec![RoleRolloutStatus {
                role: "decode".into(),
                replicas: 1,
                updated: 1,
                old: 1,
                ready: 1,
                blocked: blocked.map(str::to_owned),
            }],
        };
        let reasons = |events: Vec<Event>| {
            events
                .into_iter()
                .map(|e| (e.reason, e.note.unwrap_or_default()))
                .collect::<Vec<_>>()
        };
        let started = rolling(None);
        assert_eq!(
            reasons(rollout_events(None, Some(&started), Some("r2"))),
            [(
                "RolloutStarted".to_owned(),
                "rolling to revision r2: decode 1 old, 1 new of 1 (1 ready)".to_owned()
            )]
        );
        let blocked = rolling(Some("0/1 nodes are available"));
        let events = rollout_events(Some(&started), Some(&blocked), Some("r2"));
        assert_eq!(events[0].type_, EventType::Warning);
        assert_eq!(
            reasons(events),
            [(
                "RolloutBlocked".to_owned(),
                "a new decode worker cannot start: 0/1 nodes are available".to_owned()
            )]
        );
        assert!(rollout_events(Some(&blocked), Some(&blocked), Some("r2")).is_empty());
        assert_eq!(
            reasons(rollout_events(Some(&started), None, Some("r2"))),
            [(
                "RolloutComplete".to_owned(),
                "every worker runs revision r2".to_owned()
            )]
        );
    }

    #[test]
    fn looks_again_soon_only_while_a_pod_can_tell_why() {
        for reason in [
            "WorkersNotReady",
            "GatewayNotReady",
            "Unschedulable",
            "CrashLoopBackOff",
        ] {
            assert_eq!(build_requeue(reason, false), NOT_READY_RECHECK, "{reason}");
        }
        assert_eq!(
            build_requeue("ModelDownloading", false),
            Duration::from_secs(60)
        );
        assert_eq!(build_requeue("ScaledToZero", true), Duration::from_secs(30));
        assert_eq!(
            build_requeue("ScaledToZero", false),
            Duration::from_secs(600)
        );
        assert_eq!(build_requeue("AllReady", false), Duration::from_secs(600));
    }
}
