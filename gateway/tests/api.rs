//! The gateway's API surface: SSE relayed byte for byte and chunk by chunk, client
//! disconnects reaching the worker, every bad input answered with OpenAI (or Anthropic)
//! error JSON, `/v1/messages` with and without tools, bearer auth, h2c, body limits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use common::*;
use futures::StreamExt;
use infera_gateway::server::RunningGateway;
use infera_proto::worker::EngineKind;
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// An upstream that answers every chat request with SSE chunks it takes from `chunks`,
/// one at a time, and records the bodies it was sent.
async fn scripted_upstream(
    chunks: mpsc::UnboundedReceiver<Bytes>,
    seen: Arc<Mutex<Vec<Value>>>,
) -> std::net::SocketAddr {
    let chunks = Arc::new(tokio::sync::Mutex::new(Some(chunks)));
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |body: axum::body::Bytes| {
            let chunks = chunks.clone();
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap());
                let rx = chunks.lock().await.take().unwrap();
                let stream = tokio_stream_from(rx);
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(stream))
                    .unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn tokio_stream_from(
    mut rx: mpsc::UnboundedReceiver<Bytes>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok)))
}

#[tokio::test]
async fn sse_is_relayed_byte_for_byte_as_it_arrives() {
    let (tx, rx) = mpsc::unbounded_channel();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let upstream = scripted_upstream(rx, seen.clone()).await;
    let gw = embedded(vec![record_for(upstream, EngineKind::Vllm)], &[]).await;
    let mut body = chat("hi", 3);
    body["stream"] = json!(true);
    let resp = reqwest::Client::new()
        .post(gw_url(&gw, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hé\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"llo\"}}]}\n\n",
        "data: [DONE]\n\n",
    ];
    let mut got = Vec::new();
    for chunk in chunks {
        // The next chunk is only sent once the previous one reached the client: a gateway
        // that buffered the response would stall here.
        tx.send(Bytes::from(chunk)).unwrap();
        let received = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("chunk not relayed promptly");
        got.extend_from_slice(&received.unwrap().unwrap());
    }
    drop(tx);
    assert!(stream.next().await.is_none());
    assert_eq!(String::from_utf8(got).unwrap(), chunks.concat());
    let forwarded = seen.lock().unwrap()[0].clone();
    assert_eq!(
        forwarded["kv_transfer_params"]["infera_retention"], "long",
        "default retention forwarded"
    );
}

#[tokio::test]
async fn a_client_disconnect_reaches_the_worker() {
    let sim = start_sim(EngineKind::Vllm, 1.0).await;
    let gw = embedded(vec![record_for(sim.addr, EngineKind::Vllm)], &[]).await;
    let mut body = chat("long answer", 2000);
    body["stream"] = json!(true);
    let resp = reqwest::Client::new()
        .post(gw_url(&gw, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    let counters = sim.state.engine.counters.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters.aborted.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the worker never saw the disconnect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn bad_inputs_get_openai_error_json() {
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let gw = embedded(
        vec![record_for(sim.addr, EngineKind::Vllm)],
        &["--max-body-bytes", "2048"],
    )
    .await;
    let http = reqwest::Client::new();
    let cases: Vec<(String, u16, Option<&str>)> = vec![
        ("{not json".into(), 400, None),
        (json!({"model": MODEL, "messages": []}).to_string(), 400, Some("messages")),
        (json!({"model": MODEL, "messages": [{"role": "user", "content": 7}]}).to_string(), 400, Some("messages[0].content")),
        (json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}).to_string(), 400, Some("n")),
        (json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}).to_string(), 400, Some("max_tokens")),
        (json!({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}).to_string(), 404, Some("model")),
        (json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "infera_retention": "forever"}).to_string(), 400, Some("infera_retention")),
        (json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(4096)}]}).to_string(), 413, None),
    ];
    for (body, status, param) in cases {
        let r = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{body:.80}");
        assert!(r.headers().contains_key("x-infera-request-id"));
        let err: Value = r.json().await.unwrap();
        assert_eq!(err["error"]["param"].as_str(), param, "{err}");
        assert!(
            err["error"]["type"].is_string() && err["error"]["message"].is_string(),
            "{err}"
        );
    }
    assert_eq!(served(&sim), 0, "no bad request reached the worker");
    // The worker's own 4xx (a prompt over its context) is relayed, not retried.
    let r = http.post(gw_url(&gw, "/v1/chat/completions")).json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 999999})).send().await.unwrap();
    assert_eq!(r.status(), 400);
}

