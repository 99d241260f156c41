//! S4 prefill/decode disaggregation: 2 prefill + 2 decode workers against 4 mixed
//! workers on long prompts; goodput (TTFT <= 2 s and mean ITL <= 25 ms, H200-equivalent),
//! ITL p99, and the gateway's CPU per request.

use super::cpu::threads_cpu;
use super::driver::open_loop;
use super::fleet::{Fleet, MODEL, SimSpec};
use super::stats::{quantile, summary};
use super::workload::{Rng, text};
use super::{Ctx, policy_flags};
use anyhow::{Result, bail};
use infera_proto::pd::PdProtocol;
use infera_sim::pd::PdLeg;
use serde::Deserialize;
use serde_json::{Value, json};

/// Sizes of S4.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    shapes: Vec<(usize, usize)>,
    requests: usize,
    rate: f64,
    transfer_gbytes_per_s: Vec<f64>,
    speedup: f64,
}

const TTFT_SLO_S: f64 = 2.0;
const ITL_SLO_S: f64 = 0.025;

fn fleet_spec(
    policy: &str,
    profile: &str,
    speedup: f64,
    gbps: f64,
) -> Result<(Vec<SimSpec>, Vec<String>)> {
    let sim = |pd, kv_events| SimSpec {
        kv_blocks: 8192,
        speedup,
        profile: profile.to_owned(),
        pd,
        kv_events,
        transfer_gbytes_per_s: gbps,
        kvd: false,
    };
    Ok(match policy {
        "mixed-round-robin" => (vec![sim(None, false); 4], policy_flags("round-robin")?.0),
        "mixed-kv-aware" => (vec![sim(None, true); 4], policy_flags("kv-aware")?.0),
        "pd-2p2d" => {
            let p = Some((PdProtocol::VllmMooncake, PdLeg::Prefill));
            let d = Some((PdProtocol::VllmMooncake, PdLeg::Decode));
            (
                vec![sim(p, false), sim(p, false), sim(d, false), sim(d, false)],
                policy_flags("round-robin")?.0,
            )
        }
        other => bail!("unknown S4 policy {other:?} (mixed-round-robin, mixed-kv-aware, pd-2p2d)"),
    })
}

/// Runs S4.
pub async fn run(ctx: &Ctx, size: &Size, policies: &[String], profile: &str) -> Result<Value> {
    let client = super::driver::client()?;
    let mut runs = Vec::new();
    for &(input, output) in &size.shapes {
        let mut rng = Rng::new(ctx.seed);
        let bodies: Vec<Value> = (0..size.requests)
            .map(|_| {
                json!({"model": MODEL, "prompt": text(&mut rng, input), "max_tokens": output,
                            "stream": true, "stream_options": {"include_usage": true}})
            })
            .collect();
        for &gbps in &size.transfer_gbytes_per_s {
            for policy in policies {
                let (sims, flags) = fleet_spec(policy, profile, size.speedup, gbps)?;
                // Transfer bandwidth only matters to prefill/decode pairs.
                if !policy.starts_with("pd") && gbps != size.transfer_gbytes_per_s[0] {
                    continue;
                }
                let fleet = Fleet::start(&sims, 1, &flags).await?;
                let urls = fleet.gateway_urls("/v1/completions");
                let gw0 = threads_cpu("infera-gw");
                let label = format!("s4 {policy} {input}/{output} {gbps} GB/s");
                let outcomes = open_loop(
                    &client,
                    &urls,
                    bodies.clone(),
                    size.rate * size.speedup,
                    ctx.seed,
                    &label,
                )
                .await;
                let gw_cpu = threads_cpu("infera-gw").saturating_sub(gw0).as_secs_f64();
                fleet.shutdown().await;
                let s = size.speedup;
                let ok: Vec<_> = outcomes.iter().filter(|o| o.ok).collect();
                let good = ok
                    .iter()
                    .filter(|o| {
                        let itl = if o.itls.is_empty() {
                            0.0
                        } else {
                            o.itls.iter().sum::<f64>() / o.itls.len() as f64
                        };
                        o.ttft.is_some_and(|t| t * s <= TTFT_SLO_S) && itl * s <= ITL_SLO_S
                    })
                    .count();
                let ttft: Vec<f64> = ok.iter().filter_map(|o| o.ttft).collect();
                let itl: Vec<f64> = ok.iter().flat_map(|o| o.itls.iter().copied()).collect();
                runs.push(json!({
                    "policy": policy,
                    "input": input,
                    "output": output,
                    "transfer_gbytes_per_s": if policy.starts_with("pd") { json!(gbps) } else { Value::Null },
                    "rate": size.rate,
                    "requests": outcomes.len(),
                    "errors": outcomes.len() - ok.len(),
                    "goodput_ratio": good as f64 / outcomes.len().max(1) as f64,
                    "ttft_s": summary(&ttft, s),
                    "itl_s": summary(&itl, s),
                    "itl_p99_ms": quantile(&itl, 0.99) * s * 1e3,
                    "gateway_cpu_us_per_request": gw_cpu * 1e6 / outcomes.len().max(1) as f64,
                }));
            }
        }
    }
    let verdicts = runs
        .iter()
        .filter(|r| r["policy"] == "pd-2p2d")
        .map(|pd| {
            let best_mixed = runs
                .iter()
                .filter(|m| {
                    m["input"] == pd["input"]
                        && m["policy"].as_str().is_some_and(|p| p.starts_with("mixed"))
                })
                .map(|m| {
                    (
                        m["goodput_ratio"].as_f64().unwrap_or(0.0),
                        m["itl_p99_ms"].as_f64().unwrap_or(0.0),
                    )
                })
                .fold((0.0_f64, f64::MAX), |a, b| (a.0.max(b.0), a.1.min(b.1)));
            json!({
                "input": pd["input"], "transfer_gbytes_per_s": pd["transfer_gbytes_per_s"],
                "pd_goodput": pd["goodput_ratio"], "best_mixed_goodput": best_mixed.0,
                "pd_itl_p99_ms": pd["itl_p99_ms"], "best_mixed_itl_p99_ms": best_mixed.1,
            })
        })
        .collect::<Vec<_>>();
    Ok(json!({"runs": runs, "verdicts": {"pd_vs_mixed": verdicts,
        "targets": {"goodput": "PD >= mixed at >= 4K input", "itl_p99": "PD lower than mixed"}}}))
}
