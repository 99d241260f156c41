//! Decoding of engine KV-event batches (the last ZMQ frame, or a relayed NATS message).
//!
//! Engines encode a batch `ts, events, data_parallel_rank` with msgspec/msgpack, and the
//! layout differs between engine versions, so the decoder reads all three:
//!
//! | layout | batch | event | who emits it |
//! | --- | --- | --- | --- |
//! | [`KvEventLayout::Array`] | array | `["BlockStored", field, ...]` | SGLang, vLLM 0.10.x |
//! | [`KvEventLayout::TaggedMap`] | array | `{"type": "BlockStored", ...}` | vLLM 0.25.x, ATOM |
//! | [`KvEventLayout::MapBatch`] | map | `{"type": "BlockStored", ...}` | vLLM main |
//!
//! Array events hold fields in declaration order (msgspec writes them all, but a decoder
//! must also accept shorter arrays from encoders that drop trailing defaults); map events
//! omit default-valued fields. Hashes are ints or bytes. The decoder never guesses:
//! a batch it cannot read is an error the caller must count and log, because a wrong
//! decoder means an empty view and a silent 0% hit rate.

use rmpv::Value;
use thiserror::Error;

pub mod encode;

/// The engine's identity for a block: an integer or a byte digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EngineBlockHash {
    /// Integer hash (SGLang; vLLM with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`).
    /// Wide enough for both signed and unsigned 64-bit values.
    Int(i128),
    /// Byte digest (vLLM's default sha256 block hashes).
    Bytes(Vec<u8>),
}

/// The batch layout detected while decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEventLayout {
    /// Array batch holding array events.
    Array,
    /// Array batch holding tagged-map events.
    TaggedMap,
    /// Map batch holding tagged-map events.
    MapBatch,
}

/// Blocks entered the engine's cache.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    /// Engine hashes of the stored blocks, in chain order.
    pub block_hashes: Vec<EngineBlockHash>,
    /// Engine hash of the block before the first one, if any.
    pub parent_block_hash: Option<EngineBlockHash>,
    /// Token ids of all stored blocks, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// Deprecated numeric LoRA id.
    pub lora_id: Option<i64>,
    /// Where the blocks live (`GPU`, `CPU`, ...).
    pub medium: Option<String>,
    /// LoRA adapter name; blocks match only within the same adapter.
    pub lora_name: Option<String>,
    /// Per-block extra hash keys (multimodal ids, LoRA, salt), kept opaque.
    pub extra_keys: Option<Value>,
    /// KV cache group of a hybrid model.
    pub group_idx: Option<u32>,
    /// Attention kind of the group (`full_attention`, `mamba`, ...).
    pub kv_cache_spec_kind: Option<String>,
    /// Sliding window of the group, if any.
    pub kv_cache_spec_sliding_window: Option<u32>,
}

/// Attention kinds whose blocks form a reusable prefix; other groups (Mamba state,
/// sliding windows) do not and are skipped by the router.
pub const PREFIX_CACHE_KINDS: [&str; 3] =
    ["full_attention", "mla_attention", "sink_full_attention"];

impl BlockStored {
    /// Whether the router should index these blocks: the group is full, MLA or sink
    /// attention, or the engine does not say (older engines have only full attention).
    pub fn is_prefix_cache_kind(&self) -> bool {
        self.kv_cache_spec_kind
            .as_deref()
            .is_none_or(|kind| PREFIX_CACHE_KINDS.contains(&kind))
    }
}

/// Blocks left the engine's cache.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockRemoved {
    /// Engine hashes of the removed blocks.
    pub block_hashes: Vec<EngineBlockHash>,
    /// Where they lived.
    pub medium: Option<String>,
    /// KV cache group.
    pub group_idx: Option<u32>,
}

/// One KV cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Blocks stored.
    BlockStored(BlockStored),
    /// Blocks removed.
    BlockRemoved(BlockRemoved),
    /// The whole cache was cleared.
    AllBlocksCleared,
}

/// A decoded batch.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventBatch {
    /// Engine wall-clock timestamp (seconds).
    pub ts: f64,
    /// Events in order.
    pub events: Vec<KvEvent>,
    /// Data-parallel rank the batch came from, when the engine says.
    pub data_parallel_rank: Option<u32>,
    /// Which layout the bytes were in.
    pub layout: KvEventLayout,
}

