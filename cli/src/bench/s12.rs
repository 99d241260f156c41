//! S12 behind a GAIE gateway: a real Envoy (`--concurrency 1`) in front of the fleet.
//! The hop: S1's workload through Envoy's own round robin (`plain`) and through Envoy
//! asking Infera's endpoint picker (`picked`, ext_proc over TLS), beside direct-to-sim
//! and the gateway alone, on one fleet in one run: what the ext_proc hop adds. The
//! routing: S2's workload with kv-aware routing through the gateway alone and through
//! Envoy and the picker, each on a fresh fleet per rate: hit ratio against the oracle,
//! TTFT p90, goodput.

use super::Ctx;
use super::driver::open_loop;
use super::envoy::{Envoy, Ready, h2_client};
use super::fleet::{Fleet, MODEL};
use super::gaie::{Lwepp, Reference};
use super::ladder::{measure, row};
use super::s2;
use super::stats::quantile;
use super::under_test::BEHIND_ENVOY;
use super::workload::{Rng, text};
use anyhow::{Result, bail};
use serde::Deserialize;
use serde_json::{Value, json};

/// The hop's sizes (S1's workload).
#[derive(Debug, Clone, Deserialize)]
pub struct HopSize {
    workers: usize,
    prompt_bytes: usize,
    output_tokens: usize,
    rates: Vec<f64>,
    step_seconds: f64,
    speedup: f64,
}

/// Sizes of S12.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    hop: HopSize,
    routing: s2::Size,
}

/// p50 and p99 (ms) of the successful requests' end-to-end times, and the errors.
fn latency(out: &[super::driver::Outcome]) -> (f64, f64, usize) {
    let e2e: Vec<f64> = out.iter().filter(|o| o.ok).map(|o| o.e2e).collect();
    (
        quantile(&e2e, 0.5) * 1e3,
        quantile(&e2e, 0.99) * 1e3,
        out.iter().filter(|o| !o.ok).count(),
    )
}

/// The hop: one fleet (a round-robin gateway serving the picker too), one Envoy.
async fn hop(ctx: &Ctx, size: &HopSize, profile: &str, rates: &[f64]) -> Result<Vec<Value>> {
    let sims = super::s1::sims(size.workers, size.speedup, profile);
    let flags: Vec<String> = [
        "--router-policy",
        "round-robin",
        "--shutdown-grace-s",
        "1",
        "--epp-port",
        "0",
        "--epp-health-port",
        "0",
    ]
    .map(String::from)
    .to_vec();
    let fleet = Fleet::start(&sims, 1, &flags).await?;
    let Some(epp) = fleet.gateways.first().and_then(|g| g.epp) else {
        bail!("the fleet's gateway serves no endpoint picker");
    };
    let addrs: Vec<_> = fleet.sims.iter().map(|s| s.addr).collect();
    let envoy = Envoy::start(epp.ext_proc, &addrs, Ready::Picked).await?;
    let client = super::driver::client()?;
    let mut rng = Rng::new(ctx.seed);
    let prompt = text(&mut rng, size.prompt_bytes);
    let path = "/v1/completions";
    let targets = [
        ("direct", fleet.sim_urls(path)),
        ("envoy", vec![format!("{}{path}", envoy.plain)]),
        ("envoy+picker", vec![format!("{}{path}", envoy.picked)]),
        ("gateway", fleet.gateway_urls(path)),
    ];
    let mut rows = Vec::new();
    for &rate in rates {
        let n = (rate * size.step_seconds).round() as usize;
        for stream in [false, true] {
            let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": size.output_tokens, "stream": stream});
            let mut by = serde_json::Map::new();
            for (name, urls) in &targets {
                let label = format!(
                    "s12 hop {name} {} @ {rate}/s",
                    if stream { "stream" } else { "unary" }
                );
                let out =
                    open_loop(&client, urls, vec![body.clone(); n], rate, ctx.seed, &label).await;
                let (p50, p99, errors) = latency(&out);
                by.insert(
                    (*name).to_owned(),
                    json!({"p50_ms": p50, "p99_ms": p99, "errors": errors}),
                );
            }
            let ms = |name: &str, q: &str| by[name][q].as_f64().unwrap_or(0.0);
            let errors: u64 = by.values().filter_map(|v| v["errors"].as_u64()).sum();
            rows.push(json!({
                "part": "hop",
                "rate": rate,
                "stream": stream,
                "requests": n,
                "errors": errors,
                "routers": by.clone(),
                // What asking the picker adds to Envoy's own balancing.
                "hop_added_p50_us": (ms("envoy+picker", "p50_ms") - ms("envoy", "p50_ms")) * 1e3,
                "hop_added_p99_us": (ms("envoy+picker", "p99_ms") - ms("envoy", "p99_ms")) * 1e3,
                "envoy_added_p50_us": (ms("envoy", "p50_ms") - ms("direct", "p50_ms")) * 1e3,
                "gateway_added_p50_us": (ms("gateway", "p50_ms") - ms("direct", "p50_ms")) * 1e3,
            }));
        }
    }
    envoy.stop().await;
    fleet.shutdown().await;
    Ok(rows)
}

/// The policy name of GAIE's reference picker behind Envoy.
const REFERENCE: &str = "envoy:lwepp";

