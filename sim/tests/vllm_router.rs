//! vLLM's tokenizer endpoints on the simulator, and vLLM's own router (`vllm-router` from
//! PyPI) using them: in cache-aware mode it asks every worker for the request's token ids
//! (`/v1/completions/render`, or `/tokenize` where render is 404, as on a vLLM without
//! `--enable-scale-out`), and routes on them instead of falling back to least-loaded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{free_port, mk_config, start, url};
use infera_proto::worker::EngineKind;
use infera_testkit::process::ServerProcess;
use infera_testkit::python_tools::python_with;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const VLLM_ROUTER: &str = "vllm-router==0.1.17";

/// Status and JSON body; status 0 when nothing answered.
async fn post(http: &reqwest::Client, to: String, body: Value) -> (u16, Value) {
    let Ok(r) = http.post(to).json(&body).send().await else {
        return (0, Value::Null);
    };
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn tokenize_and_render_answer_with_the_prompt_ids_the_engine_uses() {
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.enable_scale_out = true;
    let w = start(cfg).await;
    let plain = start(mk_config(EngineKind::Vllm)).await;
    let http = reqwest::Client::new();
    // The ids the engine itself reports for the prompt.
    let (status, done) = post(
        &http,
        url(&w, "/v1/completions"),
        json!({"model": "fixture-model", "prompt": "hello there", "max_tokens": 1, "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    let engine_ids = done["choices"][0]["prompt_token_ids"].clone();
    assert!(
        engine_ids.as_array().is_some_and(|a| !a.is_empty()),
        "{done}"
    );

    let (status, tok) = post(
        &http,
        url(&w, "/tokenize"),
        json!({"model": "fixture-model", "prompt": "hello there"}),
    )
    .await;
    assert_eq!(status, 200, "{tok}");
    assert_eq!(tok["tokens"], engine_ids);
    assert_eq!(tok["count"], engine_ids.as_array().unwrap().len());
    assert!(tok["max_model_len"].as_u64().unwrap() > 0);
    assert_eq!(tok["token_strs"], Value::Null);

    let (status, chat) = post(
        &http,
        url(&w, "/tokenize"),
        json!({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": false}),
    )
    .await;
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["count"], chat["tokens"].as_array().unwrap().len());

    let (status, missing) = post(
        &http,
        url(&w, "/tokenize"),
        json!({"model": "other", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, 404, "an unknown model is 404 as in vLLM: {missing}");
    assert_eq!(missing["error"]["param"], "model", "{missing}");

    let (status, rendered) = post(
        &http,
        url(&w, "/v1/completions/render"),
        json!({"model": "fixture-model", "prompt": "hello there", "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "{rendered}");
    assert_eq!(
        rendered[0]["token_ids"], engine_ids,
        "a list of one for completions"
    );
    assert_eq!(rendered[0]["features"], Value::Null);
    let (status, rendered) = post(
        &http,
        url(&w, "/v1/chat/completions/render"),
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{rendered}");
    assert!(
        rendered["token_ids"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "one object for chat: {rendered}"
    );

    let (status, _) = post(
        &http,
        url(&plain, "/v1/completions/render"),
        json!({"prompt": "hello"}),
    )
    .await;
    assert_eq!(status, 404, "render needs --enable-scale-out, as in vLLM");
}

/// `vllm_router_kv_routing_inputs_total{transport="http",result=...}` from its metrics.
async fn routing_inputs(http: &reqwest::Client, metrics: &str, result: &str) -> f64 {
    let text = http
        .get(metrics)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("vllm_router_kv_routing_inputs_total{"))
        .filter(|l| l.contains(&format!("result=\"{result}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn vllm_router_routes_on_the_simulators_token_ids() {
    let python = python_with(VLLM_ROUTER).unwrap();
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.enable_scale_out = true;
    let rendering = start(cfg).await;
    let tokenizing = start(mk_config(EngineKind::Vllm)).await;
    let (port, metrics_port) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let bin = python.with_file_name("vllm-router");
    let args: Vec<String> = [
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        &metrics_port.to_string(),
        "--policy",
        "cache_aware",
        "--worker-startup-check-interval",
        "1",
        "--worker-urls",
        &url(&rendering, ""),
        &url(&tokenizing, ""),
    ]
    .map(String::from)
    .to_vec();
    let log = dir.path().join("router.log");
    let mut router =
        ServerProcess::start_with_env(&bin, &args, &[("HF_HUB_OFFLINE", "1")], &log).unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let body = json!({"model": "fixture-model", "prompt": "a shared system prompt, then a question", "max_tokens": 2});
    loop {
        let (status, _) = post(&http, format!("{base}/v1/completions"), body.clone()).await;
        if status == 200 {
            break;
        }
        assert!(
            router.exited().is_none(),
            "router exited: {}",
            router.log_tail(30)
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "router never served: {}",
            router.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for _ in 0..4 {
        let (status, answer) = post(&http, format!("{base}/v1/completions"), body.clone()).await;
        assert_eq!(status, 200, "{answer}");
    }
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics");
    // Every request asked both workers: one rendered, the other (render 404) tokenized.
    assert!(
        routing_inputs(&http, &metrics, "render").await >= 5.0,
        "{}",
        router.log_tail(30)
    );
    assert!(
        routing_inputs(&http, &metrics, "tokenize").await >= 5.0,
        "{}",
        router.log_tail(30)
    );
    router.kill();
}
