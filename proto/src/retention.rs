//! Retention classes: how long a client wants its prompt's KV kept, read from the
//! cache hints clients already send, and how the hint is forwarded to each engine.
//!
//! Classes order `none < ephemeral < short < long`. Hints:
//! - Anthropic `cache_control {type: "ephemeral"}` on `system`, `tools` or message
//!   content (or top level): `ttl: "1h"` -> `long`, otherwise `short`.
//! - OpenAI `prompt_cache_retention`: `24h` or `1h` -> `long`, `in_memory` -> `short`;
//!   `prompt_cache_key` alone -> `short`.
//! - Infera's own `infera_retention` (any class, top level or inside
//!   `kv_transfer_params`): an explicit choice that overrides the rest; the only way to
//!   ask for `none` or `ephemeral`.
//!
//! The strongest hint wins; requests without a hint get the deployment default (`long`
//! unless configured). The default changes what engines receive, not routing weight.

use crate::worker::EngineKind;
use serde_json::{Map, Value};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// How long KV for a prompt should be kept. Ordered weakest to strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Retention {
    /// Do not keep.
    None,
    /// Keep only while convenient.
    Ephemeral,
    /// Keep minutes.
    Short,
    /// Keep hours; written through to persistent tiers.
    Long,
}

/// The default class for requests without a hint.
pub const DEFAULT_RETENTION: Retention = Retention::Long;

/// A retention name that is not one of the four classes.
#[derive(Debug, Error, PartialEq)]
#[error("unknown retention {0:?}: expected one of none, ephemeral, short, long")]
pub struct ParseRetentionError(pub String);

impl Retention {
    /// All classes, weakest first.
    pub const ALL: [Retention; 4] = [Self::None, Self::Ephemeral, Self::Short, Self::Long];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ephemeral => "ephemeral",
            Self::Short => "short",
            Self::Long => "long",
        }
    }

    /// SGLang request `priority` for this class.
    pub fn sglang_priority(self) -> i64 {
        match self {
            Self::None => 0,
            // Not fixed by the earlier system; halfway between none and short.
            Self::Ephemeral => 25,
            Self::Short => 50,
            Self::Long => 100,
        }
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Retention {
    type Err = ParseRetentionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| ParseRetentionError(s.to_owned()))
    }
}

/// Field holding Infera's explicit retention choice.
pub const INFERA_RETENTION_FIELD: &str = "infera_retention";

/// The hint a request carries, if any: the explicit `infera_retention` when present,
/// else the strongest of its Anthropic and OpenAI cache hints.
///
/// An `infera_retention` that is not a class name is an error (a 400 for the client).
pub fn parse_retention_hint(
    body: &Map<String, Value>,
) -> Result<Option<Retention>, ParseRetentionError> {
    if let Some(explicit) = explicit_retention(body) {
        return explicit.map(Some);
    }
    Ok([anthropic_hint(body), openai_hint(body)]
        .into_iter()
        .flatten()
        .max())
}

fn explicit_retention(body: &Map<String, Value>) -> Option<Result<Retention, ParseRetentionError>> {
    let value = body
        .get(INFERA_RETENTION_FIELD)
        .or_else(|| body.get("kv_transfer_params")?.get(INFERA_RETENTION_FIELD))?;
    Some(match value.as_str() {
        Some(s) => s.parse(),
        None => Err(ParseRetentionError(value.to_string())),
    })
}

fn openai_hint(body: &Map<String, Value>) -> Option<Retention> {
    let from_retention = match body.get("prompt_cache_retention").and_then(Value::as_str) {
        Some("24h" | "1h") => Some(Retention::Long),
        Some("in_memory" | "in-memory") => Some(Retention::Short),
        _ => None,
    };
    let from_key = body
        .get("prompt_cache_key")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .map(|_| Retention::Short);
    from_retention.max(from_key)
}

fn anthropic_hint(body: &Map<String, Value>) -> Option<Retention> {
    let mut best = cache_control_retention(body.get("cache_control"));
    let mut consider = |block: &Value| best = best.max(cache_control_hint(block));
    if let Some(blocks) = body.get("system").and_then(Value::as_array) {
        blocks.iter().for_each(&mut consider);
    }
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        tools.iter().for_each(&mut consider);
    }
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        consider(message);
        if let Some(blocks) = message.get("content").and_then(Value::as_array) {
            blocks.iter().for_each(&mut consider);
        }
    }
    best
}

fn cache_control_hint(block: &Value) -> Option<Retention> {
    cache_control_retention(block.get("cache_control"))
}

