//! kvd's Prometheus metrics: the store's counters and sizes, rejections, and op
//! latencies per op.

use crate::daemon::PrefetchCounters;
use crate::lower::Lower;
use crate::tier::{Tier, TierCounters};
use crate::wire::Stats;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
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

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The tiers' part of the exposition: hits per tier (RAM's from `ram`), and for L3/L4
/// what they read, wrote, evicted, promoted and failed at; then prefetch outcomes.
pub fn render_tiers(ram: &Stats, lower: &Lower, prefetched: &PrefetchCounters) -> String {
    let mut out = String::new();
    let mut tiers: Vec<(Tier, &TierCounters)> = Vec::new();
    if let Some(d) = &lower.disk {
        tiers.push((Tier::Nvme, &d.counters));
    }
    if let Some(r) = &lower.remote {
        tiers.push((Tier::Remote, &r.counters));
    }
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    type Pick = fn(&TierCounters) -> &AtomicU64;
    let counters: [(&str, &str, Pick); 8] = [
        ("hits_total", "Lookups answered by the tier.", |c| &c.hits),
        (
            "misses_total",
            "Lookups the tier did not answer (failures included).",
            |c| &c.misses,
        ),
        ("read_bytes_total", "Bytes read for hits.", |c| {
            &c.read_bytes
        }),
        ("writes_total", "Entries written to the tier.", |c| {
            &c.writes
        }),
        ("write_bytes_total", "Bytes written to the tier.", |c| {
            &c.write_bytes
        }),
        (
            "evictions_total",
            "Entries evicted from the tier to make room.",
            |c| &c.evictions,
        ),
        (
            "promotions_total",
            "Entries brought up into RAM after a hit in the tier.",
            |c| &c.promotions,
        ),
        (
            "read_nanoseconds_total",
            "Time spent reading hits, in nanoseconds.",
            |c| &c.read_nanos,
        ),
    ];
    for (suffix, help, pick) in counters {
        let name = format!("infera_kvd_tier_{suffix}");
        family(&mut out, &name, help, "counter");
        if suffix == "hits_total" {
            let _ = writeln!(out, "{name}{{tier=\"ram\"}} {}", ram.hits_total);
        }
        if suffix == "misses_total" {
            let _ = writeln!(out, "{name}{{tier=\"ram\"}} {}", ram.misses_total);
        }
        if suffix == "evictions_total" {
            let _ = writeln!(out, "{name}{{tier=\"ram\"}} {}", ram.evictions_total);
        }
        for (tier, c) in &tiers {
            let _ = writeln!(out, "{name}{{tier=\"{}\"}} {}", tier.label(), load(pick(c)));
        }
    }
    family(
        &mut out,
        "infera_kvd_tier_failures_total",
        "Tier operations that failed and became misses or dropped writes, by op and reason.",
        "counter",
    );
    for (tier, c) in &tiers {
        for ((op, reason), n) in c.failures() {
            let _ = writeln!(
                out,
                "infera_kvd_tier_failures_total{{tier=\"{}\",op=\"{op}\",reason=\"{reason}\"}} {n}",
                tier.label()
            );
        }
    }
    let disk = lower.disk.as_ref().map(|d| d.report());
    family(
        &mut out,
        "infera_kvd_tier_entries",
        "Entries held by the tier.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "infera_kvd_tier_entries{{tier=\"ram\"}} {}",
        ram.entries
    );
    if let Some(r) = &disk {
        let _ = writeln!(
            out,
            "infera_kvd_tier_entries{{tier=\"nvme\"}} {}",
            r.entries
        );
    }
    family(
        &mut out,
        "infera_kvd_tier_bytes",
        "Bytes held by the tier.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "infera_kvd_tier_bytes{{tier=\"ram\"}} {}",
        ram.host_bytes
    );
    if let Some(r) = &disk {
        let _ = writeln!(out, "infera_kvd_tier_bytes{{tier=\"nvme\"}} {}", r.bytes);
    }
    family(
        &mut out,
        "infera_kvd_tier_queued_writes",
        "Writes waiting for the tier.",
        "gauge",
    );
    if let Some(r) = &disk {
        let _ = writeln!(
            out,
            "infera_kvd_tier_queued_writes{{tier=\"nvme\"}} {}",
            r.queued
        );
    }
    if let Some(r) = &lower.remote {
        let _ = writeln!(
            out,
            "infera_kvd_tier_queued_writes{{tier=\"remote\"}} {}",
            r.queued()
        );
    }
    if let Some(r) = &disk {
        for (name, help, v) in [
            (
                "infera_kvd_nvme_capacity_bytes",
                "Container bytes over all devices.",
                r.capacity,
            ),
            (
                "infera_kvd_nvme_journal_bytes",
                "Journal bytes over all devices.",
                r.journal_bytes,
            ),
            (
                "infera_kvd_nvme_slot_size_bytes",
                "NVMe slot size (0 until the first write).",
                r.slot_size,
            ),
        ] {
            family(&mut out, name, help, "gauge");
            let _ = writeln!(out, "{name} {v}");
        }
        family(
            &mut out,
            "infera_kvd_nvme_devices",
            "NVMe tier devices, by I/O mode.",
            "gauge",
        );
        let _ = writeln!(out, "infera_kvd_nvme_devices{{io=\"direct\"}} {}", r.direct);
        let _ = writeln!(
            out,
            "infera_kvd_nvme_devices{{io=\"buffered\"}} {}",
            r.devices - r.direct
        );
    }
    if let Some(r) = &lower.remote {
        family(
            &mut out,
            "infera_kvd_remote_up",
            "0 while the distributed store is skipped after a failure.",
            "gauge",
        );
        let _ = writeln!(out, "infera_kvd_remote_up {}", u8::from(!r.is_down()));
    }
    family(
        &mut out,
        "infera_kvd_prefetch_keys_total",
        "prefetch_hint keys by outcome.",
        "counter",
    );
    for (outcome, n) in [
        ("warmed", &prefetched.warmed),
        ("present", &prefetched.present),
        ("missing", &prefetched.missing),
        ("late", &prefetched.late),
        ("dropped", &prefetched.dropped),
        ("refused", &prefetched.refused),
    ] {
        let _ = writeln!(
            out,
            "infera_kvd_prefetch_keys_total{{outcome=\"{outcome}\"}} {}",
            load(n)
        );
    }
    out
}
