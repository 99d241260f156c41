//! S1 proxy overhead: the same open-loop ladder sent to the simulators directly and
//! through a round-robin gateway, streaming and not; the gateway's CPU per request
//! (its runtime's threads) and the latency it adds.

use super::Ctx;
use super::cpu::threads_cpu;
use super::driver::open_loop;
use super::fleet::{Fleet, MODEL, SimSpec};
use super::stats::quantile;
use super::workload::{Rng, text};
use anyhow::Result;
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Instant;

/// Sizes of S1.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    workers: usize,
    prompt_bytes: usize,
    output_tokens: usize,
    rates: Vec<f64>,
    step_seconds: f64,
    speedup: f64,
}

/// Runs S1.
pub async fn run(ctx: &Ctx, size: &Size, profile: &str) -> Result<Value> {
    let sims: Vec<SimSpec> = (0..size.workers)
        .map(|_| SimSpec {
            kv_blocks: 4096,
            speedup: size.speedup,
            profile: profile.to_owned(),
            pd: None,
            kv_events: false,
            transfer_gbytes_per_s: 170.0,
        })
        .collect();
    let flags: Vec<String> = ["--router-policy", "round-robin", "--shutdown-grace-s", "1"]
        .map(String::from)
        .to_vec();
    let fleet = Fleet::start(&sims, 1, &flags).await?;
    let client = super::driver::client()?;
    let mut rng = Rng::new(ctx.seed);
    let prompt = text(&mut rng, size.prompt_bytes);
    let mut steps = Vec::new();
    for &rate in &size.rates {
        let n = (rate * size.step_seconds).round() as usize;
        for stream in [false, true] {
            let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": size.output_tokens, "stream": stream});
            let bodies = vec![body; n];
            let mut lat = Vec::new();
            let mut gw_cpu_us = 0.0;
            let mut errors = 0;
            let mut achieved = 0.0;
            for (target, urls) in [
                ("direct", fleet.sim_urls("/v1/completions")),
                ("gateway", fleet.gateway_urls("/v1/completions")),
            ] {
                let before = threads_cpu("infera-gw");
                let t0 = Instant::now();
                let label = format!(
                    "s1 {target} {} @ {rate}/s",
                    if stream { "stream" } else { "unary" }
                );
                let out = open_loop(&client, &urls, bodies.clone(), rate, ctx.seed, &label).await;
                let wall = t0.elapsed().as_secs_f64();
                errors += out.iter().filter(|o| !o.ok).count();
                let e2e: Vec<f64> = out.iter().filter(|o| o.ok).map(|o| o.e2e).collect();
                lat.push(e2e);
                if target == "gateway" {
                    gw_cpu_us = threads_cpu("infera-gw")
                        .saturating_sub(before)
                        .as_secs_f64()
                        * 1e6
                        / n.max(1) as f64;
                    achieved = n as f64 / wall;
                }
            }
            let (direct, gw) = (&lat[0], &lat[1]);
            steps.push(json!({
                "rate": rate,
                "stream": stream,
                "requests": n,
                "achieved_rate": achieved,
                "errors": errors,
                "direct_ms": {"p50": quantile(direct, 0.5) * 1e3, "p99": quantile(direct, 0.99) * 1e3},
                "gateway_ms": {"p50": quantile(gw, 0.5) * 1e3, "p99": quantile(gw, 0.99) * 1e3},
                "added_p50_us": (quantile(gw, 0.5) - quantile(direct, 0.5)) * 1e6,
                "added_p99_us": (quantile(gw, 0.99) - quantile(direct, 0.99)) * 1e6,
                "gateway_cpu_us_per_request": gw_cpu_us,
            }));
        }
    }
    fleet.shutdown().await;
    let unary: Vec<f64> = steps
        .iter()
        .filter(|s| s["stream"] == false)
        .filter_map(|s| s["gateway_cpu_us_per_request"].as_f64())
        .collect();
    let added: Vec<f64> = steps
        .iter()
        .filter_map(|s| s["added_p50_us"].as_f64())
        .collect();
    Ok(json!({
        "runs": steps,
        "verdicts": {
            "gateway_cpu_us_per_unary_request_median": quantile(&unary, 0.5),
            "added_p50_us_median": quantile(&added, 0.5),
            "targets": {"cpu_us_per_request": "<= 100", "added_p50_us": "<= 50", "added_p99_us": "<= 1000"},
        },
    }))
}
