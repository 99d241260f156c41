//! The engine task: owns the scheduler, runs its steps in (scaled) real time, delivers
//! tokens to the requests' streams and KV events to the publisher. An idle engine waits
//! on its command channel and costs no CPU.

use crate::core::{CoreStats, EngineCore, NewRequest, TokenEvent};
use crate::kv_cache::PoolEvent;
use crate::kv_events::KvEventConverter;
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

/// Starts the engine task. Simulated time runs `speedup` times faster than real time.
/// Cache events are converted and sent to `events` when given.
pub fn spawn_engine(
    core: EngineCore,
    speedup: f64,
    events: Option<(KvEventConverter, mpsc::UnboundedSender<KvEventBatch>)>,
) -> (EngineHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let counters = Arc::new(EngineCounters::default());
    let handle = EngineHandle {
        tx,
        counters: counters.clone(),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let task = tokio::spawn(run_engine(core, speedup.max(1e-6), rx, counters, events));
    (handle, task)
}

async fn run_engine(
    mut core: EngineCore,
    speedup: f64,
    mut rx: mpsc::UnboundedReceiver<EngineCommand>,
    counters: Arc<EngineCounters>,
    mut events: Option<(KvEventConverter, mpsc::UnboundedSender<KvEventBatch>)>,
) {
    let start = Instant::now();
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
                let real = Duration::from_secs_f64(step.duration_ms / 1000.0 / speedup);
                tokio::time::sleep(real).await;
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
