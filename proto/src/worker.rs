//! The worker record: what an engine's launcher (Infera's sidecar, or the earlier Python
//! launchers) publishes about one engine endpoint, under an etcd lease or in a Pod
//! annotation, and what the gateway routes on.
//!
//! The record is identity, never status: it is rebuilt whole on every heartbeat.
//! Unknown fields are preserved (not rejected, not dropped) so that a record written by
//! a newer or older launcher survives a read-modify-write by us unchanged in meaning.
//!
//! # Reading records the earlier system wrote
//!
//! Every reader here (etcd and Kubernetes discovery, the static file, `infera up`, the
//! sidecar re-reading what it built) goes through [`WorkerRecord::from_json`] (or the
//! `Deserialize` impl, which is the same parse). The rules reproduce the earlier
//! reader (`infera/common/discovery.py` `worker_info_from_json`, the router's DP
//! expansion in `infera/router/policy/target.py`): where it treated `{}`, `null` and a
//! missing key alike, so do we; where it refused a record, so do we. They are pinned by
//! `tests/legacy_records.rs` against `testdata/legacy_records/`, records the earlier
//! launchers wrote and what the earlier reader made of each (probe names in parentheses).
//!
//! | field | accepted | meaning |
//! | --- | --- | --- |
//! | `worker_id`, `url`, `model_name` | a string, key required | as written (`worker_id` must be `host:port`) |
//! | `engine` | missing, or `sglang`/`vllm`/`atom` | missing = `sglang` (probe `engine/missing`); `null`, `""`, other spellings refused (probes `engine/null`, `engine="SGLANG"`) |
//! | `status` | missing, or `active`/`draining`/`dead` | missing = active; draining and dead are listed, not routed (probe `status="draining"`); `null`, `""`, `ACTIVE` refused |
//! | `disagg_mode` | missing, or `mixed`/`prefill`/`decode` | missing = mixed; `null` and other spellings refused (probe `disagg_mode/null`) |
//! | `disagg_meta` | anything Python reads as false (missing, `null`, `{}`, `[]`, `""`, `0`, `false`), or an object | false = no connector (probes `disagg_meta={}`, `disagg_meta/null`, `disagg_meta=[]`); an object's `protocol` (string) and `params` (object) may each be missing or null (probe `disagg_meta={"params": {}}`); other types refused (probe `disagg_meta="sglang-bootstrap"`) |
//! | `kv_events_endpoint` | missing, `null`, or a string | missing = null; `""` subscribes to nothing |
//! | `kv_block_size` | missing, `null`, or a non-negative integer | missing = null; `0` = unset (no hashing, load-only) (probe `kv_block_size=0`) |
//! | `dp_rank` | missing, `null`, or a non-negative integer | missing = null (the worker stands for all its ranks) |
//! | `dp_size` | missing, `null`, or a non-negative integer | missing, null and `0` = one rank (probes `dp_size/null`, `dp_size=0`); > 1 without `dp_rank` expands to one target per rank, `<worker_id>#dp<r>` |
//! | `request_transport` | missing, `null`, or a string | only `"nats"` is NATS; missing, `null` and any other string are HTTP, as the earlier router sent them (probes `request_transport/null`, `request_transport="grpc"`) |
//! | `kv` | anything Python reads as false, or an object | false = no native index block (probes `kv={}`, `kv/null`, `kv=[]`); in an object `engine_block_size`, `index_block_size`, `tokenizer`, `tokenizer_digest` and `tokenizer_canary` are required keys (probe `kv.tokenizer=missing`), see [`KvInfo`] |
//!
//! Integers are JSON numbers with an integral value (`16` and `16.0` alike: JSON has
//! one number type). Where the earlier reader accepted a value of the wrong type and then
//! routed nowhere useful, crashed while expanding targets, or listed a worker it could
//! never remove, the record is refused instead, counted and logged by the gateway: a
//! `worker_id`, `url` or `model_name` that is not a string (or a `worker_id` that is not
//! `host:port`), a string or boolean where an integer belongs, a negative integer, a
//! non-string `kv_events_endpoint`, a `kv.tokenizer_canary` that is not a list of token
//! ids. `tests/legacy_records.rs` lists each of these deviations with its probe.
//!
//! `dp_rank` is checked against `dp_size` only when `dp_size` is given and non-zero (the
//! earlier reader never checked; a record without a size names its rank freely).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;
use std::str::FromStr;
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

