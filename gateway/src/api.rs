//! The HTTP API: OpenAI endpoints relayed to workers, Anthropic `/v1/messages`
//! translated, and the gateway's own `/v1/models`, `/v1/workers`, `/health`, `/ready`,
//! `/metrics`. Errors are rendered here and only here, from [`ApiError`].

use crate::anthropic::{self, build_chat_request};
use crate::config::RouterMode;
use crate::forward::{Forwarded, Outbound, Sent, Upstream, forward, send_planned};
use crate::gateway::Gateway;
use crate::json_limits::{JsonLimits, check_json_limits};
use crate::metrics::Outcome;
use crate::migration::{Continuation, MigrationState};
use crate::offload::off_workers;
use crate::relay::{Migration, RequestGuard, relay_body};
use crate::router::{PREFILL_PIN_HEADER, Pins, RouteError, WORKER_PIN_HEADER, plan};
use crate::routing::RoutingInput;
use crate::validate::{ApiKind, validate_request};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::retention::{Retention, parse_retention_hint};
use infera_proto::worker::{WorkerRecord, WorkerStatus};
use infera_telemetry::logging::spans_exported;
use infera_telemetry::propagation::TraceContext;
use serde_json::{Map, Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

type Shared = Arc<Gateway>;

pub use crate::forward::REQUEST_ID_HEADER;

/// Which error JSON a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    OpenAi,
    Anthropic,
}

/// The gateway's routes.
pub fn build_router(gw: Shared) -> Router {
    let served = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .layer(middleware::from_fn_with_state(gw.clone(), admit));
    let api = Router::new()
        .merge(served)
        .route("/v1/models", get(models))
        .route("/v1/workers", get(workers))
        .route("/v1/admin/cache-view/{worker_id}", get(cache_view))
        .layer(middleware::from_fn_with_state(gw.clone(), require_auth));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/infera/tokenizer", get(tokenizer))
        .route("/ready", get(ready))
        .route(
            "/metrics",
            get(metrics).layer(middleware::from_fn_with_state(gw.clone(), metrics_auth)),
        )
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            gw.clone(),
            close_when_draining,
        ))
        .with_state(gw)
}

