use super::*;
use std::sync::Arc;

fn fixture(protocol: PdProtocol) -> Value {
    let path = format!(
        "{}/../proto/testdata/pd/{}.json",
        env!("CARGO_MANIFEST_DIR"),
        protocol.as_str()
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn target(record: Value, dp_rank: Option<u32>) -> Target {
    let record = WorkerRecord::from_json(record.to_string().as_bytes()).unwrap();
    Target {
        key: record.worker_id.clone(),
        record: Arc::new(record),
        dp_rank,
    }
}

/// The pair the fixture describes: prefill at 10.0.0.22, decode at 10.0.0.40.
fn pair_targets(protocol: PdProtocol, fx: &Value) -> (Target, Target) {
    let engine = protocol.engine().as_str();
    let sglang = protocol == PdProtocol::SglangBootstrap;
    let prefill = target(
        json!({
            "worker_id": "10.0.0.22:30001", "url": "http://10.0.0.22:30001",
            "model_name": "m", "engine": engine, "disagg_mode": "prefill",
            "dp_size": if sglang { 2 } else { 1 },
            "disagg_meta": {"protocol": protocol.as_str(), "params": fx["prefill_record_params"]},
        }),
        sglang.then_some(0),
    );
    let decode_params = match protocol {
        PdProtocol::AtomMooncake => json!({
            "host": "10.0.0.40", "http_port": 30002, "handshake_port": 6301, "tp_size": 8, "dp_size": 1
        }),
        PdProtocol::VllmMoriRead | PdProtocol::VllmMoriWrite => json!({
            "engine_id": "eng-d",
            "kv_connector_extra_config": {"handshake_port": 6301, "notify_port": 61005, "tp_size": 8}
        }),
        _ => json!({}),
    };
    let decode = target(
        json!({
            "worker_id": "10.0.0.40:30002", "url": "http://10.0.0.40:30002",
            "model_name": "m", "engine": engine, "disagg_mode": "decode",
            "disagg_meta": {"protocol": protocol.as_str(), "params": decode_params},
        }),
        None,
    );
    (prefill, decode)
}

/// What the client sent for each fixture.
fn client_body(protocol: PdProtocol) -> Map<String, Value> {
    let v = match protocol {
        PdProtocol::SglangBootstrap => json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "stream": true
        }),
        PdProtocol::VllmMooncake => json!({
            "model": "m", "prompt": "hi", "max_tokens": 128, "max_completion_tokens": 128,
            "stream": true, "stream_options": {"include_usage": true}
        }),
        PdProtocol::VllmMoriWrite | PdProtocol::VllmMoriRead => {
            json!({"model": "m", "prompt": "hi", "max_tokens": 128, "stream": true})
        }
        PdProtocol::AtomMooncake => {
            json!({"model": "m", "prompt": "1 2 3 4 5", "max_tokens": 10, "stream": true})
        }
    };
    v.as_object().unwrap().clone()
}

fn ids(protocol: PdProtocol) -> PdIds {
    PdIds {
        room: if protocol == PdProtocol::SglangBootstrap {
            5764607523034234880
        } else {
            42
        },
        request_uuid: 0x9f1c3b0e5d2a4c7f8e6b1a2d3c4e5f60,
        transfer_uuid: 0x6f1d2c3b7a8e4f009b1c2d3e4f5a6b7c,
    }
}

