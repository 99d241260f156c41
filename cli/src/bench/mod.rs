//! `infera bench`: the scenarios of BENCHMARKS.md against simulated fleets, at a small
//! size in seconds or at full size in minutes. Scenario sizes are data
//! (`bench/scenarios/*.yaml`); each run prints a table and writes `<id>.json` and
//! `<id>.svg` into `--out`.

pub mod cpu;
pub mod driver;
pub mod envoy;
pub mod external;
pub mod fleet;
pub mod gaie;
pub mod ladder;
pub mod report;
pub mod s1;
pub mod s12;
pub mod s2;
pub mod s3;
pub mod s4;
pub mod s5;
pub mod s6;
pub mod s6_tiers;
pub mod s7;
pub mod s8;
pub mod s9;
pub mod stats;
pub mod under_test;
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
    /// Multi-turn sessions under KV pressure.
    S3,
    /// Prefill/decode disaggregation against mixed workers.
    S4,
    /// Control plane scale (needs --etcd).
    S5,
    /// kvd: RAM tier (arena GET vs inline GET vs memcpy), then the NVMe and Redis tiers
    /// (L3 read vs the disk's O_DIRECT read, L4 latency, prefix reload vs recompute).
    S6,
    /// Operator scale (needs --kubeconfig of a kube-apiserver with the CRDs installed).
    S7,
    /// Routing at the knee: S2's workload on a fleet run slower than real time, every
    /// policy and every --router-cmd up to and past saturation; TTFT and goodput.
    S8,
    /// The NATS request plane against HTTP, and the stall at a mid-stream migration
    /// (needs --nats of a nats-server with JetStream).
    S9,
    /// Behind a GAIE gateway: a real Envoy asking Infera's endpoint picker (ext_proc),
    /// the hop it adds and routing through it against the gateway alone.
    S12,
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
    /// Only these arrival rates (comma-separated, H200-equivalent req/s), in place of
    /// the size's ladder (S1, S2, S8's ladders, S9).
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// etcd client URL (S5 writes worker records there).
    #[arg(long, value_name = "URL")]
    pub etcd: Option<String>,
    /// S8: only these workloads (comma-separated: `shared-prefix`, `sessions`); both
    /// by default.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub workload: Vec<s8::Workload>,
    /// S6: which part, `all`, `ram` or `tiers`.
    #[arg(long, default_value = "all", value_parser = ["all", "ram", "tiers"])]
    pub s6_part: String,
    /// S6: directory for the NVMe tier (default: a temp dir under --out). Put it on the
    /// disk to measure; its filesystem is reported.
    #[arg(long, value_name = "DIR")]
    pub l3_path: Option<PathBuf>,
    /// S6: a Redis/Valkey for the distributed tier (default: start `redis-server` from
    /// PATH; without either, the L4 rows are skipped).
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
    /// NATS server URL (S9's request plane), e.g. a `nats-server -js` of testenv/build.sh.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// Admin kubeconfig of a kube-apiserver: with Infera's CRDs installed (S7); for
    /// GAIE's reference picker to read its pool from (S12).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// S12: GAIE's reference picker (`cmd/lwepp`), run beside Infera's picker when
    /// --kubeconfig names a kube-apiserver for it to read its pool from.
    #[arg(long, env = "INFERA_TESTENV_LWEPP", value_name = "PATH")]
    pub lwepp: Option<PathBuf>,
    /// S12: the folder with GAIE's InferencePool CRD (`testenv/crds.sh`).
    #[arg(long, env = "INFERA_TESTENV_CRDS_GAIE", value_name = "DIR")]
    pub gaie_crds: Option<PathBuf>,
    /// The infera-operator binary (S7); default: next to this one.
    #[arg(long, value_name = "PATH")]
    pub operator_bin: Option<PathBuf>,
    /// S1, S2, S3, S8: also measure this router on the same simulated fleet, as the
    /// run `external:NAME` (repeat for several). `NAME=` is optional (default
    /// `external`). In COMMAND, `{port}` is replaced by the port to listen on,
    /// `{metrics_port}` by another free port and `{workers}` by the simulators' URLs (one
    /// argument each), e.g. "sglang=python -m sglang_router.launch_router --host
    /// 127.0.0.1 --port {port} --prometheus-port {metrics_port} --worker-urls {workers}
    /// --policy cache_aware". S1 runs them beside the gateway; S2 and S3 run only the
    /// peers and any --policies; S8 runs them beside its own policies.
    #[arg(long = "router-cmd", value_name = "[NAME=]COMMAND")]
    pub router_cmd: Vec<String>,
    /// Pin the router under test (Infera's gateway threads or a peer's process, via
    /// `taskset`) to this core, and the driver and simulators to the other cores.
    #[arg(long, value_name = "CORE")]
    pub pin_router: Option<usize>,
}

