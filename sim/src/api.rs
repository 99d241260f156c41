//! The HTTP API of one simulated worker: the OpenAI endpoints (JSON and SSE), health,
//! metrics with the engine's own names, the info endpoints routers probe, the profiler
//! controls (`/start_profile`, `/stop_profile`, answered as the engine does), and the
//! simulator's fault controls.

use crate::core::{EngineCore, NewRequest};
use crate::engine::EngineOutput;
use crate::faults::FaultSettings;
use crate::handoff;
use crate::metrics::render_metrics;
use crate::openai::{
    Endpoint, ParsedRequest, PromptInput, Rejection, ResponseMeta, add_token_ids, build_chunk,
    build_response, build_usage, build_usage_chunk, parse_request,
};
use crate::pd::{self, PdLeg};
use crate::state::WorkerState;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use infera_prompt::PromptCodec;
use infera_proto::retention::{DEFAULT_RETENTION, INFERA_RETENTION_FIELD, Retention};
use infera_proto::worker::EngineKind;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

type Shared = Arc<WorkerState>;

/// Largest request body the simulator reads: far above any gateway's limit.
const SIM_MAX_BODY_BYTES: usize = 256 << 20;

/// The worker's router.
pub fn build_router(state: Shared) -> Router {
    let router = if state.scale_out {
        Router::new()
            .route("/v1/completions/render", post(render_completion))
            .route("/v1/chat/completions/render", post(render_chat))
    } else {
        Router::new()
    };
    router
        .route("/tokenize", post(tokenize))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/get_server_info", get(server_info))
        .route("/server_info", get(server_info))
        .route("/get_model_info", get(model_info))
        .route("/model_info", get(model_info))
        .route("/version", get(version))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/flush_cache", post(reset_prefix_cache))
        .route("/start_profile", post(start_profile))
        .route("/stop_profile", post(stop_profile))
        .route("/sim/faults", get(get_faults).post(set_faults))
        .route("/sim/trace", get(last_trace))
        // Engines take prompts of any size their context allows (vLLM sets no body
        // limit); axum's 2 MB default would refuse long prompts a real one serves.
        .layer(DefaultBodyLimit::max(SIM_MAX_BODY_BYTES))
        .with_state(state)
}

fn error_response(state: &WorkerState, r: &Rejection) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = state
        .flavor
        .error_body(r.status, &r.message, r.param.as_deref());
    (status, axum::Json(body)).into_response()
}

async fn chat(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    generate(s, Endpoint::Chat, headers, body).await
}

async fn completions(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    generate(s, Endpoint::Completions, headers, body).await
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The prompt of a validated request as token ids (no length check).
fn encode_prompt(s: &WorkerState, req: &ParsedRequest) -> Result<Vec<u32>, Rejection> {
    let tokens = match &req.prompt {
        PromptInput::Chat => s
            .codec
            .encode_chat(&req.body)
            .map_err(|e| Rejection::bad(e.to_string(), Some("messages")))?,
        PromptInput::Text(text) => s
            .codec
            .encode_completion(text)
            .map_err(|e| Rejection::bad(e.to_string(), Some("prompt")))?,
        PromptInput::Tokens(ids) => ids.clone(),
    };
    if tokens.is_empty() {
        return Err(Rejection::bad(
            "the prompt encodes to no tokens",
            Some("prompt"),
        ));
    }
    Ok(tokens)
}

/// Tokenizes the prompt of a validated request and checks it fits.
fn prompt_tokens(s: &WorkerState, req: &ParsedRequest) -> Result<Vec<u32>, Rejection> {
    let tokens = encode_prompt(s, req)?;
    // Saturating: a max_tokens near u64::MAX is refused like any other too-long request.
    let requested = tokens.len().saturating_add(req.max_tokens);
    if requested > s.max_model_len {
        return Err(Rejection::bad(
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                s.max_model_len,
                requested,
                tokens.len(),
                req.max_tokens
            ),
            Some("max_tokens"),
        ));
    }
    Ok(tokens)
}

/// The retention class a router forwarded, where each engine reads it (vLLM:
/// `kv_transfer_params.infera_retention`; SGLang: `infera_retention`); the default
/// class without one.
fn request_retention(body: &serde_json::Map<String, serde_json::Value>) -> Retention {
    body.get("kv_transfer_params")
        .and_then(|p| p.get(INFERA_RETENTION_FIELD))
        .or_else(|| body.get(INFERA_RETENTION_FIELD))
        .and_then(serde_json::Value::as_str)
        .and_then(|r| r.parse().ok())
        .unwrap_or(DEFAULT_RETENTION)
}

