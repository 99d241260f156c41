//! The gateway over real etcd and simulated workers: round-robin spread, leaving
//! routing when a lease goes, failover and circuit breakers, timeouts, records written
//! exactly as the earlier launchers write them, static discovery.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use infera_proto::discovery::build_worker_key;
use infera_proto::worker::EngineKind;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[tokio::test]
async fn round_robin_spreads_requests_evenly() {
    let prefix = unique_prefix();
    let sims = [
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Sglang, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    ];
    for s in &sims {
        register(&prefix, &record_for(s.addr, s.state.flavor.0), 30).await;
    }
    let gw = start_gw(&prefix, &[]).await;
    wait_workers(&gw, 3).await;
    let http = reqwest::Client::new();
    for i in 0..30 {
        let r = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .json(&chat(&format!("q{i}"), 2))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers().contains_key("x-infera-request-id"));
    }
    let counts: Vec<u64> = sims.iter().map(served).collect();
    assert_eq!(counts, vec![10, 10, 10]);
    let metrics = http
        .get(gw_url(&gw, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let picks = format!(
        "infera_router_picks_total{{role=\"mixed\",worker_id=\"{}\"}} 10",
        sims[0].addr
    );
    assert!(metrics.contains(&picks), "{metrics}");
}

#[tokio::test]
async fn a_revoked_lease_takes_the_worker_out_of_routing() {
    let prefix = unique_prefix();
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    let lease_a = register(&prefix, &record_for(a.addr, EngineKind::Vllm), 30).await;
    register(&prefix, &record_for(b.addr, EngineKind::Vllm), 30).await;
    let gw = start_gw(&prefix, &[]).await;
    wait_workers(&gw, 2).await;
    let mut etcd = infera_testkit::etcd_client().await.unwrap();
    etcd.lease_revoke(lease_a).await.unwrap();
    wait_workers(&gw, 1).await;
    let http = reqwest::Client::new();
    for i in 0..6 {
        let r = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .json(&chat(&format!("q{i}"), 1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!((served(&a), served(&b)), (0, 6));
    let workers: Value = get_json(&http, &gw, "/v1/workers").await;
    assert_eq!(workers["workers"].as_array().unwrap().len(), 1);
    assert_eq!(workers["workers"][0]["worker_id"], b.addr.to_string());
}

#[tokio::test]
async fn failover_before_the_first_byte_and_the_breaker_opens() {
    let prefix = unique_prefix();
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    register(&prefix, &record_for(a.addr, EngineKind::Vllm), 30).await;
    register(&prefix, &record_for(b.addr, EngineKind::Vllm), 30).await;
    // A third worker that is registered but unreachable.
    let dead_port = infera_testkit::process::free_port().unwrap();
    let dead: std::net::SocketAddr = format!("127.0.0.1:{dead_port}").parse().unwrap();
    register(&prefix, &record_for(dead, EngineKind::Vllm), 30).await;
    let gw = start_gw(
        &prefix,
        &["--breaker-cooldown-s", "60", "--request-max-retries", "2"],
    )
    .await;
    wait_workers(&gw, 3).await;
    let http = reqwest::Client::new();
    http.post(format!("http://{}/sim/faults", a.addr))
        .json(&json!({"fail_next": 1000}))
        .send()
        .await
        .unwrap();
    for i in 0..12 {
        let r = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .json(&chat(&format!("q{i}"), 1))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            200,
            "request {i} should have failed over to the healthy worker"
        );
    }
    assert_eq!(served(&b), 12, "every request ends on the healthy worker");
    let workers: Value = get_json(&http, &gw, "/v1/workers").await;
    for w in workers["workers"].as_array().unwrap() {
        let expected = if w["worker_id"] == b.addr.to_string() {
            "closed"
        } else {
            "open"
        };
        assert_eq!(w["breaker"]["state"], expected, "{w}");
    }
    let metrics = http
        .get(gw_url(&gw, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!(
            "infera_router_worker_breaker_trips_total{{worker_id=\"{dead}\"}} 1"
        )),
        "{metrics}"
    );
    // The earlier server's gauge values: 0 closed, 1 half-open, 2 open.
    assert!(
        metrics.contains(&format!(
            "infera_router_worker_breaker_state{{worker_id=\"{}\"}} 2",
            a.addr
        )),
        "{metrics}"
    );
}

#[tokio::test]
async fn when_every_worker_fails_the_client_gets_a_clear_error() {
    let prefix = unique_prefix();
    let dead_port = infera_testkit::process::free_port().unwrap();
    let dead: std::net::SocketAddr = format!("127.0.0.1:{dead_port}").parse().unwrap();
    register(&prefix, &record_for(dead, EngineKind::Vllm), 30).await;
    let gw = start_gw(&prefix, &[]).await;
    wait_workers(&gw, 1).await;
    let r = reqwest::Client::new()
        .post(gw_url(&gw, "/v1/chat/completions"))
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "worker_unreachable");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&dead.to_string())
    );
}

