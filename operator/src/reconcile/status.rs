//! Status (pure): what the children report becomes `observedGeneration`, the `Ready`,
//! `Progressing` and `Degraded` conditions, per-role counts and the `/scale` replicas.

use super::gateway_tokenizer::GatewayTokenizer;
use super::pod_problems::{PodProblem, of_component, summarize};
use crate::api::{InferaDeploymentStatus, RoleRolloutStatus, RoleStatus, RolloutStatus};
use crate::api::{PlatformStatus, PlatformVersion};
use crate::names::Role;
use crate::plan::rollout::RoleProgress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// One role as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleObservation {
    /// The role.
    pub role: Role,
    /// Workers the spec wants.
    pub desired: i32,
    /// Workers that exist (the workload's `status.replicas`).
    pub current: i32,
    /// Workers ready.
    pub ready: i32,
    /// Workers of this role per topology unit (mixed: 1).
    pub per_unit: u32,
    /// The release of Infera's parts its pods run.
    pub platform: PlatformVersion,
    /// Where its rollout stands.
    pub progress: RoleProgress,
}

/// The model download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelState {
    /// No download (PVC or host path).
    NotNeeded,
    /// The Job runs.
    Downloading,
    /// The Job gave up.
    Failed(String),
    /// The Job succeeded.
    Ready,
}

/// Everything status is computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Roles, when the build succeeded.
    pub roles: Option<Vec<RoleObservation>>,
    /// Gateway replicas wanted and ready.
    pub gateway: (i32, i32),
    /// The model download.
    pub model: ModelState,
    /// Why the deployment cannot be (fully) built: reason and message.
    pub problem: Option<(String, String)>,
    /// `status.selector`.
    pub selector: String,
    /// `status.gatewayEndpoint`.
    pub endpoint: Option<String>,
    /// Why pods of the deployment are not running ([`super::pod_problems`]).
    pub pod_problems: Vec<PodProblem>,
    /// The gateways' tokenizer, when they fetch it from the workers.
    pub tokenizer: Option<GatewayTokenizer>,
    /// `spec.autoscaling` is set: the `Autoscaling` condition follows what the
    /// autoscaler wrote in `status.autoscaling`.
    pub autoscaled: bool,
    /// The revision of the engine spec, when the build succeeded.
    pub revision: Option<String>,
    /// The InferencePool's picker and route (with `spec.gateway.inferencePool`).
    pub inference_pool: Option<crate::api::InferencePoolStatus>,
    /// Optional kinds the build needs whose CRDs the cluster lacks.
    pub missing_crds: Vec<crate::render::Kind>,
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
    previous: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

fn units(roles: &[RoleObservation], count: impl Fn(&RoleObservation) -> i32) -> i32 {
    roles
        .iter()
        .map(|r| count(r) / i32::try_from(r.per_unit.max(1)).unwrap_or(1))
        .min()
        .unwrap_or(0)
}

/// `status.rollout` while a role has old workers.
fn build_rollout(revision: Option<&str>, roles: &[RoleObservation]) -> Option<RolloutStatus> {
    if !roles.iter().any(|r| r.progress.rolling) {
        return None;
    }
    Some(RolloutStatus {
        revision: revision.unwrap_or_default().to_owned(),
        roles: roles
            .iter()
            .map(|r| RoleRolloutStatus {
                role: r.role.as_str().into(),
                replicas: r.desired,
                updated: r.progress.updated,
                old: r.progress.old,
                ready: r.progress.ready,
                blocked: r.progress.blocked.clone(),
            })
            .collect(),
    })
}

