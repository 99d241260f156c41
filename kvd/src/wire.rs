//! The wire protocol (pure): frames are a u32 big-endian length and a msgpack map, `op`
//! first. Requests are parsed with every field checked (a missing or mistyped field is a
//! `bad_field` error naming it); replies are encoded with their fields in the order of
//! the contract's table, every field present, so the bytes equal the earlier daemon's.

use infera_proto::retention::Retention;
use rmpv::Value;
use std::str::FromStr;

/// Protocol version spoken.
pub const PROTOCOL_VERSION: i64 = 1;
/// Length of a key.
pub const KEY_LEN: usize = 8;

/// A block key.
pub type Key = [u8; KEY_LEN];

/// Which model's entries an op is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    /// Model name ("" = none given).
    pub model: String,
    /// Compatibility key (dtype, parallelism, ...; "" = none given).
    pub compat_key: String,
}

impl Scope {
    /// Whether a `clear` of `self` covers entries of `scope` (`""` fields match all).
    pub fn covers(&self, scope: &Scope) -> bool {
        (self.model.is_empty() || self.model == scope.model)
            && (self.compat_key.is_empty() || self.compat_key == scope.compat_key)
    }
}

/// One value to store.
#[derive(Debug, Clone, PartialEq)]
pub struct SetItem {
    /// Key.
    pub key: Key,
    /// Bytes.
    pub value: Vec<u8>,
    /// Retention class.
    pub retention: Retention,
    /// Seconds to live (`None`: no expiry; `<= 0`: not stored).
    pub ttl_seconds: Option<i64>,
}

/// Where a key is held, as `lookup_tier` names it: the earlier contract's `miss`, `ram`
/// and `file` (the NVMe tier), and `remote` (the shared Redis/Valkey tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Nowhere.
    Miss,
    /// kvd's RAM (the arena or its heap).
    Ram,
    /// The NVMe tier.
    File,
    /// The shared tier every kvd of the model reaches.
    Remote,
}

impl Location {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Miss => "miss",
            Self::Ram => "ram",
            Self::File => "file",
            Self::Remote => "remote",
        }
    }

    /// The tier of a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "miss" => Self::Miss,
            "ram" => Self::Ram,
            "file" => Self::File,
            "remote" => Self::Remote,
            _ => return None,
        })
    }
}

/// A request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Handshake.
    Hello {
        /// Client name.
        client_id: String,
        /// Its protocol version.
        protocol_version: i64,
        /// Whether it wants the arena fd.
        prefers_shared_arena: bool,
    },
    /// One key.
    Get {
        /// Key.
        key: Key,
        /// Scope.
        scope: Scope,
    },
    /// Several keys.
    BatchGet {
        /// Keys.
        keys: Vec<Key>,
        /// Scope.
        scope: Scope,
    },
    /// One value.
    Set {
        /// The value.
        item: SetItem,
        /// Scope.
        scope: Scope,
    },
    /// Several values.
    BatchSet {
        /// The values.
        items: Vec<SetItem>,
        /// Scope.
        scope: Scope,
    },
    /// Lease an arena slot for a zero-copy write.
    SetReserve {
        /// Payload bytes wanted.
        size: u64,
    },
    /// Publish a leased slot under a key.
    SetCommit {
        /// Lease.
        lease_token: u64,
        /// Key.
        key: Key,
        /// Payload bytes written.
        length: u64,
        /// Scope.
        scope: Scope,
        /// Retention.
        retention: Retention,
        /// Seconds to live (0: no expiry).
        ttl_seconds: i64,
    },
    /// Give a lease back.
    SetCancel {
        /// Lease.
        lease_token: u64,
    },
    /// Warm these keys (no reply).
    PrefetchHint {
        /// Keys.
        keys: Vec<Key>,
        /// Scope.
        scope: Scope,
        /// Warming later than this many milliseconds is pointless.
        deadline_ms: u64,
    },
    /// Which keys are present.
    Exists {
        /// Keys.
        keys: Vec<Key>,
        /// Scope.
        scope: Scope,
    },
    /// Where each key is held (an Infera extension: the earlier contract's
    /// `lookup_tier` for several keys in one round trip). Reads no value and counts no
    /// get.
    BatchLookupTier {
        /// Keys.
        keys: Vec<Key>,
        /// Scope.
        scope: Scope,
    },
    /// Drop a scope's entries.
    Clear {
        /// Scope ("" matches everything).
        scope: Scope,
    },
    /// Counters.
    Stats,
}

