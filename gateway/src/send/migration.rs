//! Continuing a streamed generation on another worker when its own fails or drains
//! mid-stream (`--migration-limit`). Pure: [`MigrationState`] reads every SSE event on
//! its way to the client (what the client received is what is carried), takes out the
//! token ids the gateway asked for, and builds the [`Continuation`] request: the prompt
//! plus what was generated, the token budget reduced by what was spent. Exact token ids
//! when the engine reported them (a chat request then continues on `/v1/completions`
//! and its chunks are put back in the chat shape), the text otherwise (chat: a final
//! assistant turn the engine continues, `continue_final_message`). A request that cannot
//! be continued honestly (several choices, a tool call under way, a fixed seed,
//! unparseable events) is marked, and its stream ends with an error event instead.

use crate::request::validate::ApiKind;
use infera_proto::worker::EngineKind;
use serde_json::{Map, Value, json};

const DATA: &[u8] = b"data: ";
const DONE: &[u8] = b"data: [DONE]";

/// The request that makes another worker finish a generation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Continuation {
    /// The body to send.
    pub body: Map<String, Value>,
    /// Where to send it (a chat request continued from exact ids goes to completions).
    pub kind: ApiKind,
    /// Continued from token ids (else from text).
    pub exact: bool,
    /// It may move again (migrations left): a worker may hand it back.
    pub movable: bool,
}

/// Why a generation cannot be carried (the `reason` of `infera_migrations_failed_total`
/// is `poisoned` for all of these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unmigratable {
    /// `n` or `best_of` above 1, or a batch of prompts.
    SeveralChoices,
    /// The client fixed `seed` to reproduce its output.
    FixedSeed,
    /// A tool call or reasoning was streamed (text cannot carry it).
    NotPlainText,
    /// An event was not JSON.
    Unparseable,
    /// A pre-tokenized prompt with output the engine did not give ids for.
    TokensWithoutIds,
}

impl Unmigratable {
    /// What the client's error event says.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::SeveralChoices => "it asked for more than one choice",
            Self::FixedSeed => "it fixed a sampling seed",
            Self::NotPlainText => "a tool call or reasoning was under way",
            Self::Unparseable => "the worker's stream was not JSON events",
            Self::TokensWithoutIds => "its token prompt cannot be extended with text",
        }
    }
}

/// Whether the gateway may ask `engine` for token ids on `kind`: vLLM everywhere, SGLang
/// on completions (it refuses them on streaming chat), ATOM not at all.
pub(crate) fn asks_token_ids(engine: EngineKind, kind: ApiKind) -> bool {
    match engine {
        EngineKind::Vllm => true,
        EngineKind::Sglang => kind == ApiKind::Completions,
        EngineKind::Atom => false,
    }
}

/// What has been relayed so far, and what carrying it costs.
#[derive(Debug, Clone)]
pub(crate) struct MigrationState {
    original: Map<String, Value>,
    kind: ApiKind,
    client_asked_ids: bool,
    text: String,
    text_events: usize,
    output_ids: Vec<u64>,
    prompt_ids: Option<Vec<u64>>,
    ids_cover_output: bool,
    migrations_left: u32,
    refused: Option<Unmigratable>,
    pending: Vec<u8>,
    /// The current worker answers on completions for a chat client.
    reshape: bool,
    /// Tokens carried into the current worker's prompt (its usage is corrected).
    carried: u64,
    /// `id` and `created` of the first worker's events (kept across a move).
    identity: Option<(Value, Value)>,
    finished: bool,
    done_seen: bool,
}

impl MigrationState {
    /// The state of a streamed `kind` request with `body`, allowed `limit` migrations.
    pub(crate) fn new(body: &Map<String, Value>, kind: ApiKind, limit: u32) -> Self {
        let refused = refusal_of(body);
        Self {
            original: body.clone(),
            kind,
            client_asked_ids: body.contains_key("return_token_ids"),
            text: String::new(),
            text_events: 0,
            output_ids: Vec::new(),
            prompt_ids: None,
            ids_cover_output: true,
            migrations_left: limit,
            refused,
            pending: Vec::new(),
            reshape: false,
            carried: 0,
            identity: None,
            finished: false,
            done_seen: false,
        }
    }

