//! S3 multi-turn sessions under KV pressure: users converse concurrently, each turn's
//! prompt is the whole history (earlier prompts and the engine's own answers) plus a new
//! message, with think time between turns; the cluster's KV holds a fraction of the
//! sessions' working set. S8 drives the same conversations as sessions arriving at a
//! rate ([`sessions_ladder`]), up to and past the fleet's knee.

use super::Ctx;
use super::driver::{Outcome, Progress, join_indexed, send};
use super::fleet::{BLOCK_TOKENS, MODEL};
use super::ladder::{Slo, mixed_fleet, row, step};
use super::stats::quantile;
use super::workload::{Rng, text};
use anyhow::Result;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One user's conversation.
#[derive(Debug, Clone, Deserialize)]
pub struct Conversation {
    turns: usize,
    first_prompt_tokens: usize,
    turn_tokens: usize,
    output_tokens: usize,
    /// H200-equivalent seconds between an answer and the next turn.
    think_seconds: f64,
}

/// Sizes of S3.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    workers: usize,
    users: usize,
    #[serde(flatten)]
    conversation: Conversation,
    kv_fractions: Vec<f64>,
    speedup: f64,
}

/// Sizes of S8's sessions: conversations start as a Poisson process for `duration_s`
/// (H200-equivalent seconds) at `rate / turns` per second, so that requests arrive at
/// each of `rates` (H200-equivalent req/s) once the first conversations are under way.
#[derive(Debug, Clone, Deserialize)]
pub struct SessionsSize {
    workers: usize,
    kv_tokens_per_worker: usize,
    duration_s: f64,
    #[serde(flatten)]
    conversation: Conversation,
    /// Request arrival rates: sessions start at `rate / turns` per second.
    pub rates: Vec<f64>,
    speedup: f64,
    /// The latency targets of goodput (`ttft_slo_s`, `itl_slo_s`).
    #[serde(flatten)]
    slo: Slo,
}

/// One user's turns against `url` on a fleet run at `speedup`, after `start`: each
/// prompt is the history so far plus a new message; each answer joins the history as
/// the engine wrote it (so its KV blocks can be reused, as a chat client's would be).
async fn converse(
    client: reqwest::Client,
    url: String,
    conversation: Conversation,
    speedup: f64,
    seed: u64,
    start: Duration,
    done: Arc<AtomicUsize>,
) -> Vec<Outcome> {
    let c = conversation;
    let mut rng = Rng::new(seed);
    let mut history = text(&mut rng, c.first_prompt_tokens);
    let mut turns = Vec::with_capacity(c.turns);
    tokio::time::sleep(start).await;
    for turn in 0..c.turns {
        if turn > 0 {
            history.push_str(&text(&mut rng, c.turn_tokens));
        }
        let body = json!({"model": MODEL, "prompt": history, "max_tokens": c.output_tokens,
                          "stream": true, "stream_options": {"include_usage": true}});
        let o = send(&client, &url, &body).await;
        history.push_str(&o.text);
        turns.push(o);
        done.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs_f64(c.think_seconds / speedup)).await;
    }
    turns
}

/// Runs `starts.len()` conversations (the i-th after `starts[i]`, on the router URLs in
/// turn) with a progress line; every conversation's turns in order, conversation by
/// conversation.
async fn conversations(
    client: &reqwest::Client,
    urls: &[String],
    conversation: &Conversation,
    speedup: f64,
    seed: u64,
    starts: &[Duration],
    label: &str,
) -> Vec<Outcome> {
    let total = starts.len() * conversation.turns;
    let progress = Progress::start(label, total);
    let mut users = tokio::task::JoinSet::new();
    for (u, start) in starts.iter().enumerate() {
        let task = converse(
            client.clone(),
            urls[u % urls.len()].clone(),
            conversation.clone(),
            speedup,
            seed.wrapping_add(u as u64),
            *start,
            progress.counter(),
        );
        users.spawn(async move { (u, task.await) });
    }
    let by_user = join_indexed(users, starts.len()).await;
    progress.finish();
    by_user.into_iter().flatten().collect()
}