/// Bodies within the byte limit that would take hundreds of megabytes once parsed, and a
/// `max_tokens` that once crashed a worker: refused with 400 before any worker sees them.
#[tokio::test]
async fn crafted_bodies_are_refused_before_they_grow() {
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let gw = embedded(vec![record_for(sim.addr, EngineKind::Vllm)], &[]).await;
    let http = reqwest::Client::new();
    let siblings = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":[{}]}}]}}"#,
        vec!["[[]]"; 400_000].join(",")
    );
    let nested = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":{}{}}}]}}"#,
        "[".repeat(400_000),
        "]".repeat(400_000)
    );
    let ids = json!({"model": MODEL, "prompt": vec![1; 1_000_000], "max_tokens": 1});
    let messages =
        json!({"model": MODEL, "messages": vec![json!({"role": "user", "content": "x"}); 100_000]});
    let huge_max = json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": u64::MAX});
    let cases = [
        ("/v1/chat/completions", siblings, "--max-request-values"),
        ("/v1/chat/completions", nested, "--max-request-depth"),
        ("/v1/completions", ids.to_string(), "--max-request-values"),
        (
            "/v1/chat/completions",
            messages.to_string(),
            "--max-request-values",
        ),
        ("/v1/messages", messages.to_string(), "--max-request-values"),
        ("/v1/chat/completions", huge_max.to_string(), "2147483647"),
    ];
    for (path, body, says) in cases {
        assert!(body.len() < 8 << 20, "within the default byte limit");
        let r = http
            .post(gw_url(&gw, path))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path} {body:.80}");
        let err: Value = r.json().await.unwrap();
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{path} {body:.80}: {err}");
    }
    assert_eq!(served(&sim), 0, "no crafted request reached the worker");
    // A long prompt given as ids (60k tokens, what the test worker's cache holds) is
    // within the limits and served.
    let long = json!({"model": MODEL, "prompt": vec![1; 60_000], "max_tokens": 1});
    let r = http
        .post(gw_url(&gw, "/v1/completions"))
        .json(&long)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// Sends raw bytes on a new connection and returns the status line of the answer and
/// how long it took, bounded by 10 s.
async fn raw_status(gw: &RunningGateway, request: &[u8]) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let started = Instant::now();
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("no answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    (
        text.lines().next().unwrap_or_default().to_owned(),
        started.elapsed(),
    )
}

