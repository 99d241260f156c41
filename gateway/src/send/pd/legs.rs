//! Sending both legs of a prefill/decode request.
//!
//! The prefill leg always runs in its own task, so a client that goes away never
//! cancels a KV transfer half done. Concurrent protocols send both legs at once and
//! relay the decode; a prefill failure ends the request (502 before the decode's first
//! byte, an error event after it) rather than leave the client waiting on a transfer
//! that will not come. Serial protocols wait for the prefill's answer and hand its
//! `kv_transfer_params` to the decode. The decode open is retried on the same worker
//! (its peers were already told who it is) while no byte has come back.

use super::connectors::{
    Leg, PdError, PdPair, build_decode_leg, build_prefill_leg, extract_handoff,
};
use crate::offload::off_workers;
use crate::send::guard::Abort;
use crate::send::nats::{NatsPlane, Outgoing, PlaneError};
use crate::send::upstream::{
    Outbound, REQUEST_ID_HEADER, Upstream, build_post, record_answer, root_cause, send_span,
    stall_error,
};
use crate::send::worker_response::WorkerResponse;
use crate::workers::registry::Target;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::pd::PdTopology;
use reqwest::StatusCode;
use serde_json::Value;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Retries of a decode open that failed before its first byte.
pub(crate) const DECODE_OPEN_RETRIES: u32 = 3;

/// First wait between decode opens (doubling up to [`DECODE_RETRY_MAX_BACKOFF`]).
pub(crate) const DECODE_RETRY_BACKOFF: Duration = Duration::from_millis(50);

/// Longest wait between decode opens.
pub(crate) const DECODE_RETRY_MAX_BACKOFF: Duration = Duration::from_millis(500);

/// A decode leg whose headers have arrived.
pub(crate) struct PdOpened {
    /// The decode worker's response (body not yet read).
    pub response: WorkerResponse,
    /// Ends the relay if the prefill fails while the decode streams.
    pub abort: Option<Abort>,
}

impl std::fmt::Debug for PdOpened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PdOpened")
            .field("status", &self.response.status)
            .field("abort", &self.abort.is_some())
            .finish()
    }
}

type PrefillResult = Shared<BoxFuture<'static, Result<Bytes, ApiError>>>;

/// Records a set-up failure and turns it into the client's error.
fn setup_failed(upstream: &Upstream, err: &PdError) -> ApiError {
    upstream.metrics.record_pd_failure(err.reason());
    tracing::warn!(reason = err.reason(), "prefill/decode request: {:?}", err);
    err.to_api_error()
}

