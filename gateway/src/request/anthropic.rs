//! Anthropic Messages (`/v1/messages`) translated to OpenAI chat for the engines and
//! back: requests, whole responses, and SSE streams, tools included. The translation is
//! pure; the HTTP front's `/v1/messages` handler ([`crate::http`]) applies it to a
//! forwarded worker response (read whole, or relayed and re-framed event by event).

use crate::request::validate::MAX_TOKENS_LIMIT;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use infera_proto::error_class::{ApiError, ErrorClass};
use serde_json::{Map, Value, json};
use std::io;

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::new(ErrorClass::BadRequest, message).with_param(param)
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| {
                (b.get("type").and_then(Value::as_str) == Some("text"))
                    .then(|| b.get("text")?.as_str())
                    .flatten()
            })
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// An Anthropic Messages request as an OpenAI chat request.
pub fn build_chat_request(body: &Value) -> Result<Map<String, Value>, ApiError> {
    let Some(obj) = body.as_object() else {
        return Err(ApiError::new(
            ErrorClass::BadRequest,
            "request body must be a JSON object",
        ));
    };
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("model: field required", "model"))?;
    let max_tokens = obj
        .get("max_tokens")
        .and_then(Value::as_u64)
        .filter(|n| (1..=MAX_TOKENS_LIMIT).contains(n))
        .ok_or_else(|| {
            bad(
                format!("max_tokens: field required (a positive integer up to {MAX_TOKENS_LIMIT})"),
                "max_tokens",
            )
        })?;
    let messages = match obj.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        _ => return Err(bad("messages: a non-empty list is required", "messages")),
    };
    let mut out_messages: Vec<Value> = Vec::new();
    if let Some(system) = obj.get("system").filter(|s| !s.is_null()) {
        out_messages.push(json!({"role": "system", "content": text_of(system)}));
    }
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        if !matches!(role, Some("user" | "assistant")) {
            return Err(bad(
                format!("messages.{i}.role: must be 'user' or 'assistant'"),
                &format!("messages.{i}.role"),
            ));
        }
        let role = role.unwrap_or("user");
        match m.get("content") {
            Some(Value::String(s)) => out_messages.push(json!({"role": role, "content": s})),
            Some(Value::Array(blocks)) => translate_blocks(role, blocks, i, &mut out_messages)?,
            _ => {
                return Err(bad(
                    format!("messages.{i}.content: a string or a list of blocks is required"),
                    &format!("messages.{i}.content"),
                ));
            }
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert("messages".into(), Value::Array(out_messages));
    out.insert("max_tokens".into(), json!(max_tokens));
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").cloned().unwrap_or(Value::Null),
                    "description": t.get("description").cloned().unwrap_or(Value::Null),
                    "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"})),
                }})
            })
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = obj.get("tool_choice") {
        let mapped = match choice.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                json!({"type": "function", "function": {"name": choice.get("name").cloned().unwrap_or(Value::Null)}})
            }
            _ => {
                return Err(bad(
                    "tool_choice.type must be auto, any, tool or none",
                    "tool_choice",
                ));
            }
        };
        out.insert("tool_choice".into(), mapped);
    }
    if let Some(stop) = obj.get("stop_sequences") {
        out.insert("stop".into(), stop.clone());
    }
    for key in ["temperature", "top_p", "top_k"] {
        if let Some(v) = obj.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if obj.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(out)
}

fn translate_blocks(
    role: &str,
    blocks: &[Value],
    i: usize,
    out: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let mut parts: Vec<Value> = Vec::new();
    let mut tool_calls: Vec<Value> = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(json!({"type": "text", "text": b.get("text").cloned().unwrap_or(json!(""))})),
            Some("image") => {
                let src = b.get("source").cloned().unwrap_or(Value::Null);
                let url = match src.get("type").and_then(Value::as_str) {
                    Some("base64") => format!(
                        "data:{};base64,{}",
                        src.get("media_type").and_then(Value::as_str).unwrap_or("image/png"),
                        src.get("data").and_then(Value::as_str).unwrap_or("")
                    ),
                    _ => src.get("url").and_then(Value::as_str).unwrap_or("").to_owned(),
                };
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Some("tool_use") => tool_calls.push(json!({
                "id": b.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": b.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": b.get("input").map(Value::to_string).unwrap_or_else(|| "{}".into()),
                },
            })),
            Some("tool_result") => out.push(json!({
                "role": "tool",
                "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                "content": b.get("content").map(text_of).unwrap_or_default(),
            })),
            _ => {
                return Err(bad(
                    format!("messages.{i}.content.{j}.type: expected text, image, tool_use or tool_result"),
                    &format!("messages.{i}.content.{j}.type"),
                ));
            }
        }
    }
    if !parts.is_empty() || !tool_calls.is_empty() {
        let all_text = parts
            .iter()
            .all(|p| p.get("type").and_then(Value::as_str) == Some("text"));
        let content = if all_text {
            json!(
                parts
                    .iter()
                    .filter_map(|p| p.get("text")?.as_str())
                    .collect::<Vec<_>>()
                    .join("")
            )
        } else {
            Value::Array(parts)
        };
        let mut msg = json!({"role": role, "content": content});
        if !tool_calls.is_empty() {
            msg["tool_calls"] = Value::Array(tool_calls);
        }
        out.push(msg);
    }
    Ok(())
}

