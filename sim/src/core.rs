//! The simulated engine's scheduler: continuous batching with chunked prefill over the
//! prefix-cached KV pool, timed by the latency profile. Pure: it never sleeps or does
//! I/O. The caller asks for a step at time `now`, gets its duration and what it
//! produced (tokens, cache events), and delivers them when that time has passed, on a
//! real clock (scaled by `--speedup`) or a virtual one in tests ([`run_virtual`]).
//!
//! Each step, as vLLM's scheduler does: running requests in decode take one token of
//! the step's budget (`max_num_batched_tokens`); requests still in prefill take chunks
//! of what is left; then waiting requests are admitted first-come-first-served while
//! budget, `max_num_seqs` and KV space allow. A request is admitted only when the
//! uncached part of its prompt fits in the KV cache. A decode that cannot get a new
//! block preempts the most recently admitted request (its KV is freed and recomputed
//! later).

use crate::kv_cache::{BlockKey, BlockPool, PoolEvent};
use crate::profile::LatencyProfile;
use infera_proto::block_hash::compute_block_hash;
use infera_proto::kv_tiers::{KvTier, TierCost};
use infera_proto::retention::Retention;
use std::collections::{HashMap, VecDeque};
use xxhash_rust::xxh3::xxh3_64;

/// Scheduler and cache settings.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the cache.
    pub kv_blocks: usize,
    /// Token budget of one step (the chunked-prefill size).
    pub max_num_batched_tokens: usize,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Step timing.
    pub profile: LatencyProfile,
    /// KV transfer bandwidth for remote prefill (GB/s).
    pub kv_transfer_gbytes_per_s: f64,
    /// The tiers below HBM a connector loads from (kvd's), and what a load costs; empty
    /// without one.
    pub lower_tiers: Vec<(KvTier, TierCost)>,
}

/// A request handed to the engine, already tokenized.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequest {
    /// Unique id.
    pub id: u64,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// The tokens the request will generate (its length is `max_tokens`, at least 1).
    pub output: Vec<u32>,
    /// LoRA adapter: blocks are shared only within one adapter.
    pub lora: Option<String>,
    /// The prompt's KV arrives from a prefill worker instead of being computed.
    pub remote_kv: bool,
    /// Where the connector found the prompt's leading full blocks below HBM, block 0
    /// first (the run ends at the first block it did not find).
    pub lower: Vec<KvTier>,
    /// The request's retention class: what its blocks are stored under when they
    /// leave HBM.
    pub retention: Retention,
}

