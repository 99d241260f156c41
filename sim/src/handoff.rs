//! The KV handoff between simulated prefill and decode workers of one process, for the
//! concurrent protocols (`sglang-bootstrap`, `vllm-mooncake`, `vllm-mori-write`): a
//! real decode engine cannot start before its prefill has computed the prompt's KV, so
//! a simulated decode waits for the prefill with the same bootstrap room or transfer id
//! to finish (then the transfer time is added by the scheduler). Workers in other
//! processes cannot be seen: in a process without a prefill worker, decodes do not wait.

use crate::pd::{PdLeg, PdProtocol, PdRole};
use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;

/// How long a decode waits for an unseen prefill to show up before going ahead.
const APPEAR_GRACE: Duration = Duration::from_millis(20);

/// Longest a decode waits for a running prefill.
const PREFILL_WAIT: Duration = Duration::from_secs(120);

/// Finished handoffs remembered (a decode may arrive after its prefill finished).
const DONE_CAPACITY: usize = 65_536;

#[derive(Default)]
struct Board {
    /// Prefills that started and have not finished.
    started: HashMap<String, ()>,
    /// What waiting decodes are woken by.
    waiters: HashMap<String, Arc<Notify>>,
    done: HashMap<String, ()>,
    done_order: VecDeque<String>,
}

fn board() -> &'static Mutex<Board> {
    static BOARD: OnceLock<Mutex<Board>> = OnceLock::new();
    BOARD.get_or_init(Mutex::default)
}

static PREFILL_WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Counts a prefill worker of this process (decodes wait only when there is one).
pub fn register_prefill_worker(role: Option<&PdRole>) {
    if role.is_some_and(|r| r.leg == PdLeg::Prefill) {
        PREFILL_WORKERS.fetch_add(1, Ordering::Relaxed);
    }
}

/// The key both legs of a concurrent protocol carry; `None` for serial protocols.
pub fn handoff_key(protocol: PdProtocol, body: &Map<String, Value>) -> Option<String> {
    match protocol {
        PdProtocol::SglangBootstrap => body.get("bootstrap_room").map(|r| format!("room:{r}")),
        PdProtocol::VllmMooncake | PdProtocol::VllmMoriWrite => body
            .get("kv_transfer_params")
            .and_then(|p| p.get("transfer_id"))
            .and_then(Value::as_str)
            .map(|t| format!("xfer:{t}")),
        PdProtocol::VllmMoriRead | PdProtocol::AtomMooncake => None,
    }
}

fn notify_of(b: &mut Board, key: &str) -> Arc<Notify> {
    b.waiters
        .entry(key.to_owned())
        .or_insert_with(|| Arc::new(Notify::new()))
        .clone()
}

/// A prefill with `key` started.
pub fn prefill_started(key: &str) {
    if let Ok(mut b) = board().lock() {
        b.started.insert(key.to_owned(), ());
    }
}

/// Whether a prefill with `key` is running (diagnostics and tests).
pub fn is_pending(key: &str) -> bool {
    board().lock().is_ok_and(|b| b.started.contains_key(key))
}

/// The prefill with `key` computed the prompt's KV (or ended without: its decode then
/// goes ahead and meets the failure the router reports).
pub fn prefill_done(key: &str) {
    let Ok(mut b) = board().lock() else { return };
    b.started.remove(key);
    if let Some(n) = b.waiters.remove(key) {
        n.notify_waiters();
    }
    if b.done.insert(key.to_owned(), ()).is_none() {
        b.done_order.push_back(key.to_owned());
    }
    while b.done_order.len() > DONE_CAPACITY {
        if let Some(old) = b.done_order.pop_front() {
            b.done.remove(&old);
        }
    }
}

/// Waits until the prefill with `key` is done (if this process runs prefills at all).
pub async fn wait_for_prefill(key: &str) {
    if PREFILL_WORKERS.load(Ordering::Relaxed) == 0 {
        return;
    }
    let now = tokio::time::Instant::now;
    let deadline = now() + PREFILL_WAIT;
    let appear_by = now() + APPEAR_GRACE;
    loop {
        let notify = {
            let Ok(mut b) = board().lock() else { return };
            if b.done.contains_key(key) {
                return;
            }
            let started = b.started.contains_key(key);
            if !started && now() >= appear_by {
                return; // Its prefill runs in another process.
            }
            notify_of(&mut b, key)
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Done between the check and the registration?
        if board().lock().map_or(true, |b| b.done.contains_key(key)) {
            return;
        }
        let started = board().lock().is_ok_and(|b| b.started.contains_key(key));
        let until = if started {
            deadline
        } else {
            appear_by.min(deadline)
        };
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(until) => {
                if now() >= deadline {
                    return;
                }
            }
        }
    }
}

/// Marks the prefill done when dropped (finished, failed or cancelled).
#[derive(Debug)]
pub struct PrefillGuard(pub String);

impl Drop for PrefillGuard {
    fn drop(&mut self) {
        prefill_done(&self.0);
    }
}
