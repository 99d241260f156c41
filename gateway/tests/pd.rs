//! Prefill/decode disaggregation end to end: the gateway over real etcd and simulated
//! prefill and decode workers of every connector (the simulators reject any leg whose
//! body or headers their engine would mishandle), streaming and not; a failing
//! prefill, a decode failing before its first byte (retried) and after it (error
//! event); mismatched protocols; chat to a completions-only pool; direct mode pins.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use infera_gateway::server::RunningGateway;
use infera_proto::pd::PdProtocol;
use infera_proto::worker::{EngineKind, WorkerRecord};
use infera_sim::faults::FaultSettings;
use infera_sim::pd::{PdLeg, PdRole, build_disagg_meta};
use infera_sim::worker::RunningWorker;
use serde_json::{Value, json};

fn role(protocol: PdProtocol, leg: PdLeg) -> PdRole {
    PdRole {
        leg,
        protocol,
        host: "127.0.0.1".into(),
        http_port: 0,
        handshake_port: 6301,
        notify_port: 61005,
        tp_size: 1,
        dp_size: 1,
        bootstrap_port: 8998,
        engine_id: "eng-test".into(),
    }
}

/// A simulated worker of `protocol` serving `leg`, and the record its launcher writes.
async fn start_leg(protocol: PdProtocol, leg: PdLeg) -> (RunningWorker, WorkerRecord) {
    let role = role(protocol, leg);
    let meta = build_disagg_meta(&role);
    let sim = start_sim_with(protocol.engine(), 50.0, |c| c.pd = Some(role)).await;
    let mut record = serde_json::to_value(record_for(sim.addr, protocol.engine())).unwrap();
    record["disagg_mode"] = json!(match leg {
        PdLeg::Prefill => "prefill",
        PdLeg::Decode => "decode",
    });
    record["disagg_meta"] = meta;
    let record = WorkerRecord::from_json(record.to_string().as_bytes()).unwrap();
    (sim, record)
}

struct Pair {
    prefill: RunningWorker,
    decode: RunningWorker,
    gw: RunningGateway,
}

async fn start_pair(p: PdProtocol, d: PdProtocol, gw_flags: &[&str]) -> Pair {
    let prefix = unique_prefix();
    let (prefill, pr) = start_leg(p, PdLeg::Prefill).await;
    let (decode, dr) = start_leg(d, PdLeg::Decode).await;
    register(&prefix, &pr, 30).await;
    register(&prefix, &dr, 30).await;
    let gw = start_gw(&prefix, gw_flags).await;
    wait_workers(&gw, 2).await;
    Pair {
        prefill,
        decode,
        gw,
    }
}

fn completion(stream: bool) -> Value {
    json!({"model": MODEL, "prompt": "tell me a story about a prefill", "max_tokens": 6, "stream": stream})
}

