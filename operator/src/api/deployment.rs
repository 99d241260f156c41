//! `InferaDeployment`: one served model, its engine workers (mixed, or prefill/decode
//! units shaped by a `PDTopology`) and its gateways.

use super::autoscaling::{AutoscalingSpec, AutoscalingStatus, RoleReplicas};
use super::common::{EngineKind, Parallelism, RetentionClass, SecretKeyRef, SimFlavor, one};
use super::platform::{LocalSecret, PlatformSpec, PlatformStatus, PullPolicy};
use super::rollout::{RolloutSpec, RolloutStatus};
use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A model served by engine workers behind gateways. `replicas` counts workers in mixed
/// mode and topology units in disaggregated mode (a 1P2D topology at 2 gives 2 prefill
/// and 4 decode workers); `kubectl scale` and autoscalers change it.
// Several `printcolumn(...)` carry the same `type_`: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "infera.amd.com",
    version = "v1alpha1",
    kind = "InferaDeployment",
    plural = "inferadeployments",
    shortname = "idep",
    namespaced,
    status = "InferaDeploymentStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Engine", type_ = "string", json_path = ".spec.engine.kind"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.serving.mode"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InferaDeploymentSpec {
    /// Workers in mixed mode; topology units in disaggregated mode (default 1).
    #[serde(default = "one_i32")]
    #[schemars(range(min = 0, max = 1024))]
    pub replicas: i32,
    /// The model and where its weights come from.
    pub model: ModelSpec,
    /// The inference engine and how each worker runs it.
    pub engine: EngineSpec,
    /// Mixed workers, or prefill/decode disaggregation.
    #[serde(default)]
    pub serving: ServingSpec,
    /// Node networking: AINIC RDMA for KV transfer and collectives.
    #[serde(default)]
    pub network: NetworkSpec,
    /// The gateways clients talk to.
    #[serde(default)]
    pub gateway: GatewaySpec,
    /// Where gateways find workers.
    #[serde(default)]
    pub discovery: DiscoverySpec,
    /// Message bus for KV events.
    #[serde(default)]
    pub messaging: MessagingSpec,
    /// The tiered KV-cache daemon (kvd) beside each engine.
    #[serde(default)]
    pub kv_cache: KvCacheSpec,
    /// Where engine pods run.
    #[serde(default)]
    pub scheduling: SchedulingSpec,
    /// Size the workers on latency targets: the operator scrapes the gateways' and the
    /// engines' `/metrics` and sets `replicas` (mixed) or `serving.roleReplicas`
    /// (disaggregated, each role apart) between minReplicas and maxReplicas, with
    /// server-side apply under the field manager `infera-autoscaler`: leave that field
    /// out of GitOps manifests (the GitOps guide). While a HorizontalPodAutoscaler
    /// targets this deployment's `/scale`, the operator stands down (condition
    /// Autoscaling: StoodDown). Unset: the workers are what `replicas` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
    /// The release of Infera's own parts in the engine pods (see `status.platform`).
    /// Unset: engines keep the release they run across operator upgrades.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformSpec>,
    /// Secrets (`kubernetes.io/dockerconfigjson`, in this namespace) every pod of the
    /// deployment pulls its images with: engines, gateways, the model download. Added to
    /// the ones the operator was installed with (the chart's `imagePullSecrets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalSecret>,
    /// When the kubelet pulls the images of every container of the deployment's pods
    /// (the engine's included). Unset: the operator's setting (the chart's
    /// `image.pullPolicy`) for Infera's images, Kubernetes' default for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// How an engine change rolls (any change to the engine pods: image, arguments,
    /// environment, resources, the platform release). By default every role starts one
    /// new worker beside its old ones and removes an old one only once a new one is
    /// ready, so it never serves with fewer workers; prefill and decode roll as one
    /// topology (gateways pair only workers of one revision).
    #[serde(default)]
    pub rollout: RolloutSpec,
}

/// Moves per stream for operator-made gateways: a decode worker lost mid-stream is not
/// the client's problem (Dynamo recommends 3 for its gateway, whose flag defaults to 0).
pub const DEFAULT_MIGRATION_LIMIT: u32 = 3;

