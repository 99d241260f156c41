//! The endpoint picker behind a real Envoy 1.40 (ext_proc filter, `override_host` pool
//! cluster, GAIE's configuration) on loopback, in front of simulated engines; and,
//! for what plain Envoy does not send (the subset hint), through a Rust ext_proc client.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::ext_proc::{exchange, header, set_header};
use common::*;
use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpHeaders, ProcessingRequest};
use envoy_types::pb::google::protobuf::value::Kind;
use infera_gateway::server::RunningGateway;
use infera_proto::worker::{EngineKind, WorkerRecord};
use infera_sim::worker::RunningWorker;
use infera_testkit::envoy::Envoy;
use infera_testkit::process::{ServerProcess, free_port};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// `lb_endpoints` entries for loopback ports.
fn endpoints(ports: impl Iterator<Item = u16>) -> String {
    ports
        .map(|p| {
            format!(
                "        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {p} }} }} }}"
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Envoy's bootstrap for pickers on `epp_ports` and these workers, listening on `ports`
/// (full duplex, buffered).
fn bootstrap(
    epp_ports: &[u16],
    tls: bool,
    workers: &[&RunningWorker],
    ports: (u16, u16, u16),
) -> String {
    let epp_tls = if tls {
        "    transport_socket:\n      name: envoy.transport_sockets.tls\n      typed_config:\n        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n        common_tls_context: { alpn_protocols: [\"h2\"], validation_context: {} }"
    } else {
        ""
    };
    include_str!("../../testenv/envoy/gaie.yaml")
        .replace("{duplex_port}", &ports.0.to_string())
        .replace("{buffered_port}", &ports.1.to_string())
        .replace("{plain_port}", &free_port().unwrap().to_string())
        .replace("{streamed_port}", &ports.2.to_string())
        .replace("{epp_endpoints}", &endpoints(epp_ports.iter().copied()))
        .replace("{epp_tls}", epp_tls)
        .replace(
            "{endpoints}",
            &endpoints(workers.iter().map(|w| w.addr.port())),
        )
}

/// A picker (kv-aware, router-approximate prefixes) over `workers`, with `flags`.
async fn picker(workers: &[&RunningWorker], flags: &[&str]) -> RunningGateway {
    let records: Vec<WorkerRecord> = workers
        .iter()
        .map(|w| record_for(w.addr, EngineKind::Vllm))
        .collect();
    let mut args = vec![
        "--host",
        "127.0.0.1",
        "--router-policy",
        "kv-aware",
        "--kv-overlap-weight",
        "2",
        "--epp-port",
        "0",
        "--epp-health-port",
        "0",
        "--health-check-interval-s",
        "0.2",
        "--health-check-failures",
        "1",
    ];
    args.extend_from_slice(flags);
    embedded(records, &args).await
}

struct Front {
    envoy: Envoy,
    duplex: String,
    buffered: String,
    streamed: String,
}

async fn envoy_for(gw: &RunningGateway, tls: bool, workers: &[&RunningWorker]) -> Front {
    let epp = gw.epp.expect("the picker runs").ext_proc.port();
    envoy_for_ports(&[epp], tls, workers).await
}

/// Envoy in front of the pickers on `epp_ports`.
async fn envoy_for_ports(epp_ports: &[u16], tls: bool, workers: &[&RunningWorker]) -> Front {
    let ports = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let envoy = Envoy::start(&bootstrap(epp_ports, tls, workers, ports))
        .await
        .unwrap();
    // The picker's cluster takes traffic once its gRPC health check has passed.
    let deadline = Instant::now() + Duration::from_secs(15);
    while envoy.stat("cluster.epp.membership_healthy").await < epp_ports.len() as u64 {
        assert!(
            Instant::now() < deadline,
            "Envoy never saw the picker healthy:\n{}",
            envoy.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Front {
        duplex: format!("http://127.0.0.1:{}", ports.0),
        buffered: format!("http://127.0.0.1:{}", ports.1),
        streamed: format!("http://127.0.0.1:{}", ports.2),
        envoy,
    }
}

/// Waits until the gRPC health service on `port` says `service` is serving; panics with
/// the tail of `process`'s log after `within`.
async fn wait_serving(port: u16, service: &str, process: &ServerProcess, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let ready = async {
            let channel =
                tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
                    .ok()?
                    .connect()
                    .await
                    .ok()?;
            let status = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .ok()?;
            (status.into_inner().status == ServingStatus::Serving as i32).then_some(())
        };
        if ready.await.is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{service} was never served on {port}:\n{}",
            process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn prefixed(prefix: &str, question: &str) -> Value {
    json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": prefix}, {"role": "user", "content": question}]})
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> reqwest::Response {
    http.post(url).json(body).send().await.unwrap()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Requests in flight on any worker, as the picker counts them.
async fn inflight(http: &reqwest::Client, gw: &RunningGateway) -> u64 {
    let workers = get_json(http, gw, "/v1/workers").await;
    workers["workers"]
        .as_array()
        .map(|ws| ws.iter().filter_map(|w| w["inflight"].as_u64()).sum())
        .unwrap_or(0)
}

#[tokio::test]
async fn chat_completions_and_streams_go_through_envoy_and_shared_prefixes_land_where_cached() {
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    let gw = picker(&[&a, &b], &[]).await;
    let front = envoy_for(&gw, true, &[&a, &b]).await;
    let http = reqwest::Client::new();
    let chat_url = format!("{}/v1/chat/completions", front.duplex);

    // Completions, chat, a stream and a GET, each answered by a worker through Envoy.
    let r = post(
        &http,
        &format!("{}/v1/completions", front.duplex),
        &json!({"model": MODEL, "prompt": "hello", "max_tokens": 3}),
    )
    .await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r: Value = r.json().await.unwrap();
    assert_eq!(r["object"], "text_completion");
    let r = post(&http, &chat_url, &chat("hi", 3)).await;
    assert_eq!(r.status(), 200);
    let stream = post(
        &http,
        &chat_url,
        &json!({"model": MODEL, "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": "stream"}]}),
    )
    .await;
    assert_eq!(stream.status(), 200);
    assert!(
        stream.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = stream.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let models: Value = http
        .get(format!("{}/v1/models", front.duplex))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    // The buffered listener routes the same way.
    let r = post(
        &http,
        &format!("{}/v1/chat/completions", front.buffered),
        &chat("buffered", 2),
    )
    .await;
    assert_eq!(r.status(), 200);

    // Follow-ups sharing a long prefix land on the worker that cached it.
    let prefix = "envoy: you are a meticulous assistant. ".repeat(12);
    let before = (served(&a), served(&b));
    let first: Value = post(&http, &chat_url, &prefixed(&prefix, "first?"))
        .await
        .json()
        .await
        .unwrap();
    assert!(
        first["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            <= 16
    );
    let holder = if served(&a) > before.0 { &a } else { &b };
    let held_before = served(holder);
    for i in 0..6 {
        let r: Value = post(
            &http,
            &chat_url,
            &prefixed(&prefix, &format!("question {i}?")),
        )
        .await
        .json()
        .await
        .unwrap();
        let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached >= prefix.len() as u64 - 16,
            "request {i} missed the cache ({cached} cached)"
        );
    }
    assert_eq!(
        served(holder),
        held_before + 6,
        "every follow-up went to the worker holding the prefix"
    );

    // Each exchange's in-flight count ends with its stream.
    let deadline = Instant::now() + Duration::from_secs(5);
    while inflight(&http, &gw).await != 0 {
        assert!(
            Instant::now() < deadline,
            "in-flight counts never went back to 0"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = get_text(&http, &gw, "/metrics").await;
    assert!(
        metric(&m, "infera_epp_exchanges_total{result=\"picked\"}") >= 12.0,
        "{m}"
    );
    assert_eq!(
        front
            .envoy
            .stat("duplex.ext_proc.spurious_msgs_received")
            .await,
        0
    );
}

#[tokio::test]
async fn a_killed_worker_stops_being_picked_and_no_request_fails() {
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    let gw = picker(&[&a, &b], &[]).await;
    let front = envoy_for(&gw, true, &[&a, &b]).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", front.duplex);
    let dead = a.addr.to_string();
    drop(a);
    // At once: a pick of the dead worker lists the live one after it, and Envoy goes
    // down the list on the connect failure.
    for i in 0..10 {
        let r = post(&http, &url, &chat(&format!("after the kill {i}"), 2)).await;
        assert_eq!(r.status(), 200, "request {i}: {:?}", r.text().await);
    }
    // Once the health checks (and the failures Envoy reported) have taken it out, it is
    // not picked at all.
    let picks = |m: &str| {
        metric(
            m,
            &format!("infera_router_picks_total{{role=\"mixed\",worker_id=\"{dead}\"}}"),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let workers = get_json(&http, &gw, "/v1/workers").await;
        let failing = workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["worker_id"] == dead.as_str() && w["health"] == "failing");
        if failing {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead worker was never marked: {workers}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = picks(&get_text(&http, &gw, "/metrics").await);
    let served_before = served(&b);
    for i in 0..10 {
        let r = post(&http, &url, &chat(&format!("later {i}"), 2)).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(picks(&get_text(&http, &gw, "/metrics").await), before);
    assert_eq!(served(&b), served_before + 10);
}

/// A picker run as its own process (the `infera-gateway` binary) over these workers.
struct PickerProcess {
    process: ServerProcess,
    epp_port: u16,
    _dir: tempfile::TempDir,
}

impl PickerProcess {
    async fn start(workers: &[&RunningWorker], flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("workers.json");
        let records: Vec<Value> = workers
            .iter()
            .map(|w| serde_json::from_str(&record_for(w.addr, EngineKind::Vllm).to_json()).unwrap())
            .collect();
        std::fs::write(&file, serde_json::to_string(&records).unwrap()).unwrap();
        let (port, epp_port, health_port) = (
            free_port().unwrap(),
            free_port().unwrap(),
            free_port().unwrap(),
        );
        let mut args: Vec<String> = [
            "--host",
            "127.0.0.1",
            "--discovery-backend",
            "static",
            "--router-policy",
            "kv-aware",
            "--health-check-interval-s",
            "0.5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(["--static-workers".into(), file.display().to_string()]);
        args.extend([
            "--port".into(),
            port.to_string(),
            "--epp-port".into(),
            epp_port.to_string(),
        ]);
        args.extend(["--epp-health-port".into(), health_port.to_string()]);
        args.extend(flags.iter().map(|s| s.to_string()));
        let process = ServerProcess::start(
            std::path::Path::new(env!("CARGO_BIN_EXE_infera-gateway")),
            &args,
            &dir.path().join("picker.log"),
        )
        .unwrap();
        wait_serving(health_port, "readiness", &process, Duration::from_secs(20)).await;
        Self {
            process,
            epp_port,
            _dir: dir,
        }
    }
}

#[tokio::test]
async fn without_the_picker_fail_close_refuses_at_once_and_fail_open_serves() {
    let w = start_sim(EngineKind::Vllm, 50.0).await;
    let mut epp = PickerProcess::start(&[&w], &[]).await;
    let front = envoy_for_ports(&[epp.epp_port], true, &[&w]).await;
    let http = reqwest::Client::new();
    let body = chat("before", 2);
    let duplex = format!("{}/v1/chat/completions", front.duplex);
    assert_eq!(post(&http, &duplex, &body).await.status(), 200);
    // The picker's process dies.
    epp.process.kill();
    let started = Instant::now();
    let r = post(&http, &duplex, &body).await;
    println!(
        "picker killed: FailClose answered {} in {:?}",
        r.status(),
        started.elapsed()
    );
    assert!(
        r.status().is_server_error(),
        "FailClose answered {}",
        r.status()
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    // FailOpen (failure_mode_allow) with a buffered body: Envoy's own pick serves.
    let r = post(
        &http,
        &format!("{}/v1/chat/completions", front.buffered),
        &body,
    )
    .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn two_pickers_serve_one_pool_and_stopping_one_under_load_fails_no_request() {
    let (a, b) = (
        start_sim(EngineKind::Vllm, 20.0).await,
        start_sim(EngineKind::Vllm, 20.0).await,
    );
    // Stopping (SIGTERM, as Kubernetes stops a pod): not ready for 4 s, so Envoy's health
    // checks move new requests to the other picker, then the open exchanges finish.
    let flags = ["--shutdown-delay-s", "4"];
    let first = PickerProcess::start(&[&a, &b], &flags).await;
    let second = PickerProcess::start(&[&a, &b], &flags).await;
    let front = envoy_for_ports(&[first.epp_port, second.epp_port], true, &[&a, &b]).await;
    let url = format!("{}/v1/chat/completions", front.duplex);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..4 {
        let (url, stop) = (url.clone(), stop.clone());
        clients.spawn(async move {
            let http = reqwest::Client::new();
            let (mut ok, mut failed) = (0u32, Vec::new());
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let body = json!({"model": MODEL, "max_tokens": 16, "stream": i % 2 == 0,
                    "messages": [{"role": "user", "content": format!("client {c} request {i}")}]});
                match http.post(&url).json(&body).send().await {
                    Ok(r) if r.status() == 200 => match r.text().await {
                        Ok(_) => ok += 1,
                        Err(e) => failed.push(e.to_string()),
                    },
                    Ok(r) => failed.push(format!(
                        "{}: {}",
                        r.status(),
                        r.text().await.unwrap_or_default()
                    )),
                    Err(e) => failed.push(e.to_string()),
                }
                i += 1;
            }
            (ok, failed)
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.process.terminate();
    let mut first = first;
    assert!(
        first
            .process
            .wait_exit(Duration::from_secs(20))
            .await
            .is_some(),
        "the picker did not stop"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    while let Some(r) = clients.join_next().await {
        let (o, f) = r.unwrap();
        ok += o;
        failed.extend(f);
    }
    println!(
        "two pickers, one stopped under load: {ok} requests, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert!(ok > 20, "only {ok} requests");
    drop(second);
}

#[tokio::test]
async fn the_subset_hint_limits_the_pick_and_an_empty_match_is_503() {
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    let gw = picker(
        &[&a, &b],
        &["--epp-secure-serving", "false", "--epp-fallbacks", "0"],
    )
    .await;
    let port = gw.epp.unwrap().ext_proc.port();
    let only_b = b.addr.to_string();
    for i in 0..6 {
        let reply = exchange(
            port,
            &chat(&format!("subset {i}"), 2),
            Some(vec![only_b.as_str()]),
        )
        .await;
        assert_eq!(
            set_header(&reply, "x-gateway-destination-endpoint").as_deref(),
            Some(only_b.as_str())
        );
        let lb = &reply.dynamic_metadata.as_ref().unwrap().fields["envoy.lb"];
        let Some(Kind::StructValue(lb)) = &lb.kind else {
            panic!("{lb:?}")
        };
        assert_eq!(
            lb.fields["x-gateway-destination-endpoint"].kind,
            Some(Kind::StringValue(only_b.clone()))
        );
    }
    // A bare ip allows every port of it.
    let reply = exchange(port, &chat("by ip", 2), Some(vec!["127.0.0.1"])).await;
    assert!(set_header(&reply, "x-gateway-destination-endpoint").is_some());
    let reply = exchange(port, &chat("nobody", 2), Some(vec!["10.9.9.9:8000"])).await;
    let Some(Reply::ImmediateResponse(refused)) = &reply.response else {
        panic!("{reply:?}")
    };
    assert_eq!(refused.status.as_ref().unwrap().code, 503);
    let error: Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(error["error"]["code"], "no_endpoint_in_subset");
    // An unknown model is the gateway's 404, before any worker.
    let reply = exchange(port, &json!({"model": "nope", "prompt": "x"}), None).await;
    let Some(Reply::ImmediateResponse(refused)) = &reply.response else {
        panic!("{reply:?}")
    };
    assert_eq!(refused.status.as_ref().unwrap().code, 404);
}

#[tokio::test]
async fn every_worker_at_its_cap_is_429_and_pairs_name_both_workers_for_direct_mode() {
    let w = start_sim(EngineKind::Vllm, 50.0).await;
    let gw = picker(
        &[&w],
        &[
            "--epp-secure-serving",
            "false",
            "--epp-max-inflight-per-worker",
            "1",
        ],
    )
    .await;
    let port = gw.epp.unwrap().ext_proc.port();
    // An exchange whose stream stays open holds its worker's one slot.
    let mut client = ExternalProcessorClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ProcessingRequest {
        request: Some(Message::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![header(":path", "/v1/models")],
            }),
            end_of_stream: true,
            ..Default::default()
        })),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut open = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert!(
        set_header(
            &open.message().await.unwrap().unwrap(),
            "x-gateway-destination-endpoint"
        )
        .is_some()
    );
    let reply = exchange(port, &chat("full", 2), None).await;
    let Some(Reply::ImmediateResponse(refused)) = &reply.response else {
        panic!("{reply:?}")
    };
    assert_eq!(refused.status.as_ref().unwrap().code, 429);
    // Its end frees the slot.
    drop(tx);
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = exchange(port, &chat("free", 2), None).await;
        if set_header(&reply, "x-gateway-destination-endpoint").is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Prefill/decode: Envoy goes to the decode worker (at the frontend's port), which a
    // direct-mode frontend serves with the prefill worker the picker named.
    let record = |id: &str, port: u16, mode: &str| {
        WorkerRecord::from_json(
            json!({"worker_id": id, "url": format!("http://10.0.0.{port}:8000"),
            "model_name": MODEL, "engine": "vllm", "disagg_mode": mode, "kv_block_size": 16,
            "disagg_meta": {"protocol": "vllm-mooncake"}})
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    };
    let pd = embedded(
        vec![
            record("10.0.0.1:8000", 1, "prefill"),
            record("10.0.0.2:8000", 2, "decode"),
        ],
        &[
            "--host",
            "127.0.0.1",
            "--epp-port",
            "0",
            "--epp-health-port",
            "0",
            "--epp-secure-serving",
            "false",
            "--epp-destination-port",
            "8200",
            "--health-check-interval-s",
            "0",
        ],
    )
    .await;
    let reply = exchange(
        pd.epp.unwrap().ext_proc.port(),
        &json!({"model": MODEL, "prompt": "pd", "max_tokens": 2}),
        None,
    )
    .await;
    assert_eq!(
        set_header(&reply, "x-gateway-destination-endpoint").as_deref(),
        Some("10.0.0.2:8200"),
        "{reply:?}"
    );
    assert_eq!(
        set_header(&reply, "x-worker-instance-id").as_deref(),
        Some("10.0.0.2:8000")
    );
    assert_eq!(
        set_header(&reply, "x-prefill-instance-id").as_deref(),
        Some("10.0.0.1:8000")
    );
}

#[tokio::test]
async fn health_is_served_on_both_ports_and_ready_once_discovery_synced() {
    let w = start_sim(EngineKind::Vllm, 50.0).await;
    let gw = picker(&[&w], &["--epp-secure-serving", "false"]).await;
    let addrs = gw.epp.unwrap();
    for (port, services) in [
        (
            addrs.health.port(),
            vec![
                "liveness",
                "readiness",
                "inference-extension",
                "envoy.service.ext_proc.v3.ExternalProcessor",
                "",
            ],
        ),
        (
            addrs.ext_proc.port(),
            vec!["envoy.service.ext_proc.v3.ExternalProcessor", ""],
        ),
    ] {
        let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        for service in services {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let status = client
                    .check(HealthCheckRequest {
                        service: service.into(),
                    })
                    .await
                    .map(|r| r.into_inner().status);
                if status.as_ref().ok() == Some(&(ServingStatus::Serving as i32)) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{service:?} on {port}: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// GAIE's reference picker (`cmd/lwepp` v1.6.0, round robin over the InferencePool's
/// Pods) on its own: it reads its pool and Pods from the test kube-apiserver.
struct Lwepp {
    _process: ServerProcess,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Lwepp {
    async fn start(ns: &str, pool: &str) -> Lwepp {
        let binary =
            infera_testkit::binaries::locate(infera_testkit::binaries::Binary::Lwepp).unwrap();
        let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (port, health, metrics) = (
            free_port().unwrap(),
            free_port().unwrap(),
            free_port().unwrap(),
        );
        let args: Vec<String> = [
            "--pool-name",
            pool,
            "--pool-namespace",
            ns,
            "--grpc-port",
            &port.to_string(),
            "--grpc-health-port",
            &health.to_string(),
            "--metrics-port",
            &metrics.to_string(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--zap-log-level",
            "error",
            // Its gRPC health service on the ext_proc port, which Envoy's health check asks.
            "--health-checking",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let process = ServerProcess::start(&binary, &args, &dir.path().join("lwepp.log")).unwrap();
        wait_serving(
            health,
            "inference-extension",
            &process,
            Duration::from_secs(30),
        )
        .await;
        Lwepp {
            _process: process,
            port,
            _dir: dir,
        }
    }
}

/// The control: the same Envoy bootstrap with GAIE's own reference picker in place of
/// Infera's, so the configuration is GAIE's and not tuned to Infera's picker. lwepp
/// routes on the `streamed` listener from an HTTP/2 client and fails on the full-duplex
/// one (it acknowledges body chunks with empty replies, which Envoy refuses in
/// full-duplex mode); Infera's picker serves both.
#[tokio::test]
async fn gaies_reference_picker_routes_through_the_same_envoy() {
    use common::k8s::{
        create_namespace, create_pool, create_stock_pod, drop_namespace, install_inference_pool_crd,
    };
    use k8s_openapi::api::core::v1::Pod;
    let client = infera_testkit::kube_client().await.unwrap();
    if !install_inference_pool_crd(&client).await {
        return;
    }
    let ns = create_namespace(&client).await;
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
    create_stock_pod(&pods, "stock-0", "pool").await;
    create_pool(
        &client,
        &ns,
        "pool",
        "pool",
        &[a.addr.port(), b.addr.port()],
    )
    .await;
    let lwepp = Lwepp::start(&ns, "pool").await;
    let front = envoy_for_ports(&[lwepp.port], true, &[&a, &b]).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    // lwepp answers every body chunk, the response's too, with an empty reply, which
    // Envoy refuses in full-duplex mode: GAIE's own picker fails on GAIE's own
    // full-duplex listener, and serves the streamed one.
    let get = |url: String| {
        let h2 = h2.clone();
        async move { h2.get(url).send().await.unwrap().status() }
    };
    assert_eq!(
        get(format!("{}/v1/models", front.duplex)).await,
        500,
        "lwepp, full duplex"
    );
    assert!(
        front
            .envoy
            .stat("http.duplex.ext_proc.spurious_msgs_received")
            .await
            >= 1
    );
    assert_eq!(
        get(format!("{}/v1/models", front.streamed)).await,
        200,
        "lwepp, a GET"
    );
    let before = (served(&a), served(&b));
    for i in 0..6 {
        let r = post(
            &h2,
            &format!("{}/v1/chat/completions", front.streamed),
            &chat(&format!("lwepp {i}"), 2),
        )
        .await;
        assert_eq!(
            r.status(),
            200,
            "lwepp, streamed listener, request {i}: {:?}",
            r.text().await
        );
    }
    // Round robin over the pool's two endpoints.
    assert_eq!((served(&a) - before.0, served(&b) - before.1), (3, 3));
    drop(front);
    drop(lwepp);

    // Infera's picker on the same listeners.
    let gw = picker(&[&a, &b], &[]).await;
    let front = envoy_for(&gw, true, &[&a, &b]).await;
    let models = h2
        .get(format!("{}/v1/models", front.duplex))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    for url in [&front.streamed, &front.duplex] {
        let r = post(
            &h2,
            &format!("{url}/v1/chat/completions"),
            &chat("infera", 2),
        )
        .await;
        assert_eq!(r.status(), 200, "{url}");
    }
    drop_namespace(&client, &ns).await;
}