fn stop_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        _ => "end_turn",
    }
}

fn usage(u: Option<&Value>) -> Value {
    let get = |k: &str| {
        u.and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let cached = u
        .and_then(|u| {
            u.get("prompt_tokens_details")?
                .get("cached_tokens")?
                .as_u64()
        })
        .unwrap_or(0);
    json!({"input_tokens": get("prompt_tokens"), "output_tokens": get("completion_tokens"), "cache_read_input_tokens": cached})
}

/// A whole OpenAI chat response as an Anthropic message.
pub(crate) fn build_message_response(chat: &Value, model: &str) -> Value {
    let choice = chat.get("choices").and_then(|c| c.get(0));
    let message = choice.and_then(|c| c.get("message"));
    let mut content = Vec::new();
    if let Some(text) = message
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in message
        .and_then(|m| m.get("tool_calls"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let args = call
            .get("function")
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("{}");
        content.push(json!({
            "type": "tool_use",
            "id": call.get("id").cloned().unwrap_or(Value::Null),
            "name": call.get("function").and_then(|f| f.get("name")).cloned().unwrap_or(Value::Null),
            "input": serde_json::from_str::<Value>(args).unwrap_or(json!({})),
        }));
    }
    json!({
        "id": format!("msg_{}", chat.get("id").and_then(Value::as_str).unwrap_or("infera")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice.and_then(|c| c.get("finish_reason")).and_then(Value::as_str)),
        "stop_sequence": null,
        "usage": usage(chat.get("usage")),
    })
}

/// Turns an OpenAI chat SSE stream into Anthropic's event stream.
#[derive(Debug)]
pub(crate) struct StreamTranslator {
    model: String,
    id: String,
    started: bool,
    text_index: Option<usize>,
    tool_index: Vec<(u64, usize)>,
    next_index: usize,
    finish: Option<String>,
    usage: Value,
    done: bool,
}

impl StreamTranslator {
    /// A translator for one response.
    pub(crate) fn new(model: &str, request_id: &str) -> Self {
        Self {
            model: model.to_owned(),
            id: format!("msg_{request_id}"),
            started: false,
            text_index: None,
            tool_index: Vec::new(),
            next_index: 0,
            finish: None,
            usage: usage(None),
            done: false,
        }
    }

    fn start(&mut self, out: &mut Vec<(&'static str, Value)>) {
        if !self.started {
            self.started = true;
            out.push((
                "message_start",
                json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            ));
        }
    }

    /// Events for one upstream `data:` payload (`[DONE]` ends the message).
    pub(crate) fn on_data(&mut self, data: &str) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        if data.trim() == "[DONE]" {
            return self.finish();
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return out;
        };
        if let Some(err) = chunk.get("error") {
            self.done = true;
            let message = err
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| err.to_string());
            out.push((
                "error",
                json!({"type": "error", "error": {"type": "api_error", "message": message}}),
            ));
            return out;
        }
        self.start(&mut out);
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = usage(Some(u));
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return out;
        };
        let delta = choice.get("delta").cloned().unwrap_or(Value::Null);
        if let Some(text) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            let index = match self.text_index {
                Some(i) => i,
                None => {
                    let i = self.next_index;
                    self.next_index += 1;
                    self.text_index = Some(i);
                    out.push((
                        "content_block_start",
                        json!({"type": "content_block_start", "index": i,
                        "content_block": {"type": "text", "text": ""}}),
                    ));
                    i
                }
            };
            out.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": text}}),
            ));
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let index = match self.tool_index.iter().find(|(k, _)| *k == key) {
                Some((_, i)) => *i,
                None => {
                    if let Some(t) = self.text_index.take() {
                        out.push((
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": t}),
                        ));
                    }
                    let i = self.next_index;
                    self.next_index += 1;
                    self.tool_index.push((key, i));
                    out.push(("content_block_start", json!({"type": "content_block_start", "index": i,
                        "content_block": {"type": "tool_use",
                            "id": call.get("id").cloned().unwrap_or(Value::Null),
                            "name": call.get("function").and_then(|f| f.get("name")).cloned().unwrap_or(Value::Null),
                            "input": {}}})));
                    i
                }
            };
            if let Some(args) = call
                .get("function")
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
            {
                out.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": args}}),
                ));
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_owned());
        }
        out
    }

    /// Closing events (also when the upstream ended without `[DONE]`).
    pub(crate) fn finish(&mut self) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        self.done = true;
        self.start(&mut out);
        let mut open: Vec<usize> = self
            .text_index
            .take()
            .into_iter()
            .chain(self.tool_index.iter().map(|(_, i)| *i))
            .collect();
        open.sort_unstable();
        for i in open {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
        out.push((
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(self.finish.as_deref()), "stop_sequence": null},
            "usage": self.usage}),
        ));
        out.push(("message_stop", json!({"type": "message_stop"})));
        out
    }
}

