//! The prefill/decode connectors (pure): which protocol a pair speaks, and the exact
//! request each leg gets for it. Bodies match the earlier router's byte for byte
//! (pinned by `proto/testdata/pd/*.json`); the I/O that sends them is in
//! [`super::legs`].
//!
//! - `sglang-bootstrap`: the same body to both legs plus `bootstrap_host`,
//!   `bootstrap_port` (the prefill's `bootstrap_addr`) and `bootstrap_room`; the decode
//!   is told the prefill's data-parallel rank.
//! - `vllm-mooncake`: the prefill computes one token (`do_remote_decode`), the decode the
//!   rest (`do_remote_prefill`, the prefill's bootstrap address and engine id, with
//!   `_dp<rank>` when the prefill runs data-parallel); one transfer id from the room.
//! - `vllm-mori-write` / `vllm-mori-read`: both legs carry an `X-Request-Id` naming both
//!   peers' handshake and notify ports; read mode sends the prefill's answer on.
//! - `atom-mooncake`: the prefill is told where the decode listens; the decode reuses
//!   the prefill's `kv_transfer_params`. Completions only.

use crate::workers::registry::Target;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::pd::PdProtocol;
use infera_proto::retention::{Retention, apply_retention};
use infera_proto::worker::WorkerRecord;
use serde_json::{Map, Value, json};

/// Header pinning a request to a data-parallel rank.
pub(crate) const DP_RANK_HEADER: &str = "X-Data-Parallel-Rank";

/// Header the MoRI connector parses its peers from.
pub(crate) const REQUEST_ID_HEADER: &str = "X-Request-Id";

/// Why a prefill/decode pair cannot serve a request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PdError {
    /// The two workers register different protocols.
    Mismatch {
        /// Prefill worker and its protocol.
        prefill: (String, String),
        /// Decode worker and its protocol.
        decode: (String, String),
    },
    /// A worker registers a protocol the router does not speak (or none).
    Unsupported {
        /// Worker.
        worker: String,
        /// What it registered (`None`: no `disagg_meta`).
        protocol: Option<String>,
    },
    /// A record parameter the protocol needs is missing or has the wrong type.
    MissingParam {
        /// `prefill` or `decode`.
        side: &'static str,
        /// Worker.
        worker: String,
        /// The key under `disagg_meta.params`.
        key: String,
    },
    /// The prefill's answer lacks what the decode leg needs.
    BadHandoff {
        /// Prefill worker.
        worker: String,
        /// What was wrong.
        detail: String,
    },
    /// A chat request to a pool that serves completions only.
    CompletionsOnly {
        /// Protocol.
        protocol: PdProtocol,
    },
}

impl PdError {
    /// The label of `infera_pd_bootstrap_failures_total{reason}`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Mismatch { .. } => "protocol_mismatch",
            Self::Unsupported { .. } => "unsupported_protocol",
            Self::MissingParam { .. } => "missing_param",
            Self::BadHandoff { .. } => "bad_handoff",
            Self::CompletionsOnly { .. } => "completions_only",
        }
    }

    /// The client-facing error.
    pub(crate) fn to_api_error(&self) -> ApiError {
        match self {
            Self::Mismatch { prefill, decode } => ApiError::new(
                ErrorClass::NotImplemented,
                format!(
                    "prefill worker {} speaks {} but decode worker {} speaks {}; a prefill/decode pair needs one protocol (check the deployment's transport)",
                    prefill.0, prefill.1, decode.0, decode.1
                ),
            )
            .with_code("pd_protocol_mismatch"),
            Self::Unsupported { worker, protocol } => ApiError::new(
                ErrorClass::NotImplemented,
                match protocol {
                    Some(p) => format!(
                        "worker {worker} registers prefill/decode protocol {p:?}, which this router does not support (supported: {})",
                        PdProtocol::ALL.map(PdProtocol::as_str).join(", ")
                    ),
                    None => format!(
                        "worker {worker} is a prefill/decode worker without disagg_meta.protocol in its record"
                    ),
                },
            )
            .with_code("pd_protocol_unsupported"),
            Self::MissingParam { side, worker, key } => ApiError::new(
                ErrorClass::BadGateway,
                format!(
                    "{side} worker {worker} registered no usable disagg_meta.params.{key}, which its protocol needs"
                ),
            )
            .with_code("pd_missing_param"),
            Self::BadHandoff { worker, detail } => ApiError::new(
                ErrorClass::BadGateway,
                format!("prefill worker {worker} answered without a usable handoff: {detail}"),
            )
            .with_code("pd_bad_handoff"),
            Self::CompletionsOnly { protocol } => ApiError::new(
                ErrorClass::BadRequest,
                format!(
                    "this model is served by {protocol} prefill/decode workers, which accept /v1/completions only (the engine passes kv_transfer_params on the completion path alone); send a completion request"
                ),
            )
            .with_code("pd_completions_only"),
        }
    }
}

