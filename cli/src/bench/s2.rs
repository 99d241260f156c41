//! S2 shared-prefix routing: every policy on a fresh fleet at each arrival rate; TTFT,
//! throughput, cluster hit ratio against the oracle, load spread.

use super::Ctx;
use super::driver::open_loop;
use super::fleet::{BLOCK_TOKENS, MODEL, SimSpec};
use super::ladder::{Slo, mixed_fleet, row, step};
use super::stats::quantile;
use super::workload::{oracle_hit_ratio, shared_prefix};
use anyhow::Result;
use serde::Deserialize;
use serde_json::{Value, json};

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
    /// The latency targets of goodput (`ttft_slo_s`, `itl_slo_s`).
    #[serde(flatten)]
    slo: Slo,
}

/// Runs S2.
pub async fn run(ctx: &Ctx, size: &Size, policies: &[String], profile: &str) -> Result<Value> {
    // Fresh connections, so that routers are compared on routing (see S8).
    let client = super::driver::client_per_request()?;
    let runs = ladder("s2", &client, ctx, size, policies, profile).await?;
    Ok(json!({"verdicts": verdicts(&runs), "runs": runs}))
}

/// S2's requests, the oracle's hit ratio for them, and the fleet they run on.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The request bodies (streamed completions).
    pub bodies: Vec<Value>,
    /// The hit ratio of a router that always finds its group's prefix.
    pub oracle: f64,
    /// The simulators.
    pub sims: Vec<SimSpec>,
}

/// The workload of `size`.
pub fn workload(ctx: &Ctx, size: &Size, profile: &str) -> Workload {
    let requests = shared_prefix(
        ctx.seed,
        size.groups,
        size.prompts_per_group,
        size.system_tokens,
        size.question_tokens,
    );
    let capacity = size.workers * size.kv_tokens_per_worker;
    let oracle = oracle_hit_ratio(&requests, size.system_tokens, BLOCK_TOKENS, capacity);
    let bodies: Vec<Value> = requests
        .iter()
        .map(|r| {
            json!({"model": MODEL, "prompt": r.prompt, "max_tokens": size.output_tokens,
                        "stream": true, "stream_options": {"include_usage": true}})
        })
        .collect();
    let sims = mixed_fleet(
        size.workers,
        size.kv_tokens_per_worker / BLOCK_TOKENS,
        size.speedup,
        profile,
    );
    Workload {
        bodies,
        oracle,
        sims,
    }
}

impl Size {
    /// How much faster than an H200 the simulators run.
    pub fn speedup(&self) -> f64 {
        self.speedup
    }

    /// The latency targets of goodput.
    pub fn slo(&self) -> Slo {
        self.slo
    }
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
    let Workload {
        bodies,
        oracle,
        sims,
    } = workload(ctx, size, profile);
    let mut runs = Vec::new();
    for &rate in &size.rates {
        for policy in policies {
            let label = format!("{scenario} {policy} @ {rate}/s");
            let bodies = bodies.clone();
            let step = step(ctx, policy, &sims, "/v1/completions", |urls| async move {
                open_loop(client, &urls, bodies, rate * size.speedup, ctx.seed, &label).await
            })
            .await?;
            runs.push(Value::Object(row(
                policy,
                rate,
                &step,
                size.speedup,
                size.slo,
                oracle,
            )));
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