/// One line of a rollout: each role's old and new workers.
pub fn rollout_summary(rollout: &RolloutStatus) -> String {
    let roles = rollout
        .roles
        .iter()
        .map(|r| {
            format!(
                "{} {} old, {} new of {} ({} ready)",
                r.role, r.old, r.updated, r.replicas, r.ready
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!("rolling to revision {}: {roles}", rollout.revision)
}

/// The scheduler's reason a new worker cannot start, with its role.
pub fn rollout_blocked(rollout: &RolloutStatus) -> Option<String> {
    rollout.roles.iter().find_map(|r| {
        r.blocked
            .as_ref()
            .map(|why| format!("a new {} worker cannot start: {why}", r.role))
    })
}

fn summary(roles: &[RoleObservation]) -> String {
    roles
        .iter()
        .map(|r| format!("{} {}/{} ready", r.role.as_str(), r.ready, r.desired))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The new status. Conditions keep their `lastTransitionTime` while their status holds;
/// when the build failed, the counts of `previous` stay (the fleet keeps running).
pub fn compute_status(
    previous: Option<&InferaDeploymentStatus>,
    obs: &Observation,
    now: &Time,
) -> InferaDeploymentStatus {
    let prev = previous.cloned().unwrap_or_default();
    let generation = obs.generation;
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(
            type_,
            ok,
            reason,
            message,
            generation,
            now,
            &prev.conditions,
        )
    };
    let (replicas, ready_replicas, roles_status, roles_ready, progress) = match &obs.roles {
        Some(roles) => {
            // A rolling role runs workers above its count (the surge): ready is enough.
            let all_ready = roles
                .iter()
                .all(|r| r.ready >= r.desired && (r.current == r.desired || r.progress.rolling));
            (
                units(roles, |r| r.current.min(r.desired)),
                units(roles, |r| r.ready.min(r.desired)),
                roles
                    .iter()
                    .map(|r| RoleStatus {
                        role: r.role.as_str().into(),
                        replicas: r.desired,
                        ready_replicas: r.ready,
                    })
                    .collect(),
                all_ready,
                summary(roles),
            )
        }
        None => (
            prev.replicas,
            prev.ready_replicas,
            prev.roles.clone(),
            false,
            String::new(),
        ),
    };
    let (gw_desired, gw_ready) = obs.gateway;
    let gateway_ok = gw_desired == 0 || gw_ready >= 1;
    let workers_wanted = obs
        .roles
        .as_ref()
        .is_some_and(|r| r.iter().any(|r| r.desired > 0));
    // Not ready for a reason a pod states: that reason, and the pod's message.
    let stuck = |component: &str, progress: &str| {
        let problems = of_component(&obs.pod_problems, component);
        let first = problems.first()?;
        let why = summarize(&problems)?;
        let message = if progress.is_empty() {
            why
        } else {
            format!("{progress}; {why}")
        };
        Some(cond("Ready", false, first.kind.reason(), message))
    };
    let ready = match (&obs.roles, &obs.model) {
        (None, _) => cond(
            "Ready",
            prev_ready(&prev),
            "BuildFailed",
            "the last good build keeps serving; see Degraded".into(),
        ),
        (_, ModelState::Downloading) => {
            stuck("model-download", "the model download Job cannot run").unwrap_or_else(|| {
                cond(
                    "Ready",
                    false,
                    "ModelDownloading",
                    "workers start when the model download Job succeeds".into(),
                )
            })
        }
        (_, ModelState::Failed(m)) => cond("Ready", false, "ModelDownloadFailed", m.clone()),
        _ if !workers_wanted => cond("Ready", false, "ScaledToZero", "spec.replicas is 0".into()),
        _ if !roles_ready => stuck("engine", &progress)
            .unwrap_or_else(|| cond("Ready", false, "WorkersNotReady", progress.clone())),
        _ if !gateway_ok => {
            let counts = format!("0 of {gw_desired} gateway pods ready");
            stuck("gateway", &counts)
                .unwrap_or_else(|| cond("Ready", false, "GatewayNotReady", counts))
        }
        _ => cond(
            "Ready",
            true,
            "AllReady",
            format!("{progress}; {gw_ready}/{gw_desired} gateways ready"),
        ),
    };
    let rollout = match &obs.roles {
        Some(roles) => build_rollout(obs.revision.as_deref(), roles),
        None => prev.rollout.clone(),
    };
    let progressing = match (&obs.problem, &obs.model) {
        (Some((reason, message)), _) if obs.roles.is_none() => {
            cond("Progressing", false, reason, message.clone())
        }
        (_, ModelState::Downloading) => cond(
            "Progressing",
            true,
            "ModelDownloading",
            "the model download Job runs".into(),
        ),
        _ if rollout.is_some() => cond(
            "Progressing",
            true,
            "RollingOut",
            rollout.as_ref().map(rollout_summary).unwrap_or_default(),
        ),
        _ if !roles_ready || gw_ready < gw_desired => cond(
            "Progressing",
            true,
            "RollingOut",
            format!("{progress}; {gw_ready}/{gw_desired} gateways ready"),
        ),
        _ => cond(
            "Progressing",
            false,
            "Complete",
            "every worker and gateway is ready".into(),
        ),
    };
    let degraded = match (&obs.problem, &obs.model) {
        (Some((reason, message)), _) => cond("Degraded", true, reason, message.clone()),
        (None, ModelState::Failed(m)) => cond("Degraded", true, "ModelDownloadFailed", m.clone()),
        _ => cond("Degraded", false, "AsExpected", String::new()),
    };
    let mut conditions = vec![ready, progressing, degraded];
    // Present from a deployment's first rollout on.
    let blocked = rollout.as_ref().and_then(rollout_blocked);
    let had_blocked = prev.conditions.iter().any(|c| c.type_ == "RolloutBlocked");
    match (&rollout, blocked) {
        (_, Some(why)) => conditions.push(cond("RolloutBlocked", true, "Unschedulable", why)),
        (Some(r), None) => conditions.push(cond(
            "RolloutBlocked",
            false,
            "Progressing",
            rollout_summary(r),
        )),
        (None, None) if had_blocked => conditions.push(cond(
            "RolloutBlocked",
            false,
            "RolloutComplete",
            "every worker runs the current revision".into(),
        )),
        (None, None) => {}
    }
    if let Some(t) = &obs.tokenizer {
        let (ok, reason, message) = t.condition();
        conditions.push(cond("TokenizerLoaded", ok, reason, message));
    }
    if obs.autoscaled {
        let (ok, reason, message) = match &prev.autoscaling {
            Some(a) => (a.state == "Active", a.state.as_str(), a.message.clone()),
            None => (
                false,
                "Pending",
                "the autoscaler has not looked at the signals yet".into(),
            ),
        };
        conditions.push(cond("Autoscaling", ok, reason, message));
    }
    let platform = match obs
        .roles
        .as_ref()
        .and_then(|r| r.iter().map(|r| r.platform).min())
    {
        Some(engines) => Some(build_platform_status(engines)),
        None => prev.platform.clone(),
    };
    if let Some(p) = &platform {
        let (ok, reason, message) = match &p.available {
            None => (
                true,
                "Current",
                format!("the engines run Infera {}'s sidecar and kvd", p.engines),
            ),
            Some(newer) => (
                false,
                "NewerPlatformAvailable",
                format!(
                    "the engines run Infera {}'s sidecar and kvd; {newer} is available: set spec.platform.version: \"{newer}\" to move them (new pods start beside the old ones, see spec.rollout)",
                    p.engines
                ),
            ),
        };
        conditions.push(cond("PlatformCurrent", ok, reason, message));
    }
    // A failed build observes nothing of the pool: what was seen last stays.
    let inference_pool = match (&obs.inference_pool, &obs.roles) {
        (Some(pool), _) => Some(pool.clone()),
        (None, None) => prev.inference_pool.clone(),
        (None, Some(_)) => None,
    };
    if let Some(pool) = &obs.inference_pool {
        let (ok, reason, message) = super::pool_status::pool_condition(pool, &obs.missing_crds);
        conditions.push(cond("InferencePoolReady", ok, reason, message));
    } else if inference_pool.is_some()
        && let Some(c) = prev
            .conditions
            .iter()
            .find(|c| c.type_ == "InferencePoolReady")
    {
        conditions.push(c.clone());
    }
    InferaDeploymentStatus {
        inference_pool,
        platform,
        observed_generation: generation,
        conditions,
        replicas,
        ready_replicas,
        selector: Some(obs.selector.clone()),
        roles: roles_status,
        gateway_endpoint: obs.endpoint.clone().or(prev.gateway_endpoint),
        // The autoscaler's own field (its field manager): kept for comparison, never
        // written by the reconcile.
        autoscaling: prev.autoscaling,
        revision: obs.revision.clone().or(prev.revision),
        rollout,
    }
}

/// `status.platform` for engines on `engines`: a newer release when this operator
/// renders one.
pub fn build_platform_status(engines: PlatformVersion) -> PlatformStatus {
    PlatformStatus {
        engines: engines.as_str().to_owned(),
        available: (engines < PlatformVersion::CURRENT)
            .then(|| PlatformVersion::CURRENT.as_str().to_owned()),
    }
}

fn prev_ready(prev: &InferaDeploymentStatus) -> bool {
    prev.conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests;
