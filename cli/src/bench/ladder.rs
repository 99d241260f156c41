//! One step of a routing ladder (S2, S3's sessions, S8): a fresh simulated fleet, the
//! router under test on it, the load, and what the step measured; plus the pure parts,
//! which requests were good and the row of numbers every ladder reports.

use super::Ctx;
use super::cpu::threads_cpu;
use super::driver::Outcome;
use super::fleet::{Fleet, SimSpec};
use super::stats::{spread, summary};
use super::under_test::{UnderTest, fleet_setup};
use anyhow::Result;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::future::Future;
use std::time::Instant;

/// Latency targets a good request meets (H200-equivalent seconds), read from a size's
/// `ttft_slo_s` and `itl_slo_s`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Slo {
    /// Time to the first token at most this...
    #[serde(rename = "ttft_slo_s", default = "default_ttft_slo")]
    pub ttft_s: f64,
    /// ...and a mean gap between tokens at most this.
    #[serde(rename = "itl_slo_s", default = "default_itl_slo")]
    pub itl_s: f64,
}

fn default_ttft_slo() -> f64 {
    2.0
}

fn default_itl_slo() -> f64 {
    0.05
}

/// Whether a request met `slo`, its times measured on a fleet run at `speedup`.
pub fn good(o: &Outcome, speedup: f64, slo: Slo) -> bool {
    let mean_itl = if o.itls.is_empty() {
        0.0
    } else {
        o.itls.iter().sum::<f64>() / o.itls.len() as f64
    };
    o.ok && o.ttft.is_some_and(|t| t * speedup <= slo.ttft_s) && mean_itl * speedup <= slo.itl_s
}

/// What one step measured besides the requests' outcomes.
#[derive(Debug, Clone, Default)]
pub struct Step {
    /// Every request's outcome.
    pub outcomes: Vec<Outcome>,
    /// CPU seconds of the router under test (a peer's whole process).
    pub router_cpu: f64,
    /// CPU seconds of the driver's threads.
    pub driver_cpu: f64,
    /// CPU seconds of the simulators' threads.
    pub sim_cpu: f64,
    /// Seconds the load ran.
    pub wall: f64,
    /// Requests each simulator finished.
    pub served: Vec<u64>,
    /// KV blocks the simulators evicted.
    pub evictions: u64,
}

/// The failed requests' errors, the most frequent first (at most 5 kinds, each with
/// its count), so a run says why requests failed.
pub fn error_kinds(outcomes: &[Outcome]) -> Vec<Value> {
    let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for e in outcomes.iter().filter_map(|o| o.error.as_deref()) {
        *counts.entry(e).or_default() += 1;
    }
    let mut kinds: Vec<(&str, usize)> = counts.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    kinds
        .into_iter()
        .take(5)
        .map(|(error, n)| json!({"error": error, "count": n}))
        .collect()
}

/// The policy suffix that puts a kvd beside each simulator (`kv-aware+kvd`).
pub const KVD_SUFFIX: &str = "+kvd";

/// `workers` mixed simulators of `kv_blocks` blocks each, run at `speedup` with
/// `profile`'s latencies ([`step`] sets whether they publish KV events).
pub fn mixed_fleet(workers: usize, kv_blocks: usize, speedup: f64, profile: &str) -> Vec<SimSpec> {
    vec![
        SimSpec {
            kv_blocks,
            speedup,
            profile: profile.to_owned(),
            pd: None,
            kv_events: false,
            transfer_gbytes_per_s: 170.0,
            kvd: false,
        };
        workers
    ]
}

/// Starts `sims` and `policy`'s router on them (a fresh fleet), runs `drive` against the
/// router's URLs for `path`, and stops everything.
pub async fn step<F, Fut>(
    ctx: &Ctx,
    policy: &str,
    sims: &[SimSpec],
    path: &str,
    drive: F,
) -> Result<Step>
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: Future<Output = Vec<Outcome>>,
{
    // `<policy>+kvd`: the same router, each simulator with a kvd beside it.
    let (policy, kvd) = match policy.strip_suffix(KVD_SUFFIX) {
        Some(base) => (base, true),
        None => (policy, false),
    };
    let (flags, gateways, mut kv_events) = fleet_setup(policy)?;
    // A peer router reading KV events gets a fleet that publishes them.
    if let Some(name) = policy.strip_prefix(super::under_test::EXTERNAL) {
        kv_events |= ctx
            .peers
            .iter()
            .any(|p| p.name == name && p.reads_kv_events());
    }
    let sims: Vec<SimSpec> = sims
        .iter()
        .map(|s| SimSpec {
            kv_events,
            kvd,
            ..s.clone()
        })
        .collect();
    let fleet = Fleet::start(&sims, gateways, &flags).await?;
    let mut router = UnderTest::start(policy, &ctx.peers, &fleet, ctx.pin.as_ref(), path).await?;
    let step = measure(&fleet, drive(router.urls.clone()), || router.take_cpu()).await;
    router.stop().await;
    fleet.shutdown().await;
    Ok(step)
}

