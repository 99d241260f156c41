//! Requests in flight per worker: held by each request's guard from the pick to its
//! last byte, shown in `/v1/workers`, forgotten when the worker leaves.

use std::collections::HashMap;
use std::sync::Mutex;

/// Requests in flight per worker (shown in `/v1/workers`).
#[derive(Debug, Default)]
pub(crate) struct Inflight(Mutex<HashMap<String, u64>>);

impl Inflight {
    /// One more request on `worker`.
    pub(crate) fn acquire(&self, worker: &str) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(worker.to_owned()).or_default() += 1;
        }
    }

    /// One request fewer on `worker`.
    pub(crate) fn release(&self, worker: &str) {
        if let Ok(mut m) = self.0.lock()
            && let Some(n) = m.get_mut(worker)
        {
            *n = n.saturating_sub(1);
        }
    }

    /// Requests on `worker`.
    pub(crate) fn get(&self, worker: &str) -> u64 {
        self.0
            .lock()
            .ok()
            .and_then(|m| m.get(worker).copied())
            .unwrap_or(0)
    }

    /// Forgets a removed worker.
    pub(crate) fn remove(&self, worker: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(worker);
        }
    }
}