/// A leg ready to send: its body serialized once (a retried decode open sends the same
/// bytes again).
struct Encoded {
    headers: Vec<(&'static str, String)>,
    body: Bytes,
}

/// Builds a leg and serializes it, off the async workers for a large request body.
fn encode(
    body_bytes: usize,
    build: impl FnOnce() -> Result<Leg, PdError>,
) -> Result<Encoded, PdError> {
    off_workers(body_bytes, || {
        let leg = build()?;
        Ok(Encoded {
            body: Bytes::from(serde_json::to_vec(&leg.body).unwrap_or_default()),
            headers: leg.headers,
        })
    })
}

fn post(
    upstream: &Upstream,
    target: &Target,
    leg: &Encoded,
    outbound: &Outbound<'_>,
    span: &tracing::Span,
) -> reqwest::RequestBuilder {
    let mut request = build_post(
        upstream,
        target,
        outbound.kind.path(),
        (outbound.request_id, outbound.trace, span),
        leg.body.clone(),
    );
    for (name, value) in &leg.headers {
        request = request.header(*name, value);
    }
    request
}

/// An excerpt of an error body: the OpenAI `error.message` when there is one.
fn error_text(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let text = message.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    text.chars().take(300).collect()
}

/// Runs the prefill leg to the end of its body in a task of its own.
fn spawn_prefill(
    upstream: &Upstream,
    target: &Target,
    leg: &Encoded,
    outbound: &Outbound<'_>,
    over_nats: bool,
) -> PrefillResult {
    let span = send_span("prefill", target, outbound.kind.path());
    let request = if over_nats {
        PrefillRequest::Nats {
            envelope: build_envelope(leg, outbound, &span, false),
            path: outbound.kind.path(),
        }
    } else {
        PrefillRequest::Http(post(upstream, target, leg, outbound, &span))
    };
    let upstream = upstream.clone();
    let worker = target.record.worker_id.clone();
    let task = tokio::spawn(
        async move {
            let started = Instant::now();
            let result = run_prefill(&upstream, request, &worker).await;
            upstream
                .metrics
                .observe_pd_leg("prefill", &worker, started.elapsed().as_secs_f64());
            match &result {
                Ok(_) => upstream.breakers.on_success(&worker),
                Err((reason, e)) => {
                    tracing::Span::current().record("otel.status_code", "ERROR");
                    upstream.metrics.record_pd_failure(reason);
                    if matches!(*reason, "prefill_rejected" | "prefill_busy") {
                        // An answer below 500: the worker is up (closes a half-open breaker).
                        upstream.breakers.on_success(&worker);
                    } else {
                        upstream.breakers.on_failure(&worker, Instant::now());
                    }
                    tracing::warn!(worker = %worker, reason, "{}", e.message);
                }
            }
            result.map_err(|(_, e)| e)
        }
        .instrument(span),
    );
    task.map(|joined| {
        joined.unwrap_or_else(|e| {
            Err(ApiError::new(
                ErrorClass::Internal,
                format!("the prefill task ended abnormally: {e}"),
            ))
        })
    })
    .boxed()
    .shared()
}

/// How the prefill leg goes out: an HTTP POST, or the NATS plane's envelope.
enum PrefillRequest {
    Http(reqwest::RequestBuilder),
    Nats {
        envelope: Envelope,
        path: &'static str,
    },
}

/// The prefill leg's answer, ended early when the worker starts failing its health
/// checks (a hung engine never answers).
async fn run_prefill(
    upstream: &Upstream,
    request: PrefillRequest,
    worker: &str,
) -> Result<Bytes, (&'static str, ApiError)> {
    let answer = async {
        let (status, body) = match request {
            PrefillRequest::Http(request) => prefill_over_http(upstream, request, worker).await?,
            PrefillRequest::Nats { envelope, path } => {
                prefill_over_nats(upstream, &envelope, path, worker).await?
            }
        };
        judge_prefill(worker, status, body)
    };
    tokio::select! {
        answer = answer => answer,
        stalled = stall_error(&upstream.breakers, "prefill worker", worker) => {
            Err(("prefill_stalled", stalled))
        }
    }
}

async fn prefill_over_http(
    upstream: &Upstream,
    request: reqwest::RequestBuilder,
    worker: &str,
) -> Result<(StatusCode, Bytes), (&'static str, ApiError)> {
    let timeout = upstream.request_timeout;
    let response = match tokio::time::timeout(timeout, request.send()).await {
        Err(_) => {
            return Err((
                "prefill_timeout",
                ApiError::new(
                    ErrorClass::GatewayTimeout,
                    format!("prefill worker {worker} did not answer within {timeout:?}"),
                ),
            ));
        }
        Ok(Err(e)) => {
            return Err((
                "prefill_unreachable",
                ApiError::new(
                    ErrorClass::BadGateway,
                    format!("prefill worker {worker} is unreachable: {}", root_cause(&e)),
                ),
            ));
        }
        Ok(Ok(r)) => r,
    };
    let status = response.status();
    let idle = upstream.idle_timeout;
    match tokio::time::timeout(idle, response.bytes()).await {
        Ok(Ok(b)) => Ok((status, b)),
        Ok(Err(e)) => Err((
            "prefill_error",
            ApiError::new(
                ErrorClass::BadGateway,
                format!("prefill worker {worker} broke its answer: {e}"),
            ),
        )),
        Err(_) => Err((
            "prefill_timeout",
            ApiError::new(
                ErrorClass::GatewayTimeout,
                format!("prefill worker {worker} sent nothing for {idle:?}"),
            ),
        )),
    }
}

/// The prefill leg over the NATS plane, read to its `done` frame (the plane enforces
/// its own idle and total timeouts).
async fn prefill_over_nats(
    upstream: &Upstream,
    envelope: &Envelope,
    path: &str,
    worker: &str,
) -> Result<(StatusCode, Bytes), (&'static str, ApiError)> {
    let Some(plane) = upstream.nats.get() else {
        return Err((
            "prefill_unreachable",
            ApiError::new(
                ErrorClass::BadGateway,
                "the NATS request plane is not connected",
            ),
        ));
    };
    let response = envelope.send(plane, worker, path).await.map_err(|e| {
        let reason = match e {
            PlaneError::Busy(_) | PlaneError::Draining => "prefill_busy",
            PlaneError::Timeout(_) => "prefill_timeout",
            PlaneError::NoResponder => "prefill_unreachable",
            _ => "prefill_error",
        };
        (reason, e.to_api_error(worker))
    })?;
    let status = response.status;
    let body = response.bytes().await.map_err(|e| {
        (
            "prefill_error",
            ApiError::new(
                ErrorClass::BadGateway,
                format!("prefill worker {worker} broke its answer: {e}"),
            ),
        )
    })?;
    Ok((status, body))
}

/// What the prefill worker's answer means for the pair (pure).
fn judge_prefill(
    worker: &str,
    status: StatusCode,
    body: Bytes,
) -> Result<Bytes, (&'static str, ApiError)> {
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Err((
            "prefill_busy",
            ApiError::new(
                ErrorClass::RateLimited,
                format!("prefill worker {worker} is at its admission limit; retry shortly"),
            ),
        ));
    }
    if status.is_client_error() {
        return Err((
            "prefill_rejected",
            ApiError::new(
                ErrorClass::BadRequest,
                format!(
                    "prefill worker {worker} rejected the request ({status}): {}",
                    error_text(&body)
                ),
            ),
        ));
    }
    if !status.is_success() {
        return Err((
            "prefill_error",
            ApiError::new(
                ErrorClass::BadGateway,
                format!(
                    "prefill worker {worker} failed ({status}): {}",
                    error_text(&body)
                ),
            ),
        ));
    }
    Ok(body)
}