/// What every scenario runner gets.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Seed.
    pub seed: u64,
    /// Peer routers to measure beside (or instead of) the gateway.
    pub peers: Vec<under_test::PeerRouter>,
    /// Where the router under test runs.
    pub pin: Option<under_test::Pinning>,
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
        Scenario::S3 => include_str!("../../../bench/scenarios/s3.yaml"),
        Scenario::S4 => include_str!("../../../bench/scenarios/s4.yaml"),
        Scenario::S5 => include_str!("../../../bench/scenarios/s5.yaml"),
        Scenario::S6 => include_str!("../../../bench/scenarios/s6.yaml"),
        Scenario::S7 => include_str!("../../../bench/scenarios/s7.yaml"),
        Scenario::S8 => include_str!("../../../bench/scenarios/s8.yaml"),
        Scenario::S9 => include_str!("../../../bench/scenarios/s9.yaml"),
        Scenario::S12 => include_str!("../../../bench/scenarios/s12.yaml"),
    }
}

/// Appends `more`'s runs to `into`'s and adds its verdicts.
fn merge(into: &mut Value, more: Value) {
    if let (Some(runs), Some(extra)) = (into["runs"].as_array_mut(), more["runs"].as_array()) {
        runs.extend(extra.iter().cloned());
    }
    if let (Some(v), Some(extra)) = (
        into["verdicts"].as_object_mut(),
        more["verdicts"].as_object(),
    ) {
        v.extend(extra.clone());
    }
}

/// `kv-aware-w<N>` and `kv-aware-approximate-w<N>`: (approximate, N).
fn weighted(policy: &str) -> Option<(bool, f64)> {
    let (approximate, w) = match policy.strip_prefix("kv-aware-approximate-w") {
        Some(w) => (true, w),
        None => (false, policy.strip_prefix("kv-aware-w")?),
    };
    w.parse::<f64>().ok().map(|w| (approximate, w))
}

