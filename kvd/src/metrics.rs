//! kvd's Prometheus metrics, through `prometheus-client` ([`infera_telemetry::metrics`]):
//! op latencies per op, refusals and error replies counted as they happen; the
//! store's counters and sizes and every tier's read when scraped.

use crate::lower::Lower;
use crate::tier::{Tier, TierCounters};
use crate::wire::Stats;
use infera_telemetry::metrics::{Labels, ScrapeValues, register, register_counter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What `prefetch_hint` keys came to.
#[derive(Debug, Default)]
pub struct PrefetchCounters {
    /// Brought into RAM from a slower tier.
    pub warmed: AtomicU64,
    /// Already in RAM.
    pub present: AtomicU64,
    /// In no tier.
    pub missing: AtomicU64,
    /// Not reached before the hint's deadline.
    pub late: AtomicU64,
    /// Not queued: the prefetch queue was full.
    pub dropped: AtomicU64,
    /// Found below, but not kept in RAM (no room, or written or cleared meanwhile).
    pub refused: AtomicU64,
}

/// Upper bounds (seconds) of the op latency histogram.
const BUCKETS: [f64; 8] = [0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.1];

fn op_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// A label set of one static label.
type One = [(&'static str, &'static str); 1];

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

/// Latencies, refusals and errors (the store keeps the rest).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    ops: Family<One, Histogram, fn() -> Histogram>,
    rejections: Family<One, Counter>,
    errors: Family<One, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::default(),
            ops: Family::new_with_constructor(op_histogram),
            rejections: Family::default(),
            errors: Family::default(),
        };
        register(
            &mut m.registry,
            "infera_kvd_op_duration_seconds",
            "Time to serve one op.",
            m.ops.clone(),
        );
        register_counter(
            &mut m.registry,
            "infera_kvd_rejections_total",
            "Writes refused, by reason.",
            m.rejections.clone(),
        );
        register_counter(
            &mut m.registry,
            "infera_kvd_errors_total",
            "Error replies, by code.",
            m.errors.clone(),
        );
        m
    }
}

impl Metrics {
    /// One op served.
    pub fn observe(&self, op: &'static str, took: Duration) {
        self.ops
            .get_or_create(&[("op", op)])
            .observe(took.as_secs_f64());
    }

    /// A write refused (`accepted=false`), counted by kind (a closed set, so label
    /// values stay few).
    pub fn rejected(&self, reason: &str) {
        self.rejections
            .get_or_create(&[("reason", rejection_kind(reason))])
            .inc();
    }

    /// An `error` reply.
    pub fn error(&self, code: &'static str) {
        self.errors.get_or_create(&[("code", code)]).inc();
    }

    /// The exposition: the store (`stats`, `leases`, `slot_size`), the tiers below it
    /// and prefetch outcomes, then this registry's.
    pub fn render(
        &self,
        store: &StoreView,
        lower: &Lower,
        prefetched: &PrefetchCounters,
    ) -> String {
        let mut scraped = ScrapeValues::default();
        render_store(&mut scraped, store);
        render_tiers(&mut scraped, &store.stats, lower, prefetched);
        infera_telemetry::metrics::render(&self.registry, scraped)
    }
}

/// What the store reports at scrape time.
#[derive(Debug, Clone, Default)]
pub struct StoreView {
    /// Its counters and sizes.
    pub stats: Stats,
    /// Write leases held.
    pub leases: usize,
    /// Arena slot size (0 until the first value).
    pub slot_size: u64,
}

fn render_store(out: &mut ScrapeValues, store: &StoreView) {
    let stats = &store.stats;
    for (name, help, v) in [
        ("infera_kvd_entries", "Entries held in RAM.", stats.entries),
        (
            "infera_kvd_bytes",
            "RAM held: arena slots, leased slots and spilled values.",
            stats.host_bytes,
        ),
        (
            "infera_kvd_spillover_bytes",
            "Values held outside the arena (larger than a slot).",
            stats.spillover_bytes,
        ),
        (
            "infera_kvd_long_bytes",
            "Bytes of long-retention entries.",
            stats.long_bytes,
        ),
        (
            "infera_kvd_leases",
            "Write leases held by clients.",
            store.leases as u64,
        ),
        (
            "infera_kvd_slot_size_bytes",
            "Arena slot size (0 until the first value).",
            store.slot_size,
        ),
    ] {
        out.gauge(name, help, v);
    }
    for (name, help, v) in [
        ("infera_kvd_gets_total", "Keys asked for.", stats.gets_total),
        ("infera_kvd_sets_total", "Values offered.", stats.sets_total),
        (
            "infera_kvd_hits_total",
            "Keys found (tier ram).",
            stats.hits_total,
        ),
        (
            "infera_kvd_misses_total",
            "Keys not found.",
            stats.misses_total,
        ),
        (
            "infera_kvd_evictions_total",
            "Entries evicted to make room.",
            stats.evictions_total,
        ),
    ] {
        out.counter(name, help, v);
    }
}

fn tier(t: Tier) -> Labels {
    vec![("tier", t.label().to_owned())]
}

