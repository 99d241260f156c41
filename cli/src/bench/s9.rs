//! S9 NATS transport and migration. First S1's open-loop ladder sent to the simulators
//! directly, through a gateway over HTTP and through one over the NATS request plane
//! (each simulator's request server in process, as a sidecar runs it): the latency each
//! transport adds. Then streamed requests whose worker breaks the stream after
//! `break_after` tokens, through gateways with `--migration-limit 1` over each
//! transport: the longest wait the client sees (the stall at the move) against the
//! usual gap between tokens, and tokens lost or repeated at the seam against the same
//! request served without a fault.

use super::Ctx;
use super::driver::open_loop;
use super::fleet::{Fleet, MODEL, SimSpec};
use super::stats::quantile;
use super::workload::{Rng, text};
use anyhow::{Result, anyhow};
use futures::StreamExt;
use infera_sim::faults::FaultSettings;
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Instant;

/// Sizes of S9.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    workers: usize,
    prompt_bytes: usize,
    output_tokens: usize,
    rates: Vec<f64>,
    step_seconds: f64,
    speedup: f64,
    migration: MigrationSize,
}

/// Sizes of the migration part.
#[derive(Debug, Clone, Deserialize)]
pub struct MigrationSize {
    requests: usize,
    prompt_bytes: usize,
    output_tokens: usize,
    break_after: u64,
    speedup: f64,
}

fn sims(size: &Size, speedup: f64, profile: &str) -> Vec<SimSpec> {
    (0..size.workers)
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

fn gateway_flags(nats: &str, transport: &str, extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--router-policy",
        "round-robin",
        "--shutdown-grace-s",
        "1",
        "--nats-server",
        nats,
        "--request-transport",
        transport,
    ]
    .map(String::from)
    .to_vec();
    flags.extend(extra.iter().map(|s| (*s).to_owned()));
    flags
}