/// Gateway flags, gateway count and whether simulators publish KV events, for a
/// policy name: `random`, `round-robin`, `kv-aware`, `kv-aware-w<N>` (weight N),
/// `kv-aware-approximate` (events ignored), `kv-aware-approximate-w<N>`,
/// `kv-aware-2-replicas`. Any of them with modifiers after `+`: `flow<MS>`, flow control
/// on with a TTFT deadline of MS milliseconds of real time; `r<N>`, N gateway replicas
/// (the driver spreads requests over them); and last `kvd` (S2, S3, S8, handled by the
/// fleet): each simulator with a kvd beside it.
pub fn policy_flags(policy: &str) -> Result<(Vec<String>, usize, bool)> {
    let mut flags: Vec<String> = vec!["--shutdown-grace-s".into(), "1".into()];
    let mut parts = policy.split('+');
    let base = parts.next().unwrap_or_default();
    let mut replicas = None;
    for modifier in parts {
        let number = |prefix: &str| {
            modifier
                .strip_prefix(prefix)
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        if let Some(ms) = number("flow") {
            flags.extend([
                "--flow-control".into(),
                "true".into(),
                "--flow-ttft-deadline-ms".into(),
                ms.to_string(),
            ]);
        } else if let Some(n) = number("r") {
            replicas = Some(n as usize);
        } else if modifier != "kvd" {
            bail!("{policy}: unknown modifier +{modifier} (+flow<MS>, +r<N>, +kvd)");
        }
    }
    let (flags, gateways, events) = base_policy_flags(base, flags)?;
    Ok((flags, replicas.unwrap_or(gateways), events))
}

fn base_policy_flags(policy: &str, mut flags: Vec<String>) -> Result<(Vec<String>, usize, bool)> {
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
        other => match weighted(other) {
            Some((approximate, w)) => {
                flags.extend([
                    "--router-policy".into(),
                    "kv-aware".into(),
                    "--kv-overlap-weight".into(),
                    w.to_string(),
                ]);
                if approximate {
                    flags.push("--kv-approximate".into());
                }
                events = !approximate;
            }
            None => bail!(
                "unknown policy {other:?} (random, round-robin, kv-aware, kv-aware-w<N>, kv-aware-approximate, kv-aware-approximate-w<N>, kv-aware-2-replicas)"
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

/// A ladder row's name: its policy, and its workload unless that is S2's.
fn run_name(r: &Value) -> String {
    let policy = r["policy"].as_str().unwrap_or("");
    match r["workload"].as_str() {
        Some(w) if w != "shared-prefix" => format!("{policy} ({w})"),
        _ => policy.to_owned(),
    }
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
        "s3" => (
            vec![
                "policy",
                "KV/working set",
                "turn",
                "TTFT p50 s",
                "hit",
                "evictions",
                "errors",
            ],
            runs.iter()
                .flat_map(|r| {
                    r["turns"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .map(move |t| {
                            vec![
                                r["policy"].as_str().unwrap_or("").to_owned(),
                                num(&r["kv_fraction"]),
                                t["turn"].to_string(),
                                num(&t["ttft_p50_s"]),
                                num(&t["hit_ratio"]),
                                r["evictions"].to_string(),
                                r["errors"].to_string(),
                            ]
                        })
                })
                .collect(),
        ),
        "s4" => (
            vec![
                "policy",
                "input",
                "output",
                "GB/s",
                "goodput",
                "TTFT p50 s",
                "TTFT p90 s",
                "ITL p50 ms",
                "ITL p99 ms",
                "gw CPU µs/req",
                "errors",
            ],
            runs.iter()
                .map(|r| {
                    vec![
                        r["policy"].as_str().unwrap_or("").to_owned(),
                        r["input"].to_string(),
                        r["output"].to_string(),
                        num(&r["transfer_gbytes_per_s"]),
                        num(&r["goodput_ratio"]),
                        num(&r["ttft_s"]["p50"]),
                        num(&r["ttft_s"]["p90"]),
                        num(&json!(r["itl_s"]["p50"].as_f64().unwrap_or(0.0) * 1e3)),
                        num(&r["itl_p99_ms"]),
                        num(&r["gateway_cpu_us_per_request"]),
                        r["errors"].to_string(),
                    ]
                })
                .collect(),
        ),
        "s6" => (
            vec![
                "mode",
                "hit ratio",
                "GET GB/s",
                "GET p50 ms",
                "GET p99 ms",
                "put p50 ms",
                "total ms",
            ],
            runs.iter()
                .map(|r| {
                    vec![
                        r["mode"].as_str().unwrap_or("").to_owned(),
                        num(&r["hit_ratio"]),
                        num(&r["get_gb_per_s"]),
                        num(&r["get_ms"]["p50"]),
                        num(&r["get_ms"]["p99"]),
                        num(&r["put_ms"]["p50"]),
                        num(&r["total_ms"]),
                    ]
                })
                .collect(),
        ),
        "s7" => (
            vec![
                "deployments",
                "seconds",
                "reconciles/s",
                "applied",
                "operator RSS MiB",
                "operator CPU s",
                "apiserver CPU s",
            ],
            runs.iter()
                .map(|r| {
                    vec![
                        r["deployments"].to_string(),
                        num(&r["seconds"]),
                        num(&r["reconciles_per_s"]),
                        num(&r["objects_applied"]),
                        num(&r["operator_peak_rss_mib"]),
                        num(&r["operator_cpu_s"]),
                        num(&r["apiserver_cpu_s"]),
                    ]
                })
                .collect(),
        ),
        "s12" => (
            vec![
                "part",
                "policy / stream",
                "rate",
                "hop added p50 µs",
                "hop added p99 µs",
                "envoy p50 ms",
                "picker p50 ms",
                "hit/oracle",
                "TTFT p90 s",
                "goodput req/s",
                "errors",
            ],
            runs.iter()
                .map(|r| {
                    let dash = |v: &Value| if v.is_null() { "-".into() } else { num(v) };
                    let hop = r["part"] == "hop";
                    vec![
                        r["part"].as_str().unwrap_or("").to_owned(),
                        if hop {
                            if r["stream"] == true {
                                "stream".into()
                            } else {
                                "unary".into()
                            }
                        } else {
                            r["policy"].as_str().unwrap_or("").to_owned()
                        },
                        num(&r["rate"]),
                        dash(&r["hop_added_p50_us"]),
                        dash(&r["hop_added_p99_us"]),
                        dash(&r["routers"]["envoy"]["p50_ms"]),
                        dash(&r["routers"]["envoy+picker"]["p50_ms"]),
                        dash(&r["hit_vs_oracle"]),
                        dash(&r["ttft_s"]["p90"]),
                        dash(&r["goodput_req_s"]),
                        r["errors"].to_string(),
                    ]
                })
                .collect(),
        ),
        "s9" => (
            vec![
                "part",
                "transport",
                "rate",
                "stream",
                "p50 ms",
                "added p50 µs",
                "stall p50 ms",
                "stall p90 ms",
                "usual gap ms",
                "carried prefill ms",
                "lost/repeated",
                "errors",
            ],
            runs.iter()
                .map(|r| {
                    let dash = |v: &Value| if v.is_null() { "-".into() } else { num(v) };
                    vec![
                        r["part"].as_str().unwrap_or("").to_owned(),
                        r["transport"].as_str().unwrap_or("").to_owned(),
                        dash(&r["rate"]),
                        r.get("stream").map_or("-".into(), Value::to_string),
                        dash(&r["p50_ms"]),
                        dash(&r["added_p50_us"]),
                        dash(&r["stall_ms_p50"]),
                        dash(&r["stall_ms_p90"]),
                        dash(&r["usual_gap_ms_p50"]),
                        dash(&r["carried_prefill_ms"]),
                        dash(&r["tokens_lost_or_repeated"]),
                        r.get("errors")
                            .or_else(|| r.get("failed"))
                            .map_or("-".into(), Value::to_string),
                    ]
                })
                .collect(),
        ),
        "s5" => (
            vec![
                "records",
                "all routable s",
                "join p50 ms",
                "join p99 ms",
                "leave p99 ms",
                "idle CPU %",
                "index ops/s",
                "B/block",
                "decision µs",
            ],
            runs.iter()
                .map(|r| {
                    vec![
                        r["records"].to_string(),
                        num(&r["all_routable_s"]),
                        num(&r["join_to_routable_ms"]["p50"]),
                        num(&r["join_to_routable_ms"]["p99"]),
                        num(&r["leave_to_gone_ms"]["p99"]),
                        num(&r["idle_gateway_cpu_percent"]),
                        num(&r["index_inserts_per_s"]),
                        num(&r["index_bytes_per_block"]),
                        num(&r["route_decision_us"]),
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
                "goodput req/s",
                "good",
                "router CPU µs/req",
                "driver CPU",
                "errors",
            ],
            runs.iter()
                .map(|r| {
                    vec![
                        run_name(r),
                        num(&r["rate"]),
                        num(&r["ttft_s"]["p50"]),
                        num(&r["ttft_s"]["p90"]),
                        num(&r["output_tok_per_s"]),
                        num(&r["hit_ratio"]),
                        num(&r["oracle_hit_ratio"]),
                        num(&r["hit_vs_oracle"]),
                        num(&r["load_spread"]),
                        num(&r["goodput_req_s"]),
                        num(&r["good_share"]),
                        num(&r["gateway_cpu_us_per_request"]),
                        num(&r["driver_cpu_share"]),
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
    if id == "s3" {
        for r in &runs {
            let name = format!(
                "{} @ {}x",
                r["policy"].as_str().unwrap_or(""),
                r["kv_fraction"]
            );
            let pts = r["turns"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|t| {
                    (
                        t["turn"].as_f64().unwrap_or(0.0),
                        t["hit_ratio"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect();
            series.push((name, pts));
        }
        return svg_plot(&format!("S3 {title}"), "turn", "prefix hit ratio", &series);
    }
    if id == "s4" {
        for r in &runs {
            let name = match r["transfer_gbytes_per_s"].as_f64() {
                Some(g) => format!("{} {g} GB/s", r["policy"].as_str().unwrap_or("")),
                None => r["policy"].as_str().unwrap_or("").to_owned(),
            };
            let point = (
                r["input"].as_f64().unwrap_or(0.0),
                r["goodput_ratio"].as_f64().unwrap_or(0.0),
            );
            match series.iter_mut().find(|(n, _)| *n == name) {
                Some((_, pts)) => pts.push(point),
                None => series.push((name, vec![point])),
            }
        }
        return svg_plot(
            &format!("S4 {title}"),
            "input tokens",
            "goodput (share of requests in SLO)",
            &series,
        );
    }
    if id == "s6" {
        let pts = runs
            .iter()
            .enumerate()
            .map(|(i, r)| (i as f64 + 1.0, r["get_gb_per_s"].as_f64().unwrap_or(0.0)))
            .collect();
        let names: Vec<String> = runs
            .iter()
            .enumerate()
            .map(|(i, r)| format!("{} {}", i + 1, r["mode"].as_str().unwrap_or("")))
            .collect();
        series.push((format!("GET GB/s: {}", names.join(", ")), pts));
        return svg_plot(&format!("S6 {title}"), "mode", "GB/s", &series);
    }
    if id == "s7" {
        let pts = runs
            .iter()
            .map(|r| {
                (
                    r["deployments"].as_f64().unwrap_or(0.0),
                    r["seconds"].as_f64().unwrap_or(0.0),
                )
            })
            .collect();
        series.push(("time to reconcile all (s)".into(), pts));
        return svg_plot(
            &format!("S7 {title}"),
            "InferaDeployments",
            "seconds",
            &series,
        );
    }
    if id == "s5" {
        let r = runs.first().cloned().unwrap_or(Value::Null);
        let pts = ["p50", "p90", "p99"]
            .iter()
            .enumerate()
            .map(|(i, q)| {
                (
                    i as f64 + 1.0,
                    r["join_to_routable_ms"][q].as_f64().unwrap_or(0.0),
                )
            })
            .collect();
        series.push(("join to routable (ms) at p50, p90, p99".into(), pts));
        return svg_plot(
            &format!("S5 {title}"),
            "quantile (1 = p50, 2 = p90, 3 = p99)",
            "ms",
            &series,
        );
    }
    let (key, y): (&str, fn(&Value) -> f64) = match id {
        "s1" | "s9" => ("stream", |r| r["added_p50_us"].as_f64().unwrap_or(0.0)),
        "s8" => ("policy", |r| r["ttft_s"]["p90"].as_f64().unwrap_or(0.0)),
        _ => ("policy", |r| r["ttft_s"]["p50"].as_f64().unwrap_or(0.0)),
    };
    for r in runs
        .iter()
        .filter(|r| r["part"] != "migration" && r["part"] != "hop")
    {
        let name = match id {
            "s9" => format!(
                "{} {}",
                r["transport"].as_str().unwrap_or(""),
                if r[key] == true { "streaming" } else { "unary" }
            ),
            "s1" => {
                if r[key] == true {
                    "streaming".to_owned()
                } else {
                    "unary".to_owned()
                }
            }
            _ => run_name(r),
        };
        let point = (r["rate"].as_f64().unwrap_or(0.0), y(r));
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push(point),
            None => series.push((name, vec![point])),
        }
    }
    let y_label = if id == "s1" || id == "s9" {
        "latency added by the gateway, p50 (µs)"
    } else if id == "s8" {
        "TTFT p90 (s, H200-equivalent)"
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

/// Raises this process's open-file limit to its hard limit: a load ladder holds
/// thousands of sockets (client and server sides are both in this process).
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write only the struct passed by pointer.
    #[allow(unsafe_code)]
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Runs `infera bench`.
pub async fn run(args: BenchArgs) -> Result<()> {
    let file: ScenarioFile =
        serde_saphyr::from_str(scenario_file(args.scenario)).context("scenario file")?;
    let size_name = if args.small { "small" } else { "full" };
    let mut size = if args.small {
        file.small.clone()
    } else {
        file.full.clone()
    };
    if !args.rates.is_empty() {
        if size.get("rates").is_none() {
            bail!("--rates: scenario {} has no arrival-rate ladder", file.id);
        }
        size["rates"] = json!(args.rates);
        if size.get("sessions").is_some() {
            size["sessions"]["rates"] = json!(args.rates);
        }
    }
    let size = &size;
    let peers: Vec<under_test::PeerRouter> = args
        .router_cmd
        .iter()
        .map(|c| under_test::PeerRouter::parse(c))
        .collect();
    let mut policies = if !args.policies.is_empty() {
        args.policies.clone()
    } else if peers.is_empty() || args.scenario == Scenario::S8 {
        file.policies.clone()
    } else {
        Vec::new()
    };
    if matches!(args.scenario, Scenario::S2 | Scenario::S3 | Scenario::S8) {
        for p in &policies {
            policy_flags(p.strip_suffix(ladder::KVD_SUFFIX).unwrap_or(p))?;
        }
    }
    policies.extend(peers.iter().map(under_test::PeerRouter::policy));
    raise_open_files_limit();
    let ctx = Ctx {
        seed: args.seed,
        peers,
        pin: args.pin_router.map(under_test::Pinning::on).transpose()?,
    };
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
        Scenario::S8 => {
            let workloads = if args.workload.is_empty() {
                vec![s8::Workload::SharedPrefix, s8::Workload::Sessions]
            } else {
                args.workload.clone()
            };
            s8::run(
                &ctx,
                &serde_json::from_value(size.clone())?,
                &policies,
                &file.profile,
                &workloads,
            )
            .await?
        }
        Scenario::S12 => {
            let size = serde_json::from_value(size.clone())?;
            let reference = match &args.kubeconfig {
                Some(kubeconfig) => Some(gaie::Reference {
                    kubeconfig: kubeconfig.clone(),
                    lwepp: args.lwepp.clone().context(
                        "s12 with --kubeconfig runs GAIE's reference picker: pass --lwepp PATH (testenv/build.sh builds it; INFERA_TESTENV_LWEPP)",
                    )?,
                    crds: args.gaie_crds.clone().context(
                        "s12 with --kubeconfig installs GAIE's InferencePool CRD: pass --gaie-crds DIR (testenv/crds.sh fetches it; INFERA_TESTENV_CRDS_GAIE)",
                    )?,
                }),
                None => None,
            };
            s12::run(&ctx, &size, &file.profile, &args.rates, reference.as_ref()).await?
        }
        Scenario::S3 => {
            let size = serde_json::from_value(size.clone())?;
            s3::run(&ctx, &size, &policies, &file.profile).await?
        }
        Scenario::S4 => {
            let size = serde_json::from_value(size.clone())?;
            s4::run(&ctx, &size, &policies, &file.profile).await?
        }
        Scenario::S5 => {
            let Some(etcd) = &args.etcd else {
                bail!(
                    "s5 writes worker records into a real etcd: pass --etcd URL (testenv/build.sh builds one; scripts/test starts one)"
                );
            };
            s5::run(&ctx, &serde_json::from_value(size.clone())?, etcd).await?
        }
        Scenario::S6 => {
            let kvd = std::env::current_exe()?.with_file_name("infera-kvd");
            let mut result = json!({"runs": [], "verdicts": {}});
            if args.s6_part != "tiers" {
                result = s6::run(&ctx, &serde_json::from_value(size.clone())?, &kvd)?;
            }
            if args.s6_part != "ram" {
                let profile = infera_sim::profile::LatencyProfile::builtin(&file.profile)
                    .with_context(|| format!("unknown profile {}", file.profile))?;
                let tiers = s6_tiers::TierSize::from_value(size)?;
                let recompute_ms = profile.prefill_ms(tiers.prefix_tokens(), 0);
                let target = s6_tiers::TierTarget {
                    l3_path: args.l3_path.clone(),
                    redis_url: args.redis_url.clone(),
                    out: args.out.clone(),
                };
                let more = s6_tiers::run(&tiers, &kvd, &target, recompute_ms)?;
                merge(&mut result, more);
            }
            result
        }
        Scenario::S9 => {
            let Some(nats) = &args.nats else {
                bail!(
                    "s9 sends requests over a real NATS server: pass --nats URL (testenv/build.sh builds nats-server; run it with -js)"
                );
            };
            s9::run(
                &ctx,
                &serde_json::from_value(size.clone())?,
                &file.profile,
                nats,
            )
            .await?
        }
        Scenario::S7 => {
            let Some(kubeconfig) = args.kubeconfig.clone() else {
                bail!(
                    "s7 runs the operator against a real kube-apiserver: pass --kubeconfig PATH (`infera-testenv up --env-file F` starts one; `infera crds` and kubectl apply -f crds/ install the CRDs)"
                );
            };
            let operator = match &args.operator_bin {
                Some(p) => p.clone(),
                None => std::env::current_exe()?.with_file_name("infera-operator"),
            };
            std::fs::create_dir_all(&args.out)?;
            let target = s7::Target {
                kubeconfig,
                operator,
                out: args.out.clone(),
            };
            s7::run(&ctx, &serde_json::from_value(size.clone())?, &target).await?
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
