//! The live set of workers, read without locks on the hot path.
//!
//! Discovery (etcd, a static file, or another crate in-process) writes records in; the
//! router reads an immutable [`Snapshot`] swapped atomically on every change. Writers
//! are serialized by a mutex and copy the map (changes are rare, reads are per request).
//! Removal listeners let breakers, policies and metrics forget a worker that leaves.
//!
//! A worker can be *draining*: listed (in [`Snapshot::workers`], so `/v1/workers` shows
//! it and its breaker, in-flight count and KV index stay) but not routed (absent from
//! [`Snapshot::models`]). Kubernetes discovery drains the worker of a Pod being deleted
//! until the Pod is gone, so no new request reaches an engine that is shutting down. A
//! record that itself says `"status": "draining"` or `"dead"` (the earlier reader honoured
//! it; launchers do not write it) is listed the same way, under its own status.
//!
//! A model's tokenizer canary reference is set by its first worker that carries one and
//! forgotten when the model's last worker leaves, as the earlier registry did, so a fleet
//! replaced by workers with a new tokenizer is accepted once the old one is gone.

use arc_swap::ArcSwap;
use infera_proto::worker::{DisaggMode, RouteTarget, WorkerRecord, WorkerStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// One place a request can go.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The worker's record.
    pub record: Arc<WorkerRecord>,
    /// Routing key: the worker id, or `<worker_id>#dp<r>`.
    pub key: String,
    /// Rank sent as `X-Data-Parallel-Rank`.
    pub dp_rank: Option<u32>,
}

/// The model of workers found on an InferencePool's target ports without a worker
/// record (a stock engine's Pod): requests for a model no record names go to them.
pub(crate) const ANY_MODEL: &str = "*";

/// The workers serving one model, by role.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pools {
    /// Mixed workers.
    pub mixed: Vec<Target>,
    /// Prefill workers.
    pub prefill: Vec<Target>,
    /// Decode workers.
    pub decode: Vec<Target>,
}

/// An immutable view of the registry.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Workers by id, draining ones included.
    pub workers: BTreeMap<String, Arc<WorkerRecord>>,
    /// Ids of listed workers drained by discovery (a Pod being deleted); each is in
    /// `workers`. Records stating a status of their own are not in this set.
    pub draining: BTreeSet<String>,
    /// Routing targets per model (draining workers are left out).
    pub(crate) models: BTreeMap<String, Pools>,
    /// Every model a worker has registered for since the gateway started, served now or
    /// not: a request for one with no worker at the moment is told to retry (503), not
    /// that the model does not exist (404).
    pub known_models: BTreeSet<String>,
}

impl Snapshot {
    fn build(
        workers: BTreeMap<String, Arc<WorkerRecord>>,
        draining: BTreeSet<String>,
        mut known_models: BTreeSet<String>,
    ) -> Self {
        known_models.extend(workers.values().map(|r| r.model_name.clone()));
        let mut models: BTreeMap<String, Pools> = BTreeMap::new();
        for record in workers
            .values()
            .filter(|r| !draining.contains(&r.worker_id) && r.status() == WorkerStatus::Active)
        {
            let pools = models.entry(record.model_name.clone()).or_default();
            let pool = match record.disagg_mode {
                DisaggMode::Mixed => &mut pools.mixed,
                DisaggMode::Prefill => &mut pools.prefill,
                DisaggMode::Decode => &mut pools.decode,
            };
            pool.extend(
                record
                    .route_targets()
                    .into_iter()
                    .map(|RouteTarget { key, dp_rank }| Target {
                        record: record.clone(),
                        key,
                        dp_rank,
                    }),
            );
        }
        Self {
            workers,
            draining,
            models,
            known_models,
        }
    }

    /// The status of a listed worker (the earlier `/v1/workers` `status`): draining
    /// while discovery drains it, else what its record states (active by default).
    pub(crate) fn status(&self, worker_id: &str) -> Option<WorkerStatus> {
        let record = self.workers.get(worker_id)?;
        Some(if self.draining.contains(worker_id) {
            WorkerStatus::Draining
        } else {
            record.status()
        })
    }

