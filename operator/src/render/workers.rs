//! One role's workers (pure): a StatefulSet of engine pods, or a LeaderWorkerSet when a
//! worker spans nodes, plus a headless Service (stable pod DNS for bootstrap and
//! rendezvous) and a PodDisruptionBudget. Rollouts replace one worker at a time,
//! deleting before creating, so they never need spare GPUs.
//!
//! The pod template is rendered under the release of Infera's parts the role keeps
//! when that gives the template the workload records, else under the target release
//! ([`crate::plan::engine_platform`]); the workload records the release and the
//! template's digest in its own annotations.

use super::engine::{ENGINE_PORT, EngineCommand};
use super::overrides::apply_overrides;
use super::pod::{NodePlace, PodInput, build_pod_template, drain_token};
use super::{Child, Kind, child};
use crate::api::PlatformVersion;
use crate::names::{self, Role};
use crate::plan::engine_platform::{
    PLATFORM_ANNOTATION, TEMPLATE_DIGEST_ANNOTATION, build_release_platform,
};
use crate::plan::{EnginePlatform, PlatformChoice};
use crate::plan::{Plan, PodOverride, RolePlan, ValidateError};
use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
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
    /// The release of Infera's parts its pods run.
    pub platform: PlatformVersion,
}

/// The digest a workload records of its pod templates (the leader's, then a
/// follower's): the first 16 hex characters of the SHA-256 of their JSON.
pub fn build_template_digest(templates: &[PodTemplateSpec]) -> String {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    for t in templates {
        hash.update(serde_json::to_vec(t).unwrap_or_default());
    }
    hex::encode(&hash.finalize()[..8])
}

/// The annotations of an engine workload: its pods' release and template digest.
fn platform_annotations(version: PlatformVersion, digest: String) -> BTreeMap<String, String> {
    BTreeMap::from([
        (PLATFORM_ANNOTATION.to_owned(), version.as_str().to_owned()),
        (TEMPLATE_DIGEST_ANNOTATION.to_owned(), digest),
    ])
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
    let overrides: Vec<&PodOverride> = role.pod_overrides.iter().collect();
    let nodes = role.parallelism.nodes_per_worker;
    // The leader's template, then a follower's for multi-node workers.
    let templates = |platform: &EnginePlatform| -> Result<Vec<PodTemplateSpec>, ValidateError> {
        let places: &[NodePlace] = if nodes > 1 {
            &[NodePlace::Leader, NodePlace::Follower]
        } else {
            &[NodePlace::Leader]
        };
        places
            .iter()
            .map(|&place| {
                let input = PodInput {
                    plan,
                    role,
                    place,
                    engine,
                    drain_token: &drain_token,
                    platform,
                };
                apply_overrides(build_pod_template(&input), &overrides)
            })
            .collect()
    };
    let fallback;
    let choice = match plan.engine_platforms.get(&role.role) {
        Some(choice) => choice,
        None => {
            fallback = PlatformChoice::new_role(build_release_platform(
                PlatformVersion::CURRENT,
                &plan.images,
                "",
            ));
            &fallback
        }
    };
    // The kept release when it gives the recorded template (no restart), else the target.
    let kept = match &choice.kept {
        Some((platform, recorded)) => {
            let rendered = templates(platform)?;
            let digest = build_template_digest(&rendered);
            (recorded.is_none() || recorded.as_deref() == Some(digest.as_str()))
                .then_some((platform, rendered, digest))
        }
        None => None,
    };
    let (platform, mut rendered, digest) = match kept {
        Some(kept) => kept,
        None => {
            let rendered = templates(&choice.target)?;
            let digest = build_template_digest(&rendered);
            (&choice.target, rendered, digest)
        }
    };
    let version = platform.version;
    let labels = names::role_labels(instance, role.role);
    let (kind, workload) = if nodes > 1 {
        let worker = rendered.pop().unwrap_or_default();
        let leader = rendered.pop().unwrap_or_default();
        let object = json!({
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {
                "name": name,
                "namespace": plan.owner.namespace,
                "labels": labels,
                "annotations": platform_annotations(version, digest),
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
        let mut metadata = plan.owner.meta(name.clone(), labels);
        metadata.annotations = Some(platform_annotations(version, digest));
        let sts = StatefulSet {
            metadata,
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
                template: rendered.pop().unwrap_or_default(),
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
        platform: version,
    })
}
