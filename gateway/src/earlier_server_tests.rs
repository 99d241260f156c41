//! The earlier server's cache and control endpoints, replayed from
//! `testdata/earlier_server/fixtures.json` (what its FastAPI handlers answered, written by
//! `make_fixtures.py`) against this gateway, set up as each case's `setup` says: status,
//! content type and body compared byte for byte. The stand-ins match the generator's:
//! the router's view seeded with the blocks its stub held, a kvd that takes hints on a
//! Unix socket, engines answering `/start_profile` and `/stop_profile` as vLLM and SGLang
//! do (on loopback: their addresses are written back to the fixture's before comparing),
//! and one that refuses connections. The scaling cases that need an InferaDeployment run
//! against a real API server in `tests/earlier_server.rs`.

use crate::config::GatewayConfig;
use crate::http::build_router;
use crate::state::Gateway;
use crate::workers::registry::Registry;
use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::routing::post;
use clap::Parser;
use infera_proto::worker::WorkerRecord;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

fn fixtures() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/earlier_server/fixtures.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// What the stand-in engines received: (url, body).
type Received = Arc<Mutex<Vec<(String, String)>>>;

/// An engine's profile endpoints on loopback, answering `start` and `stop` with these
/// texts (empty: vLLM's empty 200).
async fn engine(start: &'static str, stop: &'static str, received: Received) -> String {
    async fn record(
        State((received, text, path)): State<(Received, &'static str, &'static str)>,
        body: String,
    ) -> String {
        received.lock().unwrap().push((path.to_owned(), body));
        text.to_owned()
    }
    let app = axum::Router::new()
        .route(
            "/start_profile",
            post(record).with_state((received.clone(), start, "/start_profile")),
        )
        .route(
            "/stop_profile",
            post(record).with_state((received, stop, "/stop_profile")),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("127.0.0.1:{}", addr.port())
}

/// A loopback port nothing listens on.
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", l.local_addr().unwrap().port())
}

/// A kvd stand-in: answers each hello and keeps each hint frame's bytes.
fn kvd(path: &std::path::Path) -> Arc<Mutex<Vec<Vec<u8>>>> {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let frames = Arc::new(Mutex::new(Vec::new()));
    let kept = frames.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let read = async |s: &mut tokio::net::UnixStream| {
                let mut len = [0u8; 4];
                s.read_exact(&mut len).await.ok()?;
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                s.read_exact(&mut body).await.ok()?;
                Some([len.to_vec(), body].concat())
            };
            read(&mut s).await;
            let ack = infera_kvd::client::request_map(
                "hello_ack",
                vec![
                    ("server_id", rmpv::Value::from("fixture-kvd")),
                    ("protocol_version", rmpv::Value::from(1)),
                    ("shared_arena", rmpv::Value::Nil),
                ],
            );
            let _ = s.write_all(&infera_kvd::wire::encode_frame(&ack)).await;
            if let Some(frame) = read(&mut s).await {
                kept.lock().unwrap().push(frame);
            }
        }
    });
    frames
}

fn record(
    id: &str,
    url: &str,
    model: &str,
    engine: &str,
    mode: &str,
    extra: Value,
) -> WorkerRecord {
    let mut v = json!({"worker_id": id, "url": format!("http://{url}"), "model_name": model,
                       "engine": engine, "disagg_mode": mode, "kv_block_size": 16});
    if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    WorkerRecord::from_json(v.to_string().as_bytes()).unwrap()
}

struct Setup {
    gateway: Arc<Gateway>,
    /// Loopback addresses to write back as the fixture's worker addresses.
    addresses: Vec<(String, String)>,
}

async fn setup(
    name: &str,
    fixtures: &Value,
    received: &Received,
    kvd_socket: &std::path::Path,
) -> Option<Setup> {
    let workers = fixtures["workers"].as_array().unwrap();
    let w = |i: usize, key: &str| workers[i][key].as_str().unwrap().to_owned();
    let mut flags: Vec<String> = Vec::new();
    let mut records = Vec::new();
    let mut addresses = Vec::new();
    match name {
        "kv_stats_nats" => flags.extend(["--kv-event-transport".into(), "nats".into()]),
        "kv_stats_zmq"
        | "round_robin"
        | "prewarm_unconfigured"
        | "profiling_off"
        | "scaling_off" => {}
        "kv_aware" => {
            flags.extend(["--router-policy".into(), "kv-aware".into()]);
            records.push(record(
                &w(0, "worker_id"),
                &w(0, "worker_id"),
                "m",
                "sglang",
                "mixed",
                json!({}),
            ));
            records.push(record(
                &w(1, "worker_id"),
                &w(1, "worker_id"),
                "m",
                "vllm",
                "mixed",
                json!({"dp_size": 2}),
            ));
        }
        "prewarm_absent_kvd" => {
            flags.extend([
                "--kvd-socket-path".into(),
                "/nonexistent/fixture-kvd.sock".into(),
            ]);
        }
        "prewarm_kvd" => {
            flags.extend(["--kvd-socket-path".into(), kvd_socket.display().to_string()]);
        }
        "profiling" => {
            flags.push("--enable-profiling".into());
            let urls = [
                engine(
                    "Start profiling.\n",
                    "Stop profiling. This will take some time.\n",
                    received.clone(),
                )
                .await,
                engine("", "", received.clone()).await,
                closed_port(),
            ];
            for (i, url) in urls.into_iter().enumerate() {
                records.push(record(
                    &w(i, "worker_id"),
                    &url,
                    &w(i, "model_name"),
                    &w(i, "engine"),
                    &w(i, "disagg_mode"),
                    json!({}),
                ));
                addresses.push((url, w(i, "worker_id")));
            }
        }
        "scaling_unlabelled" => flags.push("--enable-scaling-api".into()),
        // An InferaDeployment on an API server: tests/earlier_server.rs.
        "scaling_mixed" | "scaling_pd" => return None,
        other => panic!("setup {other} is not known here"),
    }
    let mut args = vec!["infera-gateway".to_owned()];
    args.extend(flags);
    let cfg = GatewayConfig::try_parse_from(args).unwrap();
    let registry = Registry::new();
    for r in records {
        registry.upsert(r);
    }
    registry.mark_synced();
    let gateway = Gateway::new(cfg, registry).unwrap();
    if name == "kv_aware"
        && let Some(kv) = &gateway.kv
    {
        // The generator's stub views: the first worker 12 blocks, the second 2 on rank 0
        // and 3 on rank 1.
        kv.seed_view(&w(0, "worker_id"), 12);
        kv.seed_view(&format!("{}#dp0", w(1, "worker_id")), 2);
        kv.seed_view(&format!("{}#dp1", w(1, "worker_id")), 3);
    }
    Some(Setup { gateway, addresses })
}