fn default_migration_limit() -> u32 {
    DEFAULT_MIGRATION_LIMIT
}

fn one_i32() -> i32 {
    1
}

/// Weight quantization of the served checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Quantization {
    /// What the checkpoint says.
    #[default]
    Auto,
    /// FP8.
    Fp8,
    /// MXFP4 (MI355X native).
    Mxfp4,
    /// BF16.
    Bf16,
}

/// The model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Name clients send as `model` (the engines' served model name).
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Where the weights come from: exactly one of huggingFace, pvc or hostPath.
    pub source: ModelSource,
    /// Weight quantization.
    #[serde(default)]
    pub quantization: Quantization,
    /// Tokenizer folder (tokenizer.json and tokenizer_config.json) for kv-aware routing,
    /// relative to the model root; default the model root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Seconds a worker may take to load the model before it counts as failed (sizes
    /// the startup probe; loads take 5-30 minutes).
    #[serde(default = "startup_budget")]
    #[schemars(range(min = 60, max = 14400))]
    pub startup_budget_seconds: u32,
}

fn startup_budget() -> u32 {
    1800
}

/// Where model weights come from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.huggingFace), has(self.pvc), has(self.hostPath)].filter(x, x).size() == 1").message("spec.model.source: set exactly one of huggingFace, pvc or hostPath"))]
pub struct ModelSource {
    /// A Hugging Face repository, downloaded once by a Job into a PVC the deployment's
    /// pods share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugging_face: Option<HuggingFaceSource>,
    /// An existing PersistentVolumeClaim holding the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcSource>,
    /// A directory on every node (pre-staged weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPathSource>,
}

/// A Hugging Face model repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct HuggingFaceSource {
    /// Repository id, `org/name` (or a legacy id without an org, such as `gpt2`).
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$"))]
    pub id: String,
    /// Branch, tag or commit; default `main`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Secret key holding an access token, for gated models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,
    /// The hub to download from (`HF_ENDPOINT`): a mirror or an in-house hub serving
    /// Hugging Face's API; default https://huggingface.co.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(url)]
    pub endpoint: Option<String>,
    /// Size of the cache PVC the download Job fills.
    #[serde(default = "cache_size")]
    pub cache_size: Quantity,
    /// Storage class of the cache PVC (ReadWriteMany when workers span nodes); default
    /// the cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

fn cache_size() -> Quantity {
    Quantity("500Gi".into())
}

/// An existing PersistentVolumeClaim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcSource {
    /// Claim name, in the deployment's namespace.
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
        length(max = 253)
    )]
    pub claim_name: String,
    /// Directory of the model inside the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!self.startsWith('/') && !self.contains('..')").message("spec.model.source.pvc.subPath must be relative and must not contain '..'"))]
    pub sub_path: Option<String>,
}

/// A node directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPathSource {
    /// Absolute path on the node.
    #[schemars(regex(pattern = r"^/"))]
    pub path: String,
}

/// KV-cache element type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// FP8 (the earlier launchers' default: twice the cache of bf16).
    #[default]
    Fp8,
    /// The model's dtype.
    Auto,
    /// BF16.
    Bf16,
}

