//! What every served API does between parsing a request and rendering its answer: the
//! request's span, its routing input (the retention hint), the plan over the registry's
//! snapshot with direct mode's pins, the forward path, the relay of the answer, and the
//! migration context that resends a moved generation's continuation.

use crate::config::RouterMode;
use crate::flow::class::{Asked, Priority, asked};
use crate::flow::gate::{FlowControl, Why};
use crate::flow::room::with_room;
use crate::http::Shared;
use crate::http::errors::{request_id, with_request_id};
use crate::metrics::Outcome;
use crate::request::validate::ApiKind;
use crate::route::plan::{PREFILL_PIN_HEADER, Pins, Plan, RouteError, WORKER_PIN_HEADER, plan};
use crate::route::select::{RequestRouting, RoutingInput};
use crate::send::forward::{forward, send_planned};
use crate::send::guard::{Forwarded, RequestGuard, Sent};
use crate::send::migration::{Continuation, MigrationState};
use crate::send::relay::{Migration, relay_body};
use crate::send::upstream::{Outbound, Upstream};
use crate::state::Gateway;
use crate::workers::registry::Target;
use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::retention::{Retention, parse_retention_hint};
use infera_telemetry::logging::spans_exported;
use infera_telemetry::propagation::TraceContext;
use serde_json::{Map, Value};
use std::time::{Duration, Instant};

pub(crate) fn default_model(gw: &Gateway) -> Option<String> {
    let snap = gw.registry.snapshot();
    let names = snap.model_names();
    (names.len() == 1)
        .then(|| names.into_iter().next().map(str::to_owned))
        .flatten()
}

/// Counts a request that ended before it was sent anywhere, in its metrics and span.
pub(crate) fn reject(gw: &Gateway, outcome: Outcome, started: Instant) {
    gw.metrics.request_rejected("mixed", outcome, started);
    let span = tracing::Span::current();
    span.record("outcome", outcome.name());
    span.record("otel.status_code", "ERROR");
}

/// What a request's body says about its routing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RouteInput {
    /// The client's explicit hint (it sets the kv-aware weight).
    pub(crate) hint: Option<Retention>,
    /// What engines are told (the hint, or the default).
    pub(crate) retention: Retention,
    /// Bytes of the request body: large ones are tokenized off the async workers.
    pub(crate) body_bytes: usize,
}

