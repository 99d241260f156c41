//! Per-worker circuit breakers (pure: time is passed in).
//!
//! A worker's breaker opens after `threshold` consecutive faults (0: never, the earlier
//! server's way to turn breakers off) (5xx, unreachable,
//! timeout, broken stream); 4xx and 429 never count as faults (a worker that answers
//! them is alive, so they close a half-open breaker). While open it takes no traffic
//! until its cooldown passes; then one half-open probe is let through: success closes
//! it, failure reopens it with the cooldown doubled (up to `max_cooldown`). If every
//! candidate is open the router dispatches anyway (see `route::plan`).
//!
//! Apart from the breakers, a worker can be *failing its health checks*
//! (`health_check`): it takes no traffic while any other candidate does, and requests in
//! flight to it end (`stalled`), since a hung engine never answers them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Breaker settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BreakerConfig {
    /// Consecutive faults that open the breaker.
    pub threshold: u32,
    /// First cooldown.
    pub cooldown: Duration,
    /// Longest cooldown.
    pub max_cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            threshold: 3,
            cooldown: Duration::from_secs(5),
            max_cooldown: Duration::from_secs(60),
        }
    }
}

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerState {
    /// Taking traffic.
    Closed,
    /// Refusing traffic until the instant.
    Open {
        /// End of the cooldown.
        until: Instant,
    },
    /// One probe allowed; `probing` while it is in flight.
    HalfOpen {
        /// A probe is in flight.
        probing: bool,
    },
}

impl BreakerState {
    /// The gauge value, as the earlier server set it: 0 closed, 1 half-open, 2 open.
    pub(crate) fn gauge(self) -> u8 {
        match self {
            Self::Closed => 0,
            Self::HalfOpen { .. } => 1,
            Self::Open { .. } => 2,
        }
    }

    /// The name shown in `/v1/workers`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open { .. } => "open",
            Self::HalfOpen { .. } => "half_open",
        }
    }
}

/// One worker's breaker.
#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    state: BreakerState,
    failures: u32,
    cooldown: Duration,
    trips: u64,
    probe_started: Option<Instant>,
}

impl Breaker {
    fn new(cfg: &BreakerConfig) -> Self {
        Self {
            state: BreakerState::Closed,
            failures: 0,
            cooldown: cfg.cooldown,
            trips: 0,
            probe_started: None,
        }
    }

