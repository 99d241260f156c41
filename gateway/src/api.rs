//! The HTTP API: OpenAI endpoints relayed to workers, Anthropic `/v1/messages`
//! translated, and the gateway's own `/v1/models`, `/v1/workers`, `/health`, `/ready`,
//! `/metrics`. Errors are rendered here and only here, from [`ApiError`].

use crate::anthropic::{
    StreamTranslator, build_chat_request, build_message_response, format_event,
};
use crate::dispatch::{DispatchContext, dispatch};
use crate::gateway::Gateway;
use crate::kv_router::block_size_of;
use crate::metrics::{KvGauges, Outcome};
use crate::relay::{RequestGuard, relay_body};
use crate::router::route;
use crate::validate::{ApiKind, validate_request};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::retention::{Retention, overlap_weight_factor, parse_retention_hint};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Shared = Arc<Gateway>;

/// Header carrying the request id in and out.
pub const REQUEST_ID_HEADER: &str = "x-infera-request-id";

/// Which error JSON a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    OpenAi,
    Anthropic,
}

/// The gateway's routes.
pub fn build_router(gw: Shared) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(models))
        .route("/v1/workers", get(workers))
        .route("/v1/admin/cache-view/{worker_id}", get(cache_view))
        .layer(middleware::from_fn_with_state(gw.clone(), require_auth));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(gw)
}

fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)))
}

/// Returns the request id to the client.
fn with_request_id(mut resp: Response, request_id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

fn error_response(err: &ApiError, shape: Shape, request_id: &str) -> Response {
    let status =
        StatusCode::from_u16(err.class.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match shape {
        Shape::OpenAi => err.to_openai_json(),
        Shape::Anthropic => err.to_anthropic_json(),
    };
    let mut resp = with_request_id((status, axum::Json(body)).into_response(), request_id);
    if err.class == ErrorClass::RateLimited {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

async fn require_auth(State(gw): State<Shared>, req: Request, next: Next) -> Response {
    let Some(keys) = &gw.api_keys else {
        return next.run(req).await;
    };
    let headers = req.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    if bearer.or(api_key).is_some_and(|k| keys.contains(k.trim())) {
        return next.run(req).await;
    }
    let shape = if req.uri().path() == "/v1/messages" {
        Shape::Anthropic
    } else {
        Shape::OpenAi
    };
    let err = ApiError::new(
        ErrorClass::Unauthorized,
        "missing or unknown API key: send 'Authorization: Bearer <key>' with a key from the gateway's keys file",
    );
    error_response(&err, shape, &request_id(req.headers()))
}

/// Reads the body, answering 413 past the limit.
async fn read_body(gw: &Gateway, body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, gw.cfg.max_body_bytes)
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorClass::PayloadTooLarge,
                format!(
                    "request body is larger than the gateway's limit of {} bytes",
                    gw.cfg.max_body_bytes
                ),
            )
        })
}

fn default_model(gw: &Gateway) -> Option<String> {
    let snap = gw.registry.snapshot();
    let names = snap.model_names();
    (names.len() == 1)
        .then(|| names.into_iter().next().map(str::to_owned))
        .flatten()
}

/// How a request is to be routed.
#[derive(Debug, Clone, Copy)]
struct RouteInput {
    kind: ApiKind,
    /// The client's explicit hint (it sets the kv-aware weight).
    hint: Option<Retention>,
    /// What engines are told (the hint, or the default).
    retention: Retention,
}

/// The hint a request carries and the retention to forward.
fn route_input(gw: &Gateway, kind: ApiKind, body: &Value) -> Result<RouteInput, ApiError> {
    let hint = parse_retention_hint(body).map_err(|e| {
        ApiError::new(ErrorClass::BadRequest, e.to_string()).with_param("infera_retention")
    })?;
    if let Some(h) = hint {
        gw.metrics.record_cache_control(h.as_str());
    }
    Ok(RouteInput {
        kind,
        hint,
        retention: hint.unwrap_or(gw.default_retention),
    })
}

async fn chat(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    openai(gw, ApiKind::Chat, headers, body).await
}

async fn completions(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    openai(gw, ApiKind::Completions, headers, body).await
}

