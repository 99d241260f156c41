//! Micro-benchmark of the kv-aware router's hot paths (BENCHMARKS.md S5): prefix-index
//! ops/s on one core, bytes per indexed block, and route-decision time.
//!
//!     cargo run --release -p infera-gateway --example prefix_index_bench -- [WORKERS] [BLOCKS_PER_WORKER]
//!
//! Pin it to a core for per-core figures: `taskset -c 0 target/release/examples/prefix_index_bench`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_gateway::kv_router::{KvRouter, RequestBlocks};
use infera_gateway::metrics::Metrics;
use infera_gateway::prefix_index::PrefixIndex;
use infera_gateway::registry::Target;
use infera_prompt::PromptCodec;
use infera_proto::block_hash::compute_block_hashes;
use infera_proto::kv_events::{BlockStored, EngineBlockHash, KvEvent, KvEventBatch, KvEventLayout};
use infera_proto::worker::WorkerRecord;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

const BLOCK: u32 = 16;
const BLOCKS_PER_EVENT: usize = 32;

fn stored_events(worker: usize, blocks: usize) -> Vec<KvEvent> {
    let mut events = Vec::new();
    let mut parent = None;
    for start in (0..blocks).step_by(BLOCKS_PER_EVENT) {
        let n = BLOCKS_PER_EVENT.min(blocks - start);
        let hashes: Vec<EngineBlockHash> = (start..start + n)
            .map(|b| EngineBlockHash::Int((worker * 1_000_000 + b) as i128))
            .collect();
        let tokens: Vec<u32> = (start * BLOCK as usize..(start + n) * BLOCK as usize)
            .map(|t| (t as u32).wrapping_mul(2_654_435_761) ^ worker as u32)
            .collect();
        events.push(KvEvent::BlockStored(BlockStored {
            block_hashes: hashes.clone(),
            parent_block_hash: parent.clone(),
            token_ids: tokens,
            block_size: BLOCK,
            ..Default::default()
        }));
        parent = hashes.last().cloned();
    }
    events
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let workers = args.first().copied().unwrap_or(8);
    let blocks = args.get(1).copied().unwrap_or(16_384);
    println!(
        "prefix index: {workers} workers x {blocks} blocks of {BLOCK} tokens ({BLOCKS_PER_EVENT} blocks per BlockStored event)"
    );

    // Index ops/s: applying BlockStored events (re-hashing token ids, two map inserts per block).
    let events: Vec<Vec<KvEvent>> = (0..workers).map(|w| stored_events(w, blocks)).collect();
    let mut rates = Vec::new();
    let mut index = PrefixIndex::new();
    for _ in 0..3 {
        index = PrefixIndex::new();
        let t = Instant::now();
        for (w, evs) in events.iter().enumerate() {
            for e in evs {
                index.apply(&format!("w{w}"), BLOCK, e);
            }
        }
        rates.push((workers * blocks) as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "  index inserts/s (one core, median of 3):  {:>12.0}",
        median(rates)
    );
    println!(
        "  bytes per indexed block:                   {:>12.1}",
        index.bytes_per_block()
    );

    // Lookups: leading hits of a 256-block prompt against one view.
    let prompt_tokens: Vec<u32> = (0..256 * BLOCK)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect();
    let hashes = compute_block_hashes(&prompt_tokens, BLOCK as usize);
    let mut lookups = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let mut sink = 0;
        for i in 0..200_000 {
            sink += index.hits(&format!("w{}", i % workers), &hashes[..64]);
        }
        std::hint::black_box(sink);
        lookups.push(200_000.0 / t.elapsed().as_secs_f64());
    }
    println!(
        "  hit counts/s (64-block prompt, median):    {:>12.0}",
        median(lookups)
    );

    // Route decision: KvRouter::choose over every worker for a request whose first half
    // is held by worker 0.
    let metrics = Arc::new(Metrics::default());
    let router = KvRouter::new(Arc::new(PromptCodec::bytes()), 1.0, false, metrics);
    let targets: Vec<Target> = (0..workers)
        .map(|w| {
            let record = WorkerRecord::from_json(
                format!(r#"{{"worker_id":"10.0.0.{w}:8000","url":"http://10.0.0.{w}:8000","model_name":"m","engine":"vllm","kv_block_size":{BLOCK},"kv_events_endpoint":"tcp://10.0.0.{w}:5557"}}"#).as_bytes(),
            )
            .unwrap();
            Target { key: record.worker_id.clone(), record: Arc::new(record), dp_rank: None }
        })
        .collect();
    for (w, evs) in events.iter().enumerate() {
        let batch = KvEventBatch {
            ts: 0.0,
            events: evs.clone(),
            data_parallel_rank: None,
            layout: KvEventLayout::Array,
        };
        router.apply_batch(&targets[w].key, BLOCK, &batch);
    }
    let held: Vec<u32> = match &events[0][0] {
        KvEvent::BlockStored(s) => s.token_ids.clone(),
        _ => unreachable!(),
    };
    let mut request = held.clone();
    request.extend((0..BLOCKS_PER_EVENT as u32 * BLOCK).map(|t| t + 7_000_000));
    let blocks = RequestBlocks {
        by_size: HashMap::from([(BLOCK, compute_block_hashes(&request, BLOCK as usize))]),
        skipped: None,
    };
    let options: Vec<&Target> = targets.iter().collect();
    let mut decisions = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..20_000 {
            let pick = router.choose(&options, &blocks, 1.0);
            assert_eq!(pick, Some(0));
        }
        decisions.push(t.elapsed().as_secs_f64() * 1e6 / 20_000.0);
    }
    println!(
        "  route decision, {workers} candidates, {}-block request: {:>8.2} us (median of 5)",
        blocks.by_size[&BLOCK].len(),
        median(decisions)
    );
}