fn cache_control_retention(cc: Option<&Value>) -> Option<Retention> {
    let cc = cc?;
    if cc.get("type").and_then(Value::as_str) != Some("ephemeral") {
        return None;
    }
    Some(match cc.get("ttl").and_then(Value::as_str) {
        Some("1h") => Retention::Long,
        _ => Retention::Short,
    })
}

/// Factor applied to the kv-aware overlap weight for a client's explicit hint:
/// `long` doubles it, `none` cuts it to a tenth; no hint leaves it.
pub fn overlap_weight_factor(hint: Option<Retention>) -> f64 {
    match hint {
        Some(Retention::Long) => 2.0,
        Some(Retention::None) => 0.1,
        _ => 1.0,
    }
}

/// Writes `retention` into an engine-bound request body the way that engine reads it.
/// A value the client set itself is never overwritten.
///
/// - vLLM: `kv_transfer_params.infera_retention`.
/// - ATOM: nothing (as the earlier router did).
/// - SGLang: `priority` (none 0, ephemeral 25, short 50, long 100) and `infera_retention`.
pub fn apply_retention(body: &mut Map<String, Value>, engine: EngineKind, retention: Retention) {
    let name = Value::from(retention.as_str());
    match engine {
        // The earlier router forwarded nothing to ATOM, whose server ignores the field.
        EngineKind::Atom => {}
        EngineKind::Vllm => {
            let params = body
                .entry("kv_transfer_params")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(params) = params {
                params.entry(INFERA_RETENTION_FIELD).or_insert(name);
            }
        }
        EngineKind::Sglang => {
            body.entry("priority")
                .or_insert_with(|| Value::from(retention.sglang_priority()));
            body.entry(INFERA_RETENTION_FIELD).or_insert(name);
        }
    }
}

/// The top-level fields [`apply_retention`] may add or change.
const RETENTION_FIELDS: [&str; 3] = ["kv_transfer_params", "priority", INFERA_RETENTION_FIELD];