impl FromStr for EngineKind {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        [Self::Sglang, Self::Vllm, Self::Atom]
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or(())
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

impl FromStr for DisaggMode {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        [Self::Mixed, Self::Prefill, Self::Decode]
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or(())
    }
}

/// A worker's state as its record states it (the earlier `WorkerStatus`). Launchers
/// do not write it; a record that says `draining` or `dead` is listed but not routed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerStatus {
    /// Takes requests.
    #[default]
    Active,
    /// Finishing what it holds; takes no new requests.
    Draining,
    /// Gone; takes no requests.
    Dead,
}

impl WorkerStatus {
    /// The name used on the wire and in `/v1/workers`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Draining => "draining",
            Self::Dead => "dead",
        }
    }
}

impl FromStr for WorkerStatus {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        [Self::Active, Self::Draining, Self::Dead]
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or(())
    }
}

impl fmt::Display for WorkerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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

/// Prefill/decode connector metadata: the protocol and its parameters (for example
/// `bootstrap_addr`, `engine_id`). A record without any (`{}`, `null`, missing) has
/// `disagg_meta: None`; an object naming no protocol keeps what it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct DisaggMeta {
    /// Connector protocol, e.g. `sglang-bootstrap`, `vllm-mooncake`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Protocol parameters, kept as JSON since each protocol has its own keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<Map<String, Value>>,
    /// Keys this version does not know, preserved verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The Infera-native index plane block (`kv`), carried and preserved but not routed on
/// (only its tokenizer canary is checked). Read as the earlier
/// `KvRegistrationMetadata.from_dict` read it: `engine_block_size`, `index_block_size`
/// and `event_version` through Python's `int()` (integers and decimal strings, so
/// `"16"` is 16 (probe `kv.engine_block_size="16"`); `null` refused); `tokenizer` and
/// `tokenizer_digest` required keys that may be `null`; `tokenizer_canary` a required
/// list of token ids; `supports_events` Python truthiness (missing = true,
/// `"false"` = true (probe `kv.supports_events="false"`), `0`/`null` = false); `tiers` kept as
/// written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct KvInfo {
    /// The engine's own KV block (page) size in tokens.
    pub engine_block_size: u32,
    /// Block size of the native index plane (64 in the earlier system).
    pub index_block_size: u32,
    /// Tokenizer location as the launcher saw it.
    pub tokenizer: Option<String>,
    /// First 16 hex characters of the tokenizer digest (see [`crate::tokenizer`]).
    pub tokenizer_digest: Option<String>,
    /// Token ids of [`crate::tokenizer::TOKENIZER_CANARY`], without special tokens.
    pub tokenizer_canary: Vec<u32>,
    /// Whether the engine publishes KV events.
    pub supports_events: bool,
    /// Version of the native event stream (1).
    pub event_version: u32,
    /// Native event stream endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_endpoint: Option<String>,
    /// Native snapshot endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_endpoint: Option<String>,
    /// Cache tiers the worker has, as the launcher described them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiers: Option<Value>,
    /// Fields this version does not know, preserved verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The record field naming the revision of the engine spec a worker runs: the
/// operator's `infera.amd.com/engine-revision`, the same for every role of one
/// deployment's topology. Readers that do not know it keep it as an unknown field.
pub const REVISION_FIELD: &str = "revision";

/// The record field a sidecar writes when its engine's tokenizer is in a format the
/// router cannot read (`"tiktoken"`: `tiktoken.model` or `*.tiktoken`, no
/// `tokenizer.json`): such a worker has no tokenizer canary, and a gateway routes its
/// prompts hashed as UTF-8 bytes, with a warning. Readers that do not know it keep it as
/// an unknown field.
pub const TOKENIZER_FORMAT_FIELD: &str = "tokenizer_format";

