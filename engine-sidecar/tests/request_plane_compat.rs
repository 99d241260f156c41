//! The NATS request plane against the earlier system's side of it, not ours:
//! - the gateway is answered with the frames the earlier worker sent, byte for byte
//!   (`testdata/request_plane/earlier_frames.json`, recorded by running the earlier
//!   `nats_request.py` with `make_fixtures.py`), and publishes the envelope it read;
//! - the gateway serves through `earlier_worker.py`, a nats-py worker written from the
//!   earlier worker's side;
//! - the sidecar answers `earlier_client.py`, written from the earlier client's side,
//!   over plain NATS and through JetStream admission.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    args_of, launch_with, nats_gateway, normalized, post_json, sse_values, unique_prefix, wait_key,
};
use futures::StreamExt;
use infera_proto::discovery::build_worker_key;
use infera_proto::request_plane::build_worker_token;
use infera_testkit::process::{ServerProcess, free_port};
use serde_json::{Value, json};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/request_plane")
}

fn fixture() -> Value {
    serde_json::from_slice(&std::fs::read(testdata().join("earlier_frames.json")).unwrap()).unwrap()
}

fn python() -> PathBuf {
    infera_testkit::python_tools::python_with_requirements(&testdata().join("requirements.txt"))
        .unwrap()
}

/// A record of `worker_id` reached over NATS, put in etcd under `prefix` (no lease).
async fn register(prefix: &str, worker_id: &str, url: &str, engine: &str) {
    let record = json!({
        "worker_id": worker_id, "url": url, "model_name": "fixture-model", "engine": engine,
        "disagg_mode": "mixed", "disagg_meta": null, "kv_events_endpoint": null,
        "kv_block_size": null, "dp_rank": null, "dp_size": null, "request_transport": "nats",
    });
    let mut etcd = infera_testkit::etcd_client().await.unwrap();
    etcd.put(
        build_worker_key(prefix, worker_id),
        record.to_string(),
        None,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn the_gateway_reads_the_earlier_workers_frames_as_the_earlier_router_did() {
    let fixture = fixture();
    let nats = infera_testkit::nats_client().await.unwrap();
    // A worker nobody can reach over HTTP: only its NATS subject answers.
    let worker_id = format!("127.0.0.1:{}", free_port().unwrap());
    let prefix = unique_prefix("compat-frames");
    register(&prefix, &worker_id, "http://127.0.0.1:1", "atom").await;
    let mut requests = nats
        .subscribe(format!("infera.req.{}", build_worker_token(&worker_id)))
        .await
        .unwrap();
    infera_testkit::nats_round_trip(&nats).await.unwrap();
    let gw = nats_gateway(&prefix, &["--migration-limit", "1"], 1).await;
    // (scenario, status the client gets, whether it streams)
    for (scenario, want_status) in [
        ("unary", 200),
        ("stream", 200),
        ("error", 400),
        ("error_stream", 400),
    ] {
        let frames = fixture["scenarios"][scenario].as_array().unwrap();
        let earlier: Value = serde_json::from_str(frames[0]["payload"].as_str().unwrap()).unwrap();
        let client_body = json!({
            "model": "fixture-model",
            "prompt": earlier["body"]["prompt"],
            "stream": earlier["stream"],
        });
        let gw_addr = gw.addr;
        let sent = tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("http://{gw_addr}/v1/completions"))
                .json(&client_body)
                .send()
                .await
                .unwrap()
        });
        let request = tokio::time::timeout(Duration::from_secs(10), requests.next())
            .await
            .expect("the gateway published the request")
            .unwrap();
        // The envelope says what the earlier router's said.
        let ours: Value = serde_json::from_slice(&request.payload).unwrap();
        for key in ["path", "stream"] {
            assert_eq!(ours[key], earlier[key], "{scenario}: {key}");
        }
        assert_eq!(ours["body"]["prompt"], earlier["body"]["prompt"]);
        assert_eq!(
            ours.get("migratable").cloned().unwrap_or(json!(false)),
            earlier.get("migratable").cloned().unwrap_or(json!(false)),
            "{scenario}: migratable"
        );
        // The earlier worker's frames, replayed as it sent them (its empty trailer too).
        let inbox = request.reply.unwrap();
        let mut data = Vec::new();
        for frame in &frames[1..] {
            let payload = frame["payload"].as_str().unwrap().to_owned();
            match frame["headers"].as_object() {
                Some(h) => {
                    let mut headers = async_nats::HeaderMap::new();
                    for (k, v) in h {
                        headers.insert(k.as_str(), v.as_str().unwrap());
                    }
                    if h["rs-type"] == "data" {
                        data.extend_from_slice(payload.as_bytes());
                    }
                    nats.publish_with_headers(inbox.clone(), headers, payload.into())
                        .await
                        .unwrap();
                }
                None => nats.publish(inbox.clone(), payload.into()).await.unwrap(),
            }
        }
        let response = sent.await.unwrap();
        assert_eq!(response.status().as_u16(), want_status, "{scenario}");
        let body = response.bytes().await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&data),
            "{scenario}: the client reads the engine's bytes"
        );
    }
}