/// The engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.kind == 'sim' || has(self.image)").message("spec.engine.image is required for vllm, sglang and atom (the vendor image to run); only kind: sim has a default"))]
#[x_kube(validation = Rule::new("self.kind == 'sim' || !has(self.simFlavor)").message("spec.engine.simFlavor applies to kind: sim only; remove it"))]
#[x_kube(validation = Rule::new("self.kind != 'sim' || self.parallelism.nodesPerWorker == 1").message("spec.engine.parallelism.nodesPerWorker must be 1 for kind: sim (a simulated worker does not span nodes)"))]
pub struct EngineSpec {
    /// Engine: vllm, sglang, atom, or sim (the simulator, for clusters without GPUs).
    pub kind: EngineKind,
    /// Container image of the engine (for sim, default the Infera image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// Which engine the simulator imitates (kind: sim only; default vllm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_flavor: Option<SimFlavor>,
    /// Extra engine arguments, passed verbatim after the ones Infera renders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment of the engine container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Parallelism of one worker (mixed mode; a topology sets its roles' own).
    #[serde(default)]
    pub parallelism: Parallelism,
    /// Size of /dev/shm in engine pods (NCCL/RCCL and the engines' IPC need it large;
    /// default 64Gi).
    #[serde(default = "shm_size")]
    pub shared_memory_size: Quantity,
    /// KV-cache element type (default fp8, as the earlier launchers did).
    #[serde(default)]
    pub kv_cache_dtype: KvCacheDtype,
    /// CPU and memory of the engine container (GPUs and RDMA devices are added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Longest wait for in-flight requests when a worker stops (its sidecar's
    /// `--drain-timeout`; default 60). The pod's grace period is max(120, this + 65) s:
    /// deregistration, the drain, and the engine's own stop.
    #[serde(default = "drain_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub drain_seconds: u32,
    /// The extended resource engine pods request GPUs as (default `amd.com/gpu`, the
    /// ROCm device plugin's; e.g. `amd.com/gpu-partition` or a DRA-backed name).
    #[serde(default = "gpu_resource_name")]
    #[schemars(length(min = 1, max = 253))]
    pub gpu_resource_name: String,
    /// A pod template merged onto every engine pod Infera renders, by Kubernetes'
    /// strategic-merge rules (as `kubectl patch` would): maps merge, `null` deletes,
    /// containers, volumes, env, ports and mounts merge by name (mount path, port),
    /// other lists are replaced; `$patch: delete|replace` work. E.g. extra volumes and
    /// mounts, pod labels and annotations, an image pull secret, a container's
    /// securityContext (the engine container is `engine`; init containers `node-env`,
    /// `kvd`, `sidecar`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_template_schema")]
    pub pod_template: Option<serde_json::Value>,
    /// Pod templates for one role of a disaggregated deployment, merged after
    /// `podTemplate`.
    #[serde(default, skip_serializing_if = "RolePodTemplates::is_empty")]
    pub role_pod_templates: RolePodTemplates,
}

/// Per-role pod templates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolePodTemplates {
    /// Merged onto prefill pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_template_schema")]
    pub prefill: Option<serde_json::Value>,
    /// Merged onto decode pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_template_schema")]
    pub decode: Option<serde_json::Value>,
}

impl RolePodTemplates {
    fn is_empty(&self) -> bool {
        self.prefill.is_none() && self.decode.is_none()
    }
}

/// A strategic-merge patch of a `PodTemplateSpec` (`metadata`, `spec`): any object, read
/// as a pod template when merged.
fn pod_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn gpu_resource_name() -> String {
    "amd.com/gpu".into()
}

/// The sidecar's drain budget unless the spec names one.
pub const DEFAULT_DRAIN_SECONDS: u32 = 60;

fn drain_seconds() -> u32 {
    DEFAULT_DRAIN_SECONDS
}

fn shm_size() -> Quantity {
    Quantity("64Gi".into())
}

/// How requests are served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServingMode {
    /// Every worker runs whole requests.
    #[default]
    Mixed,
    /// Prefill and decode run on separate workers, shaped by a PDTopology.
    Disaggregated,
}

/// Serving mode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode != 'disaggregated' || has(self.topologyRef)").message("spec.serving.topologyRef is required when spec.serving.mode is disaggregated: name a PDTopology in this namespace"))]
#[x_kube(validation = Rule::new("self.mode != 'mixed' || !has(self.topologyRef)").message("spec.serving.topologyRef applies to mode: disaggregated only; remove it or set mode: disaggregated"))]
pub struct ServingSpec {
    /// mixed or disaggregated.
    #[serde(default)]
    pub mode: ServingMode,
    /// Name of the PDTopology (same namespace) giving the prefill/decode shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
        length(max = 253)
    )]
    pub topology_ref: Option<String>,
    /// Workers per role, written by the autoscaler (`spec.autoscaling`) in place of the
    /// topology's ratio times `replicas`; ignored without `spec.autoscaling` and in mixed
    /// mode. While set, `kubectl scale` does not change the workers, and `/scale`
    /// reports the complete topology units they make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_replicas: Option<RoleReplicas>,
}