/// S2's workload through Envoy asking GAIE's reference picker (round robin over the
/// pool), on its `streamed` listener from an HTTP/2 client (the one way it routes a
/// request with a body), a fresh fleet per rate.
async fn routing_reference(
    ctx: &Ctx,
    size: &s2::Size,
    profile: &str,
    reference: &Reference,
) -> Result<Vec<Value>> {
    let work = s2::workload(ctx, size, profile);
    let client = h2_client()?;
    let mut rows = Vec::new();
    for &rate in &size.rates {
        let fleet = Fleet::start(&work.sims, 0, &[]).await?;
        let ports: Vec<u16> = fleet.sims.iter().map(|s| s.addr.port()).collect();
        let addrs: Vec<_> = fleet.sims.iter().map(|s| s.addr).collect();
        let lwepp = Lwepp::start(reference, &ports).await?;
        let epp = std::net::SocketAddr::from(([127, 0, 0, 1], lwepp.port));
        let envoy = Envoy::start(epp, &addrs, Ready::Streamed).await?;
        let urls = vec![format!("{}/v1/completions", envoy.streamed)];
        let label = format!("s12 {REFERENCE} @ {rate}/s");
        let cpu0 = envoy.cpu();
        let load = open_loop(
            &client,
            &urls,
            work.bodies.clone(),
            rate * size.speedup(),
            ctx.seed,
            &label,
        );
        // Envoy's process (lwepp's own CPU is not counted).
        let step = measure(&fleet, load, || {
            envoy.cpu().saturating_sub(cpu0).as_secs_f64()
        })
        .await;
        envoy.stop().await;
        lwepp.stop().await;
        fleet.shutdown().await;
        let mut r = Value::Object(row(
            REFERENCE,
            rate,
            &step,
            size.speedup(),
            size.slo(),
            work.oracle,
        ));
        r["part"] = json!("routing");
        rows.push(r);
    }
    Ok(rows)
}

/// Runs S12 (with GAIE's reference picker when `reference` says where it is).
pub async fn run(
    ctx: &Ctx,
    size: &Size,
    profile: &str,
    rates: &[f64],
    reference: Option<&Reference>,
) -> Result<Value> {
    let hop_rates = if rates.is_empty() {
        size.hop.rates.clone()
    } else {
        rates.to_vec()
    };
    let mut runs = hop(ctx, &size.hop, profile, &hop_rates).await?;
    let policies = ["kv-aware".to_owned(), format!("{BEHIND_ENVOY}kv-aware")];
    let client = super::driver::client_per_request()?;
    let routing = s2::ladder("s12", &client, ctx, &size.routing, &policies, profile).await?;
    runs.extend(routing.into_iter().map(|mut r| {
        r["part"] = json!("routing");
        r
    }));
    if let Some(reference) = reference {
        runs.extend(routing_reference(ctx, &size.routing, profile, reference).await?);
    }
    Ok(json!({"verdicts": verdicts(&runs, reference.is_some()), "runs": runs}))
}

/// The targets of BENCHMARKS.md, judged on these runs.
fn verdicts(runs: &[Value], with_reference: bool) -> Value {
    let hop: Vec<&Value> = runs.iter().filter(|r| r["part"] == "hop").collect();
    let median = |key: &str, stream: bool| {
        let v: Vec<f64> = hop
            .iter()
            .filter(|r| r["stream"] == stream)
            .filter_map(|r| r[key].as_f64())
            .collect();
        quantile(&v, 0.5)
    };
    let routing = |policy: &str, key: &dyn Fn(&Value) -> Option<f64>| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r["part"] == "routing" && r["policy"] == policy)
            .filter_map(key)
            .collect();
        quantile(&v, 0.5)
    };
    let behind = format!("{BEHIND_ENVOY}kv-aware");
    let hit = |p: &str| routing(p, &|r| r["hit_vs_oracle"].as_f64());
    let ttft = |p: &str| routing(p, &|r| r["ttft_s"]["p90"].as_f64());
    let goodput = |p: &str| routing(p, &|r| r["goodput_req_s"].as_f64());
    let ratio = |a: f64, b: f64| if b > 0.0 { json!(a / b) } else { Value::Null };
    json!({
        "hop_added_p50_us_unary_median": median("hop_added_p50_us", false),
        "hop_added_p50_us_stream_median": median("hop_added_p50_us", true),
        "hop_added_p99_us_unary_median": median("hop_added_p99_us", false),
        "hit_vs_oracle": {"gateway": hit("kv-aware"), "envoy+picker": hit(&behind)},
        "hit_vs_oracle_picker_over_gateway": ratio(hit(&behind), hit("kv-aware")),
        "ttft_p90_s": {"gateway": ttft("kv-aware"), "envoy+picker": ttft(&behind)},
        "ttft_p90_picker_over_gateway": ratio(ttft(&behind), ttft("kv-aware")),
        "goodput_picker_over_gateway": ratio(goodput(&behind), goodput("kv-aware")),
        "hit_vs_oracle_reference_picker": if with_reference { json!(hit(REFERENCE)) } else { json!("not measured: pass --kubeconfig of a kube-apiserver, with lwepp and GAIE's CRD from the test environment") },
        "ttft_p90_s_reference_picker": if with_reference { json!(ttft(REFERENCE)) } else { Value::Null },
        "goodput_picker_over_reference": if with_reference { ratio(goodput(&behind), goodput(REFERENCE)) } else { Value::Null },
        "targets": {"hop_added_p50_us": "< 1000", "hit_vs_oracle_ratio": ">= 0.95", "ttft_p90_ratio": "<= 1.05"},
    })
}