/// `earlier_worker.py` serving `worker_id` for the engine at `engine`; its stdout lines.
struct EarlierWorker {
    process: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl EarlierWorker {
    fn start(worker_id: &str, engine: &str, nats: &str) -> Self {
        let mut process = Command::new(python())
            .arg(testdata().join("earlier_worker.py"))
            .args(["--nats", nats, "--worker-id", worker_id, "--engine", engine])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = process.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let worker = Self { process, lines };
        assert_eq!(worker.next_line(Duration::from_secs(30)), "ready");
        worker
    }

    fn next_line(&self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .expect("a line from the earlier worker")
    }
}

impl Drop for EarlierWorker {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A simulated engine on its own (no sidecar).
fn engine() -> (ServerProcess, u16, tempfile::TempDir) {
    let port = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args = args_of(&[
        "fixture/model",
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
        "--engine",
        "vllm",
        "--speedup",
        "1",
    ]);
    let sim =
        ServerProcess::start(&common::sim_binary(), &args, &dir.path().join("sim.log")).unwrap();
    (sim, port, dir)
}

async fn wait_healthy(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the engine never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_gateway_serves_through_a_worker_written_from_the_earlier_side() {
    let nats_url = infera_testkit::nats_url().await.unwrap();
    let (_sim, port, _dir) = engine();
    wait_healthy(port).await;
    let worker_id = format!("127.0.0.1:{port}");
    let engine_url = format!("http://{worker_id}");
    let worker = EarlierWorker::start(&worker_id, &engine_url, &nats_url);
    let prefix = unique_prefix("compat-worker");
    // Its url leads nowhere: what is answered came over NATS.
    register(&prefix, &worker_id, "http://127.0.0.1:1", "vllm").await;
    let gw = nats_gateway(&prefix, &[], 1).await;
    let chat = json!({"model": "fixture-model", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]});
    let completion = json!({"model": "fixture-model", "max_tokens": 6, "prompt": "Say"});
    for (path, mut body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
    ] {
        for stream in [false, true] {
            body["stream"] = json!(stream);
            let (s_gw, via_gw) = post_json(&format!("http://{}{path}", gw.addr), &body).await;
            let (s_direct, direct) = post_json(&format!("{engine_url}{path}"), &body).await;
            assert_eq!((s_gw, s_direct), (200, 200), "{path} {body}: {via_gw}");
            let parse = |t: &str| {
                if stream {
                    Value::Array(sse_values(t))
                } else {
                    serde_json::from_str(t).unwrap()
                }
            };
            assert_eq!(
                normalized(parse(&via_gw)),
                normalized(parse(&direct)),
                "{path} {body}"
            );
        }
    }
    // A client that leaves cancels the request on the worker.
    let watcher = infera_testkit::nats_client().await.unwrap();
    let mut cancels = watcher
        .subscribe(format!("infera.cancel.{}", build_worker_token(&worker_id)))
        .await
        .unwrap();
    infera_testkit::nats_round_trip(&watcher).await.unwrap();
    let body =
        json!({"model": "fixture-model", "max_tokens": 5000, "prompt": "Once", "stream": true});
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", gw.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    let cancel = tokio::time::timeout(Duration::from_secs(5), cancels.next())
        .await
        .expect("the gateway published a cancel")
        .unwrap();
    let line = worker.next_line(Duration::from_secs(10));
    assert_eq!(
        line,
        format!("cancelled {}", String::from_utf8_lossy(&cancel.payload)),
        "the worker cancelled the request the gateway named"
    );
}

/// Runs `earlier_client.py` against `worker_id`; the frames it printed.
fn earlier_client(nats: &str, worker_id: &str, body: &Value, extra: &[&str]) -> Vec<Value> {
    let out = Command::new(python())
        .arg(testdata().join("earlier_client.py"))
        .args([
            "--nats",
            nats,
            "--worker-id",
            worker_id,
            "--path",
            "/v1/completions",
        ])
        .args(["--body", &body.to_string(), "--idle-timeout", "30"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Checks frames as the earlier client reads them: data frames (headers exactly
/// `rs-type: data`), then `done` with `rs-status`; the data joined.
fn joined_data(frames: &[Value], status: u64) -> String {
    let (last, data) = frames.split_last().unwrap();
    assert_eq!(last["type"], "done", "{frames:?}");
    assert_eq!(last["status"], status);
    assert_eq!(
        last["headers"],
        json!({"rs-type": "done", "rs-status": status.to_string()})
    );
    // Once any worker runs admission, the INFERA_REQUESTS stream stores every
    // `infera.req.>` message and acknowledges a plain request to its reply inbox; the
    // earlier client reads that acknowledgement as data (its bug, which the gateway
    // avoids). It is JetStream's, not the sidecar's: left out.
    let data: Vec<&Value> = data
        .iter()
        .filter(|f| {
            let ack = f["headers"] == json!({})
                && f["payload"]
                    .as_str()
                    .is_some_and(|p| p.starts_with(r#"{"stream":"INFERA_REQUESTS""#));
            !ack
        })
        .collect();
    assert!(!data.is_empty());
    data.iter()
        .map(|f| {
            assert_eq!(f["headers"], json!({"rs-type": "data"}), "{f}");
            f["payload"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test]
async fn the_sidecar_answers_a_client_written_from_the_earlier_side() {
    let nats = infera_testkit::nats_url().await.unwrap();
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    for extra in [&[][..], &["--nats-req-max-pending", "2"][..]] {
        let prefix = unique_prefix("compat-client");
        let mut flags = args_of(&["--request-transport", "nats", "--nats-server", &nats]);
        flags.extend(args_of(extra));
        let mut w = launch_with(&etcd, &prefix, "10", &flags).await;
        wait_key(&w.key, true, Duration::from_secs(60), &mut w.sidecar)
            .await
            .unwrap();
        let worker_id = format!("127.0.0.1:{}", w.port);
        let client_flags: &[&str] = if extra.is_empty() {
            &[]
        } else {
            &["--jetstream"]
        };
        let direct = |body: Value| {
            let url = format!("http://{worker_id}/v1/completions");
            async move { post_json(&url, &body).await }
        };

        let body = json!({"model": "fixture-model", "prompt": "Say", "max_tokens": 5});
        let frames = earlier_client(&nats, &worker_id, &body, client_flags);
        let answer: Value = serde_json::from_str(&joined_data(&frames, 200)).unwrap();
        let (_, want) = direct(body).await;
        assert_eq!(
            normalized(answer),
            normalized(serde_json::from_str(&want).unwrap())
        );

        let body =
            json!({"model": "fixture-model", "prompt": "Say", "max_tokens": 5, "stream": true});
        let mut stream_flags = vec!["--stream", "--migratable"];
        stream_flags.extend_from_slice(client_flags);
        let frames = earlier_client(&nats, &worker_id, &body, &stream_flags);
        let text = joined_data(&frames, 200);
        let (_, want) = direct(body).await;
        assert_eq!(
            normalized(Value::Array(sse_values(&text))),
            normalized(Value::Array(sse_values(&want)))
        );

        // An engine's refusal is its JSON and its status, not an error frame.
        let body = json!({"model": "fixture-model", "prompt": "Say", "max_tokens": 100_000_000});
        let frames = earlier_client(&nats, &worker_id, &body, client_flags);
        let error: Value = serde_json::from_str(&joined_data(&frames, 400)).unwrap();
        assert!(error["error"]["message"].is_string(), "{error}");
        w.sidecar.kill();
    }
}
