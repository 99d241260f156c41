//! The `infera-sim` binary launched as an engine would be: engine flags, unknown flags
//! ignored, `--help` explaining every flag.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::free_port;
use infera_testkit::process::ServerProcess;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_infera-sim");

#[test]
fn help_explains_every_flag() {
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--workers",
        "--listen",
        "--engine",
        "--kv-event-layout",
        "--served-model-name",
        "--tokenizer",
        "--profile",
        "--block-size",
        "--kv-blocks",
        "--max-num-batched-tokens",
        "--speedup",
        "--kv-events-config",
        "--disaggregation-mode",
        "--kv-transfer-config",
        "--fail-first",
        "--fail-after-tokens",
        "--hang",
        "--startup-delay",
        "--refuse-connections",
    ] {
        assert!(help.contains(flag), "--help does not mention {flag}");
    }
}

#[tokio::test]
async fn runs_from_a_vllm_style_command_line() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "fixture/model",
        "--engine",
        "vllm",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--served-model-name",
        "fixture-model",
        "--block-size",
        "32",
        "--gpu-memory-utilization",
        "0.9",
        "--enforce-eager",
        "--speedup",
        "100",
        "--kv-events-config",
        &format!(
            r#"{{"publisher":"zmq","endpoint":"tcp://127.0.0.1:{}","topic":"kv"}}"#,
            free_port()
        ),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut server =
        ServerProcess::start(Path::new(BIN), &args, &dir.path().join("sim.log")).unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while http.get(format!("{base}/health")).send().await.is_err() {
        assert!(server.exited().is_none(), "exited: {}", server.log_tail(20));
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r: Value = http
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "fixture-model", "prompt": "hello", "max_tokens": 3}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["usage"]["completion_tokens"], 3);
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("block_size=\"32\""));
    let log = server.log_tail(50);
    assert!(
        log.contains("ignoring engine flag") && log.contains("--gpu-memory-utilization 0.9"),
        "{log}"
    );
    // SIGTERM stops it, KV-event publisher included (a launcher's engine must not linger).
    server.terminate();
    let status = server.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}: {}",
        server.log_tail(10)
    );
}
