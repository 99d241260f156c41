//! kvd's Prometheus metrics: the store's counters and sizes, rejections, and op
//! latencies per op.

use crate::wire::Stats;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the op latency histogram.
const BUCKETS: [f64; 8] = [0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.1];

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// The label of a refusal: `ttl`, `retention_downgrade`, `displace_higher_class`,
/// `no_room`, `too_large`, `lease` or `other`.
pub fn rejection_kind(reason: &str) -> &'static str {
    const KINDS: [(&str, &str); 7] = [
        ("ttl_seconds", "ttl"),
        ("retention downgrade", "retention_downgrade"),
        ("would displace", "displace_higher_class"),
        ("no room", "no_room"),
        ("do not fit", "too_large"),
        ("exceeds", "too_large"),
        ("lease", "lease"),
    ];
    KINDS
        .iter()
        .find(|(needle, _)| reason.contains(needle))
        .map_or("other", |(_, kind)| kind)
}

/// Latencies and rejections (the store keeps the rest).
#[derive(Debug, Default)]
pub struct Metrics {
    ops: Mutex<BTreeMap<&'static str, Histogram>>,
    rejections: Mutex<BTreeMap<String, u64>>,
    errors: Mutex<BTreeMap<&'static str, u64>>,
}

impl Metrics {
    /// One op served.
    pub fn observe(&self, op: &'static str, took: Duration) {
        if let Ok(mut ops) = self.ops.lock() {
            let h = ops.entry(op).or_default();
            let secs = took.as_secs_f64();
            for (bound, b) in BUCKETS.iter().zip(h.buckets.iter_mut()) {
                if secs <= *bound {
                    *b += 1;
                }
            }
            h.count += 1;
            h.sum += secs;
        }
    }

    /// A write refused (`accepted=false`), counted by kind (a closed set, so label
    /// values stay few).
    pub fn rejected(&self, reason: &str) {
        let kind = rejection_kind(reason);
        if let Ok(mut r) = self.rejections.lock() {
            *r.entry(kind.to_owned()).or_default() += 1;
        }
    }

    /// An `error` reply.
    pub fn error(&self, code: &'static str) {
        if let Ok(mut e) = self.errors.lock() {
            *e.entry(code).or_default() += 1;
        }
    }

    /// The exposition text.
    pub fn render(&self, stats: &Stats, leases: usize, slot_size: u64) -> String {
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        gauge(
            "infera_kvd_entries",
            "Entries held in RAM.",
            "gauge",
            stats.entries,
        );
        gauge(
            "infera_kvd_bytes",
            "RAM held: arena slots, leased slots and spilled values.",
            "gauge",
            stats.host_bytes,
        );
        gauge(
            "infera_kvd_spillover_bytes",
            "Values held outside the arena (larger than a slot).",
            "gauge",
            stats.spillover_bytes,
        );
        gauge(
            "infera_kvd_long_bytes",
            "Bytes of long-retention entries.",
            "gauge",
            stats.long_bytes,
        );
        gauge(
            "infera_kvd_leases",
            "Write leases held by clients.",
            "gauge",
            leases as u64,
        );
        gauge(
            "infera_kvd_slot_size_bytes",
            "Arena slot size (0 until the first value).",
            "gauge",
            slot_size,
        );
        gauge(
            "infera_kvd_gets_total",
            "Keys asked for.",
            "counter",
            stats.gets_total,
        );
        gauge(
            "infera_kvd_sets_total",
            "Values offered.",
            "counter",
            stats.sets_total,
        );
        gauge(
            "infera_kvd_hits_total",
            "Keys found (tier ram).",
            "counter",
            stats.hits_total,
        );
        gauge(
            "infera_kvd_misses_total",
            "Keys not found.",
            "counter",
            stats.misses_total,
        );
        gauge(
            "infera_kvd_evictions_total",
            "Entries evicted to make room.",
            "counter",
            stats.evictions_total,
        );
        let _ = writeln!(
            out,
            "# HELP infera_kvd_rejections_total Writes refused, by reason.\n# TYPE infera_kvd_rejections_total counter"
        );
        if let Ok(r) = self.rejections.lock() {
            for (reason, n) in r.iter() {
                let reason = reason.replace('"', "'");
                let _ = writeln!(
                    out,
                    "infera_kvd_rejections_total{{reason=\"{reason}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP infera_kvd_errors_total Error replies, by code.\n# TYPE infera_kvd_errors_total counter"
        );
        if let Ok(e) = self.errors.lock() {
            for (code, n) in e.iter() {
                let _ = writeln!(out, "infera_kvd_errors_total{{code=\"{code}\"}} {n}");
            }
        }
        let _ = writeln!(
            out,
            "# HELP infera_kvd_op_duration_seconds Time to serve one op.\n# TYPE infera_kvd_op_duration_seconds histogram"
        );
        if let Ok(ops) = self.ops.lock() {
            for (op, h) in ops.iter() {
                for (bound, n) in BUCKETS.iter().zip(h.buckets.iter()) {
                    let _ = writeln!(
                        out,
                        "infera_kvd_op_duration_seconds_bucket{{op=\"{op}\",le=\"{bound}\"}} {n}"
                    );
                }
                let _ = writeln!(
                    out,
                    "infera_kvd_op_duration_seconds_bucket{{op=\"{op}\",le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(
                    out,
                    "infera_kvd_op_duration_seconds_sum{{op=\"{op}\"}} {}",
                    h.sum
                );
                let _ = writeln!(
                    out,
                    "infera_kvd_op_duration_seconds_count{{op=\"{op}\"}} {}",
                    h.count
                );
            }
        }
        out
    }
}
