//! S8 routing at the knee: S2's shared-prefix workload and S3's multi-turn sessions on a
//! fleet run slower than real time (`speedup` below 1), so the machine can drive it past
//! saturation; every policy and every peer router at each rate. The verdicts find each
//! router's knee and compare Infera's kv-aware policies with the best peer there and
//! below it (pure, on the rows), for each workload.

use super::Ctx;
use super::s2::ladder;
use super::s3::{SessionsSize, sessions_ladder};
use super::under_test::EXTERNAL;
use anyhow::{Result, bail};
use serde::Deserialize;
use serde_json::{Value, json};

/// Sizes of S8: S2's sizes for the shared-prefix ladder, and the sessions ladder's.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    #[serde(flatten)]
    shared_prefix: super::s2::Size,
    sessions: Option<SessionsSize>,
}

/// S8's workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// S2's groups of prompts sharing a long system prompt.
    SharedPrefix,
    /// S3's multi-turn conversations, arriving as sessions.
    Sessions,
}

impl Workload {
    /// Its name in rows and verdicts.
    pub fn name(self) -> &'static str {
        match self {
            Workload::SharedPrefix => "shared-prefix",
            Workload::Sessions => "sessions",
        }
    }
}

/// A router's knee: the highest rate at which at least this share of its requests met
/// the latency targets.
pub const KNEE_GOOD_SHARE: f64 = 0.9;

/// Runs S8's `workloads`.
pub async fn run(
    ctx: &Ctx,
    size: &Size,
    policies: &[String],
    profile: &str,
    workloads: &[Workload],
) -> Result<Value> {
    // Every router is measured on fresh connections (see `client_per_request`).
    let client = super::driver::client_per_request()?;
    let mut runs = Vec::new();
    let mut by_workload = serde_json::Map::new();
    for &workload in workloads {
        let mut rows = match workload {
            Workload::SharedPrefix => {
                ladder("s8", &client, ctx, &size.shared_prefix, policies, profile).await?
            }
            Workload::Sessions => {
                let Some(sessions) = &size.sessions else {
                    bail!("this S8 size has no sessions ladder");
                };
                sessions_ladder(&client, ctx, sessions, policies, profile).await?
            }
        };
        for r in &mut rows {
            r["workload"] = json!(workload.name());
        }
        by_workload.insert(workload.name().into(), verdicts(&rows));
        runs.extend(rows);
    }
    Ok(json!({"verdicts": by_workload, "runs": runs}))
}

fn metric(runs: &[Value], policy: &str, rate: f64, path: &[&str]) -> Option<f64> {
    let run = runs
        .iter()
        .find(|r| r["policy"] == policy && r["rate"].as_f64() == Some(rate))?;
    path.iter().try_fold(run, |v, k| v.get(*k))?.as_f64()
}

/// The highest rate at which `policy` kept [`KNEE_GOOD_SHARE`] of its requests good.
pub fn knee(runs: &[Value], policy: &str, rates: &[f64]) -> Option<f64> {
    rates
        .iter()
        .copied()
        .filter(|&r| metric(runs, policy, r, &["good_share"]).is_some_and(|g| g >= KNEE_GOOD_SHARE))
        .reduce(f64::max)
}