    /// Why this generation cannot move, if it cannot.
    pub(crate) fn refusal(&self) -> Option<Unmigratable> {
        self.refused
    }

    /// A chunk from `finish_reason` on has been relayed: nothing is left to generate.
    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// The worker's `data: [DONE]` has been relayed.
    pub(crate) fn done_seen(&self) -> bool {
        self.done_seen
    }

    /// Tokens generated so far: exact with ids, else one per event that carried text.
    pub(crate) fn produced_tokens(&self) -> u64 {
        if self.has_exact_output() {
            self.output_ids.len() as u64
        } else {
            self.text_events as u64
        }
    }

    #[cfg(test)]
    /// The generated text so far.
    pub(crate) fn produced_text(&self) -> &str {
        &self.text
    }

    fn has_exact_output(&self) -> bool {
        self.ids_cover_output && !self.output_ids.is_empty()
    }

    /// Whether the continuation would be exact (prompt and output ids known).
    pub(crate) fn is_exact(&self) -> bool {
        self.prompt_ids.as_ref().is_some_and(|p| !p.is_empty()) && self.has_exact_output()
    }

    /// Reads a chunk of the worker's stream and returns what goes to the client: whole
    /// events only (a partial line waits for the rest), token ids taken out unless the
    /// client asked for them, a continuation's events in the client's shape.
    pub(crate) fn observe(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        let Some(end) = self.pending.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        let rest = self.pending.split_off(end + 1);
        let whole = std::mem::replace(&mut self.pending, rest);
        let mut out = Vec::with_capacity(whole.len());
        for line in whole.split_inclusive(|&b| b == b'\n') {
            let trimmed = line.trim_ascii();
            if trimmed.starts_with(DONE) {
                self.done_seen = true;
            }
            if !trimmed.starts_with(DATA) || trimmed.starts_with(DONE) {
                out.extend_from_slice(line);
                continue;
            }
            match serde_json::from_slice::<Value>(&trimmed[DATA.len()..]) {
                Ok(Value::Object(mut event)) => {
                    self.record(&event);
                    if self.rewrite(&mut event) {
                        out.extend_from_slice(DATA);
                        out.extend_from_slice(&serde_json::to_vec(&event).unwrap_or_default());
                        out.push(b'\n');
                    } else {
                        out.extend_from_slice(line);
                    }
                }
                _ => {
                    self.refused.get_or_insert(Unmigratable::Unparseable);
                    out.extend_from_slice(line);
                }
            }
        }
        out
    }

