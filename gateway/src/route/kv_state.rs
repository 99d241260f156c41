//! kv-aware routing state: the prefix index fed by KV events, the load state, and the
//! request hashing that turns a prompt into the router's block chain at each candidate's
//! block size. Decisions are the pure cost of [`crate::route::kv_cost`]; this module owns the
//! shared state around them.

use crate::metrics::{KvGauges, Metrics};
use crate::request::validate::ApiKind;
use crate::route::kv_cost::{LoadState, lower_cover};
use crate::route::prefix_index::{IndexSkip, PrefixIndex};
use crate::workers::registry::Target;
use arc_swap::ArcSwap;
use infera_prompt::PromptCodec;
use infera_proto::block_hash::compute_block_hashes;
use infera_proto::kv_events::{KvEvent, KvEventBatch};
use infera_proto::kv_tiers::{DeclaredTiers, KvTier};
use infera_proto::worker::WorkerRecord;
use serde_json::{Map, Value, json};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Views grown from the router's own picks are capped at this many blocks (then reset).
pub(crate) const APPROXIMATE_VIEW_CAP: usize = 1 << 20;

/// A request's block hashes per block size, or why it has none.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RequestBlocks {
    /// Hashes per block size.
    pub by_size: HashMap<u32, Vec<u64>>,
    /// Why hashing failed (the request is routed on load only).
    pub skipped: Option<&'static str>,
}

impl RequestBlocks {
    /// Hashes at `block_size` (empty when none).
    pub(crate) fn at(&self, block_size: Option<u32>) -> &[u64] {
        block_size
            .and_then(|bs| self.by_size.get(&bs))
            .map_or(&[], Vec::as_slice)
    }
}

/// A request's load charged to a target, released when the request ends.
#[derive(Debug)]
pub(crate) struct KvCharge {
    router: Arc<KvRouter>,
    target: String,
    hashes: Vec<u64>,
    /// Missed blocks still counted as queued prefill.
    queued: usize,
}

impl KvCharge {
    /// The request's first token arrived: its prefill no longer queues on the target.
    pub(crate) fn prefilled(&mut self) {
        if self.queued == 0 {
            return;
        }
        if let Ok(mut s) = self.router.state.lock() {
            s.load.prefilled(&self.target, self.queued);
        }
        self.queued = 0;
    }
}

impl Drop for KvCharge {
    fn drop(&mut self) {
        if let Ok(mut s) = self.router.state.lock() {
            s.load.release(&self.target, &self.hashes, self.queued);
        }
    }
}

#[derive(Debug, Default)]
struct KvState {
    index: PrefixIndex,
    load: LoadState,
}

/// What the KV-event ingest has done, counted for `/v1/kv-stats` (the earlier server's
/// index-writer, subscriber and reconciler counters; [`KvRouter::index_stats`] gives its
/// index counts).
#[derive(Debug, Default)]
pub(crate) struct IngestCounters {
    /// Payloads handed to the decoder.
    pub batches_received: AtomicU64,
    /// Of those, decoded.
    pub batches_decoded: AtomicU64,
    /// Events in the decoded batches.
    pub events_received: AtomicU64,
    /// Payloads no decoder knows.
    pub batches_undecodable: AtomicU64,
    /// Stored events applied to a view.
    pub stored_applied: AtomicU64,
    /// Removed events applied.
    pub removed_applied: AtomicU64,
    /// Cleared events applied.
    pub cleared_applied: AtomicU64,
    /// Events the index could not use (`IndexSkip`).
    pub events_skipped: AtomicU64,
    /// Replays asked of the engines' replay sockets (after a gap or a reconnect).
    pub replays_pulled: AtomicU64,
    /// Of those, ones that applied batches.
    pub replays_applied: AtomicU64,
    /// Of those, ones that failed (no answer, a bad frame).
    pub replays_failed: AtomicU64,
    /// Of those, ones with nothing newer than what was applied.
    pub replays_stale: AtomicU64,
    /// The ZMQ endpoints subscribed to now.
    pub endpoints: Mutex<Vec<String>>,
}

