//! Checking an OpenAI request before it is routed (pure). Every problem becomes a 400
//! naming the parameter, so a client learns what to change and no worker sees it.

use infera_proto::error_class::{ApiError, ErrorClass};
use serde_json::{Map, Value};

/// Which OpenAI endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

impl ApiKind {
    /// The engine path.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
        }
    }
}

/// The fields routing needs from a validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestInfo {
    /// Requested model.
    pub model: String,
    /// Whether the client asked for SSE.
    pub stream: bool,
}

/// The largest `max_tokens` passed on: engines hold it in 32-bit integers, and a larger
/// one can only be a mistake or an attempt to crash a worker (which would then count
/// against the worker's breaker).
pub(crate) const MAX_TOKENS_LIMIT: u64 = i32::MAX as u64;

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::new(ErrorClass::BadRequest, message).with_param(param)
}

const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// Parses and checks a request body. `default_model` fills a missing `model` when the
/// gateway serves exactly one.
pub fn validate_request(
    kind: ApiKind,
    bytes: &[u8],
    default_model: Option<&str>,
) -> Result<(Map<String, Value>, RequestInfo), ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            ErrorClass::BadRequest,
            format!("request body is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(mut body) = value else {
        return Err(ApiError::new(
            ErrorClass::BadRequest,
            "request body must be a JSON object",
        ));
    };
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        None | Some(Value::Null) => match default_model {
            Some(m) => {
                body.insert("model".into(), Value::String(m.to_owned()));
                m.to_owned()
            }
            None => return Err(bad("'model' is required", "model")),
        },
        Some(_) => return Err(bad("'model' must be a non-empty string", "model")),
    };
    match kind {
        ApiKind::Chat => check_messages(body.get("messages"))?,
        ApiKind::Completions => check_prompt(body.get("prompt"))?,
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("'stream' must be a boolean", "stream")),
    };
    for name in ["max_tokens", "max_completion_tokens"] {
        match body.get(name) {
            None | Some(Value::Null) => {}
            Some(v)
                if v.as_u64()
                    .is_some_and(|n| (1..=MAX_TOKENS_LIMIT).contains(&n)) => {}
            Some(v) => {
                return Err(bad(
                    format!(
                        "'{name}' must be a positive integer up to {MAX_TOKENS_LIMIT}, got {v}"
                    ),
                    name,
                ));
            }
        }
    }
    match body.get("n") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(v) => {
            return Err(bad(
                format!("'n' must be 1: one completion per request is supported (got {v})"),
                "n",
            ));
        }
    }
    for (name, lo, hi) in [("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)] {
        match body.get(name) {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_f64() {
                Some(x) if (lo..=hi).contains(&x) => {}
                _ => {
                    return Err(bad(
                        format!("'{name}' must be a number from {lo} to {hi}, got {v}"),
                        name,
                    ));
                }
            },
        }
    }
    if let Some(opts) = body.get("stream_options").filter(|v| !v.is_null())
        && !opts.is_object()
    {
        return Err(bad("'stream_options' must be an object", "stream_options"));
    }
    Ok((body, RequestInfo { model, stream }))
}

fn check_messages(messages: Option<&Value>) -> Result<(), ApiError> {
    let list = match messages {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => return Err(bad("'messages' must not be empty", "messages")),
        Some(_) => return Err(bad("'messages' must be a list of messages", "messages")),
        None => return Err(bad("'messages' is required", "messages")),
    };
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Some(m) = m.as_object() else {
            return Err(bad(format!("{param} must be an object"), &param));
        };
        match m.get("role").and_then(Value::as_str) {
            Some(r) if ROLES.contains(&r) => {}
            Some(r) => {
                return Err(bad(
                    format!("{param}.role '{r}' is not one of {}", ROLES.join(", ")),
                    &format!("{param}.role"),
                ));
            }
            None => {
                return Err(bad(
                    format!("{param}.role is required"),
                    &format!("{param}.role"),
                ));
            }
        }
        match m.get("content") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(Value::Array(parts)) => check_parts(parts, &format!("{param}.content"))?,
            Some(_) => {
                return Err(bad(
                    format!("{param}.content must be a string or a list of parts"),
                    &format!("{param}.content"),
                ));
            }
        }
    }
    Ok(())
}

