//! The simulated engine over HTTP: OpenAI responses, prefix-cache reporting, SSE,
//! client disconnects, engine error shapes, metrics and info endpoints.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{chat_body, mk_config, start, start_with_codec, url};
use futures::StreamExt;
use infera_prompt::PromptCodec;
use infera_proto::worker::EngineKind;
use infera_testkit::model_files::{FixtureModel, model_dir};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::time::Duration;

#[tokio::test]
async fn a_repeated_prefix_is_reported_as_cached() {
    let worker = start(mk_config(EngineKind::Vllm)).await;
    let http = reqwest::Client::new();
    let system = "You are a careful assistant. ".repeat(20);
    let ask = |q: &str| {
        json!({"model": "fixture-model", "max_tokens": 4, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": q}]})
    };
    let first: Value = http
        .post(url(&worker, "/v1/chat/completions"))
        .json(&ask("first?"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let second: Value = http
        .post(url(&worker, "/v1/chat/completions"))
        .json(&ask("second?"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    // The whole system prompt (600+ bytes) is shared; only the question's blocks differ.
    assert!(
        cached >= 600 && cached.is_multiple_of(16) && cached < prompt,
        "cached {cached} of {prompt}"
    );
    assert_eq!(second["usage"]["completion_tokens"], 4);
    assert_eq!(second["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn streaming_carries_the_same_text_and_usage_as_json() {
    let worker = start(mk_config(EngineKind::Vllm)).await;
    let http = reqwest::Client::new();
    let mut body = chat_body("stream me", 12);
    body["seed"] = json!(42);
    let whole: Value = http
        .post(url(&worker, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = http
        .post(url(&worker, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        streamed,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 12);
    assert_eq!(chunks.len(), 13, "12 token chunks and a usage chunk");
}

#[tokio::test]
async fn completions_accept_text_and_token_prompts() {
    let worker = start(mk_config(EngineKind::Sglang)).await;
    let http = reqwest::Client::new();
    let r: Value = http
        .post(url(&worker, "/v1/completions"))
        .json(&json!({"prompt": "abc", "max_tokens": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["usage"]["prompt_tokens"], 3);
    let r: Value = http
        .post(url(&worker, "/v1/completions"))
        .json(&json!({"prompt": [1, 2, 3, 4, 5], "max_tokens": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["usage"]["prompt_tokens"], 5);
}

#[tokio::test]
async fn bad_requests_get_the_engines_error_shape() {
    for engine in [EngineKind::Vllm, EngineKind::Sglang] {
        let worker = start(mk_config(engine)).await;
        let http = reqwest::Client::new();
        let cases = [
            (json!({"messages": []}), 400, "messages"),
            (
                json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}),
                404,
                "model",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
                400,
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 200_000}),
                400,
                "max_tokens",
            ),
            // Once a panic (the sum overflowed) that closed the connection: a 502 the
            // gateway counted against a healthy worker.
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": u64::MAX}),
                400,
                "max_tokens",
            ),
        ];
        for (body, status, param) in cases {
            let resp = http
                .post(url(&worker, "/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), status, "{body}");
            let err: Value = resp.json().await.unwrap();
            let (got_param, got_code) = match engine {
                EngineKind::Sglang => (&err["param"], &err["code"]),
                _ => (&err["error"]["param"], &err["error"]["code"]),
            };
            assert_eq!(got_param, param, "{engine:?} {err}");
            assert_eq!(got_code, status, "{engine:?} {err}");
        }
        let resp = http
            .post(url(&worker, "/v1/chat/completions"))
            .body("{not json")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
    }
}

#[tokio::test]
async fn a_client_disconnect_aborts_the_request() {
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.timing.speedup = 1.0; // ~5 ms per decode step: 2,000 tokens take ~10 s
    let worker = start(cfg).await;
    let http = reqwest::Client::new();
    let mut body = chat_body("a long answer please", 2000);
    body["stream"] = json!(true);
    let resp = http
        .post(url(&worker, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    let counters = worker.state.engine.counters.clone();
    assert_eq!(counters.stats.lock().unwrap().running, 1);
    drop(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while counters.aborted.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the engine never noticed the disconnect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(counters.generation_tokens.load(Ordering::SeqCst) < 2000);
}

#[tokio::test]
async fn metrics_and_info_use_the_engines_names() {
    let vllm = start(mk_config(EngineKind::Vllm)).await;
    let sglang = start(mk_config(EngineKind::Sglang)).await;
    let http = reqwest::Client::new();
    http.post(url(&vllm, "/v1/chat/completions"))
        .json(&chat_body("x", 1))
        .send()
        .await
        .unwrap();
    let m = http
        .get(url(&vllm, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:gpu_cache_usage_perc{",
        "vllm:prefix_cache_hits_total{",
    ] {
        assert!(m.contains(name), "missing {name}");
    }
    assert!(
        m.contains("vllm:cache_config_info{block_size=\"16\""),
        "{m}"
    );
    assert!(
        m.contains("vllm:request_success_total{model_name=\"fixture-model\"} 1"),
        "{m}"
    );
    let m = http
        .get(url(&sglang, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("sglang:num_running_reqs{") && m.contains("sglang:num_queue_reqs{"),
        "{m}"
    );
    let info: Value = http
        .get(url(&sglang, "/get_server_info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            info["page_size"].as_u64(),
            info["served_model_name"].as_str()
        ),
        (Some(16), Some("fixture-model"))
    );
    let info: Value = http
        .get(url(&sglang, "/get_model_info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["is_generation"], true);
    let models: Value = http
        .get(url(&vllm, "/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "fixture-model");
    assert_eq!(
        http.get(url(&vllm, "/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn a_real_tokenizer_counts_prompt_tokens_like_the_engine() {
    let codec = PromptCodec::load(&model_dir(FixtureModel::Qwen3).unwrap()).unwrap();
    let expected = codec
        .encode_chat(chat_body("Hello!", 1).as_object().unwrap())
        .unwrap()
        .len();
    let worker = start_with_codec(mk_config(EngineKind::Vllm), codec).await;
    let r: Value = reqwest::Client::new()
        .post(url(&worker, "/v1/chat/completions"))
        .json(&chat_body("Hello!", 5))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // transformers renders this conversation to 10 Qwen3 tokens (prompt/testdata).
    assert_eq!(expected, 10);
    assert_eq!(r["usage"]["prompt_tokens"], 10);
    assert!(
        !r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn profiler_controls_answer_as_the_engine_does() {
    let http = reqwest::Client::new();
    for (engine, start_text, stop_text) in [
        (
            EngineKind::Sglang,
            "Start profiling.\n",
            "Stop profiling. This will take some time.\n",
        ),
        (EngineKind::Vllm, "", ""),
    ] {
        let worker = start(mk_config(engine)).await;
        for (path, text) in [("/start_profile", start_text), ("/stop_profile", stop_text)] {
            let r = http
                .post(url(&worker, path))
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{engine:?} {path}");
            assert_eq!(r.text().await.unwrap(), text, "{engine:?} {path}");
        }
    }
}
