//! Build (pure): an `InferaDeployment` and its `PDTopology` become the desired children,
//! each a complete object for server-side apply. Nothing here talks to the API server;
//! [`crate::reconcile`] observes, applies, prunes and writes status around it.
//!
//! - [`names`]: names and labels; [`engine`]: the engine command; [`pod`]: engine pods;
//!   [`workers`]: StatefulSets or LeaderWorkerSets, headless Services, PDBs;
//!   [`gateway`]: the gateway and its RBAC; [`model`]: model download.

pub mod engine;
pub mod gateway;
pub mod gateway_flags;
pub mod model;
pub mod names;
pub mod network_policy;
pub mod pod;
pub mod quantity;
pub mod secrets;
pub mod token;
pub mod workers;

use crate::api::resolve::{ResolveError, Workers, gpus_per_worker, resolve_workers};
use crate::api::{
    DiscoveryBackend, EngineKind, EtcdSpec, InferaDeployment, InferaDeploymentSpec,
    MessagingBackend, PDTopology, Parallelism,
};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::core::{ApiResource, GroupVersionKind};
use names::Role;
use serde::Serialize;
use serde_json::Value;
use std::path::Component;

/// Container images of the parts Infera ships.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// `infera-gateway`.
    pub gateway: String,
    /// `infera-engine-sidecar`.
    pub sidecar: String,
    /// `infera-sim` (engines of `kind: sim`).
    pub sim: String,
    /// `infera-kvd`.
    pub kvd: String,
    /// `infera-downloader`: runs the model download when the engine image is not a
    /// Python one (`sim`); `huggingface_hub` is baked in, nothing is installed at run time.
    pub downloader: String,
}

impl Images {
    /// `<registry>/infera-<part>:<tag>` for every part.
    pub fn from_registry(registry: &str, tag: &str) -> Self {
        let image = |part: &str| format!("{}/infera-{part}:{tag}", registry.trim_end_matches('/'));
        Self {
            gateway: image("gateway"),
            sidecar: image("engine-sidecar"),
            sim: image("sim"),
            kvd: image("kvd"),
            downloader: image("downloader"),
        }
    }
}

/// What the operator was configured with: Infera's images, and the etcd and NATS the
/// chart installed, which deployments use when they name none of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// Images.
    pub images: Images,
    /// Client URLs of the cluster's etcd (`--default-etcd-endpoints`).
    pub etcd_endpoints: Vec<String>,
    /// URL of the cluster's NATS (`--default-nats-url`).
    pub nats_url: Option<String>,
    /// The Secret (`namespace`, `name`) with the CA and client certificate of the
    /// cluster's etcd when it requires TLS (`--default-etcd-client-secret`): copied into
    /// each deployment that uses that etcd.
    pub etcd_client_secret: Option<(String, String)>,
    /// Node directories under which a deployment's `kvCache.nvme.path` may lie
    /// (`--kv-cache-nvme-host-paths`): kvd runs as root in it.
    pub nvme_host_paths: Vec<String>,
}

/// Where NVMe tiers may lie unless the operator is told otherwise.
pub const DEFAULT_NVME_HOST_PATHS: [&str; 4] = ["/mnt", "/data", "/raid", "/var/lib/infera"];

impl Platform {
    /// Images only: no cluster etcd or NATS.
    pub fn with_images(images: Images) -> Self {
        Self {
            images,
            etcd_endpoints: Vec::new(),
            nats_url: None,
            etcd_client_secret: None,
            nvme_host_paths: DEFAULT_NVME_HOST_PATHS.map(String::from).to_vec(),
        }
    }

    /// Whether `spec` uses the cluster's etcd (etcd discovery naming no endpoints).
    pub fn uses_cluster_etcd(spec: &InferaDeploymentSpec) -> bool {
        spec.discovery.backend == DiscoveryBackend::Etcd && spec.discovery.etcd.is_none()
    }
}

/// The spec of deployment `name` with the platform's etcd and NATS filled in where the
/// deployment picked the backend but named no endpoint (the etcd's client certificate
/// from the copy named [`names::etcd_client_secret`]).
pub fn with_platform_endpoints(
    name: &str,
    spec: &InferaDeploymentSpec,
    platform: &Platform,
) -> Result<InferaDeploymentSpec, RenderError> {
    let mut spec = spec.clone();
    if Platform::uses_cluster_etcd(&spec) {
        if platform.etcd_endpoints.is_empty() {
            return Err(RenderError::NoEtcd);
        }
        spec.discovery.etcd = Some(EtcdSpec {
            endpoints: platform.etcd_endpoints.clone(),
            prefix: infera_proto::discovery::DEFAULT_ETCD_PREFIX.into(),
            tls_secret_name: platform
                .etcd_client_secret
                .as_ref()
                .map(|_| names::etcd_client_secret(name)),
            user: None,
            password_secret_ref: None,
        });
    }
    if spec.messaging.backend == MessagingBackend::Nats && spec.messaging.nats_url.is_none() {
        match &platform.nats_url {
            Some(url) => spec.messaging.nats_url = Some(url.clone()),
            None => return Err(RenderError::NoNats),
        }
    }
    Ok(spec)
}

