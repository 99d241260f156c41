//! Prefill/decode roles: what a disaggregated worker of each protocol expects in a
//! request, and what its prefill answers with. A request that the real engine would
//! mishandle (silently run without a KV transfer, or fail later inside the connector)
//! is rejected here with a 400 naming the field, so routers get caught early.
//!
//! Protocols and the fields checked (see `shared/PROTOCOLS.md` and the fixtures in
//! `proto/testdata/pd/`):
//! - `sglang-bootstrap`: `bootstrap_host` (string), `bootstrap_port` (int) and
//!   `bootstrap_room` (int) on both legs.
//! - `vllm-mooncake`: prefill `kv_transfer_params.do_remote_decode=true` with
//!   `transfer_id`; decode `do_remote_prefill=true` with `remote_engine_id`,
//!   `remote_bootstrap_addr` and `transfer_id`. The prefill answers
//!   `kv_transfer_params: null`.
//! - `vllm-mori-write` / `vllm-mori-read`: `transfer_id` always; prefill keys
//!   `remote_block_ids` and `remote_engine_id` present (null allowed); the peer's
//!   address from an `X-Request-Id` of the form
//!   `___prefill_addr_host:H,handshake:P,notify:P___decode_addr_host:H,handshake:P,notify:P_<32 hex>`
//!   unless `remote_host` and ports are given; read-mode decode needs non-empty
//!   `remote_block_ids`. The prefill answers the handoff parameters.
//! - `atom-mooncake`: `/v1/completions` only; prefill `do_remote_decode=true` with the
//!   decode side's `remote_host`, `remote_port`, `remote_handshake_port`; decode
//!   `do_remote_prefill=true` with `transfer_id`, `remote_host`,
//!   `remote_handshake_port`. The prefill answers ATOM's handoff (with `first_token_id`).

use crate::openai::{Endpoint, Rejection};
use serde_json::{Map, Value, json};

pub use infera_proto::pd::PdProtocol;

/// Which leg this worker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdLeg {
    /// Computes the prompt's KV and hands it off.
    Prefill,
    /// Receives the KV and generates.
    Decode,
}

/// A disaggregated worker's identity, used in its handoff answers.
#[derive(Debug, Clone, PartialEq)]
pub struct PdRole {
    /// Leg.
    pub leg: PdLeg,
    /// Protocol.
    pub protocol: PdProtocol,
    /// Host the worker advertises.
    pub host: String,
    /// HTTP port.
    pub http_port: u16,
    /// Connector handshake port (MoRI, ATOM).
    pub handshake_port: u16,
    /// Connector notify port (MoRI).
    pub notify_port: u16,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Data-parallel size.
    pub dp_size: u32,
    /// SGLang bootstrap port / vLLM Mooncake bootstrap port.
    pub bootstrap_port: u16,
    /// Connector engine id (vLLM `kv_transfer_config.engine_id`).
    pub engine_id: String,
}

/// The `disagg_meta` a launcher registers for a worker in this role (the parameters
/// listed in `proto/testdata/pd/*.json` as `prefill_record_params`).
pub fn build_disagg_meta(role: &PdRole) -> Value {
    let params = match role.protocol {
        PdProtocol::SglangBootstrap => match role.leg {
            PdLeg::Prefill => {
                json!({"bootstrap_addr": format!("{}:{}", role.host, role.bootstrap_port)})
            }
            PdLeg::Decode => json!({}),
        },
        PdProtocol::VllmMooncake => json!({
            "engine_id": role.engine_id,
            "kv_ip": "127.0.0.1",
            "kv_port": 14579,
            "kv_connector_extra_config": {},
            "bootstrap_addr": format!("http://{}:{}", role.host, role.bootstrap_port),
        }),
        PdProtocol::VllmMoriWrite | PdProtocol::VllmMoriRead => json!({
            "engine_id": role.engine_id,
            "kv_ip": "127.0.0.1",
            "kv_port": 14579,
            "kv_connector_extra_config": {
                "handshake_port": role.handshake_port,
                "notify_port": role.notify_port,
                "tp_size": role.tp_size,
            },
        }),
        PdProtocol::AtomMooncake => json!({
            "host": role.host,
            "http_port": role.http_port,
            "handshake_port": role.handshake_port,
            "tp_size": role.tp_size,
            "dp_size": role.dp_size,
        }),
    };
    json!({"protocol": role.protocol.as_str(), "params": params})
}