    /// Whether `worker_id` is listed but takes no new requests (draining or dead).
    pub(crate) fn is_draining(&self, worker_id: &str) -> bool {
        self.status(worker_id)
            .is_some_and(|s| s != WorkerStatus::Active)
    }

    #[cfg(test)]
    /// The record of `worker_id` when it may take new requests (listed, active).
    pub(crate) fn routable(&self, worker_id: &str) -> Option<&Arc<WorkerRecord>> {
        self.workers
            .get(worker_id)
            .filter(|_| !self.is_draining(worker_id))
    }

    /// Workers that take new requests, over all models (the earlier `/health`
    /// `active_workers`).
    pub(crate) fn active_workers(&self) -> usize {
        self.workers
            .keys()
            .filter(|id| !self.is_draining(id))
            .count()
    }

    /// Names of the models served.
    pub(crate) fn model_names(&self) -> BTreeSet<&str> {
        self.models.keys().map(String::as_str).collect()
    }

    /// Routable (not draining) workers per role.
    pub(crate) fn count_by_mode(&self) -> [(DisaggMode, usize); 3] {
        let count = |mode| {
            self.workers
                .values()
                .filter(|w| w.disagg_mode == mode && !self.is_draining(&w.worker_id))
                .count()
        };
        [
            (DisaggMode::Mixed, count(DisaggMode::Mixed)),
            (DisaggMode::Prefill, count(DisaggMode::Prefill)),
            (DisaggMode::Decode, count(DisaggMode::Decode)),
        ]
    }
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A new worker.
    Added,
    /// A changed record.
    Updated,
    /// Same record as before (a heartbeat).
    Unchanged,
    /// Refused: its tokenizer canary differs from the model's first worker's, so its
    /// prompts tokenize differently and every prefix lookup would silently miss.
    RejectedCanary,
}

type Listener = Box<dyn Fn(&str) + Send + Sync>;

/// The registry.
pub struct Registry {
    snapshot: ArcSwap<Snapshot>,
    write: Mutex<()>,
    synced: watch::Sender<bool>,
    version: watch::Sender<u64>,
    canaries: Mutex<BTreeMap<String, Vec<u32>>>,
    on_remove: Mutex<Vec<Listener>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("workers", &self.snapshot.load().workers.len())
            .field("synced", &*self.synced.borrow())
            .finish()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            write: Mutex::new(()),
            synced: watch::channel(false).0,
            version: watch::channel(0).0,
            canaries: Mutex::new(BTreeMap::new()),
            on_remove: Mutex::new(Vec::new()),
        }
    }
}

impl Registry {
    /// An empty, not yet synced registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The current view.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Calls `f(worker_id)` whenever a worker leaves.
    pub fn on_remove(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        if let Ok(mut listeners) = self.on_remove.lock() {
            listeners.push(Box::new(f));
        }
    }

    fn notify_removed(&self, ids: &[String]) {
        if let Ok(listeners) = self.on_remove.lock() {
            for id in ids {
                for f in listeners.iter() {
                    f(id);
                }
            }
        }
    }

