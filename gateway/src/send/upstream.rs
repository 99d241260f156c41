//! The send stage's shared parts, at its bottom: what sending needs from the gateway
//! ([`Upstream`]: the client, breakers, metrics, timeouts, the NATS plane), the request on
//! its way ([`Outbound`]), and the one POST every leg makes to a worker (its URL, request
//! id, trace context and client span). Every other file of `send/` builds on these.

use crate::metrics::Metrics;
use crate::request::validate::ApiKind;
use crate::send::nats::NatsPlane;
use crate::workers::breaker::Breakers;
use crate::workers::inflight::Inflight;
use crate::workers::registry::Target;
use bytes::Bytes;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::retention::Retention;
use infera_proto::worker::RequestTransport;
use infera_telemetry::propagation::TraceContext;
use serde_json::{Map, Value};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Header carrying the request id in and out, and to workers.
pub(crate) const REQUEST_ID_HEADER: &str = "x-infera-request-id";

/// What sending needs from the gateway, cheap to clone into a task (a prefill leg runs
/// in its own).
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
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
    /// The request plane to reach `target` by: NATS for a worker that registered
    /// `request_transport: nats` while the gateway runs it, HTTP otherwise.
    pub(crate) fn nats_for(&self, target: &Target) -> Option<&NatsPlane> {
        self.nats
            .get()
            .filter(|_| target.record.request_transport == RequestTransport::Nats)
    }
}

/// A validated request on its way to a worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outbound<'a> {
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

/// Resolves, once `worker` starts failing its health checks (`Breakers::stalled`), with
/// the error its request in flight ends with; `who` names it ("worker", "prefill
/// worker", ...).
pub(crate) fn stall_error(
    breakers: &Breakers,
    who: &str,
    worker: &str,
) -> impl Future<Output = ApiError> + Send + 'static {
    let stalled = breakers.stalled(worker);
    let message = format!("{who} {worker} stopped answering its health checks");
    async move {
        stalled.await;
        ApiError::new(ErrorClass::BadGateway, message)
    }
}

fn url_for(target: &Target, path: &str) -> String {
    format!("{}{path}", target.record.url.trim_end_matches('/'))
}

/// The client span of one request to a worker: the engine's spans continue it.
pub(crate) fn send_span(role: &'static str, target: &Target, path: &str) -> tracing::Span {
    if !infera_telemetry::logging::spans_exported() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        "send",
        otel.name = %format_args!("POST {path}"),
        otel.kind = "client",
        role,
        worker = %target.record.worker_id,
        http.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// Marks a client span with the worker's status, and as an error unless the worker
/// answered below 500.
pub(crate) fn record_answer(
    span: &tracing::Span,
    answer: &Result<reqwest::Result<reqwest::Response>, tokio::time::error::Elapsed>,
) {
    let status = match answer {
        Ok(Ok(response)) => Some(response.status()),
        _ => None,
    };
    if let Some(status) = status {
        span.record("http.status_code", status.as_u16());
    }
    if status.is_none_or(|s| s.is_server_error()) {
        span.record("otel.status_code", "ERROR");
    }
}

/// A POST of `body` to `path` on `target`, with the request id and the trace context
/// of `span`.
pub(crate) fn build_post(
    upstream: &Upstream,
    target: &Target,
    path: &str,
    request: (&str, &TraceContext, &tracing::Span),
    body: Bytes,
) -> reqwest::RequestBuilder {
    let (request_id, trace, span) = request;
    let mut post = upstream
        .client
        .post(url_for(target, path))
        .header("content-type", "application/json")
        .header(REQUEST_ID_HEADER, request_id);
    for (name, value) in trace.upstream_headers(span) {
        post = post.header(name, value);
    }
    post.body(body)
}

/// The innermost cause of a client error ("connection refused", not "error sending request").
pub(crate) fn root_cause(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(next) = source.source() {
        source = next;
    }
    source.to_string()
}
