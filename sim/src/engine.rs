//! The engine task: owns the scheduler, runs its steps in (scaled) real time, delivers
//! tokens to the requests' streams and KV events to the publisher. An idle engine waits
//! on its command channel and costs no CPU.

use crate::core::{CoreStats, EngineCore, NewRequest, TokenEvent};
use crate::kv_cache::PoolEvent;
use crate::kv_events::KvEventConverter;
use crate::kvd_connector::KvdHandle;
use infera_proto::kv_events::KvEventBatch;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What the engine sends back to a request.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineOutput {
    /// A generated token.
    Token(TokenEvent),
    /// The engine dropped the request (it can never fit).
    Rejected(String),
}

/// A command to the engine task.
#[derive(Debug)]
pub enum EngineCommand {
    /// Schedule a request; its tokens go to `out`.
    Add {
        /// The request.
        req: NewRequest,
        /// Where its output goes.
        out: mpsc::UnboundedSender<EngineOutput>,
    },
    /// Drop every unreferenced cached block.
    ResetPrefixCache,
}

/// Counters the metrics endpoint reads.
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Scheduler snapshot after the last step.
    pub stats: Mutex<CoreStats>,
    /// Prompt tokens of finished or running requests.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Requests finished.
    pub finished: AtomicU64,
    /// Requests aborted because their client went away.
    pub aborted: AtomicU64,
}

/// The way handlers reach the engine.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<EngineCommand>,
    /// Shared counters.
    pub counters: Arc<EngineCounters>,
    next_id: Arc<AtomicU64>,
}

impl EngineHandle {
    /// A fresh request id.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Submits a request; its output arrives on the returned receiver. Dropping the
    /// receiver aborts the request.
    pub fn submit(&self, req: NewRequest) -> Option<mpsc::UnboundedReceiver<EngineOutput>> {
        let (out, rx) = mpsc::unbounded_channel();
        self.counters
            .prompt_tokens
            .fetch_add(req.prompt.len() as u64, Ordering::Relaxed);
        self.tx.send(EngineCommand::Add { req, out }).ok()?;
        Some(rx)
    }

    /// Asks the engine to drop its unreferenced cache.
    pub fn reset_prefix_cache(&self) -> bool {
        self.tx.send(EngineCommand::ResetPrefixCache).is_ok()
    }
}

/// How simulated time maps to real time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Simulated time runs this many times faster than real time.
    pub speedup: f64,
    /// Each step lasts `1 ± jitter` times its modelled duration (0: exact).
    pub jitter: f64,
    /// Seed of the jitter sequence.
    pub seed: u64,
}

impl Timing {
    /// Exact timing at `speedup`.
    pub fn exact(speedup: f64) -> Self {
        Self {
            speedup,
            jitter: 0.0,
            seed: 0,
        }
    }
}

/// A seeded stream of factors in `[1 - jitter, 1 + jitter]` (splitmix64).
#[derive(Debug, Clone)]
struct Jitter {
    amount: f64,
    state: u64,
}

impl Jitter {
    fn next_factor(&mut self) -> f64 {
        if self.amount == 0.0 {
            return 1.0;
        }
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        1.0 + self.amount * (2.0 * unit - 1.0)
    }
}

