//! The autoscaler's decision (pure): targets, signals and the recent recommendations in;
//! each role's desired workers and the reason out.
//!
//! Per role, each signal with a target gives a ratio, observed over target: requests
//! waiting per worker, mean KV usage, and the gateways' TTFT p90 and inter-token p90
//! (mixed workers take both). In a disaggregated deployment TTFT is decode's when only
//! decode has a queue, else prefill's unless the prefill legs' p90 (what the gateways
//! timed from sending a prefill to reading its answer) is under half the target; and
//! inter-token latency is decode's. The highest ratio decides:
//! - more than 10% over: `ceil(workers × ratio)`, at least one more and at most twice
//!   as many (plus one) in one step;
//! - every ratio more than 10% under, and nothing waiting: the fewest workers over
//!   which the queue and KV usage, spread, stay 10% under (one fewer with latency
//!   targets alone: latency does not spread), at most half of them in one step, and
//!   never fewer than the requests in flight need (running over the seats a worker was
//!   seen to fill before its queue grew);
//! - else: as is.
//!
//! Recommendations are stabilised as a HorizontalPodAutoscaler does: workers are added
//! when the lowest recommendation over the scale-up window asks for more, removed when
//! the highest over the scale-down window asks for fewer. Nothing changes during a
//! rollout; no more are added until the ones added last are ready; none leave while an
//! engine of the role did not answer; the result stays within min and max.

use crate::api::AutoscalingTargets;
use crate::names::Role;
use std::collections::BTreeMap;

/// Slack around a target before the workers change.
pub const TOLERANCE: f64 = 0.1;

/// The policy, from `spec.autoscaling`.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Fewest workers per role.
    pub min: u32,
    /// Most workers per role.
    pub max: u32,
    /// The targets.
    pub targets: AutoscalingTargets,
    /// Scale-up stabilisation window, seconds.
    pub up_window: f64,
    /// Scale-down stabilisation window, seconds.
    pub down_window: f64,
}

/// One role's workers and engines, as seen.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleSignals {
    /// The role.
    pub role: Role,
    /// Workers the spec asks for now.
    pub current: u32,
    /// Workers ready.
    pub ready: u32,
    /// Every worker has been ready for two looks: the latest signals include the
    /// workers added last (a worker is routed to a little after it turns ready).
    pub settled: bool,
    /// Requests waiting, summed over the engines that answered.
    pub waiting: Option<f64>,
    /// Mean KV usage of the engines that answered, 0-1.
    pub kv_usage: Option<f64>,
    /// Requests running, summed over the engines that answered.
    pub running: Option<f64>,
    /// Requests one worker runs at once, as learnt: the most a worker ran while
    /// others waited in its queue (none until a queue was seen).
    pub seats: Option<f64>,
    /// Every running engine of the role answered the scrape: without that, a queue or
    /// requests in flight may be unseen, and the role does not scale in.
    pub complete: bool,
}

/// Everything seen in one look.
#[derive(Debug, Clone, PartialEq)]
pub struct Signals {
    /// TTFT p90 over the last interval, seconds.
    pub ttft_p90: Option<f64>,
    /// Inter-token p90 over the last interval, seconds.
    pub itl_p90: Option<f64>,
    /// Prefill legs' p90 over the last interval, seconds (disaggregated).
    pub prefill_p90: Option<f64>,
    /// Per role.
    pub roles: Vec<RoleSignals>,
    /// The spec changed and the controllers have not caught up (a rollout).
    pub rollout: bool,
}

/// Recommendations of the recent looks, per role: (time in seconds, workers).
pub type History = BTreeMap<Role, Vec<(f64, u32)>>;

/// What one role gets.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleDecision {
    /// The role.
    pub role: Role,
    /// Workers now.
    pub current: u32,
    /// Workers wanted.
    pub desired: u32,
    /// Why.
    pub reason: String,
    /// When a scale-in waits for its window: the earliest time it may happen.
    pub next_scale_in: Option<f64>,
}

/// A signal's pressure on a role.
#[derive(Debug, Clone, PartialEq)]
struct Pressure {
    what: &'static str,
    observed: f64,
    target: f64,
}

