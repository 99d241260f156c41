//! Relaying a worker's response body to the client chunk by chunk (never buffered
//! whole), while measuring TTFT and inter-chunk latency, enforcing an idle timeout, and
//! turning a mid-stream failure into an SSE error event. Dropping the relay (the
//! client went away) drops the upstream connection, which cancels the request on the
//! worker.

use crate::breaker::Breakers;
use crate::metrics::{Metrics, Outcome};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use infera_proto::error_class::{ApiError, ErrorClass};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Upstream = Pin<Box<dyn Stream<Item = Result<Bytes, reqwest::Error>> + Send>>;

/// Bookkeeping that must happen however the response ends.
#[derive(Debug)]
pub struct RequestGuard {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Router label.
    pub router: &'static str,
    /// When the request arrived.
    pub started: Instant,
    /// Outcome if the relay ends now (cancelled until the body completes).
    pub outcome: Outcome,
    /// Per-worker in-flight counter to release.
    pub inflight: Option<(Arc<crate::gateway::Inflight>, String)>,
    /// kv-aware in-flight blocks, released on drop.
    pub kv_charge: Option<crate::kv_router::KvCharge>,
}

impl RequestGuard {
    /// Sets how the request ended.
    pub fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.metrics
            .request_finished(self.router, self.outcome, self.started);
        if let Some((inflight, worker)) = &self.inflight {
            inflight.release(worker);
        }
    }
}

struct RelayState {
    upstream: Upstream,
    guard: RequestGuard,
    breakers: Arc<Breakers>,
    worker: String,
    sse: bool,
    idle: Duration,
    last: Option<Instant>,
    done: bool,
}

/// The client-bound body for an upstream response.
pub fn relay_body(
    response: reqwest::Response,
    guard: RequestGuard,
    breakers: Arc<Breakers>,
    worker: String,
    sse: bool,
    idle: Duration,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let state = RelayState {
        upstream: Box::pin(response.bytes_stream()),
        guard,
        breakers,
        worker,
        sse,
        idle,
        last: None,
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let failure = match tokio::time::timeout(st.idle, st.upstream.next()).await {
            Ok(Some(Ok(chunk))) => {
                let now = Instant::now();
                match st.last {
                    None => st
                        .guard
                        .metrics
                        .observe_ttft(now.duration_since(st.guard.started).as_secs_f64()),
                    Some(prev) => st
                        .guard
                        .metrics
                        .observe_itl(now.duration_since(prev).as_secs_f64()),
                }
                st.last = Some(now);
                return Some((Ok(chunk), st));
            }
            Ok(None) => {
                st.guard.set_outcome(Outcome::Ok);
                return None;
            }
            Ok(Some(Err(e))) => {
                st.guard.outcome = Outcome::UpstreamError;
                ApiError::new(
                    ErrorClass::BadGateway,
                    format!("worker {} broke the stream: {e}", st.worker),
                )
            }
            Err(_) => {
                st.guard.outcome = Outcome::Timeout;
                ApiError::new(
                    ErrorClass::GatewayTimeout,
                    format!("worker {} sent nothing for {:?}", st.worker, st.idle),
                )
            }
        };
        st.done = true;
        st.breakers.on_failure(&st.worker, Instant::now());
        tracing::warn!(worker = %st.worker, "{}", failure.message);
        if st.sse {
            Some((Ok(Bytes::from(failure.to_sse_event())), st))
        } else {
            Some((Err(std::io::Error::other(failure.message)), st))
        }
    })
}