#[tokio::test]
async fn every_earlier_endpoint_answers_as_its_fixture_says() {
    let fixtures = fixtures();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kvd.sock");
    let hints = kvd(&socket);
    let mut replayed = 0;
    for case in fixtures["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let received: Received = Arc::default();
        let Some(setup) = setup(
            case["setup"].as_str().unwrap(),
            &fixtures,
            &received,
            &socket,
        )
        .await
        else {
            continue;
        };
        let mut request = Request::builder()
            .method(case["method"].as_str().unwrap())
            .uri(case["path"].as_str().unwrap());
        let body = match case["request_body"].as_str() {
            Some(b) => {
                request = request.header("content-type", "application/json");
                Body::from(b.to_owned())
            }
            None => Body::empty(),
        };
        let response = build_router(setup.gateway.clone())
            .oneshot(request.body(body).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let mut text = String::from_utf8(bytes.to_vec()).unwrap();
        for (ours, theirs) in &setup.addresses {
            text = text.replace(ours, theirs);
        }
        assert_eq!(status, case["status"], "{name}: status; body {text}");
        assert_eq!(
            content_type.as_deref(),
            case["content_type"].as_str(),
            "{name}: content type"
        );
        assert_eq!(text, case["body"].as_str().unwrap(), "{name}: body");
        if let Some(forwarded) = case.get("forwarded") {
            // The hosts are checked by the results above; here the paths and bodies.
            let mut got: Vec<Value> = received
                .lock()
                .unwrap()
                .iter()
                .map(|(path, body)| json!([path, body]))
                .collect();
            got.sort_by_key(|v| v.to_string());
            let mut want: Vec<Value> = forwarded
                .as_array()
                .unwrap()
                .iter()
                .map(|pair| {
                    let url = pair[0].as_str().unwrap();
                    json!([&url[url.rfind('/').unwrap()..], pair[1]])
                })
                .collect();
            want.sort_by_key(|v| v.to_string());
            assert_eq!(got, want, "{name}: what the engines received");
        }
        replayed += 1;
    }
    let on_an_api_server = fixtures["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| matches!(c["setup"].as_str(), Some("scaling_mixed" | "scaling_pd")))
        .count();
    assert_eq!(
        replayed + on_an_api_server,
        fixtures["cases"].as_array().unwrap().len()
    );
    assert!(replayed >= 50, "only {replayed} cases replayed");
    // A rank larger than any integer of this gateway's is no rank of the worker's, and
    // comes back as written.
    let fixtures_ = &fixtures;
    let received: Received = Arc::default();
    let kv_aware = setup("kv_aware", fixtures_, &received, &socket)
        .await
        .unwrap();
    let worker = fixtures_["workers"][0]["worker_id"].as_str().unwrap();
    let response = build_router(kv_aware.gateway)
        .oneshot(
            Request::get(format!(
                "/v1/admin/cache-view/{worker}?dp_rank=000999999999999999999999999999999999999999"
            ))
            .body(Body::empty())
            .unwrap(),
        )
        .await
        .unwrap();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!(
            r#"{{"worker_id":"{worker}","dp_rank":999999999999999999999999999999999999999,"block_count":0}}"#
        )
    );
    // The hints kvd took: the 8-byte keys of each accepted hint, in kvd's frame.
    let frames = hints.lock().unwrap().clone();
    let hint = |keys: &[&str], compat_key: &str, deadline_ms: u64| {
        let hint = infera_kvd::client::PrefetchHint {
            keys: keys
                .iter()
                .map(|k| <[u8; 8]>::try_from(hex::decode(k).unwrap().as_slice()).unwrap())
                .collect(),
            model: "fixture-model".into(),
            compat_key: compat_key.into(),
            deadline_ms,
        };
        infera_kvd::wire::encode_frame(&hint.to_value())
    };
    assert_eq!(
        frames,
        vec![
            hint(&["00112233aabbccdd", "0102030405060708"], "fixture-ck", 250),
            hint(&["0011223344556677"], "", 1000),
        ]
    );
}
