//! Micro-benchmark of the kv-aware router's hot paths (BENCHMARKS.md S5), also part of
//! `infera bench s5`: prefix-index ops/s on one core, bytes per indexed block, and
//! route-decision time.
//!
//!     cargo run --release -p infera-gateway --features bench --example prefix_index_bench -- [WORKERS] [BLOCKS_PER_WORKER]
//!
//! Pin it to a core for per-core figures: `taskset -c 0 target/release/examples/prefix_index_bench`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let workers = args.first().copied().unwrap_or(8);
    let blocks = args.get(1).copied().unwrap_or(16_384);
    println!("prefix index: {workers} workers x {blocks} blocks of 16 tokens");
    let f = infera_gateway::bench::measure(workers, blocks).unwrap();
    println!(
        "  index inserts/s (one core, median of 3):  {:>12.0}",
        f.inserts_per_s
    );
    println!(
        "  bytes per indexed block:                   {:>12.1}",
        f.bytes_per_block
    );
    println!(
        "  hit counts/s (64-block prompt, median):    {:>12.0}",
        f.hit_counts_per_s
    );
    println!(
        "  route decision, {workers} candidates, {}-block request: {:>8.2} us (median of 5)",
        f.decision_blocks, f.decision_us
    );
}
