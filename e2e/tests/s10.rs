//! S10 of `BENCHMARKS.md`: autoscaling against a fixed fleet sized for the peak, on the
//! node, with simulated engines. The same step load runs on each: two clients, then four
//! (the load doubles), then two again (it halves). Each run reports:
//! - the time the autoscaler took to react (from the step to the new count in the spec,
//!   and to the new workers ready);
//! - SLO attainment per phase: the share of streamed requests whose first token came
//!   within the TTFT target, as the clients measured it;
//! - worker-hours: ready engine workers integrated over the run, sampled each second;
//! - failed requests.
//!
//! A benchmark, not a test: ignored unless asked for; it writes `bench/results/s10.json`.
//!
//! ```sh
//! scripts/cluster create
//! INFERA_CLUSTER_KUBECONFIG=$(scripts/cluster kubeconfig) \
//!     cargo test -p infera-e2e --test s10 -- --ignored --nocapture
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::load::{Load, LoadReport};
use infera_e2e::{Cluster, repo};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The TTFT target, seconds: the autoscaler's target and the SLO the clients judge by.
const TTFT_SLO: f64 = 0.1;

/// Phases: (name, clients, seconds).
const PHASES: [(&str, usize, u64); 3] = [("base", 2, 45), ("doubled", 4, 75), ("halved", 2, 75)];

/// Tokens per answer.
const MAX_TOKENS: u32 = 32;

fn manifest(name: &str, replicas: u32, autoscaled: bool) -> String {
    let autoscaling = if autoscaled {
        format!(
            "  autoscaling:
    minReplicas: 1
    maxReplicas: 3
    targets: {{ttftP90Seconds: {TTFT_SLO}, waitingPerWorker: 1}}
    scaleDownStabilizationSeconds: 20
    intervalSeconds: 2
"
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  model: {{name: {name}-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim, args: [--max-num-seqs, '2']}}
  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
{autoscaling}"
    )
}

/// One sample of the deployment: seconds since the load started, spec.replicas, ready.
type Sample = (f64, i64, i64);

async fn sample(cluster: &Cluster, ns: &str, name: &str) -> Option<(i64, i64)> {
    let d = cluster
        .get_json(&["get", "idep", name, "-n", ns])
        .await
        .ok()?;
    Some((
        d["spec"]["replicas"].as_i64()?,
        d["status"]["readyReplicas"].as_i64().unwrap_or(0),
    ))
}

fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

fn phase_row(name: &str, report: &LoadReport) -> Value {
    let mut ttft: Vec<f64> = report.ttft.iter().map(Duration::as_secs_f64).collect();
    ttft.sort_by(f64::total_cmp);
    let good = ttft.iter().filter(|t| **t <= TTFT_SLO).count();
    json!({
        "phase": name,
        "requests": report.ok + report.failed.len() as u64,
        "failed": report.failed.len(),
        "streamed": ttft.len(),
        "slo_attainment": if ttft.is_empty() { 0.0 } else { good as f64 / ttft.len() as f64 },
        "ttft_p50_s": percentile(&ttft, 0.5),
        "ttft_p90_s": percentile(&ttft, 0.9),
    })
}

/// First sample time at or after `from` when `hit` holds.
fn first(samples: &[Sample], from: f64, hit: impl Fn(&Sample) -> bool) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.0 >= from && hit(s))
        .map(|s| s.0 - from)
}

async fn run(cluster: &Cluster, ns: &str, name: &str, replicas: u32, autoscaled: bool) -> Value {
    cluster
        .apply(ns, &manifest(name, replicas, autoscaled))
        .await
        .unwrap();
    cluster.wait_ready(ns, name).await.unwrap();
    let gateway = cluster
        .gateway_on_node_port(ns, name, replicas as usize)
        .await
        .unwrap();
    let model = format!("{name}-model");
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let started = Instant::now();
    let sampler = {
        let (cluster, ns, name, samples) = (
            Cluster::connect().await.unwrap(),
            ns.to_owned(),
            name.to_owned(),
            samples.clone(),
        );
        tokio::spawn(async move {
            loop {
                if let Some((spec, ready)) = sample(&cluster, &ns, &name).await {
                    let t = started.elapsed().as_secs_f64();
                    samples.lock().unwrap().push((t, spec, ready));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let mut phases = Vec::new();
    let mut starts = Vec::new();
    let mut failed = 0;
    for (phase, clients, seconds) in PHASES {
        starts.push(started.elapsed().as_secs_f64());
        let load = Load::start(&gateway, &model, clients, MAX_TOKENS);
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let report = load.stop().await;
        failed += report.failed.len();
        let row = phase_row(phase, &report);
        println!("{name} {phase}: {row}");
        phases.push(row);
    }
    let total = started.elapsed().as_secs_f64();
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    // Ready workers, held until the next sample.
    let worker_seconds: f64 = samples
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) * w[0].2 as f64)
        .sum::<f64>()
        + samples
            .last()
            .map_or(0.0, |s| (total - s.0).max(0.0) * s.2 as f64);
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let initial = i64::from(replicas);
    let row = json!({
        "fleet": if autoscaled { "autoscaled" } else { "fixed" },
        "initial_workers": initial,
        "peak_workers": peak,
        "seconds": total,
        "worker_hours": worker_seconds / 3600.0,
        "failed": failed,
        // A fixed fleet never changes: no reaction to time.
        "scale_out_s": first(&samples, starts[1], |s| s.1 > initial).filter(|_| autoscaled),
        "scaled_out_ready_s": first(&samples, starts[1], |s| s.1 > initial && s.2 >= s.1)
            .filter(|_| autoscaled),
        "scale_in_s": first(&samples, starts[2], |s| s.1 == initial).filter(|_| autoscaled),
        "phases": phases,
    });
    cluster.delete_deployment(ns, name).await.unwrap();
    row
}

#[tokio::test]
#[ignore = "a benchmark: about 10 minutes on the node; writes bench/results/s10.json"]
async fn s10_autoscaled_against_a_fixed_fleet_sized_for_the_peak() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("s10").await.unwrap();
    let ns = ns.name.clone();
    let autoscaled = run(&cluster, &ns, "s10-auto", 1, true).await;
    let peak = autoscaled["peak_workers"].as_u64().unwrap().max(1) as u32;
    let fixed = run(&cluster, &ns, "s10-fixed", peak, false).await;
    let attainment =
        |r: &Value, phase: usize| r["phases"][phase]["slo_attainment"].as_f64().unwrap();
    let hours = |r: &Value| r["worker_hours"].as_f64().unwrap();
    let verdict = json!({
        "worker_hours_ratio": hours(&autoscaled) / hours(&fixed),
        "slo_points_behind": (0..PHASES.len())
            .map(|p| 100.0 * (attainment(&fixed, p) - attainment(&autoscaled, p)))
            .collect::<Vec<_>>(),
    });
    let report = json!({
        "scenario": "S10",
        "ttft_slo_s": TTFT_SLO,
        "max_tokens": MAX_TOKENS,
        "phases": PHASES.iter().map(|(n, c, s)| json!({"phase": n, "clients": c, "seconds": s})).collect::<Vec<_>>(),
        "engine": "sim (vllm flavor, h200-llama-3.1-8b profile, speedup 1), --max-num-seqs 2",
        "runs": [autoscaled, fixed],
        "verdict": verdict,
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    let out = repo().join("bench/results/s10.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    assert_eq!(
        report["runs"][0]["failed"], 0,
        "requests failed while autoscaling"
    );
}
