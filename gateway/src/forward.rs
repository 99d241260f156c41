//! The one forward path, for mixed and prefill/decode requests alike: given the
//! AutoRouter's [`Plan`] and the request's [`RequestRouting`], pick (each role with its
//! selector), send (a mixed request fails over to another worker before the first byte;
//! a pair's decode open is retried on its worker), and hand back the worker's
//! response with a [`RequestGuard`] that owns the request's bookkeeping (metrics,
//! in-flight counts, kv charges) until the relay ends. It sees the gateway only through
//! [`Upstream`]: the client, breakers, metrics and timeouts.

use crate::breaker::Breakers;
use crate::config::GatewayConfig;
use crate::dispatch::send_with_failover;
use crate::gateway::Inflight;
use crate::metrics::{Metrics, Outcome};
use crate::nats_plane::NatsPlane;
use crate::pd::connectors::{PdError, PdIds, PdPair, resolve_protocol};
use crate::pd::dispatch::send_pair;
use crate::registry::Target;
use crate::relay::{Abort, RequestGuard};
use crate::router::{Plan, build_attempt_candidates};
use crate::routing::{RequestRouting, Selector};
use crate::validate::ApiKind;
use crate::worker_response::WorkerResponse;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::pd::PdProtocol;
use infera_proto::retention::Retention;
use infera_proto::worker::RequestTransport;
use infera_telemetry::propagation::TraceContext;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Header carrying the request id in and out, and to workers.
pub const REQUEST_ID_HEADER: &str = "x-infera-request-id";

/// What sending needs from the gateway, cheap to clone into a task (a prefill leg runs
/// in its own).
#[derive(Debug, Clone)]
pub struct Upstream {
    /// HTTP client to the workers.
    pub client: reqwest::Client,
    /// Breakers, told of every attempt.
    pub breakers: Arc<Breakers>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Requests in flight per worker.
    pub inflight: Arc<Inflight>,
    /// Wait for a worker's response headers (`--request-timeout-s`).
    pub request_timeout: Duration,
    /// Longest silence inside a response body (`--stream-idle-timeout-s`).
    pub idle_timeout: Duration,
    /// Other workers tried after the first (`--request-max-retries`).
    pub max_retries: u32,
    /// The NATS request plane (`--request-transport nats`), set once connected.
    pub nats: Arc<tokio::sync::OnceCell<NatsPlane>>,
    /// Moves of a live generation to another worker (`--migration-limit`; 0 off).
    pub migration_limit: u32,
}

impl Upstream {
    /// The context `cfg` sets, over the gateway's shared parts.
    pub fn new(
        cfg: &GatewayConfig,
        client: reqwest::Client,
        breakers: Arc<Breakers>,
        metrics: Arc<Metrics>,
        inflight: Arc<Inflight>,
    ) -> Self {
        Self {
            client,
            breakers,
            metrics,
            inflight,
            request_timeout: Duration::from_secs_f64(cfg.request_timeout_s),
            idle_timeout: Duration::from_secs_f64(cfg.stream_idle_timeout_s),
            max_retries: cfg.request_max_retries,
            nats: Arc::default(),
            migration_limit: cfg.migration_limit,
        }
    }

    /// The request plane to reach `target` by: NATS for a worker that registered
    /// `request_transport: nats` while the gateway runs it, HTTP otherwise.
    pub fn nats_for(&self, target: &Target) -> Option<&NatsPlane> {
        self.nats
            .get()
            .filter(|_| target.record.request_transport == RequestTransport::Nats)
    }
}

/// A validated request on its way to a worker.
#[derive(Debug, Clone, Copy)]
pub struct Outbound<'a> {
    /// Chat or completions (the path it is sent to).
    pub kind: ApiKind,
    /// The body as the client sent it (defaults applied).
    pub body: &'a Map<String, Value>,
    /// Bytes of the client's body: a large one is serialized off the async workers.
    pub body_bytes: usize,
    /// What engines are told to keep (the hint, or the default).
    pub retention: Retention,
    /// Sent to workers as `x-infera-request-id`.
    pub request_id: &'a str,
    /// The client's trace context, continued on every request to a worker.
    pub trace: &'a TraceContext,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Whether the gateway can continue this generation on another worker.
    pub migratable: bool,
}

/// A worker's response on its way to the client, with the request's bookkeeping.
pub struct Forwarded {
    /// The response (body not yet read).
    pub response: WorkerResponse,
    /// The worker answering (the decode worker of a prefill/decode pair).
    pub worker: String,
    /// Owns metrics, in-flight counts and kv charges until the relay ends.
    pub guard: RequestGuard,
    /// Ends the relay early (a prefill leg failed).
    pub abort: Option<Abort>,
}

impl std::fmt::Debug for Forwarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarded")
            .field("status", &self.response.status)
            .field("worker", &self.worker)
            .field("abort", &self.abort.is_some())
            .finish_non_exhaustive()
    }
}

/// Sends `request` where `plan` says, picking with `routing`.
pub async fn forward(
    upstream: &Upstream,
    plan: &Plan<'_>,
    routing: &RequestRouting<'_>,
    request: &Outbound<'_>,
    started: Instant,
) -> Result<Forwarded, ApiError> {
    let span = tracing::Span::current();
    span.record("router", plan.router());
    let mut guard = RequestGuard::new(upstream.metrics.clone(), plan.router(), started, span);
    match send_planned(upstream, plan, routing, request, &mut guard).await {
        Ok((response, worker, abort)) => {
            guard.outcome = outcome_for(response.status);
            Ok(Forwarded {
                response,
                worker,
                guard,
                abort,
            })
        }
        Err(e) => {
            guard.outcome = outcome_of_error(&e);
            Err(e)
        }
    }
}