async fn post(gw: &RunningGateway, path: &str, body: &Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(gw_url(gw, path))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn metrics(gw: &RunningGateway) -> String {
    reqwest::get(gw_url(gw, "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn set_faults(sim: &RunningWorker, faults: FaultSettings) {
    let r = reqwest::Client::new()
        .post(format!("http://{}/sim/faults", sim.addr))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Makes `sim` answer its next `n` generation requests with a 500.
async fn fail_next(sim: &RunningWorker, n: u64) {
    set_faults(
        sim,
        FaultSettings {
            fail_next: n,
            ..Default::default()
        },
    )
    .await;
}

/// The `data:` payloads of an SSE body.
fn sse_events(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

/// Waits until the prefill leg has been read to its end (it runs detached).
async fn wait_served(sim: &RunningWorker, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while served(sim) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "sim served {} of {n}",
            served(sim)
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn every_connector_serves_streaming_and_unary_requests() {
    for protocol in PdProtocol::ALL {
        let pair = start_pair(protocol, protocol, &[]).await;
        let (status, text) = post(&pair.gw, "/v1/completions", &completion(false)).await;
        assert_eq!(status, 200, "{protocol}: {text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert!(
            !answer["choices"][0]["text"].as_str().unwrap().is_empty(),
            "{protocol}: {text}"
        );
        let (status, text) = post(&pair.gw, "/v1/completions", &completion(true)).await;
        assert_eq!(status, 200, "{protocol}: {text}");
        let events = sse_events(&text);
        assert_eq!(events.last(), Some(&"[DONE]"), "{protocol}: {text}");
        assert!(
            !text.contains("\"error\""),
            "{protocol}: an error event: {text}"
        );
        // Both legs ran on their own worker, twice.
        wait_served(&pair.prefill, 2).await;
        assert_eq!(served(&pair.decode), 2, "{protocol}");
        let m = metrics(&pair.gw).await;
        for (role, sim) in [("prefill", &pair.prefill), ("decode", &pair.decode)] {
            let line = format!(
                "infera_router_picks_total{{role=\"{role}\",worker_id=\"{}\"}} 2",
                sim.addr
            );
            assert!(m.contains(&line), "{protocol}: {line}\n{m}");
        }
        let ok = format!("infera_pd_requests_total{{protocol=\"{protocol}\",outcome=\"ok\"}} 2");
        assert!(m.contains(&ok), "{protocol}: {m}");
        // Per leg and worker, as the earlier server labelled it.
        let decode_leg = format!(
            "infera_pd_dispatch_duration_seconds_count{{leg=\"decode\",worker_id=\"{}\"}} 2",
            pair.decode.addr
        );
        assert!(m.contains(&decode_leg), "{m}");
    }
}

#[tokio::test]
async fn sglang_pairs_serve_chat_and_anthropic_messages() {
    let p = PdProtocol::SglangBootstrap;
    let pair = start_pair(p, p, &[]).await;
    let mut body = chat("hello there", 5);
    body["stream"] = json!(true);
    let (status, text) = post(&pair.gw, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(sse_events(&text).last(), Some(&"[DONE]"));
    let (status, text) = post(
        &pair.gw,
        "/v1/messages",
        &json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["type"],
        "message"
    );
}

#[tokio::test]
async fn a_failing_prefill_fails_the_request_with_its_reason() {
    for protocol in [PdProtocol::VllmMooncake, PdProtocol::VllmMoriRead] {
        let pair = start_pair(protocol, protocol, &[]).await;
        fail_next(&pair.prefill, 1).await;
        let (status, text) = post(&pair.gw, "/v1/completions", &completion(false)).await;
        assert_eq!(status, 502, "{protocol}: {text}");
        let err: Value = serde_json::from_str(&text).unwrap();
        let message = err["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("prefill worker {}", pair.prefill.addr))
                && message.contains("injected failure"),
            "{protocol}: {message}"
        );
        let m = metrics(&pair.gw).await;
        assert!(
            m.contains("infera_pd_bootstrap_failures_total{reason=\"prefill_error\"} 1"),
            "{m}"
        );
        // The fault was one request: the next one goes through.
        let (status, text) = post(&pair.gw, "/v1/completions", &completion(false)).await;
        assert_eq!(status, 200, "{protocol}: {text}");
    }
}

#[tokio::test]
async fn a_prefill_failing_under_a_stream_ends_it_with_an_error() {
    let protocol = PdProtocol::SglangBootstrap;
    let pair = start_pair(protocol, protocol, &[]).await;
    fail_next(&pair.prefill, 1).await;
    let mut body = completion(true);
    body["max_tokens"] = json!(64);
    let (status, text) = post(&pair.gw, "/v1/completions", &body).await;
    // Either before the decode's first byte (502) or after it (an error event): never
    // a complete answer built on a KV transfer that did not happen.
    let reported = if status == 502 {
        text
    } else {
        assert_eq!(status, 200);
        let events = sse_events(&text);
        assert_ne!(events.last(), Some(&"[DONE]"), "{text}");
        events.last().unwrap().to_string()
    };
    assert!(
        reported.contains(&format!("prefill worker {}", pair.prefill.addr)),
        "{reported}"
    );
}

#[tokio::test]
async fn a_decode_failing_before_its_first_byte_is_retried() {
    for protocol in [PdProtocol::VllmMoriWrite, PdProtocol::AtomMooncake] {
        let pair = start_pair(protocol, protocol, &[]).await;
        fail_next(&pair.decode, 2).await;
        let (status, text) = post(&pair.gw, "/v1/completions", &completion(true)).await;
        assert_eq!(status, 200, "{protocol}: {text}");
        assert_eq!(
            sse_events(&text).last(),
            Some(&"[DONE]"),
            "{protocol}: {text}"
        );
        let m = metrics(&pair.gw).await;
        assert!(
            m.contains("infera_pd_decode_open_retries_total 2"),
            "{protocol}: {m}"
        );
        // Past the retries, the client hears which decode worker failed.
        fail_next(&pair.decode, 10).await;
        let (status, text) = post(&pair.gw, "/v1/completions", &completion(false)).await;
        assert_eq!(status, 502, "{protocol}: {text}");
        assert!(
            text.contains(&format!("decode worker {}", pair.decode.addr))
                && text.contains("after 4 attempts"),
            "{protocol}: {text}"
        );
    }
}

/// A decode that keeps failing before it answers: the request goes to another pair
/// (the client has seen nothing), and the response names the pair that served it.
#[tokio::test]
async fn a_decode_that_keeps_failing_is_replaced_by_another_pair() {
    let protocol = PdProtocol::SglangBootstrap;
    let prefix = unique_prefix();
    let (_prefill, pr) = start_leg(protocol, PdLeg::Prefill).await;
    let (broken, br) = start_leg(protocol, PdLeg::Decode).await;
    let (healthy, hr) = start_leg(protocol, PdLeg::Decode).await;
    for r in [&pr, &br, &hr] {
        register(&prefix, r, 30).await;
    }
    let gw = start_gw(&prefix, &[]).await;
    wait_workers(&gw, 3).await;
    fail_next(&broken, 100).await;
    for stream in [false, true, false, true] {
        let r = reqwest::Client::new()
            .post(gw_url(&gw, "/v1/completions"))
            .json(&completion(stream))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let header = |name: &str| r.headers()[name].to_str().unwrap().to_owned();
        assert_eq!(header("x-infera-decode-worker"), healthy.addr.to_string());
        assert_eq!(header("x-infera-prefill-worker"), pr.worker_id);
        assert_eq!(header("x-infera-worker"), healthy.addr.to_string());
        let text = r.text().await.unwrap();
        assert!(!text.contains("\"error\""), "{text}");
    }
    // Once: its four failed opens opened its breaker, and no later pair picks it.
    let m = metrics(&gw).await;
    assert!(
        m.contains("infera_pd_bootstrap_failures_total{reason=\"pair_retried\"} 1"),
        "{m}"
    );
}

/// Mid-rollout two revisions serve side by side: a prefill is paired only with a decode
/// of its own revision, and the response names it.
#[tokio::test]
async fn prefill_and_decode_are_paired_only_within_one_revision() {
    let protocol = PdProtocol::SglangBootstrap;
    let prefix = unique_prefix();
    let (_old_p, mut opr) = start_leg(protocol, PdLeg::Prefill).await;
    let (_new_p, mut npr) = start_leg(protocol, PdLeg::Prefill).await;
    let (old_d, mut odr) = start_leg(protocol, PdLeg::Decode).await;
    let (new_d, mut ndr) = start_leg(protocol, PdLeg::Decode).await;
    for (r, revision) in [
        (&mut opr, "old"),
        (&mut odr, "old"),
        (&mut npr, "new"),
        (&mut ndr, "new"),
    ] {
        r.set_revision(revision);
        register(&prefix, r, 30).await;
    }
    let gw = start_gw(&prefix, &[]).await;
    wait_workers(&gw, 4).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let r = reqwest::Client::new()
            .post(gw_url(&gw, "/v1/completions"))
            .json(&completion(false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let header = |name: &str| r.headers()[name].to_str().unwrap().to_owned();
        let (prefill, decode, revision) = (
            header("x-infera-prefill-worker"),
            header("x-infera-decode-worker"),
            header("x-infera-revision"),
        );
        let want_decode = if prefill == opr.worker_id {
            &old_d
        } else {
            &new_d
        };
        assert_eq!(
            decode,
            want_decode.addr.to_string(),
            "{prefill} paired across revisions"
        );
        assert_eq!(
            revision,
            if prefill == opr.worker_id {
                "old"
            } else {
                "new"
            }
        );
        seen.insert(revision);
    }
    assert_eq!(seen.len(), 2, "both revisions served: {seen:?}");
}

#[tokio::test]
async fn a_decode_failing_mid_stream_ends_with_an_error_event() {
    let protocol = PdProtocol::VllmMooncake;
    let pair = start_pair(protocol, protocol, &[]).await;
    set_faults(
        &pair.decode,
        FaultSettings {
            fail_after_tokens: Some(2),
            ..Default::default()
        },
    )
    .await;
    let mut body = completion(true);
    body["max_tokens"] = json!(20);
    let (status, text) = post(&pair.gw, "/v1/completions", &body).await;
    assert_eq!(status, 200);
    let events = sse_events(&text);
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("worker {}", pair.decode.addr)),
        "{text}"
    );
    assert!(events.len() >= 2, "tokens came before the failure: {text}");
}

/// The text of a completions stream.
fn streamed_text(text: &str) -> String {
    sse_events(text)
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_decode_failing_mid_stream_is_continued_by_a_new_pair() {
    let protocol = PdProtocol::VllmMooncake;
    let prefix = unique_prefix();
    let (_prefill, pr) = start_leg(protocol, PdLeg::Prefill).await;
    let (first, fr) = start_leg(protocol, PdLeg::Decode).await;
    let (second, sr) = start_leg(protocol, PdLeg::Decode).await;
    for r in [&pr, &fr, &sr] {
        register(&prefix, r, 30).await;
    }
    let gw = start_gw(&prefix, &["--migration-limit", "1"]).await;
    wait_workers(&gw, 3).await;
    let mut body = completion(true);
    body["max_tokens"] = json!(20);
    let (status, unfaulted) = post(&gw, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{unfaulted}");
    // Each decode breaks its stream after 12 tokens: the continuation needs 8.
    for decode in [&first, &second] {
        set_faults(
            decode,
            FaultSettings {
                fail_after_tokens: Some(12),
                ..Default::default()
            },
        )
        .await;
    }
    let (status, moved) = post(&gw, "/v1/completions", &body).await;
    assert_eq!(status, 200);
    assert!(!moved.contains("\"error\""), "{moved}");
    assert_eq!(streamed_text(&moved), streamed_text(&unfaulted), "{moved}");
    assert!(moved.ends_with("data: [DONE]\n\n"), "{moved}");
    let m = metrics(&gw).await;
    assert!(
        m.contains("infera_migrations_total{reason=\"stream_broken\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn mismatched_protocols_and_chat_to_atom_get_clear_errors() {
    let pair = start_pair(PdProtocol::VllmMooncake, PdProtocol::SglangBootstrap, &[]).await;
    let (status, text) = post(&pair.gw, "/v1/completions", &completion(false)).await;
    assert_eq!(status, 501, "{text}");
    assert!(
        text.contains("speaks vllm-mooncake") && text.contains("speaks sglang-bootstrap"),
        "{text}"
    );
    assert_eq!(served(&pair.prefill) + served(&pair.decode), 0);

    // With a decode worker of the prefill's protocol around too, pairs are formed with it.
    let prefix = unique_prefix();
    let (_p, pr) = start_leg(PdProtocol::VllmMooncake, PdLeg::Prefill).await;
    let (good, gr) = start_leg(PdProtocol::VllmMooncake, PdLeg::Decode).await;
    let (other, or) = start_leg(PdProtocol::SglangBootstrap, PdLeg::Decode).await;
    for r in [&pr, &gr, &or] {
        register(&prefix, r, 30).await;
    }
    let gw = start_gw(&prefix, &[]).await;
    wait_workers(&gw, 3).await;
    for _ in 0..4 {
        let (status, text) = post(&gw, "/v1/completions", &completion(false)).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!((served(&good), served(&other)), (4, 0));
    assert!(
        metrics(&pair.gw)
            .await
            .contains("infera_pd_bootstrap_failures_total{reason=\"protocol_mismatch\"} 1")
    );

    let atom = PdProtocol::AtomMooncake;
    let pair = start_pair(atom, atom, &[]).await;
    let (status, text) = post(&pair.gw, "/v1/chat/completions", &chat("hi", 4)).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("/v1/completions only"), "{text}");
}

#[tokio::test]
async fn only_one_pool_is_a_503_naming_the_missing_one() {
    let prefix = unique_prefix();
    let (_prefill, record) = start_leg(PdProtocol::VllmMooncake, PdLeg::Prefill).await;
    register(&prefix, &record, 30).await;
    let gw = start_gw(&prefix, &[]).await;
    wait_workers(&gw, 1).await;
    let (status, text) = post(&gw, "/v1/completions", &completion(false)).await;
    assert_eq!(status, 503);
    assert!(
        text.contains("no decode worker") && text.contains("missing_decode_pool"),
        "{text}"
    );
}

#[tokio::test]
async fn direct_mode_sends_to_the_pinned_workers() {
    let protocol = PdProtocol::VllmMooncake;
    let prefix = unique_prefix();
    let mut sims = Vec::new();
    for leg in [PdLeg::Prefill, PdLeg::Prefill, PdLeg::Decode, PdLeg::Decode] {
        let (sim, record) = start_leg(protocol, leg).await;
        register(&prefix, &record, 30).await;
        sims.push(sim);
    }
    let mixed = start_sim(EngineKind::Vllm, 50.0).await;
    register(&prefix, &record_for(mixed.addr, EngineKind::Vllm), 30).await;
    let gw = start_gw(&prefix, &["--router-mode", "direct"]).await;
    wait_workers(&gw, 5).await;
    let http = reqwest::Client::new();
    let send = |worker: Option<String>, prefill: Option<String>| {
        let mut r = http
            .post(gw_url(&gw, "/v1/completions"))
            .json(&completion(false));
        if let Some(w) = worker {
            r = r.header("x-worker-instance-id", w);
        }
        if let Some(p) = prefill {
            r = r.header("x-prefill-instance-id", p);
        }
        async move {
            let resp = r.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    let id = |s: &RunningWorker| s.addr.to_string();
    for _ in 0..3 {
        let (status, text) = send(Some(id(&sims[3])), Some(id(&sims[1]))).await;
        assert_eq!(status, 200, "{text}");
    }
    wait_served(&sims[1], 3).await;
    assert_eq!(
        [&sims[0], &sims[1], &sims[2], &sims[3]].map(served),
        [0, 3, 0, 3]
    );
    // A pinned mixed worker serves alone.
    let (status, _) = send(Some(id(&mixed)), None).await;
    assert_eq!((status, served(&mixed)), (200, 1));
    // A stale pin is a 503 naming it, not a silent re-route.
    let (status, text) = send(Some("10.9.9.9:1".into()), None).await;
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("x-worker-instance-id names worker '10.9.9.9:1'"),
        "{text}"
    );
    let (status, text) = send(Some(id(&sims[2])), Some(id(&sims[3]))).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("is a decode worker"), "{text}");
    // Without pins, the AutoRouter decides (both pools present: disaggregated).
    let (status, text) = send(None, None).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(served(&mixed), 1);
}
