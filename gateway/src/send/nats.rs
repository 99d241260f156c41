//! The NATS request plane, gateway side: a request published to its worker's subject
//! (`infera.req.<tok>`) with a reply inbox, the worker's `data`/`done`/`error` frames
//! read back as a [`WorkerResponse`]. Wire-compatible with the earlier router
//! (`nats_request.py`): the same envelope, frames, timeouts, cancel and admission.
//!
//! - **Status**: a streamed answer whose first frame is not a JSON object is an SSE
//!   stream and answers 200 at once; anything else is read to its `done` frame, whose
//!   `rs-status` is the status.
//! - **Timeouts**: idle (the wait for the next frame) and total (the whole request),
//!   either one 504 before the first frame, a broken stream after it.
//! - **Cancel**: a request that ends without its `done` frame (client gone, timeout,
//!   failure) publishes its inbox to `infera.cancel.<tok>`, [`CANCEL_RESENDS`] times.
//! - **A worker that vanished**: nobody subscribed to the subject answers "no
//!   responders" at once (the next worker is tried). Mid-stream, after a second without a
//!   frame, the gateway sends a request to the worker's cancel subject every second:
//!   while the worker's process lives, its subscription makes NATS accept it (our
//!   sidecar replies; the earlier worker ignores it, which is as good); once the process
//!   is gone the server answers "no responders", and the stream is broken (and can
//!   migrate) within about two seconds, not at the idle timeout or the lease's expiry.
//! - **Admission** (`max_pending` > 0): requests go through the `INFERA_REQUESTS` work
//!   queue; a worker whose durable consumer holds `max_pending` or more unacknowledged
//!   requests is skipped (read at most every 0.2 s, unreadable counts as room).

use crate::send::worker_response::{BodyStream, WorkerResponse};
use async_nats::jetstream;
use async_nats::{Client, HeaderMap, Message, RequestErrorKind, StatusCode as NatsStatus};
use bytes::Bytes;
use futures::StreamExt;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::request_plane::{
    CANCEL_RESEND_GAP_S, CANCEL_RESENDS, FrameType, HEADER_INBOX, HEADER_STATUS, HEADER_TYPE,
    PENDING_CACHE_S, REQUEST_STREAM, build_cancel_subject, build_request_durable,
    build_request_subject, is_draining_notice, parse_status,
};
use reqwest::StatusCode;
use reqwest::header::HeaderValue;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Silence in a stream after which the worker's presence is probed, and the gap
/// between probes.
pub(crate) const PROBE_AFTER: Duration = Duration::from_secs(1);

/// Payload of a presence probe (never a reply inbox, so no worker cancels on it).
pub(crate) const PROBE_PAYLOAD: &[u8] = b"infera: probe";

/// How requests travel and how long they may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PlaneSettings {
    /// Longest wait for the next frame (`None`: forever).
    pub idle_timeout: Option<Duration>,
    /// Longest whole request (`None`: no cap).
    pub max_duration: Option<Duration>,
    /// Admission backlog limit per worker (0: plain NATS, no admission).
    pub max_pending: u64,
}

/// Why a request over NATS got no answer to relay.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PlaneError {
    /// Nobody serves the worker's subject (try another).
    NoResponder,
    /// The worker's backlog is at the admission limit (try another; 429 if none).
    Busy(u64),
    /// The worker handed the request back before answering: it is draining.
    Draining,
    /// A timeout before the first frame.
    Timeout(String),
    /// The worker or NATS failed.
    Failed(String),
}

impl PlaneError {
    /// Whether another worker may be tried.
    pub(crate) fn retryable(&self) -> bool {
        !matches!(self, Self::Timeout(_))
    }

    /// The client's error for `worker`.
    pub(crate) fn to_api_error(&self, worker: &str) -> ApiError {
        match self {
            Self::NoResponder => ApiError::new(
                ErrorClass::BadGateway,
                format!("worker {worker} does not serve its NATS subject (no responders)"),
            ),
            Self::Busy(limit) => ApiError::new(
                ErrorClass::RateLimited,
                format!("worker {worker} request backlog over limit ({limit})"),
            ),
            Self::Draining => ApiError::new(
                ErrorClass::ServiceUnavailable,
                format!("worker {worker} is draining"),
            ),
            Self::Timeout(m) => ApiError::new(ErrorClass::GatewayTimeout, m.clone()),
            Self::Failed(m) => ApiError::new(
                ErrorClass::BadGateway,
                format!("worker {worker} failed: {m}"),
            ),
        }
    }
}