/// The hint a request carries and the retention to forward.
pub(crate) fn route_input(
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

/// A served request's span (it ends when the answer's last byte is relayed), its id,
/// and the client's trace context, which the span continues when spans are exported.
pub(crate) fn request_span(
    path: &str,
    headers: &HeaderMap,
) -> (tracing::Span, String, TraceContext) {
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

/// The migration state of a streamed request the gateway may move (`--migration-limit`
/// above 0, and nothing in it that forbids a move).
pub(crate) fn migration_state(
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

pub(crate) fn build_migration(
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

/// Sends a moved generation's continuation to a worker it has not failed on. With flow
/// control, a continuation that finds no such worker (the only one of its role died)
/// waits for one, first in its model's queue, up to the default deadline.
async fn resend(
    ctx: &ResumeContext,
    continuation: Continuation,
    failed: &[String],
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
    let flow = ctx.gw.flow.as_deref();
    let mut ticket = flow.map(|f| {
        let asked = Asked {
            class: Priority::Critical,
            deadline: None,
        };
        f.ticket(&ctx.model, asked, ctx.body_bytes, Instant::now())
    });
    loop {
        let snapshot = ctx.gw.registry.snapshot();
        let (plan, role) = match plan(&snapshot, &ctx.model, Pins::default()) {
            Ok(planned) => {
                let role = role_without_room(&planned, |_| true);
                (planned.without(failed), role)
            }
            Err(e) => (None, waits_for(&e).unwrap_or("mixed")),
        };
        let Some(plan) = plan else {
            let error = ApiError::new(
                ErrorClass::ServiceUnavailable,
                format!(
                    "no other worker serves {} to continue the stream",
                    ctx.model
                ),
            );
            match ticket.as_mut() {
                Some(t) => {
                    drop(snapshot);
                    t.wait(&Why::NoWorker { role, error }).await?;
                    continue;
                }
                None => return Err(error),
            }
        };
        drop(ticket.take());
        return send_continuation(ctx, &plan, continuation, guard).await;
    }
}

/// Sends a continuation within `plan`.
async fn send_continuation(
    ctx: &ResumeContext,
    plan: &Plan<'_>,
    continuation: Continuation,
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
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
    send_planned(&ctx.gw.upstream, plan, &routing, &request, guard).await
}

/// The worker's answer relayed as it arrives, with its status and content type.
pub(crate) fn relay_response(
    forwarded: Forwarded,
    upstream: &Upstream,
    rid: &str,
    migration: Option<Migration>,
) -> Response {
    let content_type = forwarded.response.content_type.clone();
    let sse = forwarded.response.is_sse();
    let status = forwarded.response.status;
    let served = forwarded.guard.served.clone();
    let mut resp = Response::new(Body::from_stream(relay_body(
        forwarded, upstream, sse, migration,
    )));
    *resp.status_mut() = status;
    if let Some(ct) = content_type {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    served.write(resp.headers_mut());
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
/// sends it down the forward path; with flow control, through its gate first.
pub(crate) async fn route_and_forward(
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
    if let Some(flow) = &gw.flow {
        return through_gate(gw, flow, headers, model, pins, hint, request, started).await;
    }
    let snapshot = gw.registry.snapshot();
    let plan = plan(&snapshot, model, pins).map_err(|e: RouteError| {
        reject(gw, Outcome::NoWorker, started);
        e.to_api_error()
    })?;
    send_plan(gw, &plan, hint, request, started).await
}

/// The request's routing within `plan` (kv-aware: its prompt hashed once).
fn routing_for<'g>(
    gw: &'g Gateway,
    plan: &Plan<'_>,
    hint: Option<Retention>,
    request: &Outbound<'_>,
) -> RequestRouting<'g> {
    let route = if spans_exported() {
        tracing::info_span!("route")
    } else {
        tracing::Span::none()
    };
    route.in_scope(|| {
        gw.routing.for_request(
            RoutingInput {
                kind: request.kind,
                body: request.body,
                body_bytes: request.body_bytes,
                hint,
            },
            plan.targets(),
        )
    })
}

/// Routes within `plan` and sends.
async fn send_plan(
    gw: &Gateway,
    plan: &Plan<'_>,
    hint: Option<Retention>,
    request: &Outbound<'_>,
    started: Instant,
) -> Result<Forwarded, ApiError> {
    let routing = routing_for(gw, plan, hint, request);
    forward(&gw.upstream, plan, &routing, request, started).await
}

/// Whether a request routing refused may wait for a worker: its model's workers, or
/// one of its pools, are gone for now (or none registered yet), and which pool.
fn waits_for(e: &RouteError) -> Option<&'static str> {
    match e {
        RouteError::NoWorkerNow { .. } => Some("mixed"),
        RouteError::UnknownModel { available, .. } if available.is_empty() => Some("mixed"),
        RouteError::MissingPool { missing, .. } => Some(missing),
        _ => None,
    }
}

/// Where the request can start soon, or `None` while it must wait. Round-robin and
/// random: the plan's workers with room. kv-aware: the worker the selector chooses
/// (its cached prefix weighed against its load) must itself have room, and the plan
/// goes whole, so the send chooses it again: sending elsewhere would trade a cache hit
/// for a recompute, and under load turn every hot prefix into misses. (A prefill/decode
/// plan: the chosen prefill worker, and any decode worker with room.)
fn startable<'s>(
    gw: &Gateway,
    plan: &Plan<'s>,
    routing: &RequestRouting<'_>,
    room: impl Fn(&Target) -> bool + Copy,
) -> Option<Plan<'s>> {
    if !gw.routing.is_kv_aware() {
        return with_room(plan, room);
    }
    let now = Instant::now();
    let chosen_has_room = |role: &'static str, pool: &[Target]| {
        let options: Vec<&Target> = pool
            .iter()
            .filter(|t| gw.breakers.is_available(&t.record.worker_id, now))
            .collect();
        routing
            .selector(role)
            .choose(&options)
            .is_some_and(|i| room(options[i]))
    };
    let ok = match plan {
        Plan::Mixed(c) => chosen_has_room("mixed", c),
        Plan::Disagg(p, d) => chosen_has_room("prefill", p) && d.iter().any(room),
    };
    ok.then(|| plan.clone())
}

