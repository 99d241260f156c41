//! Fuzzes the gateway's request parsing: the JSON limits, OpenAI chat and completion
//! validation and the Anthropic Messages translation must never panic, whatever the bytes,
//! and a body the limits pass never parses into more values than they allow.

#![no_main]

use infera_gateway::request::anthropic::build_chat_request;
use infera_gateway::request::json_limits::{JsonLimits, check_json_limits};
use infera_gateway::request::validate::{ApiKind, validate_request};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const LIMITS: JsonLimits = JsonLimits {
    max_values: 64,
    max_depth: 8,
};

fn values(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(values).sum(),
        Value::Object(o) => o.values().map(values).sum(),
        _ => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    let within = check_json_limits(data, LIMITS).is_ok();
    let _ = validate_request(ApiKind::Chat, data, Some("fuzz-model"));
    let _ = validate_request(ApiKind::Completions, data, None);
    if let Ok(value) = serde_json::from_slice::<Value>(data) {
        assert!(!within || values(&value) <= LIMITS.max_values);
        let _ = build_chat_request(&value);
    }
});
