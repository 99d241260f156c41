//! Measurements of the kv-aware router's hot paths (BENCHMARKS.md S5), shared by
//! `infera bench s5` and the `prefix_index_bench` example: prefix-index inserts per
//! second on one core, bytes per indexed block, hit counting, and the route decision.

use crate::metrics::Metrics;
use crate::route::kv_state::{KvRouter, RequestBlocks};
use crate::route::prefix_index::PrefixIndex;
use crate::workers::registry::Target;
use infera_prompt::PromptCodec;
use infera_proto::block_hash::compute_block_hashes;
use infera_proto::kv_events::{BlockStored, EngineBlockHash, KvEvent, KvEventBatch, KvEventLayout};
use infera_proto::worker::WorkerRecord;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

const BLOCK: u32 = 16;
const BLOCKS_PER_EVENT: usize = 32;

/// What [`measure`] found (medians of repeated runs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexFigures {
    /// Blocks indexed per second (BlockStored events applied, one thread).
    pub inserts_per_s: f64,
    /// Heap bytes per indexed block.
    pub bytes_per_block: f64,
    /// Leading-hit counts of a 64-block prompt per second.
    pub hit_counts_per_s: f64,
    /// One kv-aware route decision over every worker, microseconds.
    pub decision_us: f64,
    /// Blocks of the request the decision scored.
    pub decision_blocks: usize,
}

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
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// Measures `workers` views of `blocks` blocks each.
pub fn measure(workers: usize, blocks: usize) -> Result<IndexFigures, String> {
    let workers = workers.max(1);
    let blocks = blocks.max(BLOCKS_PER_EVENT);
    let events: Vec<Vec<KvEvent>> = (0..workers).map(|w| stored_events(w, blocks)).collect();
    let mut rates = Vec::new();
    let mut index = PrefixIndex::new();
    for _ in 0..3 {
        index = PrefixIndex::new();
        let t = Instant::now();
        for (w, evs) in events.iter().enumerate() {
            for e in evs {
                index.apply(&format!("w{w}"), BLOCK, "bench-model", e);
            }
        }
        rates.push((workers * blocks) as f64 / t.elapsed().as_secs_f64());
    }
    let prompt: Vec<u32> = (0..256 * BLOCK)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect();
    let hashes = compute_block_hashes(&prompt, BLOCK as usize);
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
    let router = KvRouter::new(
        Arc::new(PromptCodec::bytes()),
        1.0,
        false,
        Arc::new(Metrics::default()),
    );
    let mut targets = Vec::new();
    for w in 0..workers {
        let record = WorkerRecord::from_json(
            format!(r#"{{"worker_id":"10.0.{}.{}:8000","url":"http://10.0.0.1:8000","model_name":"m","engine":"vllm","kv_block_size":{BLOCK},"kv_events_endpoint":"tcp://10.0.0.1:5557"}}"#, w / 250, w % 250).as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        targets.push(Target {
            key: record.worker_id.clone(),
            record: Arc::new(record),
            dp_rank: None,
        });
    }
    for (w, evs) in events.iter().enumerate() {
        let batch = KvEventBatch {
            ts: 0.0,
            events: evs.clone(),
            data_parallel_rank: None,
            layout: KvEventLayout::Array,
        };
        router.apply_batch(&targets[w].key, BLOCK, "bench-model", &batch);
    }
    let Some(KvEvent::BlockStored(first)) = events[0].first() else {
        return Err("no stored event".into());
    };
    let mut request = first.token_ids.clone();
    request.extend((0..BLOCKS_PER_EVENT as u32 * BLOCK).map(|t| t + 7_000_000));
    let request_hashes = compute_block_hashes(&request, BLOCK as usize);
    let decision_blocks = request_hashes.len();
    let blocks_of = RequestBlocks {
        by_size: HashMap::from([(BLOCK, request_hashes)]),
        skipped: None,
    };
    let options: Vec<&Target> = targets.iter().collect();
    let mut decisions = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..2_000 {
            if router.choose(&options, &blocks_of, 1.0) != Some(0) {
                return Err("the decision did not pick the worker holding the prefix".into());
            }
        }
        decisions.push(t.elapsed().as_secs_f64() * 1e6 / 2_000.0);
    }
    Ok(IndexFigures {
        inserts_per_s: median(rates),
        bytes_per_block: index.bytes_per_block(),
        hit_counts_per_s: median(lookups),
        decision_us: median(decisions),
        decision_blocks,
    })
}
