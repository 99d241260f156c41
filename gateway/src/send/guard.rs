//! A request's bookkeeping, from the pick to the relay's last byte: the
//! [`RequestGuard`] (metrics, in-flight counts, kv charges, the span) that settles
//! however the response ends, and the worker's answer carried with it ([`Forwarded`]).

use crate::metrics::{Metrics, Outcome};
use crate::route::kv_state::KvCharge;
use crate::send::served::ServedBy;
use crate::send::worker_response::WorkerResponse;
use crate::workers::inflight::Inflight;
use infera_proto::error_class::ApiError;
use infera_proto::pd::PdProtocol;
use infera_telemetry::logging::SPAN_EVENTS;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

/// Resolves with an error when the relay must stop (a prefill leg failed).
pub(crate) type Abort = Pin<Box<dyn Future<Output = ApiError> + Send>>;

/// Bookkeeping that must happen however the response ends.
#[derive(Debug)]
pub(crate) struct RequestGuard {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Router label.
    pub router: &'static str,
    /// When the request arrived.
    pub started: Instant,
    /// Outcome if the relay ends now (cancelled until the body completes).
    pub outcome: Outcome,
    /// Per-worker in-flight counters to release.
    pub inflight: Vec<(Arc<Inflight>, String)>,
    /// Per-worker counts of requests before their first byte, released at it, with
    /// when each began.
    pub pending: Vec<(Arc<Inflight>, String, Instant)>,
    /// kv-aware in-flight blocks, released on drop.
    pub kv_charges: Vec<KvCharge>,
    /// The connector of a prefill/decode request.
    pub pd_protocol: Option<PdProtocol>,
    /// The workers the request was first sent to, for the response's headers.
    pub served: ServedBy,
    /// The request's span: it ends (is exported) when the guard drops.
    pub span: tracing::Span,
}

impl RequestGuard {
    /// A guard for a request routed by `router` within `span`, cancelled until told
    /// otherwise.
    pub(crate) fn new(
        metrics: Arc<Metrics>,
        router: &'static str,
        started: Instant,
        span: tracing::Span,
    ) -> Self {
        metrics.request_started(router);
        Self {
            metrics,
            router,
            started,
            outcome: Outcome::Cancelled,
            inflight: Vec::new(),
            pending: Vec::new(),
            kv_charges: Vec::new(),
            pd_protocol: None,
            served: ServedBy::default(),
            span,
        }
    }
}

impl RequestGuard {
    /// Sets how the request ended.
    pub(crate) fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// Counts the request in `worker`'s in-flight requests until the guard drops.
    pub(crate) fn hold(&mut self, inflight: &Arc<Inflight>, worker: &str) {
        inflight.acquire(worker);
        self.inflight.push((inflight.clone(), worker.to_owned()));
    }

    /// Counts the request among `worker`'s requests before their first byte, until
    /// [`RequestGuard::first_byte`] or the guard drops.
    pub(crate) fn hold_pending(&mut self, inflight: &Arc<Inflight>, worker: &str) {
        inflight.acquire_pending(worker);
        self.pending
            .push((inflight.clone(), worker.to_owned(), Instant::now()));
    }

    /// The answer's first byte arrived: the request no longer waits on its workers.
    pub(crate) fn first_byte(&mut self) {
        for (inflight, worker, since) in self.pending.drain(..) {
            inflight.observe_first_byte(&worker, since.elapsed().as_secs_f64());
            inflight.release_pending(&worker);
        }
    }

    /// The request ended before a first byte: its workers no longer hold it.
    fn release_pending(&mut self) {
        for (inflight, worker, _) in self.pending.drain(..) {
            inflight.release_pending(&worker);
        }
    }

    /// Stops counting the request in `worker`'s in-flight requests (it moved away).
    pub(crate) fn release(&mut self, worker: &str) {
        self.pending.retain(|(inflight, w, _)| {
            if w == worker {
                inflight.release_pending(w);
            }
            w != worker
        });
        self.inflight.retain(|(inflight, w)| {
            if w == worker {
                inflight.release(w);
            }
            w != worker
        });
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.metrics
            .request_finished(self.router, self.outcome, self.started);
        tracing::debug!(
            target: "infera_gateway::access",
            router = self.router,
            outcome = self.outcome.name(),
            workers = ?self.inflight.iter().map(|(_, w)| w.as_str()).collect::<Vec<_>>(),
            ms = self.started.elapsed().as_millis() as u64,
            "request"
        );
        if let Some(protocol) = self.pd_protocol {
            self.metrics.record_pd_request(protocol, self.outcome);
        }
        let outcome = self.outcome.name();
        self.span.record("outcome", outcome);
        if self.outcome != Outcome::Ok {
            self.span.record("otel.status_code", "ERROR");
        }
        tracing::debug!(target: SPAN_EVENTS, parent: &self.span, outcome, "completion");
        self.release_pending();
        for (inflight, worker) in &self.inflight {
            inflight.release(worker);
        }
    }
}

/// A worker's response on its way to the client, with the request's bookkeeping.
pub(crate) struct Forwarded {
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

/// A worker's answer: the response, the worker answering, and the relay's abort.
pub(crate) type Sent = (WorkerResponse, String, Option<Abort>);
