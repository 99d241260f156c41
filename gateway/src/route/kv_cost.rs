//! The kv-aware cost (pure). For each candidate target `t` and the request's block
//! hashes `B`:
//!
//! `cost(t) = w · (|B| − hits(t)) + load(t)`, the minimum `(cost, load)` pair wins,
//! where `hits(t)` counts the leading hashes of `B` that `t` holds: in its view (KV
//! events, or the router's own picks in approximate mode) or in flight on it (a pick's
//! blocks count as held from the pick on, so requests sharing a prefix follow the
//! first one before its KV events arrive). `load(t)` estimates the wait a new request
//! would see there, in blocks:
//!
//! `load(t) = queued(t) + REQUEST_COST · requests(t)`
//!
//! where `queued(t)` sums the missed blocks (prefill still to compute) of `t`'s
//! in-flight requests that have not produced a token yet, and `requests(t)` counts its
//! in-flight requests (each one decoding occupies a batch seat and slows every step).
//! Cached blocks are not load: a hot prefix stays on its holder while its queue is
//! short and spreads to a second worker once the holder's queued prefill and batch
//! outweigh recomputing the prefix (`w · |prefix|`). Ties go to the target picked least
//! recently (never picked first, then candidate order), so an idle fleet takes turns.
//! Cost per decision: O(candidates × leading hits).
//!
//! Tiers below the device ([`lower_cover`]): past its leading device hits, a target's
//! next blocks may sit on a tier it declares in its record (host RAM, NVMe, the shared
//! store). Each run of them on one tier costs its load time in blocks' worth of
//! recomputation (`infera_proto::kv_tiers::run_cost`, never more than recomputing it),
//! so those blocks count as held but for that cost: `hits(t)` above becomes the leading
//! device hits plus the runs' blocks minus their cost. A long run on a fast tier is
//! nearly as good as a device hit; a short run behind a slow round trip counts as
//! nothing, as the engine will recompute it.

use crate::route::prefix_index::TargetView;
use infera_proto::kv_tiers::{DeclaredTiers, KvTier, run_cost};
use std::collections::HashMap;

/// What one in-flight request adds to its worker's load, in blocks: about the prefill of
/// 128 tokens, so a couple of cached blocks (a chat template's shared header) do not hold
/// a busy worker against an idle one, while a long cached prefix does until its holder
/// has many requests in flight.
pub(crate) const REQUEST_COST: f64 = 8.0;

/// A scored choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct KvChoice {
    /// Index into the candidates.
    pub index: usize,
    /// Leading hits of the winner (device hits and the worth of its lower-tier runs).
    pub hits: f64,
    /// Its cost.
    pub cost: f64,
    /// Its load.
    pub load: f64,
}

/// One target's in-flight work.
#[derive(Debug, Default, Clone)]
struct TargetLoad {
    /// Block hash -> in-flight requests holding it.
    blocks: HashMap<u64, u32>,
    /// Missed blocks of in-flight requests still before their first token.
    queued: usize,
    /// In-flight requests.
    requests: usize,
}

/// In-flight load per target.
#[derive(Debug, Default, Clone)]
pub(crate) struct LoadState {
    targets: HashMap<String, TargetLoad>,
    /// Target -> the number of its latest pick (tie-break: least recent first).
    last_pick: HashMap<String, u64>,
    picks: u64,
}

/// What the blocks of `hashes` from `from` on are worth on the tiers below the device a
/// target declares: per run of consecutive blocks on one tier (the fastest declared tier
/// holding each, as `tier_of` finds it), the run's blocks minus its load cost in blocks'
/// worth of recomputation. The runs end at the first block no declared tier holds.
pub(crate) fn lower_cover(
    hashes: &[u64],
    from: usize,
    block_tokens: usize,
    declared: &DeclaredTiers,
    tier_of: impl Fn(u64) -> Option<KvTier>,
) -> f64 {
    if !declared.any() || from >= hashes.len() {
        return 0.0;
    }
    let tiers: Vec<KvTier> = hashes[from..].iter().map_while(|h| tier_of(*h)).collect();
    tiers
        .chunk_by(|a, b| a == b)
        .filter_map(|run| {
            let cost = declared.cost(run[0])?;
            let paid = run_cost(
                cost,
                run.len(),
                block_tokens,
                declared.kv_bytes_per_token,
                declared.prefill_ms_per_token,
            );
            Some(run.len() as f64 - paid)
        })
        .sum()
}