/// What a validated PD request means for the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct PdPlan {
    /// The prompt's KV arrives by transfer (decode leg).
    pub remote_kv: bool,
    /// Output tokens to generate, if the leg fixes it (a prefill generates one).
    pub max_tokens: Option<usize>,
}

fn missing(field: &str, why: &str) -> Rejection {
    Rejection::bad(
        format!("{why}: kv_transfer_params.{field} is required"),
        Some(&format!("kv_transfer_params.{field}")),
    )
}

fn params<'b>(
    body: &'b Map<String, Value>,
    role: &PdRole,
) -> Result<&'b Map<String, Value>, Rejection> {
    body.get("kv_transfer_params")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            Rejection::bad(
                format!(
                    "{} {} worker needs kv_transfer_params; without it the engine would compute \
                     the request locally and transfer nothing",
                    role.protocol,
                    leg_name(role.leg)
                ),
                Some("kv_transfer_params"),
            )
        })
}

fn leg_name(leg: PdLeg) -> &'static str {
    match leg {
        PdLeg::Prefill => "prefill",
        PdLeg::Decode => "decode",
    }
}

fn require_true(p: &Map<String, Value>, field: &str, why: &str) -> Result<(), Rejection> {
    match p.get(field) {
        Some(Value::Bool(true)) => Ok(()),
        _ => Err(Rejection::bad(
            format!("{why}: kv_transfer_params.{field} must be true"),
            Some(&format!("kv_transfer_params.{field}")),
        )),
    }
}

fn require_present(p: &Map<String, Value>, field: &str, why: &str) -> Result<(), Rejection> {
    match p.get(field) {
        Some(Value::Null) | None => Err(missing(field, why)),
        Some(Value::String(s)) if s.is_empty() => Err(missing(field, why)),
        Some(_) => Ok(()),
    }
}

fn require_key(p: &Map<String, Value>, field: &str, why: &str) -> Result<(), Rejection> {
    if p.contains_key(field) {
        Ok(())
    } else {
        Err(Rejection::bad(
            format!("{why}: kv_transfer_params must contain the key {field} (null is allowed)"),
            Some(&format!("kv_transfer_params.{field}")),
        ))
    }
}

/// Whether `id` is a MoRI request id naming both sides' host, handshake and notify ports.
pub fn is_mori_request_id(id: &str) -> bool {
    let Some(rest) = id.strip_prefix("___prefill_addr_") else {
        return false;
    };
    let Some((prefill, decode_part)) = rest.split_once("___decode_addr_") else {
        return false;
    };
    // The decode address ends at the last `_` before a 32-hex-digit uuid.
    let Some((decode, uuid)) = decode_part.rsplit_once('_') else {
        return false;
    };
    let uuid = uuid.split('-').next().unwrap_or_default();
    uuid.len() == 32
        && uuid
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && is_zmq_address(prefill)
        && is_zmq_address(decode)
}

fn is_zmq_address(s: &str) -> bool {
    let mut host = false;
    let mut handshake = false;
    let mut notify = false;
    for part in s.split(',') {
        match part.split_once(':') {
            Some(("host", h)) => host = !h.is_empty(),
            Some(("handshake", p)) => handshake = p.parse::<u16>().is_ok(),
            Some(("notify", p)) => notify = p.parse::<u16>().is_ok(),
            _ => return false,
        }
    }
    host && handshake && notify
}

