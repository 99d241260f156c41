//! Feeding the prefix index from the engines' KV events: one ZMQ SUB per worker and
//! data-parallel rank (rank r publishes on the endpoint's port + r), or one JetStream
//! consumer replaying `infera.kv.events.>` from the start. Subscriptions follow the
//! registry: a worker that leaves is unsubscribed; one that arrives is subscribed.
//!
//! Every batch that cannot be used is counted (`infera_gateway_kv_events_total`) and
//! logged once per worker and reason, never silently dropped: a wrong decoder or block
//! size would otherwise show up only as a 0% hit rate.

use crate::metrics::Metrics;
use crate::route::kv_state::{IngestCounters, KvRouter, block_size_of, is_approximate};
use crate::workers::registry::Registry;
use bytes::Bytes;
use futures::StreamExt;
use infera_proto::discovery::{WATCH_BACKOFF_MAX, WATCH_BACKOFF_MIN};
use infera_proto::kv_events::decode_kv_event_batch;
use infera_proto::kv_stream::{
    NATS_STREAM, NATS_STREAM_MAX_BYTES, NATS_STREAM_MAX_MESSAGES, NATS_SUBJECT_ALL,
    REPLAY_END_SEQUENCE, build_rank_endpoint, encode_sequence, parse_kv_event_subject,
    parse_zmq_frames,
};
use infera_proto::worker::WorkerRecord;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// Record field (an Infera extension, preserved by the earlier system as an unknown
/// field) naming the engine's KV-event replay endpoint.
pub(crate) const REPLAY_ENDPOINT_FIELD: &str = "kv_events_replay_endpoint";

/// One subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubSpec {
    /// Route key of the target the events feed.
    pub(crate) target: String,
    /// The rank's PUB endpoint.
    pub(crate) endpoint: String,
    /// The rank's replay endpoint, if the worker has one.
    pub(crate) replay: Option<String>,
    /// The worker's block size.
    pub(crate) block_size: u32,
    /// The worker's model (its shared tier's blocks are the model's).
    pub(crate) model: String,
}

/// Logs each (target, reason) once.
#[derive(Debug, Default)]
struct LogOnce(Mutex<HashSet<(String, &'static str)>>);

impl LogOnce {
    fn first(&self, target: &str, reason: &'static str) -> bool {
        self.0
            .lock()
            .map(|mut s| s.insert((target.to_owned(), reason)))
            .unwrap_or(false)
    }
}

/// `tcp://*:P` and `tcp://0.0.0.0:P` name the worker's own host.
fn resolve_endpoint(endpoint: &str, record: &WorkerRecord) -> String {
    let host = record
        .url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.rsplit_once(':'))
        .map_or("127.0.0.1", |(h, _)| h);
    endpoint
        .replace("://*:", &format!("://{host}:"))
        .replace("://0.0.0.0:", &format!("://{host}:"))
}

/// The subscriptions a worker needs.
pub(crate) fn specs_for(record: &WorkerRecord) -> Vec<SubSpec> {
    let (Some(endpoint), Some(block_size)) = (record.events_endpoint(), block_size_of(record))
    else {
        return Vec::new();
    };
    let endpoint = resolve_endpoint(endpoint, record);
    let replay = record
        .extra
        .get(REPLAY_ENDPOINT_FIELD)
        .and_then(Value::as_str)
        .map(|e| resolve_endpoint(e, record));
    record
        .route_targets()
        .into_iter()
        .filter_map(|t| {
            let offset = t.dp_rank.unwrap_or(0);
            Some(SubSpec {
                target: t.key,
                endpoint: build_rank_endpoint(&endpoint, offset)?,
                replay: match &replay {
                    Some(r) => Some(build_rank_endpoint(r, offset)?),
                    None => None,
                },
                block_size,
                model: record.model_name.clone(),
            })
        })
        .collect()
}

/// Keeps one ZMQ subscription per target with events until `stop`.
pub(crate) async fn run_zmq_ingest(
    registry: Arc<Registry>,
    kv: Arc<KvRouter>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut changes = registry.subscribe_changes();
    let mut running: HashMap<String, (SubSpec, AbortHandle)> = HashMap::new();
    let mut tasks = JoinSet::new();
    let log = Arc::new(LogOnce::default());
    loop {
        let snapshot = registry.snapshot();
        let desired: HashMap<String, SubSpec> = snapshot
            .workers
            .values()
            .filter(|r| !is_approximate(r, kv.approximate_all))
            .flat_map(|r| specs_for(r))
            .map(|s| (s.target.clone(), s))
            .collect();
        running.retain(|target, (spec, handle)| {
            let keep = desired.get(target) == Some(spec);
            if !keep {
                handle.abort();
            }
            keep
        });
        if let Ok(mut endpoints) = kv.ingest.endpoints.lock() {
            let mut now: Vec<String> = desired.values().map(|s| s.endpoint.clone()).collect();
            now.sort();
            *endpoints = now;
        }
        for (target, spec) in desired {
            if let std::collections::hash_map::Entry::Vacant(slot) = running.entry(target) {
                let handle = tasks.spawn(subscribe(
                    spec.clone(),
                    kv.clone(),
                    metrics.clone(),
                    log.clone(),
                ));
                slot.insert((spec, handle));
            }
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|s| *s) => { tasks.abort_all(); return }
            Some(_) = tasks.join_next() => {}
        }
    }
}