/// The protocol a prefill/decode pair speaks.
pub(crate) fn resolve_protocol(
    prefill: &WorkerRecord,
    decode: &WorkerRecord,
) -> Result<PdProtocol, PdError> {
    let of = |w: &WorkerRecord| {
        let name = w.protocol().map(str::to_owned);
        match name.as_deref().map(str::parse::<PdProtocol>) {
            Some(Ok(p)) => Ok(p),
            _ => Err(PdError::Unsupported {
                worker: w.worker_id.clone(),
                protocol: name,
            }),
        }
    };
    let (p, d) = (of(prefill)?, of(decode)?);
    if p != d {
        return Err(PdError::Mismatch {
            prefill: (prefill.worker_id.clone(), p.as_str().into()),
            decode: (decode.worker_id.clone(), d.as_str().into()),
        });
    }
    Ok(p)
}

/// The random values one prefill/decode request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PdIds {
    /// Bootstrap room (a u63), aligned to the prefill's data-parallel rank.
    pub room: u64,
    /// The uuid in a MoRI request id.
    pub request_uuid: u128,
    /// The transfer uuid of a MoRI read-mode prefill.
    pub transfer_uuid: u128,
}

impl PdIds {
    /// Fresh ids for a request to `prefill`.
    pub(crate) fn random(prefill: &Target) -> Self {
        Self {
            room: align_room(fastrand::u64(..) >> 1, prefill),
            request_uuid: uuid4(fastrand::u128(..)),
            transfer_uuid: uuid4(fastrand::u128(..)),
        }
    }
}

/// Sets the version (4) and variant bits of a random 128-bit value.
fn uuid4(bits: u128) -> u128 {
    (bits & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62)
}

fn uuid_hyphenated(u: u128) -> String {
    let h = format!("{u:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Rewrites the room's low residue so `room % dp_size == prefill rank` (SGLang derives
/// the prefill rank from the room; vLLM's `_dp<rank>` engine id too).
pub(crate) fn align_room(room: u64, prefill: &Target) -> u64 {
    match rank_of(prefill) {
        Some(rank) if prefill.record.dp_ranks() > 1 => {
            let size = u64::from(prefill.record.dp_ranks());
            room - room % size + u64::from(rank) % size
        }
        _ => room,
    }
}

/// One leg's request: extra headers and the body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Leg {
    /// Headers beyond content type and request id.
    pub headers: Vec<(&'static str, String)>,
    /// The JSON body.
    pub body: Map<String, Value>,
}

/// What both legs are built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PdPair<'a> {
    /// Protocol.
    pub protocol: PdProtocol,
    /// Prefill target.
    pub prefill: &'a Target,
    /// Decode target.
    pub decode: &'a Target,
    /// Random ids.
    pub ids: PdIds,
    /// Retention forwarded to the engines.
    pub retention: Retention,
}

fn params<'r>(
    w: &'r WorkerRecord,
    side: &'static str,
    key: &str,
) -> Result<&'r Map<String, Value>, PdError> {
    w.disagg_params()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| PdError::MissingParam {
            side,
            worker: w.worker_id.clone(),
            key: key.to_owned(),
        })
}