/// How a stream ended without its `done` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The worker failed, vanished or stalled past the idle timeout: it may move.
    Broken,
    /// The worker handed the request back (it drains): it may move.
    HandedBack,
    /// The request ran out of its total time (`--nats-req-max-duration`, on the gateway
    /// or the worker): it ends here.
    OverTime,
}

/// A stream that ended without its `done` frame, inside the body's `io::Error`: the
/// relay reads `how` to tell a hand-back or a time limit from a failure.
#[derive(Debug)]
pub(crate) struct StreamEnded {
    /// How it ended.
    pub how: Ending,
    /// What happened.
    pub message: String,
}

impl std::fmt::Display for StreamEnded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StreamEnded {}

/// How a body error ended its stream (`Broken` for any error not from NATS).
pub(crate) fn ending_of(e: &std::io::Error) -> Ending {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<StreamEnded>())
        .map_or(Ending::Broken, |s| s.how)
}

/// The worker's error text when a request outlived its max duration.
const OVER_TIME_TEXT: &[u8] = b"request exceeded max duration";

/// The gateway's connection to the request plane.
#[derive(Debug)]
pub(crate) struct NatsPlane {
    client: Client,
    js: Option<jetstream::Context>,
    settings: PlaneSettings,
    backlog: Mutex<HashMap<String, (Instant, u64)>>,
}

/// One request's envelope, its body already serialized.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    /// Engine path.
    pub path: &'a str,
    /// Whether the engine streams.
    pub stream: bool,
    /// Headers for the engine request.
    pub headers: &'a [(&'a str, String)],
    /// The engine request body (a JSON object).
    pub body: &'a [u8],
    /// The gateway can continue the generation elsewhere.
    pub migratable: bool,
}

/// The envelope's bytes: `{"path","stream","headers","body","migratable"}` (the body
/// written as it is, never parsed again).
pub(crate) fn encode_envelope(out: &Outgoing<'_>) -> Vec<u8> {
    let headers: serde_json::Map<String, serde_json::Value> = out
        .headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(v.as_str())))
        .collect();
    let mut bytes = Vec::with_capacity(out.body.len() + 160);
    bytes.extend_from_slice(b"{\"path\":");
    bytes.extend_from_slice(&serde_json::to_vec(out.path).unwrap_or_default());
    bytes.extend_from_slice(if out.stream {
        b",\"stream\":true,\"headers\":"
    } else {
        b",\"stream\":false,\"headers\":"
    });
    bytes.extend_from_slice(&serde_json::to_vec(&headers).unwrap_or_default());
    bytes.extend_from_slice(b",\"body\":");
    bytes.extend_from_slice(out.body);
    bytes.extend_from_slice(if out.migratable {
        b",\"migratable\":true}"
    } else {
        b",\"migratable\":false}"
    });
    bytes
}

impl NatsPlane {
    /// Connects to `url`.
    pub(crate) async fn connect(url: &str, settings: PlaneSettings) -> Result<Self, String> {
        let client = async_nats::ConnectOptions::new()
            .name("infera-gateway-req")
            .retry_on_initial_connect()
            .connect(url)
            .await
            .map_err(|e| format!("cannot connect to NATS at {url}: {e}"))?;
        // The workers create the work queue: a request to a worker whose stream is not
        // there yet fails over like one to a worker that is not there.
        let js = (settings.max_pending > 0).then(|| jetstream::new(client.clone()));
        Ok(Self {
            client,
            js,
            settings,
            backlog: Mutex::new(HashMap::new()),
        })
    }

    /// The settings it runs with.
    pub(crate) fn settings(&self) -> PlaneSettings {
        self.settings
    }