/// An NVMe tier's hostPath must lie under a directory the platform allows: kvd writes
/// there as root, so the spec must not reach the node's system directories.
fn check_nvme_path(spec: &InferaDeploymentSpec, platform: &Platform) -> Result<(), RenderError> {
    let Some(nvme) = spec
        .kv_cache
        .nvme
        .as_ref()
        .filter(|_| spec.kv_cache.enabled)
    else {
        return Ok(());
    };
    let path = std::path::Path::new(&nvme.path);
    let plain = path
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let allowed = platform
        .nvme_host_paths
        .iter()
        .any(|dir| path.starts_with(dir) && path != std::path::Path::new(dir.as_str()));
    if plain && allowed {
        return Ok(());
    }
    Err(RenderError::NvmePathNotAllowed {
        path: nvme.path.clone(),
        allowed: platform.nvme_host_paths.join(", "),
    })
}

/// kvd takes byte counts: its sizes must be whole bytes.
fn check_kv_cache_sizes(spec: &InferaDeploymentSpec) -> Result<(), RenderError> {
    let kv = &spec.kv_cache;
    if !kv.enabled {
        return Ok(());
    }
    let mut sizes = vec![("spec.kvCache.ram", &kv.ram.0)];
    if let Some(nvme) = &kv.nvme {
        sizes.push(("spec.kvCache.nvme.size", &nvme.size.0));
    }
    for (field, value) in sizes {
        if quantity::bytes(value).is_none_or(|b| b == 0) {
            return Err(RenderError::Quantity {
                field,
                value: value.clone(),
            });
        }
    }
    Ok(())
}

/// The NATS server KV events go through, when they do.
pub fn nats_url(spec: &InferaDeploymentSpec) -> Option<&str> {
    spec.messaging
        .nats_url
        .as_deref()
        .filter(|_| spec.messaging.backend == MessagingBackend::Nats)
}

/// The sidecar's NATS flags when KV events go over NATS.
pub fn nats_args(spec: &InferaDeploymentSpec) -> Vec<String> {
    nats_url(spec)
        .map(|url| gateway_flags::nats_flags(url).to_vec())
        .unwrap_or_default()
}

/// The image of the engine container.
pub fn engine_image(spec: &crate::api::InferaDeploymentSpec, images: &Images) -> String {
    // The API server requires an image for every kind but sim.
    spec.engine
        .image
        .clone()
        .unwrap_or_else(|| images.sim.clone())
}

/// Where the model weights live, as pods mount them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelVolume {
    /// A PVC (the user's, or the Hugging Face cache), the model under `sub_path`.
    Claim {
        /// Claim name.
        claim: String,
        /// Folder of the model in the volume ("" for its root).
        sub_path: String,
    },
    /// A node folder.
    Host {
        /// Absolute path on the node.
        path: String,
    },
}

impl ModelVolume {
    /// The model folder inside a pod.
    pub fn model_path(&self) -> String {
        match self {
            Self::Claim { sub_path, .. } if !sub_path.is_empty() => {
                format!("{}/{}", engine::MODEL_MOUNT, sub_path.trim_matches('/'))
            }
            _ => engine::MODEL_MOUNT.to_owned(),
        }
    }
}

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
}

impl Kind {
    /// Every kind, in apply order (identity and storage first, workloads last).
    pub const ALL: [Kind; 12] = [
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
    ];

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
}