    /// Current state at `now`: an expired open breaker reads as half-open, and so does
    /// a probe with no verdict after a cooldown (its request was cancelled).
    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        match self.state {
            BreakerState::Open { until } if now >= until => {
                BreakerState::HalfOpen { probing: false }
            }
            BreakerState::HalfOpen { probing: true }
                if self.probe_started.is_some_and(|t| now >= t + self.cooldown) =>
            {
                BreakerState::HalfOpen { probing: false }
            }
            s => s,
        }
    }

    /// Whether a request may go to this worker now, starting a probe if half-open.
    pub(crate) fn try_acquire(&mut self, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open { .. } | BreakerState::HalfOpen { probing: true } => false,
            BreakerState::HalfOpen { probing: false } => {
                self.state = BreakerState::HalfOpen { probing: true };
                self.probe_started = Some(now);
                true
            }
        }
    }

    /// Whether the worker would take traffic now, without changing state.
    pub(crate) fn is_available(&self, now: Instant) -> bool {
        matches!(
            self.state(now),
            BreakerState::Closed | BreakerState::HalfOpen { probing: false }
        )
    }

    /// Records a success.
    pub(crate) fn on_success(&mut self, cfg: &BreakerConfig) {
        self.failures = 0;
        self.state = BreakerState::Closed;
        self.cooldown = cfg.cooldown;
    }

    /// Records a fault; returns true when this fault opened the breaker.
    pub(crate) fn on_failure(&mut self, cfg: &BreakerConfig, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::HalfOpen { .. } => {
                self.cooldown = (self.cooldown * 2).min(cfg.max_cooldown);
                self.state = BreakerState::Open {
                    until: now + self.cooldown,
                };
                self.trips += 1;
                true
            }
            BreakerState::Open { .. } => false,
            BreakerState::Closed => {
                self.failures += 1;
                // 0: the earlier server's way to turn the breaker off.
                if cfg.threshold > 0 && self.failures >= cfg.threshold {
                    self.state = BreakerState::Open {
                        until: now + self.cooldown,
                    };
                    self.trips += 1;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Times this breaker opened.
    pub(crate) fn trips(&self) -> u64 {
        self.trips
    }
}

/// Every worker's breaker, and whether it fails its health checks.
#[derive(Debug, Default)]
pub(crate) struct Breakers {
    cfg: BreakerConfig,
    map: Mutex<HashMap<String, Breaker>>,
    failing: Mutex<HashMap<String, watch::Sender<bool>>>,
}

impl Breakers {
    /// Breakers with `cfg`.
    pub(crate) fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg,
            map: Mutex::new(HashMap::new()),
            failing: Mutex::new(HashMap::new()),
        }
    }

    /// Marks `worker` as failing its health checks, or passing them again.
    pub(crate) fn set_health_failing(&self, worker: &str, failing: bool) {
        if let Ok(mut map) = self.failing.lock() {
            map.entry(worker.to_owned())
                .or_insert_with(|| watch::channel(false).0)
                .send_replace(failing);
        }
    }

    /// Whether `worker` fails its health checks.
    pub(crate) fn health_failing(&self, worker: &str) -> bool {
        self.failing
            .lock()
            .ok()
            .and_then(|m| m.get(worker).map(|tx| *tx.borrow()))
            .unwrap_or(false)
    }

    /// Resolves once `worker` starts failing its health checks; never if it is removed
    /// first. A worker failing them already must recover and fail again: it was sent the
    /// request only because every candidate was failing, and may yet answer.
    pub(crate) fn stalled(&self, worker: &str) -> impl Future<Output = ()> + Send + 'static {
        let rx = self.failing.lock().ok().map(|mut m| {
            m.entry(worker.to_owned())
                .or_insert_with(|| watch::channel(false).0)
                .subscribe()
        });
        async move {
            if let Some(mut rx) = rx
                && rx.wait_for(|failing| !*failing).await.is_ok()
                && rx.wait_for(|failing| *failing).await.is_ok()
            {
                return;
            }
            std::future::pending::<()>().await;
        }
    }

    fn with<R>(
        &self,
        worker: &str,
        f: impl FnOnce(&mut Breaker, &BreakerConfig) -> R,
    ) -> Option<R> {
        let mut map = self.map.lock().ok()?;
        let breaker = map
            .entry(worker.to_owned())
            .or_insert_with(|| Breaker::new(&self.cfg));
        Some(f(breaker, &self.cfg))
    }

    /// See [`Breaker::try_acquire`]; false while the worker fails its health checks.
    pub(crate) fn try_acquire(&self, worker: &str, now: Instant) -> bool {
        !self.health_failing(worker) && self.with(worker, |b, _| b.try_acquire(now)).unwrap_or(true)
    }

    /// See [`Breaker::is_available`]; false while the worker fails its health checks.
    pub(crate) fn is_available(&self, worker: &str, now: Instant) -> bool {
        if self.health_failing(worker) {
            return false;
        }
        let Ok(map) = self.map.lock() else {
            return true;
        };
        map.get(worker).is_none_or(|b| b.is_available(now))
    }

    /// Records a success.
    pub(crate) fn on_success(&self, worker: &str) {
        self.with(worker, |b, cfg| b.on_success(cfg));
    }

    /// Records a fault; true when it opened the breaker.
    pub(crate) fn on_failure(&self, worker: &str, now: Instant) -> bool {
        self.with(worker, |b, cfg| b.on_failure(cfg, now))
            .unwrap_or(false)
    }

    /// A copy of a worker's breaker.
    pub(crate) fn get(&self, worker: &str) -> Option<Breaker> {
        self.map.lock().ok()?.get(worker).cloned()
    }

    /// Forgets a removed worker.
    pub(crate) fn remove(&self, worker: &str) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(worker);
        }
        if let Ok(mut map) = self.failing.lock() {
            map.remove(worker);
        }
    }

    /// Every breaker, for metrics.
    pub(crate) fn all(&self) -> Vec<(String, Breaker)> {
        self.map
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: BreakerConfig = BreakerConfig {
        threshold: 3,
        cooldown: Duration::from_secs(5),
        max_cooldown: Duration::from_secs(12),
    };

    #[test]
    fn opens_after_threshold_and_probes_after_cooldown() {
        let t0 = Instant::now();
        let mut b = Breaker::new(&CFG);
        assert!(!b.on_failure(&CFG, t0));
        assert!(!b.on_failure(&CFG, t0));
        assert!(b.try_acquire(t0));
        assert!(b.on_failure(&CFG, t0), "third fault opens");
        assert!(!b.try_acquire(t0 + Duration::from_secs(4)));
        let t5 = t0 + Duration::from_secs(5);
        assert!(b.try_acquire(t5), "one half-open probe");
        assert!(!b.try_acquire(t5), "only one");
        b.on_success(&CFG);
        assert_eq!(b.state(t5), BreakerState::Closed);
        assert_eq!(b.trips(), 1);
    }

    #[test]
    fn a_threshold_of_zero_never_opens() {
        let off = BreakerConfig {
            threshold: 0,
            ..CFG
        };
        let t0 = Instant::now();
        let mut b = Breaker::new(&off);
        for _ in 0..100 {
            assert!(!b.on_failure(&off, t0));
        }
        assert_eq!(b.state(t0), BreakerState::Closed);
        assert!(b.try_acquire(t0));
        assert_eq!(b.trips(), 0);
    }

    #[test]
    fn a_failed_probe_doubles_the_cooldown_up_to_the_max() {
        let t0 = Instant::now();
        let mut b = Breaker::new(&CFG);
        for _ in 0..3 {
            b.on_failure(&CFG, t0);
        }
        let t5 = t0 + Duration::from_secs(5);
        assert!(b.try_acquire(t5));
        assert!(b.on_failure(&CFG, t5));
        assert_eq!(
            b.state(t5),
            BreakerState::Open {
                until: t5 + Duration::from_secs(10)
            }
        );
        let t15 = t5 + Duration::from_secs(10);
        assert!(b.try_acquire(t15));
        b.on_failure(&CFG, t15);
        assert_eq!(
            b.state(t15),
            BreakerState::Open {
                until: t15 + Duration::from_secs(12)
            },
            "capped"
        );
    }

    #[test]
    fn a_probe_without_verdict_is_retried_after_a_cooldown() {
        let t0 = Instant::now();
        let mut b = Breaker::new(&CFG);
        for _ in 0..3 {
            b.on_failure(&CFG, t0);
        }
        let t5 = t0 + Duration::from_secs(5);
        assert!(b.try_acquire(t5));
        // The probe's client went away: no success, no failure.
        assert!(!b.try_acquire(t5 + Duration::from_secs(4)));
        assert!(
            b.try_acquire(t5 + Duration::from_secs(5)),
            "a lost probe does not wedge the worker"
        );
    }

    #[test]
    fn successes_reset_the_fault_count() {
        let t0 = Instant::now();
        let mut b = Breaker::new(&CFG);
        b.on_failure(&CFG, t0);
        b.on_failure(&CFG, t0);
        b.on_success(&CFG);
        b.on_failure(&CFG, t0);
        b.on_failure(&CFG, t0);
        assert_eq!(b.state(t0), BreakerState::Closed);
    }
}
