//! etcd discovery: range over the prefix, then watch from the next revision. PUT adds or
//! updates a worker, DELETE removes it (its lease expired or it deregistered). A broken
//! connection reconnects with backoff (1 s doubling to 30 s); a compacted watch
//! re-syncs at once from a fresh range, so no change is ever missed.
//!
//! An etcd that comes back without its data (a range that is empty, or at a revision
//! below one already seen) while workers were known is not taken at its word at once:
//! routing keeps the known workers missing from it for the grace period
//! (`--empty-resync-grace-s`); each one that registers again stays without a gap, those
//! that have not by its end leave.
//!
//! What a range or a watch event does to the registry is decided by
//! [`build_synced_records`] and [`apply_etcd_change`], which do no I/O (the corpus of the
//! earlier launchers' records is run through them in tests); the runner only talks to
//! etcd. Records are read by `infera_proto::worker::WorkerRecord::from_json`, the one
//! parse every reader shares.

use crate::metrics::Metrics;
use crate::workers::discovery::decode_record;
use crate::workers::registry::Registry;
use etcd_client::{Client, ConnectOptions, EventType, GetOptions, WatchOptions};
use infera_etcd_conn::{EtcdSecurity, EtcdSecurityError};
use infera_proto::discovery::{
    WATCH_BACKOFF_MAX, WATCH_BACKOFF_MIN, normalize_prefix, worker_id_from_key,
};
use infera_proto::worker::WorkerRecord;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Workers kept through an empty re-sync, until they register again or the grace ends.
#[derive(Debug)]
struct Retained {
    /// Ids not registered again yet.
    ids: BTreeSet<String>,
    /// When those still unconfirmed leave.
    until: Instant,
}

/// Why a sync-and-watch round ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EtcdDiscoveryError {
    /// An etcd call failed.
    #[error("etcd {action}: {source}")]
    Call {
        /// What was being done.
        action: &'static str,
        /// The client error.
        source: etcd_client::Error,
    },
    /// The watch's start revision was compacted away.
    #[error("watch compacted at revision {0}; re-syncing")]
    Compacted(i64),
    /// The server ended the watch.
    #[error("watch ended by the server")]
    WatchEnded,
    /// The TLS or auth files cannot be read.
    #[error("{0}")]
    Security(EtcdSecurityError),
}