impl Pressure {
    fn ratio(&self) -> f64 {
        self.observed / self.target
    }

    /// A load that spreads over the workers (not a latency).
    fn spreads(&self) -> bool {
        !self.what.contains("p90")
    }

    fn describe(&self) -> String {
        format!(
            "{} {} against a target of {}",
            self.what,
            round(self.observed),
            round(self.target)
        )
    }
}

/// `v` to three decimals, as reasons and `status.autoscaling` show it.
pub(crate) fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Whether the gateways' TTFT counts for `role`: mixed always. Disaggregated: decode's
/// when only decode has a queue; prefill's otherwise, unless its legs (when timed) took
/// under half of `target`: then more prefill workers cannot bring the first token much
/// sooner, and what held it back was elsewhere (most often a decode seat).
fn takes_ttft(role: Role, signals: &Signals, target: Option<f64>) -> bool {
    let roles = &signals.roles;
    let waiting = |r: Role| {
        roles
            .iter()
            .find(|s| s.role == r)
            .and_then(|s| s.waiting)
            .unwrap_or(0.0)
    };
    let decode_queue_only = waiting(Role::Decode) > 0.0 && waiting(Role::Prefill) <= 0.0;
    let prefill_quick = match (signals.prefill_p90, target) {
        (Some(legs), Some(target)) => legs < target / 2.0,
        _ => false,
    };
    match role {
        Role::Mixed => true,
        Role::Prefill => !decode_queue_only && !prefill_quick,
        Role::Decode => decode_queue_only,
    }
}

fn pressures(targets: &AutoscalingTargets, signals: &Signals, role: &RoleSignals) -> Vec<Pressure> {
    let mut out = Vec::new();
    let mut push = |what, observed: Option<f64>, target: Option<f64>| {
        if let (Some(observed), Some(target)) = (observed, target) {
            out.push(Pressure {
                what,
                observed,
                target,
            });
        }
    };
    let per_worker = role.waiting.map(|w| w / f64::from(role.current.max(1)));
    push(
        "requests waiting per worker",
        per_worker,
        targets.waiting_per_worker,
    );
    push("KV usage", role.kv_usage, targets.kv_usage);
    if takes_ttft(role.role, signals, targets.ttft_p90_seconds) {
        push("TTFT p90 (s)", signals.ttft_p90, targets.ttft_p90_seconds);
    }
    if role.role != Role::Prefill {
        push(
            "inter-token p90 (s)",
            signals.itl_p90,
            targets.itl_p90_seconds,
        );
    }
    out
}

/// Whether `role` misses a latency target by more than the tolerance: its workers are
/// saturated, so what each runs now is what it can hold.
pub fn over_latency_target(
    targets: &AutoscalingTargets,
    signals: &Signals,
    role: &RoleSignals,
) -> bool {
    pressures(targets, signals, role)
        .iter()
        .any(|p| !p.spreads() && p.ratio() > 1.0 + TOLERANCE)
}