/// The tiers' part: hits per tier (RAM's from `ram`), and for L3/L4 what they read,
/// wrote, evicted, promoted and failed at; then prefetch outcomes.
fn render_tiers(out: &mut ScrapeValues, ram: &Stats, lower: &Lower, prefetched: &PrefetchCounters) {
    let mut tiers: Vec<(Tier, &TierCounters)> = Vec::new();
    if let Some(d) = &lower.disk {
        tiers.push((Tier::Nvme, &d.counters));
    }
    if let Some(r) = &lower.remote {
        tiers.push((Tier::Remote, &r.counters));
    }
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    type Pick = fn(&TierCounters) -> &AtomicU64;
    let counters: [(&str, &str, Option<u64>, Pick); 8] = [
        (
            "hits_total",
            "Lookups answered by the tier.",
            Some(ram.hits_total),
            |c| &c.hits,
        ),
        (
            "misses_total",
            "Lookups the tier did not answer (failures included).",
            Some(ram.misses_total),
            |c| &c.misses,
        ),
        ("read_bytes_total", "Bytes read for hits.", None, |c| {
            &c.read_bytes
        }),
        ("writes_total", "Entries written to the tier.", None, |c| {
            &c.writes
        }),
        (
            "write_bytes_total",
            "Bytes written to the tier.",
            None,
            |c| &c.write_bytes,
        ),
        (
            "evictions_total",
            "Entries evicted from the tier to make room.",
            Some(ram.evictions_total),
            |c| &c.evictions,
        ),
        (
            "promotions_total",
            "Entries brought up into RAM after a hit in the tier.",
            None,
            |c| &c.promotions,
        ),
        (
            "read_nanoseconds_total",
            "Time spent reading hits, in nanoseconds.",
            None,
            |c| &c.read_nanos,
        ),
    ];
    for (suffix, help, in_ram, pick) in counters {
        let ram_sample = in_ram.map(|v| (tier(Tier::Ram), v));
        let lower_samples = tiers.iter().map(|(t, c)| (tier(*t), load(pick(c))));
        out.counter_family(
            &format!("infera_kvd_tier_{suffix}"),
            help,
            ram_sample.into_iter().chain(lower_samples),
        );
    }
    out.counter_family(
        "infera_kvd_tier_failures_total",
        "Tier operations that failed and became misses or dropped writes, by op and reason.",
        tiers.iter().flat_map(|(t, c)| {
            c.failures().into_iter().map(move |((op, reason), n)| {
                let labels = vec![
                    ("tier", t.label().to_owned()),
                    ("op", op.to_owned()),
                    ("reason", reason.to_owned()),
                ];
                (labels, n)
            })
        }),
    );
    let disk = lower.disk.as_ref().map(|d| d.report());
    out.gauge_family(
        "infera_kvd_tier_entries",
        "Entries held by the tier.",
        std::iter::once((tier(Tier::Ram), ram.entries))
            .chain(disk.as_ref().map(|r| (tier(Tier::Nvme), r.entries))),
    );
    out.gauge_family(
        "infera_kvd_tier_bytes",
        "Bytes held by the tier.",
        std::iter::once((tier(Tier::Ram), ram.host_bytes))
            .chain(disk.as_ref().map(|r| (tier(Tier::Nvme), r.bytes))),
    );
    out.gauge_family(
        "infera_kvd_tier_queued_writes",
        "Writes waiting for the tier.",
        disk.as_ref()
            .map(|r| (tier(Tier::Nvme), r.queued))
            .into_iter()
            .chain(
                lower
                    .remote
                    .as_ref()
                    .map(|r| (tier(Tier::Remote), r.queued() as u64)),
            ),
    );
    if let Some(r) = &disk {
        out.gauge(
            "infera_kvd_nvme_capacity_bytes",
            "Container bytes over all devices.",
            r.capacity,
        );
        out.gauge(
            "infera_kvd_nvme_journal_bytes",
            "Journal bytes over all devices.",
            r.journal_bytes,
        );
        out.gauge(
            "infera_kvd_nvme_slot_size_bytes",
            "NVMe slot size (0 until the first write).",
            r.slot_size,
        );
        out.gauge_family(
            "infera_kvd_nvme_devices",
            "NVMe tier devices, by I/O mode.",
            [
                (vec![("io", "direct".to_owned())], r.direct),
                (vec![("io", "buffered".to_owned())], r.devices - r.direct),
            ],
        );
    }
    if let Some(r) = &lower.remote {
        out.gauge(
            "infera_kvd_remote_up",
            "0 while the distributed store is skipped after a failure.",
            i64::from(!r.is_down()),
        );
    }
    out.counter_family(
        "infera_kvd_prefetch_keys_total",
        "prefetch_hint keys by outcome.",
        [
            ("warmed", &prefetched.warmed),
            ("present", &prefetched.present),
            ("missing", &prefetched.missing),
            ("late", &prefetched.late),
            ("dropped", &prefetched.dropped),
            ("refused", &prefetched.refused),
        ]
        .map(|(outcome, n)| (vec![("outcome", outcome.to_owned())], load(n))),
    );
}
