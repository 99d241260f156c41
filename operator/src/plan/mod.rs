//! The validated plan of a deployment (pure): the middle of the reconcile pipeline
//! observe -> [`validate`] -> [`Plan`] -> `render::build` -> apply -> status.
//!
//! Validation reads the custom resources once: it checks what the API server cannot
//! (names, sizes, the topology's transport, the NVMe directory), fills in the platform's
//! etcd and NATS, and decides which engine runs, which workers each role gets and how
//! the gateway routes. The builders in [`crate::render`] read only the plan, never the
//! raw spec; `infera up` runs the same [`plan_deployment`] and builds its gateway from the
//! same [`GatewayRouting`].
//!
//! - [`platform`]: what the operator was started with (images, cluster etcd and NATS);
//! - [`routing`]: how the gateway routes; [`validate`]: the checks and the plan.

pub mod engine_platform;
pub mod platform;
pub mod rollout;
pub mod routing;
pub mod validate;

pub use engine_platform::{EnginePlatform, LiveEngines, PlatformChoice};
pub use platform::{DEFAULT_NVME_HOST_PATHS, Images, Platform};
pub use routing::{GatewayRouting, Tokenizer};
pub use validate::{EtcdClientTls, Observed, ValidateError, plan_deployment, validate};

use crate::api::{
    EtcdSpec, GatewayService, GatewayTls, HuggingFaceSource, KvCacheDtype, NetworkSpec,
    Parallelism, Quantization, SchedulingSpec, SecretKeyRef, TransportSpec,
};
use crate::names::Role;
use infera_engine_prep::Launch;
use infera_proto::pd::PdProtocol;
use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::BTreeMap;

/// Everything the operator builds a deployment's children from.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The deployment as owner of its children.
    pub owner: Owner,
    /// Infera's images.
    pub images: Images,
    /// What the deployment runs.
    pub deployment: DeploymentPlan,
    /// Where sidecars register and gateways find workers.
    pub discovery: Discovery,
    /// The NATS server KV events go through (messaging backend nats).
    pub nats_url: Option<String>,
    /// The request-plane flags of gateways and sidecars (`requestTransport: nats`).
    pub request_plane: Vec<String>,
    /// The cluster etcd's client certificate, copied into the deployment's namespace.
    pub etcd_client_copy: Option<EtcdClientTls>,
    /// The model is in place: workers run (else they wait at zero replicas).
    pub model_ready: bool,
    /// Autoscaled: the namespace of the operator, whose pods scrape the engines.
    pub autoscaler_namespace: Option<String>,
    /// Which release of Infera's parts each role's engine pods may run.
    pub engine_platforms: BTreeMap<Role, PlatformChoice>,
    /// How every pod pulls its images.
    pub pull: PullPlan,
    /// Each role's StatefulSet and pods as they stand (none yet: absent), for the
    /// rollout's window.
    pub live_workers: BTreeMap<Role, rollout::LiveWorkers>,
}

/// How the deployment's pods pull their images.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PullPlan {
    /// `spec.imagePullPolicy`: every container.
    pub policy: Option<crate::api::PullPolicy>,
    /// The operator's policy for Infera's images (`--image-pull-policy`).
    pub platform_policy: Option<crate::api::PullPolicy>,
    /// `spec.imagePullSecrets`, in the deployment's namespace.
    pub secrets: Vec<String>,
    /// The operator's pull secrets, copied into the namespace: (copy's name, data).
    pub copies: Vec<(String, PullSecretData)>,
}

/// A pull secret's type and data, as stored.
pub type PullSecretData = (String, BTreeMap<String, k8s_openapi::ByteString>);

/// The deployment, as the owner of its children.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    /// Deployment name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Controller owner reference (blocking the owner's foreground deletion).
    pub reference: OwnerReference,
}

impl Owner {
    /// Metadata of a child.
    pub fn meta(&self, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        }
    }
}

/// Where workers are registered.
#[derive(Debug, Clone, PartialEq)]
pub enum Discovery {
    /// Each sidecar writes its worker record into its Pod's annotation.
    Kubernetes,
    /// Leased records in etcd (the deployment's, or the cluster's filled in).
    Etcd(EtcdSpec),
}

/// What a deployment runs, wherever it runs: the operator's pods and `infera up` alike.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentPlan {
    /// Deployment name.
    pub name: String,
    /// The engine, or the simulator imitating one.
    pub launch: Launch,
    /// The engine container's settings.
    pub engine: EnginePlan,
    /// The model.
    pub model: ModelPlan,
    /// Workers by role, in start order (prefill before decode).
    pub roles: Vec<RolePlan>,
    /// The gateway.
    pub gateway: GatewayPlan,
    /// kvd, when the KV cache is on.
    pub kvd: Option<KvdPlan>,
    /// RDMA and the engines' NetworkPolicy.
    pub network: NetworkSpec,
    /// Where engine pods are scheduled.
    pub scheduling: SchedulingSpec,
}

impl DeploymentPlan {
    /// The InferencePool's frontend port, when decode pods carry a direct-mode frontend
    /// (an InferencePool over prefill/decode workers).
    pub fn frontend_port(&self) -> Option<u16> {
        let pool = self.gateway.inference_pool.as_ref()?;
        let disaggregated = self.roles.iter().any(|r| r.pd.is_some());
        disaggregated
            .then(|| u16::try_from(pool.frontend_port).ok())
            .flatten()
    }

