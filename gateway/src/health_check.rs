//! Active health checks: every worker's `GET /health`, polled on an interval. A worker
//! that fails `--health-check-failures` checks in a row (an error, a non-2xx answer or
//! no answer within `--health-check-timeout-s`) stops taking traffic and its requests in
//! flight end with an error (a stopped or hung engine never answers them); it takes
//! traffic again after one passing check. Process exits and closed ports are caught by
//! the breakers and discovery; this is for an engine that is up but no longer answers.

use crate::breaker::Breakers;
use crate::gateway::Gateway;
use infera_proto::error_class::{ApiError, ErrorClass};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What one check changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The worker failed enough checks in a row: out of routing.
    Failing,
    /// A failing worker passed one: back in routing.
    Recovered,
}

/// Resolves, once `worker` starts failing its health checks (`Breakers::stalled`), with
/// the error its request in flight ends with; `who` names it ("worker", "prefill
/// worker", ...).
pub fn stall_error(
    breakers: &Breakers,
    who: &str,
    worker: &str,
) -> impl Future<Output = ApiError> + Send + 'static {
    let stalled = breakers.stalled(worker);
    let message = format!("{who} {worker} stopped answering its health checks");
    async move {
        stalled.await;
        ApiError::new(ErrorClass::BadGateway, message)
    }
}

/// Consecutive failures per worker URL (pure).
#[derive(Debug, Default)]
pub struct HealthTracker {
    failures: HashMap<String, u32>,
    failing: HashSet<String>,
}

impl HealthTracker {
    /// Records one check of `url`; what changed, if anything.
    pub fn observe(&mut self, url: &str, ok: bool, threshold: u32) -> Option<Change> {
        if ok {
            self.failures.remove(url);
            return self.failing.remove(url).then_some(Change::Recovered);
        }
        let n = self.failures.entry(url.to_owned()).or_insert(0);
        *n += 1;
        (*n >= threshold.max(1) && self.failing.insert(url.to_owned())).then_some(Change::Failing)
    }

    /// Whether `url` is failing (out of routing).
    pub fn is_failing(&self, url: &str) -> bool {
        self.failing.contains(url)
    }

    /// Forgets URLs no longer registered.
    pub fn retain(&mut self, urls: &HashSet<&str>) {
        self.failures.retain(|u, _| urls.contains(u.as_str()));
        self.failing.retain(|u| urls.contains(u.as_str()));
    }
}

/// Checks every registered worker each `--health-check-interval-s` until `stop`.
pub async fn run_health_checks(gw: Arc<Gateway>, mut stop: watch::Receiver<bool>) {
    let cfg = &gw.cfg;
    if cfg.health_check_interval_s <= 0.0 {
        return;
    }
    let interval = Duration::from_secs_f64(cfg.health_check_interval_s);
    let timeout = Duration::from_secs_f64(cfg.health_check_timeout_s);
    let mut tracker = HealthTracker::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let snapshot = gw.registry.snapshot();
        // Data-parallel ranks of one engine share its URL: one check for all of them.
        let mut by_url: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for w in snapshot.workers.values() {
            by_url.entry(w.url.as_str()).or_default().push(&w.worker_id);
        }
        tracker.retain(&by_url.keys().copied().collect());
        let checks = by_url.keys().map(|url| check(&gw.client, url, timeout));
        let results = futures::future::join_all(checks).await;
        for ((url, ids), ok) in by_url.iter().zip(results) {
            let change = tracker.observe(url, ok, cfg.health_check_failures);
            // Every id at the URL follows it, including one registered there since the
            // URL started failing.
            let failing = tracker.is_failing(url);
            for id in ids {
                if gw.breakers.health_failing(id) != failing {
                    gw.breakers.set_health_failing(id, failing);
                }
            }
            if change.is_none() {
                continue;
            }
            gw.metrics.record_health_change(failing);
            if failing {
                tracing::warn!(
                    "worker {ids:?} failed {} health checks in a row ({url}/health): out of routing, \
                     its requests in flight ended",
                    cfg.health_check_failures
                );
            } else {
                tracing::info!("worker {ids:?} passes its health check again: back in routing");
            }
        }
    }
}

async fn check(client: &reqwest::Client, url: &str, timeout: Duration) -> bool {
    let url = format!("{}/health", url.trim_end_matches('/'));
    match client.get(&url).timeout(timeout).send().await {
        Ok(r) => r.status().is_success(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_takes_consecutive_failures_and_one_pass_recovers() {
        let mut t = HealthTracker::default();
        assert_eq!(t.observe("u", false, 2), None);
        assert_eq!(t.observe("u", true, 2), None, "a pass resets the count");
        assert_eq!(t.observe("u", false, 2), None);
        assert_eq!(t.observe("u", false, 2), Some(Change::Failing));
        assert!(t.is_failing("u"));
        assert_eq!(t.observe("u", false, 2), None, "said once");
        assert!(t.is_failing("u"), "and still failing");
        assert_eq!(t.observe("v", true, 2), None, "others are apart");
        assert_eq!(t.observe("u", true, 2), Some(Change::Recovered));
        assert_eq!(t.observe("u", true, 2), None);
        // A threshold of 0 acts as 1; a removed URL starts over.
        assert_eq!(t.observe("w", false, 0), Some(Change::Failing));
        t.retain(&HashSet::from(["u"]));
        assert_eq!(t.observe("w", true, 1), None);
    }
}
