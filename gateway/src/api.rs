//! The HTTP API: OpenAI endpoints relayed to workers, Anthropic `/v1/messages`
//! translated, and the gateway's own `/v1/models`, `/v1/workers`, `/health`, `/ready`,
//! `/metrics`. Errors are rendered here and only here, from [`ApiError`].

use crate::anthropic::{StreamTranslator, build_chat_request, build_message_response};
use crate::config::RouterMode;
use crate::dispatch::{DispatchContext, dispatch};
use crate::gateway::Gateway;
use crate::json_limits::{JsonLimits, check_json_limits};
use crate::kv_router::{RequestBlocks, block_size_of, has_multimodal_content};
use crate::metrics::{KvGauges, Outcome};
use crate::offload::off_workers;
use crate::pd::connectors::{PdError, PdIds, PdPair, resolve_protocol};
use crate::pd::dispatch::send_pair;
use crate::registry::{Snapshot, Target};
use crate::relay::{Abort, RequestGuard, relay_body};
use crate::router::{Route, RouteError, build_attempt_candidates, pinned, route};
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
use infera_proto::retention::{Retention, overlap_weight_factor, parse_retention_hint};
use infera_proto::worker::{DisaggMode, WorkerRecord, WorkerStatus};
use serde_json::{Map, Value, json};
use std::borrow::Cow;
use std::collections::HashSet;
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

/// How a request is to be routed.
#[derive(Debug, Clone, Copy)]
struct RouteInput {
    kind: ApiKind,
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
    kind: ApiKind,
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
        kind,
        hint,
        retention: hint.unwrap_or(gw.default_retention),
        body_bytes,
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
        let bytes = read_body(&gw, &headers, body).await?;
        let model = default_model(&gw);
        let (body, info) = off_workers(bytes.len(), || {
            validate_request(kind, &bytes, model.as_deref())
        })?;
        let input = route_input(&gw, kind, &body, bytes.len())?;
        drop(bytes);
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
    match forward(&gw, &headers, &body, &info.model, input, &rid, started).await {
        Ok(fwd) => {
            let sse = is_sse(&fwd.response);
            let status = fwd.response.status();
            let content_type = fwd.response.headers().get(header::CONTENT_TYPE).cloned();
            let stream = relay_body(
                fwd.response,
                fwd.guard,
                gw.breakers.clone(),
                fwd.worker,
                sse,
                Duration::from_secs_f64(gw.cfg.stream_idle_timeout_s),
                fwd.abort,
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

/// A worker's response on its way to the client, with the request's bookkeeping.
struct Forwarded {
    /// The response (body not yet read).
    response: reqwest::Response,
    /// The worker answering (the decode worker of a prefill/decode pair).
    worker: String,
    /// Owns metrics, in-flight counts and kv charges until the relay ends.
    guard: RequestGuard,
    /// Ends the relay early (a prefill leg failed).
    abort: Option<Abort>,
}

/// Where a request goes once direct-mode pins are applied.
enum Plan<'s> {
    Mixed(Cow<'s, [Target]>),
    Disagg(Cow<'s, [Target]>, Cow<'s, [Target]>),
}

/// Header naming the worker (mixed or decode) an external picker chose.
pub const WORKER_PIN_HEADER: &str = "x-worker-instance-id";

/// Header naming the prefill worker an external picker chose.
pub const PREFILL_PIN_HEADER: &str = "x-prefill-instance-id";

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The AutoRouter's decision, with direct mode's pins replacing the picks they name.
fn plan<'s>(
    gw: &Gateway,
    snapshot: &'s Snapshot,
    headers: &HeaderMap,
    model: &str,
) -> Result<Plan<'s>, RouteError> {
    let direct = gw.cfg.router_mode == RouterMode::Direct;
    let worker_pin = header_str(headers, WORKER_PIN_HEADER).filter(|_| direct);
    let prefill_pin = header_str(headers, PREFILL_PIN_HEADER).filter(|_| direct);
    if worker_pin.is_none() && prefill_pin.is_none() {
        return Ok(match route(snapshot, model)? {
            Route::Mixed(t) => Plan::Mixed(Cow::Borrowed(t)),
            Route::Disagg { prefill, decode } => {
                Plan::Disagg(Cow::Borrowed(prefill), Cow::Borrowed(decode))
            }
        });
    }
    let pool = |mode: DisaggMode| -> Result<Cow<'s, [Target]>, RouteError> {
        let pools = snapshot.models.get(model);
        let targets = pools.map_or(&[][..], |p| match mode {
            DisaggMode::Prefill => &p.prefill,
            _ => &p.decode,
        });
        if targets.is_empty() {
            return Err(RouteError::MissingPool {
                model: model.to_owned(),
                missing: mode.as_str(),
            });
        }
        Ok(Cow::Borrowed(targets))
    };
    let prefill = match prefill_pin {
        Some(id) => Some(Cow::Owned(pinned(
            snapshot,
            PREFILL_PIN_HEADER,
            id,
            model,
            &[DisaggMode::Prefill],
        )?)),
        None => None,
    };
    match worker_pin {
        Some(id) => {
            let modes: &[DisaggMode] = if prefill.is_some() {
                &[DisaggMode::Decode]
            } else {
                &[DisaggMode::Mixed, DisaggMode::Decode]
            };
            let worker = pinned(snapshot, WORKER_PIN_HEADER, id, model, modes)?;
            if worker[0].record.disagg_mode == DisaggMode::Mixed {
                return Ok(Plan::Mixed(Cow::Owned(worker)));
            }
            let prefill = match prefill {
                Some(p) => p,
                None => pool(DisaggMode::Prefill)?,
            };
            Ok(Plan::Disagg(prefill, Cow::Owned(worker)))
        }
        None => Ok(Plan::Disagg(
            prefill.unwrap_or_default(),
            pool(DisaggMode::Decode)?,
        )),
    }
}

/// The kv-aware block hashes of a request, for the block sizes of `targets`.
fn hash_blocks<'t>(
    gw: &Gateway,
    input: RouteInput,
    body: &Map<String, Value>,
    targets: impl Iterator<Item = &'t Target>,
) -> Option<RequestBlocks> {
    gw.kv.as_ref().map(|kv| {
        let sizes = targets.filter_map(|t| block_size_of(&t.record)).collect();
        off_workers(input.body_bytes, || {
            kv.hash_request(input.kind, body, &sizes)
        })
    })
}