impl IngestCounters {
    /// Adds one to `counter`.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The value of `counter`.
    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The prefix index's counts under the earlier index's names (`/v1/kv-stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IndexStats {
    /// Blocks held in every view.
    pub nodes: usize,
    /// Of those, known from KV events.
    pub confirmed_nodes: usize,
    /// Of those, assumed from the router's own picks (workers without events).
    pub optimistic_nodes: usize,
    /// Targets (workers, ranks) holding blocks.
    pub publishers: usize,
    /// Models among them.
    pub models: usize,
    /// Block sizes among them (the router keeps one hash chain per block size, where the
    /// earlier index kept one tree per engine compatibility key).
    pub compat_keys: usize,
}

/// The kv-aware router's shared state.
#[derive(Debug)]
pub(crate) struct KvRouter {
    state: Mutex<KvState>,
    codec: ArcSwap<PromptCodec>,
    /// `--kv-overlap-weight`.
    pub weight: f64,
    /// Use the router's own picks as every worker's view, ignoring KV events.
    pub approximate_all: bool,
    metrics: Arc<Metrics>,
    /// What the KV-event ingest did.
    pub ingest: IngestCounters,
}

/// Content block types that make a request multimodal (the earlier router's list).
const MULTIMODAL_BLOCK_TYPES: [&str; 7] = [
    "image",
    "image_url",
    "input_audio",
    "document",
    "file",
    "video",
    "audio",
];

/// Whether a request carries non-text content: a `messages[].content[]` or `system[]`
/// block of an image, audio, video, document or file type, or a non-empty top-level
/// `images` list or `audio`. The router hashes text only, and an image placeholder is the
/// same token whatever the image, so such a request is routed on load alone (weight 0,
/// counted in `infera_cache_locality_skipped_total{reason="multimodal"}`), as the earlier
/// router did.
pub(crate) fn has_multimodal_content(body: &Map<String, Value>) -> bool {
    let is_mm_block = |block: &Value| {
        block
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| MULTIMODAL_BLOCK_TYPES.contains(&t))
    };
    let in_messages = body
        .get("messages")
        .and_then(Value::as_array)
        .is_some_and(|messages| {
            messages
                .iter()
                .filter_map(|m| m.get("content")?.as_array())
                .flatten()
                .any(is_mm_block)
        });
    let images = body
        .get("images")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let audio = match body.get("audio") {
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        _ => false,
    };
    let in_system = body
        .get("system")
        .and_then(Value::as_array)
        .is_some_and(|entries| entries.iter().any(is_mm_block));
    in_messages || images || audio || in_system
}

/// The block size a target is hashed at.
pub(crate) fn block_size_of(record: &WorkerRecord) -> Option<u32> {
    record.kv_block_size.filter(|bs| *bs > 0)
}

/// Whether a worker's view comes from the router's own picks (it publishes no events).
pub(crate) fn is_approximate(record: &WorkerRecord, approximate_all: bool) -> bool {
    approximate_all || record.events_endpoint().is_none()
}

impl KvRouter {
    /// A router hashing prompts with `codec`.
    pub(crate) fn new(
        codec: Arc<PromptCodec>,
        weight: f64,
        approximate_all: bool,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(KvState::default()),
            codec: ArcSwap::new(codec),
            weight,
            approximate_all,
            metrics,
            ingest: IngestCounters::default(),
        })
    }

    /// The codec requests are tokenized with.
    pub(crate) fn codec(&self) -> Arc<PromptCodec> {
        self.codec.load_full()
    }

    /// Tokenizes requests with `codec` from now on (a tokenizer that arrived late).
    pub(crate) fn set_codec(&self, codec: Arc<PromptCodec>) {
        self.codec.store(codec);
    }

    /// Tokenizes a request as the engine will and hashes it once per distinct block size.
    pub(crate) fn hash_request(
        &self,
        kind: ApiKind,
        body: &Map<String, Value>,
        block_sizes: &BTreeSet<u32>,
    ) -> RequestBlocks {
        let tokens = match self.request_tokens(kind, body) {
            Ok(t) => t,
            Err(reason) => {
                self.metrics.record_unhashed(reason);
                return RequestBlocks {
                    by_size: HashMap::new(),
                    skipped: Some(reason),
                };
            }
        };
        let by_size: HashMap<u32, Vec<u64>> = block_sizes
            .iter()
            .map(|bs| (*bs, compute_block_hashes(&tokens, *bs as usize)))
            .collect();
        let skipped = if block_sizes.is_empty() {
            Some("no_block_size")
        } else if by_size.values().all(Vec::is_empty) {
            Some("shorter_than_a_block")
        } else {
            None
        };
        if let Some(reason) = skipped {
            self.metrics.record_unhashed(reason);
        }
        RequestBlocks { by_size, skipped }
    }

    fn request_tokens(
        &self,
        kind: ApiKind,
        body: &Map<String, Value>,
    ) -> Result<Vec<u32>, &'static str> {
        match kind {
            ApiKind::Chat => self.codec.load().encode_chat(body).map_err(|_| "template"),
            ApiKind::Completions => match body.get("prompt") {
                Some(Value::String(s)) => self
                    .codec
                    .load()
                    .encode_completion(s)
                    .map_err(|_| "tokenizer"),
                Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Ok(items
                    .iter()
                    .filter_map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
                    .collect()),
                Some(Value::Array(items)) if items.len() == 1 => match &items[0] {
                    Value::String(s) => self
                        .codec
                        .load()
                        .encode_completion(s)
                        .map_err(|_| "tokenizer"),
                    _ => Err("unsupported_prompt"),
                },
                _ => Err("batched_prompt"),
            },
        }
    }

    /// Index of the cheapest of `options`.
    pub(crate) fn choose(
        &self,
        options: &[&Target],
        blocks: &RequestBlocks,
        weight: f64,
    ) -> Option<usize> {
        let state = self.state.lock().ok()?;
        let scored: Vec<(&str, f64, usize)> = options
            .iter()
            .map(|t| {
                let hashes = blocks.at(block_size_of(&t.record));
                let view = state.index.view(&t.key);
                let held = state.load.hits(&t.key, view, hashes);
                // Past the device hits: what the tiers the worker declares hold.
                let declared = DeclaredTiers::from_kv(t.record.kv.as_ref());
                let model = t.record.model_name.as_str();
                let tier_of = |h: u64| {
                    declared.costs.iter().map(|(tier, _)| *tier).find(|tier| {
                        view.is_some_and(|v| v.holds_on(h, *tier))
                            || (*tier == KvTier::Remote && state.index.shared_holds(model, h))
                    })
                };
                let block_tokens = block_size_of(&t.record).unwrap_or(16) as usize;
                let cover = lower_cover(hashes, held, block_tokens, &declared, tier_of);
                (t.key.as_str(), held as f64 + cover, hashes.len())
            })
            .collect();
        // Candidates can differ in block size; compare in the first candidate's blocks.
        let n = scored.iter().map(|s| s.2).max().unwrap_or(0);
        let pairs: Vec<(&str, f64)> = scored
            .iter()
            .map(|(k, h, len)| (*k, h * n as f64 / (*len).max(1) as f64))
            .collect();
        state.load.choose(&pairs, n, weight).map(|c| c.index)
    }

    /// Records that `target` was picked: charges its load, grows an approximate view,
    /// logs the pick (hits: the view's, as the cache-hit metrics count them), and
    /// returns the in-flight charge.
    pub(crate) fn commit(
        self: &Arc<Self>,
        target: &Target,
        blocks: &RequestBlocks,
        role: &str,
    ) -> Option<KvCharge> {
        let hashes = blocks.at(block_size_of(&target.record)).to_vec();
        let mut state = self.state.lock().ok()?;
        let hits = state.index.hits(&target.key, &hashes);
        let held = state
            .load
            .hits(&target.key, state.index.view(&target.key), &hashes);
        let queued = hashes.len().saturating_sub(held);
        state.load.charge(&target.key, &hashes, queued);
        if is_approximate(&target.record, self.approximate_all) {
            let view = state.index.view_mut(&target.key);
            if view.len() + hashes.len() > APPROXIMATE_VIEW_CAP {
                *view = Default::default();
            }
            view.insert_router_blocks(&hashes);
        }
        drop(state);
        self.metrics.record_cache_hits(role, hits);
        self.metrics.observe_pick_request_blocks(role, hashes.len());
        tracing::debug!(
            target: "infera_gateway::pick",
            policy = "kv-aware",
            worker = %target.key,
            hits,
            blocks = hashes.len(),
            skipped = blocks.skipped.unwrap_or(""),
            "pick"
        );
        Some(KvCharge {
            router: self.clone(),
            target: target.key.clone(),
            hashes,
            queued,
        })
    }

    /// Applies a decoded batch to `target`; returns the skips.
    pub(crate) fn apply_batch(
        &self,
        target: &str,
        block_size: u32,
        model: &str,
        batch: &KvEventBatch,
    ) -> Vec<IndexSkip> {
        let Ok(mut state) = self.state.lock() else {
            return Vec::new();
        };
        let mut skips = Vec::new();
        for event in &batch.events {
            let skipped = state.index.apply(target, block_size, model, event);
            let counter = match (skipped.is_empty(), event) {
                (false, _) => &self.ingest.events_skipped,
                (true, KvEvent::BlockStored(_)) => &self.ingest.stored_applied,
                (true, KvEvent::BlockRemoved(_)) => &self.ingest.removed_applied,
                (true, KvEvent::AllBlocksCleared) => &self.ingest.cleared_applied,
            };
            IngestCounters::add(counter, 1);
            skips.extend(skipped);
        }
        skips
    }

    /// The index's counts over the targets of `records` (what `/v1/kv-stats` reports).
    pub(crate) fn index_stats<'r>(
        &self,
        records: impl Iterator<Item = &'r WorkerRecord>,
    ) -> IndexStats {
        let Ok(state) = self.state.lock() else {
            return IndexStats::default();
        };
        let mut stats = IndexStats::default();
        let mut models = BTreeSet::new();
        let mut sizes = BTreeSet::new();
        for record in records {
            let approximate = is_approximate(record, self.approximate_all);
            for target in record.route_targets() {
                let blocks = state.index.view(&target.key).map_or(0, |v| v.len());
                if blocks == 0 {
                    continue;
                }
                stats.nodes += blocks;
                if approximate {
                    stats.optimistic_nodes += blocks;
                } else {
                    stats.confirmed_nodes += blocks;
                }
                stats.publishers += 1;
                models.insert(record.model_name.clone());
                sizes.insert(record.kv_block_size);
            }
        }
        stats.models = models.len();
        stats.compat_keys = sizes.len();
        stats
    }

    /// Blocks the router believes `worker_id`'s rank `rank` holds (rank 0 when none is
    /// given, as the earlier cache view read it); 0 for an unknown worker or rank.
    pub(crate) fn blocks_of(&self, record: Option<&WorkerRecord>, rank: Option<i128>) -> usize {
        let Some(record) = record else { return 0 };
        let rank = rank.unwrap_or(0);
        let Ok(state) = self.state.lock() else {
            return 0;
        };
        record
            .route_targets()
            .iter()
            .find(|t| i128::from(t.dp_rank.or(record.dp_rank).unwrap_or(0)) == rank)
            .and_then(|t| state.index.view(&t.key))
            .map_or(0, |v| v.len())
    }

    /// Forgets a worker and its ranks.
    pub(crate) fn remove_worker(&self, worker_id: &str) {
        if let Ok(mut s) = self.state.lock() {
            s.index.remove_worker(worker_id);
            s.load.remove_target(worker_id);
        }
    }

    /// The scrape-time gauges for the targets of `records` (every listed worker,
    /// draining ones included, as the earlier server set them at scrape time).
    pub(crate) fn gauges<'r>(&self, records: impl Iterator<Item = &'r WorkerRecord>) -> KvGauges {
        let Ok(state) = self.state.lock() else {
            return KvGauges::default();
        };
        KvGauges {
            indexed_blocks: state.index.total_blocks(),
            bytes_per_block: state.index.bytes_per_block(),
            targets: records
                .flat_map(WorkerRecord::route_targets)
                .map(|t| {
                    let view = state.index.view(&t.key).map_or(0, |v| v.len());
                    let active = state.load.active_blocks(&t.key);
                    (t.key, view, active)
                })
                .collect(),
        }
    }

    #[cfg(test)]
    /// Puts `blocks` blocks (hashes 1..=blocks) in `target`'s view.
    pub(crate) fn seed_view(&self, target: &str, blocks: u64) {
        if let Ok(mut s) = self.state.lock() {
            let hashes: Vec<u64> = (1..=blocks).collect();
            s.index.view_mut(target).insert_router_blocks(&hashes);
        }
    }

    #[cfg(test)]
    /// Distinct in-flight blocks over all targets.
    pub(crate) fn active_blocks(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.load.total_active_blocks())
            .unwrap_or_default()
    }

    /// `/v1/admin/cache-view/<worker_id>`: blocks held per target of the worker.
    pub(crate) fn cache_view(&self, record: &WorkerRecord) -> Value {
        let Ok(state) = self.state.lock() else {
            return Value::Null;
        };
        let targets: Vec<Value> = record
            .route_targets()
            .iter()
            .map(|t| {
                let view = state.index.view(&t.key);
                let on = |tier: KvTier| view.map_or(0, |v| v.len_on(tier));
                json!({
                    "key": t.key,
                    "blocks": view.map_or(0, |v| v.len()),
                    "lower_tier_blocks": {"host": on(KvTier::Host), "disk": on(KvTier::Disk),
                                          "remote": on(KvTier::Remote)},
                    "active_blocks": state.load.active_blocks(&t.key),
                    "load": state.load.load(&t.key),
                })
            })
            .collect();
        json!({
            "worker_id": record.worker_id,
            "kv_block_size": record.kv_block_size,
            "source": if is_approximate(record, self.approximate_all) { "router picks (approximate)" } else { "kv events" },
            "targets": targets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn detects_multimodal_requests_as_the_earlier_router_did() {
        let text = body(json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert!(!has_multimodal_content(&text));
        let parts = body(
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
        );
        assert!(!has_multimodal_content(&parts));
        for kind in MULTIMODAL_BLOCK_TYPES {
            let mm = body(
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": kind}]}]}),
            );
            assert!(has_multimodal_content(&mm), "{kind}");
        }
        assert!(has_multimodal_content(&body(json!({"images": ["x"]}))));
        assert!(!has_multimodal_content(&body(json!({"images": []}))));
        assert!(has_multimodal_content(&body(
            json!({"audio": {"data": "x"}})
        )));
        assert!(has_multimodal_content(&body(
            json!({"system": [{"type": "image"}]})
        )));
        assert!(!has_multimodal_content(&body(json!({"system": "text"}))));
    }
}