async fn openai(gw: Shared, kind: ApiKind, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let rid = request_id(&headers);
    let prepared = async {
        let bytes = read_body(&gw, body).await?;
        let (body, info) = validate_request(kind, &bytes, default_model(&gw).as_deref())?;
        let input = route_input(&gw, kind, &Value::Object(body.clone()))?;
        Ok::<_, ApiError>((body, info, input))
    }
    .await;
    let (body, info, input) = match prepared {
        Ok(p) => p,
        Err(e) => {
            gw.metrics
                .request_rejected("mixed", Outcome::ClientError, started);
            return error_response(&e, Shape::OpenAi, &rid);
        }
    };
    match forward(&gw, &body, &info.model, input, &rid, started).await {
        Ok((dispatched, guard)) => {
            let sse = is_sse(&dispatched.response);
            let worker = dispatched.target.record.worker_id.clone();
            let status = dispatched.response.status();
            let content_type = dispatched
                .response
                .headers()
                .get(header::CONTENT_TYPE)
                .cloned();
            let stream = relay_body(
                dispatched.response,
                guard,
                gw.breakers.clone(),
                worker,
                sse,
                Duration::from_secs_f64(gw.cfg.stream_idle_timeout_s),
            );
            let mut resp = Response::new(Body::from_stream(stream));
            *resp.status_mut() =
                StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            if let Some(ct) = content_type {
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            with_request_id(resp, &rid)
        }
        Err(e) => error_response(&e, Shape::OpenAi, &rid),
    }
}

fn is_sse(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"))
}

/// Routes and dispatches; on success the guard owns the request's bookkeeping.
async fn forward(
    gw: &Shared,
    body: &Map<String, Value>,
    model: &str,
    input: RouteInput,
    rid: &str,
    started: Instant,
) -> Result<(crate::dispatch::Dispatched, RequestGuard), ApiError> {
    let snapshot = gw.registry.snapshot();
    let candidates = route(&snapshot, model).map_err(|e| {
        gw.metrics
            .request_rejected("mixed", Outcome::NoWorker, started);
        e.to_api_error()
    })?;
    gw.metrics.request_started("mixed");
    let mut guard = RequestGuard {
        metrics: gw.metrics.clone(),
        router: "mixed",
        started,
        outcome: Outcome::Cancelled,
        inflight: None,
        kv_charge: None,
    };
    let ctx = DispatchContext {
        client: &gw.client,
        breakers: &gw.breakers,
        metrics: &gw.metrics,
        max_retries: gw.cfg.request_max_retries,
        timeout: Duration::from_secs_f64(gw.cfg.request_timeout_s),
    };
    let blocks = gw.kv.as_ref().map(|kv| {
        let sizes = candidates
            .iter()
            .filter_map(|t| block_size_of(&t.record))
            .collect();
        kv.hash_request(input.kind, body, &sizes)
    });
    let weight = gw
        .kv
        .as_ref()
        .map_or(1.0, |kv| kv.weight * overlap_weight_factor(input.hint));
    let choose = |options: &[&crate::registry::Target]| match (&gw.kv, &blocks) {
        (Some(kv), Some(blocks)) => kv.choose(options, blocks, weight),
        _ => gw.policy.pick(options),
    };
    match dispatch(
        &ctx,
        &choose,
        candidates,
        input.kind.path(),
        body,
        input.retention,
        rid,
    )
    .await
    {
        Ok(d) => {
            if let (Some(kv), Some(blocks)) = (&gw.kv, &blocks) {
                guard.kv_charge = kv.commit(&d.target, blocks, "mixed");
            }
            let worker = d.target.record.worker_id.clone();
            gw.inflight.acquire(&worker);
            guard.inflight = Some((gw.inflight.clone(), worker));
            guard.outcome = if d.response.status().is_server_error() {
                Outcome::UpstreamError
            } else if d.response.status().is_client_error() {
                Outcome::ClientError
            } else {
                Outcome::Cancelled
            };
            Ok((d, guard))
        }
        Err(e) => {
            guard.outcome = match e.class {
                ErrorClass::GatewayTimeout => Outcome::Timeout,
                _ => Outcome::UpstreamError,
            };
            Err(e)
        }
    }
}

async fn messages(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let rid = request_id(&headers);
    let prepared = async {
        let bytes = read_body(&gw, body).await?;
        let original: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                ErrorClass::BadRequest,
                format!("request body is not valid JSON: {e}"),
            )
        })?;
        let chat = build_chat_request(&original)?;
        let input = route_input(&gw, ApiKind::Chat, &original)?;
        Ok::<_, ApiError>((chat, input))
    }
    .await;
    let (chat, input) = match prepared {
        Ok(p) => p,
        Err(e) => {
            gw.metrics
                .request_rejected("mixed", Outcome::ClientError, started);
            return error_response(&e, Shape::Anthropic, &rid);
        }
    };
    let model = chat
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let stream = chat.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let (dispatched, mut guard) = match forward(&gw, &chat, &model, input, &rid, started).await {
        Ok(d) => d,
        Err(e) => return error_response(&e, Shape::Anthropic, &rid),
    };
    let status = dispatched.response.status();
    if !status.is_success() {
        let text = dispatched.response.text().await.unwrap_or_default();
        let class = if status.is_client_error() {
            ErrorClass::BadRequest
        } else {
            ErrorClass::BadGateway
        };
        return error_response(
            &ApiError::new(class, format!("worker answered {status}: {text}")),
            Shape::Anthropic,
            &rid,
        );
    }
    if !stream {
        let parsed = match dispatched.response.bytes().await {
            Ok(b) => serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let chat_resp: Value = match parsed {
            Ok(v) => v,
            Err(e) => {
                guard.outcome = Outcome::UpstreamError;
                return error_response(
                    &ApiError::new(
                        ErrorClass::BadGateway,
                        format!("worker response is not JSON: {e}"),
                    ),
                    Shape::Anthropic,
                    &rid,
                );
            }
        };
        guard.outcome = Outcome::Ok;
        drop(guard);
        return with_request_id(
            axum::Json(build_message_response(&chat_resp, &model)).into_response(),
            &rid,
        );
    }
    let worker = dispatched.target.record.worker_id.clone();
    let upstream = relay_body(
        dispatched.response,
        guard,
        gw.breakers.clone(),
        worker,
        true,
        Duration::from_secs_f64(gw.cfg.stream_idle_timeout_s),
    );
    let translated = translate_stream(upstream, StreamTranslator::new(&model, &rid));
    let mut resp = Response::new(Body::from_stream(translated));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    with_request_id(resp, &rid)
}

