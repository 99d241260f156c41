//! Each worker's load as this gateway sees it: its requests in flight (held by each
//! request's guard from the pick to its last byte, shown in `/v1/workers`), those of
//! them still waiting for their first byte, and the engine's own queue and running
//! counts when flow control reads them. Forgotten when the worker leaves. Every
//! change that can free room wakes flow control's waiting requests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::Notify;

/// What the engine itself last reported (its `/metrics` gauges).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EngineCounts {
    /// Requests queued in the engine, not yet scheduled.
    pub waiting: u64,
    /// Requests the engine is running.
    pub running: u64,
    /// When they were read.
    pub at: Instant,
    /// This gateway's requests waiting for a first byte there when they were read
    /// (set by [`Inflight::set_engine`]): the engine's queue beyond them is others'.
    pub ours: u64,
}

/// One worker's load.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct WorkerLoad {
    /// This gateway's requests on it, to their last byte.
    pub inflight: u64,
    /// Those of them that have not had their first byte yet.
    pub pending: u64,
    /// The engine's own counts, every client's requests included.
    pub engine: Option<EngineCounts>,
    /// Seconds from its response headers to a stream's first byte (a moving average).
    pub first_byte_s: Option<f64>,
}

/// Load per worker (in flight shown in `/v1/workers`).
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    loads: Mutex<HashMap<String, WorkerLoad>>,
    /// Woken whenever room may have been freed.
    freed: Notify,
}

impl Inflight {
    fn update(&self, worker: &str, f: impl FnOnce(&mut WorkerLoad)) {
        if let Ok(mut m) = self.loads.lock() {
            f(m.entry(worker.to_owned()).or_default());
        }
    }

    /// One more request on `worker`.
    pub(crate) fn acquire(&self, worker: &str) {
        self.update(worker, |l| l.inflight += 1);
    }

    /// One request fewer on `worker`.
    pub(crate) fn release(&self, worker: &str) {
        self.update(worker, |l| l.inflight = l.inflight.saturating_sub(1));
        self.freed.notify_waiters();
    }

    /// One more request on `worker` waiting for its first byte.
    pub(crate) fn acquire_pending(&self, worker: &str) {
        self.update(worker, |l| l.pending += 1);
    }

    /// A stream on `worker` had its first byte `secs` after the worker's headers.
    pub(crate) fn observe_first_byte(&self, worker: &str, secs: f64) {
        self.update(worker, |l| {
            l.first_byte_s = Some(l.first_byte_s.map_or(secs, |s| s + 0.2 * (secs - s)));
        });
    }

    /// A request on `worker` had its first byte (or ended before it).
    pub(crate) fn release_pending(&self, worker: &str) {
        self.update(worker, |l| l.pending = l.pending.saturating_sub(1));
        self.freed.notify_waiters();
    }

    /// Records what `worker`'s engine reported (`None`: it could not be read), read
    /// while this gateway had `ours_before` requests waiting there when the read began:
    /// the engine's count is of some moment during the read, so the larger of that and
    /// the count now is taken as this gateway's share of it.
    pub(crate) fn set_engine(&self, worker: &str, counts: Option<EngineCounts>, ours_before: u64) {
        self.update(worker, |l| {
            l.engine = counts.map(|c| EngineCounts {
                ours: l.pending.max(ours_before),
                ..c
            });
        });
        self.freed.notify_waiters();
    }

    /// Resolves the next time room may have been freed (create it before looking).
    pub(crate) fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    /// Requests on `worker`.
    pub(crate) fn get(&self, worker: &str) -> u64 {
        self.load(worker).inflight
    }

    /// `worker`'s load.
    pub(crate) fn load(&self, worker: &str) -> WorkerLoad {
        self.loads
            .lock()
            .ok()
            .and_then(|m| m.get(worker).copied())
            .unwrap_or_default()
    }

    /// Forgets a removed worker.
    pub(crate) fn remove(&self, worker: &str) {
        if let Ok(mut m) = self.loads.lock() {
            m.remove(worker);
        }
        self.freed.notify_waiters();
    }
}

/// A request counted among a worker's requests before their first byte until dropped
/// (an attempt, from the pick to the worker's response headers).
#[derive(Debug)]
pub(crate) struct PendingHold<'i> {
    inflight: &'i Inflight,
    worker: String,
}

impl<'i> PendingHold<'i> {
    /// Counts one on `worker`.
    pub(crate) fn new(inflight: &'i Inflight, worker: &str) -> Self {
        inflight.acquire_pending(worker);
        Self {
            inflight,
            worker: worker.to_owned(),
        }
    }
}

impl Drop for PendingHold<'_> {
    fn drop(&mut self) {
        self.inflight.release_pending(&self.worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_rise_and_fall_per_worker_and_never_below_zero() {
        let i = Inflight::default();
        i.acquire("a");
        i.acquire("a");
        i.acquire_pending("a");
        i.release("b");
        assert_eq!(
            (i.load("a").inflight, i.load("a").pending, i.get("b")),
            (2, 1, 0)
        );
        i.release_pending("a");
        i.release_pending("a");
        i.release("a");
        assert_eq!((i.get("a"), i.load("a").pending), (1, 0));
        i.remove("a");
        assert_eq!(i.load("a"), WorkerLoad::default());
    }
}