/// One engine endpoint as registered in discovery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct WorkerRecord {
    /// `"<advertise_host>:<port>"`, also the last segment of the etcd key.
    pub worker_id: String,
    /// `http://host:port` of the engine's OpenAI server.
    pub url: String,
    /// The model name the engine serves.
    pub model_name: String,
    /// Which engine runs behind this record.
    pub engine: EngineKind,
    /// The state the record states, when it states one (see [`WorkerStatus`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<WorkerStatus>,
    /// Role in prefill/decode disaggregation.
    pub disagg_mode: DisaggMode,
    /// Connector protocol and parameters (prefill/decode workers).
    pub disagg_meta: Option<DisaggMeta>,
    /// `tcp://host:port` of the engine's ZMQ KV-event publisher, if any.
    pub kv_events_endpoint: Option<String>,
    /// The engine's KV page size in tokens: the router hashes prompts at this size
    /// (`0` or `None`: unknown, the worker is routed on load only).
    pub kv_block_size: Option<u32>,
    /// The data-parallel rank this record stands for, or `None` for all ranks.
    pub dp_rank: Option<u32>,
    /// Data-parallel size of the engine as written (`None` or `0`: one rank; see
    /// [`WorkerRecord::dp_ranks`]).
    pub dp_size: Option<u32>,
    /// How requests reach the worker.
    pub request_transport: RequestTransport,
    /// The native index plane block, preserved but not routed on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv: Option<KvInfo>,
    /// Fields this version does not know, preserved verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Why a worker record or id was rejected.
#[derive(Debug, Error)]
pub enum WorkerRecordError {
    /// The bytes were not a JSON object.
    #[error("worker record is not a JSON object: {0}")]
    DecodeRecord(#[from] serde_json::Error),
    /// A key the record must have is missing.
    #[error("worker record: missing field '{field}'")]
    MissingField {
        /// The field, with its parent for nested ones (`kv.tokenizer`).
        field: String,
    },
    /// A field holds a value this reader refuses.
    #[error("worker record: field '{field}' is {found}, expected {expected}")]
    InvalidField {
        /// The field, with its parent for nested ones (`kv.engine_block_size`).
        field: String,
        /// What it may hold.
        expected: &'static str,
        /// What it holds (JSON, shortened).
        found: String,
    },
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

// ---------------------------------------------------------------------------
// Field rules (pure; each names the field in its error)
// ---------------------------------------------------------------------------

/// Whether Python's `bool()` is false for `value` (the earlier reader's `x or {}`).
fn is_falsy(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

fn invalid(field: &str, expected: &'static str, found: &Value) -> WorkerRecordError {
    let mut found = found.to_string();
    if found.len() > 80 {
        let cut = (0..=77)
            .rev()
            .find(|i| found.is_char_boundary(*i))
            .unwrap_or(0);
        found.truncate(cut);
        found.push_str("...");
    }
    WorkerRecordError::InvalidField {
        field: field.to_owned(),
        expected,
        found,
    }
}

fn missing(field: &str) -> WorkerRecordError {
    WorkerRecordError::MissingField {
        field: field.to_owned(),
    }
}

fn required_string(field: &str, value: Option<Value>) -> Result<String, WorkerRecordError> {
    match value {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(invalid(field, "a string", &other)),
        None => Err(missing(field)),
    }
}

/// A required key whose value may be `null`.
fn required_nullable_string(
    field: &str,
    value: Option<Value>,
) -> Result<Option<String>, WorkerRecordError> {
    match value {
        None => Err(missing(field)),
        Some(v) => optional_string(field, Some(v)),
    }
}

fn optional_string(field: &str, value: Option<Value>) -> Result<Option<String>, WorkerRecordError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(field, "a string or null", &other)),
    }
}

/// An enumeration by its exact wire name; `null` and other spellings are refused.
fn parse_enum<T: FromStr>(
    field: &str,
    value: Value,
    expected: &'static str,
) -> Result<T, WorkerRecordError> {
    match &value {
        Value::String(s) => s.parse().map_err(|_| invalid(field, expected, &value)),
        _ => Err(invalid(field, expected, &value)),
    }
}

/// A non-negative integer that fits `u32` (`16.0` is 16), from a JSON number only.
fn as_u32(value: &Value) -> Option<u32> {
    let n = value.as_number()?;
    if let Some(u) = n.as_u64() {
        return u32::try_from(u).ok();
    }
    let f = n.as_f64()?;
    (f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&f)).then_some(f as u32)
}

fn optional_count(field: &str, value: Option<Value>) -> Result<Option<u32>, WorkerRecordError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => as_u32(&v)
            .map(Some)
            .ok_or_else(|| invalid(field, "a non-negative integer or null", &v)),
    }
}

/// Python's `int()` on a JSON value, as the earlier `kv` reader applied it: integers
/// and decimal strings.
fn python_int(field: &str, value: &Value) -> Result<u32, WorkerRecordError> {
    let parsed = match value {
        Value::String(s) => s.trim().parse::<u32>().ok(),
        other => as_u32(other),
    };
    parsed.ok_or_else(|| {
        invalid(
            field,
            "a non-negative integer (or its decimal string)",
            value,
        )
    })
}