/// Runs S9 against the NATS server at `nats`.
pub async fn run(ctx: &Ctx, size: &Size, profile: &str, nats: &str) -> Result<Value> {
    let mut runs = transport_ladder(ctx, size, profile, nats).await?;
    runs.extend(migrations(ctx, size, profile, nats).await?);
    let added = |transport: &str| -> Vec<f64> {
        runs.iter()
            .filter(|r| r["part"] == "transport" && r["transport"] == transport)
            .filter_map(|r| r["added_p50_us"].as_f64())
            .collect()
    };
    let (http, over_nats) = (quantile(&added("http"), 0.5), quantile(&added("nats"), 0.5));
    let stall = |transport: &str| {
        runs.iter()
            .find(|r| r["part"] == "migration" && r["transport"] == transport)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let verdicts = json!({
        "added_p50_us_median": {"http": http, "nats": over_nats},
        "nats_over_http_added_p50": if http > 0.0 { over_nats / http } else { f64::NAN },
        "migration": {"http": stall("http"), "nats": stall("nats")},
        "targets": {
            "nats_added_p50": "<= 2x http's",
            "stall_ms": "<= one prefill of the carried prefix + 50 ms",
            "tokens_lost_or_repeated": 0,
        },
    });
    Ok(json!({"runs": runs, "verdicts": verdicts}))
}

/// The latency each transport adds, streaming and not, at each rate.
async fn transport_ladder(ctx: &Ctx, size: &Size, profile: &str, nats: &str) -> Result<Vec<Value>> {
    let flag_sets = [
        gateway_flags(nats, "http", &[]),
        gateway_flags(nats, "nats", &[]),
    ];
    let fleet =
        Fleet::start_over_nats(&sims(size, size.speedup, profile), &flag_sets, nats).await?;
    let client = super::driver::client()?;
    let mut rng = Rng::new(ctx.seed);
    let prompt = text(&mut rng, size.prompt_bytes);
    let urls = |i: usize| vec![format!("http://{}/v1/completions", fleet.gateways[i].addr)];
    let mut runs = Vec::new();
    for &rate in &size.rates {
        let n = (rate * size.step_seconds).round() as usize;
        for stream in [false, true] {
            let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": size.output_tokens, "stream": stream});
            let mode = if stream { "stream" } else { "unary" };
            let mut p50 = Vec::new();
            for (target, urls) in [
                ("direct", fleet.sim_urls("/v1/completions")),
                ("http", urls(0)),
                ("nats", urls(1)),
            ] {
                let label = format!("s9 {target} {mode} @ {rate}/s");
                let out = open_loop(
                    &client,
                    &urls,
                    vec![body.clone(); n],
                    rate,
                    ctx.seed,
                    &label,
                )
                .await;
                let e2e: Vec<f64> = out.iter().filter(|o| o.ok).map(|o| o.e2e).collect();
                let errors = out.len() - e2e.len();
                p50.push(quantile(&e2e, 0.5));
                if target != "direct" {
                    runs.push(json!({
                        "part": "transport", "transport": target, "rate": rate, "stream": stream,
                        "requests": n, "errors": errors,
                        "p50_ms": quantile(&e2e, 0.5) * 1e3, "p99_ms": quantile(&e2e, 0.99) * 1e3,
                        "added_p50_us": (quantile(&e2e, 0.5) - p50[0]) * 1e6,
                    }));
                }
            }
        }
    }
    fleet.shutdown().await;
    Ok(runs)
}

/// A streamed answer's token texts and their arrival times (seconds from the request).
async fn stream_tokens(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
) -> Result<(Vec<String>, Vec<f64>)> {
    let started = Instant::now();
    let resp = client.post(url).json(body).send().await?;
    let mut stream = resp.bytes_stream();
    let (mut buf, mut tokens, mut times) = (String::new(), Vec::new(), Vec::new());
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(pos) = buf.find("\n\n") {
            let event: String = buf.drain(..pos + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if let Some(e) = v.get("error") {
                return Err(anyhow!("the stream ended with an error: {e}"));
            }
            if let Some(t) = v.pointer("/choices/0/text").and_then(Value::as_str) {
                tokens.push(t.to_owned());
                times.push(started.elapsed().as_secs_f64());
            }
        }
    }
    Ok((tokens, times))
}

/// Streams broken after `break_after` tokens, moved over each transport.
async fn migrations(ctx: &Ctx, size: &Size, profile: &str, nats: &str) -> Result<Vec<Value>> {
    let m = &size.migration;
    let flag_sets = [
        gateway_flags(nats, "http", &["--migration-limit", "1"]),
        gateway_flags(nats, "nats", &["--migration-limit", "1"]),
    ];
    let fleet = Fleet::start_over_nats(&sims(size, m.speedup, profile), &flag_sets, nats).await?;
    let client = super::driver::client()?;
    let mut rng = Rng::new(ctx.seed ^ 9);
    let bodies: Vec<Value> = (0..m.requests)
        .map(|_| json!({"model": MODEL, "prompt": text(&mut rng, m.prompt_bytes), "max_tokens": m.output_tokens, "stream": true}))
        .collect();
    // Unfaulted answers first, straight from a simulator.
    let direct = fleet.sim_urls("/v1/completions");
    let mut unfaulted = Vec::new();
    for body in &bodies {
        unfaulted.push(stream_tokens(&client, &direct[0], body).await?.0);
    }
    for sim in &fleet.sims {
        sim.state.faults.set(&FaultSettings {
            fail_after_tokens: Some(m.break_after),
            ..Default::default()
        });
    }
    let carried_prefill_ms = infera_sim::profile::LatencyProfile::builtin(profile)
        .map(|p| p.prefill_ms(m.prompt_bytes + m.break_after as usize, 0) / m.speedup)
        .unwrap_or(f64::NAN);
    let mut runs = Vec::new();
    for (i, transport) in ["http", "nats"].into_iter().enumerate() {
        let url = format!("http://{}/v1/completions", fleet.gateways[i].addr);
        let (mut stalls, mut gaps, mut seam_errors, mut failed) = (Vec::new(), Vec::new(), 0, 0);
        for (body, want) in bodies.iter().zip(&unfaulted) {
            let Ok((got, times)) = stream_tokens(&client, &url, body).await else {
                failed += 1;
                continue;
            };
            let mut between: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
            between.sort_by(f64::total_cmp);
            stalls.push(between.last().copied().unwrap_or(0.0));
            gaps.push(quantile(&between, 0.5));
            seam_errors += got.len().abs_diff(want.len())
                + got.iter().zip(want).filter(|(a, b)| a != b).count();
        }
        runs.push(json!({
            "part": "migration", "transport": transport, "requests": m.requests,
            "failed": failed, "break_after": m.break_after,
            "stall_ms_p50": quantile(&stalls, 0.5) * 1e3,
            "stall_ms_p90": quantile(&stalls, 0.9) * 1e3,
            "usual_gap_ms_p50": quantile(&gaps, 0.5) * 1e3,
            "carried_prefill_ms": carried_prefill_ms,
            "tokens_lost_or_repeated": seam_errors,
        }));
    }
    fleet.shutdown().await;
    Ok(runs)
}
