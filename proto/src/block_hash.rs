//! The router's prompt block-hash chain.
//!
//! The router never trusts engine hashes for matching; it hashes token blocks itself:
//! `h_i = XXH3_64(seed 0, h_{i-1} as 8-byte little-endian ‖ block token ids as u32
//! little-endian)`, with `h_{-1} = 0`. Blocks are `block_size` tokens (the worker's
//! registered `kv_block_size`); a trailing partial block is dropped, since engines
//! only cache full blocks. Cost: one XXH3 pass over the prompt, O(tokens).
//!
//! Test vectors in `testdata/block_hash_vectors.json` were computed independently with
//! Python's `xxhash` package by `testdata/make_block_hash_vectors.py`.

use xxhash_rust::xxh3::xxh3_64;

/// One block's hash in the router's chain.
pub type RouterBlockHash = u64;

/// The chain value before the first block.
pub const CHAIN_ROOT: RouterBlockHash = 0;

/// Hashes one full block of `tokens` given the hash of the block before it.
pub fn compute_block_hash(parent: RouterBlockHash, tokens: &[u32]) -> RouterBlockHash {
    let mut bytes = Vec::with_capacity(8 + tokens.len() * 4);
    bytes.extend_from_slice(&parent.to_le_bytes());
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    xxh3_64(&bytes)
}

/// Hashes every full block of `tokens` at `block_size`, in order.
///
/// Returns an empty list when `block_size` is 0 or the prompt is shorter than one block.
pub fn compute_block_hashes(tokens: &[u32], block_size: usize) -> Vec<RouterBlockHash> {
    compute_block_hashes_from(CHAIN_ROOT, tokens, block_size)
}

/// Continues a chain from `parent` over the full blocks of `tokens`.
///
/// Used when a KV event stores blocks whose parent is already known to the index.
pub fn compute_block_hashes_from(
    parent: RouterBlockHash,
    tokens: &[u32],
    block_size: usize,
) -> Vec<RouterBlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut prev = parent;
    for block in tokens.chunks_exact(block_size) {
        prev = compute_block_hash(prev, block);
        out.push(prev);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Vector {
        tokens: Vec<u32>,
        block_size: usize,
        hashes: Vec<String>,
    }

    fn vectors() -> Vec<Vector> {
        serde_json::from_str(include_str!("../testdata/block_hash_vectors.json")).unwrap()
    }

    #[test]
    fn matches_python_xxhash_vectors() {
        let vectors = vectors();
        assert!(vectors.len() >= 6, "vector file lost its cases");
        for v in vectors {
            let got: Vec<String> = compute_block_hashes(&v.tokens, v.block_size)
                .iter()
                .map(|h| format!("{h:016x}"))
                .collect();
            assert_eq!(
                got, v.hashes,
                "block_size {} tokens {:?}",
                v.block_size, v.tokens
            );
        }
    }

    #[test]
    fn trailing_partial_block_is_dropped() {
        let tokens: Vec<u32> = (0..10).collect();
        let hashes = compute_block_hashes(&tokens, 4);
        assert_eq!(hashes.len(), 2);
        assert_eq!(hashes, compute_block_hashes(&tokens[..8], 4));
    }

    #[test]
    fn chain_continues_from_a_parent() {
        let tokens: Vec<u32> = (100..132).collect();
        let all = compute_block_hashes(&tokens, 8);
        let tail = compute_block_hashes_from(all[1], &tokens[16..], 8);
        assert_eq!(&all[2..], &tail[..]);
    }

    #[test]
    fn zero_block_size_yields_nothing() {
        assert!(compute_block_hashes(&[1, 2, 3], 0).is_empty());
    }

    #[test]
    fn same_block_under_different_parents_differs() {
        let block = [7u32; 4];
        assert_ne!(compute_block_hash(0, &block), compute_block_hash(1, &block));
    }
}
