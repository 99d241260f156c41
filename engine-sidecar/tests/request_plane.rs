//! The NATS request plane and mid-stream migration, end to end: sidecars launching
//! `infera-sim` and serving their NATS subjects, registered in real etcd, gateways
//! sending over real NATS (JetStream for admission) or HTTP. Every request shape over
//! NATS answers what HTTP answers; a client that goes away cancels the engine's
//! generation; idle and total timeouts answer 504; admission answers 429 at the limit;
//! and a stream whose engine or sidecar is killed, or whose worker drains, continues on
//! another worker and reads exactly as the same request served without a fault.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    Launched, args_of, gateway_with, launch_at_speed, nats_gateway, normalized, sse_values,
    unique_prefix, wait_key,
};
use futures::StreamExt;
use infera_proto::request_plane::build_worker_token;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const MODEL: &str = "fixture-model";

fn nats_flags(nats: &str, extra: &[&str]) -> Vec<String> {
    let mut flags = args_of(&["--request-transport", "nats", "--nats-server", nats]);
    flags.extend(args_of(extra));
    flags
}

/// `n` sidecar workers under a fresh prefix, registered; with `flags`.
async fn fleet(name: &str, n: usize, speedup: &str, flags: &[String]) -> (String, Vec<Launched>) {
    fleet_leased(name, n, speedup, "10", flags).await
}

/// [`fleet`] with records under leases of `ttl` seconds.
async fn fleet_leased(
    name: &str,
    n: usize,
    speedup: &str,
    ttl: &str,
    flags: &[String],
) -> (String, Vec<Launched>) {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let prefix = unique_prefix(name);
    let mut workers = Vec::new();
    for _ in 0..n {
        let mut w = launch_at_speed(&etcd, &prefix, ttl, speedup, flags).await;
        let record = wait_key(&w.key, true, Duration::from_secs(60), &mut w.sidecar)
            .await
            .unwrap();
        let nats = flags.iter().any(|f| f == "nats");
        assert_eq!(
            record.request_transport == infera_proto::worker::RequestTransport::Nats,
            nats,
            "the record names the transport"
        );
        workers.push(w);
    }
    (prefix, workers)
}

/// A whole answer: its status and its JSON, or its events.
async fn answer(addr: std::net::SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let sse = r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap_or("").starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let value = if sse {
        Value::Array(sse_values(&text))
    } else {
        // Anthropic's stream is named events: keep their data lines.
        serde_json::from_str(&text).unwrap_or_else(|_| match sse_values(&text) {
            e if e.is_empty() => Value::String(text.clone()),
            e => Value::Array(e),
        })
    };
    (status, normalized(value))
}

/// A series' value in a Prometheus exposition (0 when absent).
fn series(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name_and_labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn metrics_of(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

async fn running(port: u16) -> f64 {
    let text = metrics_of(&format!("http://127.0.0.1:{port}/metrics")).await;
    series(&text, "vllm:num_requests_running{")
}

async fn set_faults(port: u16, faults: Value) {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/sim/faults"))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

fn shapes() -> Vec<(&'static str, Value)> {
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "Tell me about foxes"}], "max_tokens": 8});
    let completion = json!({"model": MODEL, "prompt": "The lazy dog", "max_tokens": 8});
    let stream = |mut v: Value| {
        v["stream"] = json!(true);
        v["stream_options"] = json!({"include_usage": true});
        v
    };
    let mut anthropic_stream = json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]});
    let anthropic = anthropic_stream.clone();
    anthropic_stream["stream"] = json!(true);
    vec![
        ("/v1/chat/completions", chat.clone()),
        ("/v1/chat/completions", stream(chat)),
        ("/v1/completions", completion.clone()),
        ("/v1/completions", stream(completion)),
        ("/v1/messages", anthropic),
        ("/v1/messages", anthropic_stream),
    ]
}

