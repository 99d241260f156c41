//! Helpers shared by the simulator's integration tests.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_prompt::PromptCodec;
use infera_proto::worker::EngineKind;
use infera_sim::core::CoreConfig;
use infera_sim::engine::Timing;
use infera_sim::faults::FaultSettings;
use infera_sim::profile::LatencyProfile;
use infera_sim::worker::{RunningWorker, WorkerConfig, build_generator, start_worker};
use std::sync::Arc;
use std::time::Duration;

/// A worker config on a free loopback port, running 50x faster than an H200.
pub fn mk_config(engine: EngineKind) -> WorkerConfig {
    WorkerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        engine,
        model: "fixture-model".into(),
        core: CoreConfig {
            block_size: 16,
            kv_blocks: 4096,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            profile: LatencyProfile::builtin("h200-llama-3.1-8b").unwrap(),
            kv_transfer_gbytes_per_s: 170.0,
            lower_tiers: Vec::new(),
        },
        timing: Timing::exact(50.0),
        event_format: None,
        kv_events: None,
        dp_rank: None,
        pd: None,
        tp_size: 1,
        dp_size: 1,
        default_max_tokens: 16,
        faults: FaultSettings::default(),
        startup_delay: Duration::ZERO,
        refuse_connections: false,
        enable_scale_out: false,
        kvd: None,
    }
}

/// Starts a worker with the byte codec.
pub async fn start(cfg: WorkerConfig) -> RunningWorker {
    start_with_codec(cfg, PromptCodec::bytes()).await
}

/// Starts a worker with `codec`.
pub async fn start_with_codec(cfg: WorkerConfig, codec: PromptCodec) -> RunningWorker {
    let codec = Arc::new(codec);
    let generator = Arc::new(build_generator(&codec));
    start_worker(cfg, codec, generator).await.unwrap()
}

/// `http://addr`.
pub fn url(worker: &RunningWorker, path: &str) -> String {
    format!("http://{}{path}", worker.addr)
}

/// A chat body with `content` as the only user message.
pub fn chat_body(content: &str, max_tokens: usize) -> serde_json::Value {
    serde_json::json!({
        "model": "fixture-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    })
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