/// Checks a request against the worker's role.
pub fn validate(
    role: &PdRole,
    endpoint: Endpoint,
    body: &Map<String, Value>,
    request_id: Option<&str>,
) -> Result<PdPlan, Rejection> {
    let prefill = PdPlan {
        remote_kv: false,
        max_tokens: Some(1),
    };
    let decode = PdPlan {
        remote_kv: true,
        max_tokens: None,
    };
    let plan = match role.leg {
        PdLeg::Prefill => prefill,
        PdLeg::Decode => decode,
    };
    let why = format!("{} {} request", role.protocol, leg_name(role.leg));
    match role.protocol {
        PdProtocol::SglangBootstrap => {
            if !body
                .get("bootstrap_room")
                .is_some_and(|v| v.is_u64() || v.is_i64())
            {
                return Err(Rejection::bad(
                    "Invalid request: Disaggregated request received without bootstrap room id.",
                    Some("bootstrap_room"),
                ));
            }
            if !body.get("bootstrap_host").is_some_and(Value::is_string) {
                return Err(Rejection::bad(
                    format!("{why}: bootstrap_host (string) is required"),
                    Some("bootstrap_host"),
                ));
            }
            if !body.get("bootstrap_port").is_some_and(Value::is_u64) {
                return Err(Rejection::bad(
                    format!("{why}: bootstrap_port (int) is required"),
                    Some("bootstrap_port"),
                ));
            }
        }
        PdProtocol::VllmMooncake => {
            let p = params(body, role)?;
            match role.leg {
                PdLeg::Prefill => {
                    require_true(p, "do_remote_decode", &why)?;
                    require_present(p, "transfer_id", &why)?;
                }
                PdLeg::Decode => {
                    require_true(p, "do_remote_prefill", &why)?;
                    for f in ["remote_engine_id", "remote_bootstrap_addr", "transfer_id"] {
                        require_present(p, f, &why)?;
                    }
                }
            }
        }
        PdProtocol::VllmMoriWrite | PdProtocol::VllmMoriRead => {
            let p = params(body, role)?;
            require_present(p, "transfer_id", &why)?;
            match role.leg {
                PdLeg::Prefill => {
                    require_true(p, "do_remote_decode", &why)?;
                    require_key(p, "remote_block_ids", &why)?;
                    require_key(p, "remote_engine_id", &why)?;
                }
                PdLeg::Decode => {
                    require_true(p, "do_remote_prefill", &why)?;
                    if role.protocol == PdProtocol::VllmMoriRead {
                        match p.get("remote_block_ids") {
                            Some(Value::Array(ids)) if !ids.is_empty() => {}
                            _ => {
                                return Err(missing(
                                    "remote_block_ids",
                                    &format!("{why} (read mode pulls these blocks)"),
                                ));
                            }
                        }
                        require_key(p, "remote_engine_id", &why)?;
                    }
                }
            }
            let explicit_peer = ["remote_host", "remote_handshake_port", "remote_notify_port"]
                .iter()
                .all(|k| p.get(*k).is_some_and(|v| !v.is_null()));
            if !explicit_peer && !request_id.is_some_and(is_mori_request_id) {
                return Err(Rejection::bad(
                    format!(
                        "{why}: X-Request-Id must name both peers as \
                         ___prefill_addr_host:H,handshake:P,notify:P___decode_addr_host:H,handshake:P,notify:P_<32 hex> \
                         (or kv_transfer_params must give remote_host, remote_handshake_port, remote_notify_port)"
                    ),
                    Some("X-Request-Id"),
                ));
            }
        }
        PdProtocol::AtomMooncake => {
            if endpoint != Endpoint::Completions {
                return Err(Rejection::bad(
                    "atom-mooncake disaggregation serves /v1/completions only; send a completion request",
                    None,
                ));
            }
            let p = params(body, role)?;
            match role.leg {
                PdLeg::Prefill => {
                    require_true(p, "do_remote_decode", &why)?;
                    for f in ["remote_host", "remote_port", "remote_handshake_port"] {
                        require_present(p, f, &why)?;
                    }
                }
                PdLeg::Decode => {
                    require_true(p, "do_remote_prefill", &why)?;
                    for f in ["transfer_id", "remote_host", "remote_handshake_port"] {
                        require_present(p, f, &why)?;
                    }
                }
            }
        }
    }
    Ok(plan)
}

