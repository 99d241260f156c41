//! `PDTopology`: a reusable prefill/decode shape. Deployments reference it by name and
//! scale in whole units of it.

use super::common::Parallelism;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A prefill/decode shape: how many prefill and decode workers make one unit, how each
/// is parallelized, and the KV transport between them.
// Several `printcolumn(...)` carry the same `type_`: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "infera.amd.com",
    version = "v1alpha1",
    kind = "PDTopology",
    plural = "pdtopologies",
    shortname = "pdt",
    namespaced,
    status = "PDTopologyStatus",
    printcolumn(name = "Layout", type_ = "string", json_path = ".spec.layout"),
    printcolumn(
        name = "Transport",
        type_ = "string",
        json_path = ".spec.transport.backend"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.layout != 'custom' || (has(self.prefill.replicas) && has(self.decode.replicas))").message("spec.layout custom needs spec.prefill.replicas and spec.decode.replicas (workers of each role per unit)"))]
#[x_kube(validation = Rule::new("self.layout == 'custom' || (!has(self.prefill.replicas) && !has(self.decode.replicas))").message("spec.prefill.replicas and spec.decode.replicas apply to layout: custom only; the named layouts fix them (2P1D is 2 prefill, 1 decode)"))]
pub struct PDTopologySpec {
    /// Workers per unit: 1P1D, 2P1D, 1P2D, or custom (set prefill.replicas and
    /// decode.replicas).
    pub layout: Layout,
    /// The prefill role.
    #[serde(default)]
    pub prefill: RoleSpec,
    /// The decode role.
    #[serde(default)]
    pub decode: RoleSpec,
    /// How the KV cache travels from prefill to decode.
    #[serde(default)]
    pub transport: TransportSpec,
}

/// Workers per unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Layout {
    /// One prefill, one decode.
    #[serde(rename = "1P1D")]
    OneOne,
    /// Two prefill, one decode (long prompts).
    #[serde(rename = "2P1D")]
    TwoOne,
    /// One prefill, two decode (long outputs).
    #[serde(rename = "1P2D")]
    OneTwo,
    /// prefill.replicas and decode.replicas.
    #[serde(rename = "custom")]
    Custom,
}

/// One role of the topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleSpec {
    /// Workers of this role per unit (layout: custom only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub replicas: Option<u32>,
    /// Parallelism of one worker of this role.
    #[serde(default)]
    pub parallelism: Parallelism,
    /// Extra engine arguments for this role, after the deployment's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// CPU and memory of this role's engine container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// KV transport backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TransportBackend {
    /// Mooncake (vLLM MooncakeConnector, SGLang, ATOM).
    #[default]
    Mooncake,
    /// MoRI-IO (vLLM MoRIIOConnector, SGLang).
    Mori,
    /// NIXL: not supported (no connector of the router speaks it).
    Nixl,
}

/// The KV transport.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.backend != 'nixl'").message("spec.transport.backend nixl is not supported: Infera's router speaks the mooncake and mori connectors only; use mooncake or mori"))]
#[x_kube(validation = Rule::new("self.backend == 'mori' || !self.readMode").message("spec.transport.readMode (decode pulls the KV) applies to backend: mori only"))]
pub struct TransportSpec {
    /// mooncake or mori (nixl is rejected).
    #[serde(default)]
    pub backend: TransportBackend,
    /// MoRI read mode: the decode pulls the KV after the prefill answers
    /// (VLLM_MORIIO_CONNECTOR_READ_MODE=1); default write mode, the prefill pushes.
    #[serde(default)]
    pub read_mode: bool,
    /// Bootstrap port of SGLang and vLLM Mooncake prefill workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 65535))]
    pub bootstrap_port: Option<u16>,
    /// Connector handshake port (MoRI, ATOM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 65535))]
    pub handshake_port: Option<u16>,
    /// Connector notify port (MoRI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 65535))]
    pub notify_port: Option<u16>,
}

/// Observed state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PDTopologyStatus {
    /// InferaDeployments that reference this topology.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<String>,
    /// Valid: whether the layout and transport work for every deployment using it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
