//! Relaying a worker's response body to the client chunk by chunk (never buffered
//! whole), while measuring TTFT and the gaps between writes, enforcing an idle timeout,
//! and turning a mid-stream failure into an SSE error event. A streamed (SSE) body is
//! read by a pump task of its own, so what arrives while a write is under way leaves
//! together in the next write. Dropping the relay (the
//! client went away) drops the upstream connection, which cancels the request on the
//! worker. A prefill/decode request's relay also ends, with an error event, when its
//! prefill leg fails (the decode would otherwise wait for a KV transfer that never
//! comes).

use crate::metrics::Outcome;
use crate::route::kv_state::KvCharge;
use crate::send::guard::{Abort, Forwarded, RequestGuard, Sent};
use crate::send::migration::{Continuation, MigrationState};
use crate::send::nats::{Ending, ending_of};
use crate::send::upstream::{Upstream, stall_error};
use crate::send::worker_response::BodyStream;
use crate::workers::breaker::Breakers;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_telemetry::logging::SPAN_EVENTS;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct RelayState {
    upstream: BodyStream,
    guard: RequestGuard,
    breakers: Arc<Breakers>,
    worker: String,
    sse: bool,
    idle: Duration,
    last: Option<Instant>,
    done: bool,
    abort: Option<Abort>,
    migration: Option<Migration>,
}

/// Sends a moved generation's continuation (excluding the workers it failed on), with
/// the request's own guard.
pub(crate) type Resume = Box<
    dyn for<'g> FnMut(
            Continuation,
            Vec<String>,
            &'g mut RequestGuard,
        ) -> futures::future::BoxFuture<'g, Result<Sent, ApiError>>
        + Send,
>;

/// What a relay needs to move its generation to another worker mid-stream.
pub(crate) struct Migration {
    /// What has been relayed, and how to continue it.
    pub state: MigrationState,
    /// Sends the continuation.
    pub resume: Resume,
    /// Workers the generation failed on.
    pub failed: Vec<String>,
}

impl std::fmt::Debug for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migration")
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// The next upstream chunk, or the abort's error if it fires first.
async fn next_or_abort(
    upstream: &mut BodyStream,
    abort: &mut Option<Abort>,
) -> Result<Option<Result<Bytes, std::io::Error>>, ApiError> {
    match abort {
        None => Ok(upstream.next().await),
        Some(a) => {
            tokio::select! {
                biased;
                e = a => {
                    *abort = None;
                    Err(e)
                }
                next = upstream.next() => Ok(next),
            }
        }
    }
}

/// `abort`, or the worker starting to fail its health checks, whichever comes first.
fn with_stall(abort: Option<Abort>, breakers: &Breakers, worker: &str) -> Option<Abort> {
    let stall = stall_error(breakers, "worker", worker);
    Some(match abort {
        None => Box::pin(stall),
        Some(abort) => Box::pin(async move {
            tokio::select! {
                e = abort => e,
                e = stall => e,
            }
        }),
    })
}

/// Chunks queued between the pump and the relay (backpressure past it).
const PUMP_QUEUE: usize = 64;

/// Most bytes gathered into one write.
const COALESCE_LIMIT: usize = 64 * 1024;

/// Aborts the pump when the relay goes away.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the pump hands the relay.
enum Pumped {
    Chunk(Result<Bytes, std::io::Error>),
    End,
}

/// How the pumped stream goes on after what it gathered.
enum After {
    Ended,
    Failed(std::io::Error),
}

/// The worker's body read by a task of its own while the client's connection writes,
/// and yielded as it is ready: every chunk that arrived while the last write was under
/// way comes in the next item, and a chunk that finds the relay waiting comes at once
/// (no timer, nothing waits for more). The relay (and its guard, which owns the
/// request's bookkeeping) stays with the client's connection; the pump only reads. Its
/// handle lives in the returned stream: dropping that (the client went away) aborts it,
/// which drops the worker's body and cancels the request on the worker.
fn pumped(mut body: BodyStream) -> BodyStream {
    let (tx, rx) = tokio::sync::mpsc::channel(PUMP_QUEUE);
    let pump = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                biased;
                () = tx.closed() => return,
                next = body.next() => next,
            };
            let (message, last) = match next {
                Some(item) => (Pumped::Chunk(item), false),
                None => (Pumped::End, true),
            };
            if tx.send(message).await.is_err() || last {
                return;
            }
        }
    });
    let abnormal = || std::io::Error::other("the relay's reader ended abnormally");
    let state = (rx, AbortOnDrop(pump), None::<After>);
    Box::pin(futures::stream::unfold(
        state,
        move |(mut rx, pump, after)| async move {
            match after {
                Some(After::Ended) => return None,
                Some(After::Failed(e)) => return Some((Err(e), (rx, pump, Some(After::Ended)))),
                None => {}
            }
            let first = match rx.recv().await {
                Some(Pumped::Chunk(Ok(b))) => b,
                Some(Pumped::Chunk(Err(e))) => {
                    return Some((Err(e), (rx, pump, Some(After::Ended))));
                }
                Some(Pumped::End) => return None,
                None => return Some((Err(abnormal()), (rx, pump, Some(After::Ended)))),
            };
            let mut gathered: Option<bytes::BytesMut> = None;
            let mut len = first.len();
            let mut after = None;
            while len < COALESCE_LIMIT {
                match rx.try_recv() {
                    Ok(Pumped::Chunk(Ok(more))) => {
                        len += more.len();
                        gathered
                            .get_or_insert_with(|| bytes::BytesMut::from(&first[..]))
                            .extend_from_slice(&more);
                    }
                    Ok(Pumped::Chunk(Err(e))) => {
                        after = Some(After::Failed(e));
                        break;
                    }
                    Ok(Pumped::End) => {
                        after = Some(After::Ended);
                        break;
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                        after = Some(After::Failed(abnormal()));
                        break;
                    }
                }
            }
            let out = gathered.map_or(first, bytes::BytesMut::freeze);
            Some((Ok(out), (rx, pump, after)))
        },
    ))
}