/// A finished request's full blocks, for the connector to store below HBM.
#[derive(Debug, Clone, PartialEq)]
pub struct Offload {
    /// Block keys, block 0 first.
    pub keys: Vec<BlockKey>,
    /// Each block's tokens.
    pub tokens: Vec<Vec<u32>>,
    /// The request's retention class.
    pub retention: Retention,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Request id.
    pub id: u64,
    /// Token id.
    pub token: u32,
    /// Index among the request's output tokens.
    pub index: usize,
    /// Whether this was the last one.
    pub finished: bool,
    /// Prompt tokens that were served from the prefix cache.
    pub cached_tokens: usize,
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepResult {
    /// Duration of the step (ms).
    pub duration_ms: f64,
    /// Tokens produced at the end of the step.
    pub tokens: Vec<TokenEvent>,
    /// Blocks stored and evicted during the step.
    pub cache_events: Vec<PoolEvent>,
    /// Prompt tokens computed in the step.
    pub prefill_tokens: usize,
    /// Sequences decoded in the step.
    pub decode_seqs: usize,
    /// Requests dropped because they can never fit in the KV cache.
    pub rejected: Vec<u64>,
    /// Requests running in the step and waiting during it, as scheduled (before the
    /// step's finished requests leave): what an engine's gauges show while it runs.
    pub scheduled: (usize, usize),
    /// Finished requests' blocks, for a connector to store below HBM.
    pub offload: Vec<Offload>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Waiting,
    Transferring {
        ready_at_ms: f64,
    },
    /// Loading `blocks` blocks from below HBM until `ready_at_ms`.
    Loading {
        ready_at_ms: f64,
        blocks: usize,
    },
    Prefill,
    Decode,
}

#[derive(Debug)]
struct Req {
    new: NewRequest,
    phase: Phase,
    /// Cached blocks this request pins, in sequence order.
    pinned: Vec<BlockKey>,
    /// Private (partial or uncommitted) blocks it holds.
    private: usize,
    /// Tokens whose KV is computed.
    computed: usize,
    /// Output tokens emitted.
    emitted: usize,
    cached_tokens: usize,
    admitted_seq: u64,
    /// Whether the load-or-recompute decision was made (once per admission).
    lower_decided: bool,
}

impl Req {
    fn seq_len(&self) -> usize {
        self.new.prompt.len() + self.emitted
    }
    fn token_at(&self, i: usize) -> u32 {
        let p = self.new.prompt.len();
        if i < p {
            self.new.prompt[i]
        } else {
            self.new.output[i - p]
        }
    }
    /// Where prefill stops: the whole prompt, or (after a preemption) all but the last
    /// token of what was generated so far.
    fn prefill_target(&self) -> usize {
        if self.emitted == 0 {
            self.new.prompt.len()
        } else {
            self.seq_len() - 1
        }
    }
    fn held_blocks(&self) -> usize {
        self.pinned.len() + self.private
    }
}

/// Counters the metrics endpoint reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CoreStats {
    /// Requests running (prefill or decode).
    pub running: usize,
    /// Requests waiting (queued or transferring KV).
    pub waiting: usize,
    /// KV blocks in use by running requests.
    pub used_blocks: usize,
    /// KV blocks in all.
    pub total_blocks: usize,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries_tokens: u64,
    /// Prompt tokens found there.
    pub prefix_hit_tokens: u64,
    /// Cached blocks evicted.
    pub evictions: u64,
    /// Requests preempted.
    pub preemptions: u64,
    /// Prompt tokens loaded from below HBM, per lower tier (host, disk, remote).
    pub loaded_tokens: [u64; 3],
    /// Prompt tokens found below HBM but recomputed (loading them was slower).
    pub recomputed_lower_tokens: u64,
}

/// The scheduler.
#[derive(Debug)]
pub struct EngineCore {
    cfg: CoreConfig,
    pool: BlockPool,
    reqs: HashMap<u64, Req>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    next_admit: u64,
    stats: CoreStats,
}

impl EngineCore {
    /// An idle engine.
    pub fn new(cfg: CoreConfig) -> Self {
        let pool = BlockPool::new(cfg.kv_blocks);
        Self {
            cfg,
            pool,
            reqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_admit: 0,
            stats: CoreStats::default(),
        }
    }

    /// Settings.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// Queues a request arriving at `now_ms`.
    pub fn add(&mut self, new: NewRequest, now_ms: f64) {
        let phase = if new.remote_kv {
            let ms = self
                .cfg
                .profile
                .kv_transfer_ms(new.prompt.len(), self.cfg.kv_transfer_gbytes_per_s);
            Phase::Transferring {
                ready_at_ms: now_ms + ms,
            }
        } else {
            Phase::Waiting
        };
        let id = new.id;
        self.reqs.insert(
            id,
            Req {
                new,
                phase,
                pinned: Vec::new(),
                private: 0,
                computed: 0,
                emitted: 0,
                cached_tokens: 0,
                admitted_seq: 0,
                lower_decided: false,
            },
        );
        self.waiting.push_back(id);
    }

    /// Drops a request (client gone), freeing its KV.
    pub fn abort(&mut self, id: u64) {
        if let Some(req) = self.reqs.remove(&id) {
            self.pool.release(&req.pinned, req.private);
            self.waiting.retain(|w| *w != id);
            self.running.retain(|r| *r != id);
        }
    }

    /// Whether any request is queued or running.
    pub fn has_work(&self) -> bool {
        !self.reqs.is_empty()
    }

    /// Requests currently known.
    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    /// Whether no request is known.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// When a transferring request becomes ready, if nothing else can run before then.
    pub fn next_ready_ms(&self) -> Option<f64> {
        self.waiting
            .iter()
            .filter_map(|id| match self.reqs.get(id)?.phase {
                Phase::Transferring { ready_at_ms } | Phase::Loading { ready_at_ms, .. } => {
                    Some(ready_at_ms)
                }
                _ => None,
            })
            .min_by(f64::total_cmp)
    }