    /// What is left of a partial line when the stream ends.
    pub(crate) fn take_pending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }

    fn record(&mut self, event: &Map<String, Value>) {
        if self.identity.is_none()
            && let (Some(id), Some(created)) = (event.get("id"), event.get("created"))
        {
            self.identity = Some((id.clone(), created.clone()));
        }
        let choices = event.get("choices").and_then(Value::as_array);
        if choices.is_some_and(|c| c.len() > 1) {
            self.refused.get_or_insert(Unmigratable::SeveralChoices);
            return;
        }
        let Some(choice) = choices.and_then(|c| c.first()).and_then(Value::as_object) else {
            return;
        };
        if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
            self.finished = true;
        }
        if self.prompt_ids.is_none() {
            self.prompt_ids = prompt_ids_of(event, choice);
        }
        let delta = choice.get("delta").and_then(Value::as_object);
        if delta.is_some_and(|d| {
            ["tool_calls", "reasoning_content", "function_call"]
                .iter()
                .any(|k| d.get(*k).is_some_and(|v| !v.is_null()))
        }) {
            self.refused.get_or_insert(Unmigratable::NotPlainText);
            return;
        }
        let ids = output_ids_of(event, choice);
        if let Some(ids) = &ids {
            self.output_ids.extend_from_slice(ids);
        }
        let text = match delta {
            Some(d) => d.get("content").and_then(Value::as_str),
            None => choice.get("text").and_then(Value::as_str),
        }
        .filter(|t| !t.is_empty());
        let Some(text) = text else { return };
        if ids.is_none() {
            self.ids_cover_output = false;
            if !self.original.get("prompt").is_none_or(Value::is_string) {
                self.refused.get_or_insert(Unmigratable::TokensWithoutIds);
            }
        }
        self.text.push_str(text);
        self.text_events += 1;
    }

    /// Puts an event in the client's shape; whether it changed.
    fn rewrite(&self, event: &mut Map<String, Value>) -> bool {
        let mut changed = false;
        if !self.client_asked_ids {
            changed |= event.remove("prompt_token_ids").is_some();
            changed |= event.remove("sglext").is_some();
            if let Some(choices) = event.get_mut("choices").and_then(Value::as_array_mut) {
                for c in choices.iter_mut().filter_map(Value::as_object_mut) {
                    changed |= c.remove("token_ids").is_some();
                    changed |= c.remove("prompt_token_ids").is_some();
                }
            }
        }
        if self.carried > 0 {
            if let Some((id, created)) = &self.identity {
                event.insert("id".into(), id.clone());
                event.insert("created".into(), created.clone());
            }
            if let Some(usage) = event.get_mut("usage").and_then(Value::as_object_mut) {
                correct_usage(usage, self.carried);
            }
            // The role opened the stream once, on the first worker.
            if let Some(choices) = event.get_mut("choices").and_then(Value::as_array_mut) {
                for c in choices.iter_mut().filter_map(Value::as_object_mut) {
                    if let Some(delta) = c.get_mut("delta").and_then(Value::as_object_mut) {
                        delta.remove("role");
                    }
                }
            }
            changed = true;
        }
        if self.reshape {
            event.insert("object".into(), json!("chat.completion.chunk"));
            if let Some(choices) = event.get_mut("choices").and_then(Value::as_array_mut) {
                for c in choices.iter_mut().filter_map(Value::as_object_mut) {
                    if let Some(text) = c.remove("text") {
                        c.insert(
                            "delta".into(),
                            json!({"content": text.as_str().unwrap_or("")}),
                        );
                        // Completions logprobs have another shape; `null` is the same.
                        if c.get("logprobs").is_some_and(|l| !l.is_null()) {
                            c.remove("logprobs");
                        }
                    }
                }
            }
            changed = true;
        }
        changed
    }

    fn movable(&self) -> bool {
        self.refused.is_none() && self.migrations_left > 0
    }

    /// Whether the generation may move now.
    pub(crate) fn can_migrate(&self) -> bool {
        self.refused.is_none() && self.migrations_left > 0 && !self.finished
    }

    /// The request that continues the generation on another worker (one migration
    /// spent); the following events are read as that request's.
    pub(crate) fn next_continuation(&mut self) -> Continuation {
        self.migrations_left = self.migrations_left.saturating_sub(1);
        self.pending.clear();
        let produced = self.produced_tokens();
        let mut body = self.original.clone();
        for key in ["max_tokens", "max_completion_tokens"] {
            if let Some(budget) = body.get(key).and_then(Value::as_u64) {
                body.insert(key.into(), json!(budget.saturating_sub(produced).max(1)));
            }
        }
        body.remove("return_token_ids");
        let convertible = self.kind == ApiKind::Completions
            || ![
                "tools",
                "functions",
                "tool_choice",
                "function_call",
                "response_format",
            ]
            .iter()
            .any(|f| body.get(*f).is_some_and(|v| !v.is_null()));
        let cont = if self.is_exact() && convertible {
            let mut prompt = self.prompt_ids.clone().unwrap_or_default();
            prompt.extend_from_slice(&self.output_ids);
            // The prompt is complete: what shapes a chat prompt has been applied.
            for chat_only in [
                "messages",
                "add_generation_prompt",
                "continue_final_message",
                "chat_template",
                "chat_template_kwargs",
            ] {
                body.remove(chat_only);
            }
            if self.kind == ApiKind::Chat {
                // Completions read `max_tokens` only (vLLM's default there is 16): the
                // chat budget moves to it, and no budget is `null`, the context's end.
                let budget = body
                    .remove("max_completion_tokens")
                    .filter(|v| !v.is_null())
                    .or_else(|| body.get("max_tokens").cloned())
                    .unwrap_or(Value::Null);
                body.insert("max_tokens".into(), budget);
            }
            self.carried = produced;
            body.insert("prompt".into(), json!(prompt));
            Continuation {
                body,
                kind: ApiKind::Completions,
                exact: true,
                movable: self.movable(),
            }
        } else {
            if let Some(Value::Array(messages)) = body.get_mut("messages") {
                // Built from the original each time: a second move carries all the text
                // in one assistant turn.
                messages.push(json!({"role": "assistant", "content": self.text}));
                body.insert("continue_final_message".into(), json!(true));
                body.insert("add_generation_prompt".into(), json!(false));
            } else if let Some(Value::String(prompt)) = self.original.get("prompt") {
                body.insert("prompt".into(), json!(format!("{prompt}{}", self.text)));
            }
            self.carried = produced;
            // Ids from here on would not line up with the carried text.
            self.ids_cover_output = false;
            Continuation {
                body,
                kind: self.kind,
                exact: false,
                movable: self.movable(),
            }
        };
        self.reshape = self.kind == ApiKind::Chat && cont.kind == ApiKind::Completions;
        cont
    }
}

