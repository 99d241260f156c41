//! Prefill and decode workers of every protocol accept the request bodies the router
//! sends (fixtures in `proto/testdata/pd/`, taken from the earlier router and the
//! engines' connectors) and reject each body with a required field removed, naming it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{mk_config, start, url};
use infera_proto::worker::EngineKind;
use infera_sim::pd::{PdLeg, PdProtocol, PdRole};
use infera_sim::worker::RunningWorker;
use serde_json::{Value, json};

fn fixture(protocol: PdProtocol) -> Value {
    let path = format!(
        "{}/../proto/testdata/pd/{}.json",
        env!("CARGO_MANIFEST_DIR"),
        protocol.as_str()
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

async fn start_role(protocol: PdProtocol, leg: PdLeg) -> RunningWorker {
    let mut cfg = mk_config(protocol.engine());
    cfg.model = "m".into();
    cfg.pd = Some(PdRole {
        leg,
        protocol,
        host: "127.0.0.1".into(),
        http_port: 0,
        handshake_port: 6301,
        notify_port: 61005,
        tp_size: 8,
        dp_size: 1,
        bootstrap_port: 8998,
        engine_id: "eng-42".into(),
    });
    start(cfg).await
}

async fn send(
    worker: &RunningWorker,
    leg: &Value,
    body: &Value,
    drop_header: Option<&str>,
) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .post(url(worker, leg["endpoint"].as_str().unwrap()))
        .json(body);
    for (name, value) in leg["headers"].as_object().unwrap() {
        if Some(name.as_str()) != drop_header {
            req = req.header(name, value.as_str().unwrap());
        }
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// The body with the field at `path` (dotted) removed.
fn without(body: &Value, path: &str) -> Value {
    let mut body = body.clone();
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap();
    let mut cursor = &mut body;
    for p in parts {
        cursor = cursor.get_mut(p).unwrap();
    }
    cursor.as_object_mut().unwrap().remove(last);
    body
}

#[tokio::test]
async fn every_protocol_accepts_its_legs_and_names_missing_fields() {
    for protocol in PdProtocol::ALL {
        let fx = fixture(protocol);
        for (leg, leg_name) in [(PdLeg::Prefill, "prefill"), (PdLeg::Decode, "decode")] {
            let worker = start_role(protocol, leg).await;
            let info: Value = reqwest::get(url(&worker, "/get_server_info"))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(info["disagg_meta"]["protocol"], protocol.as_str());
            let spec = &fx[leg_name];
            let body = &spec["body"];
            let (status, text) = send(&worker, spec, body, None).await;
            assert_eq!(status, 200, "{protocol} {leg_name}: {text}");
            if leg == PdLeg::Prefill && !body["stream"].as_bool().unwrap_or(false) {
                let resp: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(
                    resp["usage"]["completion_tokens"], 1,
                    "a prefill generates one token"
                );
                if let Some(expected) = fx.get("prefill_response_kv_transfer_params") {
                    let got = &resp["kv_transfer_params"];
                    match expected {
                        Value::Null => assert!(got.is_null(), "{protocol}: {got}"),
                        Value::Object(keys) => {
                            for key in keys.keys() {
                                assert!(
                                    got.get(key).is_some(),
                                    "{protocol}: handoff lacks {key}: {got}"
                                );
                            }
                        }
                        _ => unreachable!(),
                    }
                }
            }
            for field in fx["required"][leg_name].as_array().unwrap() {
                let field = field.as_str().unwrap();
                let (status, text) = if field == "X-Request-Id" {
                    send(&worker, spec, body, Some("X-Request-Id")).await
                } else {
                    send(&worker, spec, &without(body, field), None).await
                };
                assert_eq!(status, 400, "{protocol} {leg_name} without {field}: {text}");
                assert!(
                    text.contains(field),
                    "{protocol} {leg_name} without {field}: {text}"
                );
            }
        }
    }
}

#[tokio::test]
async fn atom_pools_refuse_chat_requests_with_the_reason() {
    let worker = start_role(PdProtocol::AtomMooncake, PdLeg::Prefill).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                      "kv_transfer_params": {"do_remote_decode": true}});
    let resp = reqwest::Client::new()
        .post(url(&worker, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(resp.text().await.unwrap().contains("/v1/completions only"));
}

#[tokio::test]
async fn a_mixed_worker_ignores_pd_fields_but_a_pd_worker_requires_them() {
    let mixed = start(mk_config(EngineKind::Vllm)).await;
    let plain = json!({"prompt": "hi", "max_tokens": 2});
    let r = reqwest::Client::new()
        .post(url(&mixed, "/v1/completions"))
        .json(&plain)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let prefill = start_role(PdProtocol::VllmMooncake, PdLeg::Prefill).await;
    let r = reqwest::Client::new()
        .post(url(&prefill, "/v1/completions"))
        .json(&plain)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("would compute the request locally")
    );
}

#[tokio::test]
async fn a_decode_waits_for_its_prefill_in_the_same_process() {
    // Real H200 timing: a 6,000-token prefill takes hundreds of milliseconds, a
    // two-token decode of transferred KV a few.
    let role = |leg| PdRole {
        leg,
        protocol: PdProtocol::VllmMooncake,
        host: "127.0.0.1".into(),
        http_port: 0,
        handshake_port: 6301,
        notify_port: 61005,
        tp_size: 1,
        dp_size: 1,
        bootstrap_port: 8998,
        engine_id: "eng-wait".into(),
    };
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.timing = infera_sim::engine::Timing::exact(1.0);
    cfg.core.kv_blocks = 8192;
    let (mut p_cfg, mut d_cfg) = (cfg.clone(), cfg);
    p_cfg.pd = Some(role(PdLeg::Prefill));
    d_cfg.pd = Some(role(PdLeg::Decode));
    let (prefill, decode) = (start(p_cfg).await, start(d_cfg).await);
    let prompt = "x".repeat(6000);
    let xfer = "xfer-wait-test-0001";
    let body = |remote_decode: bool, max_tokens: u64| {
        json!({"model": "fixture-model", "prompt": prompt, "max_tokens": max_tokens,
               "kv_transfer_params": {"do_remote_decode": remote_decode, "do_remote_prefill": !remote_decode,
                   "transfer_id": xfer, "remote_engine_id": "eng-wait", "remote_bootstrap_addr": "http://127.0.0.1:8998"}})
    };
    let client = reqwest::Client::new();
    let p = {
        let (client, u, b) = (
            client.clone(),
            url(&prefill, "/v1/completions"),
            body(true, 1),
        );
        tokio::spawn(async move {
            let r = client.post(u).json(&b).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
            std::time::Instant::now()
        })
    };
    // The prefill is computing (its handoff is registered) before the decode is sent.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !infera_sim::handoff::is_pending(&format!("xfer:{xfer}")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the prefill never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let r = client
        .post(url(&decode, "/v1/completions"))
        .json(&body(false, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    r.bytes().await.unwrap();
    let decode_done = std::time::Instant::now();
    let prefill_done = p.await.unwrap();
    assert!(
        decode_done >= prefill_done - std::time::Duration::from_millis(20),
        "the decode answered {:?} before its prefill finished",
        prefill_done - decode_done
    );
}