/// Moves the entries of `map` named in `known` into slots (in `known`'s order) and
/// returns the rest, in their original order.
fn split_fields<const N: usize>(
    map: Map<String, Value>,
    known: [&str; N],
) -> ([Option<Value>; N], Map<String, Value>) {
    let mut slots: [Option<Value>; N] = std::array::from_fn(|_| None);
    let mut extra = Map::new();
    for (key, value) in map {
        match known.iter().position(|k| *k == key) {
            Some(i) => slots[i] = Some(value),
            None => {
                extra.insert(key, value);
            }
        }
    }
    (slots, extra)
}

impl DisaggMeta {
    /// Reads a `disagg_meta` object (`field` names it in errors).
    fn from_map(field: &str, map: Map<String, Value>) -> Result<Self, WorkerRecordError> {
        let ([protocol, params], extra) = split_fields(map, ["protocol", "params"]);
        let protocol = optional_string(&format!("{field}.protocol"), protocol)?;
        let params = match params {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(other) => {
                return Err(invalid(
                    &format!("{field}.params"),
                    "an object or null",
                    &other,
                ));
            }
        };
        Ok(Self {
            protocol,
            params,
            extra,
        })
    }

    /// `disagg_meta` as the earlier reader read it: anything Python reads as false is
    /// none, an object is read, anything else is refused.
    fn from_record_value(value: Option<Value>) -> Result<Option<Self>, WorkerRecordError> {
        match value {
            None => Ok(None),
            Some(v) if is_falsy(&v) => Ok(None),
            Some(Value::Object(m)) => Self::from_map("disagg_meta", m).map(Some),
            Some(other) => Err(invalid(
                "disagg_meta",
                "an object, or null/{} for none",
                &other,
            )),
        }
    }
}

impl TryFrom<Map<String, Value>> for DisaggMeta {
    type Error = WorkerRecordError;

    fn try_from(map: Map<String, Value>) -> Result<Self, Self::Error> {
        Self::from_map("disagg_meta", map)
    }
}

impl KvInfo {
    const FIELDS: [&'static str; 10] = [
        "engine_block_size",
        "index_block_size",
        "tokenizer",
        "tokenizer_digest",
        "tokenizer_canary",
        "supports_events",
        "event_version",
        "events_endpoint",
        "snapshot_endpoint",
        "tiers",
    ];

    fn from_map(map: Map<String, Value>) -> Result<Self, WorkerRecordError> {
        let (
            [
                engine_block_size,
                index_block_size,
                tokenizer,
                tokenizer_digest,
                tokenizer_canary,
                supports_events,
                event_version,
                events_endpoint,
                snapshot_endpoint,
                tiers,
            ],
            extra,
        ) = split_fields(map, Self::FIELDS);
        let required_int = |field: &str, value: Option<Value>| {
            value
                .ok_or_else(|| missing(field))
                .and_then(|v| python_int(field, &v))
        };
        let canary = match tokenizer_canary {
            None => return Err(missing("kv.tokenizer_canary")),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|id| {
                    as_u32(id)
                        .ok_or_else(|| invalid("kv.tokenizer_canary", "a list of token ids", id))
                })
                .collect::<Result<Vec<u32>, _>>()?,
            Some(other) => {
                return Err(invalid(
                    "kv.tokenizer_canary",
                    "a list of token ids",
                    &other,
                ));
            }
        };
        Ok(Self {
            engine_block_size: required_int("kv.engine_block_size", engine_block_size)?,
            index_block_size: required_int("kv.index_block_size", index_block_size)?,
            tokenizer: required_nullable_string("kv.tokenizer", tokenizer)?,
            tokenizer_digest: required_nullable_string("kv.tokenizer_digest", tokenizer_digest)?,
            tokenizer_canary: canary,
            supports_events: supports_events.is_none_or(|v| !is_falsy(&v)),
            event_version: match event_version {
                None => 1,
                Some(v) => python_int("kv.event_version", &v)?,
            },
            events_endpoint: optional_string("kv.events_endpoint", events_endpoint)?,
            snapshot_endpoint: optional_string("kv.snapshot_endpoint", snapshot_endpoint)?,
            tiers: tiers.filter(|t| !t.is_null()),
            extra,
        })
    }

    /// `kv` as the earlier reader read it: anything Python reads as false is no block.
    fn from_record_value(value: Option<Value>) -> Result<Option<Self>, WorkerRecordError> {
        match value {
            None => Ok(None),
            Some(v) if is_falsy(&v) => Ok(None),
            Some(Value::Object(m)) => Self::from_map(m).map(Some),
            Some(other) => Err(invalid("kv", "an object, or null/{} for none", &other)),
        }
    }
}

