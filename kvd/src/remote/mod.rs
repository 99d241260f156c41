//! L4, a store shared across hosts (Redis/Valkey first): `long` entries written behind
//! the reply, misses read through, names namespaced by model and compatibility key. A
//! slow or dead store degrades to misses, counted: every call has a deadline, and after
//! a failure the store is skipped for `retry_after` instead of being waited on again.
//! Other backends (Mooncake, object storage) implement [`Backend`].

pub mod naming;
pub mod redis;
pub mod resp;

use crate::buf::Buf;
use crate::queue::ByteQueue;
use crate::tier::TierCounters;
use crate::wire::{Key, Scope};
use infera_proto::retention::Retention;
use naming::{Pattern, Unsealed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Why a call to the store did not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// It did not answer within the deadline.
    #[error("timed out")]
    Timeout,
    /// It could not be reached.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// It answered something else than expected (an error reply, bad framing).
    #[error("protocol: {0}")]
    Protocol(String),
}

impl RemoteError {
    /// The metrics label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Unavailable(_) => "unavailable",
            Self::Protocol(_) => "protocol",
        }
    }
}

/// A shared store. Names come from [`naming::remote_key`]; values are opaque bytes.
/// Every call returns within the backend's deadline.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Where it is, for logs (no credentials).
    fn describe(&self) -> String;
    /// The value under `name`, if any.
    /// The value under `name` and its remaining time to live, if any.
    fn get(&self, name: &str) -> Result<Option<(Buf, Option<Duration>)>, RemoteError>;
    /// Stores `value` under `name`, expiring after `ttl` when given.
    fn put(&self, name: &str, value: &[u8], ttl: Option<Duration>) -> Result<(), RemoteError>;
    /// Whether each name is present.
    fn exists(&self, names: &[String]) -> Result<Vec<bool>, RemoteError>;
    /// Removes every name matching `pattern`; returns how many.
    fn clear(&self, pattern: &Pattern) -> Result<u64, RemoteError>;
}

/// Opens the backend a URL names (`redis://`, `valkey://`).
pub fn open(url: &str, timeout: Duration) -> Result<Arc<dyn Backend>, String> {
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        "redis" | "valkey" => Ok(Arc::new(redis::Redis::new(redis::parse_url(url)?, timeout))),
        "rediss" | "valkeys" => Err(format!(
            "{:?}: TLS is not supported yet; reach the store over a TLS sidecar or a private network with redis://",
            redis::redact(url)
        )),
        _ => Err(format!(
            "{:?}: unknown backend {scheme:?}; supported: redis://, valkey://",
            redis::redact(url)
        )),
    }
}

/// Times a clear is tried before it is given up (logged).
const CLEAR_ATTEMPTS: usize = 5;

/// Settings of the distributed tier.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// First part of every name (one per cluster or fleet sharing the store).
    pub namespace: String,
    /// After a failure, how long the store is skipped.
    pub retry_after: Duration,
    /// Most bytes waiting to be written behind.
    pub queue_bytes: u64,
}

#[derive(Debug)]
enum Job {
    Put {
        name: String,
        sealed: Vec<u8>,
        ttl: Option<Duration>,
    },
    Clear(Pattern, Scope),
}

/// The distributed tier.
#[derive(Debug)]
pub struct Remote {
    backend: Arc<dyn Backend>,
    options: RemoteOptions,
    down_until: Mutex<Option<Instant>>,
    /// Scopes cleared here whose clear has not reached the store yet.
    pending_clears: Mutex<Vec<Scope>>,
    queue: ByteQueue<Job>,
    /// What it served, wrote and failed at.
    pub counters: TierCounters,
}

impl Remote {
    /// The tier over `backend`.
    pub fn new(backend: Arc<dyn Backend>, options: RemoteOptions) -> Self {
        Self {
            backend,
            queue: ByteQueue::new(options.queue_bytes),
            options,
            down_until: Mutex::new(None),
            pending_clears: Mutex::new(Vec::new()),
            counters: TierCounters::default(),
        }
    }

    /// The backend, for logs.
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// Whether the store is being skipped after a failure.
    pub fn is_down(&self) -> bool {
        let until = *self
            .down_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        until.is_some_and(|t| Instant::now() < t)
    }

    /// Counts a failure; one that means the store is unwell starts a pause.
    fn failed(&self, op: &'static str, e: &RemoteError) {
        self.counters.failed(op, e.reason());
        if !matches!(e, RemoteError::Protocol(_)) {
            let mut down = self
                .down_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if down.is_none_or(|t| Instant::now() >= t) {
                tracing::warn!(
                    store = %self.backend.describe(),
                    "distributed tier {op} failed ({e}); treating it as a miss and skipping the store for {:?}",
                    self.options.retry_after
                );
            }
            *down = Some(Instant::now() + self.options.retry_after);
        }
    }

