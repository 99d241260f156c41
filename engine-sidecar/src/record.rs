//! The worker record the sidecar registers (pure), shaped exactly like the earlier
//! launchers' records (`infera_proto::worker`).

use crate::disagg::{DisaggRole, build_disagg_meta};
use crate::engine_args::EngineFacts;
use crate::tokenizer_id::TokenizerIdentity;
use infera_proto::worker::{DisaggMode, WorkerRecord, WorkerRecordError, build_worker_id};
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
    if let (Some(t), Some(map)) = (tokenizer, record.as_object_mut()) {
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
    use infera_proto::worker::EngineKind;

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
        let meta = r.disagg_meta.unwrap();
        assert_eq!(
            (meta.protocol.as_str(), &meta.params["bootstrap_addr"]),
            ("sglang-bootstrap", &json!("10.0.0.5:8998"))
        );
    }
}
