//! The scheduler on a virtual clock: timing follows the fitted H200 model.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_sim::core::{CoreConfig, EngineCore, NewRequest, run_virtual};
use infera_sim::kv_cache::PoolEvent;
use infera_sim::profile::LatencyProfile;

fn mk_core(kv_blocks: usize) -> EngineCore {
    mk_core_seats(kv_blocks, 256)
}

fn mk_core_seats(kv_blocks: usize, max_num_seqs: usize) -> EngineCore {
    EngineCore::new(CoreConfig {
        block_size: 16,
        kv_blocks,
        max_num_batched_tokens: 8192,
        max_num_seqs,
        profile: LatencyProfile::builtin("h200-llama-3.1-8b").unwrap(),
        kv_transfer_gbytes_per_s: 170.0,
        lower_tiers: Vec::new(),
    })
}

fn mk_req(id: u64, prompt: Vec<u32>, max_tokens: usize) -> NewRequest {
    NewRequest {
        id,
        prompt,
        output: (0..max_tokens as u32).map(|t| 1000 + t).collect(),
        lora: None,
        remote_kv: false,
        lower: Vec::new(),
        retention: infera_proto::retention::Retention::Short,
    }
}

fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn cached_prefix_turns_prefill_from_prompt_to_suffix_cost() {
    let mut core = mk_core(10_000);
    let cold = mk_req(1, tokens(0..4096), 1);
    let mut warm_prompt = tokens(0..3584);
    warm_prompt.extend(50_000..50_512);
    let warm = mk_req(2, warm_prompt, 1);
    let (tl, _) = run_virtual(&mut core, vec![(0.0, cold), (1000.0, warm)]);
    let cold_ttft = tl[&1].ttft_ms().unwrap();
    let warm_ttft = tl[&2].ttft_ms().unwrap();
    // calib/README.md: ~119 ms cold, ~19 ms with 3,584 tokens cached.
    assert!((cold_ttft - 119.0).abs() < 11.9, "cold TTFT {cold_ttft}");
    assert!((warm_ttft - 19.0).abs() < 1.9, "warm TTFT {warm_ttft}");
    assert_eq!(tl[&1].cached_tokens, 0);
    assert_eq!(tl[&2].cached_tokens, 3584);
}

#[test]
fn inter_token_latency_is_the_decode_formula_at_the_batch_size() {
    let profile = LatencyProfile::builtin("h200-llama-3.1-8b").unwrap();
    for n in [1usize, 8, 32] {
        let mut core = mk_core(10_000);
        let arrivals = (0..n as u64)
            .map(|i| {
                (
                    0.0,
                    mk_req(i, tokens(i as u32 * 100..i as u32 * 100 + 64), 20),
                )
            })
            .collect();
        let (tl, _) = run_virtual(&mut core, arrivals);
        for k in 1..20 {
            // Step k decodes every request with context 64 + k.
            let expected = profile.decode_step_ms(std::iter::repeat_n(64 + k, n));
            for i in 0..n as u64 {
                let t = &tl[&i].token_ms;
                let itl = t[k] - t[k - 1];
                assert!(
                    (itl - expected).abs() < 1e-9,
                    "n={n} k={k}: {itl} vs {expected}"
                );
            }
        }
    }
}

#[test]
fn a_request_queued_behind_a_long_prefill_waits_for_its_chunks() {
    let profile = LatencyProfile::builtin("h200-llama-3.1-8b").unwrap();
    let mut core = mk_core(10_000);
    let long = mk_req(1, tokens(0..12_000), 4);
    let short = mk_req(2, tokens(90_000..90_100), 4);
    let (tl, steps) = run_virtual(&mut core, vec![(0.0, long), (1.0, short)]);
    // Step 1 (t=0): 8,192 tokens of the long prompt. Step 2: its last 3,808 tokens and
    // the whole short prompt share the budget.
    let step1 = profile.prefill_ms(8192, 0);
    let step2 = profile.prefill_c0_ms
        + profile.prefill_compute_ms(3808, 8192)
        + profile.prefill_compute_ms(100, 0);
    assert!((steps[0].duration_ms - step1).abs() < 1e-9);
    assert!((steps[1].duration_ms - step2).abs() < 1e-9);
    let ttft = tl[&2].ttft_ms().unwrap();
    assert!(
        (ttft - (step1 + step2 - 1.0)).abs() < 1e-9,
        "short TTFT {ttft}"
    );
    let alone = profile.prefill_ms(100, 0);
    assert!(ttft > 20.0 * alone, "queued TTFT {ttft} vs alone {alone}");
}

#[test]
fn cache_pressure_evicts_and_reports_removed_blocks() {
    // 40 blocks of 16 tokens: three 256-token prompts (16 blocks each) cannot all stay.
    let mut core = mk_core(40);
    let arrivals = (0..3u32)
        .map(|i| {
            (
                i as f64 * 1000.0,
                mk_req(i as u64, tokens(i * 10_000..i * 10_000 + 256), 2),
            )
        })
        .collect();
    let (tl, steps) = run_virtual(&mut core, arrivals);
    let removed: usize = steps
        .iter()
        .flat_map(|s| &s.cache_events)
        .filter(|e| matches!(e, PoolEvent::Removed { .. }))
        .count();
    assert!(removed > 0, "no eviction under pressure");
    assert_eq!(tl.len(), 3);
    assert!(tl.values().all(|t| t.token_ms.len() == 2));
    assert!(core.stats().evictions as usize == removed);
}