/// A worker's answer: the response, the worker answering, and the relay's abort.
pub type Sent = (WorkerResponse, String, Option<Abort>);

/// Sends `request` where `plan` says, its bookkeeping in `guard` (a moved generation's
/// continuation is sent here with the request's own guard).
pub async fn send_planned(
    upstream: &Upstream,
    plan: &Plan<'_>,
    routing: &RequestRouting<'_>,
    request: &Outbound<'_>,
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
    match plan {
        Plan::Mixed(candidates) => send_mixed(upstream, routing, candidates, request, guard).await,
        Plan::Disagg(prefill, decode) => {
            send_disagg(upstream, routing, prefill, decode, request, guard).await
        }
    }
}

/// The MixedRouter: one worker of the pool serves the request whole.
async fn send_mixed(
    upstream: &Upstream,
    routing: &RequestRouting<'_>,
    candidates: &[Target],
    request: &Outbound<'_>,
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
    let selector = routing.selector("mixed");
    let sent = send_with_failover(upstream, &selector, candidates, request).await?;
    guard.kv_charges.extend(sent.charge);
    let worker = sent.target.record.worker_id.clone();
    guard.hold(&upstream.inflight, &worker);
    guard.span.record("worker", worker.as_str());
    Ok((sent.response, worker, None))
}

/// The DisaggRouter: a prefill and a decode worker, each picked with its own selector
/// among available workers, then both legs sent.
async fn send_disagg(
    upstream: &Upstream,
    routing: &RequestRouting<'_>,
    prefill: &[Target],
    decode: &[Target],
    request: &Outbound<'_>,
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
    let selectors = [routing.selector("prefill"), routing.selector("decode")];
    let (p, d, protocol) = pick_pair(upstream, &selectors, prefill, decode, request.kind)?;
    guard.pd_protocol = Some(protocol);
    let now = Instant::now();
    for (target, selector) in [(&p, &selectors[0]), (&d, &selectors[1])] {
        let worker = &target.record.worker_id;
        upstream.breakers.try_acquire(worker, now);
        upstream.metrics.record_pick(selector.role(), worker);
        guard.kv_charges.extend(selector.commit(target));
        guard.hold(&upstream.inflight, worker);
    }
    let pair = PdPair {
        protocol,
        prefill: &p,
        decode: &d,
        ids: PdIds::random(&p),
        retention: request.retention,
    };
    guard.span.record("worker", d.record.worker_id.as_str());
    guard
        .span
        .record("prefill_worker", p.record.worker_id.as_str());
    let opened = send_pair(upstream, &pair, request).await?;
    Ok((
        WorkerResponse::from_http(opened.response),
        d.record.worker_id.clone(),
        opened.abort,
    ))
}

/// A prefill worker, then a decode worker that speaks its protocol (a fleet
/// mid-migration may hold several; with none, the decode pick names the mismatch), and
/// the protocol between them.
fn pick_pair(
    upstream: &Upstream,
    [prefill_selector, decode_selector]: &[Selector<'_>; 2],
    prefill: &[Target],
    decode: &[Target],
    kind: ApiKind,
) -> Result<(Target, Target, PdProtocol), ApiError> {
    let pick = |selector: &Selector<'_>, pool: &[Target]| -> Result<Target, ApiError> {
        let now = Instant::now();
        let options = build_attempt_candidates(pool, &[], |t| {
            upstream.breakers.is_available(&t.record.worker_id, now)
        });
        let index = selector.choose(&options).ok_or_else(|| {
            ApiError::new(
                ErrorClass::ServiceUnavailable,
                format!("no {} worker is available", selector.role()),
            )
        })?;
        Ok(options[index].clone())
    };
    let p = pick(prefill_selector, prefill)?;
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
    let d = pick(decode_selector, pool)?;
    let protocol = resolve_protocol(&p.record, &d.record)
        .and_then(|protocol| {
            if protocol.completions_only() && kind == ApiKind::Chat {
                Err(PdError::CompletionsOnly { protocol })
            } else {
                Ok(protocol)
            }
        })
        .map_err(|e| {
            upstream.metrics.record_pd_failure(e.reason());
            e.to_api_error()
        })?;
    Ok((p, d, protocol))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_of_statuses_and_errors() {
        let table = [
            (200, Outcome::Cancelled),
            (404, Outcome::ClientError),
            (503, Outcome::UpstreamError),
        ];
        for (status, want) in table {
            let status = reqwest::StatusCode::from_u16(status).unwrap();
            assert_eq!(outcome_for(status), want, "{status}");
        }
        let table = [
            (ErrorClass::GatewayTimeout, Outcome::Timeout),
            (ErrorClass::BadRequest, Outcome::ClientError),
            (ErrorClass::RateLimited, Outcome::ClientError),
            (ErrorClass::BadGateway, Outcome::UpstreamError),
            (ErrorClass::ServiceUnavailable, Outcome::UpstreamError),
        ];
        for (class, want) in table {
            assert_eq!(outcome_of_error(&ApiError::new(class, "x")), want);
        }
    }
}
