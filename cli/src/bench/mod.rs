//! `infera bench`: the scenarios of BENCHMARKS.md against simulated fleets, at a small
//! size in seconds or at full size in minutes. Scenario sizes are data
//! (`bench/scenarios/*.yaml`); each run prints a table and writes `<id>.json` and
//! `<id>.svg` into `--out`.

pub mod cpu;
pub mod driver;
pub mod fleet;
pub mod report;
pub mod s1;
pub mod s2;
pub mod stats;
pub mod workload;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use report::{num, svg_plot, table};
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::PathBuf;

/// A scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Proxy overhead: gateway CPU per request and added latency.
    S1,
    /// Shared-prefix routing: policies compared on TTFT and cache hits.
    S2,
}

/// `infera bench` flags.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Which scenario.
    pub scenario: Scenario,
    /// The small size (seconds), as CI runs it; default the full size (minutes).
    #[arg(long)]
    pub small: bool,
    /// Folder for `<scenario>.json` and `<scenario>.svg`.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Seed of every random choice (workloads, arrivals).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Only these policies (comma-separated), where the scenario compares policies.
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
}

/// What every scenario runner gets.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Seed.
    pub seed: u64,
}

#[derive(Debug, Deserialize)]
struct ScenarioFile {
    id: String,
    title: String,
    profile: String,
    small: Value,
    full: Value,
    #[serde(default)]
    policies: Vec<String>,
}

fn scenario_file(s: Scenario) -> &'static str {
    match s {
        Scenario::S1 => include_str!("../../../bench/scenarios/s1.yaml"),
        Scenario::S2 => include_str!("../../../bench/scenarios/s2.yaml"),
    }
}

/// Gateway flags, gateway count and whether simulators publish KV events, for a
/// policy name: `random`, `round-robin`, `kv-aware`, `kv-aware-w<N>` (weight N),
/// `kv-aware-approximate` (events ignored), `kv-aware-2-replicas`.
pub fn policy_flags(policy: &str) -> Result<(Vec<String>, usize, bool)> {
    let mut flags: Vec<String> = vec!["--shutdown-grace-s".into(), "1".into()];
    let mut gateways = 1;
    let mut events = false;
    match policy {
        "random" | "round-robin" => flags.extend(["--router-policy".into(), policy.into()]),
        "kv-aware" => {
            flags.extend(["--router-policy".into(), "kv-aware".into()]);
            events = true;
        }
        "kv-aware-approximate" => {
            flags.extend([
                "--router-policy".into(),
                "kv-aware".into(),
                "--kv-approximate".into(),
            ]);
        }
        "kv-aware-2-replicas" => {
            flags.extend(["--router-policy".into(), "kv-aware".into()]);
            gateways = 2;
            events = true;
        }
        other => match other
            .strip_prefix("kv-aware-w")
            .and_then(|w| w.parse::<f64>().ok())
        {
            Some(w) => {
                flags.extend([
                    "--router-policy".into(),
                    "kv-aware".into(),
                    "--kv-overlap-weight".into(),
                    w.to_string(),
                ]);
                events = true;
            }
            None => bail!(
                "unknown policy {other:?} (random, round-robin, kv-aware, kv-aware-w<N>, kv-aware-approximate, kv-aware-2-replicas)"
            ),
        },
    }
    Ok((flags, gateways, events))
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb = mem
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    json!({"cpu": model, "cores": cores, "memory_gib": mem_kb / (1024 * 1024)})
}

