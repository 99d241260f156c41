//! Helpers for the gateway's loopback tests: simulated workers registered in a real
//! etcd, and a gateway discovering them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod ext_proc;
pub mod k8s;

use clap::Parser;
use etcd_client::PutOptions;
use infera_gateway::Gateway;
use infera_gateway::Registry;
use infera_gateway::config::GatewayConfig;
use infera_gateway::server::{RunningGateway, start_embedded, start_gateway};
use infera_prompt::PromptCodec;
use infera_proto::discovery::build_worker_key;
use infera_proto::worker::{EngineKind, WorkerRecord};
use infera_sim::core::CoreConfig;
use infera_sim::engine::Timing;
use infera_sim::faults::FaultSettings;
use infera_sim::profile::LatencyProfile;
use infera_sim::worker::{RunningWorker, WorkerConfig, build_generator, start_worker};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MODEL: &str = "fixture-model";

/// A simulated worker, `speedup` times faster than an H200.
pub async fn start_sim(engine: EngineKind, speedup: f64) -> RunningWorker {
    start_sim_with(engine, speedup, |_| {}).await
}

/// A simulated worker with its config adjusted by `adjust`.
pub async fn start_sim_with(
    engine: EngineKind,
    speedup: f64,
    adjust: impl FnOnce(&mut WorkerConfig),
) -> RunningWorker {
    let codec = Arc::new(PromptCodec::bytes());
    let generator = Arc::new(build_generator(&codec));
    let cfg = WorkerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        engine,
        model: MODEL.into(),
        core: CoreConfig {
            block_size: 16,
            kv_blocks: 4096,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            profile: LatencyProfile::builtin("h200-llama-3.1-8b").unwrap(),
            kv_transfer_gbytes_per_s: 170.0,
            lower_tiers: Vec::new(),
        },
        timing: Timing::exact(speedup),
        event_format: None,
        kv_events: None,
        dp_rank: None,
        pd: None,
        tp_size: 1,
        dp_size: 1,
        default_max_tokens: 8,
        faults: FaultSettings::default(),
        startup_delay: Duration::ZERO,
        refuse_connections: false,
        enable_scale_out: false,
        kvd: None,
    };
    let mut cfg = cfg;
    adjust(&mut cfg);
    start_worker(cfg, codec, generator).await.unwrap()
}

/// The record a launcher would write for `worker`.
pub fn record_for(addr: std::net::SocketAddr, engine: EngineKind) -> WorkerRecord {
    let json = serde_json::json!({
        "worker_id": addr.to_string(),
        "url": format!("http://{addr}"),
        "model_name": MODEL,
        "engine": engine.as_str(),
        "disagg_mode": "mixed",
        "kv_block_size": 16,
        "dp_size": 1,
        "request_transport": "http",
    });
    WorkerRecord::from_json(json.to_string().as_bytes()).unwrap()
}

/// A unique etcd prefix for one test.
pub fn unique_prefix() -> String {
    format!(
        "/infera-test/{}/workers/",
        infera_testkit::unique_name("gw")
    )
}

/// Puts `record` under `prefix` with a fresh lease of `ttl` seconds; returns the lease.
pub async fn register(prefix: &str, record: &WorkerRecord, ttl: i64) -> i64 {
    let mut etcd = infera_testkit::etcd_client().await.unwrap();
    let lease = etcd.lease_grant(ttl, None).await.unwrap().id();
    etcd.put(
        build_worker_key(prefix, &record.worker_id),
        record.to_json(),
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    lease
}

/// A gateway discovering workers under `prefix`, with extra flags.
pub async fn start_gw(prefix: &str, extra: &[&str]) -> RunningGateway {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let mut args = vec!["--etcd-endpoint", &etcd, "--etcd-prefix", prefix];
    args.extend_from_slice(extra);
    start_gw_args(&args).await
}

/// A gateway on a free loopback port started with exactly these flags.
pub async fn start_gw_args(flags: &[&str]) -> RunningGateway {
    let mut args = vec!["infera-gateway", "--host", "127.0.0.1"];
    args.extend_from_slice(flags);
    let cfg = GatewayConfig::try_parse_from(args).unwrap();
    let gw = Gateway::new(cfg, Registry::new()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    start_gateway(gw, listener).await.unwrap()
}

/// A gateway fed in-process with the given workers (no discovery), with `flags`.
pub async fn embedded(records: Vec<WorkerRecord>, flags: &[&str]) -> RunningGateway {
    let mut args = vec!["infera-gateway"];
    args.extend_from_slice(flags);
    let cfg = GatewayConfig::try_parse_from(args).unwrap();
    let registry = Registry::new();
    for r in records {
        registry.upsert(r);
    }
    registry.mark_synced();
    let gw = Gateway::new(cfg, registry).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    start_embedded(gw, listener).await.unwrap()
}

/// Waits until the gateway's registry holds `n` workers.
pub async fn wait_workers(gw: &RunningGateway, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.gateway.registry.snapshot().workers.len() != n {
        assert!(
            Instant::now() < deadline,
            "gateway never saw {n} workers (has {})",
            gw.gateway.registry.snapshot().workers.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `http://gateway/path`.
pub fn gw_url(gw: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gw.addr)
}

/// `POST path` on the gateway with a JSON body.
pub async fn post_json(
    http: &reqwest::Client,
    gw: &RunningGateway,
    path: &str,
    body: &serde_json::Value,
) -> reqwest::Response {
    http.post(gw_url(gw, path)).json(body).send().await.unwrap()
}

/// `GET path` on the gateway, as text.
pub async fn get_text(http: &reqwest::Client, gw: &RunningGateway, path: &str) -> String {
    http.get(gw_url(gw, path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// `GET path` on the gateway, as JSON.
pub async fn get_json(
    http: &reqwest::Client,
    gw: &RunningGateway,
    path: &str,
) -> serde_json::Value {
    http.get(gw_url(gw, path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A chat request body.
pub fn chat(content: &str, max_tokens: u64) -> serde_json::Value {
    serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
}

/// Requests the sim finished.
pub fn served(w: &RunningWorker) -> u64 {
    w.state
        .engine
        .counters
        .finished
        .load(std::sync::atomic::Ordering::SeqCst)
}