/// Node networking.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// RDMA (RoCEv2 over AINIC) for KV transfer and collectives. The operator requests
    /// the device-plugin resources, adds IPC_LOCK, and sets MC_GID_INDEX,
    /// NCCL_IB_GID_INDEX and MORI_IB_GID_INDEX (gidIndex, else found on the node) and
    /// the earlier launchers' RDMA defaults: nobody hand-writes them.
    #[serde(default)]
    pub rdma: RdmaSpec,
    /// Who may connect to the engine pods.
    #[serde(default)]
    pub network_policy: EngineNetworkPolicy,
    /// Secondary networks attached to engine pods by Multus (the pod annotation
    /// `k8s.v1.cni.cncf.io/networks`), e.g. one per RDMA rail: `rail0`,
    /// `infera/rail1@net2` (`[namespace/]name[@interface]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?(@[A-Za-z0-9_.-]{1,15})?$"
        ))
    )]
    pub secondary_networks: Vec<String>,
}

/// A NetworkPolicy on the engine pods: only this deployment's own pods (its gateways;
/// its engines, for KV transfer and collectives) connect to them, so nobody bypasses
/// the gateway's API keys on the engine port or reads prompts' token ids on the
/// KV-event port. The kubelet's probes and `preStop` come from the node, which network
/// plugins admit; pods on the host network are outside any NetworkPolicy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineNetworkPolicy {
    /// Render the NetworkPolicy (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// More peers admitted to every engine port, e.g. the namespace of a Prometheus that
    /// scrapes the engines' `/metrics`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_from: Vec<NetworkPolicyPeer>,
}

impl Default for EngineNetworkPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            allow_from: Vec::new(),
        }
    }
}

fn yes() -> bool {
    true
}

/// RDMA settings. The operator requests the device-plugin resources and adds IPC_LOCK;
/// an init container (`node-env`) finds on the node what the engine needs and the
/// engine container sources it before starting: MC_GID_INDEX, NCCL_IB_GID_INDEX and
/// MORI_IB_GID_INDEX (gidIndex, else the first active port's RoCEv2 entry with an IPv4
/// address, else 1), Mooncake's same-NIC peer affinity, MOONCAKE_DISABLE_HIP_DMABUF=1
/// when a GPU peer-memory module is loaded, and for vLLM and ATOM the rail's address
/// as VLLM_HOST_IP/ATOM_HOST_IP when the pod holds it. Every variable `engine.env`
/// sets wins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.enabled || !has(self.gidIndex)").message("spec.network.rdma.gidIndex is set but RDMA is off: set spec.network.rdma.enabled: true or remove gidIndex"))]
#[x_kube(validation = Rule::new("self.enabled || size(self.interfaces) == 0").message("spec.network.rdma.interfaces are set but RDMA is off: set spec.network.rdma.enabled: true or remove interfaces"))]
#[x_kube(validation = Rule::new("self.enabled || !self.hostNetwork").message("spec.network.rdma.hostNetwork is an RDMA opt-in: set spec.network.rdma.enabled: true or remove hostNetwork"))]
#[x_kube(validation = Rule::new("self.enabled || !self.hostDevices").message("spec.network.rdma.hostDevices is an RDMA opt-in: set spec.network.rdma.enabled: true or remove hostDevices"))]
#[x_kube(validation = Rule::new("!self.hostDevices || !has(self.rails) || size(self.rails) == 0").message("spec.network.rdma.hostDevices mounts the host's devices instead of requesting device-plugin resources: remove rails"))]
pub struct RdmaSpec {
    /// Use RDMA.
    #[serde(default)]
    pub enabled: bool,
    /// Extended resource the cluster's RDMA device plugin advertises for AINIC ports
    /// (default rdma/hca).
    #[serde(default = "rdma_resource")]
    #[schemars(regex(pattern = RESOURCE_NAME))]
    pub resource_name: String,
    /// Devices of that resource per worker pod (default 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 16))]
    pub count: u32,
    /// One resource per rail, where the device plugin advertises each rail's NICs under
    /// its own name (e.g. `amd.com/rdma-rail0` ... `rail7`): requested instead of
    /// resourceName and count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub rails: Vec<RdmaRail>,
    /// RoCEv2 GID index (the one carrying the node's routable IPv4 address); unset:
    /// found on the node by the engine pod's init container, else 1 (the AINIC's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 255))]
    pub gid_index: Option<u32>,
    /// RDMA interfaces to use (e.g. `ionic_0`); empty: all the plugin hands out. Given
    /// to RCCL (NCCL_IB_HCA), SGLang (`--disaggregation-ib-device`) and ATOM's mooncake
    /// connector (`ib_device`).
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// Run engine pods in the host network namespace (only where the RDMA setup needs it).
    #[serde(default)]
    pub host_network: bool,
    /// For nodes without an RDMA device plugin: mount the host's /dev/infiniband into
    /// the engine container and run it privileged (the device cgroup admits a device a
    /// plugin handed out, or any device for a privileged container); no RDMA resource is
    /// requested. Off by default: devices come from the device plugin.
    #[serde(default)]
    pub host_devices: bool,
}