fn rows(id: &str, result: &Value) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let runs = result["runs"].as_array().cloned().unwrap_or_default();
    match id {
        "s1" => (
            vec![
                "rate",
                "stream",
                "achieved",
                "direct p50 ms",
                "gw p50 ms",
                "added p50 µs",
                "added p99 µs",
                "gw CPU µs/req",
                "errors",
            ],
            runs.iter()
                .map(|r| {
                    vec![
                        num(&r["rate"]),
                        r["stream"].to_string(),
                        num(&r["achieved_rate"]),
                        num(&r["direct_ms"]["p50"]),
                        num(&r["gateway_ms"]["p50"]),
                        num(&r["added_p50_us"]),
                        num(&r["added_p99_us"]),
                        num(&r["gateway_cpu_us_per_request"]),
                        r["errors"].to_string(),
                    ]
                })
                .collect(),
        ),
        _ => (
            vec![
                "policy",
                "rate",
                "TTFT p50 s",
                "TTFT p90 s",
                "tok/s",
                "hit",
                "oracle",
                "hit/oracle",
                "spread",
                "gw CPU µs/req",
                "errors",
            ],
            runs.iter()
                .map(|r| {
                    vec![
                        r["policy"].as_str().unwrap_or("").to_owned(),
                        num(&r["rate"]),
                        num(&r["ttft_s"]["p50"]),
                        num(&r["ttft_s"]["p90"]),
                        num(&r["output_tok_per_s"]),
                        num(&r["hit_ratio"]),
                        num(&r["oracle_hit_ratio"]),
                        num(&r["hit_vs_oracle"]),
                        num(&r["load_spread"]),
                        num(&r["gateway_cpu_us_per_request"]),
                        r["errors"].to_string(),
                    ]
                })
                .collect(),
        ),
    }
}

fn plot(id: &str, title: &str, result: &Value) -> String {
    let runs = result["runs"].as_array().cloned().unwrap_or_default();
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let (key, y): (&str, fn(&Value) -> f64) = match id {
        "s1" => ("stream", |r| r["added_p50_us"].as_f64().unwrap_or(0.0)),
        _ => ("policy", |r| r["ttft_s"]["p50"].as_f64().unwrap_or(0.0)),
    };
    for r in &runs {
        let name = match id {
            "s1" => {
                if r[key] == true {
                    "streaming".to_owned()
                } else {
                    "unary".to_owned()
                }
            }
            _ => r[key].as_str().unwrap_or("").to_owned(),
        };
        let point = (r["rate"].as_f64().unwrap_or(0.0), y(r));
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push(point),
            None => series.push((name, vec![point])),
        }
    }
    let y_label = if id == "s1" {
        "latency added by the gateway, p50 (µs)"
    } else {
        "TTFT p50 (s, H200-equivalent)"
    };
    svg_plot(
        &format!("{} {title}", id.to_uppercase()),
        "arrival rate (req/s)",
        y_label,
        &series,
    )
}

/// Runs `infera bench`.
pub async fn run(args: BenchArgs) -> Result<()> {
    let file: ScenarioFile =
        serde_saphyr::from_str(scenario_file(args.scenario)).context("scenario file")?;
    let size_name = if args.small { "small" } else { "full" };
    let size = if args.small { &file.small } else { &file.full };
    let policies = if args.policies.is_empty() {
        file.policies.clone()
    } else {
        args.policies.clone()
    };
    for p in &policies {
        policy_flags(p)?;
    }
    let ctx = Ctx { seed: args.seed };
    eprintln!(
        "infera bench {} ({}), {size_name} size: {size}",
        file.id, file.title
    );
    let started = std::time::Instant::now();
    let result = match args.scenario {
        Scenario::S1 => {
            s1::run(&ctx, &serde_json::from_value(size.clone())?, &file.profile).await?
        }
        Scenario::S2 => {
            s2::run(
                &ctx,
                &serde_json::from_value(size.clone())?,
                &policies,
                &file.profile,
            )
            .await?
        }
    };
    let report = json!({
        "scenario": file.id,
        "title": file.title,
        "size": size_name,
        "sizes": size,
        "profile": file.profile,
        "seed": args.seed,
        "machine": machine(),
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "wall_s": started.elapsed().as_secs_f64(),
        "driver_cpu_s": cpu::threads_cpu("infera-drv").as_secs_f64(),
        "peak_rss_bytes": cpu::peak_rss(None),
        "runs": result["runs"],
        "verdicts": result["verdicts"],
    });
    let (header, rows) = rows(&file.id, &report);
    println!("{}", table(&header, &rows));
    println!(
        "verdicts: {}",
        serde_json::to_string_pretty(&report["verdicts"])?
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let json_path = args.out.join(format!("{}.json", file.id));
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
    let svg_path = args.out.join(format!("{}.svg", file.id));
    std::fs::write(&svg_path, plot(&file.id, &file.title, &report))?;
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}