/// Content parts are objects naming their `type` (`text`, `image_url`, ...): anything
/// else would reach the chat template and the engine as nonsense.
fn check_parts(parts: &[Value], param: &str) -> Result<(), ApiError> {
    for (j, part) in parts.iter().enumerate() {
        if !part.get("type").is_some_and(Value::is_string) {
            let param = format!("{param}[{j}]");
            return Err(bad(
                format!("{param} must be an object with a string 'type' (e.g. \"text\")"),
                &param,
            ));
        }
    }
    Ok(())
}

fn check_prompt(prompt: Option<&Value>) -> Result<(), ApiError> {
    match prompt {
        Some(Value::String(s)) if !s.is_empty() => Ok(()),
        Some(Value::Array(a)) if !a.is_empty() => Ok(()),
        Some(Value::String(_) | Value::Array(_)) => {
            Err(bad("'prompt' must not be empty", "prompt"))
        }
        Some(_) => Err(bad(
            "'prompt' must be a string, a list of strings or a list of token ids",
            "prompt",
        )),
        None => Err(bad("'prompt' is required", "prompt")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(kind: ApiKind, body: &str) -> Result<RequestInfo, ApiError> {
        validate_request(kind, body.as_bytes(), None).map(|(_, i)| i)
    }

    #[test]
    fn good_requests_pass() {
        let i = check(
            ApiKind::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        )
        .unwrap();
        assert_eq!(
            i,
            RequestInfo {
                model: "m".into(),
                stream: true
            }
        );
        check(
            ApiKind::Completions,
            r#"{"model":"m","prompt":[1,2],"max_tokens":2147483647,"n":1}"#,
        )
        .unwrap();
        check(
            ApiKind::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}]}"#,
        )
        .unwrap();
        let (body, info) =
            validate_request(ApiKind::Completions, br#"{"prompt":"x"}"#, Some("only")).unwrap();
        assert_eq!(
            (info.model.as_str(), &body["model"]),
            ("only", &Value::from("only"))
        );
    }

    #[test]
    fn every_bad_input_names_its_parameter() {
        let cases = [
            (ApiKind::Chat, "{", None),
            (ApiKind::Chat, "[1]", None),
            (
                ApiKind::Chat,
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                Some("model"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":5,"messages":[{"role":"user","content":"x"}]}"#,
                Some("model"),
            ),
            (ApiKind::Chat, r#"{"model":"m"}"#, Some("messages")),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[]}"#,
                Some("messages"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[1]}"#,
                Some("messages[0]"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                Some("messages[0].role"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"wizard","content":"x"}]}"#,
                Some("messages[0].role"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
                Some("messages[0].content"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":[[[]]]}]}"#,
                Some("messages[0].content[0]"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"text":"b"}]}]}"#,
                Some("messages[0].content[1]"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":18446744073709551615}"#,
                Some("max_tokens"),
            ),
            (
                ApiKind::Completions,
                r#"{"model":"m","prompt":"x","max_completion_tokens":2147483648}"#,
                Some("max_completion_tokens"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":3}"#,
                Some("n"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                Some("max_tokens"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":1}"#,
                Some("stream"),
            ),
            (
                ApiKind::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
                Some("temperature"),
            ),
            (
                ApiKind::Completions,
                r#"{"model":"m","prompt":""}"#,
                Some("prompt"),
            ),
            (ApiKind::Completions, r#"{"model":"m"}"#, Some("prompt")),
        ];
        for (kind, body, param) in cases {
            let err = check(kind, body).unwrap_err();
            assert_eq!(err.class, ErrorClass::BadRequest, "{body}");
            assert_eq!(err.param.as_deref(), param, "{body}");
        }
    }
}
