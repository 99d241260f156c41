//! The gate a request passes between its plan and its send when flow control is on.
//!
//! A request whose plan has a worker with room goes at once, unless requests of its
//! model already wait: then it queues behind those ahead of it (class, then deadline).
//! Only the head of a model's queue is woken when room may have been freed (a request
//! ended or had its first byte, an engine reported, a worker joined or left), and the
//! head that goes wakes the next, so a burst of room drains the queue in order without
//! waking every waiter.
//!
//! A waiting request gives up, with 429 and `Retry-After`, once it can no longer meet
//! its deadline: when the queue ahead of it, at the pace requests have been leaving it,
//! plus the workers' time to a first byte would pass the deadline (decided at once, so
//! a request that has no chance hears so in microseconds), or when that moment comes.
//! A request waiting for a role that has no worker at all waits to its deadline, then
//! gets 503. A request displaced by a higher class gets 429 at once.

use crate::flow::class::{Asked, Priority};
use crate::flow::config::FlowArgs;
use crate::flow::queue::{Offer, WaitQueue, Waiter};
use crate::flow::room::{Limits, has_room};
use crate::metrics::Metrics;
use crate::workers::inflight::Inflight;
use crate::workers::registry::Registry;
use infera_proto::error_class::{ApiError, ErrorClass};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

/// Weight of the newest interval in the pace's moving average.
const PACE_ALPHA: f64 = 0.2;

/// Flow control's shared state.
#[derive(Debug)]
pub(crate) struct FlowControl {
    args: FlowArgs,
    limits: Limits,
    inflight: Arc<Inflight>,
    metrics: Arc<Metrics>,
    state: Mutex<GateState>,
    body: Arc<Semaphore>,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct GateState {
    queue: WaitQueue,
    wakers: HashMap<u64, Arc<Notify>>,
    /// Requests displaced by a higher class, until they see it.
    displaced: Vec<u64>,
    /// Per model: how fast requests leave its queue.
    pace: HashMap<String, Pace>,
}

/// Seconds between requests leaving a model's queue (a moving average), measured only
/// over stretches when requests waited the whole time: the pace room frees up, not the
/// pace of arrivals nor an idle gap.
#[derive(Debug, Default, Clone, Copy)]
struct Pace {
    /// The last send after which requests were still waiting.
    last: Option<Instant>,
    interval: Option<f64>,
}

impl Pace {
    /// A request left the queue (or went at once) at `now`; `backlog` when others still
    /// wait after it.
    fn sent(&mut self, now: Instant, backlog: bool) {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.interval = Some(match self.interval {
                Some(i) => i + PACE_ALPHA * (dt - i),
                None => dt,
            });
        }
        self.last = backlog.then_some(now);
    }
}

/// Why a request waits.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Why {
    /// Every worker of `role` it could go to is full; they answer a first byte in about
    /// this long once they start a request.
    Full {
        /// The pool without room.
        role: &'static str,
        /// The candidates' time to a first byte.
        first_byte: Duration,
    },
    /// No worker of `role` is there at all.
    NoWorker {
        /// The missing pool.
        role: &'static str,
        /// What routing said.
        error: ApiError,
    },
}