/// The client-bound body for a forwarded response, chunk by chunk with the relay's
/// bookkeeping (`sse`: failures become an error event rather than a cut connection, and
/// the worker's body is [`pumped`]). With a [`Migration`], an SSE stream whose worker
/// fails or drains mid-stream continues on another worker.
pub(crate) fn relay_body(
    forwarded: Forwarded,
    upstream: &Upstream,
    sse: bool,
    migration: Option<Migration>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + use<> {
    let Forwarded {
        response,
        worker,
        guard,
        abort,
    } = forwarded;
    let breakers = upstream.breakers.clone();
    let abort = with_stall(abort, &breakers, &worker);
    let body = response.body;
    let state = RelayState {
        upstream: if sse { pumped(body) } else { body },
        guard,
        breakers,
        worker,
        sse,
        idle: upstream.idle_timeout,
        last: None,
        done: false,
        abort,
        migration: migration.filter(|_| sse),
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            let next =
                tokio::time::timeout(st.idle, next_or_abort(&mut st.upstream, &mut st.abort));
            let (failure, ending) = match next.await {
                Ok(Err(aborted)) => {
                    st.guard.outcome = Outcome::UpstreamError;
                    st.done = true;
                    tracing::warn!(worker = %st.worker, "{}", aborted.message);
                    return Some(if st.sse {
                        (Ok(Bytes::from(aborted.to_sse_event())), st)
                    } else {
                        (Err(std::io::Error::other(aborted.message)), st)
                    });
                }
                Ok(Ok(Some(Ok(chunk)))) => {
                    let now = Instant::now();
                    match st.last {
                        None => {
                            tracing::debug!(target: SPAN_EVENTS, parent: &st.guard.span, "first byte");
                            st.guard.kv_charges.iter_mut().for_each(KvCharge::prefilled);
                            st.guard.first_byte();
                            // A JSON answer's first byte comes with its last token.
                            if st.sse {
                                st.guard.metrics.observe_ttft(
                                    now.duration_since(st.guard.started).as_secs_f64(),
                                );
                            }
                        }
                        Some(prev) if st.sse => st
                            .guard
                            .metrics
                            .observe_itl(now.duration_since(prev).as_secs_f64()),
                        Some(_) => {}
                    }
                    st.last = Some(now);
                    let out = match st.migration.as_mut() {
                        Some(m) => Bytes::from(m.state.observe(&chunk)),
                        None => chunk,
                    };
                    if out.is_empty() {
                        // Part of a line: it leaves with the rest.
                        continue;
                    }
                    return Some((Ok(out), st));
                }
                Ok(Ok(None)) => {
                    st.guard.set_outcome(Outcome::Ok);
                    st.done = true;
                    let rest = st.migration.as_mut().map(|m| m.state.take_pending());
                    return rest
                        .filter(|r| !r.is_empty())
                        .map(|r| (Ok(Bytes::from(r)), st));
                }
                Ok(Ok(Some(Err(e)))) => (
                    ApiError::new(
                        ErrorClass::BadGateway,
                        format!("worker {} broke the stream: {e}", st.worker),
                    ),
                    ending_of(&e),
                ),
                Err(_) => (
                    ApiError::new(
                        ErrorClass::GatewayTimeout,
                        format!("worker {} sent nothing for {:?}", st.worker, st.idle),
                    ),
                    Ending::Broken,
                ),
            };
            if ending == Ending::Broken {
                st.breakers.on_failure(&st.worker, Instant::now());
            }
            // A request out of its total time ends here, wherever it would go next.
            if st.migration.is_some() && ending != Ending::OverTime {
                match migrate(&mut st, ending == Ending::HandedBack).await {
                    Moved::Yes => continue,
                    Moved::Finished(done_sent) => {
                        st.guard.set_outcome(Outcome::Ok);
                        st.done = true;
                        return (!done_sent)
                            .then(|| (Ok(Bytes::from_static(b"data: [DONE]\n\n")), st));
                    }
                    Moved::No => {}
                }
            }
            st.guard.outcome = if failure.class == ErrorClass::GatewayTimeout {
                Outcome::Timeout
            } else {
                Outcome::UpstreamError
            };
            st.done = true;
            tracing::warn!(worker = %st.worker, "{}", failure.message);
            return if st.sse {
                Some((Ok(Bytes::from(failure.to_sse_event())), st))
            } else {
                Some((Err(std::io::Error::other(failure.message)), st))
            };
        }
    })
}