/// The pool a plan waits for: a mixed plan's, else prefill when no prefill worker has
/// room, else decode.
fn role_without_room(plan: &Plan<'_>, room: impl Fn(&Target) -> bool) -> &'static str {
    match plan {
        Plan::Mixed(_) => "mixed",
        Plan::Disagg(p, _) if !p.iter().any(room) => "prefill",
        Plan::Disagg(..) => "decode",
    }
}

/// Whether an error from sending means no worker took the request: every one tried was
/// unreachable, broken or gone (not a timeout, where the request may be running).
fn unserved(e: &ApiError) -> bool {
    matches!(
        e.class,
        ErrorClass::ServiceUnavailable | ErrorClass::BadGateway
    )
}

/// Flow control's passage: the request goes once its plan has a worker with room and
/// no request of its model waits ahead of it; until then it waits in the gate.
#[allow(clippy::too_many_arguments)]
async fn through_gate(
    gw: &Gateway,
    flow: &FlowControl,
    headers: &HeaderMap,
    model: &str,
    pins: Pins<'_>,
    hint: Option<Retention>,
    request: &Outbound<'_>,
    started: Instant,
) -> Result<Forwarded, ApiError> {
    let asked = asked(headers, flow.args().default_class()).inspect_err(|_| {
        reject(gw, Outcome::ClientError, started);
    })?;
    let mut ticket = flow.ticket(model, asked, request.body_bytes, started);
    loop {
        let snapshot = gw.registry.snapshot();
        let why = match plan(&snapshot, model, pins) {
            Ok(plan) => {
                let now = Instant::now();
                let room = |t: &Target| {
                    let worker = &t.record.worker_id;
                    flow.has_room(worker) && gw.breakers.is_available(worker, now)
                };
                let routing = routing_for(gw, &plan, hint, request);
                match startable(gw, &plan, &routing, room) {
                    Some(roomy) if ticket.may_go() => {
                        match forward(&gw.upstream, &roomy, &routing, request, started).await {
                            // No worker took it (each one failed before answering): it
                            // waits for the pool to change, as long as its deadline
                            // allows, instead of failing.
                            Err(e) if unserved(&e) && !ticket.past_deadline() => {
                                tracing::debug!(
                                    model,
                                    "no worker took the request ({}); waiting",
                                    e.message
                                );
                                Why::Full {
                                    role: role_without_room(&plan, room),
                                    first_byte: Duration::ZERO,
                                }
                            }
                            sent => return sent,
                        }
                    }
                    _ => Why::Full {
                        role: role_without_room(&plan, room),
                        first_byte: flow
                            .first_byte(plan.targets().map(|t| t.record.worker_id.as_str())),
                    },
                }
            }
            Err(e) => match waits_for(&e) {
                Some(role) => Why::NoWorker {
                    role,
                    error: e.to_api_error(),
                },
                None => {
                    reject(gw, Outcome::NoWorker, started);
                    return Err(e.to_api_error());
                }
            },
        };
        drop(snapshot);
        if let Err(e) = ticket.wait(&why).await {
            reject(gw, Outcome::NoWorker, started);
            return Err(e);
        }
    }
}