    fn modify(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, Arc<WorkerRecord>>, &mut BTreeSet<String>) -> Vec<String>,
    ) -> Vec<String> {
        let removed;
        {
            let _guard = self.write.lock();
            let current = self.snapshot.load();
            let mut workers = current.workers.clone();
            let mut draining = current.draining.clone();
            removed = f(&mut workers, &mut draining);
            // A worker that left is no longer draining (it may come back fresh).
            draining.retain(|id| workers.contains_key(id));
            if let Ok(mut canaries) = self.canaries.lock() {
                canaries.retain(|model, _| workers.values().any(|w| &w.model_name == model));
            }
            self.snapshot.store(Arc::new(Snapshot::build(
                workers,
                draining,
                current.known_models.clone(),
            )));
            self.version.send_modify(|v| *v += 1);
        }
        self.notify_removed(&removed);
        removed
    }

    /// A receiver that changes whenever the set of workers does.
    pub fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// The reference canary of `model`, set by its first worker that published one.
    pub fn canary(&self, model: &str) -> Option<Vec<u32>> {
        self.canaries.lock().ok()?.get(model).cloned()
    }

    fn check_canary(&self, record: &WorkerRecord) -> bool {
        // An empty canary states nothing (a `kv` block written only to declare tiers).
        let Some(canary) = record
            .kv
            .as_ref()
            .map(|kv| &kv.tokenizer_canary)
            .filter(|c| !c.is_empty())
        else {
            return true;
        };
        let Ok(mut canaries) = self.canaries.lock() else {
            return true;
        };
        let reference = canaries
            .entry(record.model_name.clone())
            .or_insert_with(|| canary.clone());
        if reference == canary {
            return true;
        }
        tracing::error!(
            worker = %record.worker_id,
            model = %record.model_name,
            "worker refused: its tokenizer canary {canary:?} differs from the model's reference {reference:?}; \
             its tokenizer (or chat template) differs from the other workers', so prefix routing would silently miss"
        );
        false
    }

    /// Adds or replaces a worker; a draining worker stays draining.
    pub fn upsert(&self, record: WorkerRecord) -> Change {
        self.upsert_as(record, None)
    }

    /// Adds or replaces a worker and sets whether it is draining, in one change (so a
    /// worker first seen draining is never routable, not even for an instant). A change
    /// of the draining state alone is [`Change::Updated`].
    pub fn upsert_draining(&self, record: WorkerRecord, draining: bool) -> Change {
        self.upsert_as(record, Some(draining))
    }

    /// Sets whether a listed worker is draining; false when no such worker is listed.
    pub fn set_draining(&self, worker_id: &str, draining: bool) -> bool {
        let mut known = false;
        self.modify(|workers, set| {
            known = workers.contains_key(worker_id);
            if known && draining {
                set.insert(worker_id.to_owned());
            } else {
                set.remove(worker_id);
            }
            Vec::new()
        });
        known
    }

    fn upsert_as(&self, record: WorkerRecord, draining: Option<bool>) -> Change {
        if !self.check_canary(&record) {
            return Change::RejectedCanary;
        }
        let mut change = Change::Added;
        self.modify(|workers, set| {
            match workers.get(&record.worker_id) {
                Some(old) if **old == record => change = Change::Unchanged,
                Some(_) => change = Change::Updated,
                None => {}
            }
            let flipped = match draining {
                Some(true) => set.insert(record.worker_id.clone()),
                Some(false) => set.remove(&record.worker_id),
                None => false,
            };
            if change != Change::Unchanged {
                workers.insert(record.worker_id.clone(), Arc::new(record));
            } else if flipped {
                change = Change::Updated;
            }
            Vec::new()
        });
        change
    }

    /// Removes a worker; true if it was there.
    pub fn remove(&self, worker_id: &str) -> bool {
        !self
            .modify(|workers, _| {
                workers
                    .remove(worker_id)
                    .map(|_| vec![worker_id.to_owned()])
                    .unwrap_or_default()
            })
            .is_empty()
    }

    /// Replaces every worker (a full re-sync); returns the ids that left. Workers that stay
    /// keep their draining state.
    pub fn replace_all(&self, records: Vec<WorkerRecord>) -> Vec<String> {
        let records: Vec<WorkerRecord> = records
            .into_iter()
            .filter(|r| self.check_canary(r))
            .collect();
        self.modify(|workers, _| {
            let fresh: BTreeMap<String, Arc<WorkerRecord>> = records
                .into_iter()
                .map(|r| (r.worker_id.clone(), Arc::new(r)))
                .collect();
            let removed = workers
                .keys()
                .filter(|k| !fresh.contains_key(*k))
                .cloned()
                .collect();
            *workers = fresh;
            removed
        })
    }

    /// Marks discovery as synced (`/ready` turns 200).
    pub fn mark_synced(&self) {
        self.synced.send_replace(true);
    }

    /// Whether discovery has synced once.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until discovery has synced.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn mk_record(id: &str, model: &str, mode: DisaggMode, dp_size: u32) -> WorkerRecord {
        let mut r = WorkerRecord::from_json(
            format!(r#"{{"worker_id":"{id}","url":"http://{id}","model_name":"{model}","engine":"vllm"}}"#).as_bytes(),
        )
        .unwrap();
        r.disagg_mode = mode;
        r.dp_size = Some(dp_size);
        r
    }

    #[test]
    fn snapshots_group_targets_by_model_and_role() {
        let reg = Registry::new();
        reg.upsert(mk_record("a:1", "m1", DisaggMode::Mixed, 1));
        reg.upsert(mk_record("b:1", "m1", DisaggMode::Prefill, 2));
        reg.upsert(mk_record("c:1", "m2", DisaggMode::Decode, 1));
        let snap = reg.snapshot();
        assert_eq!(
            snap.model_names().into_iter().collect::<Vec<_>>(),
            vec!["m1", "m2"]
        );
        let m1 = &snap.models["m1"];
        assert_eq!(m1.mixed.len(), 1);
        let keys: Vec<&str> = m1.prefill.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, vec!["b:1#dp0", "b:1#dp1"]);
        assert_eq!(snap.models["m2"].decode.len(), 1);
    }

    #[test]
    fn upsert_reports_changes_and_removal_notifies() {
        let reg = Registry::new();
        let removed = Arc::new(AtomicUsize::new(0));
        let seen = removed.clone();
        reg.on_remove(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        });
        let r = mk_record("a:1", "m", DisaggMode::Mixed, 1);
        assert_eq!(reg.upsert(r.clone()), Change::Added);
        assert_eq!(reg.upsert(r.clone()), Change::Unchanged);
        let mut r2 = r.clone();
        r2.kv_block_size = Some(32);
        assert_eq!(reg.upsert(r2), Change::Updated);
        reg.upsert(mk_record("b:1", "m", DisaggMode::Mixed, 1));
        assert_eq!(reg.replace_all(vec![r]), vec!["b:1".to_owned()]);
        let mut odd = mk_record("c:1", "m", DisaggMode::Mixed, 1);
        let kv = |canary: Vec<u32>| {
            serde_json::from_value(
                serde_json::json!({"engine_block_size": 16, "index_block_size": 64, "tokenizer": null, "tokenizer_digest": null, "tokenizer_canary": canary}),
            )
            .unwrap()
        };
        odd.kv = Some(kv(vec![1, 2, 3]));
        assert_eq!(
            reg.upsert(odd.clone()),
            Change::Added,
            "the first canary sets the reference"
        );
        let mut other = mk_record("d:1", "m", DisaggMode::Mixed, 1);
        other.kv = Some(kv(vec![9, 9]));
        assert_eq!(reg.upsert(other), Change::RejectedCanary);
        assert!(reg.remove("c:1"));
        assert!(reg.remove("a:1"));
        assert!(!reg.remove("a:1"));
        assert_eq!(removed.load(Ordering::SeqCst), 3);
        assert!(reg.snapshot().workers.is_empty());
    }

    #[test]
    fn a_draining_worker_is_listed_but_not_routed() {
        let reg = Registry::new();
        let a = mk_record("a:1", "m", DisaggMode::Mixed, 1);
        reg.upsert(a.clone());
        reg.upsert(mk_record("b:1", "m", DisaggMode::Mixed, 1));
        assert!(reg.set_draining("a:1", true));
        let snap = reg.snapshot();
        assert!(snap.workers.contains_key("a:1"));
        assert!(snap.is_draining("a:1") && !snap.is_draining("b:1"));
        assert!(snap.routable("a:1").is_none() && snap.routable("b:1").is_some());
        let keys: Vec<&str> = snap.models["m"]
            .mixed
            .iter()
            .map(|t| t.key.as_str())
            .collect();
        assert_eq!(keys, vec!["b:1"]);
        assert_eq!(
            reg.upsert(a.clone()),
            Change::Unchanged,
            "a plain upsert keeps the draining state"
        );
        assert!(reg.snapshot().is_draining("a:1"));
        assert!(
            !reg.set_draining("nobody:1", true),
            "unknown workers are not drained"
        );
        assert!(!reg.snapshot().is_draining("nobody:1"));

        assert!(reg.set_draining("b:1", true));
        let snap = reg.snapshot();
        assert!(
            !snap.models.contains_key("m"),
            "a model whose every worker drains is not served"
        );
        assert_eq!(snap.workers.len(), 2);

        assert!(reg.set_draining("a:1", false));
        assert_eq!(reg.snapshot().models["m"].mixed.len(), 1);
        assert!(reg.remove("b:1"));
        reg.upsert(mk_record("b:1", "m", DisaggMode::Mixed, 1));
        assert!(
            !reg.snapshot().is_draining("b:1"),
            "a worker that left and came back is not draining"
        );
    }

    #[test]
    fn upsert_draining_sets_record_and_state_in_one_change() {
        let reg = Registry::new();
        let mut changes = reg.subscribe_changes();
        changes.mark_unchanged();
        let a = mk_record("a:1", "m", DisaggMode::Mixed, 2);
        assert_eq!(reg.upsert_draining(a.clone(), true), Change::Added);
        let snap = reg.snapshot();
        assert!(snap.is_draining("a:1") && snap.models.is_empty());
        assert_eq!(
            *changes.borrow_and_update(),
            1,
            "one snapshot, never routable"
        );
        assert_eq!(reg.upsert_draining(a.clone(), true), Change::Unchanged);
        assert_eq!(reg.upsert_draining(a.clone(), false), Change::Updated);
        assert_eq!(reg.snapshot().models["m"].mixed.len(), 2);
        let mut a2 = a.clone();
        a2.kv_block_size = Some(64);
        assert_eq!(reg.upsert_draining(a2, true), Change::Updated);
        assert!(reg.snapshot().is_draining("a:1"));
        assert_eq!(reg.replace_all(vec![a]), Vec::<String>::new());
        assert!(
            reg.snapshot().is_draining("a:1"),
            "a re-sync keeps the state of workers that stay"
        );
        assert!(reg.replace_all(Vec::new()) == vec!["a:1".to_owned()]);
        assert!(reg.snapshot().draining.is_empty());
    }

    #[test]
    fn a_record_stating_draining_or_dead_is_listed_not_routed() {
        let reg = Registry::new();
        let mut draining = mk_record("a:1", "m", DisaggMode::Mixed, 1);
        draining.status = Some(WorkerStatus::Draining);
        let mut dead = mk_record("b:1", "m", DisaggMode::Mixed, 1);
        dead.status = Some(WorkerStatus::Dead);
        reg.upsert(draining);
        reg.upsert(dead);
        reg.upsert(mk_record("c:1", "m", DisaggMode::Mixed, 1));
        let snap = reg.snapshot();
        assert_eq!(snap.workers.len(), 3);
        assert_eq!(snap.status("a:1"), Some(WorkerStatus::Draining));
        assert_eq!(snap.status("b:1"), Some(WorkerStatus::Dead));
        assert_eq!(snap.status("c:1"), Some(WorkerStatus::Active));
        assert!(snap.routable("a:1").is_none() && snap.routable("b:1").is_none());
        assert_eq!(snap.models["m"].mixed.len(), 1);
        assert_eq!(snap.active_workers(), 1);
        assert_eq!(snap.count_by_mode()[0], (DisaggMode::Mixed, 1));
    }

    #[test]
    fn the_canary_reference_is_forgotten_with_the_models_last_worker() {
        let reg = Registry::new();
        let with_canary = |id: &str, canary: Vec<u32>| {
            let mut r = mk_record(id, "m", DisaggMode::Mixed, 1);
            r.kv = Some(
                serde_json::from_value(serde_json::json!({"engine_block_size": 16, "index_block_size": 64, "tokenizer": "t", "tokenizer_digest": "d", "tokenizer_canary": canary}))
                    .unwrap(),
            );
            r
        };
        assert_eq!(reg.upsert(with_canary("a:1", vec![1])), Change::Added);
        assert_eq!(
            reg.upsert(with_canary("b:1", vec![2])),
            Change::RejectedCanary
        );
        assert!(reg.remove("a:1"));
        assert_eq!(reg.canary("m"), None);
        assert_eq!(reg.upsert(with_canary("b:1", vec![2])), Change::Added);
        assert_eq!(reg.canary("m"), Some(vec![2]));
    }
}