/// A declared body past the limit is refused before it is sent, a body that stops
/// coming gets 408 at the read timeout, and requests past `--max-concurrent-requests`
/// get 429 with `Retry-After` at once; none of them holds the gateway or a worker.
#[tokio::test]
async fn large_slow_and_excess_requests_are_refused_early() {
    let sim = start_sim(EngineKind::Vllm, 1.0).await;
    let gw = embedded(
        vec![record_for(sim.addr, EngineKind::Vllm)],
        &[
            "--body-read-timeout-s",
            "1",
            "--max-concurrent-requests",
            "2",
        ],
    )
    .await;
    let head = |length: u64| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n{{\"model\""
        )
    };
    let (status, took) = raw_status(&gw, head(50 << 20).as_bytes()).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    assert!(took < Duration::from_millis(900), "413 only after {took:?}");
    let (status, took) = raw_status(&gw, head(100).as_bytes()).await;
    assert!(status.starts_with("HTTP/1.1 408"), "{status}");
    assert!(took >= Duration::from_millis(900), "408 after {took:?}");
    // Two long streams hold both permits; a third request is refused at once.
    let http = reqwest::Client::new();
    let mut long = chat("x", 2000);
    long["stream"] = json!(true);
    let mut streams = Vec::new();
    for _ in 0..2 {
        let r = post_json(&http, &gw, "/v1/chat/completions", &long).await;
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    let r = post_json(&http, &gw, "/v1/chat/completions", &chat("x", 1)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["type"], "rate_limit_error", "{err}");
    let metrics = get_text(&http, &gw, "/metrics").await;
    assert!(
        metrics.contains("infera_gateway_admission_refused_total 1"),
        "{metrics}"
    );
    // The clients go away: their permits come back.
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = post_json(&http, &gw, "/v1/chat/completions", &chat("x", 1)).await;
        if r.status() == 200 {
            break;
        }
        assert_eq!(r.status(), 429);
        assert!(Instant::now() < deadline, "permits never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Unknown paths and methods answer in the API's error JSON, not with empty bodies.
#[tokio::test]
async fn unknown_paths_and_methods_get_error_json() {
    let gw = embedded(Vec::new(), &[]).await;
    let http = reqwest::Client::new();
    let r = http
        .post(gw_url(&gw, "/v1/embeddings"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    assert_eq!(err["error"]["message"], "Invalid URL (POST /v1/embeddings)");
    let r = http
        .get(gw_url(&gw, "/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    let r = http.get(gw_url(&gw, "/v1/messages")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let err: Value = r.json().await.unwrap();
    assert_eq!(
        err["type"], "error",
        "Anthropic's shape on /v1/messages: {err}"
    );
}

#[tokio::test]
async fn request_ids_pass_through() {
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let gw = embedded(vec![record_for(sim.addr, EngineKind::Vllm)], &[]).await;
    let r = reqwest::Client::new()
        .post(gw_url(&gw, "/v1/chat/completions"))
        .header("x-infera-request-id", "fixture-request-7")
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-infera-request-id"], "fixture-request-7");
}

#[tokio::test]
async fn anthropic_messages_without_tools_json_and_sse() {
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let gw = embedded(vec![record_for(sim.addr, EngineKind::Vllm)], &[]).await;
    let http = reqwest::Client::new();
    let body = json!({"model": MODEL, "max_tokens": 5, "system": "be brief",
                      "messages": [{"role": "user", "content": "Hello"}]});
    let msg: Value = http
        .post(gw_url(&gw, "/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(msg["type"], "message");
    assert_eq!(msg["content"][0]["type"], "text");
    assert_eq!(msg["stop_reason"], "max_tokens");
    assert_eq!(msg["usage"]["output_tokens"], 5);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = http
        .post(gw_url(&gw, "/v1/messages"))
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(
        &events[events.len() - 2..],
        &["message_delta", "message_stop"]
    );
    assert!(events.contains(&"content_block_delta"));
    let bad = http
        .post(gw_url(&gw, "/v1/messages"))
        .json(&json!({"model": MODEL, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().await.unwrap();
    assert_eq!(err["type"], "error", "Anthropic error shape: {err}");
    assert_eq!(err["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn anthropic_messages_with_tools_reach_the_engine_as_openai_tools() {
    let (tx, rx) = mpsc::unbounded_channel();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let upstream = scripted_upstream(rx, seen.clone()).await;
    let gw = embedded(vec![record_for(upstream, EngineKind::Vllm)], &[]).await;
    tx.send(Bytes::from(
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\"}}]}}]}\n\n\
         data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n\
         data: [DONE]\n\n",
    ))
    .unwrap();
    drop(tx);
    let body = json!({"model": MODEL, "max_tokens": 50, "stream": true,
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]});
    let text = reqwest::Client::new()
        .post(gw_url(&gw, "/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let forwarded = seen.lock().unwrap()[0].clone();
    assert_eq!(forwarded["tools"][0]["type"], "function");
    assert_eq!(forwarded["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(forwarded["messages"][0]["content"], "Weather in Paris?");
    assert_eq!(
        forwarded["kv_transfer_params"]["infera_retention"], "long",
        "1h cache_control is a long hint"
    );
    assert!(text.contains("\"type\":\"tool_use\""), "{text}");
    assert!(
        text.contains("\"partial_json\":\"\\\"Paris\\\"}\""),
        "{text}"
    );
    assert!(text.contains("\"stop_reason\":\"tool_use\""), "{text}");
}

#[tokio::test]
async fn bearer_auth_when_a_keys_file_is_given() {
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "# fixture keys\nfixture-key-1\n\nfixture-key-2\n").unwrap();
    let gw = embedded(
        vec![record_for(sim.addr, EngineKind::Vllm)],
        &["--api-keys-file", keys.to_str().unwrap()],
    )
    .await;
    let open = embedded(vec![record_for(sim.addr, EngineKind::Vllm)], &[]).await;
    let http = reqwest::Client::new();
    let no_key = http
        .post(gw_url(&gw, "/v1/chat/completions"))
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 401);
    let err: Value = no_key.json().await.unwrap();
    assert_eq!(err["error"]["type"], "authentication_error");
    let wrong = http
        .post(gw_url(&gw, "/v1/chat/completions"))
        .bearer_auth("nope")
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let ok = http
        .post(gw_url(&gw, "/v1/chat/completions"))
        .bearer_auth("fixture-key-2")
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(
        http.get(gw_url(&gw, "/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200,
        "health stays open"
    );
    let anthropic = http.post(gw_url(&gw, "/v1/messages")).header("x-api-key", "fixture-key-1")
        .json(&json!({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})).send().await.unwrap();
    assert_eq!(anthropic.status(), 200);
    // The scheme in any case; a stray Authorization header does not hide a valid x-api-key.
    for (name, value) in [
        ("authorization", "bearer fixture-key-1"),
        ("authorization", "BEARER  fixture-key-2 "),
    ] {
        let r = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .header(name, value)
            .json(&chat("x", 1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{value}");
    }
    let r = http
        .post(gw_url(&gw, "/v1/chat/completions"))
        .header("authorization", "Bearer a-proxys-own-token")
        .header("x-api-key", "fixture-key-2")
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for value in [
        "Bearer fixture-key-",
        "Bearer fixture-key-12",
        "fixture-key-1",
    ] {
        let r = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .header("authorization", value)
            .json(&chat("x", 1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{value}");
    }
    assert_eq!(
        http.get(gw_url(&gw, "/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        200,
        "/metrics open unless asked"
    );
    let closed = embedded(
        vec![record_for(sim.addr, EngineKind::Vllm)],
        &[
            "--api-keys-file",
            keys.to_str().unwrap(),
            "--metrics-require-auth",
        ],
    )
    .await;
    assert_eq!(
        http.get(gw_url(&closed, "/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let r = http
        .get(gw_url(&closed, "/metrics"))
        .bearer_auth("fixture-key-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        http.get(gw_url(&closed, "/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.post(gw_url(&open, "/v1/chat/completions"))
            .json(&chat("x", 1))
            .send()
            .await
            .unwrap()
            .status(),
        200,
        "auth is off by default"
    );
}

#[tokio::test]
async fn rotated_keys_are_served_without_a_restart_and_a_broken_file_keeps_the_old() {
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "old-key\n").unwrap();
    let gw = embedded(
        vec![record_for(sim.addr, EngineKind::Vllm)],
        &["--api-keys-file", keys.to_str().unwrap()],
    )
    .await;
    let http = reqwest::Client::new();
    let status = |key: &'static str| {
        let req = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .bearer_auth(key)
            .json(&chat("x", 1));
        async move { req.send().await.unwrap().status() }
    };
    assert_eq!(status("old-key").await, 200);
    // A Secret being rewritten can be seen empty: the old keys stay.
    std::fs::write(&keys, "# nothing yet\n").unwrap();
    let err = gw.gateway.reload_api_keys().unwrap_err();
    assert!(err.0.contains("holds no key"), "{err}");
    assert_eq!(status("old-key").await, 200);
    std::fs::write(&keys, "new-key\n").unwrap();
    // What the gateway's 30 s check does, driven here.
    assert!(gw.gateway.reload_api_keys().unwrap());
    assert!(!gw.gateway.reload_api_keys().unwrap());
    assert_eq!(status("old-key").await, 401);
    assert_eq!(status("new-key").await, 200);
}

#[tokio::test]
async fn serves_h2c() {
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let gw = embedded(vec![record_for(sim.addr, EngineKind::Vllm)], &[]).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = h2
        .post(gw_url(&gw, "/v1/chat/completions"))
        .json(&chat("x", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn models_and_workers_views() {
    let sim = start_sim(EngineKind::Sglang, 50.0).await;
    let gw = embedded(vec![record_for(sim.addr, EngineKind::Sglang)], &[]).await;
    let models: Value = reqwest::get(gw_url(&gw, "/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let workers: Value = reqwest::get(gw_url(&gw, "/v1/workers"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(workers["workers"][0]["engine"], "sglang");
    assert_eq!(workers["workers"][0]["breaker"]["state"], "closed");
    assert_eq!(
        reqwest::get(gw_url(&gw, "/ready")).await.unwrap().status(),
        200
    );
}

#[tokio::test]
async fn a_mid_stream_failure_ends_with_an_sse_error_event() {
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let gw = embedded(vec![record_for(sim.addr, EngineKind::Vllm)], &[]).await;
    let http = reqwest::Client::new();
    http.post(format!("http://{}/sim/faults", sim.addr))
        .json(&json!({"fail_after_tokens": 2}))
        .send()
        .await
        .unwrap();
    let mut body = chat("x", 10);
    body["stream"] = json!(true);
    let resp = http
        .post(gw_url(&gw, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 3, "two token chunks, then the error: {text}");
    let last: Value = serde_json::from_str(events[2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "worker_unreachable");
    assert!(!text.contains("[DONE]"));
}

#[tokio::test]
async fn shutdown_lets_open_streams_finish() {
    let sim = start_sim(EngineKind::Vllm, 10.0).await;
    let gw = embedded(vec![record_for(sim.addr, EngineKind::Vllm)], &[]).await;
    let addr = gw.addr;
    let mut body = chat("x", 40);
    body["stream"] = json!(true);
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    let stopping = tokio::spawn(gw.shutdown());
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert!(
        String::from_utf8(rest)
            .unwrap()
            .ends_with("data: [DONE]\n\n"),
        "the open stream completed"
    );
    stopping.await.unwrap();
    assert!(
        reqwest::get(format!("http://{addr}/health")).await.is_err(),
        "no new connections after shutdown"
    );
}

#[tokio::test]
async fn a_stopping_gateway_serves_its_delay_unready_closing_connections() {
    let sim = start_sim(EngineKind::Vllm, 10.0).await;
    let gw = embedded(
        vec![record_for(sim.addr, EngineKind::Vllm)],
        &["--shutdown-delay-s", "1.5"],
    )
    .await;
    let addr = gw.addr;
    let client = reqwest::Client::new();
    let ready = client
        .get(format!("http://{addr}/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    assert!(ready.headers().get("connection").is_none());
    let started = Instant::now();
    let stopping = tokio::spawn(gw.shutdown());
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Not ready, so the Service drops it; still answering, each answer closing its
    // connection so the client's next request goes elsewhere.
    let ready = client
        .get(format!("http://{addr}/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let answer = client
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&chat("during the delay", 4))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["connection"], "close");
    stopping.await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(
        reqwest::get(format!("http://{addr}/health")).await.is_err(),
        "no new connections after the delay"
    );
}

#[tokio::test]
async fn a_rank_multiplexed_worker_gets_each_rank_in_turn() {
    let ranks = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = ranks.clone();
    let app = axum::Router::new().route(
        "/v1/completions",
        post(move |headers: axum::http::HeaderMap| {
            let seen = seen.clone();
            async move {
                let rank = headers
                    .get("x-data-parallel-rank")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                seen.lock().unwrap().push(rank);
                axum::Json(json!({"choices": [{"text": "ok"}]}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut record = record_for(addr, EngineKind::Sglang);
    record.dp_size = Some(2);
    let gw = embedded(vec![record], &[]).await;
    let workers: Value = reqwest::get(gw_url(&gw, "/v1/workers"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(workers["workers"][0]["dp_size"], 2);
    for _ in 0..4 {
        let r = reqwest::Client::new()
            .post(gw_url(&gw, "/v1/completions"))
            .json(&json!({"model": MODEL, "prompt": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(*ranks.lock().unwrap(), vec!["0", "1", "0", "1"]);
}