/// `GET /sim/trace`: `{"traceparent": ...}` of the last generation request (null
/// without one), for tests that follow a trace from the gateway into the engine.
async fn last_trace(State(s): State<Shared>) -> Response {
    let last = s.last_traceparent.lock().ok().and_then(|t| t.clone());
    axum::Json(serde_json::json!({ "traceparent": last })).into_response()
}

async fn generate(s: Shared, endpoint: Endpoint, headers: HeaderMap, body: Bytes) -> Response {
    if let Ok(mut last) = s.last_traceparent.lock() {
        *last = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
    }
    if s.faults.take_failure() {
        let r = Rejection {
            status: 500,
            message: "injected failure (sim fault: fail_next)".into(),
            param: None,
        };
        return error_response(&s, &r);
    }
    if s.faults.hang() {
        // Never answers; the client's disconnect (or timeout) ends this future.
        std::future::pending::<()>().await;
    }
    let mut req = match parse_request(endpoint, &body, &s.model, s.default_max_tokens) {
        Ok(r) => r,
        Err(r) => return error_response(&s, &r),
    };
    let plan = match &s.pd {
        Some(role) => {
            let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok());
            match pd::validate(role, endpoint, &req.body, request_id) {
                Ok(plan) => Some(plan),
                Err(r) => return error_response(&s, &r),
            }
        }
        None => None,
    };
    if let Some(n) = plan.as_ref().and_then(|p| p.max_tokens) {
        req.max_tokens = n;
    }
    let prompt = match prompt_tokens(&s, &req) {
        Ok(p) => p,
        Err(r) => return error_response(&s, &r),
    };
    // Concurrent prefill/decode: a decode starts once its prefill computed the KV.
    let handoff =
        s.pd.as_ref()
            .and_then(|role| handoff::handoff_key(role.protocol, &req.body).map(|k| (role.leg, k)));
    let prefill_guard = match handoff {
        Some((PdLeg::Prefill, key)) => {
            handoff::prefill_started(&key);
            Some(handoff::PrefillGuard(key))
        }
        Some((PdLeg::Decode, key)) => {
            handoff::wait_for_prefill(&key).await;
            None
        }
        None => None,
    };
    let id = s.engine.next_id();
    let remote_kv = plan.as_ref().is_some_and(|p| p.remote_kv);
    // The connector finds the prompt's blocks below HBM and loads them before the
    // engine schedules the request (a remote prefill's KV arrives by its own path).
    let lower = match (&s.kvd, remote_kv) {
        (Some(kvd), false) => {
            kvd.lookup(EngineCore::prompt_keys(&prompt, s.block_size, None))
                .await
        }
        _ => Vec::new(),
    };
    let new = NewRequest {
        id,
        prompt: prompt.clone(),
        output: s
            .generator
            .continue_prompt(&prompt, req.seed, req.max_tokens),
        lora: None,
        remote_kv,
        lower,
        retention: request_retention(&req.body),
    };
    let Some(mut rx) = s.engine.submit(new) else {
        let r = Rejection {
            status: 503,
            message: "engine stopped".into(),
            param: None,
        };
        return error_response(&s, &r);
    };
    if let Some(guard) = prefill_guard {
        // The prefill is done at its first token; the guard also covers a cancel.
        let (tx, forwarded) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut guard = Some(guard);
            while let Some(out) = rx.recv().await {
                if matches!(out, EngineOutput::Token(_)) {
                    guard.take();
                }
                if tx.send(out).is_err() {
                    break;
                }
            }
        });
        rx = forwarded;
    }
    let meta = ResponseMeta {
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-sim-{id}"),
            Endpoint::Completions => format!("cmpl-sim-{id}"),
        },
        created: unix_now(),
        model: s.model.clone(),
        endpoint,
    };
    if req.stream {
        stream_response(s, meta, req, prompt, rx)
    } else {
        json_response(s, meta, req, prompt, rx).await
    }
}

async fn json_response(
    s: Shared,
    meta: ResponseMeta,
    req: ParsedRequest,
    prompt: Vec<u32>,
    mut rx: mpsc::UnboundedReceiver<EngineOutput>,
) -> Response {
    let prompt_len = prompt.len();
    let mut ids = Vec::with_capacity(req.max_tokens);
    let mut cached = 0;
    while let Some(out) = rx.recv().await {
        match out {
            EngineOutput::Token(t) => {
                ids.push(t.token);
                cached = t.cached_tokens;
                if t.finished {
                    break;
                }
            }
            EngineOutput::Rejected(message) => {
                return error_response(
                    &s,
                    &Rejection {
                        status: 400,
                        message,
                        param: None,
                    },
                );
            }
        }
    }
    let text = s.codec.decode(&ids);
    let kv_params = s.pd.as_ref().and_then(|role| {
        pd::prefill_response_params(
            role,
            &req.body,
            prompt_len,
            s.block_size,
            ids.first().copied().unwrap_or(0),
        )
    });
    let usage = build_usage(prompt_len, ids.len(), cached);
    let mut response = build_response(&meta, &text, "length", usage, kv_params);
    if req.return_token_ids {
        add_token_ids(&mut response, meta.endpoint, Some(&prompt), &ids);
    }
    axum::Json(response).into_response()
}