/// An extended resource's name (`[domain/]name`).
const RESOURCE_NAME: &str =
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// One rail's RDMA resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RdmaRail {
    /// Extended resource name.
    #[schemars(regex(pattern = RESOURCE_NAME))]
    pub resource_name: String,
    /// Devices per worker pod (default 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 16))]
    pub count: u32,
}

impl Default for RdmaSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            resource_name: rdma_resource(),
            count: 1,
            rails: Vec::new(),
            gid_index: None,
            interfaces: Vec::new(),
            host_network: false,
            host_devices: false,
        }
    }
}

fn rdma_resource() -> String {
    "rdma/hca".into()
}

/// Gateway routing policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingPolicy {
    /// To the worker holding most of the prompt's KV cache, weighed against load.
    #[default]
    KvAware,
    /// Rotate.
    RoundRobin,
    /// Uniformly at random.
    Random,
}

/// Kubernetes Service type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ServiceType {
    /// Cluster-internal.
    #[default]
    ClusterIP,
    /// A port on every node.
    NodePort,
    /// An external load balancer.
    LoadBalancer,
}

/// The gateways.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.metricsRequireAuth || has(self.apiKeysSecretRef)").message("spec.gateway.metricsRequireAuth needs spec.gateway.apiKeysSecretRef (the keys /metrics would require)"))]
pub struct GatewaySpec {
    /// Gateway pods (default 1).
    #[serde(default = "one_i32")]
    #[schemars(range(min = 0, max = 64))]
    pub replicas: i32,
    /// Routing policy (default kv-aware).
    #[serde(default)]
    pub policy: RoutingPolicy,
    /// kv-aware: weight of uncached blocks against load (mixed workers). Default 4: in
    /// the shared-prefix benchmark (S2) it reaches 99% of the oracle hit ratio where the
    /// gateway flag's contract default of 1 reaches 79-87%.
    #[serde(default = "overlap_weight")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub kv_overlap_weight: f64,
    /// kv-aware: weight on prefill legs.
    #[serde(default = "prefill_weight")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub kv_prefill_overlap_weight: f64,
    /// kv-aware: weight on decode legs.
    #[serde(default = "decode_weight")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub kv_decode_overlap_weight: f64,
    /// Tokenizer folder the gateway reads (default: the model's, from its source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// The Service in front of the gateways.
    #[serde(default)]
    pub service: GatewayService,
    /// Gateway image (default the Infera image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// CPU and memory of a gateway pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// API keys clients must present (`Authorization: Bearer <key>` or `x-api-key`): a
    /// Secret key holding one key per line (`#` comments). Unset: no authentication.
    /// Keys rotated in the Secret are served without restarting the gateways, within
    /// the kubelet's Secret sync plus 30 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys_secret_ref: Option<SecretKeyRef>,
    /// Require an API key on `/metrics` too (it lists worker addresses); needs
    /// `apiKeysSecretRef`. A scraper then sends a key.
    #[serde(default)]
    pub metrics_require_auth: bool,
    /// Serve HTTPS instead of HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayTls>,
    /// Times a streamed generation may move to another worker when its worker fails or
    /// drains mid-stream (`--migration-limit`), continuing from what the client already
    /// received; 0 never moves one (the gateway's own default, as the earlier server's).
    /// Deployments stored before release 0.2.0 keep the 0 they were stored with.
    #[serde(default = "default_migration_limit")]
    #[schemars(range(max = 16))]
    pub migration_limit: u32,
    /// Serve the earlier server's scaling API on the gateways (`GET` and
    /// `POST /v1/admin/scale`, behind the API keys): it reads this deployment's worker
    /// counts and sets `replicas`. The gateways then run with `--enable-scaling-api` and
    /// their ServiceAccount gets one Role more, allowing `get` and `patch` of this
    /// InferaDeployment alone (and `get` of its PDTopology). Off (the default): the API
    /// answers 403 and the gateways hold no such permission.
    #[serde(default)]
    pub scaling_api: bool,
    /// Placement of gateway pods (node selector, tolerations, affinity, priority,
    /// spread), apart from the engines'. With two or more replicas a
    /// PodDisruptionBudget keeps all but one up through node drains.
    #[serde(default)]
    pub scheduling: SchedulingSpec,
    /// A pod template merged onto gateway pods by strategic-merge rules, as
    /// spec.engine.podTemplate is onto engine pods (the container is `gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_template_schema")]
    pub pod_template: Option<serde_json::Value>,
    /// Serve the deployment through a Gateway API inference gateway as well: an
    /// InferencePool (`inference.networking.k8s.io/v1`) over the serving workers, the
    /// endpoint picker it names (this gateway's routing, as GAIE's picker), and with
    /// `gatewayRef` an HTTPRoute to the user's Gateway. Needs the InferencePool CRD
    /// (and for the route, Gateway API's). Unset: none of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_pool: Option<super::inference_pool::InferencePoolSpec>,
    /// Flow control: requests wait in the gateways, by class (`x-infera-priority`) and
    /// TTFT deadline, until a worker can start them soon, instead of queuing inside the
    /// engines; those that cannot meet their deadline get 429 with `Retry-After`. On by
    /// default.
    #[serde(default)]
    pub flow_control: super::flow_control::FlowControlSpec,
}

