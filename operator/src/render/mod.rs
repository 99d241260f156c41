//! Build (pure): a validated [`Plan`] becomes the desired children, each a complete
//! object for server-side apply. Builders read the plan only, never the raw spec; nothing
//! here talks to the API server. [`crate::reconcile`] observes, validates
//! ([`crate::plan::validate`]), applies, prunes and writes status around it.
//!
//! - [`names`]: names and labels; [`engine`]: the engine command; [`pod`]: engine pods;
//!   [`workers`]: StatefulSets or LeaderWorkerSets, headless Services, PDBs;
//!   [`gateway`]: the gateway and its RBAC; [`gateway_flags`]: its command line;
//!   [`gateway_site`]: what every gateway process of a deployment shares;
//!   [`inference_pool`]: the InferencePool, its picker and route; [`frontend`]: the
//!   decode pods' frontend behind it;
//!   [`model`]: model download; [`secrets`], [`token`], [`network_policy`].

pub mod engine;
pub mod frontend;
pub mod gateway;
pub mod gateway_flags;
pub mod gateway_site;
pub mod inference_pool;
pub mod model;
pub mod network_policy;
pub mod overrides;
pub mod pod;
pub mod pull;
pub mod secrets;
pub mod strategic_merge;
pub mod token;
pub mod workers;

use crate::api::{InferaDeployment, RoutingPolicy};
use crate::names::{self, Role};
use crate::plan::rollout::{RoleInput, RoleProgress, plan_rollout};
use crate::plan::{Observed, Plan, Platform, ValidateError, validate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::core::{ApiResource, GroupVersionKind};
use serde::Serialize;
use serde_json::Value;

/// The kinds of children, with what the API server calls them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// core/v1 Secret (only the cluster etcd's client certificate, copied).
    Secret,
    /// core/v1 ServiceAccount.
    ServiceAccount,
    /// rbac/v1 Role.
    Role,
    /// rbac/v1 RoleBinding.
    RoleBinding,
    /// core/v1 PersistentVolumeClaim.
    PersistentVolumeClaim,
    /// batch/v1 Job.
    Job,
    /// core/v1 Service.
    Service,
    /// apps/v1 StatefulSet.
    StatefulSet,
    /// leaderworkerset.x-k8s.io/v1 LeaderWorkerSet.
    LeaderWorkerSet,
    /// policy/v1 PodDisruptionBudget.
    PodDisruptionBudget,
    /// apps/v1 Deployment.
    Deployment,
    /// networking.k8s.io/v1 NetworkPolicy.
    NetworkPolicy,
    /// inference.networking.k8s.io/v1 InferencePool (GAIE's CRD, when installed).
    InferencePool,
    /// gateway.networking.k8s.io/v1 HTTPRoute (Gateway API's CRD, when installed).
    HttpRoute,
}

impl Kind {
    /// Every kind, in apply order (identity and storage first, workloads last).
    pub const ALL: [Kind; 14] = [
        Kind::Secret,
        Kind::ServiceAccount,
        Kind::Role,
        Kind::RoleBinding,
        Kind::PersistentVolumeClaim,
        Kind::Job,
        Kind::Service,
        // Before the engines start, so none is ever open.
        Kind::NetworkPolicy,
        Kind::StatefulSet,
        Kind::LeaderWorkerSet,
        Kind::PodDisruptionBudget,
        Kind::Deployment,
        // After the picker they name.
        Kind::InferencePool,
        Kind::HttpRoute,
    ];

    /// The kinds whose CRDs a cluster may not have: applied and pruned only where the
    /// API server serves them.
    pub const OPTIONAL: [Kind; 3] = [Kind::LeaderWorkerSet, Kind::InferencePool, Kind::HttpRoute];

    /// Group, version, kind and plural.
    pub fn api_resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::Secret => ("", "v1", "Secret", "secrets"),
            Kind::ServiceAccount => ("", "v1", "ServiceAccount", "serviceaccounts"),
            Kind::Role => ("rbac.authorization.k8s.io", "v1", "Role", "roles"),
            Kind::RoleBinding => (
                "rbac.authorization.k8s.io",
                "v1",
                "RoleBinding",
                "rolebindings",
            ),
            Kind::PersistentVolumeClaim => {
                ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
            }
            Kind::Job => ("batch", "v1", "Job", "jobs"),
            Kind::Service => ("", "v1", "Service", "services"),
            Kind::StatefulSet => ("apps", "v1", "StatefulSet", "statefulsets"),
            Kind::LeaderWorkerSet => (
                "leaderworkerset.x-k8s.io",
                "v1",
                "LeaderWorkerSet",
                "leaderworkersets",
            ),
            Kind::PodDisruptionBudget => (
                "policy",
                "v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
            ),
            Kind::Deployment => ("apps", "v1", "Deployment", "deployments"),
            Kind::NetworkPolicy => (
                "networking.k8s.io",
                "v1",
                "NetworkPolicy",
                "networkpolicies",
            ),
            Kind::InferencePool => (
                "inference.networking.k8s.io",
                "v1",
                "InferencePool",
                "inferencepools",
            ),
            Kind::HttpRoute => ("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    /// Whether the operator deletes children of this kind it no longer renders. The
    /// model cache is kept: it holds hundreds of gigabytes that took long to download.
    /// A copied Secret stays until the deployment is deleted: finding it would take
    /// listing Secrets, which is reading every Secret of the namespace, a right the
    /// operator does not hold.
    pub fn pruned(self) -> bool {
        !matches!(self, Kind::PersistentVolumeClaim | Kind::Secret)
    }
}

/// One desired object.
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    /// Its kind.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// The complete object (apiVersion, kind, metadata, spec).
    pub object: Value,
}

