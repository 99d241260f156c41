//! The prefix index: which router block hashes each routing target (a worker, or one
//! data-parallel rank of it) holds, fed by the engines' KV events.
//!
//! Engines identify blocks by their own hashes, which the router never trusts for
//! matching: each stored block's `token_ids` are re-hashed into the router's chain
//! (`infera_proto::block_hash`), starting from the parent's router hash, which a
//! per-target map from engine hash to router hash provides. A block whose parent is
//! unknown is dropped (counted): its chain position cannot be known. LoRA blocks live in
//! their own namespace (the chain root is seeded by the adapter name).
//!
//! Tiers: an event's `medium` says where the block is ([`KvTier::from_medium`]: the
//! engine's memory, or host RAM, NVMe or a shared store below it, as a KV connector
//! reports its writes). Each indexed block carries the set of tiers holding it; a
//! removal clears only its own tier, and a block leaves the view (and its engine hash
//! the map) once no tier holds it, so a child stored later still finds its parent.
//! `AllBlocksCleared` is the engine's prefix-cache reset: it clears the device tier.
//! Blocks in the shared tier are also kept per model, since every worker of the model
//! that declares the tier reaches them, whoever stored them.
//!
//! Memory: engine hashes are folded to 64 bits, so each indexed block costs one entry in
//! a `HashMap<u64, u8>` and one in a `HashMap<u64, u64>` (~30-40 bytes with table
//! overhead; see [`PrefixIndex::bytes_per_block`]). Lookups are O(1) per block; counting
//! a request's hits is O(leading hits).

use infera_proto::block_hash::compute_block_hash;
use infera_proto::kv_events::{EngineBlockHash, KvEvent};
use infera_proto::kv_tiers::KvTier;
use std::collections::{HashMap, HashSet};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Why (part of) an event was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum IndexSkip {
    /// A stored block's parent is not in the view.
    UnknownParent,
    /// The event's block size differs from the worker's registered `kv_block_size`.
    BlockSizeMismatch,
    /// A group whose blocks are not a reusable prefix (Mamba, sliding window).
    NonPrefixGroup,
    /// `token_ids` is not a whole number of blocks.
    PartialTokens,
    /// A `medium` this version does not know.
    UnknownMedium,
}

impl IndexSkip {
    /// Metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::UnknownParent => "unknown_parent",
            Self::BlockSizeMismatch => "block_size_mismatch",
            Self::NonPrefixGroup => "non_prefix_group",
            Self::PartialTokens => "partial_tokens",
            Self::UnknownMedium => "unknown_medium",
        }
    }
}

/// The chain root of a LoRA namespace (0 for the base model).
pub(crate) fn namespace_root(lora: Option<&str>) -> u64 {
    lora.map_or(0, |name| xxh3_64(name.as_bytes()))
}

fn fold(hash: &EngineBlockHash) -> u64 {
    match hash {
        EngineBlockHash::Int(i) => xxh3_64_with_seed(&i.to_le_bytes(), 0x1d),
        EngineBlockHash::Bytes(b) => xxh3_64_with_seed(b, 0x1d),
    }
}

/// One target's view: each block it holds, with the tiers holding it (a bit each).
#[derive(Debug, Default, Clone)]
pub(crate) struct TargetView {
    blocks: HashMap<u64, u8>,
    engine_to_router: HashMap<u64, u64>,
}

const DEVICE: u8 = 1 << (KvTier::Device as u8);

impl TargetView {
    /// Blocks held in the engine's own memory.
    pub(crate) fn len(&self) -> usize {
        self.blocks.values().filter(|m| *m & DEVICE != 0).count()
    }

    /// Blocks held on `tier`.
    pub(crate) fn len_on(&self, tier: KvTier) -> usize {
        self.blocks
            .values()
            .filter(|m| *m & tier.bit() != 0)
            .count()
    }

    /// Whether block `hash` is in the engine's own memory.
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.blocks.get(&hash).is_some_and(|m| m & DEVICE != 0)
    }

    /// Whether block `hash` is on `tier`.
    pub(crate) fn holds_on(&self, hash: u64, tier: KvTier) -> bool {
        self.blocks.get(&hash).is_some_and(|m| m & tier.bit() != 0)
    }

    /// Leading hashes of `hashes` in the engine's own memory.
    pub(crate) fn leading_hits(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.contains(**h)).count()
    }

    /// Records blocks directly (approximate mode: the router's own picks).
    pub(crate) fn insert_router_blocks(&mut self, hashes: &[u64]) {
        for h in hashes {
            *self.blocks.entry(*h).or_default() |= DEVICE;
        }
    }

    /// Clears `bits` of every block; drops blocks no tier holds.
    fn clear_bits(&mut self, bits: u8) {
        self.blocks.retain(|_, m| {
            *m &= !bits;
            *m != 0
        });
        let blocks = &self.blocks;
        self.engine_to_router.retain(|_, r| blocks.contains_key(r));
    }
}