/// Routes and dispatches; on success the guard owns the request's bookkeeping.
async fn forward(
    gw: &Shared,
    headers: &HeaderMap,
    body: &Map<String, Value>,
    model: &str,
    input: RouteInput,
    rid: &str,
    started: Instant,
) -> Result<Forwarded, ApiError> {
    let snapshot = gw.registry.snapshot();
    let planned = plan(gw, &snapshot, headers, model).map_err(|e| {
        gw.metrics
            .request_rejected("mixed", Outcome::NoWorker, started);
        e.to_api_error()
    })?;
    match planned {
        Plan::Mixed(candidates) => forward_mixed(gw, &candidates, body, input, rid, started).await,
        Plan::Disagg(prefill, decode) => {
            forward_pd(gw, &prefill, &decode, body, input, rid, started).await
        }
    }
}

/// The guard's outcome for a worker's status, until the body is relayed.
fn outcome_for(status: reqwest::StatusCode) -> Outcome {
    if status.is_server_error() {
        Outcome::UpstreamError
    } else if status.is_client_error() {
        Outcome::ClientError
    } else {
        Outcome::Cancelled
    }
}

/// The guard's outcome for an error answered instead of a worker's response.
fn outcome_of_error(e: &ApiError) -> Outcome {
    match e.class {
        ErrorClass::GatewayTimeout => Outcome::Timeout,
        ErrorClass::BadRequest | ErrorClass::RateLimited => Outcome::ClientError,
        _ => Outcome::UpstreamError,
    }
}

