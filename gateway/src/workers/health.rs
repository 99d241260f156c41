//! Active health checks: every worker's `GET /health`, polled on an interval. A worker
//! that fails `--health-check-failures` checks in a row (an error, a non-2xx answer or
//! no answer within `--health-check-timeout-s`) stops taking traffic and its requests in
//! flight end with an error (a stopped or hung engine never answers them); it takes
//! traffic again after one passing check. Process exits and closed ports are caught by
//! the breakers and discovery; this is for an engine that is up but no longer answers.

use crate::metrics::Metrics;
use crate::workers::breaker::Breakers;
use crate::workers::registry::Registry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What one check changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// The worker failed enough checks in a row: out of routing.
    Failing,
    /// A failing worker passed one: back in routing.
    Recovered,
}

/// Consecutive failures per worker URL (pure).
#[derive(Debug, Default)]
pub(crate) struct HealthTracker {
    failures: HashMap<String, u32>,
    failing: HashSet<String>,
}

impl HealthTracker {
    /// Records one check of `url`; what changed, if anything.
    pub(crate) fn observe(&mut self, url: &str, ok: bool, threshold: u32) -> Option<Change> {
        if ok {
            self.failures.remove(url);
            return self.failing.remove(url).then_some(Change::Recovered);
        }
        let n = self.failures.entry(url.to_owned()).or_insert(0);
        *n += 1;
        (*n >= threshold.max(1) && self.failing.insert(url.to_owned())).then_some(Change::Failing)
    }

    /// Whether `url` is failing (out of routing).
    pub(crate) fn is_failing(&self, url: &str) -> bool {
        self.failing.contains(url)
    }

    /// Forgets URLs no longer registered.
    pub(crate) fn retain(&mut self, urls: &HashSet<&str>) {
        self.failures.retain(|u, _| urls.contains(u.as_str()));
        self.failing.retain(|u| urls.contains(u.as_str()));
    }
}

/// What the health checks read and act on: the registered workers, their breakers (a
/// failing worker's are told), the metrics, and the settings.
#[derive(Debug, Clone)]
pub(crate) struct HealthChecks {
    /// The workers to check.
    pub(crate) registry: Arc<Registry>,
    /// Told which workers fail their checks.
    pub(crate) breakers: Arc<Breakers>,
    /// Counts changes.
    pub(crate) metrics: Arc<Metrics>,
    /// The HTTP client the checks use.
    pub(crate) client: reqwest::Client,
    /// `--health-check-interval-s` (zero: no checks).
    pub(crate) interval: Duration,
    /// `--health-check-timeout-s`.
    pub(crate) timeout: Duration,
    /// `--health-check-failures`.
    pub(crate) failures: u32,
}

/// Checks every registered worker each interval until `stop`.
pub(crate) async fn run_health_checks(checks: HealthChecks, mut stop: watch::Receiver<bool>) {
    if checks.interval.is_zero() {
        return;
    }
    let (interval, timeout) = (checks.interval, checks.timeout);
    let mut tracker = HealthTracker::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let snapshot = checks.registry.snapshot();
        // Data-parallel ranks of one engine share its URL: one check for all of them.
        let mut by_url: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for w in snapshot.workers.values() {
            by_url.entry(w.url.as_str()).or_default().push(&w.worker_id);
        }
        tracker.retain(&by_url.keys().copied().collect());
        let probes = by_url.keys().map(|url| check(&checks.client, url, timeout));
        let results = futures::future::join_all(probes).await;
        for ((url, ids), ok) in by_url.iter().zip(results) {
            let change = tracker.observe(url, ok, checks.failures);
            // Every id at the URL follows it, including one registered there since the
            // URL started failing.
            let failing = tracker.is_failing(url);
            for id in ids {
                if checks.breakers.health_failing(id) != failing {
                    checks.breakers.set_health_failing(id, failing);
                }
            }
            if change.is_none() {
                continue;
            }
            checks.metrics.record_health_change(failing);
            if failing {
                tracing::warn!(
                    "worker {ids:?} failed {} health checks in a row ({url}/health): out of routing, \
                     its requests in flight ended",
                    checks.failures
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
