//! kv-aware routing end to end, with simulated engines publishing real KV events, real
//! etcd and real NATS: a shared prefix goes back to the worker that holds it (events over
//! ZMQ in every layout, and over JetStream), cleared blocks stop attracting requests, and
//! a worker whose tokenizer canary differs is refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use infera_gateway::server::RunningGateway;
use infera_proto::kv_events::encode::KvEventFormat;
use infera_proto::kv_stream::{build_kv_event_subject, parse_zmq_frames};
use infera_proto::worker::{EngineKind, WorkerRecord};
use infera_sim::kv_events::KvEventsEndpoint;
use infera_sim::worker::RunningWorker;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use zeromq::{Socket, SocketRecv, SubSocket};

struct EventSim {
    worker: RunningWorker,
    endpoint: String,
    replay: String,
}

async fn start_event_sim(engine: EngineKind, format: Option<KvEventFormat>) -> EventSim {
    let (p, r) = (
        infera_testkit::process::free_port().unwrap(),
        infera_testkit::process::free_port().unwrap(),
    );
    let endpoint = format!("tcp://127.0.0.1:{p}");
    let replay = format!("tcp://127.0.0.1:{r}");
    let worker = start_sim_with(engine, 50.0, |cfg| {
        cfg.event_format = format;
        cfg.kv_events = Some(KvEventsEndpoint {
            endpoint: endpoint.clone(),
            replay_endpoint: Some(replay.clone()),
            topic: "kv-events".into(),
        });
    })
    .await;
    EventSim {
        worker,
        endpoint,
        replay,
    }
}

fn event_record(sim: &EventSim) -> WorkerRecord {
    let mut r = record_for(sim.worker.addr, sim.worker.state.flavor.0);
    r.kv_events_endpoint = Some(sim.endpoint.clone());
    r.extra
        .insert("kv_events_replay_endpoint".into(), json!(sim.replay));
    r
}

async fn cache_blocks(gw: &RunningGateway, worker: &RunningWorker) -> u64 {
    let view: Value = reqwest::get(gw_url(gw, &format!("/v1/admin/cache-view/{}", worker.addr)))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    view["block_count"].as_u64().unwrap_or(0)
}