/// Applies one payload, counting and logging (once) what could not be used.
fn ingest(
    kv: &KvRouter,
    metrics: &Metrics,
    log: &LogOnce,
    target: &str,
    block_size: u32,
    model: &str,
    payload: &[u8],
) {
    let counters = &kv.ingest;
    IngestCounters::add(&counters.batches_received, 1);
    match decode_kv_event_batch(payload) {
        Ok(batch) => {
            IngestCounters::add(&counters.batches_decoded, 1);
            IngestCounters::add(&counters.events_received, batch.events.len() as u64);
            metrics.record_kv_event("applied");
            for skip in kv.apply_batch(target, block_size, model, &batch) {
                metrics.record_kv_event(skip.label());
                if log.first(target, skip.label()) {
                    tracing::warn!(
                        target_key = target,
                        "KV event skipped: {} (logged once per worker and reason)",
                        skip.label()
                    );
                }
            }
        }
        Err(e) => {
            IngestCounters::add(&counters.batches_undecodable, 1);
            metrics.record_kv_event("undecodable");
            if log.first(target, "undecodable") {
                tracing::error!(
                    target_key = target,
                    "undecodable KV event batch: {e} (logged once per worker)"
                );
            }
        }
    }
}

async fn subscribe(spec: SubSpec, kv: Arc<KvRouter>, metrics: Arc<Metrics>, log: Arc<LogOnce>) {
    let mut backoff = WATCH_BACKOFF_MIN;
    let mut last_seq: Option<i64> = None;
    loop {
        let mut sub = SubSocket::new();
        let connected =
            tokio::time::timeout(Duration::from_secs(5), sub.connect(&spec.endpoint)).await;
        if !matches!(connected, Ok(Ok(()))) || sub.subscribe("").await.is_err() {
            if log.first(&spec.target, "connect") {
                tracing::warn!(target_key = %spec.target, "cannot subscribe to KV events at {}; retrying with backoff", spec.endpoint);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(WATCH_BACKOFF_MAX);
            continue;
        }
        backoff = WATCH_BACKOFF_MIN;
        tracing::info!(target_key = %spec.target, "subscribed to KV events at {}", spec.endpoint);
        // Batches published before the subscription took effect (a late join, an engine
        // that started first, a reconnect) come from the replay socket where offered.
        if let Some(replay) = &spec.replay
            && let Some(last) = fill_gap(
                replay,
                last_seq.map_or(0, |l| l + 1),
                i64::MAX,
                &spec,
                &kv,
                &metrics,
                &log,
            )
            .await
        {
            last_seq = Some(last);
        }
        while let Ok(msg) = sub.recv().await {
            let frames = msg.into_vec();
            let parts: Vec<&[u8]> = frames.iter().map(|b| b.as_ref()).collect();
            let Ok(parsed) = parse_zmq_frames(&parts) else {
                metrics.record_kv_event("bad_frames");
                continue;
            };
            if last_seq.is_some_and(|last| parsed.sequence <= last && parsed.sequence > 0) {
                // Already applied from the replay that followed the (re)connect.
                continue;
            }
            if let Some(last) = last_seq
                && parsed.sequence > last + 1
            {
                metrics.record_kv_event("gap");
                if let Some(replay) = &spec.replay {
                    fill_gap(
                        replay,
                        last + 1,
                        parsed.sequence,
                        &spec,
                        &kv,
                        &metrics,
                        &log,
                    )
                    .await;
                } else if log.first(&spec.target, "gap") {
                    tracing::warn!(target_key = %spec.target, "missed KV events {}..{} and the worker offers no replay endpoint", last + 1, parsed.sequence - 1);
                }
            }
            last_seq = Some(parsed.sequence);
            ingest(
                &kv,
                &metrics,
                &log,
                &spec.target,
                spec.block_size,
                &spec.model,
                parsed.payload,
            );
        }
        metrics.record_kv_event("disconnected");
    }
}

/// Replays `[from, until)` from the worker's replay socket; returns the last sequence
/// applied.
async fn fill_gap(
    replay: &str,
    from: i64,
    until: i64,
    spec: &SubSpec,
    kv: &KvRouter,
    metrics: &Metrics,
    log: &LogOnce,
) -> Option<i64> {
    let counters = &kv.ingest;
    IngestCounters::add(&counters.replays_pulled, 1);
    let replayed = replay_round(replay, from, until, spec, kv, metrics, log).await;
    let counter = match replayed {
        Err(()) => &counters.replays_failed,
        Ok(None) => &counters.replays_stale,
        Ok(Some(_)) => &counters.replays_applied,
    };
    IngestCounters::add(counter, 1);
    replayed.ok().flatten()
}

/// One replay round; `Err` when the socket failed before answering in full.
async fn replay_round(
    replay: &str,
    from: i64,
    until: i64,
    spec: &SubSpec,
    kv: &KvRouter,
    metrics: &Metrics,
    log: &LogOnce,
) -> Result<Option<i64>, ()> {
    let mut dealer = DealerSocket::new();
    if !matches!(
        tokio::time::timeout(Duration::from_secs(2), dealer.connect(replay)).await,
        Ok(Ok(()))
    ) {
        return Err(());
    }
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&encode_sequence(from)),
    ])
    .map_err(|_| ())?;
    dealer.send(request).await.map_err(|_| ())?;
    let mut last = None;
    while let Ok(Ok(msg)) = tokio::time::timeout(Duration::from_secs(2), dealer.recv()).await {
        let frames = msg.into_vec();
        let parts: Vec<&[u8]> = frames.iter().map(|b| b.as_ref()).collect();
        let parsed = parse_zmq_frames(&parts).map_err(|_| ())?;
        if parsed.sequence == REPLAY_END_SEQUENCE {
            break;
        }
        if parsed.sequence < until {
            metrics.record_kv_event("replayed");
            ingest(
                kv,
                metrics,
                log,
                &spec.target,
                spec.block_size,
                &spec.model,
                parsed.payload,
            );
            last = Some(parsed.sequence);
        }
    }
    Ok(last)
}