/// While the gateway shuts down, every response asks the client to close its
/// connection, so its next request opens a new one, which the Service sends to a
/// replica that stays.
async fn close_when_draining(State(gw): State<Shared>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if gw.draining.load(std::sync::atomic::Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// `/metrics` (it lists worker addresses) behind the API keys with `--metrics-require-auth`.
async fn metrics_auth(State(gw): State<Shared>, req: Request, next: Next) -> Response {
    if gw.cfg.metrics_require_auth {
        require_auth(State(gw), req, next).await
    } else {
        next.run(req).await
    }
}

/// Admission control: a request is served only with a permit, held until the last byte
/// of its answer (streams included); without one it is refused at once with 429 and
/// `Retry-After`, before its body is read.
async fn admit(State(gw): State<Shared>, req: Request, next: Next) -> Response {
    let Some(admission) = &gw.admission else {
        return next.run(req).await;
    };
    let Ok(permit) = admission.clone().try_acquire_owned() else {
        gw.metrics.record_admission_refused();
        let err = ApiError::new(
            ErrorClass::RateLimited,
            format!(
                "the gateway is serving its limit of {} requests (--max-concurrent-requests); retry shortly",
                gw.cfg.max_concurrent_requests
            ),
        );
        return error_response(&err, shape_of(req.uri().path()), &request_id(req.headers()));
    };
    let (parts, body) = next.run(req).await.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &permit;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// The error shape a path speaks.
fn shape_of(path: &str) -> Shape {
    if path == "/v1/messages" {
        Shape::Anthropic
    } else {
        Shape::OpenAi
    }
}

/// An unknown path: 404 in the API's error JSON, as OpenAI answers it.
async fn unknown_route(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let err = ApiError::new(
        ErrorClass::UnknownRoute,
        format!("Invalid URL ({method} {})", uri.path()),
    );
    error_response(&err, shape_of(uri.path()), &request_id(&headers))
}

/// A known path with a method it does not take: 405.
async fn method_not_allowed(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let err = ApiError::new(
        ErrorClass::MethodNotAllowed,
        format!("{} does not accept {method}", uri.path()),
    );
    error_response(&err, shape_of(uri.path()), &request_id(&headers))
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
    // Both mean "not now": SDKs retry them, sooner with Retry-After.
    if matches!(
        err.class,
        ErrorClass::RateLimited | ErrorClass::ServiceUnavailable
    ) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

async fn require_auth(State(gw): State<Shared>, req: Request, next: Next) -> Response {
    let Some(keys) = &gw.api_keys else {
        return next.run(req).await;
    };
    let keys = keys.load();
    if presented_keys(req.headers()).any(|k| key_accepted(&keys, k)) {
        return next.run(req).await;
    }
    let shape = shape_of(req.uri().path());
    let err = ApiError::new(
        ErrorClass::Unauthorized,
        "missing or unknown API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>') with a key from the gateway's keys file",
    );
    error_response(&err, shape, &request_id(req.headers()))
}

/// The keys a request presents: a bearer token (the scheme in any case, as RFC 9110
/// has it) and `x-api-key`, each tried, so a stray `Authorization` header (a proxy's
/// own) cannot hide a valid `x-api-key`.
fn presented_keys(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    bearer.into_iter().chain(api_key)
}

/// Whether `presented` is one of `keys`, compared in constant time against every key, so
/// the answer's timing tells nothing about how much of a key was right.
fn key_accepted(keys: &HashSet<String>, presented: &str) -> bool {
    use subtle::ConstantTimeEq;
    keys.iter().fold(false, |found, key| {
        found | bool::from(key.as_bytes().ct_eq(presented.as_bytes()))
    })
}

/// Reads the body: 413 past the byte limit (at once when `Content-Length` declares it),
/// 408 when it does not arrive within `--body-read-timeout-s`, 400 past the JSON limits.
async fn read_body(gw: &Gateway, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let limit = gw.cfg.max_body_bytes;
    let too_large = || {
        ApiError::new(
            ErrorClass::PayloadTooLarge,
            format!("request body is larger than the gateway's limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let timeout = Duration::from_secs_f64(gw.cfg.body_read_timeout_s.max(0.0));
    let bytes = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorClass::RequestTimeout,
                format!("request body did not arrive within {timeout:?} (--body-read-timeout-s)"),
            )
        })?
        .map_err(|_| too_large())?;
    let limits = JsonLimits {
        max_values: gw.cfg.max_request_values,
        max_depth: gw.cfg.max_request_depth,
    };
    off_workers(bytes.len(), || check_json_limits(&bytes, limits)).map_err(|e| e.to_api_error())?;
    Ok(bytes)
}

fn default_model(gw: &Gateway) -> Option<String> {
    let snap = gw.registry.snapshot();
    let names = snap.model_names();
    (names.len() == 1)
        .then(|| names.into_iter().next().map(str::to_owned))
        .flatten()
}

/// Counts a request that ended before it was sent anywhere, in its metrics and span.
fn reject(gw: &Gateway, outcome: Outcome, started: Instant) {
    gw.metrics.request_rejected("mixed", outcome, started);
    let span = tracing::Span::current();
    span.record("outcome", outcome.name());
    span.record("otel.status_code", "ERROR");
}

/// What a request's body says about its routing.
#[derive(Debug, Clone, Copy)]
struct RouteInput {
    /// The client's explicit hint (it sets the kv-aware weight).
    hint: Option<Retention>,
    /// What engines are told (the hint, or the default).
    retention: Retention,
    /// Bytes of the request body: large ones are tokenized off the async workers.
    body_bytes: usize,
}

/// The hint a request carries and the retention to forward.
fn route_input(
    gw: &Gateway,
    body: &Map<String, Value>,
    body_bytes: usize,
) -> Result<RouteInput, ApiError> {
    let hint = parse_retention_hint(body).map_err(|e| {
        ApiError::new(ErrorClass::BadRequest, e.to_string()).with_param("infera_retention")
    })?;
    if let Some(h) = hint {
        gw.metrics.record_cache_control(h.as_str());
    }
    Ok(RouteInput {
        hint,
        retention: hint.unwrap_or(gw.default_retention),
        body_bytes,
    })
}

async fn chat(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let (span, rid, trace) = request_span(ApiKind::Chat.path(), &headers);
    openai(gw, ApiKind::Chat, headers, body, rid, trace)
        .instrument(span)
        .await
}

async fn completions(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let (span, rid, trace) = request_span(ApiKind::Completions.path(), &headers);
    openai(gw, ApiKind::Completions, headers, body, rid, trace)
        .instrument(span)
        .await
}

/// A served request's span (it ends when the answer's last byte is relayed), its id,
/// and the client's trace context, which the span continues when spans are exported.
fn request_span(path: &str, headers: &HeaderMap) -> (tracing::Span, String, TraceContext) {
    let rid = request_id(headers);
    // Spans cost a few allocations per request: made only when they are exported.
    if !spans_exported() {
        let trace = TraceContext::adopt(&tracing::Span::none(), headers);
        return (tracing::Span::none(), rid, trace);
    }
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("POST {path}"),
        otel.kind = "server",
        request_id = %rid,
        model = tracing::field::Empty,
        router = tracing::field::Empty,
        worker = tracing::field::Empty,
        prefill_worker = tracing::field::Empty,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let trace = TraceContext::adopt(&span, headers);
    (span, rid, trace)
}

async fn openai(
    gw: Shared,
    kind: ApiKind,
    headers: HeaderMap,
    body: Body,
    rid: String,
    trace: TraceContext,
) -> Response {
    let started = Instant::now();
    let prepared = async {
        let bytes = read_body(&gw, &headers, body).await?;
        let model = default_model(&gw);
        let (body, info) = off_workers(bytes.len(), || {
            validate_request(kind, &bytes, model.as_deref())
        })?;
        let input = route_input(&gw, &body, bytes.len())?;
        drop(bytes);
        Ok::<_, ApiError>((body, info, input))
    }
    .await;
    let (body, info, input) = match prepared {
        Ok(p) => p,
        Err(e) => {
            reject(&gw, Outcome::ClientError, started);
            return error_response(&e, Shape::OpenAi, &rid);
        }
    };
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let state = migration_state(&gw, &body, kind, stream);
    let request = Outbound {
        kind,
        body: &body,
        body_bytes: input.body_bytes,
        retention: input.retention,
        request_id: &rid,
        trace: &trace,
        stream,
        migratable: state.is_some(),
    };
    match route_and_forward(&gw, &headers, &info.model, input.hint, &request, started).await {
        Ok(forwarded) => {
            let migration =
                state.map(|state| build_migration(&gw, state, &info.model, &input, &request));
            relay_response(forwarded, &gw.upstream, &rid, migration)
        }
        Err(e) => error_response(&e, Shape::OpenAi, &rid),
    }
}

/// The migration state of a streamed request the gateway may move (`--migration-limit`
/// above 0, and nothing in it that forbids a move).
fn migration_state(
    gw: &Gateway,
    body: &Map<String, Value>,
    kind: ApiKind,
    stream: bool,
) -> Option<MigrationState> {
    let limit = gw.upstream.migration_limit;
    if !stream || limit == 0 {
        return None;
    }
    let state = MigrationState::new(body, kind, limit);
    state.refusal().is_none().then_some(state)
}

/// What a continuation is sent with: the request as the client made it.
#[derive(Clone)]
struct ResumeContext {
    gw: Shared,
    model: String,
    hint: Option<Retention>,
    retention: Retention,
    body_bytes: usize,
    request_id: String,
    trace: TraceContext,
}

fn build_migration(
    gw: &Shared,
    state: MigrationState,
    model: &str,
    input: &RouteInput,
    request: &Outbound<'_>,
) -> Migration {
    let ctx = ResumeContext {
        gw: gw.clone(),
        model: model.to_owned(),
        hint: input.hint,
        retention: input.retention,
        body_bytes: input.body_bytes,
        request_id: request.request_id.to_owned(),
        trace: request.trace.clone(),
    };
    Migration {
        state,
        resume: Box::new(move |continuation, failed, guard| {
            let ctx = ctx.clone();
            Box::pin(async move { resend(&ctx, continuation, &failed, guard).await })
        }),
        failed: Vec::new(),
    }
}

/// Sends a moved generation's continuation to a worker it has not failed on.
async fn resend(
    ctx: &ResumeContext,
    continuation: Continuation,
    failed: &[String],
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
    let snapshot = ctx.gw.registry.snapshot();
    let planned = plan(&snapshot, &ctx.model, Pins::default()).map_err(|e| e.to_api_error())?;
    let plan = planned.without(failed).ok_or_else(|| {
        ApiError::new(
            ErrorClass::ServiceUnavailable,
            format!(
                "no other worker serves {} to continue the stream",
                ctx.model
            ),
        )
    })?;
    let body = &continuation.body;
    let routing = ctx.gw.routing.for_request(
        RoutingInput {
            kind: continuation.kind,
            body,
            body_bytes: ctx.body_bytes,
            hint: ctx.hint,
        },
        plan.targets(),
    );
    let request = Outbound {
        kind: continuation.kind,
        body,
        body_bytes: ctx.body_bytes,
        retention: ctx.retention,
        request_id: &ctx.request_id,
        trace: &ctx.trace,
        stream: true,
        migratable: continuation.movable,
    };
    send_planned(&ctx.gw.upstream, &plan, &routing, &request, guard).await
}

/// The worker's answer relayed as it arrives, with its status and content type.
fn relay_response(
    forwarded: Forwarded,
    upstream: &Upstream,
    rid: &str,
    migration: Option<Migration>,
) -> Response {
    let content_type = forwarded.response.content_type.clone();
    let sse = forwarded.response.is_sse();
    let status = forwarded.response.status;
    let mut resp = Response::new(Body::from_stream(relay_body(
        forwarded, upstream, sse, migration,
    )));
    *resp.status_mut() = status;
    if let Some(ct) = content_type {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    with_request_id(resp, rid)
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// Plans the request on the registry's snapshot (direct mode honours the pins), then
/// sends it down the forward path.
async fn route_and_forward(
    gw: &Gateway,
    headers: &HeaderMap,
    model: &str,
    hint: Option<Retention>,
    request: &Outbound<'_>,
    started: Instant,
) -> Result<Forwarded, ApiError> {
    tracing::Span::current().record("model", model);
    let pins = if gw.cfg.router_mode == RouterMode::Direct {
        Pins {
            worker: header_str(headers, WORKER_PIN_HEADER),
            prefill: header_str(headers, PREFILL_PIN_HEADER),
        }
    } else {
        Pins::default()
    };
    let snapshot = gw.registry.snapshot();
    let route = if spans_exported() {
        tracing::info_span!("route")
    } else {
        tracing::Span::none()
    };
    let planned = route.in_scope(|| {
        let plan = plan(&snapshot, model, pins)?;
        let routing = gw.routing.for_request(
            RoutingInput {
                kind: request.kind,
                body: request.body,
                body_bytes: request.body_bytes,
                hint,
            },
            plan.targets(),
        );
        Ok((plan, routing))
    });
    let (plan, routing) = planned.map_err(|e: RouteError| {
        reject(gw, Outcome::NoWorker, started);
        e.to_api_error()
    })?;
    forward(&gw.upstream, &plan, &routing, request, started).await
}

async fn messages(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let (span, rid, trace) = request_span("/v1/messages", &headers);
    anthropic_messages(gw, headers, body, rid, trace)
        .instrument(span)
        .await
}

async fn anthropic_messages(
    gw: Shared,
    headers: HeaderMap,
    body: Body,
    rid: String,
    trace: TraceContext,
) -> Response {
    let started = Instant::now();
    let prepared = async {
        let bytes = read_body(&gw, &headers, body).await?;
        let (original, chat) = off_workers(bytes.len(), || {
            let original: Value = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::new(
                    ErrorClass::BadRequest,
                    format!("request body is not valid JSON: {e}"),
                )
            })?;
            let chat = build_chat_request(&original)?;
            Ok::<_, ApiError>((original, chat))
        })?;
        // build_chat_request refuses anything but an object.
        let empty = Map::new();
        let object = original.as_object().unwrap_or(&empty);
        let input = route_input(&gw, object, bytes.len())?;
        Ok::<_, ApiError>((chat, input))
    }
    .await;
    let (chat, input) = match prepared {
        Ok(p) => p,
        Err(e) => {
            reject(&gw, Outcome::ClientError, started);
            return error_response(&e, Shape::Anthropic, &rid);
        }
    };
    let model = chat
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let stream = chat.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let state = migration_state(&gw, &chat, ApiKind::Chat, stream);
    let request = Outbound {
        kind: ApiKind::Chat,
        body: &chat,
        body_bytes: input.body_bytes,
        retention: input.retention,
        request_id: &rid,
        trace: &trace,
        stream,
        migratable: state.is_some(),
    };
    let answered =
        match route_and_forward(&gw, &headers, &model, input.hint, &request, started).await {
            Ok(forwarded) => {
                let migration =
                    state.map(|state| build_migration(&gw, state, &model, &input, &request));
                anthropic::answer(forwarded, &gw.upstream, &model, &rid, stream, migration).await
            }
            Err(e) => Err(e),
        };
    match answered {
        Ok(resp) => with_request_id(resp, &rid),
        Err(e) => error_response(&e, Shape::Anthropic, &rid),
    }
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

/// One `/v1/workers` entry: the earlier server's fields under their earlier names
/// (`status` active/draining/dead, `disagg_meta` as registered or `{}`, `dp_size` as
/// registered), then this gateway's own (`state` with the breaker and the health checks
/// folded in, `breaker`, `health`: `passing`, `failing` or `unchecked`, `inflight`).
pub fn build_worker_entry(
    w: &WorkerRecord,
    status: WorkerStatus,
    breaker: (&str, u64),
    health: &str,
    inflight: u64,
) -> Value {
    let (breaker_state, trips) = breaker;
    let state = match status {
        WorkerStatus::Active if breaker_state == "closed" && health != "failing" => "active",
        WorkerStatus::Active => "degraded",
        other => other.as_str(),
    };
    json!({
        "worker_id": w.worker_id,
        "url": w.url,
        "model_name": w.model_name,
        "engine": w.engine,
        "status": status.as_str(),
        "disagg_mode": w.disagg_mode,
        "disagg_meta": w.disagg_meta_view(),
        "kv_events_endpoint": w.kv_events_endpoint,
        "kv_block_size": w.kv_block_size,
        "dp_rank": w.dp_rank,
        "dp_size": w.dp_size,
        "state": state,
        "breaker": {"state": breaker_state, "trips": trips},
        "health": health,
        "inflight": inflight,
    })
}

async fn workers(State(gw): State<Shared>) -> Response {
    let snap = gw.registry.snapshot();
    let now = Instant::now();
    let checked = gw.cfg.health_check_interval_s > 0.0;
    let list: Vec<Value> = snap
        .workers
        .values()
        .map(|w| {
            let breaker = gw.breakers.get(&w.worker_id);
            let state = breaker.as_ref().map_or("closed", |b| b.state(now).name());
            let health = match (checked, gw.breakers.health_failing(&w.worker_id)) {
                (false, _) => "unchecked",
                (true, false) => "passing",
                (true, true) => "failing",
            };
            build_worker_entry(
                w,
                snap.status(&w.worker_id).unwrap_or_default(),
                (state, breaker.map_or(0, |b| b.trips())),
                health,
                gw.inflight.get(&w.worker_id),
            )
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

/// `/health`: the earlier server's answer, `active_workers` counting the workers that
/// take requests over all models.
async fn health(State(gw): State<Shared>) -> Response {
    let active = gw.registry.snapshot().active_workers();
    axum::Json(json!({"status": "ok", "active_workers": active})).into_response()
}

/// `/infera/tokenizer`: where kv-aware routing's tokenizer stands (the operator reads it
/// into the deployment's `TokenizerLoaded` condition).
/// With `--metrics-require-auth` a caller without a key gets the state without worker
/// addresses.
async fn tokenizer(State(gw): State<Shared>, headers: HeaderMap) -> Response {
    let state = gw.tokenizer.load();
    let keyed = gw.api_keys.as_ref().is_some_and(|keys| {
        let keys = keys.load();
        presented_keys(&headers).any(|k| key_accepted(&keys, k))
    });
    if gw.cfg.metrics_require_auth && !keyed {
        axum::Json(state.redacted()).into_response()
    } else {
        axum::Json(&**state).into_response()
    }
}

async fn ready(State(gw): State<Shared>) -> Response {
    if gw.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "shutting down"})),
        )
            .into_response();
    }
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
    let snap = gw.registry.snapshot();
    let kv = gw
        .kv
        .as_ref()
        .map(|k| k.gauges(snap.workers.values().map(|w| &**w)));
    let text = gw.metrics.render(&snap, &gw.breakers, kv);
    (
        [(
            header::CONTENT_TYPE,
            infera_telemetry::metrics::CONTENT_TYPE,
        )],
        text,
    )
        .into_response()
}
