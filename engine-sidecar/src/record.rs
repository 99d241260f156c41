//! The worker record the sidecar registers (pure), shaped exactly like the earlier
//! launchers' records (`infera_proto::worker`).

use crate::engine_args::{EngineFacts, flag_value};
use infera_proto::worker::{WorkerRecord, WorkerRecordError, build_worker_id};
use serde_json::{Value, json};

/// Why no record can be built.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The engine runs a prefill/decode role, which this sidecar does not register yet.
    #[error(
        "the engine flags ask for a prefill/decode role ({0}); registering prefill/decode workers is not available yet in this sidecar, run the engine as a mixed worker"
    )]
    DisaggregationUnavailable(String),
    /// The record does not validate.
    #[error(transparent)]
    Invalid(#[from] WorkerRecordError),
}

/// The record for an engine reachable at `advertise_host`.
pub fn build_record(
    facts: &EngineFacts,
    engine_args: &[String],
    advertise_host: &str,
    block_size: u32,
    kv_events_port: Option<u16>,
) -> Result<WorkerRecord, RecordError> {
    if let Some(mode) = flag_value(engine_args, &["--disaggregation-mode"]).filter(|m| *m != "null")
    {
        return Err(RecordError::DisaggregationUnavailable(format!(
            "--disaggregation-mode {mode}"
        )));
    }
    if let Some(cfg) = flag_value(engine_args, &["--kv-transfer-config"])
        && let Ok(v) = serde_json::from_str::<Value>(cfg)
        && matches!(
            v.get("kv_role").and_then(Value::as_str),
            Some("kv_producer" | "kv_consumer")
        )
    {
        return Err(RecordError::DisaggregationUnavailable(
            "--kv-transfer-config kv_role".into(),
        ));
    }
    let worker_id = build_worker_id(advertise_host, facts.port);
    let record = json!({
        "worker_id": worker_id,
        "url": format!("http://{worker_id}"),
        "model_name": facts.model,
        "engine": facts.kind.as_str(),
        "disagg_mode": "mixed",
        "disagg_meta": null,
        "kv_events_endpoint": kv_events_port.map(|p| format!("tcp://{}:{p}", bracketed(advertise_host))),
        "kv_block_size": block_size,
        "dp_rank": null,
        "dp_size": facts.dp_size,
        "request_transport": "http",
    });
    Ok(WorkerRecord::from_json(record.to_string().as_bytes())?)
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
        let r = build_record(&facts(), &[], "10.0.0.5", 64, Some(5557)).unwrap();
        assert_eq!(
            r.to_json(),
            r#"{"worker_id":"10.0.0.5:30000","url":"http://10.0.0.5:30000","model_name":"m","engine":"sglang","disagg_mode":"mixed","disagg_meta":null,"kv_events_endpoint":"tcp://10.0.0.5:5557","kv_block_size":64,"dp_rank":null,"dp_size":2,"request_transport":"http"}"#
        );
    }

    #[test]
    fn pd_roles_are_refused_with_a_reason() {
        let args: Vec<String> = ["--disaggregation-mode", "prefill"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let err = build_record(&facts(), &args, "10.0.0.5", 64, None).unwrap_err();
        assert!(err.to_string().contains("not available yet"));
    }
}