/// One SSE event in Anthropic's framing.
pub(crate) fn format_event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// The end (past its blank line) of the first whole SSE event in `buf` from `start`.
/// Bytes after it are kept, so a character split across upstream chunks is decoded
/// whole.
fn event_end(buf: &[u8], start: usize) -> Option<usize> {
    Some(start + buf[start..].windows(2).position(|w| w == b"\n\n")? + 2)
}

impl StreamTranslator {
    /// The Anthropic events for one whole OpenAI event.
    fn on_event(&mut self, event: &[u8]) -> String {
        let mut out = String::new();
        for line in String::from_utf8_lossy(event).lines() {
            if let Some(data) = line.strip_prefix("data:") {
                for (name, value) in self.on_data(data.trim_start()) {
                    out.push_str(&format_event(name, &value));
                }
            }
        }
        out
    }

    /// Re-frames an OpenAI SSE byte stream as Anthropic's.
    pub(crate) fn translate<S>(
        self,
        upstream: S,
    ) -> impl Stream<Item = Result<Bytes, io::Error>> + Send
    where
        S: Stream<Item = Result<Bytes, io::Error>> + Send + 'static,
    {
        let state = (Box::pin(upstream), self, Vec::<u8>::new(), false);
        futures::stream::unfold(state, |(mut up, mut tr, mut buf, ended)| async move {
            if ended {
                return None;
            }
            loop {
                // Every whole event that arrived goes out in one write; the buffer is
                // scanned once and drained once.
                let mut out = String::new();
                let mut start = 0;
                while let Some(end) = event_end(&buf, start) {
                    out.push_str(&tr.on_event(&buf[start..end]));
                    start = end;
                }
                buf.drain(..start);
                if !out.is_empty() {
                    return Some((Ok(Bytes::from(out)), (up, tr, buf, false)));
                }
                match up.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => return Some((Err(e), (up, tr, buf, true))),
                    None => {
                        let out: String = tr
                            .finish()
                            .into_iter()
                            .map(|(n, v)| format_event(n, &v))
                            .collect();
                        return (!out.is_empty())
                            .then(|| (Ok(Bytes::from(out)), (up, tr, buf, true)));
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_with_system_tools_and_tool_turns() {
        let body = json!({
            "model": "m", "max_tokens": 64, "stream": true,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "21C"}]}
            ]
        });
        let chat = Value::Object(build_chat_request(&body).unwrap());
        assert_eq!(
            chat["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(
            chat["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(
            chat["messages"][3],
            json!({"role": "tool", "tool_call_id": "tu_1", "content": "21C"})
        );
        assert_eq!(
            chat["tools"][0]["function"]["parameters"]["properties"]["city"]["type"],
            "string"
        );
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["stream_options"]["include_usage"], true);
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (body, param) in [
            (
                json!({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}),
                "model",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": []}),
                "messages",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}),
                "messages.0.role",
            ),
        ] {
            assert_eq!(
                build_chat_request(&body).unwrap_err().param.as_deref(),
                Some(param)
            );
        }
    }

    #[test]
    fn response_with_text_and_tool_use() {
        let chat = json!({"id": "chatcmpl-1", "choices": [{"message": {"content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8}}});
        let msg = build_message_response(&chat, "m");
        assert_eq!(
            msg["content"][0],
            json!({"type": "text", "text": "Checking."})
        );
        assert_eq!(msg["content"][1]["input"], json!({"city": "Paris"}));
        assert_eq!(msg["stop_reason"], "tool_use");
        assert_eq!(
            msg["usage"],
            json!({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 8})
        );
    }

    #[test]
    fn stream_events_in_order() {
        let mut t = StreamTranslator::new("m", "r1");
        let mut names = Vec::new();
        for data in [
            r#"{"choices":[{"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
            r#"{"choices":[{"delta":{"content":" there"},"finish_reason":"length"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
            "[DONE]",
        ] {
            names.extend(t.on_data(data).into_iter().map(|(n, _)| n));
        }
        assert_eq!(
            names,
            vec![
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert!(t.finish().is_empty(), "finishing twice adds nothing");
    }

    #[tokio::test]
    async fn characters_split_across_chunks_arrive_whole() {
        let text = "你好🦄é";
        let event = format!(
            "data: {}\n\ndata: [DONE]\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": text}}]})
        );
        let bytes = event.as_bytes();
        // Every split point, including inside each multi-byte character.
        for cut in 1..bytes.len() {
            let chunks = vec![
                Ok(Bytes::copy_from_slice(&bytes[..cut])),
                Ok(Bytes::copy_from_slice(&bytes[cut..])),
            ];
            let out: Vec<Result<Bytes, io::Error>> = StreamTranslator::new("m", "r")
                .translate(futures::stream::iter(chunks))
                .collect()
                .await;
            let out: Vec<u8> = out.into_iter().flat_map(|b| b.unwrap().to_vec()).collect();
            let out = String::from_utf8(out).unwrap();
            assert!(out.contains(text), "cut at {cut}: {out}");
            assert!(!out.contains('\u{fffd}'), "cut at {cut}: {out}");
        }
    }
}