async fn wait_blocks(gw: &RunningGateway, worker: &RunningWorker, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while cache_blocks(gw, worker).await < at_least {
        assert!(
            Instant::now() < deadline,
            "the gateway never indexed {at_least} blocks of {}",
            worker.addr
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

fn prefixed(prefix: &str, question: &str) -> Value {
    json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": prefix}, {"role": "user", "content": question}]})
}

/// Sends requests sharing a long prefix and checks they all land on one worker, which
/// serves most of each prompt from cache. (At the default weight 1 a cached prefix is
/// worth exactly the recent load its first request charged, so the tests use 2.)
async fn assert_prefix_affinity(gw: &RunningGateway, sims: &[&RunningWorker], tag: &str) {
    let http = reqwest::Client::new();
    let prefix = format!("{tag}: you are a meticulous assistant. ").repeat(12);
    let start: Vec<u64> = sims.iter().map(|s| served(s)).collect();
    let mut indexed = Vec::new();
    for s in sims {
        indexed.push(cache_blocks(gw, s).await);
    }
    let first: Value = http
        .post(gw_url(gw, "/v1/chat/completions"))
        .json(&prefixed(&prefix, "first?"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Only the chat template's opening block can be cached yet.
    assert!(
        first["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            <= 16
    );
    let h = sims
        .iter()
        .zip(&start)
        .position(|(s, n)| served(s) > *n)
        .unwrap();
    let holder = sims[h];
    let before: Vec<u64> = sims.iter().map(|s| served(s)).collect();
    // The holder's new blocks must be indexed from its events before the next request.
    wait_blocks(gw, holder, indexed[h] + (prefix.len() / 16) as u64 - 2).await;
    for i in 0..6 {
        let r: Value = http
            .post(gw_url(gw, "/v1/chat/completions"))
            .json(&prefixed(&prefix, &format!("question {i}?")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached >= prefix.len() as u64 - 16,
            "{tag}: request {i} missed the cache ({cached} cached)"
        );
    }
    let after: Vec<u64> = sims.iter().map(|s| served(s)).collect();
    for (s, (b, a)) in sims.iter().zip(before.iter().zip(&after)) {
        let expected = if s.addr == holder.addr { b + 6 } else { *b };
        assert_eq!(
            *a, expected,
            "{tag}: every request with the prefix went to its holder"
        );
    }
}

#[tokio::test]
async fn shared_prefixes_follow_zmq_events_in_every_layout() {
    for (engine, format, tag) in [
        (EngineKind::Sglang, None, "sglang-array"),
        (EngineKind::Vllm, None, "vllm-tagged-map"),
        (
            EngineKind::Vllm,
            Some(KvEventFormat::VllmArray),
            "vllm-array",
        ),
        (
            EngineKind::Vllm,
            Some(KvEventFormat::VllmMapBatch),
            "vllm-map-batch",
        ),
    ] {
        let prefix = unique_prefix();
        let a = start_event_sim(engine, format).await;
        let b = start_event_sim(engine, format).await;
        register(&prefix, &event_record(&a), 30).await;
        register(&prefix, &event_record(&b), 30).await;
        let gw = start_gw(
            &prefix,
            &["--router-policy", "kv-aware", "--kv-overlap-weight", "2"],
        )
        .await;
        wait_workers(&gw, 2).await;
        assert_prefix_affinity(&gw, &[&a.worker, &b.worker], tag).await;
        let metrics = reqwest::get(gw_url(&gw, "/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("infera_gateway_kv_events_total{outcome=\"applied\"}"),
            "{tag}: {metrics}"
        );
        assert!(
            !metrics.contains("outcome=\"undecodable\""),
            "{tag}: {metrics}"
        );
        assert!(
            // A histogram per role, as the earlier server's.
            metrics.contains("infera_router_pick_cache_hits_count{role=\"mixed\"}"),
            "{tag}"
        );
    }
}

#[tokio::test]
async fn cleared_blocks_stop_attracting_requests() {
    let prefix = unique_prefix();
    let a = start_event_sim(EngineKind::Vllm, None).await;
    register(&prefix, &event_record(&a), 30).await;
    let gw = start_gw(&prefix, &["--router-policy", "kv-aware"]).await;
    wait_workers(&gw, 1).await;
    let http = reqwest::Client::new();
    let system = "cached system prompt, long enough for several blocks. ".repeat(4);
    http.post(gw_url(&gw, "/v1/chat/completions"))
        .json(&prefixed(&system, "q"))
        .send()
        .await
        .unwrap();
    wait_blocks(&gw, &a.worker, 8).await;
    http.post(format!("http://{}/reset_prefix_cache", a.worker.addr))
        .send()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache_blocks(&gw, &a.worker).await > 0 {
        assert!(
            Instant::now() < deadline,
            "AllBlocksCleared never emptied the view"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

#[tokio::test]
async fn a_worker_with_a_different_tokenizer_is_refused() {
    let prefix = unique_prefix();
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    let with_canary = |addr, canary: Vec<u32>| {
        let mut r = record_for(addr, EngineKind::Vllm);
        r.kv = Some(
            serde_json::from_value(json!({
                "engine_block_size": 16, "index_block_size": 64, "tokenizer": "fixture/tokenizer",
                "tokenizer_digest": "0123456789abcdef", "tokenizer_canary": canary,
            }))
            .unwrap(),
        );
        r
    };
    register(&prefix, &with_canary(a.addr, vec![9707, 11, 1879]), 30).await;
    let gw = start_gw(&prefix, &["--router-policy", "kv-aware"]).await;
    wait_workers(&gw, 1).await;
    register(&prefix, &with_canary(b.addr, vec![1, 2, 3]), 30).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = reqwest::get(gw_url(&gw, "/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if m.contains("infera_gateway_rejected_worker_records_total{reason=\"tokenizer_canary\"} 1")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the mismatched canary was not refused: {m}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(gw.gateway.registry.snapshot().workers.len(), 1);
}

#[tokio::test]
async fn shared_prefixes_follow_events_relayed_through_jetstream() {
    let nats_url = infera_testkit::nats_url().await.unwrap();
    let prefix = unique_prefix();
    let a = start_event_sim(EngineKind::Sglang, None).await;
    let b = start_event_sim(EngineKind::Sglang, None).await;
    // Relay each sim's ZMQ batches to JetStream, as the sidecar does.
    let nats = async_nats::connect(&nats_url).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let mut relays = tokio::task::JoinSet::new();
    for sim in [&a, &b] {
        let (endpoint, subject, js) = (
            sim.endpoint.clone(),
            build_kv_event_subject(&sim.worker.addr.to_string(), 0),
            js.clone(),
        );
        let mut sub = SubSocket::new();
        sub.connect(&endpoint).await.unwrap();
        sub.subscribe("").await.unwrap();
        relays.spawn(async move {
            while let Ok(msg) = sub.recv().await {
                let frames = msg.into_vec();
                let parts: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
                let parsed = parse_zmq_frames(&parts).unwrap();
                js.publish(
                    subject.clone(),
                    bytes::Bytes::copy_from_slice(parsed.payload),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            }
        });
    }
    for sim in [&a, &b] {
        // The records name the engines' ZMQ endpoint, but this gateway reads NATS.
        register(&prefix, &event_record(sim), 30).await;
    }
    let gw = start_gw(
        &prefix,
        &[
            "--router-policy",
            "kv-aware",
            "--kv-overlap-weight",
            "2",
            "--kv-event-transport",
            "nats",
            "--nats-server",
            &nats_url,
        ],
    )
    .await;
    wait_workers(&gw, 2).await;
    // The relay's SUB may join after the first batches; warm it up until events flow.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    while cache_blocks(&gw, &a.worker).await == 0 || cache_blocks(&gw, &b.worker).await == 0 {
        assert!(
            Instant::now() < deadline,
            "no event reached the gateway through JetStream"
        );
        i += 1;
        // Two at once: the second sees the first's queued prefill on its worker and goes
        // to the other (one at a time, every warm-up would follow the chat template's
        // shared first block to one worker).
        let send = |n: usize| {
            http.post(gw_url(&gw, "/v1/chat/completions"))
                .json(&prefixed(
                    &format!("warm-up {n} text that fills a block"),
                    "q",
                ))
                .send()
        };
        let (first, second) = tokio::join!(send(2 * i), send(2 * i + 1));
        first.unwrap();
        second.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_prefix_affinity(&gw, &[&a.worker, &b.worker], "jetstream").await;
    relays.abort_all();
}

#[tokio::test]
async fn workers_without_events_are_routed_on_the_routers_own_history() {
    let prefix = unique_prefix();
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    register(&prefix, &record_for(a.addr, EngineKind::Vllm), 30).await;
    register(&prefix, &record_for(b.addr, EngineKind::Vllm), 30).await;
    let gw = start_gw(
        &prefix,
        &["--router-policy", "kv-aware", "--kv-overlap-weight", "2"],
    )
    .await;
    wait_workers(&gw, 2).await;
    // No events: the first pick itself fills the holder's approximate view.
    assert_prefix_affinity(&gw, &[&a, &b], "approximate").await;
    let view: Value = reqwest::get(gw_url(
        &gw,
        &format!("/v1/admin/cache-view/{}?targets=true", a.addr),
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(view["source"], "router picks (approximate)");
}
