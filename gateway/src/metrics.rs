//! Gateway metrics, through `prometheus-client` ([`infera_telemetry::metrics`]), under
//! the series names the earlier system's dashboards query (`infera_router_picks_total`,
//! `infera_request_duration_seconds`, ...), with its label sets and bucket bounds for
//! the metrics it had, plus this gateway's own (TTFT, inter-chunk latency, discovery,
//! kv events, admission). Labels are bounded: roles, outcomes, reasons, worker ids
//! (removed with the worker). Values only known at scrape time (workers per mode, the
//! breakers, the kv-aware view) are read then, from what [`Metrics::render`] is given.

use infera_telemetry::metrics::{ScrapeValues, register, register_counter};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Buckets of `infera_request_duration_seconds`, the earlier server's (`+Inf` implied).
const REQUEST_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets of `infera_pd_dispatch_duration_seconds`, the earlier server's.
const PD_LEG_BUCKETS: [f64; 11] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Buckets of this gateway's TTFT and inter-chunk histograms (seconds). Dense from
/// 50 ms to 2 s, where latency targets are set: a p90 is interpolated inside its
/// bucket, and TTFTs just past 0.25 s in a (0.25, 0.5] bucket read as about 0.45 s.
const LATENCY_BUCKETS: [f64; 24] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0,
    1.5, 2.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Buckets of `infera_router_pick_cache_hits` and `infera_router_pick_request_blocks`,
/// the earlier server's.
const BLOCK_BUCKETS: [f64; 13] = [
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];

/// Roles a pick is labelled with (what [`Metrics::remove_worker`] clears).
const ROLES: [&str; 3] = ["mixed", "prefill", "decode"];

/// Legs of a prefill/decode request.
const LEGS: [&str; 2] = ["prefill", "decode"];

/// How a request ended, for `infera_request_duration_seconds{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Outcome {
    /// 2xx relayed.
    Ok,
    /// Rejected as a bad request (4xx before routing or from the worker).
    ClientError,
    /// No worker for it.
    NoWorker,
    /// Worker unreachable or 5xx.
    UpstreamError,
    /// Timed out.
    Timeout,
    /// The client went away.
    Cancelled,
}

impl Outcome {
    /// The label value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ClientError => "client_error",
            Self::NoWorker => "no_worker",
            Self::UpstreamError => "upstream_error",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
        }
    }
}