/// Runs `drive` against `fleet` and measures it: wall time, the driver's and the
/// simulators' CPU, and the router's CPU from `router_cpu`, read as soon as the load ends.
pub async fn measure(
    fleet: &Fleet,
    drive: impl Future<Output = Vec<Outcome>>,
    router_cpu: impl FnOnce() -> f64,
) -> Step {
    let (drv0, sim0, t0) = (
        threads_cpu("infera-drv"),
        threads_cpu("infera-sim"),
        Instant::now(),
    );
    let outcomes = drive.await;
    let wall = t0.elapsed().as_secs_f64();
    let router_cpu = router_cpu();
    Step {
        outcomes,
        router_cpu,
        driver_cpu: threads_cpu("infera-drv").saturating_sub(drv0).as_secs_f64(),
        sim_cpu: threads_cpu("infera-sim").saturating_sub(sim0).as_secs_f64(),
        wall,
        served: fleet.served(),
        evictions: evictions(fleet).await,
    }
}

/// KV blocks every simulator of `fleet` evicted, from their `/metrics`.
pub async fn evictions(fleet: &Fleet) -> u64 {
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

/// The numbers of one step of `policy` at `rate` (H200-equivalent req/s) on a fleet run
/// at `speedup`: latencies, throughput, hit ratio (against `oracle`, the best a router
/// could reach), load spread, goodput against `slo`, and CPU.
pub fn row(
    policy: &str,
    rate: f64,
    step: &Step,
    speedup: f64,
    slo: Slo,
    oracle: f64,
) -> Map<String, Value> {
    let outcomes = &step.outcomes;
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.ok).collect();
    let good_share = outcomes.iter().filter(|o| good(o, speedup, slo)).count() as f64
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
    let served: Vec<f64> = step.served.iter().map(|n| *n as f64).collect();
    let requests = outcomes.len().max(1) as f64;
    let wall = step.wall.max(1e-9);
    let fields = json!({
        "policy": policy,
        "rate": rate,
        "requests": outcomes.len(),
        "errors": outcomes.len() - ok.len(),
        "error_kinds": error_kinds(outcomes),
        "ttft_s": summary(&ttft, speedup),
        "itl_s": summary(&itl, speedup),
        "output_tok_per_s": output as f64 / (wall * speedup),
        "hit_ratio": hit,
        "oracle_hit_ratio": oracle,
        "hit_vs_oracle": if oracle > 0.0 { hit / oracle } else { 0.0 },
        "load_spread": spread(&served),
        "requests_per_worker": served,
        "evictions": step.evictions,
        "gateway_cpu_us_per_request": step.router_cpu * 1e6 / requests,
        "router_cpu_share": step.router_cpu / wall,
        // Goodput: the arrival rate times the share of requests that met the targets.
        "goodput_req_s": rate * good_share,
        "good_share": good_share,
        "driver_cpu_share": step.driver_cpu / wall,
        "sim_cpu_s": step.sim_cpu,
        "wall_s": step.wall,
    });
    match fields {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ttft: f64, itls: &[f64], prompt: u64, cached: u64) -> Outcome {
        Outcome {
            ok: true,
            status: 200,
            ttft: Some(ttft),
            itls: itls.to_vec(),
            prompt_tokens: prompt,
            cached_tokens: cached,
            output_tokens: itls.len() as u64 + 1,
            ..Outcome::default()
        }
    }

    #[test]
    fn good_requests_meet_both_targets_at_the_fleets_speed() {
        let slo = Slo {
            ttft_s: 1.0,
            itl_s: 0.05,
        };
        // Measured on a fleet 4x slower than the H200: 2 s is 0.5 s H200-equivalent.
        assert!(good(&outcome(2.0, &[0.1, 0.1], 10, 0), 0.25, slo));
        assert!(!good(&outcome(4.1, &[0.1], 10, 0), 0.25, slo), "TTFT");
        assert!(
            !good(&outcome(1.0, &[0.3, 0.2], 10, 0), 0.25, slo),
            "mean ITL"
        );
        let failed = Outcome {
            ok: false,
            ..outcome(0.1, &[], 10, 0)
        };
        assert!(!good(&failed, 1.0, slo), "a failed request is never good");
    }

    #[test]
    fn a_row_reports_goodput_hits_and_cpu_per_request() {
        let step = Step {
            outcomes: vec![
                outcome(0.5, &[0.01], 100, 80),
                outcome(3.0, &[0.01], 100, 0),
                Outcome::default(),
                outcome(0.2, &[0.01], 200, 160),
            ],
            router_cpu: 0.004,
            wall: 2.0,
            served: vec![2, 2],
            ..Step::default()
        };
        let slo = Slo {
            ttft_s: 1.0,
            itl_s: 0.05,
        };
        let r = row("kv-aware", 10.0, &step, 1.0, slo, 0.8);
        assert_eq!(r["errors"], 1);
        assert_eq!(r["good_share"], 0.5);
        assert_eq!(r["goodput_req_s"], 5.0);
        assert!((r["hit_ratio"].as_f64().unwrap() - 0.6).abs() < 1e-9);
        assert!((r["hit_vs_oracle"].as_f64().unwrap() - 0.75).abs() < 1e-9);
        assert_eq!(r["load_spread"], 0.0);
        assert_eq!(r["gateway_cpu_us_per_request"], 1000.0);
    }
}
