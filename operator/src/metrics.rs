//! The operator's Prometheus metrics (text exposition).

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the reconcile-duration histogram.
const BUCKETS: [f64; 8] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// Counters and gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    reconciles_ok: AtomicU64,
    reconciles_err: AtomicU64,
    /// Objects server-side applied.
    pub applies: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    micros_sum: AtomicU64,
    /// This replica holds the leader Lease.
    pub leader: AtomicBool,
}

impl Metrics {
    /// Records one reconcile.
    pub fn observe_reconcile(&self, took: Duration, ok: bool) {
        let counter = if ok {
            &self.reconciles_ok
        } else {
            &self.reconciles_err
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.micros_sum.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Reconciles so far (successful, failed).
    pub fn reconciles(&self) -> (u64, u64) {
        (
            self.reconciles_ok.load(Ordering::Relaxed),
            self.reconciles_err.load(Ordering::Relaxed),
        )
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let (ok, err) = self.reconciles();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP infera_operator_reconciles_total Reconciles of InferaDeployments, by result."
        );
        let _ = writeln!(out, "# TYPE infera_operator_reconciles_total counter");
        let _ = writeln!(
            out,
            "infera_operator_reconciles_total{{result=\"success\"}} {ok}"
        );
        let _ = writeln!(
            out,
            "infera_operator_reconciles_total{{result=\"error\"}} {err}"
        );
        let _ = writeln!(
            out,
            "# HELP infera_operator_reconcile_duration_seconds Time of one reconcile."
        );
        let _ = writeln!(
            out,
            "# TYPE infera_operator_reconcile_duration_seconds histogram"
        );
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "infera_operator_reconcile_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "infera_operator_reconcile_duration_seconds_bucket{{le=\"+Inf\"}} {}",
            ok + err
        );
        let sum = self.micros_sum.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "infera_operator_reconcile_duration_seconds_sum {sum}");
        let _ = writeln!(
            out,
            "infera_operator_reconcile_duration_seconds_count {}",
            ok + err
        );
        let _ = writeln!(
            out,
            "# HELP infera_operator_applies_total Objects server-side applied."
        );
        let _ = writeln!(out, "# TYPE infera_operator_applies_total counter");
        let _ = writeln!(
            out,
            "infera_operator_applies_total {}",
            self.applies.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP infera_operator_leader 1 while this replica holds the leader Lease."
        );
        let _ = writeln!(out, "# TYPE infera_operator_leader gauge");
        let _ = writeln!(
            out,
            "infera_operator_leader {}",
            u8::from(self.leader.load(Ordering::Relaxed))
        );
        out
    }
}
