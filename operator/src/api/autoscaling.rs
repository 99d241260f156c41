//! `spec.autoscaling`: the operator sizes a deployment's workers on what its users feel
//! (time to first token, time per output token, queued requests, KV usage), each role of
//! a disaggregated deployment apart, and says what it decided in `status.autoscaling`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Autoscaling on latency targets. The operator scrapes the gateways' `/metrics` (TTFT
/// and inter-token latency) and every engine's (`vllm:num_requests_waiting`,
/// `vllm:kv_cache_usage_perc`, or SGLang's) each `intervalSeconds`, and sets the workers
/// of each role between `minReplicas` and `maxReplicas`: `spec.replicas` in mixed mode,
/// `spec.serving.roleReplicas` in disaggregated mode (a prefill-bound load adds prefill
/// workers, a decode-bound one decode workers; the PDTopology is never changed). When a
/// HorizontalPodAutoscaler (or KEDA's) targets the deployment's `/scale`, the operator
/// stands down and the `Autoscaling` condition says so. Workers leave only through their
/// drain (`preStop`), never while requests queue in their role or a rollout runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("spec.autoscaling.minReplicas must not exceed maxReplicas"))]
pub struct AutoscalingSpec {
    /// Fewest workers per role (default 1; scale-to-zero is not offered: a request would
    /// wait a model load).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1024))]
    pub min_replicas: u32,
    /// Most workers per role.
    #[schemars(range(min = 1, max = 1024))]
    pub max_replicas: u32,
    /// What users should see; a role scales out when one of its signals is more than
    /// 10% over its target, and in when every signal, spread over fewer workers, stays
    /// 10% under.
    pub targets: AutoscalingTargets,
    /// Seconds a need for more workers must last before they are added (the lowest
    /// recommendation over the window wins; default 0: at once).
    #[serde(default)]
    #[schemars(range(max = 3600))]
    pub scale_up_stabilization_seconds: u32,
    /// Seconds a need for fewer workers must last before they leave (the highest
    /// recommendation over the window wins; default 300).
    #[serde(default = "scale_down_window")]
    #[schemars(range(max = 3600))]
    pub scale_down_stabilization_seconds: u32,
    /// Seconds between two looks at the signals (default 15); latency percentiles are
    /// over the requests of the last interval.
    #[serde(default = "interval")]
    #[schemars(range(min = 1, max = 600))]
    pub interval_seconds: u32,
}

fn one() -> u32 {
    1
}

fn scale_down_window() -> u32 {
    300
}

fn interval() -> u32 {
    15
}

/// Targets; give at least one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.ttftP90Seconds) || has(self.itlP90Seconds) || has(self.waitingPerWorker) || has(self.kvUsage)").message("spec.autoscaling.targets: give at least one of ttftP90Seconds, itlP90Seconds, waitingPerWorker, kvUsage"))]
pub struct AutoscalingTargets {
    /// 90th percentile of time to first token at the gateways, seconds. Disaggregated:
    /// counts for decode when only decode has a queue, else for prefill unless the
    /// prefill legs' p90 (from sending a prefill to reading its answer) is under half
    /// of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.001))]
    pub ttft_p90_seconds: Option<f64>,
    /// 90th percentile of the time between streamed tokens at the gateways, seconds
    /// (decode, or mixed workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.001))]
    pub itl_p90_seconds: Option<f64>,
    /// Requests waiting in an engine's queue, per worker of the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.1))]
    pub waiting_per_worker: Option<f64>,
    /// KV-cache usage, 0-1, averaged over the role's workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1.0))]
    pub kv_usage: Option<f64>,
}

/// Workers per role of a disaggregated deployment, written by the autoscaler (with
/// `spec.autoscaling` only; without it the topology's ratio times `spec.replicas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleReplicas {
    /// Prefill workers.
    #[schemars(range(min = 0, max = 1024))]
    pub prefill: u32,
    /// Decode workers.
    #[schemars(range(min = 0, max = 1024))]
    pub decode: u32,
}

/// What the autoscaler saw and did last.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStatus {
    /// Active, StoodDown (a HorizontalPodAutoscaler targets the deployment) or NoSignals
    /// (no engine answered the scrape).
    pub state: String,
    /// What the state means here (the `Autoscaling` condition's message).
    pub message: String,
    /// What the last look decided, and why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_decision: String,
    /// When the last look was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_look_time: Option<Time>,
    /// When the workers last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// The last change, e.g. `decode 1 -> 2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<String>,
    /// The earliest time workers may leave, when a scale-in waits for its window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_scale_in_time: Option<Time>,
    /// The signals of the last look.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ObservedSignals>,
}

/// Signals as seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedSignals {
    /// TTFT p90 over the last interval, seconds (none: no requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p90_seconds: Option<f64>,
    /// Inter-token latency p90 over the last interval, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_p90_seconds: Option<f64>,
    /// Disaggregated: the prefill legs' p90 over the last interval, seconds (from
    /// sending a prefill to reading its answer, at the gateways).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_p90_seconds: Option<f64>,
    /// Per role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<ObservedRole>,
}

/// One role's engines as seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedRole {
    /// mixed, prefill or decode.
    pub role: String,
    /// Workers asked for.
    pub replicas: u32,
    /// Engines that answered the scrape.
    pub scraped: u32,
    /// Requests waiting per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_per_worker: Option<f64>,
    /// Requests running, all workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<f64>,
    /// Mean KV-cache usage, 0-1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_usage: Option<f64>,
}
