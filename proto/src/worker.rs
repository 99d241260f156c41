//! The worker record: what an engine's launcher (our sidecar, or the earlier Python
//! launchers) publishes about one engine endpoint, under an etcd lease or in a Pod
//! annotation, and what the gateway routes on.
//!
//! The record is identity, never status: it is rebuilt whole on every heartbeat.
//! Unknown fields are preserved (not rejected, not dropped) so that a record written by
//! a newer or older launcher survives a read-modify-write by us unchanged in meaning.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

/// The serving engine behind a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// SGLang.
    Sglang,
    /// vLLM.
    Vllm,
    /// AMD ATOM.
    Atom,
}

impl EngineKind {
    /// The name used on the wire and in flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sglang => "sglang",
            Self::Vllm => "vllm",
            Self::Atom => "atom",
        }
    }
}

/// The worker's role in prefill/decode disaggregation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DisaggMode {
    /// Serves whole requests (prefill and decode).
    #[default]
    Mixed,
    /// Computes the prompt's KV and hands it to a decode worker.
    Prefill,
    /// Receives the KV from a prefill worker and generates.
    Decode,
}

impl DisaggMode {
    /// The name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mixed => "mixed",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

/// How the gateway sends requests to the worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestTransport {
    /// Plain HTTP to `url`.
    #[default]
    Http,
    /// The NATS request plane (until it exists, reached over HTTP at `url`).
    Nats,
}

/// Prefill/decode connector metadata: the protocol and its parameters
/// (for example `bootstrap_addr`, `engine_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DisaggMeta {
    /// Connector protocol, e.g. `sglang-bootstrap`, `vllm-mooncake`.
    pub protocol: String,
    /// Protocol parameters, kept as JSON since each protocol has its own keys.
    #[serde(default)]
    pub params: Map<String, Value>,
}

/// The Infera-native index plane block (`kv`), carried and preserved but not routed on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvInfo {
    /// The engine's own KV block (page) size in tokens.
    pub engine_block_size: u32,
    /// Block size of the native index plane (64 in the earlier system).
    #[serde(default = "default_index_block_size")]
    pub index_block_size: u32,
    /// Tokenizer location as the launcher saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// First 16 hex characters of the tokenizer digest (see [`crate::tokenizer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_digest: Option<String>,
    /// Token ids of [`crate::tokenizer::TOKENIZER_CANARY`], without special tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_canary: Option<Vec<u32>>,
    /// Whether the engine publishes KV events.
    #[serde(default)]
    pub supports_events: bool,
    /// Version of the native event stream (1).
    #[serde(default = "default_event_version")]
    pub event_version: u32,
    /// Native event stream endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_endpoint: Option<String>,
    /// Native snapshot endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_endpoint: Option<String>,
    /// Cache tiers the worker has, as the launcher described them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<Value>,
    /// Fields this version does not know, preserved verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn default_index_block_size() -> u32 {
    64
}

fn default_event_version() -> u32 {
    1
}

fn default_dp_size() -> u32 {
    1
}

/// One engine endpoint as registered in discovery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// `"<advertise_host>:<port>"`, also the last segment of the etcd key.
    pub worker_id: String,
    /// `http://host:port` of the engine's OpenAI server.
    pub url: String,
    /// The model name the engine serves.
    pub model_name: String,
    /// Which engine runs behind this record.
    pub engine: EngineKind,
    /// Role in prefill/decode disaggregation.
    #[serde(default)]
    pub disagg_mode: DisaggMode,
    /// Connector protocol and parameters (prefill/decode workers).
    #[serde(default)]
    pub disagg_meta: Option<DisaggMeta>,
    /// `tcp://host:port` of the engine's ZMQ KV-event publisher, if any.
    #[serde(default)]
    pub kv_events_endpoint: Option<String>,
    /// The engine's KV page size in tokens: the router hashes prompts at this size.
    #[serde(default)]
    pub kv_block_size: Option<u32>,
    /// The data-parallel rank this record stands for, or `None` for all ranks.
    #[serde(default)]
    pub dp_rank: Option<u32>,
    /// Data-parallel size of the engine.
    #[serde(default = "default_dp_size")]
    pub dp_size: u32,
    /// How requests reach the worker.
    #[serde(default)]
    pub request_transport: RequestTransport,
    /// The native index plane block, preserved but not routed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<KvInfo>,
    /// Fields this version does not know, preserved verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Why a worker record or id was rejected.
