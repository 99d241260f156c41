//! The body budget bounds the gateway process's memory: 16 bodies of 7.9 MB arriving at
//! once raise its peak RSS by about three times the budget, not by their sum. The real
//! `infera-gateway` binary, its RSS read from `/proc`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{MODEL, start_sim};
use infera_proto::worker::EngineKind;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BUDGET: u64 = 16 << 20;

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `/proc/<pid>/status` field, in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn concurrent_large_bodies_raise_the_peak_rss_by_a_few_budgets_not_their_sum() {
    let w = start_sim(EngineKind::Vllm, 1.0).await;
    let dir = tempfile::tempdir().unwrap();
    let workers = dir.path().join("workers.json");
    let record = serde_json::json!([{"worker_id": w.addr.to_string(), "url": format!("http://{}", w.addr),
        "model_name": MODEL, "engine": "vllm"}]);
    std::fs::write(&workers, record.to_string()).unwrap();
    let port = infera_testkit::process::free_port().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_infera-gateway"))
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--discovery-backend", "static", "--static-workers"])
        .arg(&workers)
        .args([
            "--flow-control",
            "true",
            "--flow-body-bytes",
            &BUDGET.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let gw = Gateway(child);
    let pid = gw.0.id();
    let http = reqwest::Client::new();
    let base_url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = |http: reqwest::Client, url: String| async move {
        http.get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().as_u16() == 200)
    };
    while !ready(http.clone(), format!("{base_url}/ready")).await {
        assert!(Instant::now() < deadline, "the gateway never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = serde_json::json!({"model": MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": "word ".repeat(1_580_000)}]})
    .to_string();
    assert!(body.len() > 7_800_000);
    let before = status_kb(pid, "VmRSS");
    let sends = (0..16).map(|_| {
        let (http, url, body) = (
            http.clone(),
            format!("{base_url}/v1/chat/completions"),
            body.clone(),
        );
        async move {
            http.post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    let statuses = futures::future::join_all(sends).await;
    let peak = status_kb(pid, "VmHWM");
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert!(
        refused >= 8,
        "past 16 MiB, bodies are refused: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| [400, 429].contains(s)),
        "{statuses:?}"
    );
    let grew = (peak.saturating_sub(before)) * 1024;
    // 16 bodies of 7.9 MB held at once, parsed, would be about 400 MB.
    assert!(
        grew < 4 * BUDGET,
        "peak RSS grew {} MiB, past 4 x the {} MiB budget",
        grew >> 20,
        BUDGET >> 20
    );
}