/// Every target's view, and the blocks of each model's shared tier.
#[derive(Debug, Default)]
pub(crate) struct PrefixIndex {
    views: HashMap<String, TargetView>,
    shared: HashMap<String, HashSet<u64>>,
}

impl PrefixIndex {
    /// An empty index.
    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A target's view, if it has one.
    pub(crate) fn view(&self, target: &str) -> Option<&TargetView> {
        self.views.get(target)
    }

    /// A target's view, created empty if needed.
    pub(crate) fn view_mut(&mut self, target: &str) -> &mut TargetView {
        self.views.entry(target.to_owned()).or_default()
    }

    /// Leading hits of `hashes` on `target`.
    pub(crate) fn hits(&self, target: &str, hashes: &[u64]) -> usize {
        self.views.get(target).map_or(0, |v| v.leading_hits(hashes))
    }

    /// Whether `model`'s shared tier holds block `hash`.
    pub(crate) fn shared_holds(&self, model: &str, hash: u64) -> bool {
        self.shared.get(model).is_some_and(|s| s.contains(&hash))
    }

    /// Forgets every target whose key starts with `worker_id` (the worker and its ranks).
    pub(crate) fn remove_worker(&mut self, worker_id: &str) {
        self.views.retain(|k, _| {
            k != worker_id
                && !k
                    .strip_prefix(worker_id)
                    .is_some_and(|r| r.starts_with("#dp"))
        });
    }

    /// Blocks indexed in all.
    pub(crate) fn total_blocks(&self) -> usize {
        self.views.values().map(TargetView::len).sum()
    }

    /// Approximate heap bytes per indexed block (table slots of both maps, with
    /// hashbrown's one control byte per slot).
    pub(crate) fn bytes_per_block(&self) -> f64 {
        let blocks = self.total_blocks();
        if blocks == 0 {
            return 0.0;
        }
        let bytes: usize = self
            .views
            .values()
            .map(|v| v.blocks.capacity() * 10 + v.engine_to_router.capacity() * 17)
            .sum();
        bytes as f64 / blocks as f64
    }