/// Re-frames an OpenAI SSE byte stream as Anthropic events.
fn translate_stream(
    upstream: impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    translator: StreamTranslator,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let upstream = Box::pin(upstream);
    futures::stream::unfold(
        (upstream, translator, String::new(), false),
        |(mut up, mut tr, mut buf, ended)| async move {
            if ended {
                return None;
            }
            loop {
                if let Some(pos) = buf.find("\n\n") {
                    let event: String = buf.drain(..pos + 2).collect();
                    let mut out = String::new();
                    for line in event.lines() {
                        if let Some(data) = line.strip_prefix("data:") {
                            for (name, value) in tr.on_data(data.trim_start()) {
                                out.push_str(&format_event(name, &value));
                            }
                        }
                    }
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), (up, tr, buf, false)));
                    }
                    continue;
                }
                match up.next().await {
                    Some(Ok(chunk)) => buf.push_str(&String::from_utf8_lossy(&chunk)),
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
        },
    )
}

async fn models(State(gw): State<Shared>) -> Response {
    let snap = gw.registry.snapshot();
    let data: Vec<Value> = snap
        .model_names()
        .into_iter()
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "infera"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn workers(State(gw): State<Shared>) -> Response {
    let snap = gw.registry.snapshot();
    let now = Instant::now();
    let list: Vec<Value> = snap
        .workers
        .values()
        .map(|w| {
            let breaker = gw.breakers.get(&w.worker_id);
            let state = breaker.as_ref().map_or("closed", |b| b.state(now).name());
            json!({
                "worker_id": w.worker_id,
                "url": w.url,
                "model_name": w.model_name,
                "engine": w.engine,
                "disagg_mode": w.disagg_mode,
                "dp_size": w.dp_size,
                "kv_block_size": w.kv_block_size,
                "state": if state == "closed" { "active" } else { "degraded" },
                "breaker": {"state": state, "trips": breaker.map_or(0, |b| b.trips())},
                "inflight": gw.inflight.get(&w.worker_id),
            })
        })
        .collect();
    axum::Json(json!({"workers": list, "synced": gw.registry.is_synced()})).into_response()
}

async fn cache_view(
    State(gw): State<Shared>,
    axum::extract::Path(worker_id): axum::extract::Path<String>,
) -> Response {
    let Some(kv) = &gw.kv else {
        let err = ApiError::new(
            ErrorClass::BadRequest,
            "kv-aware routing is off (--router-policy kv-aware turns it on)",
        );
        return error_response(&err, Shape::OpenAi, "");
    };
    let snap = gw.registry.snapshot();
    match snap.workers.get(&worker_id) {
        Some(record) => axum::Json(kv.cache_view(record)).into_response(),
        None => {
            let err = ApiError::new(
                ErrorClass::ModelNotFound,
                format!("no worker {worker_id} is registered"),
            )
            .with_code("worker_not_found");
            error_response(&err, Shape::OpenAi, "")
        }
    }
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn ready(State(gw): State<Shared>) -> Response {
    if gw.registry.is_synced() {
        let n = gw.registry.snapshot().workers.len();
        axum::Json(json!({"status": "ready", "workers": n})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "discovery has not synced yet"})),
        )
            .into_response()
    }
}

async fn metrics(State(gw): State<Shared>) -> Response {
    let kv = gw.kv.as_ref().map(|k| {
        let (active_blocks, indexed_blocks, bytes_per_block) = k.gauges();
        KvGauges {
            active_blocks,
            indexed_blocks,
            bytes_per_block,
        }
    });
    let text = gw.metrics.render(&gw.registry.snapshot(), &gw.breakers, kv);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