/// The gateway's certificate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayTls {
    /// A `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`), as cert-manager's
    /// `Certificate` writes it; a renewed certificate is served without a restart.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

impl Default for GatewaySpec {
    fn default() -> Self {
        Self {
            replicas: 1,
            policy: RoutingPolicy::default(),
            kv_overlap_weight: overlap_weight(),
            kv_prefill_overlap_weight: prefill_weight(),
            kv_decode_overlap_weight: decode_weight(),
            tokenizer: None,
            service: GatewayService::default(),
            image: None,
            resources: None,
            api_keys_secret_ref: None,
            metrics_require_auth: false,
            tls: None,
            migration_limit: default_migration_limit(),
            scaling_api: false,
            scheduling: SchedulingSpec::default(),
            pod_template: None,
            inference_pool: None,
            flow_control: Default::default(),
        }
    }
}

fn overlap_weight() -> f64 {
    4.0
}
fn prefill_weight() -> f64 {
    20.0
}
fn decode_weight() -> f64 {
    2.0
}

/// The gateway Service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayService {
    /// Service type.
    #[serde(default, rename = "type")]
    pub type_: ServiceType,
    /// Port clients connect to (default 8000).
    #[serde(default = "gateway_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

impl Default for GatewayService {
    fn default() -> Self {
        Self {
            type_: ServiceType::default(),
            port: gateway_port(),
        }
    }
}

fn gateway_port() -> i32 {
    8000
}