/// The workers one look alone would give `role`, and why.
pub fn recommend(policy: &Policy, signals: &Signals, role: &RoleSignals) -> (u32, String) {
    let current = role.current;
    let bounded = |n: u32| n.clamp(policy.min, policy.max);
    let pressures = pressures(&policy.targets, signals, role);
    let Some(top) = pressures
        .iter()
        .max_by(|a, b| a.ratio().total_cmp(&b.ratio()))
    else {
        return (bounded(current), "no signal with a target".into());
    };
    let ratio = top.ratio();
    let workers = f64::from(current.max(1));
    if ratio > 1.0 + TOLERANCE {
        let step_cap = current.saturating_mul(2).max(current + 1);
        let wanted = ((workers * ratio).ceil() as u32).clamp(current + 1, step_cap);
        let n = bounded(wanted);
        let why = if n == current {
            format!("{} (at the maximum, {})", top.describe(), policy.max)
        } else {
            top.describe()
        };
        return (n, why);
    }
    if ratio < 1.0 - TOLERANCE {
        if role.waiting.unwrap_or(0.0) > 0.0 {
            return (bounded(current), "requests wait in the queue".into());
        }
        if !role.complete {
            return (
                bounded(current),
                "not every engine answered on /metrics; no scale-in on a partial view".into(),
            );
        }
        // Load (the queue, KV usage) spreads over the workers left; latency does not
        // (it stays flat until a worker saturates), so with latency targets alone one
        // worker leaves at a time.
        let load = pressures
            .iter()
            .filter(|p| p.spreads())
            .map(Pressure::ratio)
            .reduce(f64::max);
        let spread = match load {
            Some(r) => ((workers * r) / (1.0 - TOLERANCE)).ceil().max(1.0) as u32,
            None => current.saturating_sub(1),
        };
        // At most half of the workers leave in one step.
        let spread = spread.max(current.div_ceil(2));
        let in_flight = role.running.unwrap_or(0.0) + role.waiting.unwrap_or(0.0);
        let need = role
            .seats
            .filter(|s| *s > 0.0)
            .map_or(0, |seats| (in_flight / seats).ceil() as u32);
        let n = bounded(spread.max(need)).min(bounded(current));
        let why = if need > spread && n == need.clamp(policy.min, policy.max) {
            format!(
                "every signal under its target, but {in_flight} requests in flight need {need} workers of {} seats",
                role.seats.unwrap_or_default()
            )
        } else {
            format!(
                "every signal under its target; the highest: {}",
                top.describe()
            )
        };
        return (n, why);
    }
    (
        bounded(current),
        format!("within 10% of the target: {}", top.describe()),
    )
}

/// Each role's decision, and the history to pass to the next look.
pub fn decide(
    policy: &Policy,
    signals: &Signals,
    history: &History,
    now: f64,
) -> (Vec<RoleDecision>, History) {
    let keep = policy.up_window.max(policy.down_window);
    let mut next = History::new();
    let mut decisions = Vec::new();
    for role in &signals.roles {
        let (recommended, why) = recommend(policy, signals, role);
        let mut recs: Vec<(f64, u32)> = history
            .get(&role.role)
            .map(|h| h.iter().copied().filter(|(t, _)| now - t <= keep).collect())
            .unwrap_or_default();
        recs.push((now, recommended));
        let within = |window: f64| recs.iter().filter(move |(t, _)| now - t <= window);
        let up = within(policy.up_window)
            .map(|(_, n)| *n)
            .min()
            .unwrap_or(recommended);
        let down = within(policy.down_window)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(recommended);
        let current = role.current;
        let (desired, reason, next_scale_in) = if signals.rollout {
            (
                current,
                format!("holding while a rollout runs; {recommended} recommended: {why}"),
                None,
            )
        } else if up > current && !role.settled {
            // Workers added last time are not serving yet: more would be decided on
            // signals they have not changed. (Fewer stays possible: a worker that cannot
            // start does not pin the count.)
            let hold = if role.ready < current {
                format!("{} of {current} workers are ready", role.ready)
            } else {
                "the workers added last settle".to_owned()
            };
            (
                current,
                format!("holding while {hold}; {up} recommended: {why}"),
                None,
            )
        } else if up > current {
            (up, why, None)
        } else if down < current {
            (down, why, None)
        } else if recommended < current {
            // A scale-in waits for the window: it may happen once the last higher
            // recommendation leaves it.
            let last_higher = recs
                .iter()
                .filter(|(_, n)| *n >= current)
                .map(|(t, _)| *t)
                .fold(f64::NEG_INFINITY, f64::max);
            (
                current,
                format!(
                    "{why}; {recommended} would do, after the {}s scale-down window",
                    policy.down_window
                ),
                Some(last_higher + policy.down_window),
            )
        } else if recommended > current {
            (
                current,
                format!(
                    "{why}; {recommended} wanted, after the {}s scale-up window",
                    policy.up_window
                ),
                None,
            )
        } else {
            (current, why, None)
        };
        next.insert(role.role, recs);
        decisions.push(RoleDecision {
            role: role.role,
            current,
            desired,
            reason,
            next_scale_in,
        });
    }
    (decisions, next)
}

#[cfg(test)]
mod tests;