impl TryFrom<Map<String, Value>> for KvInfo {
    type Error = WorkerRecordError;

    fn try_from(map: Map<String, Value>) -> Result<Self, Self::Error> {
        Self::from_map(map)
    }
}

impl WorkerRecord {
    const FIELDS: [&'static str; 13] = [
        "worker_id",
        "url",
        "model_name",
        "engine",
        "status",
        "disagg_mode",
        "disagg_meta",
        "kv_events_endpoint",
        "kv_block_size",
        "dp_rank",
        "dp_size",
        "request_transport",
        "kv",
    ];

    /// Decodes a record from etcd value or annotation bytes by the rules in the module
    /// doc, and checks its invariants.
    pub fn from_json(bytes: &[u8]) -> Result<Self, WorkerRecordError> {
        let map: Map<String, Value> = serde_json::from_slice(bytes)?;
        Self::from_map(map)
    }

    /// Reads a decoded JSON object by the rules in the module doc and checks its
    /// invariants.
    pub fn from_map(map: Map<String, Value>) -> Result<Self, WorkerRecordError> {
        let (
            [
                worker_id,
                url,
                model_name,
                engine,
                status,
                disagg_mode,
                disagg_meta,
                kv_events_endpoint,
                kv_block_size,
                dp_rank,
                dp_size,
                request_transport,
                kv,
            ],
            extra,
        ) = split_fields(map, Self::FIELDS);
        let status = status
            .map(|v| parse_enum("status", v, "\"active\", \"draining\" or \"dead\""))
            .transpose()?;
        let request_transport = match request_transport {
            Some(Value::String(s)) if s == "nats" => RequestTransport::Nats,
            None | Some(Value::Null | Value::String(_)) => RequestTransport::Http,
            Some(other) => {
                return Err(invalid(
                    "request_transport",
                    "a string (\"http\" or \"nats\") or null",
                    &other,
                ));
            }
        };
        let record = Self {
            worker_id: required_string("worker_id", worker_id)?,
            url: required_string("url", url)?,
            model_name: required_string("model_name", model_name)?,
            engine: engine
                .map(|v| parse_enum("engine", v, "\"sglang\", \"vllm\" or \"atom\""))
                .transpose()?
                .unwrap_or(EngineKind::Sglang),
            status,
            disagg_mode: disagg_mode
                .map(|v| parse_enum("disagg_mode", v, "\"mixed\", \"prefill\" or \"decode\""))
                .transpose()?
                .unwrap_or_default(),
            disagg_meta: DisaggMeta::from_record_value(disagg_meta)?,
            kv_events_endpoint: optional_string("kv_events_endpoint", kv_events_endpoint)?,
            kv_block_size: optional_count("kv_block_size", kv_block_size)?,
            dp_rank: optional_count("dp_rank", dp_rank)?,
            dp_size: optional_count("dp_size", dp_size)?,
            request_transport,
            kv: KvInfo::from_record_value(kv)?,
            extra,
        };
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
        if let (Some(rank), Some(size)) = (self.dp_rank, self.dp_size)
            && size > 0
            && rank >= size
        {
            return Err(WorkerRecordError::DpRankOutOfRange {
                worker_id: self.worker_id.clone(),
                dp_rank: rank,
                dp_size: size,
            });
        }
        Ok(())
    }

    /// Data-parallel ranks behind this endpoint's record: `dp_size`, or 1 when it is
    /// unset or 0 (the earlier `dp_size or 1`).
    pub fn dp_ranks(&self) -> u32 {
        self.dp_size.filter(|n| *n > 0).unwrap_or(1)
    }

    /// Whether one endpoint fronts several ranks the router addresses one by one
    /// (`dp_size > 1` and no `dp_rank`).
    pub fn is_rank_multiplexed(&self) -> bool {
        self.dp_ranks() > 1 && self.dp_rank.is_none()
    }

    /// The state the worker is in by its record (active unless it says otherwise).
    pub fn status(&self) -> WorkerStatus {
        self.status.unwrap_or_default()
    }