/// How a role's workers are run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleWorkers {
    /// The role.
    pub role: Role,
    /// Workers wanted by the spec.
    pub desired: i32,
    /// Workers rendered now (0 while the model downloads).
    pub rendered: i32,
    /// StatefulSet or LeaderWorkerSet.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// The release of Infera's parts its pods run.
    pub platform: crate::api::PlatformVersion,
    /// Where its rollout stands (a LeaderWorkerSet's is not tracked).
    pub progress: RoleProgress,
}

/// Everything a deployment should consist of.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// Objects to apply, in order.
    pub children: Vec<Child>,
    /// Worker sets by role.
    pub roles: Vec<RoleWorkers>,
    /// Workers per topology unit by role (mixed: 1), for `/scale`.
    pub unit: Vec<(Role, u32)>,
    /// The model download Job, when the source is Hugging Face.
    pub download_job: Option<String>,
    /// The gateway Deployment.
    pub gateway: String,
    /// `http://<service>.<namespace>:<port>`.
    pub gateway_endpoint: String,
    /// The gateways fetch their tokenizer from the workers (kv-aware routing over a
    /// tokenizer in the model folder): the `TokenizerLoaded` condition reports on it.
    pub tokenizer_from_workers: bool,
    /// The gateways serve HTTPS.
    pub gateway_tls: bool,
    /// The revision of the engine spec.
    pub revision: String,
}

/// Serializes a typed object into a child with the owner reference set.
pub fn child<T: Resource<DynamicType = ()> + Serialize>(
    kind: Kind,
    mut object: T,
    owner: Option<&OwnerReference>,
) -> Child {
    if let Some(owner) = owner {
        object.meta_mut().owner_references = Some(vec![owner.clone()]);
    }
    let name = object.meta().name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(&object).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), T::api_version(&()).into());
        map.insert("kind".into(), T::kind(&()).into());
    }
    Child {
        kind,
        name,
        object: value,
    }
}

/// Validates `idep` and builds its children: [`validate`] then [`build`].
pub fn render(
    idep: &InferaDeployment,
    observed: Observed<'_>,
    platform: &Platform,
) -> Result<Rendered, ValidateError> {
    validate(idep, observed, platform).and_then(|plan| build(&plan))
}

/// Builds every child of the deployment `plan` describes.
/// Fails only on a `podTemplate` override that does not merge into a pod template: the
/// one check validation cannot make, since the merge needs the rendered template.
pub fn build(plan: &Plan) -> Result<Rendered, ValidateError> {
    let d = &plan.deployment;
    let name = &plan.owner.name;
    let mut children = Vec::new();
    if let Some(data) = &plan.etcd_client_copy {
        children.push(secrets::build_etcd_client_copy(plan, data));
    }
    children.extend(secrets::build_pull_secret_copies(plan));
    children.extend(gateway::build_identity(plan));
    children.extend(network_policy::build_engine_network_policy(plan));
    let download_job = match model::build_model_download(plan) {
        Some(objs) => {
            let job = objs.iter().any(|c| c.kind == Kind::Job);
            children.extend(objs);
            job.then(|| names::model_download(name))
        }
        None => None,
    };
    let model_path = model::model_path(&d.model.volume);
    let prepared = d
        .roles
        .iter()
        .map(|role| {
            let command = engine::build_engine_command(plan, role, &model_path);
            workers::prepare_role(plan, role, &command)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let revision = workers::build_revision(&prepared);
    let desired: Vec<i32> = d
        .roles
        .iter()
        .map(|r| i32::try_from(r.workers).unwrap_or(i32::MAX))
        .collect();
    // A LeaderWorkerSet surges by itself: no window.
    let inputs: Vec<RoleInput<'_>> = d
        .roles
        .iter()
        .zip(&prepared)
        .zip(&desired)
        .map(|((role, p), &desired)| RoleInput {
            desired: if plan.model_ready { desired } else { 0 },
            limits: role.rollout,
            live: plan.live_workers.get(&role.role).filter(|_| p.nodes == 1),
            revision: p.carries_revision().then_some(revision.as_str()),
        })
        .collect();
    let windows = plan_rollout(&inputs);
    let mut role_workers = Vec::new();
    for (((role, p), (window, progress)), desired) in
        d.roles.iter().zip(prepared).zip(windows).zip(desired)
    {
        let set = workers::finish_role(plan, role, p, &revision, window);
        role_workers.push(RoleWorkers {
            role: role.role,
            desired,
            rendered: window.replicas,
            kind: set.kind,
            name: set.name.clone(),
            platform: set.platform,
            progress,
        });
        children.extend(set.children);
    }
    children.extend(gateway::build_gateway(plan, &model_path)?);
    children.extend(inference_pool::build_inference_pool(plan, &model_path));
    children.sort_by_key(|c| Kind::ALL.iter().position(|k| *k == c.kind));
    let scheme = if d.gateway.tls.is_some() {
        "https"
    } else {
        "http"
    };
    Ok(Rendered {
        children,
        roles: role_workers,
        unit: d.roles.iter().map(|r| (r.role, r.unit)).collect(),
        download_job,
        gateway: names::gateway(name),
        gateway_endpoint: format!(
            "{scheme}://{}.{}:{}",
            names::gateway(name),
            plan.owner.namespace,
            d.gateway.service.port
        ),
        tokenizer_from_workers: d.gateway.routing.policy == RoutingPolicy::KvAware
            && gateway_site::tokenizer_from_workers(plan),
        gateway_tls: d.gateway.tls.is_some(),
        revision,
    })
}

#[cfg(test)]
mod rollout_tests;
#[cfg(test)]
mod tests;