/// A request that cannot be served: the `error` reply's code and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    /// `malformed_frame`, `unknown_op`, `bad_field`, `bad_retention`,
    /// `value_too_large` or `protocol_version`.
    pub code: &'static str,
    /// What is wrong, naming the field.
    pub message: String,
}

impl WireError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The reply.
    pub fn reply(&self) -> Reply {
        Reply::Error {
            code: self.code.into(),
            message: self.message.clone(),
        }
    }
}

struct Fields<'a> {
    op: &'a str,
    map: &'a [(Value, Value)],
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.map
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v)
            .filter(|v| !v.is_nil())
    }

    fn bad(&self, name: &str, want: &str) -> WireError {
        WireError::new(
            "bad_field",
            format!("{}: field {name:?} must be {want}", self.op),
        )
    }

    fn required(&self, name: &str, want: &str) -> Result<&'a Value, WireError> {
        self.get(name).ok_or_else(|| {
            WireError::new(
                "bad_field",
                format!("{}: field {name:?} ({want}) is missing", self.op),
            )
        })
    }

    fn str_or(&self, name: &str, default: &str) -> Result<String, WireError> {
        match self.get(name) {
            None => Ok(default.to_owned()),
            Some(v) => v
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| self.bad(name, "a string")),
        }
    }

    fn uint(&self, name: &str) -> Result<u64, WireError> {
        self.required(name, "a non-negative integer")?
            .as_u64()
            .ok_or_else(|| self.bad(name, "a non-negative integer"))
    }

    fn int_or(&self, name: &str, default: Option<i64>) -> Result<Option<i64>, WireError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.bad(name, "an integer or nil")),
        }
    }

    fn bool_or(&self, name: &str, default: bool) -> Result<bool, WireError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(name, "a boolean")),
        }
    }

    fn bytes(&self, name: &str) -> Result<&'a [u8], WireError> {
        self.required(name, "bin")?
            .as_slice()
            .ok_or_else(|| self.bad(name, "bin"))
    }

    fn key(&self, name: &str) -> Result<Key, WireError> {
        key_of(self.bytes(name)?).ok_or_else(|| self.bad(name, "bin of 8 bytes"))
    }

    fn list(&self, name: &str) -> Result<&'a [Value], WireError> {
        match self.required(name, "a list")? {
            Value::Array(a) => Ok(a),
            _ => Err(self.bad(name, "a list")),
        }
    }

    fn keys(&self, name: &str) -> Result<Vec<Key>, WireError> {
        self.list(name)?
            .iter()
            .map(|v| {
                v.as_slice()
                    .and_then(key_of)
                    .ok_or_else(|| self.bad(name, "a list of 8-byte bins"))
            })
            .collect()
    }

    fn scope(&self) -> Result<Scope, WireError> {
        Ok(Scope {
            model: self.str_or("model", "")?,
            compat_key: self.str_or("compat_key", "")?,
        })
    }
}

fn key_of(bytes: &[u8]) -> Option<Key> {
    bytes.try_into().ok()
}

/// A retention name (`default` is the default class, short).
pub fn parse_retention(name: &str) -> Result<Retention, WireError> {
    if name == "default" {
        return Ok(Retention::Short);
    }
    Retention::from_str(name).map_err(|_| {
        WireError::new(
            "bad_retention",
            format!("retention {name:?}: expected none, ephemeral, short or long"),
        )
    })
}

