//! The earlier server's `POST /v1/cache/prewarm` through this architecture: a gateway
//! forwards the hint to the sidecar of each worker of the model (`--worker-sidecar-port`),
//! whose `/kvd/prefetch` leaves it with the real kvd beside the engine (`--kvd-socket`),
//! which works on it (its prefetch counters move). A model no worker serves is a 503
//! naming why.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{SIDECAR, args_of, gateway_on_etcd, sim_binary, unique_prefix, wait_key};
use infera_proto::discovery::build_worker_key;
use infera_testkit::process::{ServerProcess, free_port, workspace_binary};
use std::path::Path;
use std::time::{Duration, Instant};

fn kvd_metric(port: u16, series: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return -1.0;
    };
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[tokio::test]
async fn a_prewarm_hint_reaches_the_kvd_beside_each_worker_through_its_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kvd.sock");
    let kvd_metrics = free_port().unwrap();
    // A lower tier, so kvd works on the hint (with RAM alone there is nothing to warm).
    let nvme = dir.path().join("nvme");
    let mut kvd = ServerProcess::start(
        &workspace_binary("infera-kvd").unwrap(),
        &args_of(&[
            "--socket",
            socket.to_str().unwrap(),
            "--max-bytes",
            "67108864",
            "--long-path",
            nvme.to_str().unwrap(),
            "--long-bytes",
            "4194304",
            "--metrics-addr",
            &format!("127.0.0.1:{kvd_metrics}"),
        ]),
        &dir.path().join("kvd.log"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "kvd never listened: {}",
            kvd.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let prefix = unique_prefix("prewarm");
    let port = free_port().unwrap();
    let status_port = free_port().unwrap();
    let args = args_of(&[
        "sim",
        "--etcd-endpoint",
        &etcd,
        "--etcd-prefix",
        &prefix,
        "--sim-binary",
        sim_binary().to_str().unwrap(),
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
        "--status-port",
        &status_port.to_string(),
        "--kvd-socket",
        socket.to_str().unwrap(),
    ]);
    let mut sidecar =
        ServerProcess::start(Path::new(SIDECAR), &args, &dir.path().join("sidecar.log")).unwrap();
    let key = build_worker_key(&prefix, &format!("127.0.0.1:{port}"));
    wait_key(&key, true, Duration::from_secs(60), &mut sidecar).await;

    let gw = gateway_on_etcd(
        &etcd,
        &prefix,
        &args_of(&["--worker-sidecar-port", &status_port.to_string()]),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.gateway.registry.snapshot().workers.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the gateway never saw the worker"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = reqwest::Client::new();
    let url = format!("http://{}/v1/cache/prewarm", gw.addr);
    let answer = http
        .post(&url)
        .body(
            r#"{"model": "fixture-model", "block_hashes": ["0011223344556677", "8899aabbccddeeff", "0102030405060708"], "deadline_ms": 5000}"#,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    assert_eq!(
        answer.text().await.unwrap(),
        r#"{"accepted": true, "n_keys": 3}"#,
        "the earlier server's bytes"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while kvd_metric(
        kvd_metrics,
        "infera_kvd_prefetch_keys_total{outcome=\"missing\"}",
    ) < 3.0
    {
        assert!(
            Instant::now() < deadline,
            "kvd never worked on the hint: {}\n{}",
            kvd.log_tail(20),
            sidecar.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let absent = http
        .post(&url)
        .body(r#"{"model": "fixture-absent", "block_hashes": ["0011223344556677"]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(absent.status(), 503);
    assert_eq!(
        absent.text().await.unwrap(),
        r#"{"detail":"prefetch unavailable — no active worker serves model 'fixture-absent', so no kvd beside one can take it"}"#
    );
    sidecar.kill();
    kvd.kill();
}