    /// The revision of the engine spec the worker runs ([`REVISION_FIELD`]), when the
    /// record names one (Infera's operator-made workers from 0.2.0 on).
    pub fn revision(&self) -> Option<&str> {
        self.extra.get(REVISION_FIELD)?.as_str()
    }

    /// The tokenizer format the record reports ([`TOKENIZER_FORMAT_FIELD`]), when its
    /// sidecar found one the router cannot read.
    pub fn tokenizer_format(&self) -> Option<&str> {
        self.extra.get(TOKENIZER_FORMAT_FIELD)?.as_str()
    }

    /// Names the revision the worker runs, after the fields every reader knows.
    pub fn set_revision(&mut self, revision: &str) {
        self.extra.insert(
            REVISION_FIELD.to_owned(),
            Value::String(revision.to_owned()),
        );
    }

    /// Whether a prefill and a decode worker may serve one request together: of one
    /// revision, or either naming none (a worker of the earlier system, or one started
    /// by hand).
    pub fn pairs_with(&self, other: &WorkerRecord) -> bool {
        match (self.revision(), other.revision()) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }

    /// The connector protocol, when the record names one.
    pub fn protocol(&self) -> Option<&str> {
        self.disagg_meta.as_ref()?.protocol.as_deref()
    }

    /// The connector parameters, when the record has any.
    pub fn disagg_params(&self) -> Option<&Map<String, Value>> {
        self.disagg_meta.as_ref()?.params.as_ref()
    }

    /// The ZMQ KV-event endpoint, unless unset or empty.
    pub fn events_endpoint(&self) -> Option<&str> {
        self.kv_events_endpoint.as_deref().filter(|e| !e.is_empty())
    }

    /// `disagg_meta` as the earlier `/v1/workers` showed it: the object as written, or
    /// `{}` when there is none.
    pub fn disagg_meta_view(&self) -> Value {
        self.disagg_meta
            .as_ref()
            .and_then(|m| serde_json::to_value(m).ok())
            .unwrap_or_else(|| Value::Object(Map::new()))
    }

