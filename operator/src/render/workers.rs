//! One role's workers (pure): a StatefulSet of engine pods, or a LeaderWorkerSet when a
//! worker spans nodes, plus a headless Service (stable pod DNS for bootstrap and
//! rendezvous) and a PodDisruptionBudget. Rollouts replace one worker at a time,
//! deleting before creating, so they never need spare GPUs.

use super::engine::{ENGINE_PORT, EngineCommand};
use super::overrides::apply_overrides;
use super::pod::{NodePlace, PodInput, build_pod_template, drain_token};
use super::{Child, Kind, child};
use crate::names::{self, Role};
use crate::plan::{Plan, PodOverride, RolePlan, ValidateError};
use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use std::collections::BTreeMap;

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

fn headless_service(plan: &Plan, role: Role) -> Child {
    let service = Service {
        metadata: plan.owner.meta(
            names::workers(&plan.owner.name, role),
            names::role_labels(&plan.owner.name, role),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(names::role_selector(&plan.owner.name, role)),
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
    child(Kind::Service, service, Some(&plan.owner.reference))
}

/// A PodDisruptionBudget `name` keeping all but one of the pods `selector` matches up
/// through voluntary disruptions (node drains).
pub fn one_at_a_time(
    plan: &Plan,
    name: String,
    labels: BTreeMap<String, String>,
    selector: BTreeMap<String, String>,
) -> Child {
    let pdb = PodDisruptionBudget {
        metadata: plan.owner.meta(name, labels),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    child(Kind::PodDisruptionBudget, pdb, Some(&plan.owner.reference))
}

fn disruption_budget(plan: &Plan, role: Role) -> Child {
    let instance = plan.owner.name.as_str();
    one_at_a_time(
        plan,
        names::workers(instance, role),
        names::role_labels(instance, role),
        names::role_selector(instance, role),
    )
}

/// The objects of one role: `replicas` workers running `engine`.
pub fn build_role_set(
    plan: &Plan,
    role: &RolePlan,
    replicas: i32,
    engine: &EngineCommand,
) -> Result<BuiltRole, ValidateError> {
    let instance = plan.owner.name.as_str();
    let name = names::workers(instance, role.role);
    let drain_token = drain_token(&plan.owner.reference.uid);
    let input = |place| PodInput {
        plan,
        role,
        place,
        engine,
        drain_token: &drain_token,
    };
    let overrides: Vec<&PodOverride> = role.pod_overrides.iter().collect();
    let template = |place| apply_overrides(build_pod_template(&input(place)), &overrides);
    let nodes = role.parallelism.nodes_per_worker;
    let labels = names::role_labels(instance, role.role);
    let (kind, workload) = if nodes > 1 {
        let leader = template(NodePlace::Leader)?;
        let worker = template(NodePlace::Follower)?;
        let object = json!({
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {
                "name": name,
                "namespace": plan.owner.namespace,
                "labels": labels,
                "ownerReferences": [plan.owner.reference],
            },
            "spec": {
                "replicas": replicas,
                "startupPolicy": "LeaderCreated",
                "rolloutStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
                },
                "leaderWorkerTemplate": {
                    "size": nodes,
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
            metadata: plan.owner.meta(name.clone(), labels),
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                service_name: Some(name.clone()),
                selector: LabelSelector {
                    match_labels: Some(names::role_selector(instance, role.role)),
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
                template: template(NodePlace::Leader)?,
                ..Default::default()
            }),
            ..Default::default()
        };
        (
            Kind::StatefulSet,
            child(Kind::StatefulSet, sts, Some(&plan.owner.reference)),
        )
    };
    Ok(BuiltRole {
        kind,
        name,
        children: vec![
            headless_service(plan, role.role),
            workload,
            disruption_budget(plan, role.role),
        ],
    })
}
