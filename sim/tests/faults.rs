//! Injected faults behave as the failures they stand for: 500s, broken streams, hangs,
//! failing health, a slow start and refused connections.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{chat_body, free_port, mk_config, start, url};
use infera_proto::worker::EngineKind;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn fail_next_answers_500_then_recovers() {
    let worker = start(mk_config(EngineKind::Vllm)).await;
    let http = reqwest::Client::new();
    let set = http
        .post(url(&worker, "/sim/faults"))
        .json(&json!({"fail_next": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = http
            .post(url(&worker, "/v1/chat/completions"))
            .json(&chat_body("x", 1))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, vec![500, 500, 200]);
    let bad = http
        .post(url(&worker, "/sim/faults"))
        .json(&json!({"fail_nxt": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        bad.status(),
        400,
        "a misspelt fault is refused, not ignored"
    );
}

#[tokio::test]
async fn fail_after_tokens_breaks_the_stream_midway() {
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.faults.fail_after_tokens = Some(3);
    let worker = start(cfg).await;
    let mut body = chat_body("x", 10);
    body["stream"] = json!(true);
    let resp = reqwest::Client::new()
        .post(url(&worker, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let err = resp
        .text()
        .await
        .expect_err("the stream must break, not end cleanly");
    assert!(err.is_body() || err.is_decode(), "{err}");
}

#[tokio::test]
async fn hang_never_answers_and_unhealthy_fails_health() {
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.faults.hang = true;
    cfg.faults.unhealthy = true;
    let worker = start(cfg).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = http
        .post(url(&worker, "/v1/chat/completions"))
        .json(&chat_body("x", 1))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(
        http.get(url(&worker, "/health"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
}

#[tokio::test]
async fn startup_delay_refuses_connections_until_loaded() {
    let port = free_port();
    let mut cfg = mk_config(EngineKind::Sglang);
    cfg.listen = format!("127.0.0.1:{port}").parse().unwrap();
    cfg.startup_delay = Duration::from_millis(800);
    let started = Instant::now();
    let worker = start(cfg).await;
    let http = reqwest::Client::new();
    let early = http.get(url(&worker, "/health")).send().await.unwrap_err();
    assert!(early.is_connect(), "{early}");
    loop {
        if let Ok(r) = http.get(url(&worker, "/health")).send().await {
            assert_eq!(r.status(), 200);
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never came up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(800));
}

#[tokio::test]
async fn refuse_connections_never_listens() {
    let port = free_port();
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.listen = format!("127.0.0.1:{port}").parse().unwrap();
    cfg.refuse_connections = true;
    let worker = start(cfg).await;
    let err = reqwest::Client::new()
        .get(url(&worker, "/health"))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err}");
}