/// Ours against the best baseline (the best peer, or round-robin without peers): each
/// one's knee, and at the baseline's knee and the first rate past it, the ratios
/// baseline/ours of TTFT p90 and ours/baseline of goodput; below the knee, the worst of
/// those ratios.
pub fn verdicts(runs: &[Value]) -> Value {
    let mut rates: Vec<f64> = runs.iter().filter_map(|r| r["rate"].as_f64()).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let mut policies: Vec<String> = Vec::new();
    for r in runs {
        if let Some(p) = r["policy"].as_str()
            && !policies.iter().any(|q| q == p)
        {
            policies.push(p.to_owned());
        }
    }
    let knees: serde_json::Map<String, Value> = policies
        .iter()
        .map(|p| (p.clone(), json!(knee(runs, p, &rates))))
        .collect();
    let peers: Vec<&String> = policies
        .iter()
        .filter(|p| p.starts_with(EXTERNAL))
        .collect();
    let baselines: Vec<&String> = if peers.is_empty() {
        policies.iter().filter(|p| *p == "round-robin").collect()
    } else {
        peers
    };
    // The best baseline: the highest knee, then the lowest TTFT p90 there.
    let best = baselines.iter().copied().max_by(|a, b| {
        let ka = knee(runs, a, &rates).unwrap_or(0.0);
        let kb = knee(runs, b, &rates).unwrap_or(0.0);
        let pa = metric(runs, a, ka, &["ttft_s", "p90"]).unwrap_or(f64::MAX);
        let pb = metric(runs, b, kb, &["ttft_s", "p90"]).unwrap_or(f64::MAX);
        ka.total_cmp(&kb).then(pb.total_cmp(&pa))
    });
    let Some(best) = best else {
        return json!({"knees": knees, "note": "no baseline (a peer router or round-robin) was run"});
    };
    let at = knee(runs, best, &rates).or_else(|| rates.first().copied());
    let past = at.and_then(|k| rates.iter().copied().find(|r| *r > k));
    let compare = |ours: &str, rate: Option<f64>| {
        let rate = rate?;
        let ttft = metric(runs, best, rate, &["ttft_s", "p90"])?
            / metric(runs, ours, rate, &["ttft_s", "p90"])?.max(1e-9);
        let goodput = metric(runs, ours, rate, &["goodput_req_s"])?
            / metric(runs, best, rate, &["goodput_req_s"])?.max(1e-9);
        Some(
            json!({"rate": rate, "ttft_p90_baseline_over_ours": ttft, "goodput_ours_over_baseline": goodput}),
        )
    };
    let ours: serde_json::Map<String, Value> = policies
        .iter()
        .filter(|p| p.starts_with("kv-aware"))
        .map(|p| {
            let below = rates
                .iter()
                .copied()
                .filter(|r| at.is_some_and(|k| *r < k))
                .filter_map(|r| {
                    Some(
                        metric(runs, best, r, &["ttft_s", "p90"])?
                            / metric(runs, p, r, &["ttft_s", "p90"])?.max(1e-9),
                    )
                })
                .reduce(f64::min);
            (
                p.clone(),
                json!({
                    "at_knee": compare(p, at),
                    "past_knee": compare(p, past),
                    "worst_ttft_p90_ratio_below_knee": below,
                }),
            )
        })
        .collect();
    json!({
        "knees": knees,
        "baseline": best,
        "knee_rate": at,
        "ours": ours,
        "targets": {"at_knee": "TTFT p90 and goodput >= 1.5x the best peer", "below_knee": "never worse (ratio >= 1)"},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &str, rate: f64, good: f64, p90: f64, goodput: f64) -> Value {
        json!({"policy": policy, "rate": rate, "good_share": good,
               "ttft_s": {"p90": p90}, "goodput_req_s": goodput})
    }

    #[test]
    fn knees_and_ratios_against_the_best_peer() {
        let runs = vec![
            row("kv-aware", 10.0, 1.0, 0.1, 10.0),
            row("kv-aware", 20.0, 1.0, 0.2, 20.0),
            row("kv-aware", 30.0, 0.95, 0.5, 28.0),
            row("external:a", 10.0, 1.0, 0.2, 10.0),
            row("external:a", 20.0, 0.5, 3.0, 10.0),
            row("external:a", 30.0, 0.1, 6.0, 3.0),
            row("external:b", 10.0, 1.0, 0.15, 10.0),
            row("external:b", 20.0, 0.92, 0.6, 18.0),
            row("external:b", 30.0, 0.2, 5.0, 6.0),
        ];
        let v = verdicts(&runs);
        assert_eq!(v["knees"]["kv-aware"], 30.0);
        assert_eq!(v["knees"]["external:a"], 10.0);
        assert_eq!(
            v["baseline"], "external:b",
            "the peer with the highest knee"
        );
        assert_eq!(v["knee_rate"], 20.0);
        let at = &v["ours"]["kv-aware"]["at_knee"];
        assert!((at["ttft_p90_baseline_over_ours"].as_f64().unwrap() - 3.0).abs() < 1e-9);
        assert!((at["goodput_ours_over_baseline"].as_f64().unwrap() - 20.0 / 18.0).abs() < 1e-9);
        assert_eq!(v["ours"]["kv-aware"]["past_knee"]["rate"], 30.0);
        assert!(
            (v["ours"]["kv-aware"]["worst_ttft_p90_ratio_below_knee"]
                .as_f64()
                .unwrap()
                - 1.5)
                .abs()
                < 1e-9
        );
    }

    #[test]
    fn without_peers_round_robin_is_the_baseline() {
        let runs = vec![
            row("round-robin", 10.0, 0.5, 2.0, 5.0),
            row("kv-aware", 10.0, 1.0, 0.5, 10.0),
        ];
        let v = verdicts(&runs);
        assert_eq!(v["baseline"], "round-robin");
        assert_eq!(v["knees"]["round-robin"], Value::Null);
        assert_eq!(v["ours"]["kv-aware"]["at_knee"]["rate"], 10.0);
    }
}