fn param<'r>(w: &'r WorkerRecord, side: &'static str, key: &str) -> Result<&'r Value, PdError> {
    params(w, side, key)?
        .get(key)
        .filter(|v| !v.is_null() && v.as_str() != Some(""))
        .ok_or_else(|| PdError::MissingParam {
            side,
            worker: w.worker_id.clone(),
            key: key.to_owned(),
        })
}

fn param_str<'r>(w: &'r WorkerRecord, side: &'static str, key: &str) -> Result<&'r str, PdError> {
    param(w, side, key)?
        .as_str()
        .ok_or_else(|| PdError::MissingParam {
            side,
            worker: w.worker_id.clone(),
            key: format!("{key} (a string)"),
        })
}

fn extra_config(w: &WorkerRecord) -> Option<&Map<String, Value>> {
    w.disagg_params()?
        .get("kv_connector_extra_config")?
        .as_object()
}

/// `host:H,handshake:P,notify:P` of a MoRI worker (host from its URL).
fn mori_address(w: &WorkerRecord, side: &'static str) -> Result<String, PdError> {
    let port = |key: &str| {
        extra_config(w)
            .and_then(|c| c.get(key))
            .and_then(Value::as_u64)
            .ok_or_else(|| PdError::MissingParam {
                side,
                worker: w.worker_id.clone(),
                key: format!("kv_connector_extra_config.{key}"),
            })
    };
    Ok(format!(
        "host:{},handshake:{},notify:{}",
        url_host(&w.url),
        port("handshake_port")?,
        port("notify_port")?
    ))
}

/// A MoRI worker's tensor-parallel size (1 when it registered none).
fn mori_tp_size(w: &WorkerRecord) -> u64 {
    extra_config(w)
        .and_then(|c| c.get("tp_size"))
        .and_then(Value::as_u64)
        .unwrap_or(1)
}

/// The host of a URL (`http://[::1]:8000/x` -> `::1`).
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// The body of a leg that computes one token: non-streaming, `max_tokens` 1.
fn single_token(body: &Map<String, Value>) -> Map<String, Value> {
    let mut out = body.clone();
    out.insert("max_tokens".into(), json!(1));
    out.insert("stream".into(), json!(false));
    out.shift_remove("stream_options");
    if out.contains_key("max_completion_tokens") {
        out.insert("max_completion_tokens".into(), json!(1));
    }
    out
}

/// The body of a decode that continues after the prefill's token.
fn remaining_tokens(body: &Map<String, Value>) -> Map<String, Value> {
    let mut out = body.clone();
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = out.get(key).and_then(Value::as_u64) {
            out.insert(key.into(), json!(n.saturating_sub(1).max(1)));
        }
    }
    out
}

/// The data-parallel rank a target addresses: its routing rank, else the rank its
/// record registered (a per-rank record).
fn rank_of(target: &Target) -> Option<u32> {
    target.dp_rank.or(target.record.dp_rank)
}

fn dp_header(target: &Target) -> Vec<(&'static str, String)> {
    rank_of(target)
        .map(|r| vec![(DP_RANK_HEADER, r.to_string())])
        .unwrap_or_default()
}

fn mori_request_id(pair: &PdPair<'_>) -> Result<String, PdError> {
    Ok(format!(
        "___prefill_addr_{}___decode_addr_{}_{:032x}",
        mori_address(&pair.prefill.record, "prefill")?,
        mori_address(&pair.decode.record, "decode")?,
        pair.ids.request_uuid
    ))
}

