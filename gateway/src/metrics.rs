//! Gateway metrics in the Prometheus text format, under the exact names the earlier
//! system's dashboards use (`infera_router_picks_total`, `infera_request_duration_seconds`,
//! ...: written verbatim, no suffixes added), plus TTFT and inter-token latency
//! histograms. Labels are bounded: roles, outcomes, worker ids (removed with the worker).
//! Bucket bounds are written as the earlier exporter (`prometheus_client`) wrote them:
//! `le="1.0"`, `le="0.005"`, `le="+Inf"`.

use crate::breaker::Breakers;
use crate::registry::Snapshot;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Latency buckets (seconds).
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Buckets of `infera_router_pick_request_blocks`, the earlier server's (`+Inf` implied).
const REQUEST_BLOCK_BUCKETS: [f64; 13] = [
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Default for Histogram {
    /// A latency histogram.
    fn default() -> Self {
        Self::with_bounds(&LATENCY_BUCKETS)
    }
}

/// A bucket bound as Python's `prometheus_client` writes it (`1.0`, not `1`).
fn format_bound(bound: f64) -> String {
    if bound.fract() == 0.0 && bound.is_finite() {
        format!("{bound:.1}")
    } else {
        bound.to_string()
    }
}

impl Histogram {
    fn with_bounds(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{}\"}} {cumulative}",
                format_bound(*bound)
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// How a request ended, for `infera_request_duration_seconds{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
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
    pub fn name(self) -> &'static str {
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

#[derive(Debug, Default)]
struct Inner {
    picks: BTreeMap<(String, String), u64>,
    durations: BTreeMap<(&'static str, Outcome), Histogram>,
    inflight: BTreeMap<&'static str, i64>,
    ttft: Histogram,
    itl: Histogram,
    cache_control: BTreeMap<&'static str, u64>,
    discovery_events: BTreeMap<&'static str, u64>,
    rejected_records: BTreeMap<&'static str, u64>,
    cache_hits: BTreeMap<String, u64>,
    pick_request_blocks: BTreeMap<String, Histogram>,
    locality_skipped: BTreeMap<&'static str, u64>,
    unhashed: BTreeMap<&'static str, u64>,
    kv_events: BTreeMap<&'static str, u64>,
    pd_legs: BTreeMap<&'static str, Histogram>,
    pd_failures: BTreeMap<&'static str, u64>,
    pd_requests: BTreeMap<(&'static str, Outcome), u64>,
    pd_decode_retries: u64,
    admission_refused: u64,
    health_changes: BTreeMap<&'static str, u64>,
}

/// kv-aware gauges read at render time.
#[derive(Debug, Clone, Default)]
pub struct KvGauges {
    /// Distinct in-flight blocks.
    pub active_blocks: usize,
    /// Blocks in the prefix index.
    pub indexed_blocks: usize,
    /// Heap bytes per indexed block.
    pub bytes_per_block: f64,
    /// Blocks in the router's view of each target (route key), draining ones included.
    pub view_sizes: Vec<(String, usize)>,
}

/// The gateway's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    /// Client connections open now (the HTTP server counts them).
    pub connections_open: Arc<AtomicUsize>,
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Inner)) {
        if let Ok(mut inner) = self.inner.lock() {
            f(&mut inner);
        }
    }

    /// A pick of `worker_id` for `role` (`mixed`, `prefill`, `decode`).
    pub fn record_pick(&self, role: &str, worker_id: &str) {
        self.with(|m| {
            *m.picks
                .entry((role.to_owned(), worker_id.to_owned()))
                .or_default() += 1
        });
    }

    /// A request started on `router`.
    pub fn request_started(&self, router: &'static str) {
        self.with(|m| *m.inflight.entry(router).or_default() += 1);
    }

    /// A request that started ended.
    pub fn request_finished(&self, router: &'static str, outcome: Outcome, started: Instant) {
        let secs = started.elapsed().as_secs_f64();
        self.with(|m| {
            *m.inflight.entry(router).or_default() -= 1;
            m.durations
                .entry((router, outcome))
                .or_default()
                .observe(secs);
        });
    }

    /// A request that ended before routing (bad input, no worker).
    pub fn request_rejected(&self, router: &'static str, outcome: Outcome, started: Instant) {
        let secs = started.elapsed().as_secs_f64();
        self.with(|m| {
            m.durations
                .entry((router, outcome))
                .or_default()
                .observe(secs)
        });
    }

    /// Time to the first streamed byte.
    pub fn observe_ttft(&self, secs: f64) {
        self.with(|m| m.ttft.observe(secs));
    }

    /// Gap between streamed chunks.
    pub fn observe_itl(&self, secs: f64) {
        self.with(|m| m.itl.observe(secs));
    }

    /// A request carried a cache hint of `retention`.
    pub fn record_cache_control(&self, retention: &'static str) {
        self.with(|m| *m.cache_control.entry(retention).or_default() += 1);
    }

    /// Counts a worker starting to fail its health checks, or passing them again.
    pub fn record_health_change(&self, failing: bool) {
        let to = if failing { "failing" } else { "passing" };
        self.with(|m| *m.health_changes.entry(to).or_insert(0) += 1);
    }

    /// A request refused by admission control (429).
    pub fn record_admission_refused(&self) {
        self.with(|m| m.admission_refused += 1);
    }

    /// A discovery event (`put`, `delete`, `resync`, `watch_error`).
    pub fn record_discovery(&self, kind: &'static str) {
        self.with(|m| *m.discovery_events.entry(kind).or_default() += 1);
    }

    /// A worker record that was refused (`invalid_json`, `invalid_record`, `key_mismatch`).
    pub fn record_rejected_record(&self, reason: &'static str) {
        self.with(|m| *m.rejected_records.entry(reason).or_default() += 1);
    }

    /// Leading cache hits of a kv-aware pick.
    pub fn record_cache_hits(&self, role: &str, hits: usize) {
        self.with(|m| *m.cache_hits.entry(role.to_owned()).or_default() += hits as u64);
    }

    /// A kv-aware pick for `role`: the request's blocks at the picked worker's block size.
    pub fn observe_pick_request_blocks(&self, role: &str, blocks: usize) {
        self.with(|m| {
            m.pick_request_blocks
                .entry(role.to_owned())
                .or_insert_with(|| Histogram::with_bounds(&REQUEST_BLOCK_BUCKETS))
                .observe(blocks as f64)
        });
    }

    /// A kv-aware pick that ignored cache locality, by reason (`multimodal`).
    pub fn record_cache_locality_skipped(&self, reason: &'static str) {
        self.with(|m| *m.locality_skipped.entry(reason).or_default() += 1);
    }

    /// A request routed on load only because it produced no block hashes.
    pub fn record_unhashed(&self, reason: &'static str) {
        self.with(|m| *m.unhashed.entry(reason).or_default() += 1);
    }

    /// A KV-event batch (or part of it) by outcome: `applied`, `undecodable`,
    /// `unknown_parent`, `block_size_mismatch`, `gap`, ...
    pub fn record_kv_event(&self, outcome: &'static str) {
        self.with(|m| *m.kv_events.entry(outcome).or_default() += 1);
    }

    /// How long a prefill/decode leg took (`prefill`: until its answer was read;
    /// `decode`: until its response headers).
    pub fn observe_pd_leg(&self, leg: &'static str, secs: f64) {
        self.with(|m| m.pd_legs.entry(leg).or_default().observe(secs));
    }

    /// A prefill/decode request that could not be set up or lost its prefill, by reason.
    pub fn record_pd_failure(&self, reason: &'static str) {
        self.with(|m| *m.pd_failures.entry(reason).or_default() += 1);
    }

    /// How a prefill/decode request ended.
    pub fn record_pd_request(&self, protocol: infera_proto::pd::PdProtocol, outcome: Outcome) {
        self.with(|m| {
            *m.pd_requests
                .entry((protocol.as_str(), outcome))
                .or_default() += 1
        });
    }

    /// A decode leg was opened again after a failure before its first byte.
    pub fn record_pd_decode_retry(&self) {
        self.with(|m| m.pd_decode_retries += 1);
    }

    /// Forgets a worker's labels.
    pub fn remove_worker(&self, worker_id: &str) {
        self.with(|m| m.picks.retain(|(_, w), _| w != worker_id));
    }

    /// The text exposition.
    pub fn render(&self, snapshot: &Snapshot, breakers: &Breakers, kv: Option<KvGauges>) -> String {
        let mut out = String::new();
        let Ok(m) = self.inner.lock() else { return out };
        header(
            &mut out,
            "infera_router_picks_total",
            "counter",
            "Routing picks per role and worker.",
        );
        for ((role, worker), n) in &m.picks {
            let _ = writeln!(
                out,
                "infera_router_picks_total{{role=\"{role}\",worker_id=\"{worker}\"}} {n}"
            );
        }
        header(
            &mut out,
            "infera_request_duration_seconds",
            "histogram",
            "Request duration by router and outcome.",
        );
        for ((router, outcome), h) in &m.durations {
            h.render(
                &mut out,
                "infera_request_duration_seconds",
                &format!("router=\"{router}\",outcome=\"{}\"", outcome.name()),
            );
        }
        header(
            &mut out,
            "infera_request_inflight",
            "gauge",
            "Requests in flight by router.",
        );
        for (router, n) in &m.inflight {
            let _ = writeln!(out, "infera_request_inflight{{router=\"{router}\"}} {n}");
        }
        header(
            &mut out,
            "infera_active_workers",
            "gauge",
            "Registered workers by disaggregation mode.",
        );
        for (mode, n) in snapshot.count_by_mode() {
            let mode = mode.as_str();
            let _ = writeln!(out, "infera_active_workers{{disagg_mode=\"{mode}\"}} {n}");
        }
        let now = Instant::now();
        let all = breakers.all();
        header(
            &mut out,
            "infera_router_worker_breaker_state",
            "gauge",
            "Breaker state per worker: 0 closed, 1 open, 2 half-open.",
        );
        for (worker, b) in &all {
            let _ = writeln!(
                out,
                "infera_router_worker_breaker_state{{worker_id=\"{worker}\"}} {}",
                b.state(now).gauge()
            );
        }
        header(
            &mut out,
            "infera_router_worker_breaker_trips_total",
            "counter",
            "Times each worker's breaker opened.",
        );
        for (worker, b) in &all {
            let _ = writeln!(
                out,
                "infera_router_worker_breaker_trips_total{{worker_id=\"{worker}\"}} {}",
                b.trips()
            );
        }
        header(
            &mut out,
            "infera_cache_control_seen_total",
            "counter",
            "Requests carrying a cache retention hint, by class.",
        );
        for (retention, n) in &m.cache_control {
            let _ = writeln!(
                out,
                "infera_cache_control_seen_total{{retention=\"{retention}\"}} {n}"
            );
        }
        header(
            &mut out,
            "infera_router_pick_cache_hits",
            "counter",
            "Prefix blocks already cached on the picked worker, summed over kv-aware picks.",
        );
        for (role, n) in &m.cache_hits {
            let _ = writeln!(out, "infera_router_pick_cache_hits{{role=\"{role}\"}} {n}");
        }
        header(
            &mut out,
            "infera_router_pick_request_blocks",
            "histogram",
            "Total request block count seen at pick time.",
        );
        for (role, h) in &m.pick_request_blocks {
            h.render(
                &mut out,
                "infera_router_pick_request_blocks",
                &format!("role=\"{role}\""),
            );
        }
        header(
            &mut out,
            "infera_cache_locality_skipped_total",
            "counter",
            "kv-aware picks that ignored cache locality (weight 0), by reason.",
        );
        for (reason, n) in &m.locality_skipped {
            let _ = writeln!(
                out,
                "infera_cache_locality_skipped_total{{reason=\"{reason}\"}} {n}"
            );
        }
        if let Some(kv) = kv {
            header(
                &mut out,
                "infera_policy_cache_view_size",
                "gauge",
                "Per-worker count of cached blocks in the router's view (route key per data-parallel rank).",
            );
            for (target, blocks) in &kv.view_sizes {
                let _ = writeln!(
                    out,
                    "infera_policy_cache_view_size{{worker_id=\"{target}\"}} {blocks}"
                );
            }
            header(
                &mut out,
                "infera_policy_active_blocks",
                "gauge",
                "Distinct in-flight prefix blocks over all workers.",
            );
            let _ = writeln!(out, "infera_policy_active_blocks {}", kv.active_blocks);
            header(
                &mut out,
                "infera_gateway_prefix_index_blocks",
                "gauge",
                "Blocks held in the prefix index.",
            );
            let _ = writeln!(
                out,
                "infera_gateway_prefix_index_blocks {}",
                kv.indexed_blocks
            );
            header(
                &mut out,
                "infera_gateway_prefix_index_bytes_per_block",
                "gauge",
                "Approximate heap bytes per indexed block.",
            );
            let _ = writeln!(
                out,
                "infera_gateway_prefix_index_bytes_per_block {:.1}",
                kv.bytes_per_block
            );
        }
        header(
            &mut out,
            "infera_gateway_requests_without_blocks_total",
            "counter",
            "kv-aware requests routed on load only, by reason.",
        );
        for (reason, n) in &m.unhashed {
            let _ = writeln!(
                out,
                "infera_gateway_requests_without_blocks_total{{reason=\"{reason}\"}} {n}"
            );
        }
        header(
            &mut out,
            "infera_gateway_kv_events_total",
            "counter",
            "KV-event batches and skipped events, by outcome.",
        );
        for (outcome, n) in &m.kv_events {
            let _ = writeln!(
                out,
                "infera_gateway_kv_events_total{{outcome=\"{outcome}\"}} {n}"
            );
        }
        header(
            &mut out,
            "infera_gateway_ttft_seconds",
            "histogram",
            "Time from request to the first response byte from the worker.",
        );
        m.ttft.render(&mut out, "infera_gateway_ttft_seconds", "");
        header(
            &mut out,
            "infera_gateway_itl_seconds",
            "histogram",
            "Time between streamed chunks.",
        );
        m.itl.render(&mut out, "infera_gateway_itl_seconds", "");
        header(
            &mut out,
            "infera_gateway_admission_refused_total",
            "counter",
            "Requests refused with 429 at --max-concurrent-requests.",
        );
        let _ = writeln!(
            out,
            "infera_gateway_admission_refused_total {}",
            m.admission_refused
        );
        header(
            &mut out,
            "infera_gateway_health_changes_total",
            "counter",
            "Workers that started failing their health checks, or passing them again.",
        );
        for (to, n) in &m.health_changes {
            let _ = writeln!(
                out,
                "infera_gateway_health_changes_total{{to=\"{to}\"}} {n}"
            );
        }
        header(
            &mut out,
            "infera_gateway_connections_open",
            "gauge",
            "Client connections open (at most --max-connections).",
        );
        let _ = writeln!(
            out,
            "infera_gateway_connections_open {}",
            self.connections_open.load(Ordering::Relaxed)
        );
        header(
            &mut out,
            "infera_gateway_discovery_events_total",
            "counter",
            "Discovery events by kind.",
        );
        for (kind, n) in &m.discovery_events {
            let _ = writeln!(
                out,
                "infera_gateway_discovery_events_total{{kind=\"{kind}\"}} {n}"
            );
        }
        header(
            &mut out,
            "infera_gateway_rejected_worker_records_total",
            "counter",
            "Worker records refused, by reason.",
        );
        for (reason, n) in &m.rejected_records {
            let _ = writeln!(
                out,
                "infera_gateway_rejected_worker_records_total{{reason=\"{reason}\"}} {n}"
            );
        }
        render_pd(&mut out, &m);
        out
    }
}

fn render_pd(out: &mut String, m: &Inner) {
    header(
        out,
        "infera_pd_dispatch_duration_seconds",
        "histogram",
        "Prefill/decode legs: prefill until its answer was read, decode until its headers.",
    );
    for (leg, h) in &m.pd_legs {
        h.render(
            out,
            "infera_pd_dispatch_duration_seconds",
            &format!("leg=\"{leg}\""),
        );
    }
    header(
        out,
        "infera_pd_bootstrap_failures_total",
        "counter",
        "Prefill/decode requests that failed to set up or lost their prefill, by reason.",
    );
    for (reason, n) in &m.pd_failures {
        let _ = writeln!(
            out,
            "infera_pd_bootstrap_failures_total{{reason=\"{reason}\"}} {n}"
        );
    }
    header(
        out,
        "infera_pd_requests_total",
        "counter",
        "Prefill/decode requests by connector and outcome.",
    );
    for ((protocol, outcome), n) in &m.pd_requests {
        let _ = writeln!(
            out,
            "infera_pd_requests_total{{protocol=\"{protocol}\",outcome=\"{}\"}} {n}",
            outcome.name()
        );
    }
    header(
        out,
        "infera_pd_decode_open_retries_total",
        "counter",
        "Decode legs opened again after failing before their first byte.",
    );
    let _ = writeln!(
        out,
        "infera_pd_decode_open_retries_total {}",
        m.pd_decode_retries
    );
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

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_and_histogram_shape() {
        let m = Metrics::default();
        m.record_pick("mixed", "a:1");
        m.request_started("mixed");
        m.request_finished("mixed", Outcome::Ok, Instant::now());
        m.observe_ttft(0.003);
        let text = m.render(&Snapshot::default(), &Breakers::default(), None);
        assert!(text.contains("infera_router_picks_total{role=\"mixed\",worker_id=\"a:1\"} 1\n"));
        assert!(text.contains("infera_request_inflight{router=\"mixed\"} 0\n"));
        assert!(text.contains(
            "infera_request_duration_seconds_count{router=\"mixed\",outcome=\"ok\"} 1\n"
        ));
        assert!(text.contains("infera_gateway_ttft_seconds_bucket{le=\"0.0025\"} 0\n"));
        assert!(text.contains("infera_gateway_ttft_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("infera_active_workers{disagg_mode=\"mixed\"} 0\n"));
        m.remove_worker("a:1");
        assert!(
            !m.render(&Snapshot::default(), &Breakers::default(), None)
                .contains("a:1")
        );
    }

    #[test]
    fn the_earlier_servers_pick_blocks_view_size_and_locality_series() {
        let m = Metrics::default();
        m.observe_pick_request_blocks("mixed", 0);
        m.observe_pick_request_blocks("mixed", 3);
        m.observe_pick_request_blocks("prefill", 5000);
        m.record_cache_locality_skipped("multimodal");
        m.record_cache_locality_skipped("multimodal");
        let kv = KvGauges {
            view_sizes: vec![("h:1#dp0".into(), 4), ("h:1#dp1".into(), 0)],
            ..KvGauges::default()
        };
        let text = m.render(&Snapshot::default(), &Breakers::default(), Some(kv));
        for line in [
            "# TYPE infera_router_pick_request_blocks histogram",
            "infera_router_pick_request_blocks_bucket{role=\"mixed\",le=\"0.0\"} 1",
            "infera_router_pick_request_blocks_bucket{role=\"mixed\",le=\"2.0\"} 1",
            "infera_router_pick_request_blocks_bucket{role=\"mixed\",le=\"4.0\"} 2",
            "infera_router_pick_request_blocks_bucket{role=\"mixed\",le=\"+Inf\"} 2",
            "infera_router_pick_request_blocks_count{role=\"mixed\"} 2",
            "infera_router_pick_request_blocks_bucket{role=\"prefill\",le=\"2048.0\"} 0",
            "infera_router_pick_request_blocks_bucket{role=\"prefill\",le=\"+Inf\"} 1",
            "# TYPE infera_cache_locality_skipped_total counter",
            "infera_cache_locality_skipped_total{reason=\"multimodal\"} 2",
            "# TYPE infera_policy_cache_view_size gauge",
            "infera_policy_cache_view_size{worker_id=\"h:1#dp0\"} 4",
            "infera_policy_cache_view_size{worker_id=\"h:1#dp1\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        let bounds: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("infera_router_pick_request_blocks_bucket{role=\"mixed\",le=\"")
            })
            .filter_map(|l| l.split('"').next())
            .collect();
        assert_eq!(
            bounds,
            [
                "0.0", "1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0",
                "512.0", "1024.0", "2048.0", "+Inf"
            ],
            "the earlier server's buckets"
        );
        let round_robin = m.render(&Snapshot::default(), &Breakers::default(), None);
        assert!(
            !round_robin.contains("infera_policy_cache_view_size"),
            "kv-aware only"
        );
    }
}
