//! S1 proxy overhead: the same open-loop ladder sent to the simulators directly and
//! through a round-robin gateway, streaming and not; the gateway's CPU per request
//! (its runtime's threads) and the latency it adds.

use super::Ctx;
use super::driver::open_loop;
use super::fleet::{Fleet, MODEL, SimSpec};
use super::stats::quantile;
use super::under_test::UnderTest;
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

/// S1's fleet: `workers` aggregated simulators, no KV events.
pub fn sims(workers: usize, speedup: f64, profile: &str) -> Vec<SimSpec> {
    (0..workers)
        .map(|_| SimSpec {
            kv_blocks: 4096,
            speedup,
            profile: profile.to_owned(),
            pd: None,
            kv_events: false,
            transfer_gbytes_per_s: 170.0,
            kvd: false,
        })
        .collect()
}

/// Runs S1.
pub async fn run(ctx: &Ctx, size: &Size, profile: &str) -> Result<Value> {
    let sims = sims(size.workers, size.speedup, profile);
    let flags: Vec<String> = ["--router-policy", "round-robin", "--shutdown-grace-s", "1"]
        .map(String::from)
        .to_vec();
    let fleet = Fleet::start(&sims, 1, &flags).await?;
    let mut routers = vec![(
        "gateway".to_owned(),
        UnderTest::start(
            "round-robin",
            &[],
            &fleet,
            ctx.pin.as_ref(),
            "/v1/completions",
        )
        .await?,
    )];
    for peer in &ctx.peers {
        let policy = peer.policy();
        let router = UnderTest::start(
            &policy,
            &ctx.peers,
            &fleet,
            ctx.pin.as_ref(),
            "/v1/completions",
        )
        .await?;
        routers.push((policy, router));
    }
    let client = super::driver::client()?;
    let mut rng = Rng::new(ctx.seed);
    let prompt = text(&mut rng, size.prompt_bytes);
    let mut steps = Vec::new();
    for &rate in &size.rates {
        let n = (rate * size.step_seconds).round() as usize;
        for stream in [false, true] {
            let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": size.output_tokens, "stream": stream});
            let bodies = vec![body; n];
            let label = |target: &str| {
                format!(
                    "s1 {target} {} @ {rate}/s",
                    if stream { "stream" } else { "unary" }
                )
            };
            let direct = fleet.sim_urls("/v1/completions");
            let out = open_loop(
                &client,
                &direct,
                bodies.clone(),
                rate,
                ctx.seed,
                &label("direct"),
            )
            .await;
            let mut errors = out.iter().filter(|o| !o.ok).count();
            let direct: Vec<f64> = out.iter().filter(|o| o.ok).map(|o| o.e2e).collect();
            let mut through = Vec::new();
            for (name, router) in &mut routers {
                router.take_cpu();
                let t0 = Instant::now();
                let out = open_loop(
                    &client,
                    &router.urls,
                    bodies.clone(),
                    rate,
                    ctx.seed,
                    &label(name),
                )
                .await;
                let wall = t0.elapsed().as_secs_f64();
                let cpu_us = router.take_cpu() * 1e6 / n.max(1) as f64;
                let failed = out.iter().filter(|o| !o.ok).count();
                let e2e: Vec<f64> = out.iter().filter(|o| o.ok).map(|o| o.e2e).collect();
                through.push(json!({
                    "router": name,
                    "achieved_rate": n as f64 / wall,
                    "errors": failed,
                    "p50_ms": quantile(&e2e, 0.5) * 1e3,
                    "p99_ms": quantile(&e2e, 0.99) * 1e3,
                    "added_p50_us": (quantile(&e2e, 0.5) - quantile(&direct, 0.5)) * 1e6,
                    "added_p99_us": (quantile(&e2e, 0.99) - quantile(&direct, 0.99)) * 1e6,
                    "cpu_us_per_request": cpu_us,
                }));
                if name == "gateway" {
                    errors += failed;
                }
            }
            let gw = &through[0];
            steps.push(json!({
                "rate": rate,
                "stream": stream,
                "requests": n,
                "achieved_rate": gw["achieved_rate"],
                "errors": errors,
                "direct_ms": {"p50": quantile(&direct, 0.5) * 1e3, "p99": quantile(&direct, 0.99) * 1e3},
                "gateway_ms": {"p50": gw["p50_ms"], "p99": gw["p99_ms"]},
                "added_p50_us": gw["added_p50_us"],
                "added_p99_us": gw["added_p99_us"],
                "gateway_cpu_us_per_request": gw["cpu_us_per_request"],
                "routers": through,
            }));
        }
    }
    for (_, router) in routers {
        router.stop().await;
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
    let mut by_router = serde_json::Map::new();
    let names: Vec<String> = steps
        .first()
        .and_then(|s| s["routers"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|r| r["router"].as_str().map(str::to_owned))
        .collect();
    for name in names {
        let of = |key: &str, stream: bool| {
            let v: Vec<f64> = steps
                .iter()
                .filter(|s| s["stream"] == stream)
                .flat_map(|s| s["routers"].as_array().into_iter().flatten())
                .filter(|r| r["router"] == name.as_str())
                .filter_map(|r| r[key].as_f64())
                .collect();
            quantile(&v, 0.5)
        };
        by_router.insert(
            name.clone(),
            json!({"cpu_us_per_unary_request_median": of("cpu_us_per_request", false),
                   "added_p50_us_unary_median": of("added_p50_us", false),
                   "added_p50_us_stream_median": of("added_p50_us", true)}),
        );
    }
    Ok(json!({
        "runs": steps,
        "verdicts": {
            "routers": by_router,
            "gateway_cpu_us_per_unary_request_median": quantile(&unary, 0.5),
            "added_p50_us_median": quantile(&added, 0.5),
            "targets": {"cpu_us_per_request": "<= 100", "added_p50_us": "<= 50", "added_p99_us": "<= 1000"},
        },
    }))
}
