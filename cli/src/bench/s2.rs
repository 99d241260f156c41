//! S2 shared-prefix routing: every policy on a fresh fleet at each arrival rate; TTFT,
//! throughput, cluster hit ratio against the oracle, load spread.

use super::Ctx;
use super::cpu::threads_cpu;
use super::driver::{Outcome, open_loop};
use super::fleet::{Fleet, MODEL, SimSpec};
use super::stats::{quantile, spread, summary};
use super::under_test::{UnderTest, fleet_setup};
use super::workload::{oracle_hit_ratio, shared_prefix};
use anyhow::Result;
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Instant;

/// Sizes of S2.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    workers: usize,
    kv_tokens_per_worker: usize,
    groups: usize,
    prompts_per_group: usize,
    system_tokens: usize,
    question_tokens: usize,
    output_tokens: usize,
    /// Arrival rates (H200-equivalent req/s).
    pub rates: Vec<f64>,
    speedup: f64,
    /// Goodput counts requests with TTFT at most this (H200-equivalent s)...
    #[serde(default = "default_ttft_slo")]
    pub ttft_slo_s: f64,
    /// ...and a mean gap between tokens at most this.
    #[serde(default = "default_itl_slo")]
    pub itl_slo_s: f64,
}

fn default_ttft_slo() -> f64 {
    2.0
}

fn default_itl_slo() -> f64 {
    0.05
}

/// Whether a request met the latency targets (times measured at `speedup`).
fn good(o: &Outcome, size: &Size) -> bool {
    let mean_itl = if o.itls.is_empty() {
        0.0
    } else {
        o.itls.iter().sum::<f64>() / o.itls.len() as f64
    };
    o.ok && o.ttft.is_some_and(|t| t * size.speedup <= size.ttft_slo_s)
        && mean_itl * size.speedup <= size.itl_slo_s
}

/// Runs S2.
pub async fn run(ctx: &Ctx, size: &Size, policies: &[String], profile: &str) -> Result<Value> {
    let client = super::driver::client()?;
    let runs = ladder("s2", &client, ctx, size, policies, profile).await?;
    Ok(json!({"verdicts": verdicts(&runs), "runs": runs}))
}

/// Runs every policy at every rate of `size` on a fresh fleet each (S2, and S8's
/// ladder); one JSON row per run.
pub async fn ladder(
    scenario: &str,
    client: &reqwest::Client,
    ctx: &Ctx,
    size: &Size,
    policies: &[String],
    profile: &str,
) -> Result<Vec<Value>> {
    let requests = shared_prefix(
        ctx.seed,
        size.groups,
        size.prompts_per_group,
        size.system_tokens,
        size.question_tokens,
    );
    let capacity = size.workers * size.kv_tokens_per_worker;
    let oracle = oracle_hit_ratio(&requests, size.system_tokens, 16, capacity);
    let bodies: Vec<Value> = requests
        .iter()
        .map(|r| {
            json!({"model": MODEL, "prompt": r.prompt, "max_tokens": size.output_tokens,
                        "stream": true, "stream_options": {"include_usage": true}})
        })
        .collect();
    let mut runs = Vec::new();
    for &rate in &size.rates {
        for policy in policies {
            let (flags, gateways, kv_events) = fleet_setup(policy)?;
            let sims: Vec<SimSpec> = (0..size.workers)
                .map(|_| SimSpec {
                    kv_blocks: size.kv_tokens_per_worker / 16,
                    speedup: size.speedup,
                    profile: profile.to_owned(),
                    pd: None,
                    kv_events,
                    transfer_gbytes_per_s: 170.0,
                })
                .collect();
            let fleet = Fleet::start(&sims, gateways, &flags).await?;
            let mut router = UnderTest::start(
                policy,
                &ctx.peers,
                &fleet,
                ctx.pin.as_ref(),
                "/v1/completions",
            )
            .await?;
            let (drv0, sim0, t0) = (
                threads_cpu("infera-drv"),
                threads_cpu("infera-sim"),
                Instant::now(),
            );
            let label = format!("{scenario} {policy} @ {rate}/s");
            let outcomes = open_loop(
                client,
                &router.urls,
                bodies.clone(),
                rate * size.speedup,
                ctx.seed,
                &label,
            )
            .await;
            let wall = t0.elapsed().as_secs_f64();
            let router_cpu = router.take_cpu();
            router.stop().await;
            let sim_cpu = threads_cpu("infera-sim").saturating_sub(sim0).as_secs_f64();
            let driver_cpu = threads_cpu("infera-drv").saturating_sub(drv0).as_secs_f64();
            let served: Vec<f64> = fleet.served().into_iter().map(|n| n as f64).collect();
            fleet.shutdown().await;
            let ok: Vec<_> = outcomes.iter().filter(|o| o.ok).collect();
            // Goodput: the arrival rate times the share of requests that met the targets.
            let good_share = outcomes.iter().filter(|o| good(o, size)).count() as f64
                / outcomes.len().max(1) as f64;
            let ttft: Vec<f64> = ok.iter().filter_map(|o| o.ttft).collect();
            let itl: Vec<f64> = ok.iter().flat_map(|o| o.itls.iter().copied()).collect();
            let prompt: u64 = ok.iter().map(|o| o.prompt_tokens).sum();
            let cached: u64 = ok.iter().map(|o| o.cached_tokens).sum();
            let output: u64 = ok.iter().map(|o| o.output_tokens).sum();
            let hit = if prompt == 0 {
                0.0
            } else {
                cached as f64 / prompt as f64
            };
            runs.push(json!({
                "policy": policy,
                "rate": rate,
                "requests": outcomes.len(),
                "errors": outcomes.len() - ok.len(),
                "ttft_s": summary(&ttft, size.speedup),
                "itl_s": summary(&itl, size.speedup),
                "output_tok_per_s": output as f64 / (wall * size.speedup),
                "hit_ratio": hit,
                "oracle_hit_ratio": oracle,
                "hit_vs_oracle": if oracle > 0.0 { hit / oracle } else { 0.0 },
                "load_spread": spread(&served),
                "requests_per_worker": served,
                "gateway_cpu_us_per_request": router_cpu * 1e6 / outcomes.len().max(1) as f64,
                "router_cpu_share": router_cpu / wall,
                "goodput_req_s": rate * good_share,
                "good_share": good_share,
                "driver_cpu_share": driver_cpu / wall,
                "sim_cpu_s": sim_cpu,
                "wall_s": wall,
            }));
        }
    }
    Ok(runs)
}

