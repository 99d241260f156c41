//! Flow control against real simulated engines: requests wait in the gateway while the
//! worker is full, higher classes first; those that cannot meet their deadline get 429
//! with `Retry-After` before the engine sees them; a model with no worker waits for one;
//! bodies past the budget are refused; the engine's own queue holds every replica back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{chat, embedded, get_text, gw_url, record_for, start_sim_with};
use futures::StreamExt;
use infera_gateway::server::RunningGateway;
use infera_proto::worker::EngineKind;
use infera_sim::worker::RunningWorker;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A worker that runs one request at a time, each for a while.
async fn one_seat_worker() -> RunningWorker {
    start_sim_with(EngineKind::Vllm, 0.02, |c| {
        c.core.max_num_seqs = 1;
        c.default_max_tokens = 8;
    })
    .await
}

/// A one-seat worker behind a gateway letting one request wait on it, with a TTFT
/// deadline of `deadline_ms`.
async fn one_seat_gateway(deadline_ms: &str) -> (RunningWorker, RunningGateway) {
    let w = one_seat_worker().await;
    let flags = [
        "--flow-control=true",
        "--flow-max-waiting-per-worker",
        "1",
        "--flow-ttft-deadline-ms",
        deadline_ms,
    ];
    let gw = embedded(vec![record_for(w.addr, EngineKind::Vllm)], &flags).await;
    (w, gw)
}

fn stream_body(content: &str) -> serde_json::Value {
    let mut body = chat(content, 8);
    body["stream"] = true.into();
    body
}

/// Sends a streamed chat request; returns its status, headers, and when its first body
/// byte came (for a 200).
async fn send(
    http: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    content: &str,
) -> (u16, reqwest::header::HeaderMap, Option<Instant>, String) {
    let mut req = http.post(url).json(&stream_body(content));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let head = resp.headers().clone();
    let mut body = resp.bytes_stream();
    let mut first = None;
    let mut text = Vec::new();
    while let Some(chunk) = body.next().await {
        first.get_or_insert_with(Instant::now);
        text.extend_from_slice(&chunk.unwrap());
    }
    (
        status,
        head,
        first,
        String::from_utf8_lossy(&text).into_owned(),
    )
}

/// A request with a deadline of 8 s, sent in the background.
fn spawn_waiting(
    http: &reqwest::Client,
    url: &str,
) -> tokio::task::JoinHandle<(u16, reqwest::header::HeaderMap, Option<Instant>, String)> {
    let (http, url) = (http.clone(), url.to_owned());
    tokio::spawn(async move {
        send(
            &http,
            &url,
            &[("x-infera-ttft-deadline-ms", "8000")],
            "hello",
        )
        .await
    })
}

