//! The kv-aware cost (pure). For each candidate target `t` and the request's block
//! hashes `B`:
//!
//! `cost(t) = w · (|B| − hits(t)) + load(t)`, the minimum `(cost, load)` pair wins,
//! where `hits(t)` counts the leading hashes of `B` in `t`'s view and
//! `load(t) = active_blocks(t) + recent(t)`: distinct in-flight block hashes
//! (refcounted across requests sharing a prefix, released when a request ends however it
//! ends) plus a decayed sum: on every pick each `recent` total is multiplied by 0.97
//! (values under 1e-3 dropped) and the winner is charged its missed blocks (1 when the
//! request produced no blocks). Ties keep candidate order. Cost per decision:
//! O(candidates × leading hits).

use std::collections::HashMap;

/// Decay applied to every `recent` total on each pick.
pub const RECENT_DECAY: f64 = 0.97;

/// `recent` totals below this are dropped.
pub const RECENT_FLOOR: f64 = 1e-3;

/// A scored choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvChoice {
    /// Index into the candidates.
    pub index: usize,
    /// Leading hits of the winner.
    pub hits: usize,
    /// Its cost.
    pub cost: f64,
    /// Its load.
    pub load: f64,
}

/// In-flight and recent load per target.
#[derive(Debug, Default, Clone)]
pub struct LoadState {
    recent: HashMap<String, f64>,
    active: HashMap<String, HashMap<u64, u32>>,
}

impl LoadState {
    /// `active_blocks(t) + recent(t)`.
    pub fn load(&self, target: &str) -> f64 {
        self.active.get(target).map_or(0, HashMap::len) as f64
            + self.recent.get(target).copied().unwrap_or(0.0)
    }

    /// Distinct in-flight blocks on `target`.
    pub fn active_blocks(&self, target: &str) -> usize {
        self.active.get(target).map_or(0, HashMap::len)
    }

    /// Distinct in-flight blocks over all targets.
    pub fn total_active_blocks(&self) -> usize {
        self.active.values().map(HashMap::len).sum()
    }

    /// The best of `candidates` (target key, leading hits) for a request of `blocks`
    /// blocks at overlap weight `weight`.
    pub fn choose(
        &self,
        candidates: &[(&str, usize)],
        blocks: usize,
        weight: f64,
    ) -> Option<KvChoice> {
        let mut best: Option<KvChoice> = None;
        for (index, (key, hits)) in candidates.iter().enumerate() {
            let load = self.load(key);
            let cost = weight * (blocks.saturating_sub(*hits)) as f64 + load;
            let better = match &best {
                None => true,
                Some(b) => (cost, load) < (b.cost, b.load),
            };
            if better {
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

    /// Decays every `recent` total and charges the winner its missed blocks.
    pub fn record_pick(&mut self, winner: &str, blocks: usize, hits: usize) {
        self.recent.retain(|_, v| {
            *v *= RECENT_DECAY;
            *v >= RECENT_FLOOR
        });
        let missed = if blocks == 0 {
            1
        } else {
            blocks.saturating_sub(hits)
        };
        *self.recent.entry(winner.to_owned()).or_default() += missed as f64;
    }

    /// Adds a request's blocks to `target`'s in-flight set.
    pub fn charge(&mut self, target: &str, hashes: &[u64]) {
        let active = self.active.entry(target.to_owned()).or_default();
        for h in hashes {
            *active.entry(*h).or_default() += 1;
        }
    }

    /// Releases what [`Self::charge`] added.
    pub fn release(&mut self, target: &str, hashes: &[u64]) {
        if let Some(active) = self.active.get_mut(target) {
            for h in hashes {
                if let Some(n) = active.get_mut(h) {
                    *n -= 1;
                    if *n == 0 {
                        active.remove(h);
                    }
                }
            }
            if active.is_empty() {
                self.active.remove(target);
            }
        }
    }

    /// Forgets a target.
    pub fn remove_target(&mut self, target: &str) {
        self.recent.remove(target);
        self.active.remove(target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn prefers_the_holder_until_load_outweighs_the_hits() {
        let mut s = LoadState::default();
        // 10 blocks; a holds 8 of them.
        let c = s.choose(&[("a", 8), ("b", 0)], 10, 1.0).unwrap();
        assert_eq!((c.index, c.hits), (0, 8));
        // Load a with in-flight work: 9 distinct active blocks > the 8-block saving.
        s.charge("a", &(100..109).collect::<Vec<_>>());
        assert_eq!(s.choose(&[("a", 8), ("b", 0)], 10, 1.0).unwrap().index, 1);
        // A heavier weight brings it back.
        assert_eq!(s.choose(&[("a", 8), ("b", 0)], 10, 2.0).unwrap().index, 0);
    }

    #[test]
    fn recent_load_decays_and_spreads_requests_without_blocks() {
        let mut s = LoadState::default();
        let mut picks = Vec::new();
        for _ in 0..4 {
            let c = s.choose(&[("a", 0), ("b", 0)], 0, 1.0).unwrap();
            let key = if c.index == 0 { "a" } else { "b" };
            s.record_pick(key, 0, 0);
            picks.push(key);
        }
        assert_eq!(picks, vec!["a", "b", "a", "b"]);
        for _ in 0..400 {
            s.record_pick("b", 0, 0);
        }
        assert_eq!(
            s.recent.get("a"),
            None,
            "a's recent total decayed below the floor and was dropped"
        );
    }

    #[test]
    fn shared_prefix_blocks_are_refcounted() {
        let mut s = LoadState::default();
        s.charge("a", &[1, 2, 3]);
        s.charge("a", &[1, 2, 4]);
        assert_eq!(s.active_blocks("a"), 4);
        s.release("a", &[1, 2, 3]);
        assert_eq!(s.active_blocks("a"), 3);
        s.release("a", &[1, 2, 4]);
        assert_eq!(s.total_active_blocks(), 0);
    }

    proptest! {
        #[test]
        fn choice_has_minimal_cost_and_load(hits in proptest::collection::vec(0usize..20, 1..8), blocks in 0usize..20, w in 0.1f64..10.0, loads in proptest::collection::vec(0u64..30, 8)) {
            let mut s = LoadState::default();
            let keys: Vec<String> = (0..hits.len()).map(|i| format!("t{i}")).collect();
            for (k, l) in keys.iter().zip(&loads) {
                s.charge(k, &(0..*l).collect::<Vec<_>>());
            }
            let cands: Vec<(&str, usize)> = keys.iter().map(String::as_str).zip(hits.iter().map(|h| (*h).min(blocks))).collect();
            let c = s.choose(&cands, blocks, w).unwrap();
            for (key, h) in &cands {
                let load = s.load(key);
                let cost = w * (blocks - h) as f64 + load;
                prop_assert!((c.cost, c.load) <= (cost, load));
            }
        }

        #[test]
        fn charge_then_release_restores_the_state(sets in proptest::collection::vec(proptest::collection::vec(0u64..50, 0..20), 1..10)) {
            let mut s = LoadState::default();
            for set in &sets { s.charge("t", set); }
            for set in sets.iter().rev() { s.release("t", set); }
            prop_assert_eq!(s.total_active_blocks(), 0);
        }
    }
}
