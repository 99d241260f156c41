//! The operator's Prometheus metrics, through `prometheus-client`
//! ([`infera_telemetry::metrics`]): reconciles by result and their duration, objects
//! applied, and whether this replica leads.

use infera_telemetry::metrics::{ScrapeValues, register, register_counter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the reconcile-duration histogram.
const BUCKETS: [f64; 8] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// Counters and gauges.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<[(&'static str, &'static str); 1], Counter>,
    durations: Histogram,
    applies: Counter,
    /// This replica holds the leader Lease.
    pub leader: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::default(),
            reconciles: Family::default(),
            durations: Histogram::new(BUCKETS),
            applies: Counter::default(),
            leader: AtomicBool::new(false),
        };
        let r = &mut m.registry;
        register_counter(
            r,
            "infera_operator_reconciles_total",
            "Reconciles of InferaDeployments, by result.",
            m.reconciles.clone(),
        );
        register(
            r,
            "infera_operator_reconcile_duration_seconds",
            "Time of one reconcile.",
            m.durations.clone(),
        );
        register_counter(
            r,
            "infera_operator_applies_total",
            "Objects server-side applied.",
            m.applies.clone(),
        );
        // Both results are shown from the start, at 0.
        for result in ["success", "error"] {
            let _ = m.reconciles.get_or_create(&[("result", result)]);
        }
        m
    }
}

impl Metrics {
    /// Records one reconcile.
    pub fn observe_reconcile(&self, took: Duration, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.reconciles.get_or_create(&[("result", result)]).inc();
        self.durations.observe(took.as_secs_f64());
    }

    /// Counts objects applied.
    pub fn record_applies(&self, n: usize) {
        self.applies.inc_by(n as u64);
    }

    /// Reconciles so far (successful, failed).
    pub fn reconciles(&self) -> (u64, u64) {
        let count = |result| self.reconciles.get_or_create(&[("result", result)]).get();
        (count("success"), count("error"))
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut scraped = ScrapeValues::default();
        scraped.gauge(
            "infera_operator_leader",
            "1 while this replica holds the leader Lease.",
            i64::from(self.leader.load(Ordering::Relaxed)),
        );
        infera_telemetry::metrics::render(&self.registry, scraped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_applies_and_leadership() {
        let m = Metrics::default();
        m.observe_reconcile(Duration::from_millis(20), true);
        m.observe_reconcile(Duration::from_millis(2), false);
        m.record_applies(3);
        m.leader.store(true, Ordering::Relaxed);
        assert_eq!(m.reconciles(), (1, 1));
        let text = m.render();
        for line in [
            "infera_operator_reconciles_total{result=\"success\"} 1",
            "infera_operator_reconciles_total{result=\"error\"} 1",
            "infera_operator_reconcile_duration_seconds_bucket{le=\"0.005\"} 1",
            "infera_operator_reconcile_duration_seconds_bucket{le=\"0.025\"} 2",
            "infera_operator_reconcile_duration_seconds_count 2",
            "infera_operator_applies_total 3",
            "infera_operator_leader 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
    }
}
