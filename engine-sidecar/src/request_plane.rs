//! The NATS request plane, worker side: serves this worker's subject
//! (`infera.req.<tok>`), proxies each request to the local engine over HTTP and sends
//! the answer back to the request's inbox as `data` frames (each chunk as the engine
//! wrote it, or the whole JSON body) and a `done` frame with the engine's status; a
//! failure is an `error` frame with its text. Wire-compatible with the earlier worker
//! (`nats_request.py`).
//!
//! - **Cancel**: an inbox published to `infera.cancel.<tok>` ends that request (the
//!   engine connection closes, so the engine stops generating) with the error frame
//!   `request cancelled`. A message there that carries a reply subject is a gateway's
//!   presence probe and is answered.
//! - **Max duration** (worker-side backstop): a request running longer ends with
//!   `request exceeded max duration`.
//! - **Admission** (`max_pending` > 0): requests arrive through a durable consumer of
//!   the `INFERA_REQUESTS` work queue (explicit ack when answered, delivered once), so
//!   a gateway can read this worker's backlog.
//! - **Drain**: queued requests are taken in, intake stops, the requests the gateway
//!   marked `migratable` are handed back at once (error frame `infera: worker
//!   draining`, which the gateway continues elsewhere), the rest get the drain window,
//!   what remains is cancelled, and the durable consumer is deleted.

use async_nats::jetstream::{self, consumer, stream};
use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;
use futures::StreamExt;
use infera_proto::request_plane::{
    DRAINING_NOTICE, Envelope, Frame, HEADER_INBOX, REQUEST_ACK_WAIT_S, REQUEST_STREAM,
    REQUEST_STREAM_MAX_MESSAGES, REQUEST_STREAM_SUBJECTS, build_cancel_subject,
    build_request_durable, build_request_subject,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// How the worker serves its subject.
#[derive(Debug, Clone, PartialEq)]
pub struct PlaneSettings {
    /// NATS server.
    pub url: String,
    /// Longest request (`None`: no cap).
    pub max_duration: Option<Duration>,
    /// Admission backlog limit (0: plain NATS subscription).
    pub max_pending: u64,
}

/// Why a request ends before its answer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The gateway cancelled it, or the worker stops.
    Cancelled,
    /// The worker drains and the gateway can continue it elsewhere.
    HandBack,
}

struct Inflight {
    stop: oneshot::Sender<Stop>,
    migratable: bool,
}

type InflightMap = Arc<Mutex<HashMap<String, Inflight>>>;

/// A running request server.
pub struct RequestServer {
    client: Client,
    worker_id: String,
    js: Option<jetstream::Context>,
    inflight: InflightMap,
    intake: JoinSet<()>,
    cancel: JoinSet<()>,
}

impl std::fmt::Debug for RequestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestServer")
            .field("worker_id", &self.worker_id)
            .field("admission", &self.js.is_some())
            .finish_non_exhaustive()
    }
}

/// The work queue's stream (memory-backed: a request lost with the server is retried by
/// its client).
fn request_stream_config() -> stream::Config {
    stream::Config {
        name: REQUEST_STREAM.into(),
        subjects: vec![REQUEST_STREAM_SUBJECTS.into()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::Memory,
        discard: stream::DiscardPolicy::Old,
        max_messages: REQUEST_STREAM_MAX_MESSAGES,
        ..Default::default()
    }
}

/// What a proxied request needs.
#[derive(Clone)]
struct Proxy {
    client: Client,
    http: reqwest::Client,
    engine: String,
    max_duration: Option<Duration>,
    inflight: InflightMap,
}

/// Returns once the server has read every subscription `client` sent before (a flush
/// only writes them to the socket): a request on a fresh inbox nobody listens to comes
/// back "no responders" after the server processed what came ahead of it, so a gateway
/// that sees this worker's record finds its subject served.
async fn server_holds_subscriptions(
    client: &async_nats::Client,
) -> Result<(), async_nats::RequestError> {
    match client
        .request(client.new_inbox(), bytes::Bytes::new())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => Ok(()),
        Err(e) => Err(e),
    }
}