/// Why a batch could not be decoded.
#[derive(Debug, Error, PartialEq)]
pub enum DecodeKvEventError {
    /// The payload is not one msgpack value.
    #[error("KV event payload is not msgpack: {0}")]
    NotMsgpack(String),
    /// The payload has bytes after the batch.
    #[error("KV event payload has {0} trailing bytes after the batch")]
    TrailingBytes(usize),
    /// A value has the wrong shape.
    #[error("KV event {at}: expected {expected}")]
    Shape {
        /// Where in the batch.
        at: String,
        /// What was expected there.
        expected: &'static str,
    },
    /// A required field is missing.
    #[error("KV event {event}: missing field {field}")]
    MissingField {
        /// Event type.
        event: &'static str,
        /// Field name.
        field: &'static str,
    },
    /// The event tag is not one this decoder knows.
    #[error("unknown KV event type {0:?}")]
    UnknownEvent(String),
}

type Result<T> = std::result::Result<T, DecodeKvEventError>;

fn shape(at: impl Into<String>, expected: &'static str) -> DecodeKvEventError {
    DecodeKvEventError::Shape {
        at: at.into(),
        expected,
    }
}

/// Decodes one batch payload in whichever layout it is in.
pub fn decode_kv_event_batch(payload: &[u8]) -> Result<KvEventBatch> {
    let mut cursor = payload;
    let value = rmpv::decode::read_value(&mut cursor)
        .map_err(|e| DecodeKvEventError::NotMsgpack(e.to_string()))?;
    if !cursor.is_empty() {
        return Err(DecodeKvEventError::TrailingBytes(cursor.len()));
    }
    match value {
        Value::Array(items) => {
            let ts = items.first().ok_or_else(|| shape("batch", "ts"))?;
            let events = items.get(1).ok_or_else(|| shape("batch", "events"))?;
            let rank = items.get(2);
            decode_batch(ts, events, rank, false)
        }
        Value::Map(entries) => {
            let ts = map_get(&entries, "ts").ok_or_else(|| shape("batch", "ts"))?;
            let events = map_get(&entries, "events").ok_or_else(|| shape("batch", "events"))?;
            let rank = map_get(&entries, "data_parallel_rank");
            decode_batch(ts, events, rank, true)
        }
        _ => Err(shape("batch", "an array or a map")),
    }
}

fn decode_batch(
    ts: &Value,
    events: &Value,
    rank: Option<&Value>,
    map_batch: bool,
) -> Result<KvEventBatch> {
    let ts = ts.as_f64().ok_or_else(|| shape("batch.ts", "a number"))?;
    let events = events
        .as_array()
        .ok_or_else(|| shape("batch.events", "an array"))?;
    let data_parallel_rank = opt_u32(rank, "batch.data_parallel_rank")?;
    let mut layout = if map_batch {
        KvEventLayout::MapBatch
    } else {
        KvEventLayout::Array
    };
    let mut decoded = Vec::with_capacity(events.len());
    for (i, event) in events.iter().enumerate() {
        let at = format!("events[{i}]");
        decoded.push(match event {
            Value::Array(fields) => decode_array_event(fields, &at)?,
            Value::Map(entries) => {
                if !map_batch {
                    layout = KvEventLayout::TaggedMap;
                }
                decode_map_event(entries, &at)?
            }
            _ => return Err(shape(at, "an array or a map")),
        });
    }
    Ok(KvEventBatch {
        ts,
        events: decoded,
        data_parallel_rank,
        layout,
    })
}

fn decode_array_event(fields: &[Value], at: &str) -> Result<KvEvent> {
    let tag = fields
        .first()
        .and_then(Value::as_str)
        .ok_or_else(|| shape(format!("{at}[0]"), "the event type string"))?;
    let field = |i: usize| fields.get(i).filter(|v| !v.is_nil());
    match tag {
        "BlockStored" => Ok(KvEvent::BlockStored(BlockStored {
            block_hashes: hashes(required(field(1), "BlockStored", "block_hashes")?, at)?,
            parent_block_hash: field(2).map(|v| hash(v, at)).transpose()?,
            token_ids: tokens(required(field(3), "BlockStored", "token_ids")?, at)?,
            block_size: u32_of(required(field(4), "BlockStored", "block_size")?, at)?,
            lora_id: field(5).map(|v| i64_of(v, at)).transpose()?,
            medium: field(6).map(|v| string(v, at)).transpose()?,
            lora_name: field(7).map(|v| string(v, at)).transpose()?,
            extra_keys: field(8).cloned(),
            group_idx: field(9).map(|v| u32_of(v, at)).transpose()?,
            kv_cache_spec_kind: field(10).map(|v| string(v, at)).transpose()?,
            kv_cache_spec_sliding_window: field(11).map(|v| u32_of(v, at)).transpose()?,
        })),
        "BlockRemoved" => Ok(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes(required(field(1), "BlockRemoved", "block_hashes")?, at)?,
            medium: field(2).map(|v| string(v, at)).transpose()?,
            group_idx: field(3).map(|v| u32_of(v, at)).transpose()?,
        })),
        "AllBlocksCleared" => Ok(KvEvent::AllBlocksCleared),
        other => Err(DecodeKvEventError::UnknownEvent(other.to_owned())),
    }
}