    /// Runs `call` unless the store is paused; failures are counted and become `None`.
    fn guarded<T>(
        &self,
        op: &'static str,
        call: impl FnOnce() -> Result<T, RemoteError>,
    ) -> Option<T> {
        if self.is_down() {
            self.counters.failed(op, "unavailable");
            return None;
        }
        match call() {
            Ok(v) => Some(v),
            Err(e) => {
                self.failed(op, &e);
                None
            }
        }
    }

    /// Whether a clear of a scope covering `scope` has not reached the store yet (its
    /// entries there are stale).
    fn clearing(&self, scope: &Scope) -> bool {
        self.pending_clears
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|filter| filter.covers(scope))
    }

    /// Reads a key through: the value, its retention and its time to live, or `None` (a
    /// miss, also when the store failed, held a damaged value, or a clear of its scope is
    /// still on its way).
    pub fn fetch(&self, scope: &Scope, key: &Key) -> Option<(Buf, Retention, Option<Duration>)> {
        if self.clearing(scope) {
            self.counters.miss();
            return None;
        }
        let name = naming::remote_key(&self.options.namespace, scope, key);
        let started = Instant::now();
        let stored = self.guarded("read", || self.backend.get(&name)).flatten();
        let Some((stored, ttl)) = stored else {
            self.counters.miss();
            return None;
        };
        match naming::unseal(stored) {
            Ok((value, retention)) => {
                self.counters.hit(value.len(), started.elapsed());
                Some((value, retention, ttl))
            }
            Err(e) => {
                self.counters.failed(
                    "read",
                    match e {
                        Unsealed::Corrupt => "corrupt",
                        Unsealed::Foreign => "protocol",
                    },
                );
                self.counters.miss();
                None
            }
        }
    }

    /// Queues a write behind the reply; a full queue drops it (counted).
    pub fn write_behind(
        &self,
        scope: &Scope,
        key: &Key,
        value: &[u8],
        retention: Retention,
        ttl: Option<Duration>,
    ) {
        let sealed = naming::seal(value, retention);
        let bytes = sealed.len() as u64;
        let job = Job::Put {
            name: naming::remote_key(&self.options.namespace, scope, key),
            sealed,
            ttl,
        };
        if !self.queue.push(job, bytes) {
            self.counters.failed("write", "queue_full");
        }
    }

    /// Whether each key is in the store (all false when it cannot say in time).
    pub fn exists(&self, scope: &Scope, keys: &[Key]) -> Vec<bool> {
        if self.clearing(scope) {
            return vec![false; keys.len()];
        }
        let names: Vec<String> = keys
            .iter()
            .map(|k| naming::remote_key(&self.options.namespace, scope, k))
            .collect();
        self.guarded("exists", || self.backend.exists(&names))
            .filter(|v| v.len() == keys.len())
            .unwrap_or_else(|| vec![false; keys.len()])
    }

    /// Queues the removal of a scope's entries (after the writes queued before it,
    /// never refused); until it is done, the scope's entries read as misses.
    pub fn clear(&self, scope: &Scope) {
        self.pending_clears
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(scope.clone());
        let pattern = naming::clear_pattern(&self.options.namespace, scope);
        if !self.queue.push_always(Job::Clear(pattern, scope.clone())) {
            self.counters.failed("clear", "unavailable");
        }
    }

    /// Writes what is queued until [`Remote::close`]; run on its own thread.
    pub fn run_writer(&self) {
        loop {
            let jobs = self.queue.pop_batch(64);
            if jobs.is_empty() {
                return;
            }
            for job in jobs {
                match job {
                    Job::Put { name, sealed, ttl } => {
                        let n = sealed.len();
                        if self
                            .guarded("write", || self.backend.put(&name, &sealed, ttl))
                            .is_some()
                        {
                            self.counters.wrote(n);
                        }
                    }
                    Job::Clear(p, scope) => {
                        if self.clear_now(&p) {
                            let mut pending = self
                                .pending_clears
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner);
                            if let Some(i) = pending.iter().position(|s| *s == scope) {
                                pending.swap_remove(i);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Runs a clear, waiting out pauses (a few times): unlike a dropped write, a
    /// dropped clear would let stale entries be read back. Given up, the scope keeps
    /// reading as misses until kvd restarts.
    fn clear_now(&self, p: &Pattern) -> bool {
        for _ in 0..CLEAR_ATTEMPTS {
            let until = *self
                .down_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(wait) = until.and_then(|t| t.checked_duration_since(Instant::now())) {
                std::thread::sleep(wait);
            }
            if let Some(n) = self.guarded("clear", || self.backend.clear(p)) {
                tracing::info!(pattern = %p.glob, removed = n, "cleared from the distributed tier");
                return true;
            }
        }
        tracing::error!(pattern = %p.glob, "could not clear the distributed tier; its entries read as misses from this kvd until it restarts");
        false
    }

    /// Writes waiting.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Stops taking writes; the writer finishes what is queued, then returns.
    pub fn close(&self) {
        self.queue.close();
    }
}