    /// Whether `worker` has room under the admission limit (always, with admission
    /// off or its backlog unreadable).
    async fn admit(&self, worker: &str) -> Result<(), PlaneError> {
        let (Some(js), limit) = (&self.js, self.settings.max_pending) else {
            return Ok(());
        };
        let now = Instant::now();
        let cached = self.backlog.lock().ok().and_then(|m| {
            m.get(worker)
                .filter(|(at, _)| now.duration_since(*at).as_secs_f64() < PENDING_CACHE_S)
                .map(|(_, n)| *n)
        });
        let backlog = match cached {
            Some(n) => Some(n),
            None => {
                let read = async {
                    let stream = js.get_stream(REQUEST_STREAM).await.ok()?;
                    let info = stream
                        .consumer_info(build_request_durable(worker))
                        .await
                        .ok()?;
                    Some(info.num_pending + info.num_ack_pending as u64)
                };
                let n = read.await;
                if let (Some(n), Ok(mut m)) = (n, self.backlog.lock()) {
                    m.insert(worker.to_owned(), (now, n));
                }
                n
            }
        };
        match backlog {
            Some(n) if n >= limit => Err(PlaneError::Busy(limit)),
            _ => Ok(()),
        }
    }

    /// Sends `out` to `worker` and waits for its answer to begin.
    pub(crate) async fn send(
        &self,
        worker: &str,
        out: &Outgoing<'_>,
    ) -> Result<WorkerResponse, PlaneError> {
        self.admit(worker).await?;
        let inbox = self.client.new_inbox();
        let sub =
            self.client.subscribe(inbox.clone()).await.map_err(|e| {
                PlaneError::Failed(format!("cannot subscribe to a reply inbox: {e}"))
            })?;
        let payload = Bytes::from(encode_envelope(out));
        let subject = build_request_subject(worker);
        let mut reply = Reply {
            sub,
            cancel: CancelOnDrop {
                client: self.client.clone(),
                subject: build_cancel_subject(worker),
                inbox: inbox.clone(),
                armed: true,
            },
            settings: self.settings,
            started: Instant::now(),
            worker: worker.to_owned(),
        };
        let published = match &self.js {
            Some(js) => {
                let mut headers = HeaderMap::new();
                headers.insert(HEADER_INBOX, inbox.as_str());
                match js.publish_with_headers(subject, headers, payload).await {
                    Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            None => {
                // The inbox in `rs-inbox` too: a worker that takes its requests from the
                // work queue reads it there, and the earlier worker reads it first.
                let mut headers = HeaderMap::new();
                headers.insert(HEADER_INBOX, inbox.as_str());
                self.client
                    .publish_with_reply_and_headers(subject, inbox, headers, payload)
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        if let Err(e) = published {
            reply.cancel.armed = false;
            return Err(PlaneError::Failed(format!(
                "cannot publish the request: {e}"
            )));
        }
        let first = reply.next_frame().await?;
        match first.kind {
            FrameType::Error if is_draining_notice(&first.payload) => {
                reply.cancel.armed = false;
                Err(PlaneError::Draining)
            }
            FrameType::Error => {
                reply.cancel.armed = false;
                Err(PlaneError::Failed(
                    String::from_utf8_lossy(&first.payload).into_owned(),
                ))
            }
            FrameType::Done => {
                reply.cancel.armed = false;
                Ok(whole(first.status, Bytes::new()))
            }
            FrameType::Data if out.stream && !first.payload.starts_with(b"{") => {
                let head = futures::stream::once(async move { Ok(first.payload) });
                Ok(WorkerResponse {
                    status: StatusCode::OK,
                    content_type: Some(HeaderValue::from_static("text/event-stream")),
                    body: Box::pin(head.chain(reply.into_body())),
                })
            }
            FrameType::Data => reply.read_whole(first.payload).await,
        }
    }
}

/// A whole (JSON) answer.
fn whole(status: u16, body: Bytes) -> WorkerResponse {
    WorkerResponse {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        content_type: Some(HeaderValue::from_static("application/json")),
        body: Box::pin(futures::stream::once(async move { Ok(body) })),
    }
}

/// A frame as read.
struct Incoming {
    kind: FrameType,
    status: u16,
    payload: Bytes,
}

fn incoming(msg: Message) -> Incoming {
    let header = |name: &str| {
        msg.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_owned())
    };
    let kind = FrameType::parse(header(HEADER_TYPE).as_deref());
    let status = parse_status(header(HEADER_STATUS).as_deref()).unwrap_or(502);
    Incoming {
        kind,
        status,
        payload: msg.payload,
    }
}

/// Whether `msg` is JetStream's acknowledgement of a request it stored rather than a
/// worker's frame: when some workers run admission, the `INFERA_REQUESTS` work queue
/// covers every request subject, and a plain request published with a reply inbox is
/// acknowledged there too. Worker frames always carry `rs-type`; an acknowledgement
/// has no headers and is `{"stream": ..., "seq": ...}`.
fn is_stream_ack(msg: &Message) -> bool {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct PubAck {
        stream: String,
        seq: u64,
    }
    msg.headers
        .as_ref()
        .is_none_or(|h| h.get(HEADER_TYPE).is_none())
        && msg.payload.starts_with(b"{\"stream\"")
        && serde_json::from_slice::<PubAck>(&msg.payload).is_ok()
}

/// Why no next frame.
enum Next {
    /// A timeout (`true`: the total one).
    Timeout(String, bool),
    NoResponder,
    Gone(String),
}

impl From<Next> for PlaneError {
    fn from(next: Next) -> Self {
        match next {
            Next::Timeout(m, _) => Self::Timeout(m),
            Next::NoResponder => Self::NoResponder,
            Next::Gone(m) => Self::Failed(m),
        }
    }
}

/// Publishes the inbox to the worker's cancel subject when dropped armed.
struct CancelOnDrop {
    client: Client,
    subject: String,
    inbox: String,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, subject) = (self.client.clone(), self.subject.clone());
        let inbox = Bytes::from(std::mem::take(&mut self.inbox));
        runtime.spawn(async move {
            for i in 0..CANCEL_RESENDS {
                if let Err(e) = client.publish(subject.clone(), inbox.clone()).await {
                    tracing::debug!("cannot send a cancel to {subject}: {e}");
                }
                if i + 1 < CANCEL_RESENDS {
                    tokio::time::sleep(Duration::from_secs_f64(CANCEL_RESEND_GAP_S)).await;
                }
            }
        });
    }
}

/// The reply side of one request.
struct Reply {
    sub: async_nats::Subscriber,
    cancel: CancelOnDrop,
    settings: PlaneSettings,
    started: Instant,
    worker: String,
}

impl Reply {
    /// The next frame, within the idle and total timeouts, while the worker lives.
    async fn next_frame(&mut self) -> Result<Incoming, Next> {
        let waited = Instant::now();
        let idle_end = self.settings.idle_timeout.map(|t| waited + t);
        let total_end = self.settings.max_duration.map(|t| self.started + t);
        let deadline = match (idle_end, total_end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let expired = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        let client = self.cancel.client.clone();
        let probe_subject = self.cancel.subject.clone();
        let frame = async {
            loop {
                match self.sub.next().await {
                    Some(m) if m.status == Some(NatsStatus::NO_RESPONDERS) => {
                        return Err(Next::NoResponder);
                    }
                    Some(m) if is_stream_ack(&m) => continue,
                    Some(m) => return Ok(incoming(m)),
                    None => return Err(Next::Gone("the reply subscription closed".into())),
                }
            }
        };
        tokio::select! {
            frame = frame => frame,
            () = expired => Err(match (total_end, self.settings) {
                (Some(end), PlaneSettings { max_duration: Some(t), .. }) if Instant::now() >= end => {
                    Next::Timeout(
                        format!("nats request exceeded total timeout {:.0}s", t.as_secs_f64()),
                        true,
                    )
                }
                (_, s) => Next::Timeout(
                    format!(
                        "nats request stalled: no reply within {:.0}s (idle timeout)",
                        s.idle_timeout.unwrap_or_default().as_secs_f64()
                    ),
                    false,
                ),
            }),
            () = worker_gone(client, probe_subject) => Err(Next::Gone(format!(
                "worker {} left: its NATS subscription is gone", self.worker
            ))),
        }
    }

    /// Reads data frames to the `done` frame: a whole answer with its status.
    async fn read_whole(mut self, first: Bytes) -> Result<WorkerResponse, PlaneError> {
        let mut body = bytes::BytesMut::from(&first[..]);
        loop {
            let frame = self.next_frame().await?;
            match frame.kind {
                FrameType::Data => body.extend_from_slice(&frame.payload),
                FrameType::Done => {
                    self.cancel.armed = false;
                    return Ok(whole(frame.status, body.freeze()));
                }
                FrameType::Error => {
                    self.cancel.armed = false;
                    return Err(if is_draining_notice(&frame.payload) {
                        PlaneError::Draining
                    } else {
                        PlaneError::Failed(String::from_utf8_lossy(&frame.payload).into_owned())
                    });
                }
            }
        }
    }

    /// The rest of a streamed answer as a body: data frames until `done`; an `error`
    /// frame, a timeout or a vanished worker ends it with a [`StreamEnded`].
    fn into_body(self) -> BodyStream {
        Box::pin(futures::stream::unfold(Some(self), |reply| async move {
            let mut reply = reply?;
            let ended = |how, message: String| std::io::Error::other(StreamEnded { how, message });
            match reply.next_frame().await {
                Ok(f) if f.kind == FrameType::Data => Some((Ok(f.payload), Some(reply))),
                Ok(f) if f.kind == FrameType::Done => {
                    reply.cancel.armed = false;
                    None
                }
                Ok(f) => {
                    reply.cancel.armed = false;
                    let how = if is_draining_notice(&f.payload) {
                        Ending::HandedBack
                    } else if f.payload.starts_with(OVER_TIME_TEXT) {
                        Ending::OverTime
                    } else {
                        Ending::Broken
                    };
                    let text = String::from_utf8_lossy(&f.payload).into_owned();
                    Some((Err(ended(how, text)), None))
                }
                Err(Next::Timeout(m, true)) => Some((Err(ended(Ending::OverTime, m)), None)),
                Err(Next::Timeout(m, false) | Next::Gone(m)) => {
                    Some((Err(ended(Ending::Broken, m)), None))
                }
                Err(Next::NoResponder) => {
                    Some((Err(ended(Ending::Broken, "no responders".into())), None))
                }
            }
        }))
    }
}

/// Resolves once the worker behind `cancel_subject` has no subscription left: probed
/// after [`PROBE_AFTER`] of silence, then every [`PROBE_AFTER`].
async fn worker_gone(client: Client, cancel_subject: String) {
    loop {
        tokio::time::sleep(PROBE_AFTER).await;
        let probe = async_nats::Request::new()
            .payload(Bytes::from_static(PROBE_PAYLOAD))
            .timeout(Some(PROBE_AFTER));
        match client.send_request(cancel_subject.clone(), probe).await {
            Err(e) if e.kind() == RequestErrorKind::NoResponders => return,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infera_proto::request_plane::Envelope;

    #[test]
    fn the_envelope_carries_the_body_as_it_is() {
        let headers = [("x-data-parallel-rank", "1".to_owned())];
        let out = Outgoing {
            path: "/v1/completions",
            stream: true,
            headers: &headers,
            body: br#"{"model":"m","prompt":"hi"}"#,
            migratable: true,
        };
        let bytes = encode_envelope(&out);
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"path":"/v1/completions","stream":true,"headers":{"x-data-parallel-rank":"1"},"body":{"model":"m","prompt":"hi"},"migratable":true}"#
        );
        let back: Envelope = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back.path, "/v1/completions");
        assert!(back.stream && back.migratable);
        assert_eq!(back.body["prompt"], "hi");
    }

    #[test]
    fn only_timeouts_stop_the_failover() {
        assert!(PlaneError::NoResponder.retryable());
        assert!(PlaneError::Busy(4).retryable());
        assert!(PlaneError::Draining.retryable());
        assert!(!PlaneError::Timeout("t".into()).retryable());
        assert_eq!(PlaneError::Busy(4).to_api_error("w").class.status(), 429);
    }
}