/// The fixture's leg as bytes, without the legacy top-level `_infera_retention`
/// (the earlier router's duplicate of `kv_transfer_params.infera_retention`).
fn expected(fx: &Value, leg: &str) -> (String, Vec<(String, String)>) {
    let mut body = fx[leg]["body"].as_object().unwrap().clone();
    body.shift_remove("_infera_retention");
    let headers = fx[leg]["headers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    (serde_json::to_string(&body).unwrap(), headers)
}

fn actual(leg: &Leg) -> (String, Vec<(String, String)>) {
    (
        serde_json::to_string(&leg.body).unwrap(),
        leg.headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    )
}

#[test]
fn legs_match_the_fixtures_byte_for_byte() {
    for protocol in PdProtocol::ALL {
        let fx = fixture(protocol);
        let (p, d) = pair_targets(protocol, &fx);
        assert_eq!(resolve_protocol(&p.record, &d.record).unwrap(), protocol);
        let pair = PdPair {
            protocol,
            prefill: &p,
            decode: &d,
            ids: ids(protocol),
            retention: Retention::Long,
        };
        let body = client_body(protocol);
        let prefill = build_prefill_leg(&pair, &body).unwrap();
        assert_eq!(
            actual(&prefill),
            expected(&fx, "prefill"),
            "{protocol} prefill"
        );
        let handoff = fx
            .get("prefill_response_kv_transfer_params")
            .filter(|v| v.is_object())
            .map(|v| {
                extract_handoff(protocol, &p.record, &json!({"kv_transfer_params": v})).unwrap()
            });
        let decode = build_decode_leg(&pair, &body, handoff.as_ref()).unwrap();
        assert_eq!(
            actual(&decode),
            expected(&fx, "decode"),
            "{protocol} decode"
        );
    }
}

#[test]
fn mismatch_unsupported_and_missing_params_name_the_worker() {
    let fx = fixture(PdProtocol::VllmMooncake);
    let (p, _) = pair_targets(PdProtocol::VllmMooncake, &fx);
    let (_, d) = pair_targets(
        PdProtocol::SglangBootstrap,
        &fixture(PdProtocol::SglangBootstrap),
    );
    let err = resolve_protocol(&p.record, &d.record).unwrap_err();
    assert_eq!(err.reason(), "protocol_mismatch");
    let api = err.to_api_error();
    assert_eq!(api.class.status(), 501);
    assert!(
        api.message.contains("10.0.0.22:30001 speaks vllm-mooncake"),
        "{}",
        api.message
    );
    assert!(
        api.message
            .contains("10.0.0.40:30002 speaks sglang-bootstrap"),
        "{}",
        api.message
    );

    let nixl = target(
        json!({"worker_id": "n:1", "url": "http://n:1", "model_name": "m", "engine": "vllm",
               "disagg_mode": "decode", "disagg_meta": {"protocol": "vllm-nixl", "params": {}}}),
        None,
    );
    let api = resolve_protocol(&p.record, &nixl.record)
        .unwrap_err()
        .to_api_error();
    assert_eq!(api.class.status(), 501);
    assert!(api.message.contains("\"vllm-nixl\""), "{}", api.message);

    // A mooncake prefill without its bootstrap address.
    let bare = target(
        json!({"worker_id": "p:1", "url": "http://p:1", "model_name": "m", "engine": "vllm",
               "disagg_mode": "prefill",
               "disagg_meta": {"protocol": "vllm-mooncake", "params": {"engine_id": "e"}}}),
        None,
    );
    let (_, d) = pair_targets(PdProtocol::VllmMooncake, &fx);
    let pair = PdPair {
        protocol: PdProtocol::VllmMooncake,
        prefill: &bare,
        decode: &d,
        ids: ids(PdProtocol::VllmMooncake),
        retention: Retention::Long,
    };
    let err = build_decode_leg(&pair, &client_body(PdProtocol::VllmMooncake), None).unwrap_err();
    assert_eq!(
        err,
        PdError::MissingParam {
            side: "prefill",
            worker: "p:1".into(),
            key: "bootstrap_addr".into()
        }
    );
    let api = err.to_api_error();
    assert_eq!(api.class.status(), 502);
    assert!(api.message.contains("p:1") && api.message.contains("params.bootstrap_addr"));
}

#[test]
fn serial_decode_needs_the_handoff() {
    let fx = fixture(PdProtocol::VllmMoriRead);
    let (p, d) = pair_targets(PdProtocol::VllmMoriRead, &fx);
    let err =
        extract_handoff(PdProtocol::VllmMoriRead, &p.record, &json!({"choices": []})).unwrap_err();
    assert_eq!(err.reason(), "bad_handoff");
    assert!(err.to_api_error().message.contains("10.0.0.22:30001"));
    let pair = PdPair {
        protocol: PdProtocol::VllmMoriRead,
        prefill: &p,
        decode: &d,
        ids: ids(PdProtocol::VllmMoriRead),
        retention: Retention::Long,
    };
    let partial: Map<String, Value> = json!({"transfer_id": "tx-1"}).as_object().unwrap().clone();
    let err = build_decode_leg(
        &pair,
        &client_body(PdProtocol::VllmMoriRead),
        Some(&partial),
    )
    .unwrap_err();
    assert!(
        matches!(err, PdError::BadHandoff { ref detail, .. } if detail.contains("remote_engine_id"))
    );
}

#[test]
fn rooms_follow_the_prefill_rank_and_vllm_engine_ids_name_it() {
    let fx = fixture(PdProtocol::VllmMooncake);
    let (_, d) = pair_targets(PdProtocol::VllmMooncake, &fx);
    let p = target(
        json!({"worker_id": "p:1", "url": "http://p:1", "model_name": "m", "engine": "vllm",
               "disagg_mode": "prefill", "dp_size": 4,
               "disagg_meta": {"protocol": "vllm-mooncake", "params": fx["prefill_record_params"]}}),
        Some(3),
    );
    for _ in 0..50 {
        let ids = PdIds::random(&p);
        assert_eq!(ids.room % 4, 3);
        assert!(ids.room < 1 << 63);
        assert_eq!(format!("{:032x}", ids.request_uuid).as_bytes()[12], b'4');
        let pair = PdPair {
            protocol: PdProtocol::VllmMooncake,
            prefill: &p,
            decode: &d,
            ids,
            retention: Retention::Long,
        };
        let decode = build_decode_leg(&pair, &client_body(PdProtocol::VllmMooncake), None).unwrap();
        assert_eq!(
            decode.body["kv_transfer_params"]["remote_engine_id"],
            "eng-42_dp3"
        );
        let prefill = build_prefill_leg(&pair, &client_body(PdProtocol::VllmMooncake)).unwrap();
        assert_eq!(prefill.headers, vec![(DP_RANK_HEADER, "3".to_owned())]);
    }
}

#[test]
fn url_hosts() {
    assert_eq!(url_host("http://10.0.0.1:8000"), "10.0.0.1");
    assert_eq!(url_host("http://[fd00::1]:8000/v1"), "fd00::1");
    assert_eq!(url_host("https://user@host.example/x"), "host.example");
    assert_eq!(url_host("host:1"), "host");
}
