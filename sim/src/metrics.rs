//! `/metrics` with the imitated engine's metric names (`vllm:num_requests_running`,
//! `vllm:cache_config_info{block_size=...}`, `sglang:num_running_reqs`, ...), so
//! sidecars and dashboards read the simulator as they read a real engine. Every value
//! is read at scrape time and written through `prometheus-client`
//! ([`infera_telemetry::metrics`]).

use crate::state::WorkerState;
use infera_proto::worker::EngineKind;
use infera_telemetry::metrics::{Labels, ScrapeValues};
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;

/// Renders the worker's metrics.
pub fn render_metrics(s: &WorkerState) -> String {
    let stats = s
        .engine
        .counters
        .stats
        .lock()
        .map(|g| *g)
        .unwrap_or_default();
    let c = &s.engine.counters;
    let usage = if stats.total_blocks == 0 {
        0.0
    } else {
        stats.used_blocks as f64 / stats.total_blocks as f64
    };
    let model = || -> Labels { vec![("model_name", s.model.clone())] };
    let (running, waiting, usage_name) = s.flavor.load_metric_names();
    let mut out = ScrapeValues::default();
    let gauge = |out: &mut ScrapeValues, name: &str, help: &str, v: f64| {
        out.gauge_family(name, help, [(model(), v)]);
    };
    gauge(
        &mut out,
        running,
        "Requests running on the engine.",
        stats.running as f64,
    );
    gauge(
        &mut out,
        waiting,
        "Requests waiting to be scheduled.",
        stats.waiting as f64,
    );
    gauge(
        &mut out,
        usage_name,
        "Fraction of KV cache blocks in use.",
        usage,
    );
    let counter = |out: &mut ScrapeValues, name: &str, help: &str, v: u64| {
        out.counter_family(name, help, [(model(), v)]);
    };
    let prompt = c.prompt_tokens.load(Ordering::Relaxed);
    let generated = c.generation_tokens.load(Ordering::Relaxed);
    let finished = c.finished.load(Ordering::Relaxed);
    match s.flavor.0 {
        EngineKind::Vllm | EngineKind::Atom => {
            gauge(
                &mut out,
                "vllm:gpu_cache_usage_perc",
                "Fraction of KV cache blocks in use (legacy name).",
                usage,
            );
            let info = vec![
                ("block_size", s.block_size.to_string()),
                ("num_gpu_blocks", stats.total_blocks.to_string()),
                ("cache_dtype", "fp8".to_owned()),
                ("enable_prefix_caching", "True".to_owned()),
            ];
            out.gauge_family(
                "vllm:cache_config_info",
                "Information of the KV cache configuration.",
                [(info, 1.0)],
            );
            for (name, help, v) in [
                (
                    "vllm:prefix_cache_queries_total",
                    "Prompt tokens looked up in the prefix cache.",
                    stats.prefix_queries_tokens,
                ),
                (
                    "vllm:prefix_cache_hits_total",
                    "Prompt tokens found in the prefix cache.",
                    stats.prefix_hit_tokens,
                ),
                (
                    "vllm:prompt_tokens_total",
                    "Prompt tokens processed.",
                    prompt,
                ),
                (
                    "vllm:generation_tokens_total",
                    "Tokens generated.",
                    generated,
                ),
                ("vllm:request_success_total", "Requests finished.", finished),
                (
                    "vllm:num_preemptions_total",
                    "Requests preempted.",
                    stats.preemptions,
                ),
            ] {
                counter(&mut out, name, help, v);
            }
        }
        EngineKind::Sglang => {
            let hit_rate = if stats.prefix_queries_tokens == 0 {
                0.0
            } else {
                stats.prefix_hit_tokens as f64 / stats.prefix_queries_tokens as f64
            };
            gauge(
                &mut out,
                "sglang:cache_hit_rate",
                "Prefix cache hit rate.",
                hit_rate,
            );
            for (name, help, v) in [
                (
                    "sglang:prompt_tokens_total",
                    "Prompt tokens processed.",
                    prompt,
                ),
                (
                    "sglang:generation_tokens_total",
                    "Tokens generated.",
                    generated,
                ),
                ("sglang:num_requests_total", "Requests finished.", finished),
            ] {
                counter(&mut out, name, help, v);
            }
        }
    }
    counter(
        &mut out,
        "infera_sim_evictions_total",
        "Cached KV blocks evicted.",
        stats.evictions,
    );
    counter(
        &mut out,
        "infera_sim_aborted_requests_total",
        "Requests aborted because the client went away.",
        c.aborted.load(Ordering::Relaxed),
    );
    if let Some(kvd) = &s.kvd {
        let k = &kvd.counters;
        let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
        let with = |name: &'static str, value: &str| -> Labels {
            let mut l = model();
            l.push((name, value.to_owned()));
            l
        };
        out.counter_family(
            "infera_sim_kvd_lookups_total",
            "Prompts looked up in kvd by the KV connector, by outcome: blocks found, none found, kvd unavailable (the prompt is computed).",
            [
                (with("outcome", "hit"), load(&k.lookups_hit)),
                (with("outcome", "miss"), load(&k.lookups_miss)),
                (with("outcome", "unavailable"), load(&k.lookups_unavailable)),
            ],
        );
        out.counter_family(
            "infera_sim_kvd_loaded_tokens_total",
            "Prompt tokens loaded from below HBM instead of computed, by tier.",
            ["host", "disk", "remote"]
                .into_iter()
                .zip(stats.loaded_tokens)
                .map(|(tier, v)| (with("tier", tier), v)),
        );
        counter(
            &mut out,
            "infera_sim_kvd_recomputed_tokens_total",
            "Prompt tokens found below HBM but computed, loading them being slower.",
            stats.recomputed_lower_tokens,
        );
        counter(
            &mut out,
            "infera_sim_kvd_stored_blocks_total",
            "Blocks kvd accepted from finished requests.",
            load(&k.stored_blocks),
        );
        counter(
            &mut out,
            "infera_sim_kvd_payload_mismatches_total",
            "Blocks read back from kvd that did not hold their bytes.",
            load(&k.payload_mismatches),
        );
        gauge(
            &mut out,
            "infera_sim_kvd_up",
            "Whether kvd answers the KV connector.",
            f64::from(u8::from(k.up.load(Ordering::Relaxed))),
        );
    }
    infera_telemetry::metrics::render(&Registry::default(), out)
}