#[derive(Debug, Error)]
pub enum WorkerRecordError {
    /// The bytes were not a JSON worker record.
    #[error("worker record is not valid JSON of the expected shape: {0}")]
    DecodeRecord(#[from] serde_json::Error),
    /// The `worker_id` is not `host:port`.
    #[error("worker_id {worker_id:?} is not \"<host>:<port>\"")]
    ParseWorkerId {
        /// The offending id.
        worker_id: String,
    },
    /// `dp_rank` is not below `dp_size`.
    #[error("worker {worker_id}: dp_rank {dp_rank} is not below dp_size {dp_size}")]
    DpRankOutOfRange {
        /// The worker.
        worker_id: String,
        /// Its rank.
        dp_rank: u32,
        /// Its size.
        dp_size: u32,
    },
}

/// Builds the worker id `"<host>:<port>"`. An IPv6 literal is bracketed so the id
/// stays a valid URL authority.
pub fn build_worker_id(advertise_host: &str, port: u16) -> String {
    if advertise_host.contains(':') && !advertise_host.starts_with('[') {
        format!("[{advertise_host}]:{port}")
    } else {
        format!("{advertise_host}:{port}")
    }
}

/// Splits a worker id into host and port.
pub fn parse_worker_id(worker_id: &str) -> Result<(&str, u16), WorkerRecordError> {
    let err = || WorkerRecordError::ParseWorkerId {
        worker_id: worker_id.to_owned(),
    };
    let (host, port) = worker_id.rsplit_once(':').ok_or_else(err)?;
    let port: u16 = port.parse().map_err(|_| err())?;
    if host.is_empty() || port == 0 {
        return Err(err());
    }
    Ok((host, port))
}

/// One place the router can send a request: a worker, or one rank of a
/// rank-multiplexed worker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteTarget {
    /// `worker_id`, or `"<worker_id>#dp<r>"` for an expanded rank.
    pub key: String,
    /// The rank to send as `X-Data-Parallel-Rank`, when expanded.
    pub dp_rank: Option<u32>,
}

impl WorkerRecord {
    /// Decodes a record from etcd value or annotation bytes and checks its invariants.
    pub fn from_json(bytes: &[u8]) -> Result<Self, WorkerRecordError> {
        let record: Self = serde_json::from_slice(bytes)?;
        record.validate()?;
        Ok(record)
    }