/// The request-level reasons a generation cannot be carried.
fn refusal_of(body: &Map<String, Value>) -> Option<Unmigratable> {
    let several = ["n", "best_of"]
        .iter()
        .any(|k| body.get(*k).and_then(Value::as_u64).is_some_and(|n| n > 1));
    let batch = match body.get("prompt") {
        Some(Value::Array(items)) => !items.iter().all(Value::is_u64) || items.is_empty(),
        _ => false,
    };
    if several || batch {
        Some(Unmigratable::SeveralChoices)
    } else if body.get("seed").is_some_and(|s| !s.is_null()) {
        Some(Unmigratable::FixedSeed)
    } else {
        None
    }
}

/// A continuation's usage counts the carried tokens as prompt; the client's request
/// generated them.
fn correct_usage(usage: &mut Map<String, Value>, carried: u64) {
    let get = |u: &Map<String, Value>, k: &str| u.get(k).and_then(Value::as_u64);
    if let (Some(p), Some(c)) = (get(usage, "prompt_tokens"), get(usage, "completion_tokens")) {
        usage.insert("prompt_tokens".into(), json!(p.saturating_sub(carried)));
        usage.insert("completion_tokens".into(), json!(c + carried));
    }
}

fn id_list(v: Option<&Value>) -> Option<Vec<u64>> {
    v?.as_array()?.iter().map(Value::as_u64).collect()
}

/// The prompt's ids, on the first event: vLLM's `prompt_token_ids` (top level or in the
/// choice), SGLang's `sglext.prompt_token_ids`.
fn prompt_ids_of(event: &Map<String, Value>, choice: &Map<String, Value>) -> Option<Vec<u64>> {
    id_list(event.get("prompt_token_ids"))
        .or_else(|| id_list(choice.get("prompt_token_ids")))
        .or_else(|| id_list(event.get("sglext").and_then(|e| e.get("prompt_token_ids"))))
}

