//! A worker whose engine hangs (a real `infera-sim` process stopped with SIGSTOP: its
//! port still accepts connections, nothing answers): the gateway's health checks take it
//! out of routing, end its stream in flight with an error event instead of leaving the
//! client waiting for the 600 s idle timeout, and take it back once it answers again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{MODEL, chat, embedded, get_json, record_for, served, start_sim};
use futures::StreamExt;
use infera_gateway::server::RunningGateway;
use infera_proto::worker::EngineKind;
use infera_testkit::process::{ServerProcess, free_port, workspace_binary};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn sim_binary() -> PathBuf {
    workspace_binary("infera-sim").unwrap()
}

fn signal(pid: u32, sig: &str) {
    infera_testkit::process::signal(pid, sig).unwrap();
}

/// `/v1/workers`' health and state of worker `id`.
async fn worker_health(http: &reqwest::Client, gw: &RunningGateway, id: &str) -> (String, String) {
    let body = get_json(http, gw, "/v1/workers").await;
    let w = body["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == id)
        .unwrap();
    (
        w["health"].as_str().unwrap().to_owned(),
        w["state"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn a_hung_worker_leaves_routing_its_stream_ends_and_it_comes_back() {
    let healthy = start_sim(EngineKind::Vllm, 50.0).await;
    let port = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "--engine",
        "vllm",
        "--port",
        &port.to_string(),
        "--served-model-name",
        MODEL,
        "--speedup",
        "1",
    ]
    .map(String::from)
    .to_vec();
    let mut hung = ServerProcess::start(&sim_binary(), &args, &dir.path().join("sim.log")).unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http
        .get(format!("http://127.0.0.1:{port}/health"))
        .send()
        .await
        .map_or(true, |r| !r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "infera-sim never answered: {}",
            hung.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hung_addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let hung_id = hung_addr.to_string();
    let gw = embedded(
        vec![
            record_for(healthy.addr, EngineKind::Vllm),
            record_for(hung_addr, EngineKind::Vllm),
        ],
        &[
            "--router-mode",
            "direct",
            "--health-check-interval-s",
            "0.5",
            "--health-check-timeout-s",
            "0.5",
            "--health-check-failures",
            "2",
        ],
    )
    .await;
    let base = format!("http://{}", gw.addr);
    assert_eq!(
        worker_health(&http, &gw, &hung_id).await,
        ("passing".into(), "active".into())
    );

    // A long stream pinned to the worker that is about to hang.
    let mut body = chat("a long answer", 2000);
    body["stream"] = json!(true);
    let resp = http
        .post(format!("{base}/v1/chat/completions"))
        .header("x-worker-instance-id", &hung_id)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    let stopped = Instant::now();
    signal(hung.pid(), "-STOP");
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = stream.next().await {
            rest.extend_from_slice(&chunk.unwrap());
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream to the hung worker was left open");
    let ended_after = stopped.elapsed();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.contains("stopped answering its health checks") && !text.contains("[DONE]"),
        "{text}"
    );
    println!("stream to the hung worker ended {ended_after:?} after SIGSTOP");
    assert_eq!(
        worker_health(&http, &gw, &hung_id).await,
        ("failing".into(), "degraded".into())
    );

    // A worker registered at the hung URL since it started failing (a restarted
    // sidecar's new id) is out of routing from the next check, not routed until the
    // URL recovers.
    let mut again = record_for(hung_addr, EngineKind::Vllm);
    again.worker_id = format!("{hung_id}-again");
    gw.gateway.registry.upsert(again);
    let registered = Instant::now();
    while worker_health(&http, &gw, &format!("{hung_id}-again"))
        .await
        .0
        != "failing"
    {
        assert!(
            registered.elapsed() < Duration::from_secs(5),
            "a new id at a failing URL was left in routing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Unpinned requests go to the other worker only, none waits on the hung one.
    let before = served(&healthy);
    for _ in 0..10 {
        let r = http
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat("x", 2))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(served(&healthy) - before, 10);

    // Answering again: back in routing after one passing check.
    signal(hung.pid(), "-CONT");
    let resumed = Instant::now();
    while worker_health(&http, &gw, &hung_id).await.0 != "passing" {
        assert!(
            resumed.elapsed() < Duration::from_secs(10),
            "never probed back: {}",
            hung.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("back in routing {:?} after SIGCONT", resumed.elapsed());
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .header("x-worker-instance-id", &hung_id)
        .json(&chat("x", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = gw.gateway.metrics_text();
    assert!(
        text.contains("infera_gateway_health_changes_total{to=\"failing\"} 1")
            && text.contains("infera_gateway_health_changes_total{to=\"passing\"} 1"),
        "{text}"
    );
    hung.kill();
}
