//! Types both resources use.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An inference engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
    /// AMD ATOM.
    Atom,
    /// `infera-sim`, the calibrated engine simulator (no GPUs needed).
    Sim,
}

impl EngineKind {
    /// The name in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Atom => "atom",
            Self::Sim => "sim",
        }
    }
}

/// Which engine the simulator imitates (its API details, metrics and connectors).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SimFlavor {
    /// vLLM.
    #[default]
    Vllm,
    /// SGLang.
    Sglang,
    /// AMD ATOM.
    Atom,
}

/// How one engine worker is parallelized over GPUs and nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Parallelism {
    /// Tensor-parallel size (GPUs one model replica is split over).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub tensor_parallel_size: u32,
    /// Data-parallel size (replicas of the model inside one worker).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub data_parallel_size: u32,
    /// Expert parallelism for mixture-of-experts models (`--enable-expert-parallel` and
    /// the engines' equivalents).
    #[serde(default)]
    pub expert_parallel: bool,
    /// GPUs (`amd.com/gpu`) per worker; default tensor × data parallel size divided by
    /// `nodesPerWorker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub gpus_per_worker: Option<u32>,
    /// Nodes one worker spans; more than one renders a LeaderWorkerSet (multi-node
    /// tensor or data parallelism).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 32))]
    pub nodes_per_worker: u32,
}

impl Default for Parallelism {
    fn default() -> Self {
        Self {
            tensor_parallel_size: 1,
            data_parallel_size: 1,
            expert_parallel: false,
            gpus_per_worker: None,
            nodes_per_worker: 1,
        }
    }
}

pub(crate) fn one() -> u32 {
    1
}

/// Retention class for cached KV.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RetentionClass {
    /// Not kept.
    None,
    /// Kept only while convenient.
    Ephemeral,
    /// Minutes.
    Short,
    /// Hours (written through to the distributed tier).
    #[default]
    Long,
}

/// A key of a Secret in the resource's namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret.
    #[serde(default = "token_key")]
    #[schemars(length(min = 1))]
    pub key: String,
}

fn token_key() -> String {
    "token".into()
}
