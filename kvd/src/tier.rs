//! What the tiers below RAM share: their names in metrics and counters of what each
//! served, wrote and failed at (failures counted by a closed set of reasons).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A tier, as labelled in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// L2, the RAM arena.
    Ram,
    /// L3, container files on local disks.
    Nvme,
    /// L4, a store shared across hosts.
    Remote,
}

impl Tier {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ram => "ram",
            Self::Nvme => "nvme",
            Self::Remote => "remote",
        }
    }
}

/// Counters of one tier below RAM.
#[derive(Debug, Default)]
pub struct TierCounters {
    /// Lookups it answered.
    pub hits: AtomicU64,
    /// Lookups it did not (including failed ones).
    pub misses: AtomicU64,
    /// Bytes read for hits.
    pub read_bytes: AtomicU64,
    /// Time spent reading for hits, in nanoseconds.
    pub read_nanos: AtomicU64,
    /// Entries written.
    pub writes: AtomicU64,
    /// Bytes written.
    pub write_bytes: AtomicU64,
    /// Entries evicted to make room.
    pub evictions: AtomicU64,
    /// Entries brought up into RAM after a hit here.
    pub promotions: AtomicU64,
    failures: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl TierCounters {
    /// A lookup answered with `bytes` after `took`.
    pub fn hit(&self, bytes: usize, took: Duration) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.read_nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// A lookup not answered.
    pub fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    /// An entry of `bytes` written.
    pub fn wrote(&self, bytes: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// An operation (`read`, `write`, `exists`, `clear`) that failed, and why
    /// (`timeout`, `unavailable`, `no_space`, `below_floor`, `queue_full`, `too_large`,
    /// `corrupt`, `io`, `protocol`).
    pub fn failed(&self, op: &'static str, reason: &'static str) {
        if let Ok(mut f) = self.failures.lock() {
            *f.entry((op, reason)).or_default() += 1;
        }
    }

    /// Failures so far, by (op, reason).
    pub fn failures(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        self.failures.lock().map(|f| f.clone()).unwrap_or_default()
    }

    /// How many `op` failures of `reason` so far.
    pub fn failure_count(&self, op: &'static str, reason: &'static str) -> u64 {
        self.failures().get(&(op, reason)).copied().unwrap_or(0)
    }
}