fn decode_map_event(entries: &[(Value, Value)], at: &str) -> Result<KvEvent> {
    let tag = map_get(entries, "type")
        .and_then(Value::as_str)
        .ok_or_else(|| shape(format!("{at}.type"), "the event type string"))?;
    let field = |name: &str| map_get(entries, name).filter(|v| !v.is_nil());
    match tag {
        "BlockStored" => Ok(KvEvent::BlockStored(BlockStored {
            block_hashes: hashes(
                required(field("block_hashes"), "BlockStored", "block_hashes")?,
                at,
            )?,
            parent_block_hash: field("parent_block_hash")
                .map(|v| hash(v, at))
                .transpose()?,
            token_ids: tokens(
                required(field("token_ids"), "BlockStored", "token_ids")?,
                at,
            )?,
            block_size: u32_of(
                required(field("block_size"), "BlockStored", "block_size")?,
                at,
            )?,
            lora_id: field("lora_id").map(|v| i64_of(v, at)).transpose()?,
            medium: field("medium").map(|v| string(v, at)).transpose()?,
            lora_name: field("lora_name").map(|v| string(v, at)).transpose()?,
            extra_keys: field("extra_keys").cloned(),
            group_idx: field("group_idx").map(|v| u32_of(v, at)).transpose()?,
            kv_cache_spec_kind: field("kv_cache_spec_kind")
                .map(|v| string(v, at))
                .transpose()?,
            kv_cache_spec_sliding_window: field("kv_cache_spec_sliding_window")
                .map(|v| u32_of(v, at))
                .transpose()?,
        })),
        "BlockRemoved" => Ok(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes(
                required(field("block_hashes"), "BlockRemoved", "block_hashes")?,
                at,
            )?,
            medium: field("medium").map(|v| string(v, at)).transpose()?,
            group_idx: field("group_idx").map(|v| u32_of(v, at)).transpose()?,
        })),
        "AllBlocksCleared" => Ok(KvEvent::AllBlocksCleared),
        other => Err(DecodeKvEventError::UnknownEvent(other.to_owned())),
    }
}

fn map_get<'v>(entries: &'v [(Value, Value)], key: &str) -> Option<&'v Value> {
    entries
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

fn required<'v>(
    value: Option<&'v Value>,
    event: &'static str,
    field: &'static str,
) -> Result<&'v Value> {
    value.ok_or(DecodeKvEventError::MissingField { event, field })
}

fn hash(value: &Value, at: &str) -> Result<EngineBlockHash> {
    match value {
        Value::Binary(bytes) => Ok(EngineBlockHash::Bytes(bytes.clone())),
        Value::Integer(int) => int
            .as_u64()
            .map(i128::from)
            .or_else(|| int.as_i64().map(i128::from))
            .map(EngineBlockHash::Int)
            .ok_or_else(|| shape(at, "an integer hash")),
        _ => Err(shape(at, "a block hash (int or bytes)")),
    }
}

fn hashes(value: &Value, at: &str) -> Result<Vec<EngineBlockHash>> {
    value
        .as_array()
        .ok_or_else(|| shape(at, "a list of block hashes"))?
        .iter()
        .map(|v| hash(v, at))
        .collect()
}

fn tokens(value: &Value, at: &str) -> Result<Vec<u32>> {
    value
        .as_array()
        .ok_or_else(|| shape(at, "a list of token ids"))?
        .iter()
        .map(|v| u32_of(v, at))
        .collect()
}

fn u32_of(value: &Value, at: &str) -> Result<u32> {
    value
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| shape(at, "an unsigned 32-bit integer"))
}

fn opt_u32(value: Option<&Value>, at: &str) -> Result<Option<u32>> {
    value
        .filter(|v| !v.is_nil())
        .map(|v| u32_of(v, at))
        .transpose()
}

fn i64_of(value: &Value, at: &str) -> Result<i64> {
    value.as_i64().ok_or_else(|| shape(at, "an integer"))
}