async fn forward_mixed(
    gw: &Shared,
    candidates: &[Target],
    body: &Map<String, Value>,
    input: RouteInput,
    rid: &str,
    started: Instant,
) -> Result<Forwarded, ApiError> {
    let mut guard = RequestGuard::new(gw.metrics.clone(), "mixed", started);
    let ctx = DispatchContext {
        client: &gw.client,
        breakers: &gw.breakers,
        metrics: &gw.metrics,
        max_retries: gw.cfg.request_max_retries,
        timeout: Duration::from_secs_f64(gw.cfg.request_timeout_s),
        body_bytes: input.body_bytes,
    };
    let blocks = hash_blocks(gw, input, body, candidates.iter());
    let multimodal = gw.kv.is_some() && has_multimodal_content(body);
    let weight = gw.kv.as_ref().map_or(1.0, |kv| {
        if multimodal {
            0.0
        } else {
            kv.weight * overlap_weight_factor(input.hint)
        }
    });
    // The kv charge is taken at the pick, not when the answer's headers arrive (for a
    // non-streaming request that is the end), so concurrent requests see this load;
    // a failover's new pick releases the previous charge.
    let charge: std::sync::Mutex<Option<crate::kv_router::KvCharge>> = Default::default();
    let choose = |options: &[&Target]| match (&gw.kv, &blocks) {
        (Some(kv), Some(blocks)) => {
            if multimodal {
                gw.metrics.record_cache_locality_skipped("multimodal");
            }
            let index = kv.choose(options, blocks, weight)?;
            let committed = kv.commit(options[index], blocks, "mixed");
            if let Ok(mut c) = charge.lock() {
                *c = committed;
            }
            Some(index)
        }
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
            if let Ok(mut c) = charge.lock() {
                guard.kv_charges.extend(c.take());
            }
            let worker = d.target.record.worker_id.clone();
            gw.inflight.acquire(&worker);
            guard.inflight.push((gw.inflight.clone(), worker.clone()));
            guard.outcome = outcome_for(d.response.status());
            Ok(Forwarded {
                response: d.response,
                worker,
                guard,
                abort: None,
            })
        }
        Err(e) => {
            guard.outcome = outcome_of_error(&e);
            Err(e)
        }
    }
}