struct StreamState {
    s: Shared,
    meta: ResponseMeta,
    rx: mpsc::UnboundedReceiver<EngineOutput>,
    ids: Vec<u32>,
    prompt_len: usize,
    /// The prompt's ids, for the first chunk (`return_token_ids`).
    prompt_ids: Option<Vec<u32>>,
    return_token_ids: bool,
    include_usage: bool,
    fail_after: Option<u64>,
    done: bool,
    cached: usize,
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The text a token adds, decoded against the few tokens before it so multi-byte
/// characters split across tokens come out whole.
fn text_delta(codec: &PromptCodec, ids: &[u32]) -> String {
    let n = ids.len();
    let start = n.saturating_sub(6);
    let before = codec.decode(&ids[start..n - 1]);
    let after = codec.decode(&ids[start..n]);
    match after.strip_prefix(&before) {
        Some(delta) => delta.to_owned(),
        None => after,
    }
}

fn stream_response(
    s: Shared,
    meta: ResponseMeta,
    req: ParsedRequest,
    prompt: Vec<u32>,
    rx: mpsc::UnboundedReceiver<EngineOutput>,
) -> Response {
    let fail_after = s.faults.fail_after_tokens();
    let state = StreamState {
        s,
        meta,
        rx,
        ids: Vec::new(),
        prompt_len: prompt.len(),
        prompt_ids: req.return_token_ids.then_some(prompt),
        return_token_ids: req.return_token_ids,
        include_usage: req.include_usage,
        fail_after,
        done: false,
        cached: 0,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        match st.rx.recv().await {
            Some(EngineOutput::Token(t)) => {
                if st
                    .s
                    .faults
                    .exit_after_tokens()
                    .is_some_and(|k| st.ids.len() as u64 >= k)
                {
                    // Injected death: the process ends, every connection with it.
                    tracing::warn!("sim fault exit_after_tokens: exiting");
                    std::process::exit(137);
                }
                if st.fail_after.is_some_and(|k| st.ids.len() as u64 >= k) {
                    // Injected mid-stream failure: the connection breaks, as when an
                    // engine process dies.
                    st.done = true;
                    return Some((
                        Err(std::io::Error::other("injected mid-stream failure")),
                        st,
                    ));
                }
                st.ids.push(t.token);
                st.cached = t.cached_tokens;
                let text = text_delta(&st.s.codec, &st.ids);
                let finish = t.finished.then_some("length");
                let mut chunk = build_chunk(&st.meta, &text, st.ids.len() == 1, finish);
                if st.return_token_ids {
                    let prompt = st.prompt_ids.take();
                    add_token_ids(&mut chunk, st.meta.endpoint, prompt.as_deref(), &[t.token]);
                }
                let mut out = sse(&chunk).to_vec();
                if t.finished {
                    if st.include_usage {
                        let usage = build_usage(st.prompt_len, st.ids.len(), st.cached);
                        out.extend_from_slice(&sse(&build_usage_chunk(&st.meta, usage)));
                    }
                    out.extend_from_slice(b"data: [DONE]\n\n");
                    st.done = true;
                }
                Some((Ok(Bytes::from(out)), st))
            }
            Some(EngineOutput::Rejected(message)) => {
                st.done = true;
                let body = st.s.flavor.error_body(400, &message, None);
                Some((Ok(sse(&body)), st))
            }
            None => None,
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// `POST /tokenize` (vLLM's): a completion `prompt` or chat `messages` as token ids,
/// `{"count", "max_model_len", "tokens", "token_strs"}`.
async fn tokenize(State(s): State<Shared>, body: Bytes) -> Response {
    let chat = serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.get("messages").is_some());
    let endpoint = if chat {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let tokens = parse_request(endpoint, &body, &s.model, s.default_max_tokens)
        .and_then(|req| encode_prompt(&s, &req));
    match tokens {
        Ok(tokens) => axum::Json(json!({
            "count": tokens.len(), "max_model_len": s.max_model_len,
            "tokens": tokens, "token_strs": null,
        }))
        .into_response(),
        Err(r) => error_response(&s, &r),
    }
}

/// Requests rendered so far (their ids).
static RENDERED: AtomicU64 = AtomicU64::new(0);

async fn render_completion(State(s): State<Shared>, body: Bytes) -> Response {
    render(&s, Endpoint::Completions, &body)
}

async fn render_chat(State(s): State<Shared>, body: Bytes) -> Response {
    render(&s, Endpoint::Chat, &body)
}

/// vLLM's render endpoints: the request as the engine's token-in generate request
/// (`token_ids`), a list of one for completions and one object for chat.
fn render(s: &WorkerState, endpoint: Endpoint, body: &[u8]) -> Response {
    let rendered = parse_request(endpoint, body, &s.model, s.default_max_tokens).and_then(|req| {
        let ids = encode_prompt(s, &req)?;
        Ok(json!({
            "request_id": format!("render-sim-{}", RENDERED.fetch_add(1, Ordering::Relaxed)),
            "token_ids": ids, "features": null, "model": s.model,
            "stream": req.body.get("stream").cloned().unwrap_or(Value::Bool(false)),
        }))
    });
    match (rendered, endpoint) {
        (Ok(item), Endpoint::Completions) => axum::Json(json!([item])).into_response(),
        (Ok(item), Endpoint::Chat) => axum::Json(item).into_response(),
        (Err(r), _) => error_response(s, &r),
    }
}

async fn models(State(s): State<Shared>) -> Response {
    let owner = s.flavor.0.as_str();
    axum::Json(json!({"object": "list", "data": [{
        "id": s.model, "object": "model", "created": unix_now(), "owned_by": owner,
        "root": s.model, "parent": null, "max_model_len": s.max_model_len,
    }]}))
    .into_response()
}

async fn health(State(s): State<Shared>) -> Response {
    if s.faults.unhealthy() {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

async fn metrics(State(s): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            infera_telemetry::metrics::CONTENT_TYPE,
        )],
        render_metrics(&s),
    )
        .into_response()
}

async fn server_info(State(s): State<Shared>) -> Response {
    let disaggregation_mode = match s.pd.as_ref().map(|r| r.leg) {
        None => "null",
        Some(pd::PdLeg::Prefill) => "prefill",
        Some(pd::PdLeg::Decode) => "decode",
    };
    axum::Json(json!({
        "model_path": s.model,
        "served_model_name": s.model,
        "tokenizer_path": s.tokenizer_source,
        "page_size": s.block_size,
        "tp_size": s.tp_size,
        "dp_size": s.dp_size,
        "context_length": s.max_model_len,
        "chunked_prefill_size": s.max_num_batched_tokens,
        "max_running_requests": s.max_num_seqs,
        "max_total_num_tokens": s.kv_blocks * s.block_size,
        "disaggregation_mode": disaggregation_mode,
        "disagg_meta": s.pd.as_ref().map(pd::build_disagg_meta),
        "engine": s.flavor.0.as_str(),
        "version": format!("infera-sim {}", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

async fn model_info(State(s): State<Shared>) -> Response {
    axum::Json(json!({
        "model_path": s.model,
        "served_model_name": s.model,
        "tokenizer_path": s.tokenizer_source,
        "is_generation": true,
    }))
    .into_response()
}

async fn version(State(s): State<Shared>) -> Response {
    let engine_version = match s.flavor.0 {
        EngineKind::Vllm => "0.25.1",
        EngineKind::Sglang => "0.5.17",
        EngineKind::Atom => "0.1.4",
    };
    axum::Json(json!({"version": engine_version, "simulator": env!("CARGO_PKG_VERSION")}))
        .into_response()
}

async fn reset_prefix_cache(State(s): State<Shared>) -> Response {
    if s.engine.reset_prefix_cache() {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

/// What the engine answers to a profiler control: SGLang a line of text (its
/// `http_server.py`), vLLM and ATOM an empty 200 (vLLM's `profile/api_router.py`). The
/// simulator records nothing.
fn profile_answer(engine: EngineKind, start: bool) -> Response {
    match (engine, start) {
        (EngineKind::Sglang, true) => "Start profiling.\n".into_response(),
        (EngineKind::Sglang, false) => {
            "Stop profiling. This will take some time.\n".into_response()
        }
        _ => StatusCode::OK.into_response(),
    }
}

async fn start_profile(State(s): State<Shared>) -> Response {
    profile_answer(s.flavor.0, true)
}

async fn stop_profile(State(s): State<Shared>) -> Response {
    profile_answer(s.flavor.0, false)
}

async fn get_faults(State(s): State<Shared>) -> Response {
    axum::Json(s.faults.get()).into_response()
}

async fn set_faults(State(s): State<Shared>, body: Bytes) -> Response {
    match serde_json::from_slice::<FaultSettings>(&body) {
        Ok(settings) => {
            s.faults.set(&settings);
            axum::Json(s.faults.get()).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": format!("fault settings: {e}")})),
        )
            .into_response(),
    }
}