    /// Applies one event to `target` (a worker of `model`), whose engine pages are
    /// `block_size` tokens. Returns what was skipped (empty when everything applied).
    pub(crate) fn apply(
        &mut self,
        target: &str,
        block_size: u32,
        model: &str,
        event: &KvEvent,
    ) -> Vec<IndexSkip> {
        let view = self.views.entry(target.to_owned()).or_default();
        match event {
            KvEvent::AllBlocksCleared => {
                view.clear_bits(DEVICE);
                Vec::new()
            }
            KvEvent::BlockRemoved(r) => {
                let Some(tier) = KvTier::from_medium(r.medium.as_deref()) else {
                    return vec![IndexSkip::UnknownMedium];
                };
                for h in &r.block_hashes {
                    let engine = fold(h);
                    let Some(router) = view.engine_to_router.get(&engine).copied() else {
                        continue;
                    };
                    if tier == KvTier::Remote
                        && let Some(shared) = self.shared.get_mut(model)
                    {
                        shared.remove(&router);
                    }
                    let gone = match view.blocks.get_mut(&router) {
                        Some(mask) => {
                            *mask &= !tier.bit();
                            *mask == 0
                        }
                        None => true,
                    };
                    if gone {
                        view.blocks.remove(&router);
                        view.engine_to_router.remove(&engine);
                    }
                }
                Vec::new()
            }
            KvEvent::BlockStored(s) => {
                if !s.is_prefix_cache_kind() {
                    return vec![IndexSkip::NonPrefixGroup];
                }
                let Some(tier) = KvTier::from_medium(s.medium.as_deref()) else {
                    return vec![IndexSkip::UnknownMedium];
                };
                if s.block_size != block_size || block_size == 0 {
                    return vec![IndexSkip::BlockSizeMismatch];
                }
                let bs = block_size as usize;
                if s.token_ids.len() != s.block_hashes.len() * bs {
                    return vec![IndexSkip::PartialTokens];
                }
                let mut prev = match &s.parent_block_hash {
                    None => namespace_root(s.lora_name.as_deref()),
                    Some(p) => match view.engine_to_router.get(&fold(p)) {
                        Some(r) => *r,
                        None => return vec![IndexSkip::UnknownParent],
                    },
                };
                for (engine, tokens) in s.block_hashes.iter().zip(s.token_ids.chunks_exact(bs)) {
                    prev = compute_block_hash(prev, tokens);
                    *view.blocks.entry(prev).or_default() |= tier.bit();
                    view.engine_to_router.insert(fold(engine), prev);
                    if tier == KvTier::Remote {
                        self.shared
                            .entry(model.to_owned())
                            .or_default()
                            .insert(prev);
                    }
                }
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infera_proto::block_hash::compute_block_hashes;
    use infera_proto::kv_events::{BlockRemoved, BlockStored};

    fn stored(
        hashes: &[i128],
        parent: Option<i128>,
        tokens: std::ops::Range<u32>,
        bs: u32,
    ) -> KvEvent {
        KvEvent::BlockStored(BlockStored {
            block_hashes: hashes.iter().map(|h| EngineBlockHash::Int(*h)).collect(),
            parent_block_hash: parent.map(EngineBlockHash::Int),
            token_ids: tokens.collect(),
            block_size: bs,
            ..Default::default()
        })
    }

    #[test]
    fn stored_blocks_are_rehashed_into_the_router_chain() {
        let mut idx = PrefixIndex::new();
        assert!(
            idx.apply("w", 4, "m", &stored(&[100, 101], None, 0..8, 4))
                .is_empty()
        );
        // The continuation names its parent by engine hash.
        assert!(
            idx.apply("w", 4, "m", &stored(&[102], Some(101), 8..12, 4))
                .is_empty()
        );
        let prompt: Vec<u32> = (0..14).collect();
        let hashes = compute_block_hashes(&prompt, 4);
        assert_eq!(idx.hits("w", &hashes), 3);
        assert_eq!(idx.hits("other", &hashes), 0);
    }

    #[test]
    fn removed_and_cleared_blocks_stop_matching() {
        let mut idx = PrefixIndex::new();
        idx.apply("w", 4, "m", &stored(&[1, 2, 3], None, 0..12, 4));
        let hashes = compute_block_hashes(&(0..12).collect::<Vec<_>>(), 4);
        idx.apply(
            "w",
            4,
            "m",
            &KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![EngineBlockHash::Int(2)],
                ..Default::default()
            }),
        );
        assert_eq!(
            idx.hits("w", &hashes),
            1,
            "hits stop at the first missing block"
        );
        idx.apply("w", 4, "m", &KvEvent::AllBlocksCleared);
        assert_eq!(idx.hits("w", &hashes), 0);
        assert_eq!(idx.view("w").unwrap().len(), 0);
    }

    #[test]
    fn skips_are_reported_not_silent() {
        let mut idx = PrefixIndex::new();
        assert_eq!(
            idx.apply("w", 4, "m", &stored(&[9], Some(77), 0..4, 4)),
            vec![IndexSkip::UnknownParent]
        );
        assert_eq!(
            idx.apply("w", 16, "m", &stored(&[9], None, 0..4, 4)),
            vec![IndexSkip::BlockSizeMismatch]
        );
        assert_eq!(
            idx.apply("w", 4, "m", &stored(&[9, 10], None, 0..6, 4)),
            vec![IndexSkip::PartialTokens]
        );
        let mamba = KvEvent::BlockStored(BlockStored {
            block_hashes: vec![EngineBlockHash::Int(1)],
            token_ids: (0..4).collect(),
            block_size: 4,
            kv_cache_spec_kind: Some("mamba".into()),
            ..Default::default()
        });
        assert_eq!(
            idx.apply("w", 4, "m", &mamba),
            vec![IndexSkip::NonPrefixGroup]
        );
        assert_eq!(idx.total_blocks(), 0);
    }

    #[test]
    fn lora_blocks_live_in_their_own_namespace() {
        let mut idx = PrefixIndex::new();
        let lora = KvEvent::BlockStored(BlockStored {
            block_hashes: vec![EngineBlockHash::Int(5)],
            token_ids: (0..4).collect(),
            block_size: 4,
            lora_name: Some("fixture-adapter".into()),
            ..Default::default()
        });
        idx.apply("w", 4, "m", &lora);
        let base = compute_block_hashes(&(0..4).collect::<Vec<_>>(), 4);
        assert_eq!(
            idx.hits("w", &base),
            0,
            "a base-model request does not hit adapter blocks"
        );
        let adapter = infera_proto::block_hash::compute_block_hashes_from(
            namespace_root(Some("fixture-adapter")),
            &(0..4).collect::<Vec<_>>(),
            4,
        );
        assert_eq!(idx.hits("w", &adapter), 1);
    }

    fn on(event: KvEvent, medium: &str) -> KvEvent {
        match event {
            KvEvent::BlockStored(mut s) => {
                s.medium = Some(medium.into());
                KvEvent::BlockStored(s)
            }
            KvEvent::BlockRemoved(mut r) => {
                r.medium = Some(medium.into());
                KvEvent::BlockRemoved(r)
            }
            other => other,
        }
    }

    fn removed(hashes: &[i128]) -> KvEvent {
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes.iter().map(|h| EngineBlockHash::Int(*h)).collect(),
            ..Default::default()
        })
    }

    #[test]
    fn each_tier_holds_a_block_until_its_own_removal() {
        let mut idx = PrefixIndex::new();
        let hashes = compute_block_hashes(&(0..12).collect::<Vec<_>>(), 4);
        idx.apply("w", 4, "m", &stored(&[1, 2, 3], None, 0..12, 4));
        idx.apply("w", 4, "m", &on(stored(&[1, 2, 3], None, 0..12, 4), "CPU"));
        // The engine evicts block 2: host RAM still holds it, the device does not.
        idx.apply("w", 4, "m", &removed(&[2]));
        let v = idx.view("w").unwrap();
        assert_eq!(v.leading_hits(&hashes), 1);
        assert!(v.holds_on(hashes[1], KvTier::Host) && !v.contains(hashes[1]));
        // A child stored later on the device still finds its parent (kept by the host tier).
        assert!(
            idx.apply("w", 4, "m", &stored(&[4], Some(3), 12..16, 4))
                .is_empty()
        );
        // A reset clears the device tier only.
        idx.apply("w", 4, "m", &KvEvent::AllBlocksCleared);
        let v = idx.view("w").unwrap();
        assert_eq!((v.len(), v.len_on(KvTier::Host)), (0, 3));
        // kvd dropped them: gone from the view.
        idx.apply("w", 4, "m", &on(removed(&[1, 2, 3]), "CPU"));
        assert_eq!(idx.view("w").unwrap().len_on(KvTier::Host), 0);
        assert_eq!(
            idx.apply("w", 4, "m", &on(stored(&[9], None, 0..4, 4), "TAPE")),
            vec![IndexSkip::UnknownMedium]
        );
    }

    #[test]
    fn the_shared_tier_is_the_models_whoever_stored_it() {
        let mut idx = PrefixIndex::new();
        let hashes = compute_block_hashes(&(0..8).collect::<Vec<_>>(), 4);
        idx.apply("a", 4, "m", &on(stored(&[1, 2], None, 0..8, 4), "REMOTE"));
        assert!(idx.shared_holds("m", hashes[0]) && idx.shared_holds("m", hashes[1]));
        assert!(!idx.shared_holds("other-model", hashes[0]));
        // The worker that stored them goes away: the store still holds them.
        idx.remove_worker("a");
        assert!(idx.shared_holds("m", hashes[1]));
        idx.apply("b", 4, "m", &on(stored(&[7, 8], None, 0..8, 4), "REMOTE"));
        idx.apply("b", 4, "m", &on(removed(&[8]), "REMOTE"));
        assert!(idx.shared_holds("m", hashes[0]) && !idx.shared_holds("m", hashes[1]));
    }

    #[test]
    fn removing_a_worker_drops_its_ranks_only() {
        let mut idx = PrefixIndex::new();
        for key in ["a:1", "a:1#dp0", "a:1#dp1", "a:10"] {
            idx.apply(key, 4, "m", &stored(&[1], None, 0..4, 4));
        }
        idx.remove_worker("a:1");
        assert!(idx.view("a:1").is_none() && idx.view("a:1#dp1").is_none());
        assert!(idx.view("a:10").is_some());
    }
}
