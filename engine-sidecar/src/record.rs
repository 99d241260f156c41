//! The worker record the sidecar registers (pure), shaped exactly like the earlier
//! launchers' records (`infera_proto::worker`).

use crate::disagg::{DisaggRole, build_disagg_meta};
use crate::engine_args::EngineFacts;
use crate::tokenizer_id::TokenizerIdentity;
use infera_proto::worker::{
    DisaggMode, TOKENIZER_FORMAT_FIELD, WorkerRecord, WorkerRecordError, build_worker_id,
};
use serde_json::{Value, json};

/// The record for an engine reachable at `advertise_host`, in `role` (`None`: mixed).
pub fn build_record(
    facts: &EngineFacts,
    role: Option<&DisaggRole>,
    advertise_host: &str,
    block_size: u32,
    kv_events_port: Option<u16>,
    tokenizer: Option<&TokenizerIdentity>,
) -> Result<WorkerRecord, WorkerRecordError> {
    let worker_id = build_worker_id(advertise_host, facts.port);
    let host = bracketed(advertise_host);
    let (mode, meta) = match role {
        Some(role) => (
            role.mode,
            build_disagg_meta(role, &host, facts.port, facts.dp_size),
        ),
        None => (DisaggMode::Mixed, Value::Null),
    };
    let mut record = json!({
        "worker_id": worker_id,
        "url": format!("http://{worker_id}"),
        "model_name": facts.model,
        "engine": facts.kind.as_str(),
        "disagg_mode": mode,
        "disagg_meta": meta,
        "kv_events_endpoint": kv_events_port.map(|p| format!("tcp://{host}:{p}")),
        "kv_block_size": block_size,
        "dp_rank": null,
        "dp_size": facts.dp_size,
        "request_transport": "http",
    });
    if let (Some(t), Some(map)) = (tokenizer, record.as_object_mut())
        && t.tiktoken_only
    {
        // No canary to state (the vocabulary is not read here), so no `kv` block: the
        // record says why instead.
        map.insert(TOKENIZER_FORMAT_FIELD.into(), json!("tiktoken"));
    } else if let (Some(t), Some(map)) = (tokenizer, record.as_object_mut()) {
        map.insert(
            "kv".into(),
            json!({
                "engine_block_size": block_size,
                "index_block_size": 64,
                "tokenizer": t.path.display().to_string(),
                "tokenizer_digest": t.digest,
                "tokenizer_canary": t.canary,
                "supports_events": kv_events_port.is_some(),
                "event_version": 1,
            }),
        );
    }
    WorkerRecord::from_json(record.to_string().as_bytes())
}