/// Leading hashes of `hashes` that `held` says are held.
pub(crate) fn leading(hashes: &[u64], held: impl Fn(u64) -> bool) -> usize {
    hashes.iter().take_while(|h| held(**h)).count()
}

impl LoadState {
    /// `queued(t) + REQUEST_COST · requests(t)`.
    pub(crate) fn load(&self, target: &str) -> f64 {
        self.targets
            .get(target)
            .map_or(0.0, |t| t.queued as f64 + REQUEST_COST * t.requests as f64)
    }

    /// Distinct in-flight blocks on `target`.
    pub(crate) fn active_blocks(&self, target: &str) -> usize {
        self.targets.get(target).map_or(0, |t| t.blocks.len())
    }

    #[cfg(test)]
    /// Distinct in-flight blocks over all targets.
    pub(crate) fn total_active_blocks(&self) -> usize {
        self.targets.values().map(|t| t.blocks.len()).sum()
    }

    /// Leading hashes of `hashes` that `target` holds in `view` or in flight.
    pub(crate) fn hits(&self, target: &str, view: Option<&TargetView>, hashes: &[u64]) -> usize {
        let flying = self.targets.get(target).map(|t| &t.blocks);
        leading(hashes, |h| {
            view.is_some_and(|v| v.contains(h)) || flying.is_some_and(|b| b.contains_key(&h))
        })
    }

    /// The best of `candidates` (target key, leading hits, fractional with lower
    /// tiers) for a request of `blocks` blocks at overlap weight `weight`.
    pub(crate) fn choose(
        &self,
        candidates: &[(&str, f64)],
        blocks: usize,
        weight: f64,
    ) -> Option<KvChoice> {
        let mut best: Option<KvChoice> = None;
        let mut best_pick = 0;
        for (index, (key, hits)) in candidates.iter().enumerate() {
            let load = self.load(key);
            let cost = weight * (blocks as f64 - hits).max(0.0) + load;
            let pick = self.last_pick.get(*key).copied().unwrap_or(0);
            let better = match &best {
                None => true,
                Some(b) => (cost, load, pick) < (b.cost, b.load, best_pick),
            };
            if better {
                best_pick = pick;
                best = Some(KvChoice {
                    index,
                    hits: *hits,
                    cost,
                    load,
                });
            }
        }
        best
    }

    /// Charges a picked request to `target`: its blocks in flight, its `missed`
    /// blocks queued for prefill, one request.
    pub(crate) fn charge(&mut self, target: &str, hashes: &[u64], missed: usize) {
        let t = self.targets.entry(target.to_owned()).or_default();
        for h in hashes {
            *t.blocks.entry(*h).or_default() += 1;
        }
        t.queued += missed;
        t.requests += 1;
        self.picks += 1;
        self.last_pick.insert(target.to_owned(), self.picks);
    }

    /// The request's first token arrived: its `missed` blocks are computed.
    pub(crate) fn prefilled(&mut self, target: &str, missed: usize) {
        if let Some(t) = self.targets.get_mut(target) {
            t.queued = t.queued.saturating_sub(missed);
        }
    }