impl RequestServer {
    /// Serves `worker_id`'s subject for the engine at `engine` (`http://127.0.0.1:PORT`).
    pub async fn start(
        settings: &PlaneSettings,
        worker_id: &str,
        engine: &str,
    ) -> Result<Self, String> {
        let url = &settings.url;
        let client = async_nats::ConnectOptions::new()
            .name("infera-worker-req")
            .connect(url.as_str())
            .await
            .map_err(|e| format!("connecting to NATS at {url}: {e}"))?;
        let inflight: InflightMap = Arc::default();
        let proxy = Proxy {
            client: client.clone(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(30))
                .build()
                .map_err(|e| e.to_string())?,
            engine: engine.trim_end_matches('/').to_owned(),
            max_duration: settings.max_duration,
            inflight: inflight.clone(),
        };
        let mut cancel = JoinSet::new();
        let cancels = client
            .subscribe(build_cancel_subject(worker_id))
            .await
            .map_err(|e| format!("subscribing to the cancel subject: {e}"))?;
        cancel.spawn(serve_cancels(client.clone(), cancels, inflight.clone()));
        let subject = build_request_subject(worker_id);
        let mut intake = JoinSet::new();
        let js = if settings.max_pending > 0 {
            let js = jetstream::new(client.clone());
            let stream = js
                .get_or_create_stream(request_stream_config())
                .await
                .map_err(|e| format!("creating the {REQUEST_STREAM} stream: {e}"))?;
            let durable = build_request_durable(worker_id);
            let consumer: consumer::PullConsumer = stream
                .get_or_create_consumer(
                    &durable,
                    consumer::pull::Config {
                        durable_name: Some(durable.clone()),
                        filter_subject: subject.clone(),
                        ack_policy: consumer::AckPolicy::Explicit,
                        ack_wait: Duration::from_secs(REQUEST_ACK_WAIT_S),
                        max_deliver: 1,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| format!("creating the request consumer {durable}: {e}"))?;
            let messages = consumer
                .messages()
                .await
                .map_err(|e| format!("reading the request consumer {durable}: {e}"))?;
            intake.spawn(take_queued(messages, proxy));
            tracing::info!(
                subject,
                max_pending = settings.max_pending,
                "NATS request consumer up (JetStream)"
            );
            Some(js)
        } else {
            let requests = client
                .subscribe(subject.clone())
                .await
                .map_err(|e| format!("subscribing to {subject}: {e}"))?;
            intake.spawn(take_direct(requests, proxy));
            tracing::info!(subject, "NATS request consumer up");
            None
        };
        server_holds_subscriptions(&client)
            .await
            .map_err(|e| format!("confirming the subscriptions with the server: {e}"))?;
        Ok(Self {
            client,
            worker_id: worker_id.to_owned(),
            js,
            inflight,
            intake,
            cancel,
        })
    }

    /// Requests being served.
    pub fn inflight(&self) -> usize {
        self.inflight.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Stops serving. With a `window`: queued requests are taken in first, migratable
    /// ones handed back at once, the others given until the window ends.
    pub async fn stop(mut self, window: Option<Duration>) {
        let deadline = window.map(|w| Instant::now() + w);
        if let (Some(deadline), Some(js)) = (deadline, &self.js) {
            self.await_queued(js, deadline).await;
        }
        self.intake.abort_all();
        while self.intake.join_next().await.is_some() {}
        if let Some(deadline) = deadline {
            let handed = self.signal(|i| i.migratable, Stop::HandBack);
            if handed > 0 {
                tracing::info!("drain: handed {handed} request(s) back to the gateway");
            }
            while self.inflight() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let left = self.signal(|_| true, Stop::Cancelled);
        if left > 0 {
            tracing::warn!("cancelled {left} NATS request(s) still running");
        }
        // The cancelled requests send their error frames.
        let settle = Instant::now() + Duration::from_secs(2);
        while self.inflight() > 0 && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(js) = &self.js {
            let durable = build_request_durable(&self.worker_id);
            if let Err(e) = js
                .delete_consumer_from_stream(&durable, REQUEST_STREAM)
                .await
            {
                tracing::debug!("cannot delete the request consumer {durable}: {e}");
            }
        }
        self.cancel.abort_all();
        if let Err(e) = self.client.flush().await {
            tracing::debug!("flushing NATS on stop: {e}");
        }
    }

    /// Sends `stop` to the requests `which` selects; how many.
    fn signal(&self, which: impl Fn(&Inflight) -> bool, stop: Stop) -> usize {
        let Ok(mut map) = self.inflight.lock() else {
            return 0;
        };
        let chosen: Vec<String> = map
            .iter()
            .filter(|(_, i)| which(i))
            .map(|(k, _)| k.clone())
            .collect();
        for inbox in &chosen {
            if let Some(i) = map.remove(inbox) {
                let _ = i.stop.send(stop);
            }
        }
        chosen.len()
    }

    /// Waits (until `deadline`) for the work queue to hand over what it holds for
    /// this worker.
    async fn await_queued(&self, js: &jetstream::Context, deadline: Instant) {
        let durable = build_request_durable(&self.worker_id);
        while Instant::now() < deadline {
            let queued = async {
                let stream = js.get_stream(REQUEST_STREAM).await.ok()?;
                stream
                    .consumer_info(&durable)
                    .await
                    .ok()
                    .map(|i| i.num_pending)
            };
            match queued.await {
                Some(n) if n > 0 => {
                    tracing::info!("drain: waiting for {n} queued request(s)");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                _ => return,
            }
        }
        tracing::warn!("drain window over with requests still queued in {REQUEST_STREAM}");
    }
}

/// Plain NATS intake: every message on the subject is a request, answered to its
/// `rs-inbox` header (as the earlier worker read it first), else its reply subject.
async fn take_direct(mut requests: async_nats::Subscriber, proxy: Proxy) {
    while let Some(msg) = requests.next().await {
        let inbox = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER_INBOX))
            .map(|v| Subject::from(v.as_str()))
            .or_else(|| msg.reply.clone());
        spawn_request(&proxy, inbox, msg.payload, None);
    }
}

/// Work-queue intake: the inbox is a header (the message's reply subject acks it).
async fn take_queued(mut messages: consumer::pull::Stream, proxy: Proxy) {
    while let Some(next) = messages.next().await {
        let msg = match next {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("reading queued requests: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let inbox = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER_INBOX))
            .map(|v| Subject::from(v.as_str()));
        let payload = msg.payload.clone();
        spawn_request(&proxy, inbox, payload, Some(msg));
    }
}

/// Cancels (payload: a request's inbox) and presence probes (a reply subject).
async fn serve_cancels(client: Client, mut cancels: async_nats::Subscriber, inflight: InflightMap) {
    while let Some(msg) = cancels.next().await {
        if let Some(reply) = msg.reply
            && let Err(e) = client.publish(reply, Bytes::new()).await
        {
            tracing::debug!("answering a presence probe: {e}");
        }
        let inbox = String::from_utf8_lossy(&msg.payload).into_owned();
        let found = inflight.lock().ok().and_then(|mut m| m.remove(&inbox));
        if let Some(i) = found {
            tracing::info!("NATS request cancelled by the gateway");
            let _ = i.stop.send(Stop::Cancelled);
        }
    }
}

/// Starts serving one request. It is in the in-flight map before this returns, so a
/// cancel or a drain that follows finds it.
fn spawn_request(
    proxy: &Proxy,
    inbox: Option<Subject>,
    payload: Bytes,
    queued: Option<jetstream::Message>,
) {
    let proxy = proxy.clone();
    let Some(inbox) = inbox else {
        tracing::warn!("a NATS request without a reply inbox; dropped");
        tokio::spawn(ack(queued));
        return;
    };
    let envelope = match serde_json::from_slice::<Envelope>(&payload) {
        Ok(envelope) => envelope,
        Err(e) => {
            tokio::spawn(async move {
                let text = format!("the request is not a request envelope: {e}");
                if let Err(e) = reply(&proxy.client, &inbox, &Frame::error(text)).await {
                    tracing::debug!("{e}");
                }
                ack(queued).await;
            });
            return;
        }
    };
    let (tx, stop) = oneshot::channel();
    if let Ok(mut map) = proxy.inflight.lock() {
        let entry = Inflight {
            stop: tx,
            migratable: envelope.migratable,
        };
        map.insert(inbox.to_string(), entry);
    }
    tokio::spawn(async move {
        serve_request(&proxy, &inbox, &envelope, stop).await;
        ack(queued).await;
    });
}

/// Acknowledges a request taken from the work queue, once answered.
async fn ack(queued: Option<jetstream::Message>) {
    if let Some(msg) = queued
        && let Err(e) = msg.ack().await
    {
        tracing::debug!("acking a queued request: {e}");
    }
}

async fn serve_request(
    proxy: &Proxy,
    inbox: &Subject,
    envelope: &Envelope,
    stop: oneshot::Receiver<Stop>,
) {
    let answered = async {
        match proxy.max_duration {
            Some(cap) => tokio::time::timeout(cap, forward(proxy, inbox, envelope))
                .await
                .unwrap_or_else(|_| Err("request exceeded max duration".into())),
            None => forward(proxy, inbox, envelope).await,
        }
    };
    let failure = tokio::select! {
        result = answered => result.err(),
        stop = stop => match stop {
            Ok(Stop::HandBack) => Some(String::from_utf8_lossy(DRAINING_NOTICE).into_owned()),
            Ok(Stop::Cancelled) | Err(_) => Some("request cancelled".into()),
        },
    };
    if let Ok(mut map) = proxy.inflight.lock() {
        map.remove(inbox.as_str());
    }
    if let Some(text) = failure
        && let Err(e) = reply(&proxy.client, inbox, &Frame::error(text)).await
    {
        tracing::debug!("{e}");
    }
}

/// Proxies the request to the engine, sending the answer as it comes.
async fn forward(proxy: &Proxy, inbox: &Subject, envelope: &Envelope) -> Result<(), String> {
    let mut post = proxy
        .http
        .post(format!("{}{}", proxy.engine, envelope.path))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&envelope.body).unwrap_or_default());
    for (name, value) in envelope.headers.iter().flatten() {
        post = post.header(name.as_str(), value.as_str());
    }
    let response = post
        .send()
        .await
        .map_err(|e| format!("engine request failed: {}", root_cause(&e)))?;
    let status = response.status().as_u16();
    if envelope.stream {
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| format!("engine stream broke: {}", root_cause(&e)))?;
            if !chunk.is_empty() {
                reply(&proxy.client, inbox, &Frame::data(chunk.to_vec())).await?;
            }
        }
    } else {
        let body = response
            .bytes()
            .await
            .map_err(|e| format!("engine answer broke: {}", root_cause(&e)))?;
        reply(&proxy.client, inbox, &Frame::data(body.to_vec())).await?;
    }
    reply(&proxy.client, inbox, &Frame::done(status)).await?;
    Ok(())
}

fn root_cause(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(next) = source.source() {
        source = next;
    }
    source.to_string()
}

/// Sends one frame; an error names why (a payload over the server's `max_payload`).
async fn reply(client: &Client, inbox: &Subject, frame: &Frame) -> Result<(), String> {
    let mut headers = HeaderMap::new();
    for (name, value) in frame.headers() {
        headers.insert(name, value.as_str());
    }
    let payload = Bytes::from(frame.payload.clone());
    client
        .publish_with_headers(inbox.clone(), headers, payload)
        .await
        .map_err(|e| {
            format!(
                "cannot send the answer's {} frame: {e}",
                frame.kind.as_str()
            )
        })
}
