//! One role's workers (pure): a StatefulSet of engine pods, or a LeaderWorkerSet when a
//! worker spans nodes, plus a headless Service (stable pod DNS for bootstrap and
//! rendezvous) and a PodDisruptionBudget. From release 0.2.0 the StatefulSet replaces
//! no pod by itself (`OnDelete`): the operator rolls it by moving its window of
//! ordinals ([`crate::plan::rollout`]), new pods beside the old ones; a LeaderWorkerSet
//! surges by itself. Every pod carries the deployment's revision
//! ([`REVISION_LABEL`]), the same in every role.
//!
//! The pod template is rendered under the release of Infera's parts the role keeps
//! when that gives the template the workload records, else under the target release
//! ([`crate::plan::engine_platform`]); the workload records the release and the
//! template's digest in its own annotations.

use super::engine::{ENGINE_PORT, EngineCommand};
use super::frontend::build_frontend;
use super::overrides::apply_overrides;
use super::pod::{NodePlace, PodInput, build_pod_template, drain_token};
use super::{Child, Kind, child};
use crate::api::PlatformVersion;
use crate::names::{self, Role};
use crate::plan::engine_platform::{
    PLATFORM_ANNOTATION, TEMPLATE_DIGEST_ANNOTATION, build_release_platform,
};
use crate::plan::rollout::Window;
use crate::plan::{EnginePlatform, PlatformChoice};
use crate::plan::{Plan, PodOverride, RolePlan, ValidateError};
use infera_proto::sidecar::REVISION_ENV;
use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetOrdinals, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{EnvVar, PodTemplateSpec};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use std::collections::BTreeMap;

/// The label (on engine pods and their workloads) naming the revision of the
/// deployment's engine spec.
pub const REVISION_LABEL: &str = "infera.amd.com/engine-revision";

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

/// A role's pod templates before the revision is put in them, and the release they
/// are rendered under.
#[derive(Debug, Clone)]
pub struct PreparedRole {
    /// The role.
    pub role: Role,
    /// The leader's template, then a follower's for multi-node workers.
    pub templates: Vec<PodTemplateSpec>,
    /// Their digest (the workload's [`TEMPLATE_DIGEST_ANNOTATION`]).
    pub digest: String,
    /// The release they are rendered under.
    pub platform: PlatformVersion,
    /// Nodes per worker (above 1: a LeaderWorkerSet).
    pub nodes: u32,
}

impl PreparedRole {
    /// Whether its pods get the revision (label, and the sidecar's environment).
    pub fn carries_revision(&self) -> bool {
        self.platform.at_least(PlatformVersion::V0_2_0)
    }
}

/// The pod templates of one role running `engine`, under the release the role keeps
/// when that gives the template it records, else under the target release.
pub fn prepare_role(
    plan: &Plan,
    role: &RolePlan,
    engine: &EngineCommand,
) -> Result<PreparedRole, ValidateError> {
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
                let frontend = build_frontend(plan, role, platform);
                let input = PodInput {
                    plan,
                    role,
                    place,
                    engine,
                    drain_token: &drain_token,
                    platform,
                    frontend: frontend.as_ref(),
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
    let (platform, templates, digest) = match kept {
        Some(kept) => kept,
        None => {
            let rendered = templates(&choice.target)?;
            let digest = build_template_digest(&rendered);
            (&choice.target, rendered, digest)
        }
    };
    Ok(PreparedRole {
        role: role.role,
        templates,
        digest,
        platform: platform.version,
        nodes,
    })
}

/// The revision of the deployment's engine spec: the first 16 hex characters of the
/// SHA-256 of every role's template digest. A change to any role's pods is a new
/// revision of all of them (prefill and decode roll as one topology).
pub fn build_revision(roles: &[PreparedRole]) -> String {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    for r in roles {
        hash.update(r.role.as_str().as_bytes());
        hash.update(b"=");
        hash.update(r.digest.as_bytes());
        hash.update(b"\n");
    }
    hex::encode(&hash.finalize()[..8])
}

/// Puts `revision` in a template: the pod's label, and the sidecar's environment (it
/// registers it in the worker record).
fn with_revision(mut template: PodTemplateSpec, revision: &str) -> PodTemplateSpec {
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert(REVISION_LABEL.to_owned(), revision.to_owned());
    let sidecar = template
        .spec
        .as_mut()
        .and_then(|s| s.init_containers.as_mut())
        .and_then(|c| c.iter_mut().find(|c| c.name == "sidecar"));
    if let Some(sidecar) = sidecar {
        sidecar.env.get_or_insert_with(Vec::new).push(EnvVar {
            name: REVISION_ENV.into(),
            value: Some(revision.to_owned()),
            ..Default::default()
        });
    }
    template
}

/// The objects of one role: its workers in `window` (a StatefulSet's ordinals; a
/// LeaderWorkerSet runs `window.replicas` and surges by itself).
pub fn finish_role(
    plan: &Plan,
    role: &RolePlan,
    prepared: PreparedRole,
    revision: &str,
    window: Window,
) -> BuiltRole {
    let instance = plan.owner.name.as_str();
    let name = names::workers(instance, role.role);
    let version = prepared.platform;
    let carries = prepared.carries_revision();
    let mut rendered: Vec<PodTemplateSpec> = if carries {
        prepared
            .templates
            .into_iter()
            .map(|t| with_revision(t, revision))
            .collect()
    } else {
        prepared.templates
    };
    let mut annotations = platform_annotations(version, prepared.digest);
    if carries {
        annotations.insert(REVISION_LABEL.to_owned(), revision.to_owned());
    }
    let labels = names::role_labels(instance, role.role);
    let limits = role.rollout;
    let (kind, workload) = if prepared.nodes > 1 {
        let worker = rendered.pop().unwrap_or_default();
        let leader = rendered.pop().unwrap_or_default();
        // LeaderWorkerSet surges on its own; 0.1.0 replaced one group at a time.
        let (surge, unavailable) = if carries {
            (limits.max_surge, limits.max_unavailable)
        } else {
            (0, 1)
        };
        let object = json!({
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {
                "name": name,
                "namespace": plan.owner.namespace,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [plan.owner.reference],
            },
            "spec": {
                "replicas": window.replicas,
                "startupPolicy": "LeaderCreated",
                "rolloutStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdateConfiguration": {"maxUnavailable": unavailable, "maxSurge": surge},
                },
                "leaderWorkerTemplate": {
                    "size": prepared.nodes,
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
        metadata.annotations = Some(annotations);
        // From 0.2.0 the operator replaces pods itself (the window of ordinals, see
        // `plan::rollout`); 0.1.0's StatefulSets rolled one pod at a time.
        let update_strategy = if carries {
            StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                rolling_update: None,
            }
        } else {
            StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(0),
                    ..Default::default()
                }),
            }
        };
        let sts = StatefulSet {
            metadata,
            spec: Some(StatefulSetSpec {
                replicas: Some(window.replicas),
                ordinals: (window.start > 0).then_some(StatefulSetOrdinals {
                    start: Some(window.start),
                }),
                service_name: Some(name.clone()),
                selector: LabelSelector {
                    match_labels: Some(names::role_selector(instance, role.role)),
                    ..Default::default()
                },
                // Model loads take minutes: start every worker at once.
                pod_management_policy: Some("Parallel".into()),
                update_strategy: Some(update_strategy),
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
    BuiltRole {
        kind,
        name,
        children: vec![
            headless_service(plan, role.role),
            workload,
            disruption_budget(plan, role.role),
        ],
        platform: version,
    }
}