    /// Releases what [`Self::charge`] added (`queued`: the missed blocks still
    /// queued, 0 once [`Self::prefilled`]).
    pub(crate) fn release(&mut self, target: &str, hashes: &[u64], queued: usize) {
        let Some(t) = self.targets.get_mut(target) else {
            return;
        };
        for h in hashes {
            if let Some(n) = t.blocks.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    t.blocks.remove(h);
                }
            }
        }
        t.queued = t.queued.saturating_sub(queued);
        t.requests = t.requests.saturating_sub(1);
        if t.requests == 0 {
            self.targets.remove(target);
        }
    }

    /// Forgets a target.
    pub(crate) fn remove_target(&mut self, target: &str) {
        self.targets.remove(target);
        self.last_pick.remove(target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn blocks(range: std::ops::Range<u64>) -> Vec<u64> {
        range.collect()
    }

    #[test]
    fn prefers_the_holder_until_its_queue_outweighs_the_hits() {
        let mut s = LoadState::default();
        // 40 blocks; a holds 32 of them.
        let c = s.choose(&[("a", 32.0), ("b", 0.0)], 40, 1.0).unwrap();
        assert_eq!((c.index, c.hits), (0, 32.0));
        // 30 blocks of prefill queued on a: 30 + 8 (one request) + 8 > 40.
        s.charge("a", &blocks(100..130), 30);
        assert_eq!(
            s.choose(&[("a", 32.0), ("b", 0.0)], 40, 1.0).unwrap().index,
            1
        );
        // A heavier weight brings it back: 16 + 38 < 80.
        assert_eq!(
            s.choose(&[("a", 32.0), ("b", 0.0)], 40, 2.0).unwrap().index,
            0
        );
        // Once that request's prefill is done only its seat counts: 8 + 8 < 40.
        s.prefilled("a", 30);
        assert_eq!(
            s.choose(&[("a", 32.0), ("b", 0.0)], 40, 1.0).unwrap().index,
            0
        );
    }

    #[test]
    fn a_picks_blocks_count_as_held_before_its_events_arrive() {
        let mut s = LoadState::default();
        let prompt = blocks(0..64);
        // The first request of a prefix goes to a (nobody holds it).
        s.charge("a", &prompt, 64);
        // The second shares 60 leading blocks: a holds them in flight.
        let second: Vec<u64> = (0..60).chain(1000..1004).collect();
        assert_eq!(s.hits("a", None, &second), 60);
        assert_eq!(s.hits("b", None, &second), 0);
        let a = s.hits("a", None, &second);
        // Queued 64 + one seat 8 + missing 4 = 76 > 64 on the empty b: b wins at weight 1
        // while a's prefill is queued...
        assert_eq!(
            s.choose(&[("a", a as f64), ("b", 0.0)], 64, 1.0)
                .unwrap()
                .index,
            1
        );
        // ...and a wins once it is computing tokens (the prefix is computed there).
        s.prefilled("a", 64);
        assert_eq!(
            s.choose(&[("a", a as f64), ("b", 0.0)], 64, 1.0)
                .unwrap()
                .index,
            0
        );
        // The hold ends with the request.
        s.release("a", &prompt, 0);
        assert_eq!(s.hits("a", None, &second), 0);
        assert_eq!(s.load("a"), 0.0);
    }

    #[test]
    fn a_short_shared_header_does_not_hold_a_busy_worker() {
        // Short chats: 3 blocks, the first 2 the template's header, cached on a, which
        // has a request in flight; b just joined (nothing cached, idle).
        let mut s = LoadState::default();
        s.charge("a", &[1, 2, 7], 0);
        s.prefilled("a", 0);
        let c = s.choose(&[("a", 2.0), ("b", 0.0)], 3, 4.0).unwrap();
        // 4 x 1 + 8 = 4 x 3: equal cost, and b's load is lower.
        assert_eq!(c.index, 1);
    }

    #[test]
    fn an_idle_fleet_takes_turns() {
        let mut s = LoadState::default();
        let mut picks = Vec::new();
        for _ in 0..6 {
            let c = s
                .choose(&[("a", 0.0), ("b", 0.0), ("c", 0.0)], 4, 1.0)
                .unwrap();
            let key = ["a", "b", "c"][c.index];
            // Each request ends before the next arrives.
            s.charge(key, &[1, 2, 3, 4], 4);
            s.release(key, &[1, 2, 3, 4], 4);
            picks.push(key);
        }
        assert_eq!(picks, ["a", "b", "c", "a", "b", "c"]);
    }

    #[test]
    fn requests_without_blocks_spread_by_seats() {
        let mut s = LoadState::default();
        let mut picks = Vec::new();
        for _ in 0..4 {
            let c = s.choose(&[("a", 0.0), ("b", 0.0)], 0, 1.0).unwrap();
            let key = if c.index == 0 { "a" } else { "b" };
            s.charge(key, &[], 0);
            picks.push(key);
        }
        assert_eq!(picks, vec!["a", "b", "a", "b"]);
    }

    #[test]
    fn shared_prefix_blocks_are_refcounted() {
        let mut s = LoadState::default();
        s.charge("a", &[1, 2, 3], 3);
        s.charge("a", &[1, 2, 4], 1);
        assert_eq!(s.active_blocks("a"), 4);
        assert_eq!(s.load("a"), 4.0 + 2.0 * REQUEST_COST);
        s.release("a", &[1, 2, 3], 3);
        assert_eq!(s.active_blocks("a"), 3);
        s.release("a", &[1, 2, 4], 1);
        assert_eq!(s.total_active_blocks(), 0);
        assert_eq!(s.load("a"), 0.0);
    }

    #[test]
    fn lower_tiers_count_as_held_but_for_their_load_time() {
        use infera_proto::kv_tiers::TierCost;
        let host = TierCost::measured(KvTier::Host).unwrap();
        let slow = TierCost {
            rtt_ms: 50.0,
            gbytes_per_s: 54.8,
        };
        let declared = DeclaredTiers {
            costs: vec![(KvTier::Host, host), (KvTier::Remote, slow)],
            kv_bytes_per_token: 131_072,
            prefill_ms_per_token: 0.0261,
        };
        let hashes: Vec<u64> = (0..64).collect();
        // Blocks 0-9 on the device, 10-39 in host RAM, then 40-63 in the shared store.
        let tier_of = |h: u64| match h {
            10..=39 => Some(KvTier::Host),
            40..=63 => Some(KvTier::Remote),
            _ => None,
        };
        let cover = lower_cover(&hashes, 10, 16, &declared, tier_of);
        // Host: 30 blocks nearly free (0.1 ms + 60 MiB at 54.8 GB/s = 1.25 ms, about 3 of
        // 30 blocks' recomputation); the shared store's 24 blocks behind a 50 ms round
        // trip are worth 0 (the engine recomputes them).
        let host_cost = run_cost(host, 30, 16, 131_072, 0.0261);
        assert!((cover - (30.0 - host_cost)).abs() < 1e-9, "{cover}");
        assert!(host_cost < 4.0, "{host_cost}");
        // A declared tier that holds nothing counts for nothing; nor does an undeclared one.
        assert_eq!(lower_cover(&hashes, 10, 16, &declared, |_| None), 0.0);
        let only_disk = |_| Some(KvTier::Disk);
        assert_eq!(lower_cover(&hashes, 10, 16, &declared, only_disk), 0.0);
        assert_eq!(
            lower_cover(&hashes, 10, 16, &DeclaredTiers::default(), tier_of),
            0.0
        );
        // With the cover, a target holding the prefix in RAM beats an idle one that has
        // nothing, as a device hit would, unless it is much busier.
        let mut s = LoadState::default();
        let c = s
            .choose(&[("ram", 10.0 + cover), ("idle", 0.0)], 64, 1.0)
            .unwrap();
        assert_eq!(c.index, 0);
        s.charge("ram", &[1000], 60);
        let c = s
            .choose(&[("ram", 10.0 + cover), ("idle", 0.0)], 64, 1.0)
            .unwrap();
        assert_eq!(c.index, 1);
    }

    proptest! {
        #[test]
        fn choice_has_minimal_cost_and_load(hits in proptest::collection::vec(0usize..20, 1..8), blocks in 0usize..20, w in 0.1f64..10.0, loads in proptest::collection::vec(0usize..30, 8)) {
            let mut s = LoadState::default();
            let keys: Vec<String> = (0..hits.len()).map(|i| format!("t{i}")).collect();
            for (k, l) in keys.iter().zip(&loads) {
                s.charge(k, &(0..*l as u64).collect::<Vec<_>>(), *l);
            }
            let cands: Vec<(&str, f64)> = keys.iter().map(String::as_str).zip(hits.iter().map(|h| (*h).min(blocks) as f64)).collect();
            let c = s.choose(&cands, blocks, w).unwrap();
            for (key, h) in &cands {
                let load = s.load(key);
                let cost = w * (blocks as f64 - h) + load;
                prop_assert!((c.cost, c.load) <= (cost, load));
            }
        }

        #[test]
        fn charge_then_release_restores_the_state(sets in proptest::collection::vec((proptest::collection::vec(0u64..50, 0..20), 0usize..20, any::<bool>()), 1..10)) {
            let mut s = LoadState::default();
            for (set, missed, _) in &sets { s.charge("t", set, *missed); }
            for (set, missed, done) in sets.iter().rev() {
                if *done { s.prefilled("t", *missed); }
                s.release("t", set, if *done { 0 } else { *missed });
            }
            prop_assert_eq!(s.total_active_blocks(), 0);
            prop_assert_eq!(s.load("t"), 0.0);
        }

        #[test]
        fn a_hot_prefix_stays_on_its_holder_until_its_queue_costs_more_than_recomputing(prefix in 8usize..200, question in 1usize..16, queued in 0usize..400, w in 1.0f64..8.0) {
            // a holds the prefix and has `queued` blocks of prefill waiting; b is idle.
            let mut s = LoadState::default();
            s.charge("a", &[], queued);
            let total = prefix + question;
            let c = s.choose(&[("a", prefix as f64), ("b", 0.0)], total, w).unwrap();
            let stay = w * question as f64 + queued as f64 + REQUEST_COST < w * total as f64;
            prop_assert_eq!(c.index == 0, stay);
        }
    }
}