/// The part of the body budget a request holds, from its body's first byte.
#[derive(Debug)]
pub(crate) struct BodyPermit(#[allow(dead_code)] OwnedSemaphorePermit);

impl FlowControl {
    /// Flow control as `args` set it, over the gateway's per-worker loads.
    pub(crate) fn new(args: FlowArgs, inflight: Arc<Inflight>, metrics: Arc<Metrics>) -> Self {
        let budget = args.flow_body_bytes.min(Semaphore::MAX_PERMITS);
        Self {
            limits: args.limits(),
            args,
            inflight,
            metrics,
            state: Mutex::default(),
            body: Arc::new(Semaphore::new(budget)),
            next_id: AtomicU64::new(1),
        }
    }

    /// Its settings.
    pub(crate) fn args(&self) -> &FlowArgs {
        &self.args
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `worker` can start one more request soon.
    pub(crate) fn has_room(&self, worker: &str) -> bool {
        has_room(&self.inflight.load(worker), &self.limits, Instant::now())
    }

    /// The shortest time to a first byte among `workers` (zero when none was measured).
    pub(crate) fn first_byte<'w>(&self, workers: impl Iterator<Item = &'w str>) -> Duration {
        workers
            .filter_map(|w| self.inflight.load(w).first_byte_s)
            .fold(None, |best: Option<f64>, s| {
                Some(best.map_or(s, |b| b.min(s)))
            })
            .map_or(Duration::ZERO, Duration::from_secs_f64)
    }

    /// Takes `n` more bytes of the body budget into `held`; 429 when the gateway holds
    /// its budget's worth of bodies.
    pub(crate) fn take_body_bytes(
        &self,
        held: &mut Option<BodyPermit>,
        n: usize,
    ) -> Result<(), ApiError> {
        if n == 0 {
            return Ok(());
        }
        let more = u32::try_from(n)
            .ok()
            .and_then(|n| self.body.clone().try_acquire_many_owned(n).ok());
        let Some(more) = more else {
            self.metrics.record_flow_wait(
                self.args.default_class().as_str(),
                0.0,
                Some("body_budget"),
            );
            return Err(ApiError::new(
                ErrorClass::RateLimited,
                format!(
                    "the gateway holds its limit of {} bytes of request bodies (--flow-body-bytes); retry shortly",
                    self.args.flow_body_bytes
                ),
            )
            .with_code("body_budget"));
        };
        match held {
            Some(BodyPermit(p)) => p.merge(more),
            None => *held = Some(BodyPermit(more)),
        }
        Ok(())
    }

    /// A ticket for a request of `model` that arrived at `arrived`.
    pub(crate) fn ticket(
        &self,
        model: &str,
        asked: Asked,
        bytes: usize,
        arrived: Instant,
    ) -> Ticket<'_> {
        let due = asked
            .deadline
            .unwrap_or_else(|| self.args.deadline(asked.class));
        Ticket {
            flow: self,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            model: model.to_owned(),
            class: asked.class,
            arrived,
            deadline: arrived + due,
            bytes,
            queued: false,
            notify: Arc::new(Notify::new()),
        }
    }

    /// Wakes the first request of every model's queue.
    pub(crate) fn wake_heads(&self) {
        let state = self.lock();
        for head in state.queue.heads() {
            if let Some(n) = state.wakers.get(&head.id) {
                n.notify_one();
            }
        }
    }

    /// Sets `model`'s queue gauges from the queue.
    fn refresh_gauges(&self, state: &GateState, model: &str) {
        let mut counts: HashMap<(&'static str, Priority), usize> = HashMap::new();
        for w in state.queue.waiters(model) {
            *counts.entry((w.role, w.class)).or_default() += 1;
        }
        for role in ["mixed", "prefill", "decode"] {
            for class in Priority::ALL {
                let n = counts.get(&(role, class)).copied().unwrap_or(0);
                self.metrics.set_flow_queued(model, role, class.as_str(), n);
            }
        }
    }

    /// Requests waiting, and how long the queue of `model` takes to drain at its pace.
    fn drain_estimate(state: &GateState, model: &str) -> Duration {
        let n = state.queue.waiters(model).count();
        let interval = state
            .pace
            .get(model)
            .and_then(|p| p.interval)
            .unwrap_or(0.0);
        Duration::from_secs_f64(n as f64 * interval)
    }
}

/// One request's passage through the gate; leaving the queue when dropped (the client
/// went away, or the request was answered).
#[derive(Debug)]
pub(crate) struct Ticket<'f> {
    flow: &'f FlowControl,
    id: u64,
    model: String,
    class: Priority,
    arrived: Instant,
    deadline: Instant,
    bytes: usize,
    queued: bool,
    notify: Arc<Notify>,
}