    /// Counters for metrics.
    pub fn stats(&self) -> CoreStats {
        CoreStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            used_blocks: self.pool.used(),
            total_blocks: self.pool.capacity(),
            evictions: self.pool.evictions(),
            ..self.stats
        }
    }

    /// Drops every unreferenced cached block.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.pool.clear_unreferenced()
    }

    fn chain_root(lora: Option<&str>) -> BlockKey {
        lora.map_or(0, |name| xxh3_64(name.as_bytes()))
    }

    /// Keys of a prompt's full blocks, as the engine names them in HBM (the router's
    /// chain): what a connector looks up below HBM.
    pub fn prompt_keys(prompt: &[u32], block_size: usize, lora: Option<&str>) -> Vec<BlockKey> {
        let mut prev = Self::chain_root(lora);
        prompt
            .chunks_exact(block_size.max(1))
            .map(|block| {
                prev = compute_block_hash(prev, block);
                prev
            })
            .collect()
    }

    /// Keys of the first `blocks` full blocks of a request's sequence.
    fn keys(&self, req: &Req, blocks: usize) -> Vec<BlockKey> {
        let bs = self.cfg.block_size;
        let mut prev = Self::chain_root(req.new.lora.as_deref());
        let mut out = Vec::with_capacity(blocks);
        let mut buf = Vec::with_capacity(bs);
        for b in 0..blocks {
            buf.clear();
            buf.extend((b * bs..(b + 1) * bs).map(|i| req.token_at(i)));
            prev = compute_block_hash(prev, &buf);
            out.push(prev);
        }
        out
    }

    /// Runs one step at `now_ms`. `None` when nothing can run now (idle, or only
    /// waiting on KV transfers: see [`Self::next_ready_ms`]).
    pub fn step(&mut self, now_ms: f64) -> Option<StepResult> {
        let bs = self.cfg.block_size;
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut decodes: Vec<u64> = Vec::new();
        let mut chunks: Vec<(u64, usize)> = Vec::new();

        let mut result = StepResult::default();
        // 1. Running requests, oldest first: decodes, then continuing prefills.
        let running = self.running.clone();
        for id in running {
            if budget == 0 {
                break;
            }
            let Some(req) = self.reqs.get(&id) else {
                continue;
            };
            let (tokens, phase) = match req.phase {
                Phase::Decode => (1, Phase::Decode),
                Phase::Prefill => (
                    (req.prefill_target() - req.computed).min(budget),
                    Phase::Prefill,
                ),
                _ => continue,
            };
            let need = (req.computed + tokens)
                .div_ceil(bs)
                .saturating_sub(req.held_blocks());
            let scheduled: Vec<u64> = decodes
                .iter()
                .chain(chunks.iter().map(|(c, _)| c))
                .copied()
                .collect();
            if !self.reserve(id, need, &scheduled) {
                if self.running.len() == 1 {
                    // Alone and still out of KV: it can never finish.
                    self.abort(id);
                    result.rejected.push(id);
                }
                continue;
            }
            budget -= tokens;
            if phase == Phase::Decode {
                decodes.push(id);
            } else {
                chunks.push((id, tokens));
            }
        }

        // 2. Admit waiting requests in order while budget, seats and KV allow; one
        //    whose KV is still being loaded or transferred lets those behind it go.
        let mut at = 0;
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&id) = self.waiting.get(at) else {
                break;
            };
            match self.admit(id, now_ms) {
                Admission::Later => {
                    at += 1;
                    continue;
                }
                Admission::Admitted => {
                    self.waiting.remove(at);
                    self.running.push(id);
                    let Some(req) = self.reqs.get(&id) else {
                        continue;
                    };
                    // Remote KV arrived: its first decode step computes the last prompt
                    // token and samples the first output token.
                    let remote = req.phase == Phase::Decode;
                    let tokens = if remote {
                        1
                    } else {
                        (req.prefill_target() - req.computed).min(budget)
                    };
                    let need = (req.computed + tokens)
                        .div_ceil(bs)
                        .saturating_sub(req.held_blocks());
                    // Admission checked that the whole uncached prompt fits.
                    if !self.pool.allocate(need) {
                        break;
                    }
                    if let Some(req) = self.reqs.get_mut(&id) {
                        req.private += need;
                    }
                    budget -= tokens;
                    if remote {
                        decodes.push(id);
                    } else {
                        chunks.push((id, tokens));
                    }
                }
                Admission::NotYet => break,
                Admission::Never => {
                    self.waiting.remove(at);
                    self.abort(id);
                    result.rejected.push(id);
                }
            }
        }

        if decodes.is_empty() && chunks.is_empty() {
            return (!result.rejected.is_empty()).then_some(result);
        }

        // 3. Time the step, then apply it.
        let contexts: Vec<usize> = decodes
            .iter()
            .filter_map(|id| self.reqs.get(id).map(|r| r.computed + 1))
            .collect();
        let chunk_costs: Vec<(usize, usize)> = chunks
            .iter()
            .filter_map(|(id, n)| self.reqs.get(id).map(|r| (*n, r.computed)))
            .collect();
        result.duration_ms = self.cfg.profile.step_ms(&contexts, &chunk_costs);
        result.scheduled = (self.running.len(), self.waiting.len());
        result.prefill_tokens = chunks.iter().map(|(_, n)| n).sum();
        result.decode_seqs = decodes.len();
        for (id, n) in chunks {
            self.advance(id, n, false, &mut result);
        }
        for id in decodes {
            self.advance(id, 1, true, &mut result);
        }
        result.cache_events = self.pool.take_events();
        Some(result)
    }

    /// Makes sure `id` holds `need` more blocks, preempting newer requests not
    /// scheduled in this step if needed.
    fn reserve(&mut self, id: u64, need: usize, scheduled: &[u64]) -> bool {
        if need == 0 {
            return true;
        }
        loop {
            if self.pool.allocate(need) {
                if let Some(req) = self.reqs.get_mut(&id) {
                    req.private += need;
                }
                return true;
            }
            // Preempt the most recently admitted other running request.
            let victim = self
                .running
                .iter()
                .copied()
                .filter(|r| *r != id && !scheduled.contains(r))
                .max_by_key(|r| self.reqs.get(r).map_or(0, |q| q.admitted_seq));
            let Some(victim) = victim else { return false };
            self.preempt(victim);
        }
    }

    fn preempt(&mut self, id: u64) {
        self.running.retain(|r| *r != id);
        if let Some(req) = self.reqs.get_mut(&id) {
            self.pool.release(&req.pinned, req.private);
            req.pinned.clear();
            req.private = 0;
            req.computed = 0;
            req.phase = Phase::Waiting;
            self.waiting.push_front(id);
            self.stats.preemptions += 1;
        }
    }

    /// How many blocks from `from` (up to `end`) the connector found below HBM.
    fn lower_run(&self, req: &Req, from: usize, end: usize) -> usize {
        if self.cfg.lower_tiers.is_empty() || req.emitted > 0 {
            return 0;
        }
        req.new.lower.len().min(end).saturating_sub(from)
    }

    /// Time to load these blocks from their tiers (ms): each tier's run is one load (a
    /// round trip and its bytes); `None` for an empty run or an unknown tier.
    fn load_ms(&self, tiers: &[KvTier]) -> Option<f64> {
        if tiers.is_empty() {
            return None;
        }
        let block_bytes = (self.cfg.block_size as u64 * self.cfg.profile.kv_bytes_per_token) as f64;
        let mut total = 0.0;
        for run in tiers.chunk_by(|a, b| a == b) {
            let cost = self
                .cfg
                .lower_tiers
                .iter()
                .find(|(t, _)| *t == run[0])
                .map(|(_, c)| *c)?;
            total += cost.load_ms(run.len() as f64 * block_bytes);
        }
        Some(total)
    }

    fn admit(&mut self, id: u64, now_ms: f64) -> Admission {
        let bs = self.cfg.block_size;
        let Some(req) = self.reqs.get(&id) else {
            return Admission::NotYet;
        };
        let (remote, loaded) = match req.phase {
            Phase::Transferring { ready_at_ms } | Phase::Loading { ready_at_ms, .. }
                if ready_at_ms > now_ms =>
            {
                return Admission::Later;
            }
            Phase::Transferring { .. } => (true, 0),
            Phase::Loading { blocks, .. } => (false, blocks),
            _ => (false, 0),
        };
        let target = req.prefill_target();
        if target.div_ceil(bs) + 1 > self.pool.capacity() {
            return Admission::Never;
        }
        let keys = self.keys(req, target / bs);
        let mut matched = self.pool.match_prefix(&keys);
        if !remote && loaded == 0 && !req.lower_decided {
            // The run below HBM past what HBM holds: load it when that is quicker than
            // computing it, then come back (the request waits without blocking others).
            // Not the block of the last prompt token: that one is computed anyway.
            let run = self.lower_run(req, matched, target.saturating_sub(1) / bs);
            let found = if run > 0 {
                self.load_ms(&req.new.lower[matched..matched + run])
            } else {
                None
            };
            if let Some(ms) = found {
                let compute = self.cfg.profile.prefill_compute_ms(run * bs, matched * bs);
                if ms < compute {
                    if let Some(req) = self.reqs.get_mut(&id) {
                        req.lower_decided = true;
                        req.phase = Phase::Loading {
                            ready_at_ms: now_ms + ms,
                            blocks: matched + run,
                        };
                    }
                    return Admission::Later;
                }
                self.stats.recomputed_lower_tokens += (run * bs) as u64;
            }
            if let Some(req) = self.reqs.get_mut(&id) {
                req.lower_decided = true;
            }
        }
        if loaded > matched {
            // The loaded blocks become cached HBM blocks (stored, as the connector's
            // writes into the engine's blocks are), then count as matched.
            let fresh = loaded - matched;
            let Some(req) = self.reqs.get(&id) else {
                return Admission::NotYet;
            };
            let rest = target.div_ceil(bs).saturating_sub(loaded);
            // The blocks HBM holds stay pinned while room is made for the loaded ones.
            self.pool.acquire(&keys[..matched]);
            if self.pool.available() < fresh + rest || !self.pool.allocate(fresh) {
                self.pool.release(&keys[..matched], 0);
                return Admission::NotYet;
            }
            let tokens: Vec<Vec<u32>> = (matched..loaded)
                .map(|b| (b * bs..(b + 1) * bs).map(|i| req.token_at(i)).collect())
                .collect();
            for tier in &req.new.lower[matched..loaded] {
                let i = KvTier::LOWER.iter().position(|t| t == tier).unwrap_or(0);
                self.stats.loaded_tokens[i] += bs as u64;
            }
            for (offset, b) in (matched..loaded).enumerate() {
                let parent = b.checked_sub(1).map(|p| keys[p]);
                self.pool.commit(keys[b], parent, &tokens[offset]);
            }
            self.pool.release(&keys[..loaded], 0);
            matched = self.pool.match_prefix(&keys);
            if let Some(req) = self.reqs.get_mut(&id) {
                req.phase = Phase::Waiting;
            }
        }
        // At least one token must be computed to sample from (remote KV excepted).
        if !remote && matched * bs >= target && matched > 0 {
            matched -= 1;
        }
        // A remote prefill delivers the whole prompt but its last token, which the
        // first decode step computes.
        let ready_tokens = if remote { target - 1 } else { matched * bs };
        let need = if remote {
            ready_tokens.div_ceil(bs).saturating_sub(matched)
        } else {
            target.div_ceil(bs) - matched
        };
        self.pool.acquire(&keys[..matched]);
        if self.pool.available() < need {
            self.pool.release(&keys[..matched], 0);
            return Admission::NotYet;
        }
        self.stats.prefix_queries_tokens += target as u64;
        self.stats.prefix_hit_tokens += (matched * bs) as u64;
        let seq = self.next_admit;
        self.next_admit += 1;
        let Some(req) = self.reqs.get_mut(&id) else {
            return Admission::NotYet;
        };
        req.pinned = keys[..matched].to_vec();
        req.computed = matched * bs;
        req.cached_tokens = if req.emitted == 0 {
            matched * bs
        } else {
            req.cached_tokens
        };
        req.admitted_seq = seq;
        if remote {
            req.phase = Phase::Decode;
            let extra = need;
            if self.pool.allocate(extra) {
                req.private += extra;
            }
            req.computed = ready_tokens;
            self.commit_full_blocks(id);
        } else {
            req.phase = Phase::Prefill;
        }
        Admission::Admitted
    }

    /// Computes `n` tokens of `id`; decodes and finished prefills emit a token.
    fn advance(&mut self, id: u64, n: usize, decode: bool, result: &mut StepResult) {
        let Some(req) = self.reqs.get_mut(&id) else {
            return;
        };
        req.computed += n;
        let emits = if decode {
            true
        } else if req.computed >= req.prefill_target() {
            req.phase = Phase::Decode;
            req.emitted == 0
        } else {
            false
        };
        self.commit_full_blocks(id);
        if !emits {
            return;
        }
        let Some(req) = self.reqs.get_mut(&id) else {
            return;
        };
        let index = req.emitted;
        req.emitted += 1;
        let finished = req.emitted >= req.new.output.len();
        result.tokens.push(TokenEvent {
            id,
            token: req.new.output[index],
            index,
            finished,
            cached_tokens: req.cached_tokens,
        });
        if finished {
            if let Some(req) = self.reqs.remove(&id) {
                if !self.cfg.lower_tiers.is_empty() && !req.pinned.is_empty() {
                    let bs = self.cfg.block_size;
                    result.offload.push(Offload {
                        keys: req.pinned.clone(),
                        tokens: (0..req.pinned.len())
                            .map(|b| (b * bs..(b + 1) * bs).map(|i| req.token_at(i)).collect())
                            .collect(),
                        retention: req.new.retention,
                    });
                }
                self.pool.release(&req.pinned, req.private);
            }
            self.running.retain(|r| *r != id);
        }
    }

    /// Commits every computed full block not yet cached.
    fn commit_full_blocks(&mut self, id: u64) {
        let bs = self.cfg.block_size;
        let Some(req) = self.reqs.get(&id) else {
            return;
        };
        let full = req.computed / bs;
        let have = req.pinned.len();
        if full <= have {
            return;
        }
        let keys = self.keys(req, full);
        let tokens: Vec<Vec<u32>> = (have..full)
            .map(|b| (b * bs..(b + 1) * bs).map(|i| req.token_at(i)).collect())
            .collect();
        for (offset, b) in (have..full).enumerate() {
            let parent = b.checked_sub(1).map(|p| keys[p]);
            self.pool.commit(keys[b], parent, &tokens[offset]);
        }
        if let Some(req) = self.reqs.get_mut(&id) {
            req.private = req.private.saturating_sub(full - have);
            req.pinned.extend_from_slice(&keys[have..full]);
        }
    }
}

