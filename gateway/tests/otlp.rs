//! A request followed from the client through the gateway into the engine, as a real
//! OpenTelemetry Collector receives it: the gateway's spans continue the client's W3C
//! trace, and the engine is handed the context of the gateway's client span. One test
//! in its own binary: span export is installed process-wide.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{MODEL, embedded, gw_url, record_for, start_sim};
use infera_proto::worker::EngineKind;
use infera_testkit::otelcol::{OtelCollector, ReceivedSpan};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_followed_from_the_client_into_the_engine() {
    let collector = OtelCollector::start().unwrap();
    let telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera-gateway",
        default_filter: "info".into(),
        otlp_traces_endpoint: Some(collector.traces_endpoint()),
        ..Default::default()
    })
    .unwrap();
    let sim = start_sim(EngineKind::Vllm, 1e6).await;
    let gw = embedded(
        vec![record_for(sim.addr, EngineKind::Vllm)],
        &["--router-policy", "round-robin"],
    )
    .await;
    let http = reqwest::Client::new();
    let body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 4, "stream": true});
    let answer = http
        .post(gw_url(&gw, "/v1/completions"))
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let text = answer.text().await.unwrap();
    assert!(text.contains("[DONE]"), "{text}");
    // What the engine was handed: the client's trace, a span of the gateway's.
    let seen: Value = http
        .get(format!("http://{}/sim/trace", sim.addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let traceparent = seen["traceparent"].as_str().expect("a traceparent");
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(
        parts[1], CLIENT_TRACE,
        "the engine continues the client's trace"
    );
    assert_ne!(parts[2], CLIENT_SPAN, "under the gateway's own span");
    // A request no worker can take: its span ends as an error, with the outcome.
    let unknown = json!({"model": "unknown-fixture-model", "prompt": "hello", "max_tokens": 4});
    let refused = http
        .post(gw_url(&gw, "/v1/completions"))
        .json(&unknown)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    drop(gw);
    drop(telemetry); // sends what is still batched
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans = collector.spans();
        if spans.iter().any(|s| s.kind == 2) || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let find = |name: &str, kind: u64| -> &ReceivedSpan {
        spans
            .iter()
            .find(|s| s.name == name && s.kind == kind)
            .unwrap_or_else(|| panic!("no {name} span in {spans:#?}\n{}", collector.log_tail(20)))
    };
    // Kinds: 1 internal, 2 server, 3 client.
    let request = spans
        .iter()
        .find(|s| s.kind == 2 && s.attribute("outcome") == Some("ok"))
        .unwrap_or_else(|| panic!("no served request span: {spans:#?}"));
    assert_eq!(request.name, "POST /v1/completions");
    let worker = sim.addr.to_string();
    assert_eq!(
        (
            request.service.as_str(),
            request.kind,
            request.trace_id.as_str(),
            request.parent_span_id.as_str()
        ),
        ("infera-gateway", 2, CLIENT_TRACE, CLIENT_SPAN),
        "a server span, child of the client's"
    );
    for (key, want) in [
        ("router", "mixed"),
        ("worker", worker.as_str()),
        ("model", MODEL),
        ("outcome", "ok"),
    ] {
        assert_eq!(request.attribute(key), Some(want), "{key}: {request:#?}");
    }
    let first = request.events.iter().position(|e| e == "first byte");
    let done = request.events.iter().position(|e| e == "completion");
    assert!(
        matches!((first, done), (Some(f), Some(d)) if f < d),
        "first byte, then completion: {:?}",
        request.events
    );
    let refused = spans
        .iter()
        .find(|s| s.kind == 2 && s.attribute("outcome") == Some("no_worker"))
        .unwrap_or_else(|| panic!("no refused request span: {spans:#?}"));
    assert_eq!(refused.status_code, 2, "an error: {refused:#?}");
    assert_eq!(request.status_code, 0, "a served request is not an error");
    let route = find("route", 1);
    assert_eq!(route.parent_span_id, request.span_id);
    let client = find("POST /v1/completions", 3);
    assert_eq!(
        (
            client.trace_id.as_str(),
            client.parent_span_id.as_str(),
            client.span_id.as_str()
        ),
        (CLIENT_TRACE, request.span_id.as_str(), parts[2]),
        "the engine's parent is the gateway's client span"
    );
    assert_eq!(client.attribute("worker"), Some(worker.as_str()));
    assert_eq!(client.attribute("http.status_code"), Some("200"));
}
