//! Relaying the engine's KV events to NATS JetStream (`--kv-event-transport nats`): one
//! ZMQ SUB per data-parallel rank (rank r publishes on the base port + r), each batch
//! published verbatim to `infera.kv.events.<tok>.<rank>` in the stream
//! `INFERA_KV_EVENTS`, which is created with the contract's limits if absent.

use async_nats::jetstream::{self, stream};
use infera_proto::kv_stream::{
    NATS_STREAM, NATS_STREAM_MAX_BYTES, NATS_STREAM_MAX_MESSAGES, NATS_SUBJECT_ALL,
    build_kv_event_subject, parse_zmq_frames,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use zeromq::{Socket, SocketRecv, SubSocket};

/// Batches relayed so far.
#[derive(Debug, Default)]
pub struct RelayCounters {
    /// Published to JetStream.
    pub relayed: AtomicU64,
    /// Failed to publish.
    pub failed: AtomicU64,
}

/// Creates the stream if it is absent; returns a JetStream context.
pub async fn connect_jetstream(url: &str) -> Result<jetstream::Context, String> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| format!("connecting to NATS at {url}: {e}"))?;
    let js = jetstream::new(client);
    js.get_or_create_stream(stream::Config {
        name: NATS_STREAM.to_owned(),
        subjects: vec![NATS_SUBJECT_ALL.to_owned()],
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        max_bytes: NATS_STREAM_MAX_BYTES,
        max_messages: NATS_STREAM_MAX_MESSAGES,
        discard: stream::DiscardPolicy::Old,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("creating JetStream stream {NATS_STREAM}: {e}"))?;
    Ok(js)
}

/// Relays rank `rank`'s batches from `endpoint` until `stop`.
pub async fn relay_rank(
    endpoint: String,
    worker_id: String,
    rank: u32,
    js: jetstream::Context,
    counters: Arc<RelayCounters>,
    mut stop: watch::Receiver<bool>,
) {
    let subject = build_kv_event_subject(&worker_id, rank);
    loop {
        let mut sub = SubSocket::new();
        let connected = tokio::time::timeout(Duration::from_secs(5), sub.connect(&endpoint)).await;
        if !matches!(connected, Ok(Ok(()))) || sub.subscribe("").await.is_err() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                _ = stop.wait_for(|s| *s) => return,
            }
        }
        tracing::info!("relaying KV events from {endpoint} to {subject}");
        loop {
            let msg = tokio::select! {
                m = sub.recv() => m,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Ok(msg) = msg else { break };
            let frames = msg.into_vec();
            let parts: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
            let Ok(parsed) = parse_zmq_frames(&parts) else {
                continue;
            };
            let payload = bytes::Bytes::copy_from_slice(parsed.payload);
            let published = match js.publish(subject.clone(), payload).await {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            };
            let counter = if published {
                &counters.relayed
            } else {
                &counters.failed
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}
