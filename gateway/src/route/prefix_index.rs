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
//! Memory: engine hashes are folded to 64 bits, so each indexed block costs one entry in
//! a `HashSet<u64>` and one in a `HashMap<u64, u64>` (~30-40 bytes with table overhead;
//! see [`PrefixIndex::bytes_per_block`]). Lookups are O(1) per block; counting a
//! request's hits is O(leading hits).

use infera_proto::block_hash::compute_block_hash;
use infera_proto::kv_events::{EngineBlockHash, KvEvent};
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
}

impl IndexSkip {
    /// Metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::UnknownParent => "unknown_parent",
            Self::BlockSizeMismatch => "block_size_mismatch",
            Self::NonPrefixGroup => "non_prefix_group",
            Self::PartialTokens => "partial_tokens",
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

/// One target's view.
#[derive(Debug, Default, Clone)]
pub(crate) struct TargetView {
    blocks: HashSet<u64>,
    engine_to_router: HashMap<u64, u64>,
}

impl TargetView {
    /// Blocks held.
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether block `hash` is held.
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.blocks.contains(&hash)
    }

    /// Leading hashes of `hashes` held.
    pub(crate) fn leading_hits(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.blocks.contains(h))
            .count()
    }

    /// Records blocks directly (approximate mode: the router's own picks).
    pub(crate) fn insert_router_blocks(&mut self, hashes: &[u64]) {
        self.blocks.extend(hashes.iter().copied());
    }
}

/// Every target's view.
#[derive(Debug, Default)]
pub(crate) struct PrefixIndex {
    views: HashMap<String, TargetView>,
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
            .map(|v| v.blocks.capacity() * 9 + v.engine_to_router.capacity() * 17)
            .sum();
        bytes as f64 / blocks as f64
    }

    /// Applies one event to `target`, whose engine pages are `block_size` tokens.
    /// Returns what was skipped (empty when everything applied).
    pub(crate) fn apply(
        &mut self,
        target: &str,
        block_size: u32,
        event: &KvEvent,
    ) -> Vec<IndexSkip> {
        let view = self.views.entry(target.to_owned()).or_default();
        match event {
            KvEvent::AllBlocksCleared => {
                view.blocks.clear();
                view.engine_to_router.clear();
                Vec::new()
            }
            KvEvent::BlockRemoved(r) => {
                for h in &r.block_hashes {
                    if let Some(router) = view.engine_to_router.remove(&fold(h)) {
                        view.blocks.remove(&router);
                    }
                }
                Vec::new()
            }
            KvEvent::BlockStored(s) => {
                if !s.is_prefix_cache_kind() {
                    return vec![IndexSkip::NonPrefixGroup];
                }
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
                    view.blocks.insert(prev);
                    view.engine_to_router.insert(fold(engine), prev);
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
            idx.apply("w", 4, &stored(&[100, 101], None, 0..8, 4))
                .is_empty()
        );
        // The continuation names its parent by engine hash.
        assert!(
            idx.apply("w", 4, &stored(&[102], Some(101), 8..12, 4))
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
        idx.apply("w", 4, &stored(&[1, 2, 3], None, 0..12, 4));
        let hashes = compute_block_hashes(&(0..12).collect::<Vec<_>>(), 4);
        idx.apply(
            "w",
            4,
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
        idx.apply("w", 4, &KvEvent::AllBlocksCleared);
        assert_eq!(idx.hits("w", &hashes), 0);
        assert_eq!(idx.view("w").unwrap().len(), 0);
    }

    #[test]
    fn skips_are_reported_not_silent() {
        let mut idx = PrefixIndex::new();
        assert_eq!(
            idx.apply("w", 4, &stored(&[9], Some(77), 0..4, 4)),
            vec![IndexSkip::UnknownParent]
        );
        assert_eq!(
            idx.apply("w", 16, &stored(&[9], None, 0..4, 4)),
            vec![IndexSkip::BlockSizeMismatch]
        );
        assert_eq!(
            idx.apply("w", 4, &stored(&[9, 10], None, 0..6, 4)),
            vec![IndexSkip::PartialTokens]
        );
        let mamba = KvEvent::BlockStored(BlockStored {
            block_hashes: vec![EngineBlockHash::Int(1)],
            token_ids: (0..4).collect(),
            block_size: 4,
            kv_cache_spec_kind: Some("mamba".into()),
            ..Default::default()
        });
        assert_eq!(idx.apply("w", 4, &mamba), vec![IndexSkip::NonPrefixGroup]);
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
        idx.apply("w", 4, &lora);
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

    #[test]
    fn removing_a_worker_drops_its_ranks_only() {
        let mut idx = PrefixIndex::new();
        for key in ["a:1", "a:1#dp0", "a:1#dp1", "a:10"] {
            idx.apply(key, 4, &stored(&[1], None, 0..4, 4));
        }
        idx.remove_worker("a:1");
        assert!(idx.view("a:1").is_none() && idx.view("a:1#dp1").is_none());
        assert!(idx.view("a:10").is_some());
    }
}