#[test]
fn stored_events_chain_parents_and_carry_tokens() {
    let mut core = mk_core(100);
    let (_, steps) = run_virtual(&mut core, vec![(0.0, mk_req(1, tokens(0..40), 1))]);
    let stored: Vec<_> = steps
        .iter()
        .flat_map(|s| &s.cache_events)
        .filter_map(|e| match e {
            PoolEvent::Stored {
                key,
                parent,
                tokens,
            } => Some((*key, *parent, tokens.clone())),
            PoolEvent::Removed { .. } => None,
        })
        .collect();
    assert_eq!(stored.len(), 2, "40 tokens = 2 full blocks of 16");
    assert_eq!(stored[0].1, None);
    assert_eq!(stored[1].1, Some(stored[0].0));
    assert_eq!(stored[0].2, tokens(0..16));
    assert_eq!(stored[1].2, tokens(16..32));
    assert_eq!(
        stored[1].0,
        infera_proto::block_hash::compute_block_hashes(&tokens(0..40), 16)[1],
        "cache keys are the router's chain"
    );
}

#[test]
fn remote_kv_waits_for_the_transfer_then_decodes() {
    let profile = LatencyProfile::builtin("h200-llama-3.1-8b").unwrap();
    let mut core = mk_core(10_000);
    let mut req = mk_req(1, tokens(0..4096), 3);
    req.remote_kv = true;
    let (tl, steps) = run_virtual(&mut core, vec![(0.0, req)]);
    let transfer = profile.kv_transfer_ms(4096, 170.0);
    assert!(
        steps.iter().all(|s| s.prefill_tokens == 0),
        "decode worker never prefills"
    );
    let first = profile.decode_step_ms([4096]);
    let ttft = tl[&1].ttft_ms().unwrap();
    assert!(
        (ttft - (transfer + first)).abs() < 1e-9,
        "{ttft} vs {}",
        transfer + first
    );
}

#[test]
fn a_request_larger_than_the_cache_is_rejected_not_stuck() {
    let mut core = mk_core(4);
    let (tl, steps) = run_virtual(&mut core, vec![(0.0, mk_req(1, tokens(0..200), 2))]);
    assert!(tl[&1].token_ms.is_empty());
    assert_eq!(steps.last().unwrap().rejected, vec![1]);
    assert!(core.is_empty());
}

#[test]
fn a_step_reports_what_it_runs_and_what_waits_before_its_requests_finish() {
    let mut core = mk_core_seats(4096, 1);
    // Two one-token prefills: the first runs (and finishes) in one step, the second
    // waits for the seat.
    core.add(mk_req(1, tokens(0..2000), 1), 0.0);
    core.add(mk_req(2, tokens(5000..7000), 1), 0.0);
    let step = core.step(0.0).unwrap();
    assert_eq!(step.scheduled, (1, 1));
    // Once applied, the finished request is gone from the core's own counts.
    assert_eq!(core.stats().running, 0);
    assert_eq!(core.stats().waiting, 1);
}

#[test]
fn a_prompt_found_below_hbm_is_loaded_and_counted_as_cached() {
    use infera_proto::kv_tiers::{KvTier, TierCost};
    let mut cfg = mk_core(10_000).config().clone();
    cfg.lower_tiers = vec![(KvTier::Host, TierCost::measured(KvTier::Host).unwrap())];
    let mut core = EngineCore::new(cfg);
    let prompt = tokens(0..640);
    let mut req = mk_req(1, prompt.clone(), 4);
    req.lower = vec![KvTier::Host; 40];
    let (timelines, _) = run_virtual(&mut core, vec![(0.0, req)]);
    let t = &timelines[&1];
    // Every block but the last prompt token's, which is computed anyway.
    assert_eq!(t.cached_tokens, 624, "{t:?}");
    assert_eq!(core.stats().loaded_tokens[0], 624);
    // The load took its modelled time: 39 blocks of 2 MiB at 54.8 GB/s and a round
    // trip (1.59 ms), not a prefill of 624 tokens (about 16 ms).
    let (alone, _) = run_virtual(
        &mut mk_core(10_000),
        vec![(0.0, mk_req(2, prompt.clone(), 4))],
    );
    let (loaded, computed) = (t.ttft_ms().unwrap(), alone[&2].ttft_ms().unwrap());
    assert!(
        loaded + 10.0 < computed,
        "loaded {loaded} ms, computed {computed} ms"
    );
}

#[test]
fn a_run_that_loads_slower_than_it_computes_is_computed() {
    use infera_proto::kv_tiers::{KvTier, TierCost};
    let mut cfg = mk_core(10_000).config().clone();
    let slow = TierCost {
        rtt_ms: 0.37,
        gbytes_per_s: 0.338,
    };
    cfg.lower_tiers = vec![(KvTier::Remote, slow)];
    let mut core = EngineCore::new(cfg);
    let mut req = mk_req(1, tokens(0..640), 4);
    req.lower = vec![KvTier::Remote; 40];
    let (timelines, _) = run_virtual(&mut core, vec![(0.0, req)]);
    assert_eq!(timelines[&1].cached_tokens, 0);
    assert_eq!(core.stats().loaded_tokens, [0, 0, 0]);
    assert_eq!(core.stats().recomputed_lower_tokens, 624);
}
