//! The simulated paged KV cache with prefix caching.
//!
//! `capacity` blocks of `block_size` tokens. A block that is full is identified by a
//! chained hash of every token up to its end (seeded per LoRA adapter), so two requests
//! sharing a prefix share its blocks. Blocks referenced by running requests are pinned;
//! unreferenced cached blocks stay reusable until space is needed, then the least
//! recently used is evicted. A request's partial (or not yet committed) blocks are
//! private and counted separately.
//!
//! Costs: prefix match O(blocks in the prompt) hash lookups; eviction O(log n) through
//! an ordered LRU set. The pool records stored and removed blocks for KV events.

use std::collections::{BTreeSet, HashMap};

/// A block's chain hash (the cache key).
pub type BlockKey = u64;

/// What happened to cached blocks, for KV events.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolEvent {
    /// A block became cached.
    Stored {
        /// Its key.
        key: BlockKey,
        /// The key of the block before it, if any.
        parent: Option<BlockKey>,
        /// Its tokens.
        tokens: Vec<u32>,
    },
    /// A cached block was evicted.
    Removed {
        /// Its key.
        key: BlockKey,
    },
}

#[derive(Debug)]
struct CachedBlock {
    refs: u32,
    last_used: u64,
}

/// The cache.
#[derive(Debug)]
pub struct BlockPool {
    capacity: usize,
    cached: HashMap<BlockKey, CachedBlock>,
    lru: BTreeSet<(u64, BlockKey)>,
    private_used: usize,
    tick: u64,
    events: Vec<PoolEvent>,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            cached: HashMap::new(),
            lru: BTreeSet::new(),
            private_used: 0,
            tick: 0,
            events: Vec::new(),
            evictions: 0,
        }
    }

    /// Total blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks neither cached nor privately held.
    pub fn free(&self) -> usize {
        self.capacity
            .saturating_sub(self.cached.len() + self.private_used)
    }

    /// Blocks that could be made free (free plus unreferenced cached).
    pub fn available(&self) -> usize {
        self.free() + self.lru.len()
    }

    /// Blocks in use by running requests (pinned cached + private).
    pub fn used(&self) -> usize {
        self.cached.len() - self.lru.len() + self.private_used
    }

    /// Evictions so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// How many of `keys`, from the start, are cached.
    pub fn match_prefix(&self, keys: &[BlockKey]) -> usize {
        keys.iter()
            .take_while(|k| self.cached.contains_key(k))
            .count()
    }

    /// Pins cached blocks for a request (they must all be cached).
    pub fn acquire(&mut self, keys: &[BlockKey]) {
        self.tick += 1;
        for key in keys {
            if let Some(block) = self.cached.get_mut(key) {
                if block.refs == 0 {
                    self.lru.remove(&(block.last_used, *key));
                }
                block.refs += 1;
                block.last_used = self.tick;
            }
        }
    }

    /// Takes `n` private blocks, evicting unreferenced cached blocks (oldest first) as
    /// needed. Returns false, taking nothing, if they cannot be found.
    pub fn allocate(&mut self, n: usize) -> bool {
        if n > self.available() {
            return false;
        }
        while self.free() < n {
            let Some(&(tick, key)) = self.lru.iter().next() else {
                return false;
            };
            self.lru.remove(&(tick, key));
            self.cached.remove(&key);
            self.evictions += 1;
            self.events.push(PoolEvent::Removed { key });
        }
        self.private_used += n;
        true
    }

    /// Turns one private block, now full, into the cached block `key` (pinned by the
    /// caller). If another request cached the same block meanwhile, the private block is
    /// released and the existing one pinned instead.
    pub fn commit(&mut self, key: BlockKey, parent: Option<BlockKey>, tokens: &[u32]) {
        self.private_used = self.private_used.saturating_sub(1);
        self.tick += 1;
        if let Some(block) = self.cached.get_mut(&key) {
            if block.refs == 0 {
                self.lru.remove(&(block.last_used, key));
            }
            block.refs += 1;
            block.last_used = self.tick;
            return;
        }
        self.cached.insert(
            key,
            CachedBlock {
                refs: 1,
                last_used: self.tick,
            },
        );
        self.events.push(PoolEvent::Stored {
            key,
            parent,
            tokens: tokens.to_vec(),
        });
    }

    /// Unpins a request's cached blocks and frees its private ones.
    pub fn release(&mut self, keys: &[BlockKey], private: usize) {
        self.tick += 1;
        for key in keys {
            if let Some(block) = self.cached.get_mut(key) {
                block.refs = block.refs.saturating_sub(1);
                if block.refs == 0 {
                    block.last_used = self.tick;
                    self.lru.insert((self.tick, *key));
                }
            }
        }
        self.private_used = self.private_used.saturating_sub(private);
    }

    /// Drops every unreferenced cached block (an engine's cache reset).
    pub fn clear_unreferenced(&mut self) -> usize {
        let keys: Vec<BlockKey> = self.lru.iter().map(|(_, k)| *k).collect();
        for key in &keys {
            self.cached.remove(key);
        }
        self.lru.clear();
        keys.len()
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Vec<PoolEvent> {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored_keys(events: &[PoolEvent]) -> Vec<BlockKey> {
        events
            .iter()
            .filter_map(|e| match e {
                PoolEvent::Stored { key, .. } => Some(*key),
                PoolEvent::Removed { .. } => None,
            })
            .collect()
    }

    #[test]
    fn committed_blocks_are_shared_and_reported_once() {
        let mut pool = BlockPool::new(4);
        assert!(pool.allocate(2));
        pool.commit(10, None, &[1, 2]);
        pool.commit(11, Some(10), &[3, 4]);
        assert_eq!(stored_keys(&pool.take_events()), vec![10, 11]);
        assert_eq!(pool.match_prefix(&[10, 11, 12]), 2);
        // A second request reuses both blocks.
        pool.acquire(&[10, 11]);
        assert_eq!(pool.used(), 2);
        pool.release(&[10, 11], 0);
        pool.release(&[10, 11], 0);
        assert_eq!(pool.used(), 0);
        assert_eq!(pool.available(), 4);
        assert_eq!(
            pool.match_prefix(&[10, 11]),
            2,
            "released blocks stay cached"
        );
    }

    #[test]
    fn evicts_least_recently_used_unreferenced_blocks() {
        let mut pool = BlockPool::new(3);
        for key in [1, 2, 3] {
            assert!(pool.allocate(1));
            pool.commit(key, None, &[key as u32]);
            pool.release(&[key], 0);
        }
        pool.take_events();
        pool.acquire(&[1]); // 1 becomes pinned, 2 is now the oldest unreferenced
        assert!(pool.allocate(1));
        assert_eq!(pool.take_events(), vec![PoolEvent::Removed { key: 2 }]);
        assert_eq!(pool.match_prefix(&[2]), 0);
        assert_eq!(pool.evictions(), 1);
        // Pinned and private blocks are never evicted.
        assert!(!pool.allocate(2), "only block 3 is evictable");
        assert!(pool.allocate(1));
        assert!(!pool.allocate(1));
    }

    #[test]
    fn a_duplicate_commit_pins_the_existing_block() {
        let mut pool = BlockPool::new(4);
        assert!(pool.allocate(2));
        pool.commit(7, None, &[1]);
        pool.commit(7, None, &[1]);
        assert_eq!(stored_keys(&pool.take_events()), vec![7]);
        assert_eq!(pool.used(), 1);
        pool.release(&[7], 0);
        assert_eq!(pool.used(), 1, "still referenced once");
        pool.release(&[7], 0);
        assert_eq!(pool.used(), 0);
    }
}