/// Opens the decode leg, retrying on the same worker while nothing came back.
async fn open_decode(
    upstream: &Upstream,
    target: &Target,
    leg: &Encoded,
    outbound: &Outbound<'_>,
    over_nats: bool,
) -> Result<WorkerResponse, ApiError> {
    if over_nats {
        return open_decode_over_nats(upstream, target, leg, outbound).await;
    }
    let rid = outbound.request_id;
    let worker = &target.record.worker_id;
    let timeout = upstream.request_timeout;
    let started = Instant::now();
    let mut backoff = DECODE_RETRY_BACKOFF;
    let mut attempt = 0;
    loop {
        let span = send_span("decode", target, outbound.kind.path());
        let send =
            tokio::time::timeout(timeout, post(upstream, target, leg, outbound, &span).send())
                .instrument(span.clone());
        let answer = tokio::select! {
            answer = send => answer,
            stalled = stall_error(&upstream.breakers, "decode worker", worker) => {
                span.record("otel.status_code", "ERROR");
                return Err(stalled);
            }
        };
        record_answer(&span, &answer);
        let failure = match answer {
            Err(_) => {
                upstream.breakers.on_failure(worker, Instant::now());
                return Err(ApiError::new(
                    ErrorClass::GatewayTimeout,
                    format!("decode worker {worker} did not answer within {timeout:?}"),
                ));
            }
            Ok(Ok(response)) if !response.status().is_server_error() => {
                upstream.breakers.on_success(worker);
                upstream
                    .metrics
                    .observe_pd_leg("decode", worker, started.elapsed().as_secs_f64());
                return Ok(WorkerResponse::from_http(response));
            }
            Ok(Ok(response)) => {
                let status = response.status();
                let body = tokio::time::timeout(upstream.idle_timeout, response.bytes())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default();
                format!("answered {status}: {}", error_text(&body))
            }
            Ok(Err(e)) => format!("is unreachable: {}", root_cause(&e)),
        };
        upstream.breakers.on_failure(worker, Instant::now());
        if attempt == DECODE_OPEN_RETRIES {
            upstream.metrics.record_pd_failure("decode_failed");
            return Err(ApiError::new(
                ErrorClass::BadGateway,
                format!(
                    "decode worker {worker} {failure} (after {} attempts)",
                    DECODE_OPEN_RETRIES + 1
                ),
            ));
        }
        tracing::info!(worker = %worker, rid, attempt = attempt + 1, "decode open failed ({failure}); retrying");
        upstream.metrics.record_pd_decode_retry();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(DECODE_RETRY_MAX_BACKOFF);
        attempt += 1;
    }
}