/// The largest queue the engine reported while `busy` held.
fn watch_engine_queue(w: &RunningWorker, busy: Arc<AtomicBool>) -> Arc<AtomicUsize> {
    let most = Arc::new(AtomicUsize::new(0));
    let (counters, seen) = (w.state.engine.counters.clone(), most.clone());
    tokio::spawn(async move {
        while busy.load(Ordering::SeqCst) {
            let waiting = counters.stats.lock().unwrap().waiting;
            seen.fetch_max(waiting, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    most
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_full_worker_holds_requests_in_the_gateway_and_sheds_those_past_their_deadline() {
    let (w, gw) = one_seat_gateway("1500").await;
    let http = reqwest::Client::new();
    let url = gw_url(&gw, "/v1/chat/completions");
    let busy = Arc::new(AtomicBool::new(true));
    let most_waiting = watch_engine_queue(&w, busy.clone());
    let prompts: Vec<String> = (0..16).map(|i| format!("request {i}")).collect();
    let sends = prompts.iter().map(|p| send(&http, &url, &[], p));
    let results = futures::future::join_all(sends).await;
    busy.store(false, Ordering::SeqCst);

    let ok = results.iter().filter(|r| r.0 == 200).count();
    let shed: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!(ok + shed.len(), 16, "only 200 and 429: {results:?}");
    assert!(ok >= 2, "the worker served some: {ok}");
    assert!(
        !shed.is_empty(),
        "16 requests of about 0.4 s each cannot all start within 1.5 s"
    );
    for (_, headers, _, body) in &shed {
        let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        let err: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(err["error"]["code"], "deadline", "{body}");
        assert_eq!(err["error"]["type"], "rate_limit_error", "{body}");
    }
    // The engine never queued more than the one request flow control let wait there.
    assert!(
        most_waiting.load(Ordering::SeqCst) <= 1,
        "engine queue reached {}",
        most_waiting.load(Ordering::SeqCst)
    );
    let finished = common::served(&w) as usize;
    assert_eq!(finished, ok, "a shed request never reached the engine");
    let text = get_text(&http, &gw, "/metrics").await;
    let counted = metric(
        &text,
        "infera_flow_shed_total{class=\"standard\",reason=\"deadline\"}",
    );
    assert_eq!(counted as usize, shed.len(), "{text}");
}

#[tokio::test]
async fn higher_classes_go_first_and_batch_waits() {
    let (_w, gw) = one_seat_gateway("60000").await;
    let http = reqwest::Client::new();
    let url = gw_url(&gw, "/v1/chat/completions");
    // The worker's one seat and its one waiting place taken.
    let holders: Vec<_> = (0..2)
        .map(|i| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move { send(&http, &url, &[], &format!("holder {i}")).await })
        })
        .collect();
    let queued = |text: &str| metric(text, "infera_flow_queued_requests{");
    let wait_for_queued = |n: f64| {
        let (http, gw) = (&http, &gw);
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let text = get_text(http, gw, "/metrics").await;
                if queued(&text) >= n {
                    return;
                }
                assert!(Instant::now() < deadline, "{n} queued never showed: {text}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let mut queued_ones = Vec::new();
    for (i, class) in ["batch", "batch", "batch", "interactive"]
        .into_iter()
        .enumerate()
    {
        let (http, url) = (http.clone(), url.clone());
        queued_ones.push(tokio::spawn(async move {
            let r = send(
                &http,
                &url,
                &[("x-infera-priority", class)],
                &format!("{class} {i}"),
            )
            .await;
            (class, r)
        }));
        wait_for_queued(i as f64 + 1.0).await;
    }
    for h in holders {
        assert_eq!(h.await.unwrap().0, 200);
    }
    let mut done = Vec::new();
    for q in queued_ones {
        let (class, (status, _, first, _)) = q.await.unwrap();
        assert_eq!(status, 200, "{class}");
        done.push((first.unwrap(), class));
    }
    done.sort();
    assert_eq!(
        done[0].1, "interactive",
        "queued last, sent first: {done:?}"
    );
    let bad = reqwest::Client::new()
        .post(&url)
        .header("x-infera-priority", "urgent")
        .json(&stream_body("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let err: serde_json::Value = bad.json().await.unwrap();
    assert_eq!(err["error"]["param"], "x-infera-priority");
}

#[tokio::test]
async fn a_model_with_no_worker_waits_for_one_then_gets_503() {
    let w = one_seat_worker().await;
    let gw = embedded(Vec::new(), &["--flow-control=true"]).await;
    let http = reqwest::Client::new();
    let url = gw_url(&gw, "/v1/chat/completions");
    let waiting = spawn_waiting(&http, &url);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "it waits for a worker");
    gw.gateway
        .registry
        .upsert(record_for(w.addr, EngineKind::Vllm));
    let (status, _, _, body) = waiting.await.unwrap();
    assert_eq!(status, 200, "served once the worker came: {body}");

    gw.gateway.registry.remove(&w.addr.to_string());
    let started = Instant::now();
    let (status, headers, _, body) = send(
        &http,
        &url,
        &[("x-infera-ttft-deadline-ms", "400")],
        "again",
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "it waited its deadline"
    );
    assert!(headers.contains_key("retry-after"));
}

#[tokio::test]
async fn a_request_no_worker_could_take_waits_for_one_that_can() {
    // The only registered worker is gone (nothing listens on its port).
    let gone: std::net::SocketAddr = format!(
        "127.0.0.1:{}",
        infera_testkit::process::free_port().unwrap()
    )
    .parse()
    .unwrap();
    let gw = embedded(
        vec![record_for(gone, EngineKind::Vllm)],
        &["--flow-control=true"],
    )
    .await;
    let http = reqwest::Client::new();
    let url = gw_url(&gw, "/v1/chat/completions");
    let waiting = spawn_waiting(&http, &url);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "it waits instead of failing");
    let w = one_seat_worker().await;
    gw.gateway
        .registry
        .upsert(record_for(w.addr, EngineKind::Vllm));
    let (status, _, _, body) = waiting.await.unwrap();
    assert_eq!(status, 200, "served by the worker that came: {body}");
    assert_eq!(common::served(&w), 1);
}

#[tokio::test]
async fn bodies_past_the_budget_are_refused_as_they_arrive() {
    let w = one_seat_worker().await;
    let flags = ["--flow-control=true", "--flow-body-bytes", "1000000"];
    let gw = embedded(vec![record_for(w.addr, EngineKind::Vllm)], &flags).await;
    let http = reqwest::Client::new();
    let url = gw_url(&gw, "/v1/chat/completions");
    let big = "x".repeat(2_000_000);
    let resp = http.post(&url).json(&chat(&big, 4)).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "body_budget");
    // Sent in chunks without a length: refused once the chunks pass the budget.
    let chunks = futures::stream::iter(
        (0..40).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 50_000]))),
    );
    let resp = http
        .post(&url)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    // The budget was given back: a small request is served.
    let (status, _, _, _) = send(&http, &url, &[], "small").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_engines_own_queue_holds_back_requests_from_every_replica() {
    let w = one_seat_worker().await;
    // Another client (a second replica, say) loads the engine directly.
    let http = reqwest::Client::new();
    let direct = format!("http://{}/v1/chat/completions", w.addr);
    let others: Vec<_> = (0..4)
        .map(|i| {
            let (http, direct) = (http.clone(), direct.clone());
            tokio::spawn(async move { send(&http, &direct, &[], &format!("other {i}")).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while w.state.engine.counters.stats.lock().unwrap().waiting < 3 {
        assert!(Instant::now() < deadline, "the engine never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sent_after_waiting = |scrape: &'static str| {
        let (http, w) = (&http, &w);
        async move {
            let flags = [
                "--flow-control=true",
                "--flow-max-waiting-per-worker",
                "2",
                "--flow-ttft-deadline-ms",
                "30000",
                "--flow-engine-scrape-ms",
                scrape,
            ];
            let gw = embedded(vec![record_for(w.addr, EngineKind::Vllm)], &flags).await;
            // Let a read of the engine land (when reads are on).
            tokio::time::sleep(Duration::from_millis(150)).await;
            let (status, _, _, _) =
                send(http, &gw_url(&gw, "/v1/chat/completions"), &[], "mine").await;
            assert_eq!(status, 200);
            let text = get_text(http, &gw, "/metrics").await;
            metric(
                &text,
                "infera_flow_wait_seconds_count{class=\"standard\",outcome=\"sent\"}",
            )
        }
    };
    // Reads off: this gateway sees none of the others' requests and sends at once.
    assert_eq!(sent_after_waiting("0").await, 0.0);
    while w.state.engine.counters.stats.lock().unwrap().waiting < 3 {
        let (http, direct) = (http.clone(), direct.clone());
        tokio::spawn(async move { send(&http, &direct, &[], "more").await });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Reads on: it waits in the gateway until the engine's queue is short.
    assert_eq!(sent_after_waiting("50").await, 1.0);
    for o in others {
        assert_eq!(o.await.unwrap().0, 200);
    }
}