/// Starts the engine task. Cache events are converted and sent to `events` when given.
/// Finished requests' blocks go to `kvd` when the worker has a kvd connector.
pub fn spawn_engine(
    core: EngineCore,
    timing: Timing,
    events: Option<(KvEventConverter, mpsc::UnboundedSender<KvEventBatch>)>,
    kvd: Option<KvdHandle>,
) -> (EngineHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let counters = Arc::new(EngineCounters::default());
    let handle = EngineHandle {
        tx,
        counters: counters.clone(),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let timing = Timing {
        speedup: timing.speedup.max(1e-6),
        ..timing
    };
    let task = tokio::spawn(run_engine(core, timing, rx, counters, events, kvd));
    (handle, task)
}

async fn run_engine(
    mut core: EngineCore,
    timing: Timing,
    mut rx: mpsc::UnboundedReceiver<EngineCommand>,
    counters: Arc<EngineCounters>,
    mut events: Option<(KvEventConverter, mpsc::UnboundedSender<KvEventBatch>)>,
    kvd: Option<KvdHandle>,
) {
    let speedup = timing.speedup;
    let mut jitter = Jitter {
        amount: timing.jitter.clamp(0.0, 0.99),
        state: timing.seed,
    };
    let start = Instant::now();
    let mut pace = start;
    let sim_now = || start.elapsed().as_secs_f64() * 1000.0 * speedup;
    let mut outputs: HashMap<u64, mpsc::UnboundedSender<EngineOutput>> = HashMap::new();
    loop {
        if core.is_empty() {
            match rx.recv().await {
                Some(cmd) => apply(cmd, &mut core, &mut outputs, sim_now(), &mut events),
                None => return,
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            apply(cmd, &mut core, &mut outputs, sim_now(), &mut events);
        }
        // Requests whose client left are dropped before they cost a step.
        let gone: Vec<u64> = outputs
            .iter()
            .filter(|(_, tx)| tx.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            outputs.remove(&id);
            core.abort(id);
            counters.aborted.fetch_add(1, Ordering::Relaxed);
        }
        let now = sim_now();
        match core.step(now) {
            Some(step) => {
                // What the step runs and what still waits, as an engine reports it at
                // schedule time (a one-step prefill is running while it lasts).
                if let Ok(mut stats) = counters.stats.lock() {
                    let (running, waiting) = step.scheduled;
                    *stats = CoreStats {
                        running,
                        waiting,
                        ..core.stats()
                    };
                }
                let ms = step.duration_ms * jitter.next_factor();
                let real = Duration::from_secs_f64(ms / 1000.0 / speedup);
                // Steps end at absolute deadlines: tokio's timer has millisecond
                // granularity, so sub-millisecond steps (a high --speedup) run back to back
                // until they fall behind schedule, keeping the average pace exact.
                // A late wake-up (timer rounding) is made up on the next steps; after
                // idling or a long stall the schedule restarts from now.
                let now_real = Instant::now();
                if now_real > pace + Duration::from_millis(5) {
                    pace = now_real;
                }
                pace += real;
                if pace > now_real + Duration::from_micros(500) {
                    tokio::time::sleep_until(pace.into()).await;
                } else {
                    tokio::task::yield_now().await;
                }
                for id in &step.rejected {
                    if let Some(tx) = outputs.remove(id) {
                        let _ = tx.send(EngineOutput::Rejected(format!(
                            "request {id} needs more KV cache than the engine has ({} blocks)",
                            core.stats().total_blocks
                        )));
                    }
                }
                deliver(&step.tokens, &mut outputs, &mut core, &counters);
                publish(&step.cache_events, &mut events);
                if let Some(kvd) = &kvd {
                    for offload in step.offload {
                        kvd.store(offload);
                    }
                }
                if let Ok(mut stats) = counters.stats.lock() {
                    *stats = core.stats();
                }
            }
            None if core.is_empty() => {}
            None => {
                // Waiting on a KV transfer (or on cache space): sleep until it is due or
                // a command arrives.
                let wait_ms = core.next_ready_ms().map_or(5.0, |t| (t - now).max(0.0));
                let wait = Duration::from_secs_f64(wait_ms / 1000.0 / speedup);
                tokio::select! {
                    cmd = rx.recv() => match cmd {
                        Some(cmd) => apply(cmd, &mut core, &mut outputs, sim_now(), &mut events),
                        None => return,
                    },
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

fn apply(
    cmd: EngineCommand,
    core: &mut EngineCore,
    outputs: &mut HashMap<u64, mpsc::UnboundedSender<EngineOutput>>,
    now: f64,
    events: &mut Option<(KvEventConverter, mpsc::UnboundedSender<KvEventBatch>)>,
) {
    match cmd {
        EngineCommand::Add { req, out } => {
            outputs.insert(req.id, out);
            core.add(req, now);
        }
        EngineCommand::ResetPrefixCache => {
            core.reset_prefix_cache();
            if let Some((converter, tx)) = events {
                let _ = tx.send(converter.cleared());
            }
        }
    }
}

fn deliver(
    tokens: &[TokenEvent],
    outputs: &mut HashMap<u64, mpsc::UnboundedSender<EngineOutput>>,
    core: &mut EngineCore,
    counters: &EngineCounters,
) {
    for tok in tokens {
        counters.generation_tokens.fetch_add(1, Ordering::Relaxed);
        let sent = outputs
            .get(&tok.id)
            .is_some_and(|tx| tx.send(EngineOutput::Token(tok.clone())).is_ok());
        if tok.finished {
            outputs.remove(&tok.id);
            counters.finished.fetch_add(1, Ordering::Relaxed);
        } else if !sent {
            outputs.remove(&tok.id);
            core.abort(tok.id);
            counters.aborted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn publish(
    cache_events: &[PoolEvent],
    events: &mut Option<(KvEventConverter, mpsc::UnboundedSender<KvEventBatch>)>,
) {
    if cache_events.is_empty() {
        return;
    }
    if let Some((converter, tx)) = events {
        let _ = tx.send(converter.convert(cache_events));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_is_off_by_default_and_bounded_and_seeded() {
        let mut off = Jitter {
            amount: 0.0,
            state: 1,
        };
        assert_eq!(off.next_factor(), 1.0);
        let mut a = Jitter {
            amount: 0.1,
            state: 7,
        };
        let mut b = Jitter {
            amount: 0.1,
            state: 7,
        };
        let xs: Vec<f64> = (0..1000).map(|_| a.next_factor()).collect();
        assert!(xs.iter().all(|x| (0.9..=1.1).contains(x)));
        assert!(xs.iter().any(|x| *x < 0.95) && xs.iter().any(|x| *x > 1.05));
        assert_eq!(
            xs[..5],
            (0..5).map(|_| b.next_factor()).collect::<Vec<_>>()[..]
        );
    }
}