/// Discovery backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryBackend {
    /// Worker records in Pod annotations (no etcd needed).
    #[default]
    Kubernetes,
    /// Worker records in etcd under leases.
    Etcd,
}

/// Where gateways find workers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.backend != 'kubernetes' || !has(self.etcd)").message("spec.discovery.etcd applies to backend: etcd only; remove it or set backend: etcd"))]
pub struct DiscoverySpec {
    /// kubernetes (Pod annotations; the default) or etcd.
    #[serde(default)]
    pub backend: DiscoveryBackend,
    /// etcd settings (backend: etcd); unset: the cluster etcd the chart installed (the
    /// operator's --default-etcd-endpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSpec>,
}

/// An etcd cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.tlsSecretName) == self.endpoints.all(e, e.startsWith('https://'))").message("spec.discovery.etcd: https:// endpoints go with tlsSecretName (the CA and client certificate), http:// ones without it"))]
#[x_kube(validation = Rule::new("has(self.user) == has(self.passwordSecretRef)").message("spec.discovery.etcd: user and passwordSecretRef go together"))]
pub struct EtcdSpec {
    /// Client URLs, `http(s)://host:port`.
    #[schemars(length(min = 1), inner(regex(pattern = r"^https?://[^/\s]+$")))]
    pub endpoints: Vec<String>,
    /// Key prefix of worker records.
    #[serde(default = "etcd_prefix")]
    #[schemars(regex(pattern = r"^/"))]
    pub prefix: String,
    /// TLS to `https://` endpoints: a Secret holding `ca.crt` (the CA of etcd's
    /// certificate), `tls.crt` and `tls.key` (a client certificate for etcd's
    /// `--client-cert-auth`), as cert-manager's `Certificate` writes it. Mounted into the
    /// gateways and the sidecars; a renewal is used from their next reconnect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub tls_secret_name: Option<String>,
    /// etcd user, when etcd has auth enabled (with `passwordSecretRef`); it needs read
    /// on the prefix for the gateways and write for the sidecars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Secret key holding that user's password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
}

fn etcd_prefix() -> String {
    infera_proto::discovery::DEFAULT_ETCD_PREFIX.into()
}

/// Message bus.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MessagingBackend {
    /// None: the gateway subscribes to engines' ZMQ KV events directly.
    #[default]
    None,
    /// NATS JetStream: sidecars relay KV events.
    Nats,
}

/// How gateways reach workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RequestTransport {
    /// HTTP to each worker's URL.
    #[default]
    Http,
    /// The NATS request plane: each worker's sidecar serves its subject.
    Nats,
}

/// Message bus for KV events, and optionally for requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.backend == 'nats' || !has(self.natsUrl)").message("spec.messaging.natsUrl applies to backend: nats only; remove it or set backend: nats"))]
#[x_kube(validation = Rule::new("self.backend == 'nats' || !has(self.requestTransport) || self.requestTransport == 'http'").message("spec.messaging.requestTransport nats needs backend: nats"))]
pub struct MessagingSpec {
    /// none (the default) or nats.
    #[serde(default)]
    pub backend: MessagingBackend,
    /// NATS server URL, `nats://host:port`; unset: the cluster NATS the chart installed
    /// (the operator's --default-nats-url).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(nats|tls)://[^/\s]+$"))]
    pub nats_url: Option<String>,
    /// http (the default) or nats: requests travel to workers over the NATS request
    /// plane (the earlier system's default), which needs backend nats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_transport: Option<RequestTransport>,
    /// NATS requests: seconds a gateway waits for a worker's next reply before 504
    /// (default 900; 0 waits forever).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub request_idle_timeout_seconds: Option<f64>,
    /// NATS requests: seconds a whole request may take (default 0: no cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub request_max_duration_seconds: Option<f64>,
    /// NATS requests: admission backlog per worker through the INFERA_REQUESTS work
    /// queue; a worker holding this many unanswered requests gets no more, and 429
    /// when all are full (default 0: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_max_pending: Option<u32>,
}