fn retention_value(v: Option<&Value>, default: &str) -> Result<Retention, WireError> {
    match v {
        None => parse_retention(default),
        Some(Value::String(s)) => parse_retention(s.as_str().unwrap_or("")),
        Some(_) => Err(WireError::new(
            "bad_retention",
            "retention must be a string",
        )),
    }
}

fn check_size(value: &[u8], max_value: usize) -> Result<(), WireError> {
    if value.len() > max_value {
        return Err(WireError::new(
            "value_too_large",
            format!(
                "value of {} bytes exceeds --max-value-bytes {max_value}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Parses a frame body (the msgpack map). `max_value` bounds every stored value.
pub fn parse_request(body: &[u8], max_value: usize) -> Result<Request, WireError> {
    let mut cursor = body;
    let value = rmpv::decode::read_value(&mut cursor)
        .map_err(|e| WireError::new("malformed_frame", format!("not msgpack: {e}")))?;
    if !cursor.is_empty() {
        return Err(WireError::new(
            "malformed_frame",
            format!("{} bytes after the map", cursor.len()),
        ));
    }
    let Value::Map(map) = &value else {
        return Err(WireError::new("malformed_frame", "the frame is not a map"));
    };
    let op = map
        .iter()
        .find(|(k, _)| k.as_str() == Some("op"))
        .and_then(|(_, v)| v.as_str())
        .ok_or_else(|| WireError::new("malformed_frame", "the map has no string \"op\""))?;
    let f = Fields { op, map };
    Ok(match op {
        "hello" => Request::Hello {
            client_id: f.str_or("client_id", "")?,
            protocol_version: f
                .int_or("protocol_version", Some(PROTOCOL_VERSION))?
                .unwrap_or(PROTOCOL_VERSION),
            prefers_shared_arena: f.bool_or("prefers_shared_arena", false)?,
        },
        "get" => Request::Get {
            key: f.key("key")?,
            scope: f.scope()?,
        },
        "batch_get" => Request::BatchGet {
            keys: f.keys("keys")?,
            scope: f.scope()?,
        },
        "set" => {
            let value = f.bytes("value")?;
            check_size(value, max_value)?;
            Request::Set {
                item: SetItem {
                    key: f.key("key")?,
                    value: value.to_vec(),
                    retention: retention_value(f.get("retention"), "short")?,
                    ttl_seconds: f.int_or("ttl_seconds", None)?,
                },
                scope: f.scope()?,
            }
        }
        "batch_set" => {
            let keys = f.keys("keys")?;
            let values = f.list("values")?;
            let retentions = f
                .get("retentions")
                .map(|_| f.list("retentions"))
                .transpose()?;
            let ttls = f
                .get("ttls_seconds")
                .map(|_| f.list("ttls_seconds"))
                .transpose()?;
            if values.len() != keys.len()
                || retentions.is_some_and(|r| r.len() != keys.len())
                || ttls.is_some_and(|t| t.len() != keys.len())
            {
                return Err(f.bad(
                    "values",
                    "a list as long as keys (and so retentions, ttls_seconds)",
                ));
            }
            let mut items = Vec::with_capacity(keys.len());
            for (i, key) in keys.into_iter().enumerate() {
                let value = values[i]
                    .as_slice()
                    .ok_or_else(|| f.bad("values", "a list of bins"))?;
                check_size(value, max_value)?;
                let ttl_seconds = match ttls.map(|t| &t[i]) {
                    None | Some(Value::Nil) => None,
                    Some(v) => Some(
                        v.as_i64()
                            .ok_or_else(|| f.bad("ttls_seconds", "integers or nil"))?,
                    ),
                };
                items.push(SetItem {
                    key,
                    value: value.to_vec(),
                    retention: retention_value(
                        retentions.map(|r| &r[i]).filter(|v| !v.is_nil()),
                        "short",
                    )?,
                    ttl_seconds,
                });
            }
            Request::BatchSet {
                items,
                scope: f.scope()?,
            }
        }
        "set_reserve" => Request::SetReserve {
            size: f.uint("size")?,
        },
        "set_commit" => Request::SetCommit {
            lease_token: f.uint("lease_token")?,
            key: f.key("key")?,
            length: f.uint("length")?,
            scope: f.scope()?,
            retention: retention_value(f.get("retention"), "default")?,
            ttl_seconds: f.int_or("ttl_seconds", Some(0))?.unwrap_or(0),
        },
        "set_cancel" => Request::SetCancel {
            lease_token: f.uint("lease_token")?,
        },
        "prefetch_hint" => Request::PrefetchHint {
            keys: f.keys("keys")?,
            scope: f.scope()?,
            deadline_ms: u64::try_from(f.int_or("deadline_ms", Some(1000))?.unwrap_or(1000))
                .unwrap_or(0),
        },
        "exists" => Request::Exists {
            keys: f.keys("keys")?,
            scope: f.scope()?,
        },
        "batch_lookup_tier" => Request::BatchLookupTier {
            keys: f.keys("keys")?,
            scope: f.scope()?,
        },
        "clear" => Request::Clear { scope: f.scope()? },
        "stats" => Request::Stats,
        other => {
            return Err(WireError::new(
                "unknown_op",
                format!("unknown op {other:?}"),
            ));
        }
    })
}

/// The counters of a `stats_response`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Entries held.
    pub entries: u64,
    /// RAM held (arena slots and spilled values).
    pub host_bytes: u64,
    /// Values held outside the arena (larger than a slot).
    pub spillover_bytes: u64,
    /// Bytes of `long` entries.
    pub long_bytes: u64,
    /// Keys asked for.
    pub gets_total: u64,
    /// Values offered.
    pub sets_total: u64,
    /// Keys found.
    pub hits_total: u64,
    /// Keys not found.
    pub misses_total: u64,
    /// Entries evicted.
    pub evictions_total: u64,
}

/// A reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Handshake answer; `arena` = (arena size, slot size, server pid).
    HelloAck {
        /// Daemon name.
        server_id: String,
        /// The arena, when offered.
        arena: Option<(u64, u64, u32)>,
    },
    /// Inline value.
    GetResponse {
        /// Bytes, or nil on a miss.
        value: Option<Vec<u8>>,
        /// Its retention.
        retention: Option<Retention>,
    },
    /// Value in the arena.
    GetSharedResponse {
        /// Payload offset in the memfd.
        slot_offset: u64,
        /// Payload length.
        length: u64,
        /// Slot version (even) to check around the read.
        version: u32,
        /// Retention.
        retention: Retention,
        /// Slot size.
        slot_size: u64,
    },
    /// Inline values.
    BatchGetResponse {
        /// Values.
        values: Vec<Option<Vec<u8>>>,
        /// Retentions.
        retentions: Vec<Option<Retention>>,
    },
    /// Values in the arena (misses: offset -1, length 0, version 0).
    BatchGetSharedResponse {
        /// Payload offsets.
        offsets: Vec<i64>,
        /// Lengths.
        lengths: Vec<u64>,
        /// Versions.
        versions: Vec<u32>,
        /// Retentions.
        retentions: Vec<Option<Retention>>,
        /// Slot size.
        slot_size: u64,
    },
    /// A set's outcome.
    SetAck {
        /// Stored.
        accepted: bool,
        /// Why not.
        reason: Option<String>,
    },
    /// A batch's outcomes.
    BatchSetAck {
        /// Stored, per key.
        accepted: Vec<bool>,
        /// Why not, per key.
        reasons: Vec<Option<String>>,
    },
    /// A lease (or why none).
    SetReserveResponse {
        /// Lease token (0: none).
        lease_token: u64,
        /// Slot (-1: none).
        slot_id: i64,
        /// Where to write (-1: none).
        payload_offset: i64,
        /// Most bytes the slot holds.
        payload_max_size: u64,
        /// "" or why not.
        reason: String,
    },
    /// A commit's outcome.
    SetCommitResponse {
        /// Published.
        accepted: bool,
        /// Why not.
        reason: Option<String>,
    },
    /// Lease released.
    SetCancelResponse,
    /// Presence per key.
    ExistsResponse {
        /// Present.
        present: Vec<bool>,
    },
    /// The tier holding each key.
    BatchLookupTierResponse {
        /// Per key, the fastest tier holding it.
        tiers: Vec<Location>,
    },
    /// Entries dropped.
    ClearAck {
        /// How many.
        cleared_entries: u64,
    },
    /// Counters.
    StatsResponse(Stats),
    /// A failure.
    Error {
        /// Code.
        code: String,
        /// Message.
        message: String,
    },
}

fn s(v: &str) -> Value {
    Value::from(v)
}

fn opt_bin(v: &Option<Vec<u8>>) -> Value {
    v.as_ref().map_or(Value::Nil, |b| Value::Binary(b.clone()))
}

fn opt_retention(r: Option<Retention>) -> Value {
    r.map_or(Value::Nil, |r| s(r.as_str()))
}

fn opt_str(v: &Option<String>) -> Value {
    v.as_deref().map_or(Value::Nil, s)
}

fn list<T>(items: &[T], f: impl Fn(&T) -> Value) -> Value {
    Value::Array(items.iter().map(f).collect())
}

impl Reply {
    /// Like [`Self::to_value`], moving the values' bytes instead of copying them (what
    /// the server sends: a value can be tens of megabytes).
    pub fn into_value(self) -> Value {
        match self {
            Self::GetResponse { value, retention } => op_map(
                "get_response",
                vec![
                    ("value", value.map_or(Value::Nil, Value::Binary)),
                    ("retention", opt_retention(retention)),
                ],
            ),
            Self::BatchGetResponse { values, retentions } => op_map(
                "batch_get_response",
                vec![
                    (
                        "values",
                        Value::Array(
                            values
                                .into_iter()
                                .map(|v| v.map_or(Value::Nil, Value::Binary))
                                .collect(),
                        ),
                    ),
                    ("retentions", list(&retentions, |r| opt_retention(*r))),
                ],
            ),
            other => other.to_value(),
        }
    }

    /// The op name and fields, in the contract's order.
    pub fn to_value(&self) -> Value {
        let (op, fields): (&str, Vec<(&str, Value)>) = match self {
            Self::HelloAck { server_id, arena } => (
                "hello_ack",
                vec![
                    ("server_id", s(server_id)),
                    ("protocol_version", Value::from(PROTOCOL_VERSION)),
                    (
                        "shared_arena",
                        arena.map_or(Value::Nil, |(size, slot, pid)| {
                            Value::Array(vec![
                                Value::from(size),
                                Value::from(slot),
                                Value::from(pid),
                            ])
                        }),
                    ),
                ],
            ),
            Self::GetResponse { value, retention } => (
                "get_response",
                vec![
                    ("value", opt_bin(value)),
                    ("retention", opt_retention(*retention)),
                ],
            ),
            Self::GetSharedResponse {
                slot_offset,
                length,
                version,
                retention,
                slot_size,
            } => (
                "get_shared_response",
                vec![
                    ("slot_offset", Value::from(*slot_offset)),
                    ("length", Value::from(*length)),
                    ("version", Value::from(*version)),
                    ("retention", s(retention.as_str())),
                    ("slot_size", Value::from(*slot_size)),
                ],
            ),
            Self::BatchGetResponse { values, retentions } => (
                "batch_get_response",
                vec![
                    ("values", list(values, opt_bin)),
                    ("retentions", list(retentions, |r| opt_retention(*r))),
                ],
            ),
            Self::BatchGetSharedResponse {
                offsets,
                lengths,
                versions,
                retentions,
                slot_size,
            } => (
                "batch_get_shared_response",
                vec![
                    ("offsets", list(offsets, |o| Value::from(*o))),
                    ("lengths", list(lengths, |l| Value::from(*l))),
                    ("versions", list(versions, |v| Value::from(*v))),
                    ("retentions", list(retentions, |r| opt_retention(*r))),
                    ("slot_size", Value::from(*slot_size)),
                ],
            ),
            Self::SetAck { accepted, reason } => (
                "set_ack",
                vec![
                    ("accepted", Value::from(*accepted)),
                    ("reason", opt_str(reason)),
                ],
            ),
            Self::BatchSetAck { accepted, reasons } => (
                "batch_set_ack",
                vec![
                    ("accepted", list(accepted, |a| Value::from(*a))),
                    ("reasons", list(reasons, opt_str)),
                ],
            ),
            Self::SetReserveResponse {
                lease_token,
                slot_id,
                payload_offset,
                payload_max_size,
                reason,
            } => (
                "set_reserve_response",
                vec![
                    ("lease_token", Value::from(*lease_token)),
                    ("slot_id", Value::from(*slot_id)),
                    ("payload_offset", Value::from(*payload_offset)),
                    ("payload_max_size", Value::from(*payload_max_size)),
                    ("reason", s(reason)),
                ],
            ),
            Self::SetCommitResponse { accepted, reason } => (
                "set_commit_response",
                vec![
                    ("accepted", Value::from(*accepted)),
                    ("reason", opt_str(reason)),
                ],
            ),
            Self::SetCancelResponse => ("set_cancel_response", vec![]),
            Self::ExistsResponse { present } => (
                "exists_response",
                vec![("present", list(present, |p| Value::from(*p)))],
            ),
            Self::BatchLookupTierResponse { tiers } => (
                "batch_lookup_tier_response",
                vec![("tiers", list(tiers, |t| Value::from(t.as_str())))],
            ),
            Self::ClearAck { cleared_entries } => (
                "clear_ack",
                vec![("cleared_entries", Value::from(*cleared_entries))],
            ),
            Self::StatsResponse(st) => (
                "stats_response",
                vec![
                    ("entries", Value::from(st.entries)),
                    ("host_bytes", Value::from(st.host_bytes)),
                    ("spillover_bytes", Value::from(st.spillover_bytes)),
                    ("long_bytes", Value::from(st.long_bytes)),
                    ("gets_total", Value::from(st.gets_total)),
                    ("sets_total", Value::from(st.sets_total)),
                    ("hits_total", Value::from(st.hits_total)),
                    ("misses_total", Value::from(st.misses_total)),
                    ("evictions_total", Value::from(st.evictions_total)),
                ],
            ),
            Self::Error { code, message } => {
                ("error", vec![("code", s(code)), ("message", s(message))])
            }
        };
        op_map(op, fields)
    }
}

fn op_map(op: &str, fields: Vec<(&str, Value)>) -> Value {
    let mut map = vec![(s("op"), s(op))];
    map.extend(fields.into_iter().map(|(k, v)| (s(k), v)));
    Value::Map(map)
}

fn bin_bytes(v: &Value) -> usize {
    match v {
        Value::Binary(b) => b.len(),
        Value::Array(a) => a.iter().map(bin_bytes).sum(),
        Value::Map(m) => m.iter().map(|(k, v)| bin_bytes(k) + bin_bytes(v)).sum(),
        _ => 0,
    }
}

/// A frame: u32 big-endian length, then the encoded map.
pub fn encode_frame(value: &Value) -> Vec<u8> {
    // One buffer, sized for the values' bytes: a 32 MiB value is copied once.
    let mut frame = Vec::with_capacity(4 + 256 + bin_bytes(value));
    frame.extend_from_slice(&[0; 4]);
    // Writing into a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut frame, value);
    let len = u32::try_from(frame.len() - 4).unwrap_or(u32::MAX);
    frame[..4].copy_from_slice(&len.to_be_bytes());
    frame
}

#[cfg(test)]
mod tests;
