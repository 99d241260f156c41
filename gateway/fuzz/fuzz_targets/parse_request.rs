//! Fuzzes the gateway's request parsing: OpenAI chat and completion validation and the
//! Anthropic Messages translation must never panic, whatever the bytes.

#![no_main]

use infera_gateway::anthropic::build_chat_request;
use infera_gateway::validate::{ApiKind, validate_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = validate_request(ApiKind::Chat, data, Some("fuzz-model"));
    let _ = validate_request(ApiKind::Completions, data, None);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = build_chat_request(&value);
    }
});