/// Per turn, the prompt tokens of `outcomes` (`turns` per conversation, in order) and
/// the tokens a router with unlimited KV and perfect session affinity would find cached:
/// every turn reuses the blocks its conversation's previous turn computed (its prompt and
/// all but the last token of its answer), never the whole prompt (an engine computes at
/// least its last token).
fn reusable_by_turn(outcomes: &[Outcome], turns: usize) -> Vec<(u64, u64)> {
    let block = BLOCK_TOKENS as u64;
    let floor = |tokens: u64| tokens / block * block;
    let mut by_turn = vec![(0, 0); turns];
    for conversation in outcomes.chunks(turns.max(1)) {
        for (t, o) in conversation.iter().enumerate() {
            by_turn[t].0 += o.prompt_tokens;
            if t == 0 || !o.ok {
                continue;
            }
            let before = &conversation[t - 1];
            let computed = (before.prompt_tokens + before.output_tokens).saturating_sub(1);
            by_turn[t].1 += floor(computed).min(floor(o.prompt_tokens.saturating_sub(1)));
        }
    }
    by_turn
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The hit ratio of the oracle of [`reusable_by_turn`] over every turn of `outcomes`.
pub fn sessions_oracle(outcomes: &[Outcome], turns: usize) -> f64 {
    let (prompt, reusable) = reusable_by_turn(outcomes, turns)
        .into_iter()
        .fold((0, 0), |(p, r), (tp, tr)| (p + tp, r + tr));
    ratio(reusable, prompt)
}

/// Runs S3.
pub async fn run(ctx: &Ctx, size: &Size, policies: &[String], profile: &str) -> Result<Value> {
    let c = &size.conversation;
    // Tokens one session holds at its last turn.
    let per_session = c.first_prompt_tokens + c.turns * (c.turn_tokens + c.output_tokens);
    let working_set = per_session * size.users;
    // Fresh connections, so that routers are compared on routing (see S8).
    let client = super::driver::client_per_request()?;
    let mut runs = Vec::new();
    for &fraction in &size.kv_fractions {
        for policy in policies {
            let kv_blocks = ((working_set as f64 * fraction)
                / size.workers as f64
                / BLOCK_TOKENS as f64)
                .ceil() as usize;
            let fleet = mixed_fleet(size.workers, kv_blocks, size.speedup, profile);
            // Users start spread over one think time.
            let mut rng = Rng::new(ctx.seed);
            let starts: Vec<Duration> = (0..size.users)
                .map(|_| Duration::from_secs_f64(rng.unit() * c.think_seconds / size.speedup))
                .collect();
            let label = format!("s3 {policy} @ {fraction}x");
            let step = step(ctx, policy, &fleet, "/v1/completions", |urls| {
                let client = client.clone();
                async move {
                    conversations(&client, &urls, c, size.speedup, ctx.seed, &starts, &label).await
                }
            })
            .await?;
            let errors = step.outcomes.iter().filter(|o| !o.ok).count();
            let oracle = reusable_by_turn(&step.outcomes, c.turns);
            let turns: Vec<Value> = (0..c.turns)
                .map(|t| {
                    let os: Vec<&Outcome> = step.outcomes.iter().skip(t).step_by(c.turns).collect();
                    let ttft: Vec<f64> =
                        os.iter().filter(|o| o.ok).filter_map(|o| o.ttft).collect();
                    let prompt: u64 = os.iter().map(|o| o.prompt_tokens).sum();
                    let cached: u64 = os.iter().map(|o| o.cached_tokens).sum();
                    json!({"turn": t + 1, "ttft_p50_s": quantile(&ttft, 0.5) * size.speedup,
                           "ttft_p90_s": quantile(&ttft, 0.9) * size.speedup,
                           "hit_ratio": ratio(cached, prompt),
                           "oracle_hit_ratio": ratio(oracle[t].1, oracle[t].0)})
                })
                .collect();
            let later = |key: &str| {
                let v: Vec<f64> = turns
                    .iter()
                    .skip(1)
                    .filter_map(|t| t[key].as_f64())
                    .collect();
                if v.is_empty() {
                    0.0
                } else {
                    v.iter().sum::<f64>() / v.len() as f64
                }
            };
            let later_ttft: Vec<f64> = step
                .outcomes
                .iter()
                .enumerate()
                .filter(|(i, o)| i % c.turns != 0 && o.ok)
                .filter_map(|(_, o)| o.ttft)
                .collect();
            runs.push(json!({
                "policy": policy, "kv_fraction": fraction, "kv_blocks_per_worker": kv_blocks,
                "ttft_p50_after_first_turn_s": quantile(&later_ttft, 0.5) * size.speedup,
                "ttft_p90_after_first_turn_s": quantile(&later_ttft, 0.9) * size.speedup,
                "working_set_tokens": working_set, "turns": turns, "evictions": step.evictions, "errors": errors,
                "hit_ratio_after_first_turn": later("hit_ratio"),
                "oracle_hit_ratio_after_first_turn": later("oracle_hit_ratio"),
                "gateway_cpu_us_per_request": step.router_cpu * 1e6 / step.outcomes.len().max(1) as f64,
            }));
        }
    }
    let after_first = |p: &str, f: f64, key: &str| {
        runs.iter()
            .find(|r| r["policy"] == p && r["kv_fraction"].as_f64() == Some(f))
            .and_then(|r| r[key].as_f64())
    };
    let hit = |p: &str, f: f64| after_first(p, f, "hit_ratio_after_first_turn");
    let p90 = |p: &str, f: f64| after_first(p, f, "ttft_p90_after_first_turn_s");
    let kvd = format!("kv-aware{}", super::ladder::KVD_SUFFIX);
    let verdicts: Vec<Value> = size
        .kv_fractions
        .iter()
        .map(|&f| {
            let speedup_with_kvd = match (p90("kv-aware", f), p90(&kvd, f)) {
                (Some(without), Some(with)) if with > 0.0 => Some(without / with),
                _ => None,
            };
            json!({"kv_fraction": f, "kv_aware_hit": hit("kv-aware", f), "round_robin_hit": hit("round-robin", f),
                   "kv_aware_kvd_hit": hit(&kvd, f),
                   "ttft_p90_without_over_with_kvd": speedup_with_kvd,
                   "oracle_hit": after_first("kv-aware", f, "oracle_hit_ratio_after_first_turn")})
        })
        .collect();
    // With kvd at the smallest fraction: its hit ratio against kv-aware's at the largest.
    let (low, high) = (
        size.kv_fractions.iter().copied().fold(f64::MAX, f64::min),
        size.kv_fractions.iter().copied().fold(f64::MIN, f64::max),
    );
    let kvd_hit_gap = match (hit(&kvd, low), hit("kv-aware", high)) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    Ok(
        json!({"runs": runs, "verdicts": {"by_kv_fraction": verdicts,
        "kvd_hit_gap_to_largest_fraction": kvd_hit_gap,
        "targets": {"at_1.4x": "kv-aware hit ratio >= 0.8", "at_0.7x": "kv-aware no worse than round-robin",
                    "kvd_at_0.7x": "TTFT p90 (turns after the first) at least 2x better with kvd than without, and the hit ratio within 0.10 of kv-aware's at 1.4x"}}}),
    )
}

/// S8's sessions: every policy at every rate on a fresh fleet, `rate × duration / turns`
/// conversations starting as a Poisson process; one row per run, as S2's ladder's, the
/// oracle being [`sessions_oracle`].
pub async fn sessions_ladder(
    client: &reqwest::Client,
    ctx: &Ctx,
    size: &SessionsSize,
    policies: &[String],
    profile: &str,
) -> Result<Vec<Value>> {
    let c = &size.conversation;
    let fleet = mixed_fleet(
        size.workers,
        size.kv_tokens_per_worker / BLOCK_TOKENS,
        size.speedup,
        profile,
    );
    let mut runs = Vec::new();
    for &rate in &size.rates {
        // Sessions per second of real time that make `rate` requests per H200 second.
        let turns = c.turns.max(1) as f64;
        let session_rate = rate * size.speedup / turns;
        let sessions = (rate * size.duration_s / turns).ceil() as usize;
        let mut rng = Rng::new(ctx.seed);
        let mut at = 0.0;
        let starts: Vec<Duration> = (0..sessions)
            .map(|_| {
                at += rng.exp(session_rate);
                Duration::from_secs_f64(at)
            })
            .collect();
        for policy in policies {
            let label = format!("s8 sessions {policy} @ {rate}/s");
            let starts = starts.clone();
            let step = step(ctx, policy, &fleet, "/v1/completions", |urls| async move {
                conversations(client, &urls, c, size.speedup, ctx.seed, &starts, &label).await
            })
            .await?;
            let oracle = sessions_oracle(&step.outcomes, c.turns);
            let r = row(policy, rate, &step, size.speedup, size.slo, oracle);
            runs.push(Value::Object(r));
        }
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(prompt: u64, output: u64) -> Outcome {
        Outcome {
            ok: true,
            prompt_tokens: prompt,
            output_tokens: output,
            ..Outcome::default()
        }
    }

    #[test]
    fn the_oracle_reuses_the_previous_turn_but_its_last_token_in_whole_blocks() {
        // Turn 2 holds turn 1's 100 + 20 tokens and a 30-token message: 119 computed
        // tokens give 112 reusable (7 blocks).
        let one = [turn(100, 20), turn(150, 20)];
        assert!((sessions_oracle(&one, 2) - 112.0 / 250.0).abs() < 1e-9);
        assert_eq!(reusable_by_turn(&one, 2), vec![(100, 0), (150, 112)]);
        // A prompt that is entirely the previous turn still computes its last token.
        let whole = [turn(64, 17), turn(80, 1)];
        assert!((sessions_oracle(&whole, 2) - 64.0 / 144.0).abs() < 1e-9);
        // Conversations do not share: two of them, each of one turn, reuse nothing.
        assert_eq!(sessions_oracle(&[turn(100, 20), turn(100, 20)], 1), 0.0);
        // A failed turn counts its prompt (none, when it got no answer) and no reuse.
        let failed = [turn(100, 20), Outcome::default()];
        assert_eq!(sessions_oracle(&failed, 2), 0.0);
        assert_eq!(sessions_oracle(&[], 3), 0.0);
    }
}