/// The targets of BENCHMARKS.md, judged on these runs.
fn verdicts(runs: &[Value]) -> Value {
    let get = |policy: &str, rate: f64| {
        runs.iter()
            .find(|r| r["policy"] == policy && r["rate"].as_f64() == Some(rate))
    };
    let rates: Vec<f64> = runs.iter().filter_map(|r| r["rate"].as_f64()).collect();
    // The knee: the highest rate at which round-robin's TTFT p90 stays under 2 s.
    let knee = rates
        .iter()
        .copied()
        .filter(|&r| {
            get("round-robin", r)
                .and_then(|v| v["ttft_s"]["p90"].as_f64())
                .is_some_and(|p| p < 2.0)
        })
        .fold(None, |a: Option<f64>, r| Some(a.map_or(r, |a| a.max(r))));
    let at = knee.or_else(|| rates.iter().copied().reduce(f64::min));
    let ratio = at.and_then(|r| {
        let rr = get("round-robin", r)?["ttft_s"]["p50"].as_f64()?;
        let kv = get("kv-aware", r)?["ttft_s"]["p50"].as_f64()?;
        (kv > 0.0).then(|| rr / kv)
    });
    let kv_runs: Vec<&Value> = runs.iter().filter(|r| r["policy"] == "kv-aware").collect();
    let worst_vs_oracle = kv_runs
        .iter()
        .filter_map(|r| r["hit_vs_oracle"].as_f64())
        .fold(f64::MAX, f64::min);
    let worst_spread = kv_runs
        .iter()
        .filter_map(|r| r["load_spread"].as_f64())
        .fold(0.0, f64::max);
    let p50s: Vec<f64> = kv_runs
        .iter()
        .filter_map(|r| r["ttft_s"]["p50"].as_f64())
        .collect();
    json!({
        "knee_rate": knee,
        "ttft_p50_round_robin_over_kv_aware_at_knee": ratio,
        "kv_aware_hit_vs_oracle_min": if kv_runs.is_empty() { Value::Null } else { json!(worst_vs_oracle) },
        "kv_aware_load_spread_max": worst_spread,
        "kv_aware_ttft_p50_median": quantile(&p50s, 0.5),
        "targets": {"hit_vs_oracle": ">= 0.9", "ttft_ratio_at_knee": ">= 3", "load_spread": "<= 0.25"},
    })
}