enum Admission {
    Admitted,
    /// Its KV is still arriving: the requests behind it may go first.
    Later,
    /// No room yet: nothing behind it goes either (first come, first served).
    NotYet,
    Never,
}

/// A request's timeline in a virtual run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// Arrival time (ms).
    pub arrival_ms: f64,
    /// Time each output token was produced (ms).
    pub token_ms: Vec<f64>,
    /// Prompt tokens served from cache.
    pub cached_tokens: usize,
}

impl Timeline {
    /// Time to first token (ms).
    pub fn ttft_ms(&self) -> Option<f64> {
        self.token_ms.first().map(|t| t - self.arrival_ms)
    }
}

/// Runs `arrivals` (time, request) to completion on a virtual clock.
pub fn run_virtual(
    core: &mut EngineCore,
    mut arrivals: Vec<(f64, NewRequest)>,
) -> (HashMap<u64, Timeline>, Vec<StepResult>) {
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut pending: VecDeque<(f64, NewRequest)> = arrivals.into();
    let mut timelines: HashMap<u64, Timeline> = HashMap::new();
    let mut steps = Vec::new();
    let mut now = 0.0_f64;
    loop {
        while pending.front().is_some_and(|(t, _)| *t <= now) {
            if let Some((t, req)) = pending.pop_front() {
                timelines.entry(req.id).or_default().arrival_ms = t;
                core.add(req, t);
            }
        }
        match core.step(now) {
            Some(step) => {
                now += step.duration_ms;
                for tok in &step.tokens {
                    let tl = timelines.entry(tok.id).or_default();
                    tl.token_ms.push(now);
                    tl.cached_tokens = tok.cached_tokens;
                }
                steps.push(step);
            }
            None => {
                let next_arrival = pending.front().map(|(t, _)| *t);
                let next = match (next_arrival, core.next_ready_ms()) {
                    (Some(a), Some(r)) => a.min(r),
                    (Some(a), None) => a,
                    (None, Some(r)) => r,
                    (None, None) => break,
                };
                now = now.max(next);
            }
        }
    }
    (timelines, steps)
}