fn sglang_bootstrap(
    pair: &PdPair<'_>,
    body: &Map<String, Value>,
) -> Result<Map<String, Value>, PdError> {
    let p = &pair.prefill.record;
    let addr = param_str(p, "prefill", "bootstrap_addr")?;
    let bad = || PdError::MissingParam {
        side: "prefill",
        worker: p.worker_id.clone(),
        key: "bootstrap_addr (host:port)".into(),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let mut out = body.clone();
    out.insert("bootstrap_host".into(), json!(host));
    out.insert("bootstrap_port".into(), json!(port));
    out.insert("bootstrap_room".into(), json!(pair.ids.room));
    Ok(out)
}

/// The prefill leg.
pub(crate) fn build_prefill_leg(
    pair: &PdPair<'_>,
    body: &Map<String, Value>,
) -> Result<Leg, PdError> {
    let (p, d) = (&pair.prefill.record, &pair.decode.record);
    let mut headers = dp_header(pair.prefill);
    let mut out = match pair.protocol {
        PdProtocol::SglangBootstrap => sglang_bootstrap(pair, body)?,
        PdProtocol::VllmMooncake => {
            let mut out = single_token(body);
            out.insert(
                "kv_transfer_params".into(),
                json!({
                    "do_remote_decode": true,
                    "do_remote_prefill": false,
                    "transfer_id": format!("xfer-{:032x}", pair.ids.room),
                }),
            );
            out
        }
        PdProtocol::VllmMoriWrite | PdProtocol::VllmMoriRead => {
            headers.push((REQUEST_ID_HEADER, mori_request_id(pair)?));
            let transfer_id = if pair.protocol == PdProtocol::VllmMoriRead {
                format!("tx-{}", uuid_hyphenated(pair.ids.transfer_uuid))
            } else {
                format!("tx-{:032x}", pair.ids.room)
            };
            let tp = mori_tp_size(d);
            let mut out = single_token(body);
            out.insert(
                "kv_transfer_params".into(),
                json!({
                    "do_remote_decode": true,
                    "do_remote_prefill": false,
                    "remote_engine_id": null,
                    "remote_block_ids": null,
                    "transfer_id": transfer_id,
                    "remote_dp_size": d.dp_ranks(),
                    "tp_size": tp,
                    "remote_tp_size": tp,
                }),
            );
            out
        }
        PdProtocol::AtomMooncake => {
            let mut out = single_token(body);
            out.insert(
                "kv_transfer_params".into(),
                json!({
                    "remote_dp_size": param(d, "decode", "dp_size")?,
                    "remote_tp_size": param(d, "decode", "tp_size")?,
                    "do_remote_decode": true,
                    "do_remote_prefill": false,
                    "remote_handshake_port": param(d, "decode", "handshake_port")?,
                    "remote_engine_id": null,
                    "remote_block_ids": null,
                    "remote_host": param(d, "decode", "host")?,
                    "remote_port": param(d, "decode", "http_port")?,
                }),
            );
            out
        }
    };
    apply_retention(&mut out, p.engine, pair.retention);
    Ok(Leg { headers, body: out })
}

/// The decode leg; `handoff` is the prefill's `kv_transfer_params` for serial protocols.
pub(crate) fn build_decode_leg(
    pair: &PdPair<'_>,
    body: &Map<String, Value>,
    handoff: Option<&Map<String, Value>>,
) -> Result<Leg, PdError> {
    let (p, d) = (&pair.prefill.record, &pair.decode.record);
    let mut headers = dp_header(pair.decode);
    let handoff_field = |key: &str| -> Result<Value, PdError> {
        handoff
            .and_then(|h| h.get(key))
            .cloned()
            .ok_or_else(|| PdError::BadHandoff {
                worker: p.worker_id.clone(),
                detail: format!("kv_transfer_params.{key} is missing"),
            })
    };
    let mut out = match pair.protocol {
        PdProtocol::SglangBootstrap => sglang_bootstrap(pair, body)?,
        PdProtocol::VllmMooncake => {
            let mut engine_id = param_str(p, "prefill", "engine_id")?.to_owned();
            if p.dp_ranks() > 1 {
                engine_id = format!("{engine_id}_dp{}", pair.ids.room % u64::from(p.dp_ranks()));
            }
            let mut out = remaining_tokens(body);
            out.insert(
                "kv_transfer_params".into(),
                json!({
                    "do_remote_decode": false,
                    "do_remote_prefill": true,
                    "remote_bootstrap_addr": param_str(p, "prefill", "bootstrap_addr")?,
                    "remote_engine_id": engine_id,
                    "transfer_id": format!("xfer-{:032x}", pair.ids.room),
                }),
            );
            out
        }
        PdProtocol::VllmMoriWrite => {
            headers.push((REQUEST_ID_HEADER, mori_request_id(pair)?));
            let tp = mori_tp_size(p);
            let mut out = remaining_tokens(body);
            out.insert(
                "kv_transfer_params".into(),
                json!({
                    "do_remote_decode": false,
                    "do_remote_prefill": true,
                    "remote_engine_id": null,
                    "remote_block_ids": null,
                    "transfer_id": format!("tx-{:032x}", pair.ids.room),
                    "remote_dp_size": p.dp_ranks(),
                    "tp_size": tp,
                    "remote_tp_size": tp,
                }),
            );
            out
        }
        PdProtocol::VllmMoriRead => {
            headers.push((REQUEST_ID_HEADER, mori_request_id(pair)?));
            let tp = mori_tp_size(p);
            let mut out = remaining_tokens(body);
            out.insert(
                "kv_transfer_params".into(),
                json!({
                    "do_remote_decode": false,
                    "do_remote_prefill": true,
                    "transfer_id": handoff_field("transfer_id")?,
                    "remote_engine_id": handoff_field("remote_engine_id")?,
                    "remote_block_ids": handoff_field("remote_block_ids")?,
                    "remote_dp_size": p.dp_ranks(),
                    "tp_size": tp,
                    "remote_tp_size": tp,
                }),
            );
            out
        }
        PdProtocol::AtomMooncake => {
            handoff_field("transfer_id")?;
            let mut params = handoff.cloned().unwrap_or_default();
            let tp = param(p, "prefill", "tp_size")?.clone();
            params.insert(
                "remote_dp_size".into(),
                param(p, "prefill", "dp_size")?.clone(),
            );
            params.insert("remote_tp_size".into(), tp.clone());
            params.entry("tp_size").or_insert(tp);
            if let Some(rank) = params.get("dp_rank").filter(|v| v.is_u64()).cloned() {
                params.insert("remote_dp_rank".into(), rank);
            }
            // ATOM's decode re-predicts the first token, which counts toward
            // max_tokens: the client's limit is kept.
            let mut out = body.clone();
            out.insert("kv_transfer_params".into(), Value::Object(params));
            out
        }
    };
    apply_retention(&mut out, d.engine, pair.retention);
    if pair.protocol == PdProtocol::SglangBootstrap
        && let Some(rank) = rank_of(pair.prefill)
    {
        out.insert("disagg_prefill_dp_rank".into(), json!(rank));
    }
    Ok(Leg { headers, body: out })
}

/// The `kv_transfer_params` a serial protocol's prefill answered with.
pub(crate) fn extract_handoff(
    protocol: PdProtocol,
    prefill: &WorkerRecord,
    response: &Value,
) -> Result<Map<String, Value>, PdError> {
    let bad = |detail: String| PdError::BadHandoff {
        worker: prefill.worker_id.clone(),
        detail,
    };
    let params = response
        .get("kv_transfer_params")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            bad(format!(
                "{protocol} prefill answers carry kv_transfer_params; this one has none"
            ))
        })?;
    if !params.contains_key("transfer_id") {
        return Err(bad("kv_transfer_params.transfer_id is missing".into()));
    }
    Ok(params.clone())
}

#[cfg(test)]
mod tests;
