#!/usr/bin/env python3
"""Writes block_hash_vectors.json: the router's block-hash chain computed with
Python's xxhash package (pip install xxhash), independently of the Rust code.

h_i = XXH3_64(seed 0, h_{i-1} as u64 LE || block token ids as u32 LE), h_{-1} = 0,
trailing partial block dropped. Run from this folder: python3 make_block_hash_vectors.py
"""
import json
import struct

import xxhash


def chain(tokens, block_size):
    out, prev = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start:start + block_size]
        data = struct.pack("<Q", prev) + struct.pack(f"<{len(block)}I", *block)
        prev = xxhash.xxh3_64_intdigest(data, seed=0)
        out.append(f"{prev:016x}")
    return out


CASES = [
    (list(range(16)), 16),
    (list(range(16)), 4),
    (list(range(37)), 16),  # trailing partial block dropped
    ([151643, 151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13], 2),
    ([0xFFFFFFFF, 0, 1, 0x7FFFFFFF], 1),
    (list(range(1000, 1000 + 64 * 3)), 64),
    ([5] * 7, 8),  # shorter than one block: no hashes
    ([42] * 32, 16),  # identical blocks still chain to different hashes
]

if __name__ == "__main__":
    vectors = [{"tokens": t, "block_size": b, "hashes": chain(t, b)} for t, b in CASES]
    with open("block_hash_vectors.json", "w") as f:
        json.dump(vectors, f, indent=1)
        f.write("\n")
