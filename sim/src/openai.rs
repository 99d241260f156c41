//! OpenAI request parsing and response shapes, as vLLM and SGLang serve them. Pure:
//! the HTTP handlers feed bytes in and send what comes out.

use serde_json::{Map, Value, json};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// The prompt of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Chat messages (the whole body is kept for the template: tools, kwargs).
    Chat,
    /// A completion prompt string.
    Text(String),
    /// Completion prompt token ids.
    Tokens(Vec<u32>),
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// Endpoint.
    pub endpoint: Endpoint,
    /// The body as sent.
    pub body: Map<String, Value>,
    /// The prompt.
    pub prompt: PromptInput,
    /// Whether to stream SSE.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Tokens to generate.
    pub max_tokens: usize,
    /// Sampling seed, if given.
    pub seed: Option<u64>,
    /// `return_token_ids` (vLLM): prompt and output token ids in the response.
    pub return_token_ids: bool,
}

/// A request the engine refuses: status, message, and the parameter at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// HTTP status.
    pub status: u16,
    /// Message.
    pub message: String,
    /// Parameter at fault.
    pub param: Option<String>,
}

impl Rejection {
    /// A 400 naming `param`.
    pub fn bad(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: 400,
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }
}

/// Parses and validates a request body.
pub fn parse_request(
    endpoint: Endpoint,
    bytes: &[u8],
    served_model: &str,
    default_max_tokens: usize,
) -> Result<ParsedRequest, Rejection> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| Rejection::bad(format!("Invalid JSON body: {e}"), None))?;
    let Value::Object(body) = value else {
        return Err(Rejection::bad(
            "The request body must be a JSON object",
            None,
        ));
    };
    match body.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == served_model => {}
        Some(Value::String(m)) => {
            return Err(Rejection {
                status: 404,
                message: format!("The model `{m}` does not exist."),
                param: Some("model".into()),
            });
        }
        Some(_) => return Err(Rejection::bad("'model' must be a string", Some("model"))),
    }
    let prompt = match endpoint {
        Endpoint::Chat => match body.get("messages") {
            Some(Value::Array(m)) if !m.is_empty() => PromptInput::Chat,
            Some(Value::Array(_)) => {
                return Err(Rejection::bad(
                    "'messages' must not be empty",
                    Some("messages"),
                ));
            }
            Some(_) => {
                return Err(Rejection::bad(
                    "'messages' must be a list",
                    Some("messages"),
                ));
            }
            None => return Err(Rejection::bad("'messages' is required", Some("messages"))),
        },
        Endpoint::Completions => parse_prompt(body.get("prompt"))?,
    };
    let max_tokens = match body
        .get("max_completion_tokens")
        .filter(|v| !v.is_null())
        .map(|v| ("max_completion_tokens", v))
        .or_else(|| {
            body.get("max_tokens")
                .filter(|v| !v.is_null())
                .map(|v| ("max_tokens", v))
        }) {
        None => default_max_tokens,
        Some((name, v)) => match v.as_u64() {
            Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
            _ => {
                return Err(Rejection::bad(
                    format!("'{name}' must be a positive integer, got {v}"),
                    Some(name),
                ));
            }
        },
    };
    match body.get("n") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(v) => {
            return Err(Rejection::bad(
                format!("'n' must be 1 (got {v})"),
                Some("n"),
            ));
        }
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(Rejection::bad("'stream' must be a boolean", Some("stream"))),
    };
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let seed = match body.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            Rejection::bad("'seed' must be a non-negative integer", Some("seed"))
        })?),
    };
    let return_token_ids = body
        .get("return_token_ids")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(ParsedRequest {
        endpoint,
        body,
        prompt,
        stream,
        include_usage,
        max_tokens,
        seed,
        return_token_ids,
    })
}

/// Adds token ids to a response or chunk as vLLM does under `return_token_ids`: the
/// output's in `choices[0].token_ids`; the prompt's (`prompt`, on the whole response or
/// the first chunk) top-level for chat, in the choice for completions.
pub fn add_token_ids(
    value: &mut Value,
    endpoint: Endpoint,
    prompt: Option<&[u32]>,
    output: &[u32],
) {
    if let Some(choice) = value
        .pointer_mut("/choices/0")
        .and_then(Value::as_object_mut)
    {
        choice.insert("token_ids".into(), json!(output));
        if let (Endpoint::Completions, Some(p)) = (endpoint, prompt) {
            choice.insert("prompt_token_ids".into(), json!(p));
        }
    }
    if let (Endpoint::Chat, Some(p), Some(map)) = (endpoint, prompt, value.as_object_mut()) {
        map.insert("prompt_token_ids".into(), json!(p));
    }
}

fn parse_prompt(prompt: Option<&Value>) -> Result<PromptInput, Rejection> {
    let bad = |m: &str| Rejection::bad(m, Some("prompt"));
    match prompt {
        Some(Value::String(s)) if !s.is_empty() => Ok(PromptInput::Text(s.clone())),
        Some(Value::String(_)) => Err(bad("'prompt' must not be empty")),
        Some(Value::Array(items)) if items.is_empty() => Err(bad("'prompt' must not be empty")),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Ok(PromptInput::Tokens(
            items
                .iter()
                .filter_map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect(),
        )),
        Some(Value::Array(items)) if items.len() == 1 => parse_prompt(items.first()),
        Some(Value::Array(_)) => Err(bad(
            "batched prompts are not supported: send one prompt per request",
        )),
        Some(_) => Err(bad("'prompt' must be a string or a list of token ids")),
        None => Err(bad("'prompt' is required")),
    }
}

