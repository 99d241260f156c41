//! The simulated engine with a real kvd beside it (the daemon run in-process from its
//! library, over its socket and arena): blocks a finished request leaves in HBM are
//! stored in kvd; once HBM evicts them, a repeat of the prompt loads them back instead of
//! computing them; with kvd gone, serving goes on, computing everything.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{chat_body, mk_config, start, url};
use infera_kvd::cli::KvdArgs;
use infera_proto::kv_tiers::{KvTier, TierCost};
use infera_proto::worker::EngineKind;
use infera_sim::kvd_connector::KvdConfig;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// kvd on `socket`, in this process, until `stop` fires; the task ends when it has.
fn start_kvd(socket: &Path) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    start_kvd_with(socket, &[])
}

/// [`start_kvd`] with more of kvd's flags.
fn start_kvd_with(
    socket: &Path,
    extra: &[&str],
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let max_bytes = (32u64 << 20).to_string();
    let mut args = vec![
        "infera-kvd",
        "--socket",
        socket.to_str().unwrap(),
        "--max-bytes",
        &max_bytes,
        "--metrics-addr",
        "",
    ];
    args.extend_from_slice(extra);
    let cli = <KvdArgs as clap::Parser>::try_parse_from(args).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        infera_kvd::service::run(cli, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (stop, task)
}

async fn wait_for_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "kvd never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kvd_config(socket: PathBuf) -> KvdConfig {
    KvdConfig {
        socket,
        tiers: vec![(KvTier::Host, TierCost::measured(KvTier::Host).unwrap())],
        payload_bytes: 4096,
        model: "fixture-model".into(),
        compat_key: "h200-llama-3.1-8b/bs16".into(),
    }
}

/// A prompt of about `chars` characters (byte codec: a token each), distinct by `tag`.
fn prompt(tag: &str, chars: usize) -> String {
    let mut s = format!("{tag}: ");
    while s.len() < chars {
        s.push_str(tag);
        s.push(' ');
    }
    s.truncate(chars);
    s
}