/// The ids generated in this event: vLLM's `choices[0].token_ids`, SGLang's
/// `sglext.completion_token_ids[0]`.
fn output_ids_of(event: &Map<String, Value>, choice: &Map<String, Value>) -> Option<Vec<u64>> {
    id_list(choice.get("token_ids")).or_else(|| {
        let ext = event.get("sglext")?;
        id_list(ext.get("completion_token_ids").and_then(|c| c.get(0)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn event(v: Value) -> Vec<u8> {
        format!("data: {v}\n\n").into_bytes()
    }

    fn chat_chunk(text: &str, ids: Option<&[u64]>, prompt: Option<&[u64]>) -> Vec<u8> {
        let mut choice = json!({"index": 0, "delta": {"content": text}, "finish_reason": null});
        if let Some(ids) = ids {
            choice["token_ids"] = json!(ids);
        }
        let mut e = json!({"id": "chatcmpl-1", "created": 7, "object": "chat.completion.chunk", "choices": [choice]});
        if let Some(p) = prompt {
            e["prompt_token_ids"] = json!(p);
        }
        event(e)
    }

    #[test]
    fn exact_chat_continues_on_completions_in_the_chat_shape() {
        let b = body(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": true}),
        );
        let mut st = MigrationState::new(&b, ApiKind::Chat, 1);
        let out = st.observe(&chat_chunk("a", Some(&[5]), Some(&[1, 2])));
        assert!(
            !String::from_utf8_lossy(&out).contains("token_ids"),
            "ids taken out"
        );
        st.observe(&chat_chunk("b", Some(&[6]), None));
        assert_eq!(st.produced_tokens(), 2);
        assert!(st.is_exact() && st.can_migrate());
        let cont = st.next_continuation();
        assert!(cont.exact);
        assert_eq!(cont.kind, ApiKind::Completions);
        assert_eq!(cont.body["prompt"], json!([1, 2, 5, 6]));
        assert_eq!(cont.body["max_tokens"], json!(8));
        assert!(!cont.body.contains_key("messages"));
        assert!(!st.can_migrate() && !cont.movable, "limit 1 spent");
        // A chat budget in max_completion_tokens (or none) becomes completions' max_tokens.
        for (budget, want) in [
            (json!({"max_completion_tokens": 10}), json!(9)),
            (json!({}), Value::Null),
        ] {
            let mut b = body(json!({"model": "m", "messages": [], "stream": true}));
            b.extend(budget.as_object().unwrap().clone());
            let mut st = MigrationState::new(&b, ApiKind::Chat, 2);
            st.observe(&chat_chunk("a", Some(&[5]), Some(&[1, 2])));
            let cont = st.next_continuation();
            assert_eq!(cont.body["max_tokens"], want);
            assert!(!cont.body.contains_key("max_completion_tokens"));
            assert!(cont.movable, "one move left");
        }
        // The continuation answers in the completions shape, with its own id.
        let next = event(
            json!({"id": "cmpl-9", "created": 9, "object": "text_completion",
            "choices": [{"index": 0, "text": "c", "token_ids": [7], "finish_reason": null}]}),
        );
        let out: Value = serde_json::from_slice(&st.observe(&next)[6..]).unwrap();
        assert_eq!(out["object"], "chat.completion.chunk");
        assert_eq!(out["id"], "chatcmpl-1");
        assert_eq!(out["created"], 7);
        assert_eq!(out["choices"][0]["delta"]["content"], "c");
        assert!(out["choices"][0].get("text").is_none());
        assert!(out["choices"][0].get("token_ids").is_none());
    }

    #[test]
    fn text_continuation_for_chat_and_completions() {
        let b = body(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}),
        );
        let mut st = MigrationState::new(&b, ApiKind::Chat, 2);
        st.observe(&chat_chunk("Hel", None, None));
        st.observe(&chat_chunk("lo", None, None));
        let cont = st.next_continuation();
        assert!(!cont.exact);
        assert_eq!(cont.kind, ApiKind::Chat);
        assert_eq!(
            cont.body["messages"][1],
            json!({"role": "assistant", "content": "Hello"})
        );
        assert_eq!(cont.body["continue_final_message"], json!(true));
        assert_eq!(cont.body["add_generation_prompt"], json!(false));
        assert_eq!(cont.body["max_completion_tokens"], json!(1));
        // A second move carries everything, in one assistant turn.
        st.observe(&chat_chunk("!", None, None));
        let cont = st.next_continuation();
        assert_eq!(cont.body["messages"].as_array().unwrap().len(), 2);
        assert_eq!(cont.body["messages"][1]["content"], "Hello!");

        let b = body(json!({"model": "m", "prompt": "Say", "max_tokens": 5}));
        let mut st = MigrationState::new(&b, ApiKind::Completions, 1);
        st.observe(&event(
            json!({"id": "c", "created": 1, "choices": [{"text": " hi", "index": 0}]}),
        ));
        let cont = st.next_continuation();
        assert_eq!(cont.body["prompt"], "Say hi");
        assert_eq!(cont.body["max_tokens"], 4);
    }

    #[test]
    fn requests_that_cannot_move() {
        let refused = |v: Value| MigrationState::new(&body(v), ApiKind::Completions, 1).refusal();
        assert_eq!(
            refused(json!({"prompt": "x", "n": 2})),
            Some(Unmigratable::SeveralChoices)
        );
        assert_eq!(
            refused(json!({"prompt": ["a", "b"]})),
            Some(Unmigratable::SeveralChoices)
        );
        assert_eq!(
            refused(json!({"prompt": "x", "seed": 3})),
            Some(Unmigratable::FixedSeed)
        );
        assert_eq!(refused(json!({"prompt": [1, 2]})), None);
        assert_eq!(refused(json!({"prompt": "x", "seed": null})), None);

        let b = body(json!({"messages": [], "tools": [{}]}));
        let mut st = MigrationState::new(&b, ApiKind::Chat, 1);
        st.observe(&event(
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}),
        ));
        assert_eq!(st.refusal(), Some(Unmigratable::NotPlainText));
        assert!(!st.can_migrate());

        let mut st = MigrationState::new(&body(json!({"prompt": [1, 2]})), ApiKind::Completions, 1);
        st.observe(&event(json!({"choices": [{"text": "t"}]})));
        assert_eq!(st.refusal(), Some(Unmigratable::TokensWithoutIds));

        let mut st = MigrationState::new(&body(json!({"prompt": "p"})), ApiKind::Completions, 1);
        st.observe(b"data: {not json\n\n");
        assert_eq!(st.refusal(), Some(Unmigratable::Unparseable));

        let mut st = MigrationState::new(&body(json!({"prompt": "p"})), ApiKind::Completions, 1);
        st.observe(&event(
            json!({"choices": [{"text": "t", "finish_reason": "length"}]}),
        ));
        assert!(st.finished() && !st.can_migrate());
    }

    #[test]
    fn partial_lines_wait_and_other_lines_pass_unchanged() {
        let mut st = MigrationState::new(&body(json!({"prompt": "p"})), ApiKind::Completions, 1);
        let whole = event(json!({"choices": [{"text": "t"}]}));
        let (a, b) = whole.split_at(10);
        assert!(st.observe(a).is_empty());
        assert_eq!(st.observe(b), whole);
        assert_eq!(
            st.observe(b": keepalive\n\ndata: [DONE]\n\n"),
            b": keepalive\n\ndata: [DONE]\n\n"
        );
        assert_eq!(st.produced_text(), "t");
    }

    #[test]
    fn usage_after_a_move_counts_the_carried_tokens_as_generated() {
        let b = body(json!({"prompt": "p", "stream_options": {"include_usage": true}}));
        let mut st = MigrationState::new(&b, ApiKind::Completions, 1);
        st.observe(&event(json!({"id": "a", "created": 1, "choices": [{"text": "x", "token_ids": [4]}], "prompt_token_ids": [1]})));
        st.next_continuation();
        let out = st.observe(&event(json!({"id": "b", "created": 2, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}})));
        let v: Value = serde_json::from_slice(&out[6..]).unwrap();
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5})
        );
        assert_eq!(v["id"], "a");
    }

    #[test]
    fn engines_asked_for_ids() {
        assert!(asks_token_ids(EngineKind::Vllm, ApiKind::Chat));
        assert!(!asks_token_ids(EngineKind::Sglang, ApiKind::Chat));
        assert!(asks_token_ids(EngineKind::Sglang, ApiKind::Completions));
        assert!(!asks_token_ids(EngineKind::Atom, ApiKind::Completions));
    }
}