    /// The connector between prefill and decode, when disaggregated.
    pub fn protocol(&self) -> Option<PdProtocol> {
        self.roles
            .iter()
            .find_map(|r| r.pd.as_ref().map(|l| l.protocol))
    }
}

/// The engine container's settings shared by every role.
#[derive(Debug, Clone, PartialEq)]
pub struct EnginePlan {
    /// Image (none: the simulator's).
    pub image: Option<String>,
    /// The user's arguments, after the rendered ones.
    pub args: Vec<String>,
    /// The user's environment, after the rendered one.
    pub env: Vec<EnvVar>,
    /// KV-cache dtype.
    pub kv_cache_dtype: KvCacheDtype,
    /// `/dev/shm` size.
    pub shared_memory_size: Quantity,
    /// Longest drain of in-flight requests when a worker stops.
    pub drain_seconds: u32,
    /// The extended resource GPUs are requested as.
    pub gpu_resource_name: String,
}

/// Where the weights are and how the engines serve them.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    /// Served model name.
    pub served_name: String,
    /// The volume pods mount.
    pub volume: ModelVolume,
    /// The Hugging Face repository downloaded into the cache volume, when that is the
    /// source.
    pub hugging_face: Option<HuggingFaceSource>,
    /// Weight quantization.
    pub quantization: Quantization,
    /// The simulator's tokenizer folder, relative to the model folder.
    pub tokenizer: Option<String>,
    /// Seconds a worker may take to load before it counts as failed.
    pub startup_budget_seconds: u32,
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

/// One role's workers.
#[derive(Debug, Clone, PartialEq)]
pub struct RolePlan {
    /// The role.
    pub role: Role,
    /// Workers the spec asks for.
    pub workers: u32,
    /// Workers of this role in one topology unit (mixed: 1), for `/scale`.
    pub unit: u32,
    /// Parallelism of one worker (a topology role's, with the deployment's expert
    /// parallelism carried over).
    pub parallelism: Parallelism,
    /// The topology role's arguments, after the deployment's.
    pub args: Vec<String>,
    /// CPU and memory of the engine container.
    pub resources: Option<ResourceRequirements>,
    /// GPUs per pod (none for the simulator).
    pub gpus: u32,
    /// The prefill/decode connector, for those roles.
    pub pd: Option<PdLeg>,
    /// The user's pod-template overrides for this role, in merge order.
    pub pod_overrides: Vec<PodOverride>,
    /// How its workers roll onto a new revision.
    pub rollout: rollout::RolloutLimits,
}

/// A user's pod-template patch, merged by strategic-merge rules onto a rendered template.
#[derive(Debug, Clone, PartialEq)]
pub struct PodOverride {
    /// The spec field it came from (for errors), e.g. `spec.engine.podTemplate`.
    pub field: String,
    /// The patch.
    pub patch: serde_json::Value,
}

/// Where a role's worker sits in a prefill/decode pair, and over what.
#[derive(Debug, Clone, PartialEq)]
pub struct PdLeg {
    /// The connector protocol.
    pub protocol: PdProtocol,
    /// The topology's transport.
    pub transport: TransportSpec,
}

/// The gateway's Deployment and Service.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayPlan {
    /// Replicas.
    pub replicas: i32,
    /// How it routes.
    pub routing: GatewayRouting,
    /// Image (none: Infera's).
    pub image: Option<String>,
    /// Container resources (none: the defaults).
    pub resources: Option<ResourceRequirements>,
    /// The Service.
    pub service: GatewayService,
    /// The API keys clients must present.
    pub api_keys_secret_ref: Option<SecretKeyRef>,
    /// `/metrics` needs a key too.
    pub metrics_require_auth: bool,
    /// Serve HTTPS with this certificate.
    pub tls: Option<GatewayTls>,
    /// Where gateway pods are scheduled.
    pub scheduling: SchedulingSpec,
    /// The user's pod-template override for gateway pods.
    pub pod_override: Option<PodOverride>,
    /// The InferencePool, its picker and route.
    pub inference_pool: Option<crate::api::InferencePoolSpec>,
    /// The scaling API (`spec.gateway.scalingApi`), with what it reads.
    pub scaling_api: Option<ScalingAccess>,
}

/// What the gateways' scaling API may touch: the deployment itself, and the PDTopology
/// a disaggregated one names (read for its unit of workers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalingAccess {
    /// The PDTopology, when disaggregated.
    pub topology: Option<String>,
}

/// kvd's tiers, in bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct KvdPlan {
    /// The RAM tier as written (kvd's memory request).
    pub ram: Quantity,
    /// The RAM tier in bytes.
    pub ram_bytes: u64,
    /// The NVMe tier.
    pub nvme: Option<NvmePlan>,
    /// The distributed tier's URL.
    pub remote_url: Option<String>,
    /// The distributed tier's URL, from a Secret.
    pub remote_url_secret_ref: Option<SecretKeyRef>,
}

/// An NVMe tier, in a node directory the platform allows.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmePlan {
    /// Node directory.
    pub path: String,
    /// Bytes.
    pub bytes: u64,
}

#[cfg(test)]
mod tests;