async fn chat(
    http: &reqwest::Client,
    worker: &infera_sim::worker::RunningWorker,
    content: &str,
) -> serde_json::Value {
    let resp = http
        .post(url(worker, "/v1/chat/completions"))
        .json(&chat_body(content, 4))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

fn cached(answer: &serde_json::Value) -> u64 {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

async fn metric(
    http: &reqwest::Client,
    worker: &infera_sim::worker::RunningWorker,
    series: &str,
) -> f64 {
    let text = http
        .get(url(worker, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until kvd's connector has stored `blocks` or more.
async fn stored(http: &reqwest::Client, worker: &infera_sim::worker::RunningWorker, blocks: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = metric(
            http,
            worker,
            "infera_sim_kvd_stored_blocks_total{model_name=\"fixture-model\"}",
        )
        .await;
        if n >= blocks {
            return;
        }
        assert!(Instant::now() < deadline, "stored {n} blocks, not {blocks}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_evicted_from_hbm_is_loaded_back_from_kvd() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kvd.sock");
    let (_stop, _kvd) = start_kvd(&socket);
    wait_for_socket(&socket).await;
    let mut cfg = mk_config(EngineKind::Vllm);
    // 64 blocks of 16 tokens: two 600-token prompts do not fit beside a third.
    cfg.core.kv_blocks = 64;
    cfg.kvd = Some(kvd_config(socket.clone()));
    let worker = start(cfg).await;
    let http = reqwest::Client::new();

    let first = chat(&http, &worker, &prompt("alpha", 600)).await;
    assert_eq!(cached(&first), 0, "{first}");
    stored(&http, &worker, 30.0).await;
    // Two other prompts push alpha's blocks out of HBM.
    for tag in ["bravo", "charlie"] {
        chat(&http, &worker, &prompt(tag, 600)).await;
    }
    assert!(
        metric(
            &http,
            &worker,
            "infera_sim_evictions_total{model_name=\"fixture-model\"}"
        )
        .await
            > 0.0
    );
    let again = chat(&http, &worker, &prompt("alpha", 600)).await;
    let loaded = metric(
        &http,
        &worker,
        "infera_sim_kvd_loaded_tokens_total{model_name=\"fixture-model\",tier=\"host\"}",
    )
    .await;
    let text = http
        .get(url(&worker, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let kvd_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("kvd") || l.contains("evictions"))
        .collect();
    assert!(
        cached(&again) >= 500,
        "alpha's blocks came back from kvd: {again}\n{kvd_lines:#?}"
    );
    assert!(loaded >= 500.0, "loaded {loaded} tokens from kvd's RAM");
    // kvd served them: its own counters say so.
    let stats = kvd_stats(&socket);
    let hits = infera_kvd::client::field(&stats, "hits_total")
        .and_then(rmpv::Value::as_u64)
        .unwrap();
    assert!(hits >= 30, "kvd hits {hits}");
}

/// kvd's `stats` reply.
fn kvd_stats(socket: &Path) -> rmpv::Value {
    let mut client = infera_kvd::client::Client::connect(socket, "test", false).unwrap();
    client
        .request(&infera_kvd::client::request_map("stats", vec![]))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_one_worker_stored_in_the_shared_tier_is_loaded_by_another() {
    let redis = infera_testkit::redis::RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut workers = Vec::new();
    let mut kvds = Vec::new();
    for name in ["a", "b"] {
        let socket = dir.path().join(format!("{name}.sock"));
        kvds.push(start_kvd_with(&socket, &["--remote-url", &redis.url()]));
        wait_for_socket(&socket).await;
        let mut cfg = mk_config(EngineKind::Vllm);
        let mut kvd = kvd_config(socket.clone());
        // A shared tier as fast as an RDMA store: the measured same-host Redis moves
        // bytes slower than recomputing them, and the engine would rather compute.
        kvd.tiers.push((
            KvTier::Remote,
            TierCost {
                rtt_ms: 0.37,
                gbytes_per_s: 20.0,
            },
        ));
        cfg.kvd = Some(kvd);
        workers.push((start(cfg).await, socket));
    }
    let (a, _) = &workers[0];
    let (b, b_socket) = &workers[1];

    chat(&http, a, &prompt("alpha", 600)).await;
    stored(&http, a, 30.0).await;
    // Long blocks are written behind to Redis; once there, B's first sight of the prompt
    // loads them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = redis.url().trim_start_matches("redis://").to_owned();
    while infera_testkit::redis::key_count(&addr).unwrap() < 30 {
        assert!(
            Instant::now() < deadline,
            "alpha's blocks never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = chat(&http, b, &prompt("alpha", 600)).await;
    assert!(cached(&again) >= 500, "B loaded alpha from Redis: {again}");
    let loaded = metric(
        &http,
        b,
        "infera_sim_kvd_loaded_tokens_total{model_name=\"fixture-model\",tier=\"remote\"}",
    )
    .await;
    assert!(
        loaded >= 500.0,
        "B loaded {loaded} tokens from the shared tier"
    );
    let stats = kvd_stats(b_socket);
    let hits = infera_kvd::client::field(&stats, "hits_total")
        .and_then(rmpv::Value::as_u64)
        .unwrap();
    assert!(hits >= 30, "B's kvd answered the gets: {stats}");
}

/// kvd as its own process (the workspace's `infera-kvd`, which `scripts/test` builds),
/// so the test can kill it as a crash or an OOM kill would.
fn start_kvd_process(dir: &Path) -> (infera_testkit::process::ServerProcess, PathBuf) {
    let socket = dir.join("kvd.sock");
    let bin = infera_testkit::process::workspace_binary("infera-kvd").unwrap();
    let process = infera_testkit::process::ServerProcess::start(
        &bin,
        &[
            "--socket".into(),
            socket.display().to_string(),
            "--max-bytes".into(),
            (32u64 << 20).to_string(),
            "--metrics-addr".into(),
            String::new(),
        ],
        &dir.join("kvd.log"),
    )
    .unwrap();
    (process, socket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_kvd_killed_prompts_are_computed_and_a_miss_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (mut kvd, socket) = start_kvd_process(dir.path());
    wait_for_socket(&socket).await;
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.core.kv_blocks = 64;
    cfg.kvd = Some(kvd_config(socket.clone()));
    let worker = start(cfg).await;
    let http = reqwest::Client::new();
    chat(&http, &worker, &prompt("delta", 600)).await;
    stored(&http, &worker, 30.0).await;
    let up = "infera_sim_kvd_up{model_name=\"fixture-model\"}";
    assert_eq!(metric(&http, &worker, up).await, 1.0);

    kvd.kill();
    let unavailable =
        "infera_sim_kvd_lookups_total{model_name=\"fixture-model\",outcome=\"unavailable\"}";
    let before = metric(&http, &worker, unavailable).await;
    for tag in ["echo", "foxtrot", "delta"] {
        let answer = chat(&http, &worker, &prompt(tag, 600)).await;
        assert!(
            answer["choices"][0]["message"]["content"].is_string(),
            "{answer}"
        );
    }
    assert!(metric(&http, &worker, unavailable).await >= before + 3.0);
    assert_eq!(metric(&http, &worker, up).await, 0.0);
}
