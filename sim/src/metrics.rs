//! `/metrics` in the Prometheus text format, with the imitated engine's metric names
//! (`vllm:num_requests_running`, `vllm:cache_config_info{block_size=...}`,
//! `sglang:num_running_reqs`, ...), so sidecars and dashboards read the simulator as
//! they read a real engine.

use crate::api::WorkerState;
use infera_proto::worker::EngineKind;
use std::fmt::Write;
use std::sync::atomic::Ordering;

fn metric(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{{{labels}}} {value}");
}

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
    let model = format!("model_name=\"{}\"", s.model);
    let (running, waiting, usage_name) = s.flavor.load_metric_names();
    let mut out = String::new();
    metric(
        &mut out,
        running,
        "gauge",
        "Requests running on the engine.",
        &model,
        stats.running as f64,
    );
    metric(
        &mut out,
        waiting,
        "gauge",
        "Requests waiting to be scheduled.",
        &model,
        stats.waiting as f64,
    );
    metric(
        &mut out,
        usage_name,
        "gauge",
        "Fraction of KV cache blocks in use.",
        &model,
        usage,
    );
    let prompt = c.prompt_tokens.load(Ordering::Relaxed) as f64;
    let generated = c.generation_tokens.load(Ordering::Relaxed) as f64;
    let finished = c.finished.load(Ordering::Relaxed) as f64;
    match s.flavor.0 {
        EngineKind::Vllm | EngineKind::Atom => {
            metric(
                &mut out,
                "vllm:gpu_cache_usage_perc",
                "gauge",
                "Fraction of KV cache blocks in use (legacy name).",
                &model,
                usage,
            );
            let info = format!(
                "block_size=\"{}\",num_gpu_blocks=\"{}\",cache_dtype=\"fp8\",enable_prefix_caching=\"True\"",
                s.block_size, stats.total_blocks
            );
            metric(
                &mut out,
                "vllm:cache_config_info",
                "gauge",
                "Information of the KV cache configuration.",
                &info,
                1.0,
            );
            metric(
                &mut out,
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prompt tokens looked up in the prefix cache.",
                &model,
                stats.prefix_queries_tokens as f64,
            );
            metric(
                &mut out,
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prompt tokens found in the prefix cache.",
                &model,
                stats.prefix_hit_tokens as f64,
            );
            metric(
                &mut out,
                "vllm:prompt_tokens_total",
                "counter",
                "Prompt tokens processed.",
                &model,
                prompt,
            );
            metric(
                &mut out,
                "vllm:generation_tokens_total",
                "counter",
                "Tokens generated.",
                &model,
                generated,
            );
            metric(
                &mut out,
                "vllm:request_success_total",
                "counter",
                "Requests finished.",
                &model,
                finished,
            );
            metric(
                &mut out,
                "vllm:num_preemptions_total",
                "counter",
                "Requests preempted.",
                &model,
                stats.preemptions as f64,
            );
        }
        EngineKind::Sglang => {
            let hit_rate = if stats.prefix_queries_tokens == 0 {
                0.0
            } else {
                stats.prefix_hit_tokens as f64 / stats.prefix_queries_tokens as f64
            };
            metric(
                &mut out,
                "sglang:cache_hit_rate",
                "gauge",
                "Prefix cache hit rate.",
                &model,
                hit_rate,
            );
            metric(
                &mut out,
                "sglang:prompt_tokens_total",
                "counter",
                "Prompt tokens processed.",
                &model,
                prompt,
            );
            metric(
                &mut out,
                "sglang:generation_tokens_total",
                "counter",
                "Tokens generated.",
                &model,
                generated,
            );
            metric(
                &mut out,
                "sglang:num_requests_total",
                "counter",
                "Requests finished.",
                &model,
                finished,
            );
        }
    }
    metric(
        &mut out,
        "infera_sim_evictions_total",
        "counter",
        "Cached KV blocks evicted.",
        &model,
        stats.evictions as f64,
    );
    metric(
        &mut out,
        "infera_sim_aborted_requests_total",
        "counter",
        "Requests aborted because the client went away.",
        &model,
        c.aborted.load(Ordering::Relaxed) as f64,
    );
    out
}