#[tokio::test]
async fn every_request_shape_over_nats_answers_what_http_answers() {
    let nats = infera_testkit::nats_url().await.unwrap();
    let (prefix, workers) = fleet("plane-shapes", 1, "20", &nats_flags(&nats, &[])).await;
    let over_nats = nats_gateway(&prefix, &[], 1).await;
    let over_http = gateway_with(&prefix, &[], 1).await;
    // Every request published to the worker's subject, collected.
    let client = infera_testkit::nats_client().await.unwrap();
    let token = build_worker_token(&format!("127.0.0.1:{}", workers[0].port));
    let mut seen = client
        .subscribe(format!("infera.req.{token}"))
        .await
        .unwrap();
    infera_testkit::nats_round_trip(&client).await.unwrap();
    let shapes = shapes();
    for (path, body) in &shapes {
        let (s_nats, a_nats) = answer(over_nats.addr, path, body).await;
        let (s_http, a_http) = answer(over_http.addr, path, body).await;
        assert_eq!((s_nats, s_http), (200, 200), "{path} {body}\n{a_nats}");
        assert_eq!(a_nats, a_http, "{path} {body}");
    }
    // One envelope per request to the NATS gateway, in order; none from the HTTP one.
    let expected: Vec<(Value, Value)> = shapes
        .iter()
        .map(|(path, body)| {
            let engine_path = if *path == "/v1/messages" {
                "/v1/chat/completions"
            } else {
                path
            };
            (
                json!(engine_path),
                body.get("stream").cloned().unwrap_or(json!(false)),
            )
        })
        .collect();
    let mut published = Vec::new();
    while published.len() < expected.len() {
        let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(10), seen.next()).await
        else {
            break;
        };
        let envelope: Value = serde_json::from_slice(&message.payload).unwrap();
        assert!(
            envelope["headers"]["x-infera-request-id"].is_string(),
            "{envelope}"
        );
        published.push((envelope["path"].clone(), envelope["stream"].clone()));
    }
    assert_eq!(published, expected);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), seen.next())
            .await
            .is_err()
    );
    // An engine's own error comes back with its status.
    let (status, body) = answer(
        over_nats.addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x", "max_tokens": 1_000_000}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test]
async fn a_client_that_leaves_cancels_the_generation_and_timeouts_answer_504() {
    let nats = infera_testkit::nats_url().await.unwrap();
    let (prefix, workers) = fleet("plane-cancel", 1, "1", &nats_flags(&nats, &[])).await;
    let port = workers[0].port;
    let gw = nats_gateway(&prefix, &[], 1).await;
    let client = infera_testkit::nats_client().await.unwrap();
    let token = build_worker_token(&format!("127.0.0.1:{port}"));
    let mut cancels = client
        .subscribe(format!("infera.cancel.{token}"))
        .await
        .unwrap();
    infera_testkit::nats_round_trip(&client).await.unwrap();

    // A long stream, left after its first events.
    let body = json!({"model": MODEL, "prompt": "Once", "max_tokens": 5000, "stream": true});
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", gw.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    stream.next().await.unwrap().unwrap();
    assert_eq!(running(port).await, 1.0);
    drop(stream);
    let cancel = tokio::time::timeout(Duration::from_secs(5), cancels.next())
        .await
        .expect("a cancel was published")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&cancel.payload).starts_with("_INBOX."),
        "the cancel names the request's inbox"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(port).await > 0.0 {
        assert!(Instant::now() < deadline, "the engine kept generating");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Idle: a hung engine.
    let idle = nats_gateway(&prefix, &["--nats-req-idle-timeout", "1"], 1).await;
    set_faults(port, json!({"hang": true})).await;
    let started = Instant::now();
    let (status, body) = answer(
        idle.addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert!(body.to_string().contains("idle timeout"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));
    set_faults(port, json!({})).await;

    // Total: a generation longer than the cap.
    let total = nats_gateway(
        &prefix,
        &[
            "--nats-req-idle-timeout",
            "0",
            "--nats-req-max-duration",
            "1",
        ],
        1,
    )
    .await;
    let started = Instant::now();
    let (status, body) = answer(
        total.addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x", "max_tokens": 5000}),
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert!(
        body.to_string().contains("exceeded total timeout 1s"),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn admission_answers_429_when_every_worker_is_at_its_backlog_limit() {
    let nats = infera_testkit::nats_url().await.unwrap();
    let flags = nats_flags(&nats, &["--nats-req-max-pending", "1"]);
    let (prefix, workers) = fleet("plane-admission", 1, "1", &flags).await;
    let gw = nats_gateway(&prefix, &["--nats-req-max-pending", "1"], 1).await;
    let body = json!({"model": MODEL, "prompt": "Once", "max_tokens": 5000, "stream": true});
    let held = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", gw.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    let mut held = held.bytes_stream();
    held.next().await.unwrap().unwrap();
    // The worker's consumer holds it, unacknowledged, until it is answered.
    let js = async_nats::jetstream::new(infera_testkit::nats_client().await.unwrap());
    let durable = build_worker_token(&format!("127.0.0.1:{}", workers[0].port));
    let stream = js.get_stream("INFERA_REQUESTS").await.unwrap();
    assert_eq!(
        stream
            .consumer_info(&durable)
            .await
            .unwrap()
            .num_ack_pending,
        1
    );
    // The gateway reads a backlog at most every 0.2 s: past that, it reads this one.
    tokio::time::sleep(Duration::from_secs_f64(
        infera_proto::request_plane::PENDING_CACHE_S + 0.1,
    ))
    .await;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", gw.addr))
        .json(&json!({"model": MODEL, "prompt": "x", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let text = r.text().await.unwrap();
    assert!(text.contains("backlog over limit"), "{text}");
    drop(held);
}

/// How a test takes the serving worker away mid-stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL to the engine process (the sidecar stays).
    EngineKilled,
    /// The engine process exits by itself (the simulator's `exit_after_tokens`).
    EngineExits,
    /// SIGKILL to the sidecar (its engine dies with it).
    SidecarKilled,
    /// SIGTERM to the sidecar: it drains.
    Drained,
}

/// Reads an SSE response to its end, calling `at` once after `after` events; the body
/// and the longest wait for a chunk after `at`.
async fn read_stream(
    r: reqwest::Response,
    after: usize,
    mut at: impl FnMut() -> futures::future::BoxFuture<'static, ()>,
) -> (String, Duration) {
    let mut body = String::new();
    let mut stream = r.bytes_stream();
    let mut fired: Option<Instant> = None;
    let mut stall = Duration::ZERO;
    let read = async {
        while let Some(chunk) = stream.next().await {
            body.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if let Some(last) = fired {
                stall = stall.max(last.elapsed());
                fired = Some(Instant::now());
            } else if sse_values(&body).len() >= after {
                at().await;
                fired = Some(Instant::now());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the stream ended");
    (body, stall)
}

/// The worker whose engine runs a request (by its engine's port).
async fn serving(ports: &[u16]) -> usize {
    for (i, port) in ports.iter().enumerate() {
        if running(*port).await > 0.0 {
            return i;
        }
    }
    panic!("no worker runs the request")
}

async fn migrated_stream_reads_as_unfaulted(nats_transport: bool, fault: Fault) {
    let nats = infera_testkit::nats_url().await.unwrap();
    let flags = if nats_transport {
        nats_flags(&nats, &[])
    } else {
        Vec::new()
    };
    // Records under a 10-minute lease: a vanished worker is noticed by other means.
    let (prefix, mut workers) = fleet_leased("plane-migrate", 2, "1", "600", &flags).await;
    let gw = nats_gateway(&prefix, &["--migration-limit", "2"], 2).await;
    let (tokens, at) = if fault == Fault::EngineExits {
        (30, 20)
    } else {
        (60, 5)
    };
    let body = json!({
        "model": MODEL, "stream": true, "max_tokens": tokens,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Tell me a long story about a quick fox"}],
    });
    let (_, unfaulted) = answer(gw.addr, "/v1/chat/completions", &body).await;
    assert_eq!(
        unfaulted.as_array().unwrap().len(),
        tokens + 2,
        "{unfaulted}"
    );

    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let pids: Vec<u32> = workers.iter().map(|w| w.sidecar.pid()).collect();
    let ports: Vec<u16> = workers.iter().map(|w| w.port).collect();
    if fault == Fault::EngineExits {
        // Armed on the engine running the stream alone, once it runs: a move made for
        // another reason first (a health check late on a loaded machine) must not land
        // on an engine set to exit too, with nowhere left to go.
        let i = serving(&ports).await;
        set_faults(ports[i], json!({"exit_after_tokens": at})).await;
    }
    let (body_text, stall) = read_stream(r, at, || {
        let (pids, ports) = (pids.clone(), ports.clone());
        Box::pin(async move {
            if fault == Fault::EngineExits {
                return;
            }
            let i = serving(&ports).await;
            if fault == Fault::EngineKilled {
                let engine = common::engine_pid(pids[i]).expect("the sidecar's engine");
                infera_testkit::process::signal(engine, "-KILL").unwrap();
                return;
            }
            let signal = if fault == Fault::SidecarKilled {
                "-KILL"
            } else {
                "-TERM"
            };
            infera_testkit::process::signal(pids[i], signal).unwrap();
        })
    })
    .await;
    let faulted = normalized(Value::Array(sse_values(&body_text)));
    let (got, want) = (faulted.as_array().unwrap(), unfaulted.as_array().unwrap());
    if let Some(i) = (0..got.len().max(want.len())).find(|i| got.get(*i) != want.get(*i)) {
        let metrics = metrics_of(&format!("http://{}/metrics", gw.addr)).await;
        let migrations: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("infera_migrations"))
            .collect();
        panic!(
            "nats={nats_transport} {fault:?}: event {i} differs:\n got {:?}\nwant {:?}\n{body_text}\n{migrations:?}",
            got.get(i),
            want.get(i)
        );
    }
    let metrics = metrics_of(&format!("http://{}/metrics", gw.addr)).await;
    let moved = series(
        &metrics,
        "infera_migrations_total{reason=\"stream_broken\"}",
    ) + series(
        &metrics,
        "infera_migrations_total{reason=\"worker_draining\"}",
    );
    let draining = series(
        &metrics,
        "infera_migrations_total{reason=\"worker_draining\"}",
    );
    match (fault, nats_transport) {
        // Over HTTP a draining engine finishes what it runs, and so does one whose
        // sidecar died (its death signal is SIGTERM): nothing moves.
        (Fault::Drained | Fault::SidecarKilled, false) => assert_eq!(moved, 0.0, "{metrics}"),
        (Fault::Drained, true) => assert_eq!(draining, 1.0, "{metrics}"),
        _ => assert_eq!(moved, 1.0, "{metrics}"),
    }
    if (fault, nats_transport) == (Fault::SidecarKilled, true) {
        // Its record outlived it: the presence probe, not the lease, moved the stream,
        // within the probe's bound (a second of silence, then a probe a second).
        let mut etcd = infera_testkit::etcd_client().await.unwrap();
        let mut present = 0;
        for w in &workers {
            present += etcd.get(w.key.as_str(), None).await.unwrap().kvs().len();
        }
        assert_eq!(present, 2, "both records stay under their 10-minute leases");
        assert!(
            stall < Duration::from_secs(4),
            "the client waited {stall:?}"
        );
    }
    for w in &mut workers {
        w.sidecar.kill();
    }
}

#[tokio::test]
async fn a_killed_engine_migrates_over_http() {
    migrated_stream_reads_as_unfaulted(false, Fault::EngineKilled).await;
}

#[tokio::test]
async fn a_killed_engine_migrates_over_nats() {
    migrated_stream_reads_as_unfaulted(true, Fault::EngineKilled).await;
}

#[tokio::test]
async fn an_engine_that_exits_mid_stream_migrates_over_nats() {
    migrated_stream_reads_as_unfaulted(true, Fault::EngineExits).await;
}

#[tokio::test]
async fn a_killed_sidecars_engine_finishes_its_stream_over_http() {
    migrated_stream_reads_as_unfaulted(false, Fault::SidecarKilled).await;
}

#[tokio::test]
async fn a_killed_sidecar_migrates_over_nats() {
    migrated_stream_reads_as_unfaulted(true, Fault::SidecarKilled).await;
}

#[tokio::test]
async fn a_draining_worker_finishes_over_http_and_hands_back_over_nats() {
    migrated_stream_reads_as_unfaulted(false, Fault::Drained).await;
    migrated_stream_reads_as_unfaulted(true, Fault::Drained).await;
}

#[tokio::test]
async fn a_stream_that_cannot_move_ends_with_an_error_event() {
    let nats = infera_testkit::nats_url().await.unwrap();
    let (prefix, workers) = fleet("plane-poisoned", 2, "20", &nats_flags(&nats, &[])).await;
    let gw = nats_gateway(&prefix, &["--migration-limit", "2"], 2).await;
    for w in &workers {
        set_faults(w.port, json!({"fail_after_tokens": 3})).await;
    }
    // A fixed seed asks for reproducible output: it is not carried elsewhere.
    let body = json!({"model": MODEL, "prompt": "x", "max_tokens": 20, "stream": true, "seed": 7});
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", gw.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    let (text, _) = read_stream(r, usize::MAX, || Box::pin(async {})).await;
    let all = sse_values(&text);
    assert_eq!(all.len(), 4, "three tokens and the error:\n{text}");
    assert!(
        all[3]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("broke the stream"),
        "{text}"
    );
}