impl MessagingSpec {
    /// The request-plane flags gateways and sidecars both take (none over HTTP).
    pub fn request_plane_flags(&self) -> Vec<String> {
        if self.request_transport != Some(RequestTransport::Nats) {
            return Vec::new();
        }
        let mut flags = vec!["--request-transport".into(), "nats".into()];
        let optional = [
            ("--nats-req-idle-timeout", self.request_idle_timeout_seconds),
            ("--nats-req-max-duration", self.request_max_duration_seconds),
            (
                "--nats-req-max-pending",
                self.request_max_pending.map(f64::from),
            ),
        ];
        for (flag, value) in optional {
            if let Some(v) = value {
                flags.extend([flag.to_owned(), v.to_string()]);
            }
        }
        flags
    }
}

/// The KV-cache daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.enabled || (!has(self.nvme) && !has(self.remoteUrl) && !has(self.remoteUrlSecretRef))").message("spec.kvCache tiers (nvme, remoteUrl, remoteUrlSecretRef) are set but kvd is off: set spec.kvCache.enabled: true or remove them"))]
#[x_kube(validation = Rule::new("!has(self.remoteUrl) || !has(self.remoteUrlSecretRef)").message("spec.kvCache: give the distributed tier's URL once, as remoteUrl or remoteUrlSecretRef"))]
pub struct KvCacheSpec {
    /// Run kvd beside each engine.
    #[serde(default)]
    pub enabled: bool,
    /// RAM tier size (default 64Gi).
    #[serde(default = "ram_size")]
    pub ram: Quantity,
    /// NVMe tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme: Option<NvmeTier>,
    /// Distributed tier URL: `redis://[user[:password]@]host[:port][/db]` or
    /// `valkey://...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub remote_url: Option<String>,
    /// The distributed tier's URL from a Secret key, to keep a password out of the spec
    /// (instead of remoteUrl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_url_secret_ref: Option<SecretKeyRef>,
    /// Retention of KV without a client hint (default long).
    #[serde(default)]
    pub default_retention: RetentionClass,
}

impl Default for KvCacheSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            ram: ram_size(),
            nvme: None,
            remote_url: None,
            remote_url_secret_ref: None,
            default_retention: RetentionClass::default(),
        }
    }
}

fn ram_size() -> Quantity {
    Quantity("64Gi".into())
}

/// A node-local NVMe tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.path.matches('(^|/)[.][.]?(/|$)')").message("spec.kvCache.nvme.path: no . or .. segments (the operator checks the path against the directories the platform allows)"))]
pub struct NvmeTier {
    /// Directory on the node (a hostPath): under one of the directories the operator
    /// allows (the chart's `operator.kvCacheNvmeHostPaths`).
    #[schemars(regex(pattern = r"^(/[^/\s]+)+/?$"))]
    pub path: String,
    /// Space to use.
    pub size: Quantity,
}

/// Placement of pods.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    /// Node labels engine pods require.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of engine pods (GPU nodes are often tainted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Affinity of engine pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Priority class of engine pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Topology spread of engine pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
}

/// Observed state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferaDeploymentStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Progressing and Degraded, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Workers (mixed) or complete topology units (disaggregated) that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Of those, the ones ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the engine pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Desired and ready workers per role (mixed, prefill, decode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleStatus>,
    /// Where clients reach the gateway, `http://service.namespace:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_endpoint: Option<String>,
    /// The autoscaler's last look (with `spec.autoscaling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingStatus>,
    /// Which release of Infera's parts the engine pods run, and a newer one this
    /// operator renders (`spec.platform.version` moves them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformStatus>,
    /// The revision of the engine spec: the pods' `infera.amd.com/engine-revision`
    /// label, the workers' records and the gateways' `x-infera-revision` header name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// An engine rollout in progress (absent when none runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// The InferencePool, its picker and route (with `spec.gateway.inferencePool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_pool: Option<super::inference_pool::InferencePoolStatus>,
}

/// One role's workers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    /// mixed, prefill or decode.
    pub role: String,
    /// Desired workers.
    pub replicas: i32,
    /// Ready workers.
    pub ready_replicas: i32,
}