    /// Encodes the record as compact JSON (the etcd value and annotation form).
    pub fn to_json(&self) -> String {
        // Serializing a struct of strings, numbers and JSON maps cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Checks the invariants a router relies on.
    pub fn validate(&self) -> Result<(), WorkerRecordError> {
        parse_worker_id(&self.worker_id)?;
        if let Some(rank) = self.dp_rank
            && rank >= self.dp_size.max(1)
        {
            return Err(WorkerRecordError::DpRankOutOfRange {
                worker_id: self.worker_id.clone(),
                dp_rank: rank,
                dp_size: self.dp_size,
            });
        }
        Ok(())
    }

    /// The routing targets this record stands for: one per rank when the engine runs
    /// `dp_size > 1` ranks behind one endpoint without naming a rank, else itself.
    pub fn route_targets(&self) -> Vec<RouteTarget> {
        if self.dp_size > 1 && self.dp_rank.is_none() {
            (0..self.dp_size)
                .map(|r| RouteTarget {
                    key: format!("{}#dp{r}", self.worker_id),
                    dp_rank: Some(r),
                })
                .collect()
        } else {
            vec![RouteTarget {
                key: self.worker_id.clone(),
                dp_rank: None,
            }]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAUNCHER_RECORD: &str = r#"{"worker_id":"10.1.2.3:30000","url":"http://10.1.2.3:30000","model_name":"fixture-model","engine":"sglang","disagg_mode":"prefill","disagg_meta":{"protocol":"sglang-bootstrap","params":{"bootstrap_addr":"10.1.2.3:8998"}},"kv_events_endpoint":"tcp://10.1.2.3:5557","kv_block_size":64,"dp_rank":null,"dp_size":2,"request_transport":"http","kv":{"engine_block_size":64,"index_block_size":64,"tokenizer":"/models/fixture","tokenizer_digest":"0123456789abcdef","tokenizer_canary":[1,2,3],"supports_events":true,"event_version":1,"future_kv_field":"kept"},"launcher_version":"0.1.7"}"#;

    #[test]
    fn round_trips_a_launcher_record_byte_for_byte() {
        let record = WorkerRecord::from_json(LAUNCHER_RECORD.as_bytes()).unwrap();
        assert_eq!(record.engine, EngineKind::Sglang);
        assert_eq!(record.disagg_mode, DisaggMode::Prefill);
        assert_eq!(record.extra["launcher_version"], "0.1.7");
        assert_eq!(record.kv.as_ref().unwrap().extra["future_kv_field"], "kept");
        assert_eq!(record.to_json(), LAUNCHER_RECORD);
    }

    #[test]
    fn minimal_record_gets_defaults() {
        let r = WorkerRecord::from_json(
            br#"{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"vllm"}"#,
        )
        .unwrap();
        assert_eq!(r.disagg_mode, DisaggMode::Mixed);
        assert_eq!(r.dp_size, 1);
        assert_eq!(r.request_transport, RequestTransport::Http);
        assert_eq!(
            r.to_json(),
            r#"{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"vllm","disagg_mode":"mixed","disagg_meta":null,"kv_events_endpoint":null,"kv_block_size":null,"dp_rank":null,"dp_size":1,"request_transport":"http"}"#
        );
    }

    #[test]
    fn rejects_bad_worker_ids_and_ranks() {
        for id in ["nohost", ":80", "h:0", "h:99999", "h:x"] {
            assert!(parse_worker_id(id).is_err(), "{id}");
        }
        let bad = br#"{"worker_id":"h:1","url":"u","model_name":"m","engine":"vllm","dp_rank":2,"dp_size":2}"#;
        assert!(matches!(
            WorkerRecord::from_json(bad),
            Err(WorkerRecordError::DpRankOutOfRange { dp_rank: 2, .. })
        ));
        let unknown_engine = br#"{"worker_id":"h:1","url":"u","model_name":"m","engine":"tgi"}"#;
        assert!(WorkerRecord::from_json(unknown_engine).is_err());
    }

    #[test]
    fn builds_and_parses_worker_ids() {
        assert_eq!(build_worker_id("10.0.0.1", 8000), "10.0.0.1:8000");
        assert_eq!(build_worker_id("fd00::1", 8000), "[fd00::1]:8000");
        assert_eq!(
            parse_worker_id("[fd00::1]:8000").unwrap(),
            ("[fd00::1]", 8000)
        );
    }

    #[test]
    fn expands_rank_multiplexed_workers() {
        let mut r = WorkerRecord::from_json(LAUNCHER_RECORD.as_bytes()).unwrap();
        let keys: Vec<_> = r
            .route_targets()
            .into_iter()
            .map(|t| (t.key, t.dp_rank))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("10.1.2.3:30000#dp0".to_owned(), Some(0)),
                ("10.1.2.3:30000#dp1".to_owned(), Some(1))
            ]
        );
        r.dp_rank = Some(1);
        assert_eq!(r.route_targets().len(), 1);
        assert_eq!(r.route_targets()[0].key, "10.1.2.3:30000");
    }
}