/// What [`apply_retention`] would make of `body`'s top-level fields it touches, without
/// copying the rest of the body (which can be megabytes): the forwarded body is `body`
/// with these fields put in place, new ones appended in this map's order.
pub fn retention_fields(
    body: &Map<String, Value>,
    engine: EngineKind,
    retention: Retention,
) -> Map<String, Value> {
    let mut fields: Map<String, Value> = RETENTION_FIELDS
        .iter()
        .filter_map(|k| Some(((*k).to_owned(), body.get(*k)?.clone())))
        .collect();
    apply_retention(&mut fields, engine, retention);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hint(body: Value) -> Option<Retention> {
        parse_retention_hint(body.as_object().unwrap()).unwrap()
    }

    #[test]
    fn classes_order_and_parse() {
        assert!(Retention::None < Retention::Ephemeral);
        assert!(Retention::Ephemeral < Retention::Short);
        assert!(Retention::Short < Retention::Long);
        for r in Retention::ALL {
            assert_eq!(r.as_str().parse::<Retention>().unwrap(), r);
        }
        assert_eq!(
            "forever".parse::<Retention>(),
            Err(ParseRetentionError("forever".into()))
        );
        assert_eq!(DEFAULT_RETENTION, Retention::Long);
    }

    #[test]
    fn anthropic_cache_control() {
        let cc = |ttl: Option<&str>| match ttl {
            Some(t) => json!({"type": "ephemeral", "ttl": t}),
            None => json!({"type": "ephemeral"}),
        };
        assert_eq!(
            hint(json!({"system": [{"type": "text", "text": "s", "cache_control": cc(None)}]})),
            Some(Retention::Short)
        );
        assert_eq!(
            hint(
                json!({"system": [{"type": "text", "text": "s", "cache_control": cc(Some("1h"))}]})
            ),
            Some(Retention::Long)
        );
        assert_eq!(
            hint(json!({"tools": [{"name": "t", "cache_control": cc(Some("5m"))}]})),
            Some(Retention::Short)
        );
        let messages = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": cc(None)}]},
            {"role": "user", "content": [{"type": "text", "text": "b", "cache_control": cc(Some("1h"))}]}
        ]});
        assert_eq!(hint(messages), Some(Retention::Long), "strongest wins");
        assert_eq!(
            hint(json!({"messages": [{"role": "user", "content": "plain"}]})),
            None
        );
    }

    #[test]
    fn openai_prompt_cache_fields() {
        assert_eq!(
            hint(json!({"prompt_cache_retention": "24h"})),
            Some(Retention::Long)
        );
        assert_eq!(
            hint(json!({"prompt_cache_retention": "1h"})),
            Some(Retention::Long)
        );
        assert_eq!(
            hint(json!({"prompt_cache_retention": "in_memory"})),
            Some(Retention::Short)
        );
        assert_eq!(
            hint(json!({"prompt_cache_key": "session-1"})),
            Some(Retention::Short)
        );
        assert_eq!(
            hint(json!({"prompt_cache_key": "s", "prompt_cache_retention": "24h"})),
            Some(Retention::Long)
        );
        assert_eq!(hint(json!({"prompt_cache_key": ""})), None);
        assert_eq!(hint(json!({"model": "m"})), None);
    }

    #[test]
    fn explicit_infera_retention_overrides() {
        assert_eq!(
            hint(json!({"infera_retention": "none", "prompt_cache_retention": "24h"})),
            Some(Retention::None)
        );
        assert_eq!(
            hint(json!({"kv_transfer_params": {"infera_retention": "ephemeral"}})),
            Some(Retention::Ephemeral)
        );
        for bad in [
            json!({"infera_retention": "forever"}),
            json!({"infera_retention": 3}),
        ] {
            assert!(parse_retention_hint(bad.as_object().unwrap()).is_err());
        }
    }

    #[test]
    fn weight_factors() {
        assert_eq!(overlap_weight_factor(Some(Retention::Long)), 2.0);
        assert_eq!(overlap_weight_factor(Some(Retention::None)), 0.1);
        assert_eq!(overlap_weight_factor(Some(Retention::Short)), 1.0);
        assert_eq!(overlap_weight_factor(None), 1.0);
    }

    fn forwarded(engine: EngineKind, body: Value, r: Retention) -> String {
        let Value::Object(mut map) = body else {
            unreachable!()
        };
        apply_retention(&mut map, engine, r);
        serde_json::to_string(&map).unwrap()
    }

    #[test]
    fn forwarding_per_engine_exact_json() {
        assert_eq!(
            forwarded(EngineKind::Vllm, json!({"model": "m"}), Retention::Long),
            r#"{"model":"m","kv_transfer_params":{"infera_retention":"long"}}"#
        );
        assert_eq!(
            forwarded(
                EngineKind::Vllm,
                json!({"kv_transfer_params": {"do_remote_decode": true}}),
                Retention::Short
            ),
            r#"{"kv_transfer_params":{"do_remote_decode":true,"infera_retention":"short"}}"#
        );
        assert_eq!(
            forwarded(EngineKind::Sglang, json!({"model": "m"}), Retention::Short),
            r#"{"model":"m","priority":50,"infera_retention":"short"}"#
        );
        assert_eq!(
            forwarded(EngineKind::Sglang, json!({}), Retention::None),
            r#"{"priority":0,"infera_retention":"none"}"#
        );
        assert_eq!(
            forwarded(EngineKind::Atom, json!({"model": "m"}), Retention::Long),
            r#"{"model":"m"}"#
        );
    }

    #[test]
    fn client_values_always_win() {
        assert_eq!(
            forwarded(
                EngineKind::Sglang,
                json!({"priority": 7, "infera_retention": "none"}),
                Retention::Long
            ),
            r#"{"priority":7,"infera_retention":"none"}"#
        );
        assert_eq!(
            forwarded(
                EngineKind::Vllm,
                json!({"kv_transfer_params": {"infera_retention": "none"}}),
                Retention::Long
            ),
            r#"{"kv_transfer_params":{"infera_retention":"none"}}"#
        );
    }

    #[test]
    fn retention_fields_are_what_apply_retention_changes() {
        let bodies = [
            json!({"model": "m", "messages": []}),
            json!({"model": "m", "kv_transfer_params": {"do_remote_decode": true}, "stream": true}),
            json!({"priority": 3, "model": "m", "infera_retention": "short"}),
        ];
        for body in bodies {
            let body = body.as_object().unwrap();
            for engine in [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Atom] {
                for r in Retention::ALL {
                    let mut want = body.clone();
                    apply_retention(&mut want, engine, r);
                    let fields = retention_fields(body, engine, r);
                    let mut got = body.clone();
                    for (k, v) in fields {
                        got.insert(k, v);
                    }
                    assert_eq!(
                        serde_json::to_string(&got).unwrap(),
                        serde_json::to_string(&want).unwrap(),
                        "{engine:?} {r:?}"
                    );
                }
            }
        }
    }
}