    /// The routing targets this record stands for: one per rank when the engine runs
    /// `dp_size > 1` ranks behind one endpoint without naming a rank, else itself.
    pub fn route_targets(&self) -> Vec<RouteTarget> {
        if self.is_rank_multiplexed() {
            (0..self.dp_ranks())
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

impl TryFrom<Map<String, Value>> for WorkerRecord {
    type Error = WorkerRecordError;

    fn try_from(map: Map<String, Value>) -> Result<Self, Self::Error> {
        Self::from_map(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAUNCHER_RECORD: &str = r#"{"worker_id":"10.1.2.3:30000","url":"http://10.1.2.3:30000","model_name":"fixture-model","engine":"sglang","disagg_mode":"prefill","disagg_meta":{"protocol":"sglang-bootstrap","params":{"bootstrap_addr":"10.1.2.3:8998"}},"kv_events_endpoint":"tcp://10.1.2.3:5557","kv_block_size":64,"dp_rank":null,"dp_size":2,"request_transport":"http","kv":{"engine_block_size":64,"index_block_size":64,"tokenizer":"/models/fixture","tokenizer_digest":"0123456789abcdef","tokenizer_canary":[1,2,3],"supports_events":true,"event_version":1,"future_kv_field":"kept"},"launcher_version":"0.1.7"}"#;

    /// The shape the earlier Python launchers wrote (`json.dumps` separators, `{}` for a
    /// mixed worker's `disagg_meta`, `null` sizes).
    const EARLIER_MIXED: &str = r#"{"worker_id": "10.0.3.1:8000", "url": "http://10.0.3.1:8000", "model_name": "fixture-model", "engine": "atom", "disagg_mode": "mixed", "disagg_meta": {}, "kv_events_endpoint": null, "kv_block_size": null, "dp_rank": null, "dp_size": null, "request_transport": "http"}"#;

    fn with(base: &str, key: &str, value: Value) -> Vec<u8> {
        let mut map: Map<String, Value> = serde_json::from_str(base).unwrap();
        map.insert(key.to_owned(), value);
        serde_json::to_vec(&map).unwrap()
    }

    fn without(base: &str, key: &str) -> Vec<u8> {
        let mut map: Map<String, Value> = serde_json::from_str(base).unwrap();
        map.shift_remove(key);
        serde_json::to_vec(&map).unwrap()
    }

    #[test]
    fn round_trips_a_launcher_record_byte_for_byte() {
        let record = WorkerRecord::from_json(LAUNCHER_RECORD.as_bytes()).unwrap();
        assert_eq!(record.engine, EngineKind::Sglang);
        assert_eq!(record.disagg_mode, DisaggMode::Prefill);
        assert_eq!(record.extra["launcher_version"], "0.1.7");
        assert_eq!(record.kv.as_ref().unwrap().extra["future_kv_field"], "kept");
        assert_eq!(record.to_json(), LAUNCHER_RECORD);
        let via_serde: WorkerRecord = serde_json::from_str(LAUNCHER_RECORD).unwrap();
        assert_eq!(via_serde, record, "Deserialize is the same parse");
    }

    /// A number a record passes through is read back as written (found by the fuzz
    /// target: without correctly rounded parsing, 1.4573333333333333e62 was read one
    /// unit in the last place off, so a record did not read back as itself).
    #[test]
    fn numbers_round_trip_exactly() {
        let text = LAUNCHER_RECORD.replacen(
            r#""launcher_version":"0.1.7""#,
            r#""launcher_version":"0.1.7","kv_port":1.4573333333333333e62,"tiny":5e-324"#,
            1,
        );
        let record = WorkerRecord::from_json(text.as_bytes()).unwrap();
        assert_eq!(
            record.extra["kv_port"].as_f64(),
            Some(1.4573333333333333e62)
        );
        let again = WorkerRecord::from_json(record.to_json().as_bytes()).unwrap();
        assert_eq!(again, record);
    }

    /// The revision sits after every field the earlier readers know, and pairing
    /// follows it only when both workers name one.
    #[test]
    fn a_revision_is_written_last_and_pairs_only_its_own() {
        let mut prefill = WorkerRecord::from_json(EARLIER_MIXED.as_bytes()).unwrap();
        let unnamed = prefill.clone();
        prefill.set_revision("5f1c2a9e0b7d4c31");
        assert_eq!(
            prefill.to_json(),
            r#"{"worker_id":"10.0.3.1:8000","url":"http://10.0.3.1:8000","model_name":"fixture-model","engine":"atom","disagg_mode":"mixed","disagg_meta":null,"kv_events_endpoint":null,"kv_block_size":null,"dp_rank":null,"dp_size":null,"request_transport":"http","revision":"5f1c2a9e0b7d4c31"}"#
        );
        let read = WorkerRecord::from_json(prefill.to_json().as_bytes()).unwrap();
        assert_eq!(read.revision(), Some("5f1c2a9e0b7d4c31"));
        let mut other = read.clone();
        other.set_revision("0000000000000000");
        assert!(read.pairs_with(&prefill));
        assert!(!read.pairs_with(&other));
        assert!(unnamed.pairs_with(&other) && other.pairs_with(&unnamed));
    }

    #[test]
    fn minimal_record_gets_defaults() {
        let r = WorkerRecord::from_json(
            br#"{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"vllm"}"#,
        )
        .unwrap();
        assert_eq!(r.disagg_mode, DisaggMode::Mixed);
        assert_eq!(r.dp_ranks(), 1);
        assert_eq!(r.request_transport, RequestTransport::Http);
        assert_eq!(r.status(), WorkerStatus::Active);
        assert_eq!(
            r.to_json(),
            r#"{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"vllm","disagg_mode":"mixed","disagg_meta":null,"kv_events_endpoint":null,"kv_block_size":null,"dp_rank":null,"dp_size":null,"request_transport":"http"}"#
        );
    }

    #[test]
    fn reads_the_earlier_launchers_mixed_record() {
        let r = WorkerRecord::from_json(EARLIER_MIXED.as_bytes()).unwrap();
        assert_eq!(r.disagg_meta, None, "{{}} is no connector");
        assert_eq!((r.dp_size, r.dp_ranks()), (None, 1));
        assert_eq!(r.route_targets().len(), 1);
        assert_eq!(r.disagg_meta_view(), serde_json::json!({}));
        for empty in [
            Value::Null,
            serde_json::json!({}),
            serde_json::json!([]),
            serde_json::json!(""),
            serde_json::json!(0),
            serde_json::json!(false),
        ] {
            let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "disagg_meta", empty.clone()))
                .unwrap();
            assert_eq!(r.disagg_meta, None, "{empty}");
            let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "kv", empty.clone())).unwrap();
            assert_eq!(r.kv, None, "{empty}");
        }
        let r = WorkerRecord::from_json(&without(EARLIER_MIXED, "disagg_meta")).unwrap();
        assert_eq!(r.disagg_meta, None);
    }

    #[test]
    fn empty_and_missing_fields_mean_the_same_where_the_earlier_reader_said_so() {
        let r = WorkerRecord::from_json(&without(EARLIER_MIXED, "engine")).unwrap();
        assert_eq!(r.engine, EngineKind::Sglang);
        let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "dp_size", 0.into())).unwrap();
        assert_eq!(r.dp_ranks(), 1);
        let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "dp_size", 2.0.into())).unwrap();
        assert_eq!((r.dp_size, r.route_targets().len()), (Some(2), 2));
        for transport in [Value::Null, "".into(), "grpc".into(), "NATS".into()] {
            let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "request_transport", transport))
                .unwrap();
            assert_eq!(r.request_transport, RequestTransport::Http);
        }
        let r = WorkerRecord::from_json(&without(EARLIER_MIXED, "request_transport")).unwrap();
        assert_eq!(r.request_transport, RequestTransport::Http);
        let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "status", "draining".into())).unwrap();
        assert_eq!(r.status(), WorkerStatus::Draining);
        assert!(r.to_json().contains(r#""status":"draining""#));
        let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "dp_rank", 1.into())).unwrap();
        assert_eq!(
            r.route_targets()[0].key,
            "10.0.3.1:8000",
            "a rank without a size"
        );
        let meta = serde_json::json!({"params": {}, "note": "kept"});
        let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "disagg_meta", meta.clone())).unwrap();
        assert_eq!((r.protocol(), r.disagg_params()), (None, Some(&Map::new())));
        assert_eq!(r.disagg_meta_view(), meta);
    }

    #[test]
    fn refusals_name_the_field() {
        let refused = |bytes: Vec<u8>| WorkerRecord::from_json(&bytes).unwrap_err().to_string();
        assert_eq!(
            refused(with(EARLIER_MIXED, "engine", Value::Null)),
            r#"worker record: field 'engine' is null, expected "sglang", "vllm" or "atom""#
        );
        assert_eq!(
            refused(with(EARLIER_MIXED, "status", "ACTIVE".into())),
            r#"worker record: field 'status' is "ACTIVE", expected "active", "draining" or "dead""#
        );
        assert_eq!(
            refused(with(
                EARLIER_MIXED,
                "disagg_meta",
                "sglang-bootstrap".into()
            )),
            r#"worker record: field 'disagg_meta' is "sglang-bootstrap", expected an object, or null/{} for none"#
        );
        assert_eq!(
            refused(with(EARLIER_MIXED, "dp_size", "2".into())),
            r#"worker record: field 'dp_size' is "2", expected a non-negative integer or null"#
        );
        assert_eq!(
            refused(without(EARLIER_MIXED, "url")),
            "worker record: missing field 'url'"
        );
        let kv = serde_json::json!({"engine_block_size": 16, "index_block_size": 64, "tokenizer": null, "tokenizer_canary": []});
        assert_eq!(
            refused(with(EARLIER_MIXED, "kv", kv)),
            "worker record: missing field 'kv.tokenizer_digest'"
        );
        assert!(matches!(
            WorkerRecord::from_json(b"[1]"),
            Err(WorkerRecordError::DecodeRecord(_))
        ));
    }

    #[test]
    fn reads_the_kv_block_as_the_earlier_reader_did() {
        let kv = serde_json::json!({"engine_block_size": "16", "index_block_size": 64, "tokenizer": null, "tokenizer_digest": "0123456789abcdef", "tokenizer_canary": [], "supports_events": "false", "event_version": "2", "tiers": "device"});
        let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "kv", kv)).unwrap();
        let kv = r.kv.unwrap();
        assert_eq!((kv.engine_block_size, kv.event_version), (16, 2));
        assert!(kv.supports_events, "Python's bool(\"false\")");
        assert_eq!(kv.tokenizer, None);
        let kv = serde_json::json!({"engine_block_size": 16, "index_block_size": 64, "tokenizer": "t", "tokenizer_digest": "d", "tokenizer_canary": [1]});
        let r = WorkerRecord::from_json(&with(EARLIER_MIXED, "kv", kv)).unwrap();
        let kv = r.kv.unwrap();
        assert!(kv.supports_events && kv.event_version == 1, "defaults");
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