/// The DisaggRouter: one prefill and one decode worker, each leg scored with its own
/// kv-aware weight and filtered by its own breakers, then both legs sent.
async fn forward_pd(
    gw: &Shared,
    prefill: &[Target],
    decode: &[Target],
    body: &Map<String, Value>,
    input: RouteInput,
    rid: &str,
    started: Instant,
) -> Result<Forwarded, ApiError> {
    let mut guard = RequestGuard::new(gw.metrics.clone(), "disagg", started);
    let blocks = hash_blocks(gw, input, body, prefill.iter().chain(decode));
    let multimodal = gw.kv.is_some() && has_multimodal_content(body);
    let factor = if multimodal {
        0.0
    } else {
        overlap_weight_factor(input.hint)
    };
    let pick = |pool: &[Target], weight: f64| -> Option<Target> {
        let now = Instant::now();
        let options = build_attempt_candidates(pool, &[], |t| {
            gw.breakers.is_available(&t.record.worker_id, now)
        });
        let index = match (&gw.kv, &blocks) {
            (Some(kv), Some(blocks)) => {
                if multimodal {
                    gw.metrics.record_cache_locality_skipped("multimodal");
                }
                kv.choose(&options, blocks, weight * factor)
            }
            _ => gw.policy.pick(&options),
        }?;
        Some(options[index].clone())
    };
    let no_worker = |role: &str| {
        ApiError::new(
            ErrorClass::ServiceUnavailable,
            format!("no {role} worker is available"),
        )
    };
    let picked = pick(prefill, gw.cfg.kv_prefill_overlap_weight)
        .ok_or_else(|| no_worker("prefill"))
        .and_then(|p| {
            // Decode workers that speak the prefill's protocol (a fleet mid-migration
            // may hold several); with none, the pick below names the mismatch.
            let compatible: Vec<Target> = decode
                .iter()
                .filter(|d| resolve_protocol(&p.record, &d.record).is_ok())
                .cloned()
                .collect();
            let pool = if compatible.is_empty() {
                decode
            } else {
                &compatible[..]
            };
            pick(pool, gw.cfg.kv_decode_overlap_weight)
                .map(|d| (p, d))
                .ok_or_else(|| no_worker("decode"))
        })
        .and_then(|(p, d)| {
            let protocol = resolve_protocol(&p.record, &d.record)
                .and_then(|protocol| {
                    if protocol.completions_only() && input.kind == ApiKind::Chat {
                        Err(PdError::CompletionsOnly { protocol })
                    } else {
                        Ok(protocol)
                    }
                })
                .map_err(|e| {
                    gw.metrics.record_pd_failure(e.reason());
                    e.to_api_error()
                })?;
            Ok((p, d, protocol))
        });
    let (p, d, protocol) = match picked {
        Ok(picked) => picked,
        Err(e) => {
            guard.outcome = outcome_of_error(&e);
            return Err(e);
        }
    };
    guard.pd_protocol = Some(protocol);
    let now = Instant::now();
    for (target, role) in [(&p, "prefill"), (&d, "decode")] {
        let worker = &target.record.worker_id;
        gw.breakers.try_acquire(worker, now);
        gw.metrics.record_pick(role, worker);
        if let (Some(kv), Some(blocks)) = (&gw.kv, &blocks) {
            guard.kv_charges.extend(kv.commit(target, blocks, role));
        }
        gw.inflight.acquire(worker);
        guard.inflight.push((gw.inflight.clone(), worker.clone()));
    }
    let pair = PdPair {
        protocol,
        prefill: &p,
        decode: &d,
        ids: PdIds::random(&p),
        retention: input.retention,
    };
    match send_pair(gw, &pair, input.kind.path(), body, input.body_bytes, rid).await {
        Ok(opened) => {
            guard.outcome = outcome_for(opened.response.status());
            Ok(Forwarded {
                response: opened.response,
                worker: d.record.worker_id.clone(),
                guard,
                abort: opened.abort,
            })
        }
        Err(e) => {
            guard.outcome = outcome_of_error(&e);
            Err(e)
        }
    }
}

async fn messages(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let rid = request_id(&headers);
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
        let input = route_input(&gw, ApiKind::Chat, object, bytes.len())?;
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
    let fwd = match forward(&gw, &headers, &chat, &model, input, &rid, started).await {
        Ok(f) => f,
        Err(e) => return error_response(&e, Shape::Anthropic, &rid),
    };
    let mut guard = fwd.guard;
    let status = fwd.response.status();
    if !status.is_success() {
        let text = fwd.response.text().await.unwrap_or_default();
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
        let parsed = match fwd.response.bytes().await {
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
    let upstream = relay_body(
        fwd.response,
        guard,
        gw.breakers.clone(),
        fwd.worker,
        true,
        Duration::from_secs_f64(gw.cfg.stream_idle_timeout_s),
        fwd.abort,
    );
    let translated = StreamTranslator::new(&model, &rid).translate(upstream);
    let mut resp = Response::new(Body::from_stream(translated));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    with_request_id(resp, &rid)
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
    let kv = gw.kv.as_ref().map(|k| {
        let (active_blocks, indexed_blocks, bytes_per_block) = k.gauges();
        KvGauges {
            active_blocks,
            indexed_blocks,
            bytes_per_block,
            // Every target of every listed worker, draining ones included, as the
            // earlier server set them at scrape time.
            view_sizes: k.view_sizes(snap.workers.values().map(|w| &**w)),
        }
    });
    let text = gw.metrics.render(&snap, &gw.breakers, kv);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