fn bracketed(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infera_proto::worker::{EngineKind, RequestTransport};

    fn facts() -> EngineFacts {
        EngineFacts {
            kind: EngineKind::Sglang,
            port: 30000,
            model: "m".into(),
            block_size: None,
            kv_events_port: None,
            dp_size: 2,
        }
    }

    #[test]
    fn the_record_matches_the_launchers_shape() {
        let r = build_record(&facts(), None, "10.0.0.5", 64, Some(5557), None).unwrap();
        assert_eq!(
            r.to_json(),
            r#"{"worker_id":"10.0.0.5:30000","url":"http://10.0.0.5:30000","model_name":"m","engine":"sglang","disagg_mode":"mixed","disagg_meta":null,"kv_events_endpoint":"tcp://10.0.0.5:5557","kv_block_size":64,"dp_rank":null,"dp_size":2,"request_transport":"http"}"#
        );
    }

    #[test]
    fn pd_records_carry_role_and_meta() {
        let args: Vec<String> = ["--disaggregation-mode", "prefill"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let role = crate::disagg::detect_role(EngineKind::Sglang, &args, false).unwrap();
        let r = build_record(&facts(), role.as_ref(), "10.0.0.5", 64, None, None).unwrap();
        assert_eq!(r.disagg_mode, DisaggMode::Prefill);
        assert_eq!(
            (r.protocol(), &r.disagg_params().unwrap()["bootstrap_addr"]),
            (Some("sglang-bootstrap"), &json!("10.0.0.5:8998"))
        );
    }

    /// What a record built for one engine and role must mean once read back.
    struct Meant {
        kind: EngineKind,
        args: &'static str,
        dp_size: u32,
        tokenizer: bool,
        mode: DisaggMode,
        protocol: Option<&'static str>,
    }

    #[test]
    fn every_record_the_sidecar_builds_reads_back_as_meant() {
        use DisaggMode::{Decode, Mixed, Prefill};
        use EngineKind::{Atom, Sglang, Vllm};
        let mooncake = r#"--kv-transfer-config {"kv_connector":"MooncakeConnector","kv_role":"kv_producer","engine_id":"eng-42"}"#;
        let cases = [
            Meant {
                kind: Sglang,
                args: "",
                dp_size: 1,
                tokenizer: false,
                mode: Mixed,
                protocol: None,
            },
            Meant {
                kind: Sglang,
                args: "",
                dp_size: 4,
                tokenizer: true,
                mode: Mixed,
                protocol: None,
            },
            Meant {
                kind: Sglang,
                args: "--disaggregation-mode prefill",
                dp_size: 2,
                tokenizer: true,
                mode: Prefill,
                protocol: Some("sglang-bootstrap"),
            },
            Meant {
                kind: Sglang,
                args: "--disaggregation-mode decode",
                dp_size: 1,
                tokenizer: false,
                mode: Decode,
                protocol: Some("sglang-bootstrap"),
            },
            Meant {
                kind: Vllm,
                args: "",
                dp_size: 1,
                tokenizer: true,
                mode: Mixed,
                protocol: None,
            },
            Meant {
                kind: Vllm,
                args: mooncake,
                dp_size: 2,
                tokenizer: true,
                mode: Prefill,
                protocol: Some("vllm-mooncake"),
            },
            Meant {
                kind: Vllm,
                args: r#"--kv-transfer-config {"kv_connector":"MoRIIOConnector","kv_role":"kv_consumer","kv_connector_extra_config":{"handshake_port":6301,"notify_port":61005}}"#,
                dp_size: 1,
                tokenizer: false,
                mode: Decode,
                protocol: Some("vllm-mori-write"),
            },
            Meant {
                kind: Vllm,
                args: r#"--kv-transfer-config {"kv_connector":"MoRIIOConnector","kv_role":"kv_producer","kv_connector_extra_config":{"handshake_port":6301,"notify_port":61005,"read_mode":true}}"#,
                dp_size: 1,
                tokenizer: true,
                mode: Prefill,
                protocol: Some("vllm-mori-read"),
            },
            Meant {
                kind: Atom,
                args: "",
                dp_size: 1,
                tokenizer: false,
                mode: Mixed,
                protocol: None,
            },
            Meant {
                kind: Atom,
                args: r#"--kv-transfer-config {"kv_role":"kv_producer","handshake_port":6301,"http_port":8000}"#,
                dp_size: 1,
                tokenizer: false,
                mode: Prefill,
                protocol: Some("atom-mooncake"),
            },
            Meant {
                kind: Atom,
                args: r#"--kv-transfer-config {"kv_role":"kv_consumer","handshake_port":6301,"http_port":8000}"#,
                dp_size: 1,
                tokenizer: false,
                mode: Decode,
                protocol: Some("atom-mooncake"),
            },
        ];
        let identity = TokenizerIdentity {
            path: "/models/fixture".into(),
            digest: "0123456789abcdef".into(),
            canary: vec![9707, 11, 1879],
            tiktoken_only: false,
        };
        for m in cases {
            let args: Vec<String> = m
                .args
                .split_once(' ')
                .map(|(flag, value)| vec![flag.to_owned(), value.to_owned()])
                .unwrap_or_default();
            let role = crate::disagg::detect_role(m.kind, &args, false).unwrap();
            let facts = EngineFacts {
                kind: m.kind,
                dp_size: m.dp_size,
                ..facts()
            };
            let built = build_record(
                &facts,
                role.as_ref(),
                "10.0.0.5",
                64,
                Some(5557),
                m.tokenizer.then_some(&identity),
            )
            .unwrap();
            let bytes = built.to_json();
            let read = WorkerRecord::from_json(bytes.as_bytes()).unwrap();
            let case = format!("{} {}", m.kind.as_str(), m.args);
            assert_eq!(read, built, "{case}");
            assert_eq!(read.to_json(), bytes, "{case}: byte for byte");
            assert_eq!(read.disagg_mode, m.mode, "{case}");
            assert_eq!(read.protocol(), m.protocol, "{case}");
            if m.protocol.is_some() {
                // A prefill carries what its connector needs; an SGLang decode registers
                // `"params": {}`, as the earlier launcher did.
                let params = read.disagg_params().unwrap();
                assert!(
                    m.mode == Decode || !params.is_empty(),
                    "{case}: the connector's parameters"
                );
            } else {
                assert_eq!(read.disagg_meta, None, "{case}");
            }
            assert_eq!(read.kv_block_size, Some(64), "{case}");
            assert_eq!(
                read.events_endpoint(),
                Some("tcp://10.0.0.5:5557"),
                "{case}"
            );
            assert_eq!(read.request_transport, RequestTransport::Http, "{case}");
            assert_eq!(
                (read.dp_size, read.dp_rank),
                (Some(m.dp_size), None),
                "{case}"
            );
            let targets = read.route_targets();
            assert_eq!(targets.len() as u32, m.dp_size, "{case}");
            if m.dp_size > 1 {
                assert_eq!(targets[1].key, "10.0.0.5:30000#dp1", "{case}");
                assert_eq!(targets[1].dp_rank, Some(1), "{case}");
            }
            assert_eq!(
                read.kv.as_ref().map(|kv| kv.tokenizer_canary.clone()),
                m.tokenizer.then(|| identity.canary.clone()),
                "{case}"
            );
        }
    }

    #[test]
    fn a_tiktoken_vocabulary_is_reported_on_the_record_instead_of_a_canary() {
        let identity = TokenizerIdentity {
            path: "/models/fixture-tiktoken".into(),
            digest: "0123456789abcdef".into(),
            canary: Vec::new(),
            tiktoken_only: true,
        };
        let record = build_record(&facts(), None, "10.0.0.5", 16, None, Some(&identity)).unwrap();
        assert_eq!(record.kv, None);
        assert_eq!(record.tokenizer_format(), Some("tiktoken"));
        let read = WorkerRecord::from_json(record.to_json().as_bytes()).unwrap();
        assert_eq!(read.tokenizer_format(), Some("tiktoken"), "kept as written");
    }
}
