//! One role's workers (pure): a StatefulSet of engine pods, or a LeaderWorkerSet when a
//! worker spans nodes, plus a headless Service (stable pod DNS for bootstrap and
//! rendezvous) and a PodDisruptionBudget. Rollouts replace one worker at a time,
//! deleting before creating, so they never need spare GPUs.

use super::engine::{ENGINE_PORT, EngineCommand};
use super::names::{self, Role};
use super::pod::{NodePlace, PodInput, drain_token, pod_template};
use super::{Child, Ctx, Kind, ModelVolume, child};
use crate::api::InferaDeploymentSpec;
use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{ResourceRequirements, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

/// What one role runs.
#[derive(Debug, Clone, Copy)]
pub struct RoleSet<'a> {
    /// The role.
    pub role: Role,
    /// Workers.
    pub replicas: i32,
    /// Nodes per worker (more than one: LeaderWorkerSet).
    pub nodes: u32,
    /// The engine command.
    pub engine: &'a EngineCommand,
    /// GPUs per pod.
    pub gpus: u32,
    /// CPU and memory of the engine container.
    pub resources: Option<&'a ResourceRequirements>,
    /// The model volume.
    pub model: &'a ModelVolume,
}

/// A role's objects and which kind runs its workers.
#[derive(Debug, Clone)]
pub struct BuiltRole {
    /// StatefulSet or LeaderWorkerSet.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Every object of the role.
    pub children: Vec<Child>,
}

fn headless_service(ctx: &Ctx<'_>, role: Role) -> Child {
    let service = Service {
        metadata: ctx.meta(
            names::workers(ctx.name, role),
            names::role_labels(ctx.name, role),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(names::role_selector(ctx.name, role)),
            // Peers find each other (bootstrap, rendezvous) before the engine is ready.
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: i32::from(ENGINE_PORT),
                target_port: Some(IntOrString::String("http".into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    child(Kind::Service, service, Some(ctx.owner))
}

fn disruption_budget(ctx: &Ctx<'_>, role: Role) -> Child {
    let pdb = PodDisruptionBudget {
        metadata: ctx.meta(
            names::workers(ctx.name, role),
            names::role_labels(ctx.name, role),
        ),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(names::role_selector(ctx.name, role)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    child(Kind::PodDisruptionBudget, pdb, Some(ctx.owner))
}

/// The objects of one role.
pub fn role_set(ctx: &Ctx<'_>, spec: &InferaDeploymentSpec, set: &RoleSet<'_>) -> BuiltRole {
    let name = names::workers(ctx.name, set.role);
    let drain_token = drain_token(&ctx.owner.uid);
    let input = |place| PodInput {
        drain_token: &drain_token,
        instance: ctx.name,
        namespace: ctx.namespace,
        role: set.role,
        place,
        engine: set.engine,
        gpus: set.gpus,
        resources: set.resources,
        model: set.model,
        images: ctx.images,
    };
    let labels = names::role_labels(ctx.name, set.role);
    let (kind, workload) = if set.nodes > 1 {
        let leader = pod_template(spec, &input(NodePlace::Leader));
        let worker = pod_template(spec, &input(NodePlace::Follower));
        let object = json!({
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {
                "name": name,
                "namespace": ctx.namespace,
                "labels": labels,
                "ownerReferences": [ctx.owner],
            },
            "spec": {
                "replicas": set.replicas,
                "startupPolicy": "LeaderCreated",
                "rolloutStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
                },
                "leaderWorkerTemplate": {
                    "size": set.nodes,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": leader,
                    "workerTemplate": worker,
                },
            },
        });
        (
            Kind::LeaderWorkerSet,
            Child {
                kind: Kind::LeaderWorkerSet,
                name: name.clone(),
                object,
            },
        )
    } else {
        let sts = StatefulSet {
            metadata: ctx.meta(name.clone(), labels),
            spec: Some(StatefulSetSpec {
                replicas: Some(set.replicas),
                service_name: Some(name.clone()),
                selector: LabelSelector {
                    match_labels: Some(names::role_selector(ctx.name, set.role)),
                    ..Default::default()
                },
                // Model loads take minutes: start every worker at once.
                pod_management_policy: Some("Parallel".into()),
                update_strategy: Some(StatefulSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateStatefulSetStrategy {
                        partition: Some(0),
                        ..Default::default()
                    }),
                }),
                template: pod_template(spec, &input(NodePlace::Leader)),
                ..Default::default()
            }),
            ..Default::default()
        };
        (
            Kind::StatefulSet,
            child(Kind::StatefulSet, sts, Some(ctx.owner)),
        )
    };
    BuiltRole {
        kind,
        name,
        children: vec![
            headless_service(ctx, set.role),
            workload,
            disruption_budget(ctx, set.role),
        ],
    }
}