/// What cannot be built, as a `Degraded` reason and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// A rule across objects (see [`ResolveError`]).
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The name leaves no room for children's suffixes.
    #[error("metadata.name {0:?} is longer than {max} characters: pod names add a role, an ordinal and a hash within Kubernetes' 63-character label limit; use a shorter name", max = names::MAX_NAME_LEN)]
    NameTooLong(String),
    /// etcd discovery without endpoints, and no cluster etcd.
    #[error(
        "spec.discovery.backend is etcd but spec.discovery.etcd.endpoints is unset and the operator knows no cluster etcd (install the chart with etcd.enabled=true, or set the endpoints)"
    )]
    NoEtcd,
    /// The cluster etcd requires a client certificate whose Secret does not exist.
    #[error(
        "spec.discovery uses the cluster etcd, which requires a client certificate, but its Secret {0} does not exist (the chart writes it with etcd.tls.enabled; with etcd.tls.clientSecretName it must exist, e.g. from cert-manager)"
    )]
    NoEtcdClientCertificate(String),
    /// NATS messaging without a URL, and no cluster NATS.
    #[error(
        "spec.messaging.backend is nats but spec.messaging.natsUrl is unset and the operator knows no cluster NATS (install the chart with nats.enabled=true, or set natsUrl)"
    )]
    NoNats,
    /// A size that is not a number of bytes.
    #[error("{field} {value:?} is not a number of bytes (use e.g. 64Gi or 500G)")]
    Quantity {
        /// The field.
        field: &'static str,
        /// What it holds.
        value: String,
    },
    /// An NVMe tier outside the directories the platform allows.
    #[error(
        "spec.kvCache.nvme.path {path:?} is not below a directory this operator allows for NVMe tiers ({allowed}); use a folder below one, or ask the platform team to add one (the chart's operator.kvCacheNvmeHostPaths)"
    )]
    NvmePathNotAllowed {
        /// The path.
        path: String,
        /// The allowed directories.
        allowed: String,
    },
    /// The object was never stored (no uid for owner references).
    #[error("the InferaDeployment has no uid or namespace yet")]
    NotStored,
}

impl RenderError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Resolve(ResolveError::MissingTopology(_)) => "TopologyNotFound",
            Self::Resolve(ResolveError::Unsupported { .. }) => "UnsupportedTransport",
            Self::Resolve(ResolveError::Parallelism { .. }) => "InvalidParallelism",
            Self::NameTooLong(_) => "NameTooLong",
            Self::NoEtcd => "EtcdEndpointsMissing",
            Self::NoEtcdClientCertificate(_) => "EtcdClientCertificateMissing",
            Self::NoNats => "NatsUrlMissing",
            Self::Quantity { .. } => "InvalidQuantity",
            Self::NvmePathNotAllowed { .. } => "NvmePathNotAllowed",
            Self::NotStored => "NotStored",
        }
    }
}

/// What the build needs besides the two resources.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observed<'a> {
    /// The referenced topology, if it exists.
    pub topology: Option<&'a PDTopology>,
    /// The model is in place: a PVC or host path, or a finished download (then the
    /// download Job is no longer rendered).
    pub model_ready: bool,
    /// The data of the cluster etcd's client certificate Secret
    /// ([`Platform::etcd_client_secret`]), when the deployment uses that etcd and it
    /// exists.
    pub etcd_client_tls: Option<&'a EtcdClientTls>,
}

/// A Secret's data, as stored.
pub type EtcdClientTls = std::collections::BTreeMap<String, k8s_openapi::ByteString>;

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

/// One role's parallelism, extra args and engine resources: the topology's role, with
/// the deployment's `expertParallel` carried over (a MoE model is one on every role).
fn role_parallelism<'a>(
    spec: &'a InferaDeploymentSpec,
    topology: Option<&'a PDTopology>,
    role: Role,
) -> (Parallelism, &'a [String], Option<&'a ResourceRequirements>) {
    let engine_resources = spec.engine.resources.as_ref();
    let topo_role = match (role, topology) {
        (Role::Prefill, Some(t)) => Some(&t.spec.prefill),
        (Role::Decode, Some(t)) => Some(&t.spec.decode),
        _ => None,
    };
    match topo_role {
        Some(r) => {
            let mut p = r.parallelism.clone();
            p.expert_parallel |= spec.engine.parallelism.expert_parallel;
            (p, &r.args, r.resources.as_ref().or(engine_resources))
        }
        None => (spec.engine.parallelism.clone(), &[], engine_resources),
    }
}

/// Workers by role.
type RoleCounts = Vec<(Role, u32)>;