/// A leg's envelope for the NATS plane: the headers an HTTP leg carries (the request
/// id, the trace context, the leg's own) and its body.
struct Envelope {
    headers: Vec<(String, String)>,
    body: Bytes,
    stream: bool,
}

impl Envelope {
    /// Sends it to `worker` on `plane` and waits for its answer to begin.
    async fn send(
        &self,
        plane: &NatsPlane,
        worker: &str,
        path: &str,
    ) -> Result<WorkerResponse, PlaneError> {
        let headers: Vec<(&str, String)> = self
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.clone()))
            .collect();
        let out = Outgoing {
            path,
            stream: self.stream,
            headers: &headers,
            body: &self.body,
            migratable: false,
        };
        plane.send(worker, &out).await
    }
}

fn build_envelope(
    leg: &Encoded,
    outbound: &Outbound<'_>,
    span: &tracing::Span,
    stream: bool,
) -> Envelope {
    let mut headers = vec![(REQUEST_ID_HEADER.to_owned(), outbound.request_id.to_owned())];
    headers.extend(
        outbound
            .trace
            .upstream_headers(span)
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned()))),
    );
    headers.extend(
        leg.headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.clone())),
    );
    Envelope {
        headers,
        body: leg.body.clone(),
        stream,
    }
}

/// Opens the decode leg over the NATS plane, retrying on the same worker while it is
/// not there (no responder) or failed before its first frame.
async fn open_decode_over_nats(
    upstream: &Upstream,
    target: &Target,
    leg: &Encoded,
    outbound: &Outbound<'_>,
) -> Result<WorkerResponse, ApiError> {
    let worker = &target.record.worker_id;
    let Some(plane) = upstream.nats.get() else {
        return Err(ApiError::new(
            ErrorClass::BadGateway,
            "the NATS request plane is not connected",
        ));
    };
    let started = Instant::now();
    let mut backoff = DECODE_RETRY_BACKOFF;
    let mut attempt = 0;
    loop {
        let span = send_span("decode", target, outbound.kind.path());
        let envelope = build_envelope(leg, outbound, &span, outbound.stream);
        let answer = tokio::select! {
            answer = envelope.send(plane, worker, outbound.kind.path()).instrument(span.clone()) => answer,
            stalled = stall_error(&upstream.breakers, "decode worker", worker) => {
                span.record("otel.status_code", "ERROR");
                return Err(stalled);
            }
        };
        let failure = match answer {
            Ok(response) if !response.status.is_server_error() => {
                span.record("http.status_code", response.status.as_u16());
                upstream.breakers.on_success(worker);
                upstream
                    .metrics
                    .observe_pd_leg("decode", worker, started.elapsed().as_secs_f64());
                return Ok(response);
            }
            Ok(response) => {
                let status = response.status;
                let body = response.bytes().await.unwrap_or_default();
                PlaneError::Failed(format!("answered {status}: {}", error_text(&body)))
            }
            Err(e @ (PlaneError::Busy(_) | PlaneError::Draining)) => {
                upstream.breakers.on_success(worker);
                return Err(e.to_api_error(worker));
            }
            Err(e) if !e.retryable() => {
                upstream.breakers.on_failure(worker, Instant::now());
                return Err(e.to_api_error(worker));
            }
            Err(e) => e,
        };
        span.record("otel.status_code", "ERROR");
        upstream.breakers.on_failure(worker, Instant::now());
        if attempt == DECODE_OPEN_RETRIES {
            upstream.metrics.record_pd_failure("decode_failed");
            return Err(ApiError::new(
                ErrorClass::BadGateway,
                format!(
                    "decode worker {worker}: {} (after {} attempts)",
                    failure.to_api_error(worker).message,
                    DECODE_OPEN_RETRIES + 1
                ),
            ));
        }
        tracing::info!(worker = %worker, rid = outbound.request_id, attempt = attempt + 1, "decode open over NATS failed; retrying");
        upstream.metrics.record_pd_decode_retry();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(DECODE_RETRY_MAX_BACKOFF);
        attempt += 1;
    }
}