#[tokio::test]
async fn a_hung_worker_gets_a_504_not_a_hang() {
    let prefix = unique_prefix();
    let a = start_sim(EngineKind::Vllm, 50.0).await;
    register(&prefix, &record_for(a.addr, EngineKind::Vllm), 30).await;
    let gw = start_gw(&prefix, &["--request-timeout-s", "0.5"]).await;
    wait_workers(&gw, 1).await;
    let http = reqwest::Client::new();
    http.post(format!("http://{}/sim/faults", a.addr))
        .json(&json!({"hang": true}))
        .send()
        .await
        .unwrap();
    let started = Instant::now();
    let r = http
        .post(gw_url(&gw, "/v1/chat/completions"))
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn routes_to_records_written_exactly_like_the_earlier_launchers() {
    let prefix = unique_prefix();
    let sim = start_sim(EngineKind::Sglang, 50.0).await;
    // The earlier launcher's record: every field it writes, including the native index
    // plane block and fields this gateway does not know.
    let record = format!(
        r#"{{"worker_id": "{addr}", "url": "http://{addr}", "model_name": "{MODEL}", "engine": "sglang", "disagg_mode": "mixed", "disagg_meta": null, "kv_events_endpoint": "tcp://127.0.0.1:1", "kv_block_size": 16, "dp_rank": null, "dp_size": 1, "request_transport": "http", "kv": {{"engine_block_size": 16, "index_block_size": 64, "tokenizer": "/models/fixture", "tokenizer_digest": "0123456789abcdef", "tokenizer_canary": [1, 2, 3], "supports_events": true, "event_version": 1, "events_endpoint": "tcp://127.0.0.1:2", "snapshot_endpoint": "tcp://127.0.0.1:3", "tiers": ["hbm"]}}, "launched_at": 1732900000.5, "launcher": "infera.engine.sglang"}}"#,
        addr = sim.addr
    );
    let mut etcd = infera_testkit::etcd_client().await.unwrap();
    etcd.put(
        build_worker_key(&prefix, &sim.addr.to_string()),
        record,
        None,
    )
    .await
    .unwrap();
    let gw = start_gw(&prefix, &[]).await;
    wait_workers(&gw, 1).await;
    let r = reqwest::Client::new()
        .post(gw_url(&gw, "/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(served(&sim), 1);
    let models: Value = reqwest::get(gw_url(&gw, "/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    // A malformed record is refused and counted, not routed.
    etcd.put(build_worker_key(&prefix, "10.9.9.9:1"), "{not json", None)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = reqwest::get(gw_url(&gw, "/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if m.contains("infera_gateway_rejected_worker_records_total{reason=\"invalid_record\"} 1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "malformed record not counted: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gw.gateway.registry.snapshot().workers.len(), 1);
}

#[tokio::test]
async fn ready_waits_for_discovery() {
    let dead_port = infera_testkit::process::free_port().unwrap();
    let dead = format!("http://127.0.0.1:{dead_port}");
    let gw = start_gw_args(&["--etcd-endpoint", &dead]).await;
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(gw_url(&gw, "/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    assert_eq!(
        http.get(gw_url(&gw, "/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let r = http
        .post(gw_url(&gw, "/v1/chat/completions"))
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "no worker registered: model not served");
}

#[tokio::test]
async fn static_discovery_reads_and_rereads_a_file() {
    let a = start_sim(EngineKind::Vllm, 50.0).await;
    let b = start_sim(EngineKind::Vllm, 50.0).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("workers.yaml");
    let yaml = |addrs: &[std::net::SocketAddr]| {
        let mut s = String::from("workers:\n");
        for addr in addrs {
            s.push_str(&format!("  - worker_id: \"{addr}\"\n    url: http://{addr}\n    model_name: {MODEL}\n    engine: vllm\n"));
        }
        s
    };
    std::fs::write(&file, yaml(&[a.addr])).unwrap();
    let gw = start_gw_args(&[
        "--discovery-backend",
        "static",
        "--static-workers",
        file.to_str().unwrap(),
    ])
    .await;
    wait_workers(&gw, 1).await;
    std::fs::write(&file, yaml(&[a.addr, b.addr])).unwrap();
    wait_workers(&gw, 2).await;
    let http = reqwest::Client::new();
    for i in 0..4 {
        let r = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .json(&chat(&format!("{i}"), 1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!((served(&a), served(&b)), (2, 2));
    std::fs::write(&file, "workers: [oops").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reqwest::get(gw_url(&gw, "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .contains("kind=\"file_error\"")
    {
        assert!(Instant::now() < deadline, "the broken file was never read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        gw.gateway.registry.snapshot().workers.len(),
        2,
        "a broken file keeps the last good workers"
    );
}

/// The `kind` count of `infera_gateway_discovery_events_total` on `/metrics`.
async fn discovery_events(
    http: &reqwest::Client,
    gw: &infera_gateway::server::RunningGateway,
    kind: &str,
) -> u64 {
    let text = get_text(http, gw, "/metrics").await;
    let series = format!("infera_gateway_discovery_events_total{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// etcd restarted without its data: the gateway keeps routing to the workers it knew
/// while their records come back, and drops the ones whose records do not by the end of
/// `--empty-resync-grace-s`. Once no worker is left, the model gets 503 with
/// `Retry-After` (retried by SDKs), not 404 `model_not_found`.
#[tokio::test]
async fn an_etcd_restarted_empty_does_not_empty_routing() {
    use etcd_client::PutOptions;
    use infera_testkit::etcd::EtcdServer;
    let a = start_sim(EngineKind::Vllm, 50.0).await;
    let b = start_sim(EngineKind::Vllm, 50.0).await;
    let mut etcd = EtcdServer::start().await.unwrap();
    let endpoint = etcd.endpoint().to_owned();
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let prefix = unique_prefix();
    let put = |record: infera_proto::worker::WorkerRecord| {
        let (endpoint, prefix) = (endpoint.clone(), prefix.clone());
        async move {
            let mut c = etcd_client::Client::connect([endpoint], None)
                .await
                .unwrap();
            let lease = c.lease_grant(30, None).await.unwrap().id();
            let key = build_worker_key(&prefix, &record.worker_id);
            c.put(
                key,
                record.to_json(),
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .unwrap();
        }
    };
    put(record_for(a.addr, EngineKind::Vllm)).await;
    put(record_for(b.addr, EngineKind::Vllm)).await;
    let gw = start_gw_args(&[
        "--etcd-endpoint",
        &endpoint,
        "--etcd-prefix",
        &prefix,
        "--empty-resync-grace-s",
        "4",
    ])
    .await;
    wait_workers(&gw, 2).await;
    let http = reqwest::Client::new();
    let syncs = discovery_events(&http, &gw, "sync").await;
    etcd.kill();
    let _fresh = EtcdServer::start_on(port).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while discovery_events(&http, &gw, "sync").await == syncs {
        assert!(
            Instant::now() < deadline,
            "the gateway never synced with the new etcd"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Synced with an empty etcd: both workers still serve.
    let retained = Instant::now();
    assert_eq!(gw.gateway.registry.snapshot().workers.len(), 2);
    for _ in 0..10 {
        let r = post_json(&http, &gw, "/v1/chat/completions", &chat("x", 1)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    // a's sidecar registers again; b's never does.
    put(record_for(a.addr, EngineKind::Vllm)).await;
    let deadline = retained + Duration::from_secs(10);
    while gw.gateway.registry.snapshot().workers.len() != 1 {
        assert!(Instant::now() < deadline, "b never left routing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        retained.elapsed() >= Duration::from_secs(3),
        "b left before the grace ended"
    );
    assert!(
        gw.gateway
            .registry
            .snapshot()
            .workers
            .contains_key(&a.addr.to_string())
    );
    // a's record expires too (revoked here): the model is known, so 503, not 404.
    let mut c = etcd_client::Client::connect([endpoint.clone()], None)
        .await
        .unwrap();
    c.delete(
        prefix.clone(),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    wait_workers(&gw, 0).await;
    let r = post_json(&http, &gw, "/v1/chat/completions", &chat("x", 1)).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "no_worker_available", "{err}");
}
