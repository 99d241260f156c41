//! S3 multi-turn sessions under KV pressure: users converse concurrently, each turn's
//! prompt is the whole history plus a new message, with think time between turns; the
//! cluster's KV holds a fraction of the sessions' working set.

use super::Ctx;
use super::driver::send;
use super::fleet::{Fleet, MODEL, SimSpec};
use super::stats::quantile;
use super::under_test::{UnderTest, fleet_setup};
use super::workload::{Rng, text};
use anyhow::Result;
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

/// Sizes of S3.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    workers: usize,
    users: usize,
    turns: usize,
    first_prompt_tokens: usize,
    turn_tokens: usize,
    output_tokens: usize,
    think_seconds: f64,
    kv_fractions: Vec<f64>,
    speedup: f64,
}

async fn evictions(fleet: &Fleet) -> u64 {
    let mut total = 0.0;
    for url in fleet.sim_urls("/metrics") {
        let text = match reqwest::get(&url).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => continue,
        };
        total += text
            .lines()
            .find(|l| l.starts_with("infera_sim_evictions_total"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    total as u64
}

/// Runs S3.
pub async fn run(ctx: &Ctx, size: &Size, policies: &[String], profile: &str) -> Result<Value> {
    // Tokens one session holds at its last turn.
    let per_session =
        size.first_prompt_tokens + size.turns * (size.turn_tokens + size.output_tokens);
    let working_set = per_session * size.users;
    let mut runs = Vec::new();
    for &fraction in &size.kv_fractions {
        for policy in policies {
            let (flags, gateways, kv_events) = fleet_setup(policy)?;
            let kv_blocks =
                ((working_set as f64 * fraction) / size.workers as f64 / 16.0).ceil() as usize;
            let sims = vec![
                SimSpec {
                    kv_blocks,
                    speedup: size.speedup,
                    profile: profile.to_owned(),
                    pd: None,
                    kv_events,
                    transfer_gbytes_per_s: 170.0
                };
                size.workers
            ];
            let fleet = Fleet::start(&sims, gateways, &flags).await?;
            let mut router = UnderTest::start(
                policy,
                &ctx.peers,
                &fleet,
                ctx.pin.as_ref(),
                "/v1/completions",
            )
            .await?;
            let urls = router.urls.clone();
            let client = super::driver::client()?;
            let mut users = tokio::task::JoinSet::new();
            for u in 0..size.users {
                let (client, url, size) =
                    (client.clone(), urls[u % urls.len()].clone(), size.clone());
                let seed = ctx.seed.wrapping_add(u as u64);
                users.spawn(async move {
                    let mut rng = Rng::new(seed);
                    let mut history = text(&mut rng, size.first_prompt_tokens);
                    let mut turns = Vec::new();
                    // Users start spread over one think time.
                    tokio::time::sleep(Duration::from_secs_f64(rng.unit() * size.think_seconds / size.speedup)).await;
                    for turn in 0..size.turns {
                        if turn > 0 {
                            history.push_str(&text(&mut rng, size.turn_tokens));
                        }
                        let body = json!({"model": MODEL, "prompt": history, "max_tokens": size.output_tokens,
                                          "stream": true, "stream_options": {"include_usage": true}});
                        let o = send(&client, &url, &body).await;
                        turns.push(o);
                        // The answer joins the history (its length in tokens, simulated text).
                        history.push_str(&text(&mut rng, size.output_tokens));
                        tokio::time::sleep(Duration::from_secs_f64(size.think_seconds / size.speedup)).await;
                    }
                    turns
                });
            }
            let mut by_turn: Vec<Vec<super::driver::Outcome>> = vec![Vec::new(); size.turns];
            while let Some(r) = users.join_next().await {
                if let Ok(turns) = r {
                    for (t, o) in turns.into_iter().enumerate() {
                        by_turn[t].push(o);
                    }
                }
            }
            let gw_cpu = router.take_cpu();
            router.stop().await;
            let ev = evictions(&fleet).await;
            fleet.shutdown().await;
            let errors: usize = by_turn.iter().flatten().filter(|o| !o.ok).count();
            let turns: Vec<Value> = by_turn
                .iter()
                .enumerate()
                .map(|(t, os)| {
                    let ttft: Vec<f64> = os.iter().filter(|o| o.ok).filter_map(|o| o.ttft).collect();
                    let prompt: u64 = os.iter().map(|o| o.prompt_tokens).sum();
                    let cached: u64 = os.iter().map(|o| o.cached_tokens).sum();
                    json!({"turn": t + 1, "ttft_p50_s": quantile(&ttft, 0.5) * size.speedup,
                           "ttft_p90_s": quantile(&ttft, 0.9) * size.speedup,
                           "hit_ratio": if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 }})
                })
                .collect();
            let later: Vec<f64> = turns
                .iter()
                .skip(1)
                .filter_map(|t| t["hit_ratio"].as_f64())
                .collect();
            runs.push(json!({
                "policy": policy, "kv_fraction": fraction, "kv_blocks_per_worker": kv_blocks,
                "working_set_tokens": working_set, "turns": turns, "evictions": ev, "errors": errors,
                "hit_ratio_after_first_turn": if later.is_empty() { 0.0 } else { later.iter().sum::<f64>() / later.len() as f64 },
                "gateway_cpu_us_per_request": gw_cpu * 1e6 / (size.users * size.turns).max(1) as f64,
            }));
        }
    }
    let hit = |p: &str, f: f64| {
        runs.iter()
            .find(|r| r["policy"] == p && r["kv_fraction"].as_f64() == Some(f))
            .and_then(|r| r["hit_ratio_after_first_turn"].as_f64())
    };
    let verdicts: Vec<Value> = size
        .kv_fractions
        .iter()
        .map(|&f| json!({"kv_fraction": f, "kv_aware_hit": hit("kv-aware", f), "round_robin_hit": hit("round-robin", f)}))
        .collect();
    Ok(
        json!({"runs": runs, "verdicts": {"by_kv_fraction": verdicts,
        "targets": {"at_1.4x": "kv-aware hit ratio >= 0.8", "at_0.7x": "kv-aware no worse than round-robin"}}}),
    )
}