fn string(value: &Value, at: &str) -> Result<String> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| shape(at, "a string"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value as Json, json};

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/testdata/kv_events/{name}.msgpack",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(path).unwrap()
    }

    fn expected() -> Json {
        serde_json::from_str(include_str!("../testdata/kv_events/expected.json")).unwrap()
    }

    fn norm_hash(h: &EngineBlockHash) -> Json {
        match h {
            EngineBlockHash::Int(i) => json!(format!("i:{i}")),
            EngineBlockHash::Bytes(b) => json!(format!("b:{}", hex::encode(b))),
        }
    }

    /// The same normalized view `make_fixtures.py` writes to expected.json.
    fn normalize(batch: &KvEventBatch) -> Json {
        let events: Vec<Json> = batch
            .events
            .iter()
            .map(|e| match e {
                KvEvent::AllBlocksCleared => json!({"type": "AllBlocksCleared"}),
                KvEvent::BlockRemoved(r) => json!({
                    "type": "BlockRemoved",
                    "block_hashes": r.block_hashes.iter().map(norm_hash).collect::<Vec<_>>(),
                    "medium": r.medium,
                    "group_idx": r.group_idx,
                }),
                KvEvent::BlockStored(s) => json!({
                    "type": "BlockStored",
                    "block_hashes": s.block_hashes.iter().map(norm_hash).collect::<Vec<_>>(),
                    "parent_block_hash": s.parent_block_hash.as_ref().map(norm_hash),
                    "token_ids": s.token_ids,
                    "block_size": s.block_size,
                    "lora_id": s.lora_id,
                    "medium": s.medium,
                    "lora_name": s.lora_name,
                    "group_idx": s.group_idx,
                    "kv_cache_spec_kind": s.kv_cache_spec_kind,
                    "kv_cache_spec_sliding_window": s.kv_cache_spec_sliding_window,
                }),
            })
            .collect();
        json!({"ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank, "events": events})
    }

    #[test]
    fn decodes_every_layout_as_msgspec_wrote_it() {
        let expected = expected();
        let cases = [
            ("sglang", KvEventLayout::Array),
            ("vllm-array", KvEventLayout::Array),
            ("vllm-tagged-map", KvEventLayout::TaggedMap),
            ("vllm-map-batch", KvEventLayout::MapBatch),
        ];
        assert_eq!(expected.as_object().unwrap().len(), cases.len());
        for (name, layout) in cases {
            let batch = decode_kv_event_batch(&fixture(name)).unwrap();
            assert_eq!(batch.layout, layout, "{name}");
            assert_eq!(normalize(&batch), expected[name], "{name}");
        }
    }

    #[test]
    fn int_hashes_span_signed_and_unsigned_64_bit() {
        let batch = decode_kv_event_batch(&fixture("vllm-array")).unwrap();
        let KvEvent::BlockStored(s) = &batch.events[0] else {
            panic!()
        };
        assert_eq!(
            s.block_hashes,
            vec![
                EngineBlockHash::Int(u64::MAX as i128),
                EngineBlockHash::Int(-5)
            ]
        );
        assert_eq!(batch.data_parallel_rank, Some(1));
    }

    #[test]
    fn only_prefix_cache_kinds_are_indexed() {
        let batch = decode_kv_event_batch(&fixture("vllm-tagged-map")).unwrap();
        let kinds: Vec<bool> = batch
            .events
            .iter()
            .filter_map(|e| match e {
                KvEvent::BlockStored(s) => Some(s.is_prefix_cache_kind()),
                _ => None,
            })
            .collect();
        // full_attention, mla_attention kept; mamba skipped.
        assert_eq!(kinds, vec![true, true, false]);
        let sink = decode_kv_event_batch(&fixture("vllm-map-batch")).unwrap();
        let KvEvent::BlockStored(s) = &sink.events[1] else {
            panic!()
        };
        assert!(
            !s.is_prefix_cache_kind(),
            "sliding_window is not a prefix kind"
        );
        assert!(
            BlockStored::default().is_prefix_cache_kind(),
            "no kind means full attention"
        );
    }

    #[test]
    fn undecodable_batches_are_errors_not_empty_views() {
        for truncated in [&b""[..], b"\x92\xcb\x3f"] {
            assert!(matches!(
                decode_kv_event_batch(truncated),
                Err(DecodeKvEventError::NotMsgpack(_))
            ));
        }
        assert!(matches!(
            decode_kv_event_batch(b"\x05"),
            Err(DecodeKvEventError::Shape { .. })
        ));
        // [1.0, [["Mystery"]]]
        let unknown = b"\x92\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x91\x91\xa7Mystery";
        assert_eq!(
            decode_kv_event_batch(unknown),
            Err(DecodeKvEventError::UnknownEvent("Mystery".into()))
        );
        // [1.0, [["BlockStored"]]]: fields missing.
        let missing = b"\x92\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x91\x91\xabBlockStored";
        assert_eq!(
            decode_kv_event_batch(missing),
            Err(DecodeKvEventError::MissingField {
                event: "BlockStored",
                field: "block_hashes"
            })
        );
        let mut trailing = fixture("sglang");
        trailing.push(0);
        assert_eq!(
            decode_kv_event_batch(&trailing),
            Err(DecodeKvEventError::TrailingBytes(1))
        );
    }
}