/// Consumes relayed batches from JetStream, replaying the stream from its start.
pub(crate) async fn run_nats_ingest(
    url: String,
    registry: Arc<Registry>,
    kv: Arc<KvRouter>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    registry.wait_synced().await;
    let log = Arc::new(LogOnce::default());
    let mut backoff = WATCH_BACKOFF_MIN;
    loop {
        let round = consume_nats(&url, &registry, &kv, &metrics, &log);
        tokio::select! {
            result = round => {
                if let Err(e) = result {
                    metrics.record_kv_event("nats_error");
                    tracing::warn!("KV events from NATS at {url}: {e}; retrying in {backoff:?}");
                }
            }
            _ = stop.wait_for(|s| *s) => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(WATCH_BACKOFF_MAX);
    }
}

async fn consume_nats(
    url: &str,
    registry: &Registry,
    kv: &KvRouter,
    metrics: &Metrics,
    log: &LogOnce,
) -> Result<(), String> {
    use async_nats::jetstream::{self, consumer, stream};
    let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
    let js = jetstream::new(client);
    let stream = js
        .get_or_create_stream(stream::Config {
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
        .map_err(|e| e.to_string())?;
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: NATS_SUBJECT_ALL.to_owned(),
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    tracing::info!("consuming KV events from JetStream stream {NATS_STREAM} at {url}");
    while let Some(msg) = messages.next().await {
        let msg = msg.map_err(|e| e.to_string())?;
        let Some((worker_id, rank)) = parse_kv_event_subject(&msg.subject) else {
            metrics.record_kv_event("bad_subject");
            continue;
        };
        let snapshot = registry.snapshot();
        let Some(record) = snapshot.workers.get(&worker_id) else {
            metrics.record_kv_event("unknown_worker");
            continue;
        };
        let Some(block_size) = block_size_of(record) else {
            continue;
        };
        let target = if record.is_rank_multiplexed() {
            format!("{worker_id}#dp{rank}")
        } else {
            worker_id.clone()
        };
        ingest(
            kv,
            metrics,
            log,
            &target,
            block_size,
            &record.model_name,
            &msg.payload,
        );
    }
    Err("the JetStream consumer ended".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_record(json: &str) -> WorkerRecord {
        WorkerRecord::from_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn one_subscription_per_rank_on_offset_ports() {
        let r = mk_record(
            r#"{"worker_id":"10.0.0.1:30000","url":"http://10.0.0.1:30000","model_name":"m","engine":"sglang","kv_events_endpoint":"tcp://*:5557","kv_block_size":64,"dp_size":2,"kv_events_replay_endpoint":"tcp://*:5600"}"#,
        );
        let specs = specs_for(&r);
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[1].target, "10.0.0.1:30000#dp1");
        assert_eq!(specs[1].endpoint, "tcp://10.0.0.1:5558");
        assert_eq!(specs[1].replay.as_deref(), Some("tcp://10.0.0.1:5601"));
        let no_events = mk_record(
            r#"{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"vllm","kv_block_size":16}"#,
        );
        assert!(specs_for(&no_events).is_empty());
    }
}