/// Identity of one response.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// Endpoint.
    pub endpoint: Endpoint,
}

/// `usage`, with `prompt_tokens_details.cached_tokens`.
pub fn build_usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// One SSE chunk carrying `text` (the first chat chunk also carries the role).
pub fn build_chunk(meta: &ResponseMeta, text: &str, first: bool, finish: Option<&str>) -> Value {
    match meta.endpoint {
        Endpoint::Chat => {
            let delta = if first {
                json!({"role": "assistant", "content": text})
            } else {
                json!({"content": text})
            };
            json!({
                "id": meta.id, "object": "chat.completion.chunk", "created": meta.created,
                "model": meta.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            })
        }
        Endpoint::Completions => json!({
            "id": meta.id, "object": "text_completion", "created": meta.created,
            "model": meta.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
        }),
    }
}

/// The final usage chunk of a stream (`stream_options.include_usage`).
pub fn build_usage_chunk(meta: &ResponseMeta, usage: Value) -> Value {
    let object = match meta.endpoint {
        Endpoint::Chat => "chat.completion.chunk",
        Endpoint::Completions => "text_completion",
    };
    json!({"id": meta.id, "object": object, "created": meta.created, "model": meta.model,
           "choices": [], "usage": usage})
}

/// A whole (non-streaming) response.
pub fn build_response(
    meta: &ResponseMeta,
    text: &str,
    finish: &str,
    usage: Value,
    kv_transfer_params: Option<Value>,
) -> Value {
    let choice = match meta.endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": null, "finish_reason": finish,
        }),
        Endpoint::Completions => {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        }
    };
    let object = match meta.endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completions => "text_completion",
    };
    let mut out = json!({
        "id": meta.id, "object": object, "created": meta.created, "model": meta.model,
        "choices": [choice], "usage": usage,
    });
    if let (Some(params), Some(obj)) = (kv_transfer_params, out.as_object_mut()) {
        obj.insert("kv_transfer_params".into(), params);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(endpoint: Endpoint, body: &str) -> Result<ParsedRequest, Rejection> {
        parse_request(endpoint, body.as_bytes(), "sim-model", 16)
    }

    #[test]
    fn accepts_good_requests() {
        let r = parse(Endpoint::Chat, r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
        assert_eq!((r.max_tokens, r.stream, r.include_usage), (3, true, true));
        let r = parse(
            Endpoint::Completions,
            r#"{"prompt":[1,2,3],"max_completion_tokens":2}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, PromptInput::Tokens(vec![1, 2, 3]));
        assert_eq!(r.max_tokens, 2);
        let r = parse(Endpoint::Completions, r#"{"prompt":["one"]}"#).unwrap();
        assert_eq!(
            (r.prompt, r.max_tokens),
            (PromptInput::Text("one".into()), 16)
        );
    }

    #[test]
    fn rejects_bad_requests_naming_the_parameter() {
        let cases = [
            (Endpoint::Chat, "{", 400, None),
            (Endpoint::Chat, "[]", 400, None),
            (
                Endpoint::Chat,
                r#"{"model":"other","messages":[{"role":"user","content":"x"}]}"#,
                404,
                Some("model"),
            ),
            (Endpoint::Chat, r#"{"messages":[]}"#, 400, Some("messages")),
            (
                Endpoint::Chat,
                r#"{"messages":"hi"}"#,
                400,
                Some("messages"),
            ),
            (Endpoint::Chat, r#"{}"#, 400, Some("messages")),
            (
                Endpoint::Chat,
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                400,
                Some("max_tokens"),
            ),
            (
                Endpoint::Chat,
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"5"}"#,
                400,
                Some("max_tokens"),
            ),
            (
                Endpoint::Chat,
                r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#,
                400,
                Some("n"),
            ),
            (
                Endpoint::Chat,
                r#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                400,
                Some("stream"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":""}"#,
                400,
                Some("prompt"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":["a","b"]}"#,
                400,
                Some("prompt"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":5}"#,
                400,
                Some("prompt"),
            ),
            (Endpoint::Completions, r#"{}"#, 400, Some("prompt")),
        ];
        for (endpoint, body, status, param) in cases {
            let err = parse(endpoint, body).unwrap_err();
            assert_eq!(
                (err.status, err.param.as_deref()),
                (status, param),
                "{body}"
            );
        }
    }

    #[test]
    fn response_shapes() {
        let meta = ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
            endpoint: Endpoint::Chat,
        };
        assert_eq!(
            build_chunk(&meta, "Hi", true, None).to_string(),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}]}"#
        );
        let full = build_response(&meta, "Hi", "length", build_usage(5, 1, 4), None);
        assert_eq!(full["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(full["choices"][0]["message"]["content"], "Hi");
        assert!(full.get("kv_transfer_params").is_none());
    }
}
