//! How an engine change rolls: per role, how many workers may run above the role's
//! count (`maxSurge`) and how many of its workers may be missing (`maxUnavailable`)
//! while old workers are replaced by new ones; and what the status says of a rollout
//! in progress. A change to any role's engine is a new revision of the whole topology:
//! every role rolls, and gateways pair a prefill and a decode worker only of one
//! revision while two run side by side.

use super::common::one;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Rollout limits of every role, with optional limits for prefill and decode apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("self.maxSurge > 0 || self.maxUnavailable > 0").message("spec.rollout: maxSurge and maxUnavailable are both 0, so no worker could ever be replaced; allow a surge (new workers beside the old ones) or an unavailable worker"))]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Workers a role may run above its count while it rolls: a new worker starts beside
    /// the old ones, and an old one is drained and removed only once a new one is ready
    /// and registered. Each needs the GPUs of one worker free; without them the rollout
    /// waits (condition RolloutBlocked, with the scheduler's reason) and deletes
    /// nothing. Default 1.
    #[serde(default = "one")]
    #[schemars(range(max = 64))]
    pub max_surge: u32,
    /// Workers of a role that may be missing while it rolls (an old one removed before
    /// its replacement is ready): the way to roll without spare GPUs. Default 0: the
    /// role never serves with fewer workers than it has.
    #[serde(default)]
    #[schemars(range(max = 64))]
    pub max_unavailable: u32,
    /// The prefill role's own limits (unset fields: the ones above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<RoleRolloutSpec>,
    /// The decode role's own limits (unset fields: the ones above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<RoleRolloutSpec>,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_surge: 1,
            max_unavailable: 0,
            prefill: None,
            decode: None,
        }
    }
}

/// One role's rollout limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleRolloutSpec {
    /// Workers the role may run above its count while it rolls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 64))]
    pub max_surge: Option<u32>,
    /// Workers of the role that may be missing while it rolls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 64))]
    pub max_unavailable: Option<u32>,
}

/// A rollout in progress: the revision the workers move to, and each role's workers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The revision of the engine spec the workers move to.
    pub revision: String,
    /// Each role's workers, old and new.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleRolloutStatus>,
}

/// One role's workers during a rollout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleRolloutStatus {
    /// mixed, prefill or decode.
    pub role: String,
    /// Workers the role has when the rollout is done.
    pub replicas: i32,
    /// Workers on the new revision (ready or starting).
    pub updated: i32,
    /// Workers on an old revision, still serving until replaced.
    pub old: i32,
    /// Workers ready, old and new.
    pub ready: i32,
    /// Why no new worker can start, when one cannot (the scheduler's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
}