/// The leg of a pair that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailedLeg {
    /// Building the legs (the pair cannot work, whichever workers).
    Setup,
    /// The prefill worker.
    Prefill,
    /// The decode worker.
    Decode,
}

/// Why a pair did not open: the leg, and the client's error.
#[derive(Debug)]
pub(crate) struct PairFailure {
    /// Which leg.
    pub leg: FailedLeg,
    /// What the client is told if no other pair is tried.
    pub error: ApiError,
}

impl PairFailure {
    fn of(leg: FailedLeg) -> impl Fn(ApiError) -> Self {
        move |error| Self { leg, error }
    }

    /// A worker failed (unreachable, broken, timed out) and another pair may answer.
    pub(crate) fn retryable(&self) -> bool {
        self.leg != FailedLeg::Setup
            && matches!(
                self.error.class,
                ErrorClass::BadGateway | ErrorClass::GatewayTimeout
            )
    }
}

/// Sends `request` over `pair`; returns the decode's open response.
pub(crate) async fn send_pair(
    upstream: &Upstream,
    pair: &PdPair<'_>,
    request: &Outbound<'_>,
) -> Result<PdOpened, PairFailure> {
    let setup = PairFailure::of(FailedLeg::Setup);
    let prefilled = PairFailure::of(FailedLeg::Prefill);
    let decoded = PairFailure::of(FailedLeg::Decode);
    let (body, body_bytes) = (request.body, request.body_bytes);
    let prefill_leg = encode(body_bytes, || build_prefill_leg(pair, body))
        .map_err(|e| setup(setup_failed(upstream, &e)))?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    match pair.protocol.topology() {
        PdTopology::Concurrent => {
            // Both legs over the NATS plane when both workers take requests there (the
            // KV still moves engine to engine, named by the bootstrap room in the bodies).
            let over_nats = upstream.nats_for(pair.prefill).is_some()
                && upstream.nats_for(pair.decode).is_some();
            let decode_leg = encode(body_bytes, || build_decode_leg(pair, body, None))
                .map_err(|e| setup(setup_failed(upstream, &e)))?;
            let prefill = spawn_prefill(upstream, pair.prefill, &prefill_leg, request, over_nats);
            let mut failed: Abort = {
                let prefill = prefill.clone();
                Box::pin(async move {
                    match prefill.await {
                        Err(e) => e,
                        Ok(_) => std::future::pending().await,
                    }
                })
            };
            let response = tokio::select! {
                biased;
                e = &mut failed => return Err(prefilled(e)),
                opened = open_decode(upstream, pair.decode, &decode_leg, request, over_nats) => {
                    opened.map_err(&decoded)?
                }
            };
            if !response.status.is_success() {
                return Ok(PdOpened {
                    response,
                    abort: None,
                });
            }
            if stream {
                return Ok(PdOpened {
                    response,
                    abort: Some(failed),
                });
            }
            // A whole answer exists only once the KV arrived: the prefill is done, or
            // about to be; a failed one voids the answer.
            prefill.await.map_err(&prefilled)?;
            Ok(PdOpened {
                response,
                abort: None,
            })
        }
        PdTopology::Serial => {
            let answer = spawn_prefill(upstream, pair.prefill, &prefill_leg, request, false)
                .await
                .map_err(&prefilled)?;
            let handoff = serde_json::from_slice::<Value>(&answer)
                .map_err(|e| PdError::BadHandoff {
                    worker: pair.prefill.record.worker_id.clone(),
                    detail: format!("the answer is not JSON ({e})"),
                })
                .and_then(|v| extract_handoff(pair.protocol, &pair.prefill.record, &v))
                .map_err(|e| setup(setup_failed(upstream, &e)))?;
            let decode_leg = encode(body_bytes, || build_decode_leg(pair, body, Some(&handoff)))
                .map_err(|e| setup(setup_failed(upstream, &e)))?;
            let response = open_decode(upstream, pair.decode, &decode_leg, request, false)
                .await
                .map_err(&decoded)?;
            Ok(PdOpened {
                response,
                abort: None,
            })
        }
    }
}
