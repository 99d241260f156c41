//! A third-party router drives the simulator: the SGLang router from PyPI
//! (`sglang-router`, a Rust binary in a Python wheel) routes chat completions round-robin
//! to two simulated SGLang workers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{chat_body, free_port, mk_config, start};
use infera_proto::worker::EngineKind;
use infera_testkit::process::ServerProcess;
use infera_testkit::python_tools::python_with;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const SGLANG_ROUTER: &str = "sglang-router==0.3.2";

#[tokio::test]
async fn the_sglang_router_routes_to_two_simulated_workers() {
    let python = python_with(SGLANG_ROUTER).unwrap();
    let a = start(mk_config(EngineKind::Sglang)).await;
    let b = start(mk_config(EngineKind::Sglang)).await;
    let (port, metrics_port) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = vec![
        "-m".into(),
        "sglang_router.launch_router".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
        "--worker-urls".into(),
        format!("http://{}", a.addr),
        format!("http://{}", b.addr),
        "--policy".into(),
        "round_robin".into(),
        "--prometheus-host".into(),
        "127.0.0.1".into(),
        "--prometheus-port".into(),
        metrics_port.to_string(),
        "--disable-retries".into(),
        "--shutdown-grace-period-secs".into(),
        "1".into(),
    ];
    // The router tries to fetch a tokenizer from a model hub; point it at a closed
    // loopback port so that fails at once, offline.
    let log = dir.path().join("router.log");
    let mut router = ServerProcess::start_with_env(
        &python,
        &args,
        &[("HF_ENDPOINT", "http://127.0.0.1:1")],
        &log,
    )
    .unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    loop {
        if let Ok(r) = http.get(format!("{base}/readiness")).send().await
            && r.status() == 200
        {
            let ready: Value = r.json().await.unwrap();
            if ready["healthy_workers"] == 2 {
                break;
            }
        }
        assert!(
            router.exited().is_none(),
            "router exited: {}",
            router.log_tail(30)
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "router never ready: {}",
            router.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..6 {
        let r = http
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body(&format!("question {i}"), 3))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["usage"]["completion_tokens"], 3);
    }
    let served = |w: &infera_sim::worker::RunningWorker| {
        w.state.engine.counters.finished.load(Ordering::SeqCst)
    };
    assert_eq!(
        (served(&a), served(&b)),
        (3, 3),
        "round robin over both workers"
    );
    // The router's own view lists both workers with the simulator's model name.
    let models: Value = http
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "fixture-model", "{models}");
    router.kill();
}