/// Runs etcd discovery until `stop` turns true.
pub(crate) async fn run_etcd_discovery(
    endpoints: Vec<String>,
    security: EtcdSecurity,
    prefix: String,
    empty_resync_grace: Duration,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let prefix = normalize_prefix(&prefix);
    let mut backoff = WATCH_BACKOFF_MIN;
    let mut retained: Option<Retained> = None;
    let mut last_revision = 0;
    loop {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let round = async {
            let options = security
                .apply(options)
                .map_err(EtcdDiscoveryError::Security)?;
            let mut client =
                Client::connect(&endpoints, Some(options))
                    .await
                    .map_err(|source| EtcdDiscoveryError::Call {
                        action: "connect",
                        source,
                    })?;
            let round = Round {
                prefix: &prefix,
                registry: &registry,
                metrics: &metrics,
                empty_resync_grace,
            };
            round
                .sync_and_watch(&mut client, &mut backoff, &mut retained, &mut last_revision)
                .await
        };
        let result = tokio::select! {
            r = round => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match result {
            Err(EtcdDiscoveryError::Compacted(rev)) => {
                metrics.record_discovery("resync");
                tracing::info!(
                    "etcd watch compacted at revision {rev}; re-syncing from a fresh range"
                );
                continue;
            }
            Err(e) => {
                metrics.record_discovery("watch_error");
                tracing::warn!("etcd discovery at {endpoints:?}: {e}; retrying in {backoff:?}");
            }
            Ok(()) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(WATCH_BACKOFF_MAX);
    }
}

/// What one sync-and-watch round works with.
struct Round<'a> {
    prefix: &'a str,
    registry: &'a Registry,
    metrics: &'a Metrics,
    empty_resync_grace: Duration,
}

impl Round<'_> {
    async fn sync_and_watch(
        &self,
        client: &mut Client,
        backoff: &mut Duration,
        retained: &mut Option<Retained>,
        last_revision: &mut i64,
    ) -> Result<(), EtcdDiscoveryError> {
        let resp = client
            .get(self.prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|source| EtcdDiscoveryError::Call {
                action: "range",
                source,
            })?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let records = build_synced_records(
            self.prefix,
            resp.kvs()
                .iter()
                .filter_map(|kv| Some((kv.key_str().ok()?, kv.value()))),
            self.metrics,
        );
        tracing::info!(
            "etcd discovery synced {} workers at revision {revision}",
            records.len()
        );
        let lost_data = revision < *last_revision;
        *last_revision = revision;
        self.apply_sync(records, lost_data, retained);
        self.registry.mark_synced();
        self.metrics.record_discovery("sync");
        *backoff = WATCH_BACKOFF_MIN;
        let mut stream = client
            .watch(
                self.prefix,
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1),
                ),
            )
            .await
            .map_err(|source| EtcdDiscoveryError::Call {
                action: "watch",
                source,
            })?;
        loop {
            let deadline = retained.as_ref().map(|r| r.until);
            let msg = tokio::select! {
                msg = stream.message() => msg.map_err(|source| EtcdDiscoveryError::Call {
                    action: "watch",
                    source,
                })?,
                _ = sleep_until_some(deadline) => {
                    self.end_retention(retained);
                    continue;
                }
            };
            let Some(msg) = msg else {
                return Err(EtcdDiscoveryError::WatchEnded);
            };
            if msg.compact_revision() > 0 {
                return Err(EtcdDiscoveryError::Compacted(msg.compact_revision()));
            }
            if msg.canceled() {
                return Err(EtcdDiscoveryError::WatchEnded);
            }
            if let Some(h) = msg.header() {
                *last_revision = (*last_revision).max(h.revision());
            }
            for event in msg.events() {
                let Some(kv) = event.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                let change = match event.event_type() {
                    EventType::Put => EtcdChange::Put {
                        key,
                        value: kv.value(),
                    },
                    EventType::Delete => EtcdChange::Delete { key },
                };
                if let (Some(r), Some(id)) =
                    (retained.as_mut(), worker_id_from_key(self.prefix, key))
                {
                    r.ids.remove(id);
                }
                apply_etcd_change(change, self.prefix, self.registry, self.metrics);
            }
            if retained.as_ref().is_some_and(|r| r.ids.is_empty()) {
                tracing::info!("every retained worker registered again");
                *retained = None;
            }
        }
    }

    /// Puts a full range in place, unless etcd lost its data (`lost_data`, or an empty
    /// range) while workers were known: then the range's records are added and the known
    /// workers missing from it stay until they register again or the grace ends.
    fn apply_sync(
        &self,
        records: Vec<WorkerRecord>,
        lost_data: bool,
        retained: &mut Option<Retained>,
    ) {
        let known: BTreeSet<String> = self.registry.snapshot().workers.keys().cloned().collect();
        let suspect = records.is_empty() || lost_data;
        let retain = suspect && !known.is_empty() && !self.empty_resync_grace.is_zero();
        if !retain {
            *retained = None;
            for id in self.registry.replace_all(records) {
                tracing::info!(worker = %id, "worker left while the watch was down");
            }
            return;
        }
        let mut missing = known;
        for record in records {
            missing.remove(&record.worker_id);
            self.registry.upsert(record);
        }
        if missing.is_empty() {
            return;
        }
        // A grace already running (etcd flapping) keeps its end.
        let until = retained
            .as_ref()
            .map_or_else(|| Instant::now() + self.empty_resync_grace, |r| r.until);
        tracing::warn!(
            "etcd lost worker records (restarted without its data?): keeping {} known workers \
             for up to {:?} while they register again",
            missing.len(),
            until.saturating_duration_since(Instant::now())
        );
        *retained = Some(Retained {
            ids: missing,
            until,
        });
    }

    /// The grace is over: retained workers that did not register again leave.
    fn end_retention(&self, retained: &mut Option<Retained>) {
        let Some(r) = retained.take() else { return };
        for id in &r.ids {
            if self.registry.remove(id) {
                tracing::info!(worker = %id, "worker did not register again after etcd came back empty; left routing");
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One change the watch saw under the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EtcdChange<'a> {
    /// A record was written (registered, or refreshed by a heartbeat).
    Put {
        /// The full key.
        key: &'a str,
        /// The record bytes.
        value: &'a [u8],
    },
    /// A record went away (its lease expired, or it deregistered).
    Delete {
        /// The full key.
        key: &'a str,
    },
}

/// The records of a full range under `prefix`: every value that reads as a worker
/// record (by [`infera_proto::worker::WorkerRecord::from_json`]) under a key naming its
/// worker; the rest are counted and logged.
pub(crate) fn build_synced_records<'a>(
    prefix: &str,
    kvs: impl Iterator<Item = (&'a str, &'a [u8])>,
    metrics: &Metrics,
) -> Vec<infera_proto::worker::WorkerRecord> {
    kvs.filter_map(|(key, value)| {
        let id = worker_id_from_key(prefix, key)?;
        decode_record(id, value, metrics)
    })
    .collect()
}

/// Applies one watched change to `registry`: a PUT that reads as a worker record adds or
/// updates its worker (a record refused, or a canary mismatch, leaves the registry as it
/// was), a DELETE removes the worker the key names. Keys outside `prefix` are ignored.
pub(crate) fn apply_etcd_change(
    change: EtcdChange<'_>,
    prefix: &str,
    registry: &Registry,
    metrics: &Metrics,
) {
    match change {
        EtcdChange::Put { key, value } => {
            let Some(id) = worker_id_from_key(prefix, key) else {
                return;
            };
            metrics.record_discovery("put");
            if let Some(record) = decode_record(id, value, metrics) {
                let change = registry.upsert(record);
                if change == crate::workers::registry::Change::RejectedCanary {
                    metrics.record_rejected_record("tokenizer_canary");
                }
                tracing::debug!(worker = id, ?change, "worker record put");
            }
        }
        EtcdChange::Delete { key } => {
            let Some(id) = worker_id_from_key(prefix, key) else {
                return;
            };
            metrics.record_discovery("delete");
            if registry.remove(id) {
                tracing::info!(worker = id, "worker left routing");
            }
        }
    }
}
