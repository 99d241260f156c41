//! What differs between the engines the simulator imitates: metric names, error JSON,
//! the default KV-event layout and hash type, and the info endpoints other routers probe.

use infera_proto::kv_events::encode::KvEventFormat;
use infera_proto::worker::EngineKind;
use serde_json::{Value, json};

/// Which engine to imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flavor(pub EngineKind);

impl Flavor {
    /// The KV-event layout this engine emits by default: SGLang's arrays, vLLM 0.25.x
    /// and ATOM's tagged maps.
    pub fn default_event_format(self) -> KvEventFormat {
        match self.0 {
            EngineKind::Sglang => KvEventFormat::Sglang,
            EngineKind::Vllm | EngineKind::Atom => KvEventFormat::VllmTaggedMap,
        }
    }

    /// Whether engine block hashes are ints (SGLang) rather than 32-byte digests (vLLM's
    /// default sha256 hashing, and ATOM).
    pub fn int_block_hashes(self) -> bool {
        self.0 == EngineKind::Sglang
    }

    /// The engine's error body for `status`.
    pub fn error_body(self, status: u16, message: &str, param: Option<&str>) -> Value {
        match self.0 {
            EngineKind::Sglang => json!({
                "object": "error",
                "message": message,
                "type": sglang_error_type(status),
                "param": param,
                "code": status,
            }),
            EngineKind::Vllm | EngineKind::Atom => json!({"error": {
                "message": message,
                "type": vllm_error_type(status),
                "param": param,
                "code": status,
            }}),
        }
    }

    /// Metric names: (running, waiting, cache usage fraction).
    pub fn load_metric_names(self) -> (&'static str, &'static str, &'static str) {
        match self.0 {
            EngineKind::Sglang => (
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:token_usage",
            ),
            // ATOM's own exporter is not specified; it is given vLLM's names, which is what
            // the sidecar reads for it.
            EngineKind::Vllm | EngineKind::Atom => (
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
            ),
        }
    }
}

fn vllm_error_type(status: u16) -> &'static str {
    match status {
        400 => "BadRequestError",
        404 => "NotFoundError",
        413 => "RequestEntityTooLarge",
        501 => "NotImplementedError",
        503 => "ServiceUnavailableError",
        _ => "InternalServerError",
    }
}

fn sglang_error_type(status: u16) -> &'static str {
    match status {
        400 => "BadRequest",
        404 => "NotFound",
        503 => "ServiceUnavailable",
        _ => "InternalServerError",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_shapes_per_engine() {
        assert_eq!(
            Flavor(EngineKind::Vllm)
                .error_body(400, "bad", Some("messages"))
                .to_string(),
            r#"{"error":{"message":"bad","type":"BadRequestError","param":"messages","code":400}}"#
        );
        assert_eq!(
            Flavor(EngineKind::Sglang)
                .error_body(404, "no model", None)
                .to_string(),
            r#"{"object":"error","message":"no model","type":"NotFound","param":null,"code":404}"#
        );
    }
}