/// The `kv_transfer_params` a prefill answers with (`None`: field absent).
pub fn prefill_response_params(
    role: &PdRole,
    body: &Map<String, Value>,
    prompt_tokens: usize,
    block_size: usize,
    first_token: u32,
) -> Option<Value> {
    if role.leg != PdLeg::Prefill {
        return None;
    }
    let sent = body.get("kv_transfer_params").and_then(Value::as_object);
    let transfer_id = sent.and_then(|p| p.get("transfer_id")).cloned();
    let blocks: Vec<usize> = (0..prompt_tokens.div_ceil(block_size.max(1))).collect();
    match role.protocol {
        PdProtocol::SglangBootstrap => None,
        PdProtocol::VllmMooncake => Some(Value::Null),
        PdProtocol::VllmMoriWrite | PdProtocol::VllmMoriRead => Some(json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": blocks,
            "remote_engine_id": format!("{}:{}", role.host, role.handshake_port),
            "remote_host": role.host,
            "remote_handshake_port": role.handshake_port,
            "remote_notify_port": role.notify_port,
            "remote_dp_size": role.dp_size,
            "tp_size": role.tp_size,
            "transfer_id": transfer_id,
        })),
        PdProtocol::AtomMooncake => Some(json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": blocks,
            "remote_swa_block_ids": [],
            "remote_engine_id": "None",
            "remote_host": role.host,
            "remote_port": role.http_port,
            "remote_handshake_port": role.handshake_port,
            "tp_size": role.tp_size,
            "dp_rank": 0,
            "remote_pp_size": 1,
            "transfer_id": transfer_id.unwrap_or_else(|| json!(first_token as u64 + prompt_tokens as u64)),
            "first_token_id": first_token,
            "draft_token_ids": [],
            "local_slot_index": -1,
            "prefix_cache_hit_tokens": 0,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mori_request_ids() {
        let good = "___prefill_addr_host:10.0.0.22,handshake:6301,notify:61005___decode_addr_host:10.0.0.40,handshake:6301,notify:61005_9f1c3b0e5d2a4c7f8e6b1a2d3c4e5f60";
        assert!(is_mori_request_id(good));
        assert!(is_mori_request_id(&format!("{good}-0-abc")));
        assert!(!is_mori_request_id("plain-request-id"));
        assert!(!is_mori_request_id(
            &good.replace("notify:61005___", "notify:x___")
        ));
        assert!(!is_mori_request_id(&good.replace("5f60", "5F60")));
    }

    #[test]
    fn disagg_meta_has_the_fixture_record_keys() {
        for protocol in PdProtocol::ALL {
            let path = format!(
                "{}/../proto/testdata/pd/{}.json",
                env!("CARGO_MANIFEST_DIR"),
                protocol.as_str()
            );
            let fixture: Value =
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            let role = PdRole {
                leg: PdLeg::Prefill,
                protocol,
                host: "10.0.0.22".into(),
                http_port: 30001,
                handshake_port: 6301,
                notify_port: 61005,
                tp_size: 8,
                dp_size: 1,
                bootstrap_port: 8998,
                engine_id: "eng-42".into(),
            };
            let meta = build_disagg_meta(&role);
            assert_eq!(meta["protocol"], protocol.as_str());
            let want: Vec<&String> = fixture["prefill_record_params"]
                .as_object()
                .unwrap()
                .keys()
                .collect();
            let got: Vec<&String> = meta["params"].as_object().unwrap().keys().collect();
            assert_eq!(got, want, "{protocol}");
        }
    }
}