impl Ticket<'_> {
    /// Whether its deadline has passed.
    pub(crate) fn past_deadline(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// The request found room: it goes if no request of its model waits ahead of it.
    pub(crate) fn may_go(&mut self) -> bool {
        let flow = self.flow;
        let mut state = flow.lock();
        let head = state.queue.head(&self.model).map(|w| w.id);
        if head.is_some_and(|h| h != self.id) {
            return false;
        }
        let now = Instant::now();
        let backlog = state.queue.waiters(&self.model).count() > usize::from(self.queued);
        state
            .pace
            .entry(self.model.clone())
            .or_default()
            .sent(now, backlog);
        if self.queued {
            self.leave(&mut state);
            flow.metrics.record_flow_wait(
                self.class.as_str(),
                now.saturating_duration_since(self.arrived).as_secs_f64(),
                None,
            );
        }
        true
    }

    /// Out of the queue, waking the next head.
    fn leave(&mut self, state: &mut GateState) {
        state.queue.remove(self.id);
        state.wakers.remove(&self.id);
        state.displaced.retain(|id| *id != self.id);
        self.queued = false;
        if let Some(next) = state.queue.head(&self.model)
            && let Some(n) = state.wakers.get(&next.id)
        {
            n.notify_one();
        }
        self.flow.refresh_gauges(state, &self.model);
    }

    /// Refuses the request for `reason`, out of the queue.
    fn shed(&mut self, state: &mut GateState, reason: &'static str, err: ApiError) -> ApiError {
        if self.queued {
            self.leave(state);
        }
        let waited = self.arrived.elapsed().as_secs_f64();
        self.flow
            .metrics
            .record_flow_wait(self.class.as_str(), waited, Some(reason));
        let retry = FlowControl::drain_estimate(state, &self.model)
            .as_secs_f64()
            .ceil();
        err.with_retry_after((retry as u64).clamp(1, 60))
    }

    /// Waits (in the queue) until the request may look for room again; an error when it
    /// must be answered instead.
    pub(crate) async fn wait(&mut self, why: &Why) -> Result<(), ApiError> {
        let flow = self.flow;
        let now = Instant::now();
        let was_queued = self.queued;
        let give_up_at = {
            let mut state = flow.lock();
            let role = match why {
                Why::Full { role, .. } | Why::NoWorker { role, .. } => *role,
            };
            if !self.queued {
                let waiter = Waiter {
                    id: self.id,
                    model: self.model.clone(),
                    class: self.class,
                    deadline: self.deadline,
                    bytes: self.bytes,
                    role,
                };
                match state.queue.offer(waiter, flow.args.bounds()) {
                    Offer::Refused => {
                        let err = ApiError::new(
                            ErrorClass::RateLimited,
                            format!(
                                "the gateway's queue is full ({} requests, --flow-queue-requests) of requests of class {} or higher; retry shortly",
                                flow.args.flow_queue_requests,
                                self.class.as_str()
                            ),
                        )
                        .with_code("queue_full");
                        return Err(self.shed(&mut state, "queue_full", err));
                    }
                    Offer::Queued(displaced) => {
                        for w in displaced {
                            state.displaced.push(w.id);
                            if let Some(n) = state.wakers.get(&w.id) {
                                n.notify_one();
                            }
                        }
                        self.queued = true;
                        state.wakers.insert(self.id, self.notify.clone());
                    }
                }
            } else {
                state.queue.set_role(self.id, role);
            }
            flow.refresh_gauges(&state, &self.model);
            if state.displaced.contains(&self.id) {
                let err = ApiError::new(
                    ErrorClass::RateLimited,
                    format!(
                        "the gateway's queue is full and a request of a higher class took this {} request's place; retry shortly",
                        self.class.as_str()
                    ),
                )
                .with_code("displaced");
                return Err(self.shed(&mut state, "displaced", err));
            }
            match why {
                Why::NoWorker { error, .. } => {
                    if now >= self.deadline {
                        let err = error
                            .clone()
                            .with_code(error.code.clone().unwrap_or_else(|| "no_worker".into()));
                        return Err(self.shed(&mut state, "no_worker", err));
                    }
                    self.deadline
                }
                Why::Full { first_byte, .. } => {
                    let give_up_at = self.deadline.checked_sub(*first_byte).unwrap_or(now);
                    let ahead = state.queue.ahead_of(self.id) as f64;
                    let pace = state.pace.get(&self.model).and_then(|p| p.interval);
                    let expected = pace.map_or(Duration::ZERO, |i| {
                        Duration::from_secs_f64((ahead + 1.0) * i)
                    });
                    if now >= give_up_at || now + expected > give_up_at {
                        let err = ApiError::new(
                            ErrorClass::RateLimited,
                            format!(
                                "every worker of model '{}' is busy and this request cannot start within its TTFT deadline of {} ms; retry shortly",
                                self.model,
                                self.deadline.saturating_duration_since(self.arrived).as_millis()
                            ),
                        )
                        .with_code("deadline");
                        return Err(self.shed(&mut state, "deadline", err));
                    }
                    give_up_at
                }
            }
        };
        // Just queued: room freed between the caller's look and now woke nobody (the
        // request was not in the queue yet), so the caller looks again before sleeping.
        if !was_queued {
            return Ok(());
        }
        tokio::select! {
            _ = self.notify.notified() => {}
            _ = tokio::time::sleep_until(give_up_at.into()) => {}
        }
        Ok(())
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.queued {
            let flow = self.flow;
            let mut state = flow.lock();
            self.leave(&mut state);
        }
    }
}

/// Wakes the heads of the queues whenever room may have been freed or the workers
/// changed, until `stop`.
pub(crate) async fn run_wakeups(
    flow: Arc<FlowControl>,
    registry: Arc<Registry>,
    mut stop: watch::Receiver<bool>,
) {
    let mut changes = registry.subscribe_changes();
    let inflight = flow.inflight.clone();
    loop {
        let freed = inflight.freed();
        tokio::pin!(freed);
        freed.as_mut().enable();
        flow.wake_heads();
        tokio::select! {
            _ = &mut freed => {}
            changed = changes.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_counts_only_stretches_with_requests_waiting() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Pace::default();
        // Sends with nobody left waiting: no pace, however far apart.
        p.sent(at(0), false);
        p.sent(at(5_000), false);
        assert_eq!(p.interval, None);
        // A backlog drains one every 100 ms.
        p.sent(at(5_100), true);
        p.sent(at(5_200), true);
        p.sent(at(5_300), false);
        let i = p.interval.unwrap();
        assert!((i - 0.1).abs() < 1e-9, "{i}");
        // An idle minute later: not counted.
        p.sent(at(65_300), true);
        assert!((p.interval.unwrap() - 0.1).abs() < 1e-9);
    }
}