/// How a migration attempt went.
enum Moved {
    /// The stream goes on from another worker.
    Yes,
    /// Nothing was left to generate: the stream only needs its end (`true`: the
    /// worker's `[DONE]` went out already).
    Finished(bool),
    /// It could not move (counted).
    No,
}

/// Moves the relay's generation to another worker after its own failed (`draining`:
/// handed back).
async fn migrate(st: &mut RelayState, draining: bool) -> Moved {
    let Some(m) = st.migration.as_mut() else {
        return Moved::No;
    };
    let metrics = st.guard.metrics.clone();
    if m.state.finished() {
        return Moved::Finished(m.state.done_seen());
    }
    if !m.state.can_migrate() {
        let reason = if m.state.refusal().is_some() {
            "poisoned"
        } else {
            "limit"
        };
        if let Some(why) = m.state.refusal() {
            tracing::warn!(worker = %st.worker, "the stream cannot move: {}", why.describe());
        }
        metrics.record_migration_failed(reason);
        return Moved::No;
    }
    let reason = if draining {
        "worker_draining"
    } else {
        "stream_broken"
    };
    m.failed.push(st.worker.clone());
    st.guard.release(&st.worker);
    let continuation = m.state.next_continuation();
    let exact = continuation.exact;
    let sent = (m.resume)(continuation, m.failed.clone(), &mut st.guard).await;
    match sent {
        Ok((response, worker, abort)) if response.status.is_success() && response.is_sse() => {
            tracing::info!(
                from = %st.worker, to = %worker, reason,
                tokens = m.state.produced_tokens(), exact,
                "moved a live generation"
            );
            metrics.record_migration(reason);
            st.abort = with_stall(abort, &st.breakers, &worker);
            st.upstream = pumped(response.body);
            st.worker = worker;
            Moved::Yes
        }
        Ok((response, worker, _)) => {
            tracing::warn!(to = %worker, status = %response.status, "the continuation was refused");
            metrics.record_migration_failed("no_first_byte");
            Moved::No
        }
        Err(e) => {
            tracing::warn!("the continuation found no worker: {}", e.message);
            let reason = if e.class == ErrorClass::ServiceUnavailable {
                "no_candidate"
            } else {
                "no_first_byte"
            };
            metrics.record_migration_failed(reason);
            Moved::No
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &'static str) -> Result<Bytes, std::io::Error> {
        Ok(Bytes::from_static(s.as_bytes()))
    }

    type Sender = futures::channel::mpsc::UnboundedSender<Result<Bytes, std::io::Error>>;

    fn source() -> (Sender, BodyStream) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        (tx, Box::pin(rx))
    }

    #[tokio::test]
    async fn what_arrived_together_leaves_together_and_nothing_waits() {
        let (tx, body) = source();
        let mut out = pumped(body);
        for s in ["data: a\n\n", "data: b\n\n", "data: c\n\n"] {
            tx.unbounded_send(ok(s)).unwrap();
        }
        assert_eq!(
            out.next().await.unwrap().unwrap(),
            "data: a\n\ndata: b\n\ndata: c\n\n"
        );
        // A chunk alone is yielded alone, at once.
        tx.unbounded_send(ok("data: d\n\n")).unwrap();
        assert_eq!(out.next().await.unwrap().unwrap(), "data: d\n\n");
        // An error ends what was gathered before it, then follows on its own.
        tx.unbounded_send(ok("data: e\n\n")).unwrap();
        tx.unbounded_send(Err(std::io::Error::other("broken")))
            .unwrap();
        assert_eq!(out.next().await.unwrap().unwrap(), "data: e\n\n");
        assert!(out.next().await.unwrap().is_err());
        assert!(out.next().await.is_none());
    }

    #[tokio::test]
    async fn the_end_is_told_apart_from_a_reader_that_died() {
        let (tx, body) = source();
        let mut out = pumped(body);
        tx.unbounded_send(ok("data: a\n\n")).unwrap();
        drop(tx);
        assert_eq!(out.next().await.unwrap().unwrap(), "data: a\n\n");
        assert!(out.next().await.is_none(), "a clean end");
    }

    #[tokio::test]
    async fn a_client_gone_drops_the_worker_body() {
        let (tx, body) = source();
        let mut out = pumped(body);
        tx.unbounded_send(ok("data: a\n\n")).unwrap();
        out.next().await.unwrap().unwrap();
        drop(out);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !tx.is_closed() {
            assert!(Instant::now() < deadline, "the pump kept the worker's body");
            tokio::task::yield_now().await;
        }
    }
}