/// Builds every child of `idep`.
pub fn render(
    idep: &InferaDeployment,
    observed: Observed<'_>,
    platform: &Platform,
) -> Result<Rendered, RenderError> {
    let images = &platform.images;
    let name = idep.metadata.name.clone().unwrap_or_default();
    if name.len() > names::MAX_NAME_LEN {
        return Err(RenderError::NameTooLong(name));
    }
    let (Some(namespace), Some(mut owner)) = (
        idep.metadata.namespace.clone(),
        idep.controller_owner_ref(&()),
    ) else {
        return Err(RenderError::NotStored);
    };
    // Foreground deletion of the deployment waits for its children.
    owner.block_owner_deletion = Some(true);
    let spec = with_platform_endpoints(&name, &idep.spec, platform)?;
    check_kv_cache_sizes(&spec)?;
    check_nvme_path(&spec, platform)?;
    let spec = &spec;
    let topology = observed.topology;
    let workers = resolve_workers(
        spec,
        topology.map(|t| (t.metadata.name.as_deref().unwrap_or_default(), &t.spec)),
    )?;
    let (roles, protocol, unit): (RoleCounts, _, RoleCounts) = match workers {
        Workers::Mixed(n) => (vec![(Role::Mixed, n)], None, vec![(Role::Mixed, 1)]),
        Workers::Disaggregated {
            prefill,
            decode,
            protocol,
        } => {
            let (p, d) = topology
                .map(|t| crate::api::resolve::unit_size(&t.spec))
                .unwrap_or((1, 1));
            (
                vec![(Role::Prefill, prefill), (Role::Decode, decode)],
                Some(protocol),
                vec![(Role::Prefill, p), (Role::Decode, d)],
            )
        }
    };
    let model = model::volume(&name, spec);
    let model_path = model.model_path();
    let tokenizer = spec
        .model
        .tokenizer
        .as_ref()
        .map(|t| format!("{model_path}/{}", t.trim_matches('/')));
    let kv_events = spec.gateway.policy == crate::api::RoutingPolicy::KvAware;
    let ctx = Ctx {
        name: &name,
        namespace: &namespace,
        owner: &owner,
        images,
    };
    let mut children = Vec::new();
    if let (true, Some((secret_ns, secret))) = (
        Platform::uses_cluster_etcd(&idep.spec),
        &platform.etcd_client_secret,
    ) {
        let data = observed
            .etcd_client_tls
            .ok_or_else(|| RenderError::NoEtcdClientCertificate(format!("{secret_ns}/{secret}")))?;
        children.push(secrets::etcd_client_copy(&ctx, data));
    }
    children.extend(gateway::identity(&ctx, spec));
    children.extend(network_policy::engine_network_policy(&ctx, spec));
    let download_job = match model::download(&ctx, spec, observed.model_ready) {
        Some(objs) => {
            let job = objs.iter().any(|c| c.kind == Kind::Job);
            children.extend(objs);
            job.then(|| names::model_download(&name))
        }
        None => None,
    };
    let mut role_workers = Vec::new();
    for (role, count) in roles {
        let (parallelism, role_args, resources) = role_parallelism(spec, topology, role);
        let pd = match (protocol, topology) {
            (Some(protocol), Some(t)) => Some(engine::PdLeg {
                protocol,
                transport: &t.spec.transport,
            }),
            _ => None,
        };
        let command = engine::engine_command(
            spec,
            &engine::RoleInput {
                role,
                parallelism: &parallelism,
                role_args,
                pd,
                model_path: &model_path,
                tokenizer_path: tokenizer.as_deref(),
            },
            kv_events,
        );
        let desired = i32::try_from(count).unwrap_or(i32::MAX);
        let rendered = if observed.model_ready { desired } else { 0 };
        let gpus = if spec.engine.kind == EngineKind::Sim {
            0
        } else {
            gpus_per_worker(&parallelism)
        };
        let set = workers::role_set(
            &ctx,
            spec,
            &workers::RoleSet {
                role,
                replicas: rendered,
                nodes: parallelism.nodes_per_worker,
                engine: &command,
                gpus,
                resources,
                model: &model,
            },
        );
        role_workers.push(RoleWorkers {
            role,
            desired,
            rendered,
            kind: set.kind,
            name: set.name.clone(),
        });
        children.extend(set.children);
    }
    let gw = gateway::gateway(&ctx, spec, &model, &model_path);
    children.extend(gw);
    children.sort_by_key(|c| Kind::ALL.iter().position(|k| *k == c.kind));
    Ok(Rendered {
        children,
        roles: role_workers,
        unit,
        download_job,
        gateway: names::gateway(&name),
        gateway_endpoint: format!(
            "{}://{}.{namespace}:{}",
            if spec.gateway.tls.is_some() {
                "https"
            } else {
                "http"
            },
            names::gateway(&name),
            spec.gateway.service.port
        ),
    })
}

/// Shared inputs of the builders.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    /// Deployment name.
    pub name: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// Controller owner reference to the deployment.
    pub owner: &'a OwnerReference,
    /// Images.
    pub images: &'a Images,
}

impl Ctx<'_> {
    /// Metadata of a child.
    pub fn meta(
        &self,
        name: String,
        labels: std::collections::BTreeMap<String, String>,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.to_owned()),
            labels: Some(labels),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests;