// Label fields in name order: the earlier exporter wrote labels sorted.

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleWorker {
    role: String,
    worker_id: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouterOutcome {
    outcome: &'static str,
    router: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouterLabel {
    router: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LegWorker {
    leg: &'static str,
    worker_id: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolOutcome {
    // Not an earlier metric: in the order it was first served.
    protocol: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    class: &'static str,
    model: String,
    role: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassOutcome {
    class: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassReason {
    class: &'static str,
    reason: &'static str,
}

/// A label set of one static label (`reason`, `kind`, `outcome`, `retention`, `to`).
type One = [(&'static str, &'static str); 1];

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_BUCKETS)
}

fn block_histogram() -> Histogram {
    Histogram::new(BLOCK_BUCKETS)
}

fn pd_leg_histogram() -> Histogram {
    Histogram::new(PD_LEG_BUCKETS)
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// What the exposition reads from the workers' side at scrape time, read by the
/// caller (the registry's snapshot and the breakers), so the metrics know neither.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkerGauges {
    /// Registered workers taking requests, per disaggregation mode (`mixed`, `prefill`,
    /// `decode`).
    pub(crate) by_mode: Vec<(&'static str, usize)>,
    /// Per worker: its breaker's state (0 closed, 1 half-open, 2 open) and trips.
    pub(crate) breakers: Vec<(String, i64, u64)>,
}

/// kv-aware gauges read at render time.
#[derive(Debug, Clone, Default)]
pub(crate) struct KvGauges {
    /// Blocks held in the prefix index.
    pub indexed_blocks: usize,
    /// Heap bytes per indexed block.
    pub bytes_per_block: f64,
    /// Per target (route key) of every listed worker, draining ones included: blocks in
    /// the router's view, distinct in-flight blocks.
    pub targets: Vec<(String, usize, usize)>,
}

/// The gateway's metrics.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    picks: Family<RoleWorker, Counter>,
    durations: Histograms<RouterOutcome>,
    inflight: Family<RouterLabel, Gauge>,
    ttft: Histogram,
    itl: Histogram,
    cache_control: Family<One, Counter>,
    discovery_events: Family<One, Counter>,
    rejected_records: Family<One, Counter>,
    cache_hits: Histograms<RoleLabel>,
    pick_request_blocks: Histograms<RoleLabel>,
    locality_skipped: Family<One, Counter>,
    unhashed: Family<One, Counter>,
    kv_events: Family<One, Counter>,
    pd_legs: Histograms<LegWorker>,
    pd_failures: Family<One, Counter>,
    migrations: Family<One, Counter>,
    migrations_failed: Family<One, Counter>,
    pd_requests: Family<ProtocolOutcome, Counter>,
    pd_decode_retries: Counter,
    admission_refused: Counter,
    flow_queued: Family<QueueLabels, Gauge>,
    flow_waits: Histograms<ClassOutcome>,
    flow_shed: Family<ClassReason, Counter>,
    health_changes: Family<One, Counter>,
    epp_exchanges: Family<One, Counter>,
    /// Client connections open now (the HTTP server counts them).
    pub connections_open: Arc<AtomicUsize>,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Self {
            registry: Registry::default(),
            picks: Family::default(),
            durations: Family::new_with_constructor(request_histogram),
            inflight: Family::default(),
            ttft: latency_histogram(),
            itl: latency_histogram(),
            cache_control: Family::default(),
            discovery_events: Family::default(),
            rejected_records: Family::default(),
            cache_hits: Family::new_with_constructor(block_histogram),
            pick_request_blocks: Family::new_with_constructor(block_histogram),
            locality_skipped: Family::default(),
            unhashed: Family::default(),
            kv_events: Family::default(),
            pd_legs: Family::new_with_constructor(pd_leg_histogram),
            pd_failures: Family::default(),
            migrations: Family::default(),
            migrations_failed: Family::default(),
            pd_requests: Family::default(),
            pd_decode_retries: Counter::default(),
            admission_refused: Counter::default(),
            flow_queued: Family::default(),
            flow_waits: Family::new_with_constructor(latency_histogram),
            flow_shed: Family::default(),
            health_changes: Family::default(),
            epp_exchanges: Family::default(),
            connections_open: Arc::default(),
        };
        m.registered()
    }
}

impl Metrics {
    /// Registers every metric under its name.
    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        register_counter(
            r,
            "infera_router_picks_total",
            "Routing picks per role and worker.",
            self.picks.clone(),
        );
        register(
            r,
            "infera_router_pick_cache_hits",
            "Prefix blocks already cached on the picked worker, per kv-aware pick.",
            self.cache_hits.clone(),
        );
        register(
            r,
            "infera_router_pick_request_blocks",
            "Total request block count seen at pick time.",
            self.pick_request_blocks.clone(),
        );
        register(
            r,
            "infera_request_duration_seconds",
            "Request duration by router and outcome.",
            self.durations.clone(),
        );
        register(
            r,
            "infera_request_inflight",
            "Requests in flight by router.",
            self.inflight.clone(),
        );
        register_counter(
            r,
            "infera_cache_control_seen_total",
            "Requests carrying a cache retention hint, by class.",
            self.cache_control.clone(),
        );
        register_counter(
            r,
            "infera_cache_locality_skipped_total",
            "kv-aware picks that ignored cache locality (weight 0), by reason.",
            self.locality_skipped.clone(),
        );
        register_counter(
            r,
            "infera_gateway_requests_without_blocks_total",
            "kv-aware requests routed on load only, by reason.",
            self.unhashed.clone(),
        );
        register_counter(
            r,
            "infera_gateway_kv_events_total",
            "KV-event batches and skipped events, by outcome.",
            self.kv_events.clone(),
        );
        register(
            r,
            "infera_gateway_ttft_seconds",
            "Time from request to the first streamed byte from the worker (streamed answers only).",
            self.ttft.clone(),
        );
        register(
            r,
            "infera_gateway_itl_seconds",
            "Time between streamed writes (streamed answers only).",
            self.itl.clone(),
        );
        register_counter(
            r,
            "infera_gateway_admission_refused_total",
            "Requests refused with 429 at --max-concurrent-requests.",
            self.admission_refused.clone(),
        );
        register(
            r,
            "infera_flow_queued_requests",
            "Requests waiting in the gateway for a worker with room, by model, role (the pool without room: mixed, prefill or decode) and class.",
            self.flow_queued.clone(),
        );
        register(
            r,
            "infera_flow_wait_seconds",
            "How long requests waited in the gateway, by class and outcome (sent, or shed: answered 429 or 503).",
            self.flow_waits.clone(),
        );
        register_counter(
            r,
            "infera_flow_shed_total",
            "Requests answered 429 or 503 by flow control before any worker started them, by class and reason (deadline, queue_full, displaced, body_budget, no_worker).",
            self.flow_shed.clone(),
        );
        register_counter(
            r,
            "infera_gateway_health_changes_total",
            "Workers that started failing their health checks, or passing them again.",
            self.health_changes.clone(),
        );
        register_counter(
            r,
            "infera_gateway_discovery_events_total",
            "Discovery events by kind.",
            self.discovery_events.clone(),
        );
        register_counter(
            r,
            "infera_gateway_rejected_worker_records_total",
            "Worker records refused, by reason.",
            self.rejected_records.clone(),
        );
        register(
            r,
            "infera_pd_dispatch_duration_seconds",
            "Prefill/decode legs per worker: prefill until its answer was read, decode until its headers.",
            self.pd_legs.clone(),
        );
        register_counter(
            r,
            "infera_pd_bootstrap_failures_total",
            "Prefill/decode requests that failed to set up or lost their prefill, by reason.",
            self.pd_failures.clone(),
        );
        register_counter(
            r,
            "infera_migrations_total",
            "Live generations carried from one worker to another, by what prompted it.",
            self.migrations.clone(),
        );
        register_counter(
            r,
            "infera_migrations_failed_total",
            "Generations that could not be carried, and so ended visibly to the client.",
            self.migrations_failed.clone(),
        );
        register_counter(
            r,
            "infera_pd_requests_total",
            "Prefill/decode requests by connector and outcome.",
            self.pd_requests.clone(),
        );
        register_counter(
            r,
            "infera_pd_decode_open_retries_total",
            "Decode legs opened again after failing before their first byte.",
            self.pd_decode_retries.clone(),
        );
        register_counter(
            r,
            "infera_epp_exchanges_total",
            "Endpoint-picker exchanges by result: picked, refused (with the status), failed.",
            self.epp_exchanges.clone(),
        );
        self
    }

    /// An endpoint-picker exchange's result (`picked`, `refused_503`, ..., `failed`).
    pub(crate) fn record_epp_exchange(&self, result: &'static str) {
        self.epp_exchanges
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// A pick of `worker_id` for `role` (`mixed`, `prefill`, `decode`).
    pub(crate) fn record_pick(&self, role: &str, worker_id: &str) {
        self.picks
            .get_or_create(&RoleWorker {
                role: role.to_owned(),
                worker_id: worker_id.to_owned(),
            })
            .inc();
    }

    /// Declares the in-flight gauge of both routers at 0, so a scraper that reads one
    /// series (KEDA's metrics-api scaler, a Prometheus rule) finds it before the first
    /// request of its kind. The serving gateway does this at start; the earlier server's
    /// series, pinned without it, appeared with the first request.
    pub(crate) fn declare_inflight(&self) {
        for router in ["mixed", "disagg"] {
            let _declared = self.inflight.get_or_create(&RouterLabel { router });
        }
    }

    /// A request started on `router`.
    pub(crate) fn request_started(&self, router: &'static str) {
        self.inflight.get_or_create(&RouterLabel { router }).inc();
    }

    /// A request that started ended.
    pub(crate) fn request_finished(
        &self,
        router: &'static str,
        outcome: Outcome,
        started: Instant,
    ) {
        self.inflight.get_or_create(&RouterLabel { router }).dec();
        self.observe_request(router, outcome, started.elapsed().as_secs_f64());
    }

    /// A request that ended before routing (bad input, no worker).
    pub(crate) fn request_rejected(
        &self,
        router: &'static str,
        outcome: Outcome,
        started: Instant,
    ) {
        self.observe_request(router, outcome, started.elapsed().as_secs_f64());
    }

    /// A request's duration.
    pub(crate) fn observe_request(&self, router: &'static str, outcome: Outcome, secs: f64) {
        self.durations
            .get_or_create(&RouterOutcome {
                router,
                outcome: outcome.name(),
            })
            .observe(secs);
    }

    /// Time to the first streamed byte.
    pub(crate) fn observe_ttft(&self, secs: f64) {
        self.ttft.observe(secs);
    }

    /// Gap between streamed writes.
    pub(crate) fn observe_itl(&self, secs: f64) {
        self.itl.observe(secs);
    }

    /// A request carried a cache hint of `retention`.
    pub(crate) fn record_cache_control(&self, retention: &'static str) {
        self.cache_control
            .get_or_create(&[("retention", retention)])
            .inc();
    }

    /// Counts a worker starting to fail its health checks, or passing them again.
    pub(crate) fn record_health_change(&self, failing: bool) {
        let to = if failing { "failing" } else { "passing" };
        self.health_changes.get_or_create(&[("to", to)]).inc();
    }

    /// A request refused by admission control (429).
    pub(crate) fn record_admission_refused(&self) {
        self.admission_refused.inc();
    }

    /// Requests of `model` waiting for a worker of `role` in `class`.
    pub(crate) fn set_flow_queued(
        &self,
        model: &str,
        role: &'static str,
        class: &'static str,
        n: usize,
    ) {
        let labels = QueueLabels {
            class,
            model: model.to_owned(),
            role,
        };
        self.flow_queued.get_or_create(&labels).set(n as i64);
    }

    /// A request left the gateway's queue after `waited` seconds: sent, or shed for
    /// `reason`.
    pub(crate) fn record_flow_wait(
        &self,
        class: &'static str,
        waited: f64,
        shed: Option<&'static str>,
    ) {
        let outcome = if shed.is_some() { "shed" } else { "sent" };
        self.flow_waits
            .get_or_create(&ClassOutcome { class, outcome })
            .observe(waited);
        if let Some(reason) = shed {
            self.flow_shed
                .get_or_create(&ClassReason { class, reason })
                .inc();
        }
    }

    /// A discovery event (`put`, `delete`, `resync`, `watch_error`).
    pub(crate) fn record_discovery(&self, kind: &'static str) {
        self.discovery_events.get_or_create(&[("kind", kind)]).inc();
    }

    /// A worker record that was refused (`invalid_json`, `invalid_record`, `key_mismatch`).
    pub(crate) fn record_rejected_record(&self, reason: &'static str) {
        self.rejected_records
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Leading cache hits of a kv-aware pick.
    pub(crate) fn record_cache_hits(&self, role: &str, hits: usize) {
        self.cache_hits
            .get_or_create(&RoleLabel {
                role: role.to_owned(),
            })
            .observe(hits as f64);
    }

    /// A kv-aware pick for `role`: the request's blocks at the picked worker's block size.
    pub(crate) fn observe_pick_request_blocks(&self, role: &str, blocks: usize) {
        self.pick_request_blocks
            .get_or_create(&RoleLabel {
                role: role.to_owned(),
            })
            .observe(blocks as f64);
    }

    /// A kv-aware pick that ignored cache locality, by reason (`multimodal`).
    pub(crate) fn record_cache_locality_skipped(&self, reason: &'static str) {
        self.locality_skipped
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// A request routed on load only because it produced no block hashes.
    pub(crate) fn record_unhashed(&self, reason: &'static str) {
        self.unhashed.get_or_create(&[("reason", reason)]).inc();
    }

    /// A KV-event batch (or part of it) by outcome: `applied`, `undecodable`,
    /// `unknown_parent`, `block_size_mismatch`, `gap`, ...
    pub(crate) fn record_kv_event(&self, outcome: &'static str) {
        self.kv_events.get_or_create(&[("outcome", outcome)]).inc();
    }

    /// How long a prefill/decode leg took on `worker_id` (`prefill`: until its answer
    /// was read; `decode`: until its response headers).
    pub(crate) fn observe_pd_leg(&self, leg: &'static str, worker_id: &str, secs: f64) {
        self.pd_legs
            .get_or_create(&LegWorker {
                leg,
                worker_id: worker_id.to_owned(),
            })
            .observe(secs);
    }

    /// A prefill/decode request that could not be set up or lost its prefill, by reason.
    pub(crate) fn record_pd_failure(&self, reason: &'static str) {
        self.pd_failures.get_or_create(&[("reason", reason)]).inc();
    }

    /// A generation moved to another worker (`stream_broken`, `worker_draining`).
    pub(crate) fn record_migration(&self, reason: &'static str) {
        self.migrations.get_or_create(&[("reason", reason)]).inc();
    }

    /// A generation that could not move (`no_candidate`, `no_first_byte`, `limit`,
    /// `poisoned`).
    pub(crate) fn record_migration_failed(&self, reason: &'static str) {
        self.migrations_failed
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// How a prefill/decode request ended.
    pub(crate) fn record_pd_request(
        &self,
        protocol: infera_proto::pd::PdProtocol,
        outcome: Outcome,
    ) {
        self.pd_requests
            .get_or_create(&ProtocolOutcome {
                protocol: protocol.as_str(),
                outcome: outcome.name(),
            })
            .inc();
    }

    /// A decode leg was opened again after a failure before its first byte.
    pub(crate) fn record_pd_decode_retry(&self) {
        self.pd_decode_retries.inc();
    }

    /// Forgets a worker's labels.
    pub(crate) fn remove_worker(&self, worker_id: &str) {
        for role in ROLES {
            self.picks.remove(&RoleWorker {
                role: role.to_owned(),
                worker_id: worker_id.to_owned(),
            });
        }
        for leg in LEGS {
            self.pd_legs.remove(&LegWorker {
                leg,
                worker_id: worker_id.to_owned(),
            });
        }
    }

    /// The exposition (OpenMetrics text).
    pub(crate) fn render(&self, workers: &WorkerGauges, kv: Option<KvGauges>) -> String {
        let mut scraped = ScrapeValues::default();
        let worker = |w: &str| vec![("worker_id", w.to_owned())];
        scraped.gauge_family(
            "infera_active_workers",
            "Registered workers taking requests, by disaggregation mode.",
            workers
                .by_mode
                .iter()
                .map(|(mode, n)| (vec![("disagg_mode", (*mode).to_owned())], *n)),
        );
        scraped.gauge_family(
            "infera_router_worker_breaker_state",
            "Breaker state per worker: 0 closed, 1 half-open, 2 open.",
            workers
                .breakers
                .iter()
                .map(|(w, state, _)| (worker(w), *state)),
        );
        scraped.counter_family(
            "infera_router_worker_breaker_trips_total",
            "Times each worker's breaker opened.",
            workers
                .breakers
                .iter()
                .map(|(w, _, trips)| (worker(w), *trips)),
        );
        if let Some(kv) = kv {
            scraped.gauge_family(
                "infera_policy_cache_view_size",
                "Per-worker count of cached blocks in the router's view (route key per data-parallel rank).",
                kv.targets.iter().map(|(t, view, _)| (worker(t), *view)),
            );
            scraped.gauge_family(
                "infera_policy_active_blocks",
                "Per-worker count of distinct in-flight prefix blocks (route key per data-parallel rank).",
                kv.targets.iter().map(|(t, _, active)| (worker(t), *active)),
            );
            scraped.gauge(
                "infera_gateway_prefix_index_blocks",
                "Blocks held in the prefix index.",
                kv.indexed_blocks,
            );
            scraped.gauge(
                "infera_gateway_prefix_index_bytes_per_block",
                "Approximate heap bytes per indexed block.",
                kv.bytes_per_block,
            );
        }
        scraped.gauge(
            "infera_gateway_connections_open",
            "Client connections open (at most --max-connections).",
            self.connections_open.load(Ordering::Relaxed),
        );
        infera_telemetry::metrics::render(&self.registry, scraped)
    }
}

/// Reads `infera_router_picks_total{role, worker_id}` back from a `/metrics` text:
/// `(role, worker_id)` to count. For clients that tell where requests went (`infera up
/// --check`, the end-to-end tests).
pub fn parse_picks(metrics: &str) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("infera_router_picks_total{role=\"") else {
            continue;
        };
        let Some((role, rest)) = rest.split_once("\",worker_id=\"") else {
            continue;
        };
        let Some((worker, count)) = rest.split_once("\"} ") else {
            continue;
        };
        out.insert(
            (role.to_owned(), worker.to_owned()),
            count.trim().parse().unwrap_or(0),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No worker registered: every mode at 0, no breaker.
    fn idle() -> WorkerGauges {
        WorkerGauges {
            by_mode: vec![("mixed", 0), ("prefill", 0), ("decode", 0)],
            breakers: Vec::new(),
        }
    }

    #[test]
    fn both_routers_in_flight_gauges_are_declared_at_zero() {
        let m = Metrics::default();
        m.declare_inflight();
        let text = m.render(&idle(), None);
        for line in [
            "infera_request_inflight{router=\"mixed\"} 0",
            "infera_request_inflight{router=\"disagg\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
    }

    #[test]
    fn gateway_series_and_forgetting_a_worker() {
        let m = Metrics::default();
        m.record_pick("mixed", "a:1");
        m.observe_pd_leg("prefill", "a:1", 0.2);
        m.request_started("mixed");
        m.request_finished("mixed", Outcome::Ok, Instant::now());
        m.observe_ttft(0.003);
        m.observe_ttft(0.26);
        m.record_kv_event("applied");
        let text = m.render(&idle(), None);
        for line in [
            "# TYPE infera_router_picks counter",
            "infera_router_picks_total{role=\"mixed\",worker_id=\"a:1\"} 1",
            "infera_request_inflight{router=\"mixed\"} 0",
            "infera_request_duration_seconds_count{outcome=\"ok\",router=\"mixed\"} 1",
            "infera_gateway_ttft_seconds_bucket{le=\"0.0025\"} 0",
            "infera_gateway_ttft_seconds_bucket{le=\"0.005\"} 1",
            // Dense where latency targets are set.
            "infera_gateway_ttft_seconds_bucket{le=\"0.25\"} 1",
            "infera_gateway_ttft_seconds_bucket{le=\"0.3\"} 2",
            "infera_gateway_kv_events_total{outcome=\"applied\"} 1",
            "infera_active_workers{disagg_mode=\"mixed\"} 0",
            "infera_gateway_connections_open 0",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        assert!(
            !text.contains("infera_policy_cache_view_size"),
            "kv-aware only"
        );
        assert_eq!(parse_picks(&text).len(), 1);
        m.remove_worker("a:1");
        let text = m.render(&idle(), None);
        assert!(!text.contains("a:1"), "{text}");
    }
}
