//! Whether a worker can start a request soon (pure): its requests waiting for a first
//! byte under `--flow-max-waiting-per-worker` (this gateway's, counted live, plus what
//! the engine's own queue held beyond them when it was last read: other clients', such
//! as the other gateway replicas), and its requests in flight under
//! `--flow-seats-per-worker`. A plan keeps only the workers with room; a plan left
//! without a worker of a role it needs waits.

use crate::route::plan::Plan;
use crate::workers::inflight::WorkerLoad;
use crate::workers::registry::Target;
use std::borrow::Cow;
use std::time::{Duration, Instant};

/// How much a worker may hold before new requests wait in the gateway (0: no bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Limits {
    /// Requests waiting for their first byte.
    pub max_waiting: u64,
    /// Requests in flight.
    pub seats: u64,
    /// Engine counts older than this are not used (the engine could not be read).
    pub engine_fresh: Duration,
}

/// The engine's counts when they are recent enough to use: others' waiting requests
/// (its queue beyond this gateway's when read), and all it held (running and waiting).
fn engine(load: &WorkerLoad, limits: &Limits, now: Instant) -> Option<(u64, u64)> {
    load.engine
        .filter(|e| now.saturating_duration_since(e.at) <= limits.engine_fresh)
        .map(|e| (e.waiting.saturating_sub(e.ours), e.waiting + e.running))
}

/// Requests waiting on the worker for their first byte.
pub(crate) fn waiting(load: &WorkerLoad, limits: &Limits, now: Instant) -> u64 {
    let others = engine(load, limits, now).map_or(0, |(w, _)| w);
    load.pending + others
}

/// Whether the worker can start one more request soon.
pub(crate) fn has_room(load: &WorkerLoad, limits: &Limits, now: Instant) -> bool {
    let waiting_ok = limits.max_waiting == 0 || waiting(load, limits, now) < limits.max_waiting;
    let held = engine(load, limits, now).map_or(0, |(_, held)| held);
    let seats_ok = limits.seats == 0 || load.inflight.max(held) < limits.seats;
    waiting_ok && seats_ok
}

/// The plan with only the workers that have room; `None` when a pool it needs has none.
pub(crate) fn with_room<'s>(plan: &Plan<'s>, room: impl Fn(&Target) -> bool) -> Option<Plan<'s>> {
    let keep = |pool: &Cow<'s, [Target]>| -> Option<Cow<'s, [Target]>> {
        if pool.iter().all(&room) {
            return Some(pool.clone());
        }
        let kept: Vec<Target> = pool.iter().filter(|t| room(t)).cloned().collect();
        (!kept.is_empty()).then_some(Cow::Owned(kept))
    };
    Some(match plan {
        Plan::Mixed(c) => Plan::Mixed(keep(c)?),
        Plan::Disagg(p, d) => Plan::Disagg(keep(p)?, keep(d)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::inflight::EngineCounts;
    use infera_proto::worker::WorkerRecord;
    use serde_json::json;
    use std::sync::Arc;

    const LIMITS: Limits = Limits {
        max_waiting: 4,
        seats: 10,
        engine_fresh: Duration::from_secs(1),
    };

    fn load(
        inflight: u64,
        pending: u64,
        engine: Option<(u64, u64, u64)>,
        now: Instant,
    ) -> WorkerLoad {
        WorkerLoad {
            inflight,
            pending,
            // Read when this gateway had `pending` waiting there too.
            engine: engine.map(|(waiting, running, age_ms)| EngineCounts {
                waiting,
                running,
                at: now - Duration::from_millis(age_ms),
                ours: pending.min(waiting),
            }),
            first_byte_s: None,
        }
    }

    #[test]
    fn room_counts_our_waiting_plus_others_in_the_engines_queue_while_fresh() {
        let now = Instant::now();
        let table = [
            // (in flight, pending, engine (waiting, running, age ms)) -> room
            ((0, 0, None), true),
            ((3, 3, None), true),
            ((4, 4, None), false),
            // Another replica's requests queue in the engine: no room.
            ((1, 1, Some((4, 2, 100))), false),
            // Only ours queue there: not counted twice.
            ((3, 3, Some((3, 1, 100))), true),
            // The same report, stale: our own counts decide.
            ((1, 1, Some((4, 2, 5_000))), true),
            // Seats: the engine runs 9 and queues 1 of every client's.
            ((2, 0, Some((1, 9, 100))), false),
            ((10, 0, None), false),
            ((9, 0, Some((0, 3, 100))), true),
        ];
        for ((inflight, pending, engine), want) in table {
            let l = load(inflight, pending, engine, now);
            assert_eq!(has_room(&l, &LIMITS, now), want, "{l:?}");
        }
        let unbounded = Limits {
            max_waiting: 0,
            seats: 0,
            ..LIMITS
        };
        assert!(has_room(
            &load(1_000, 1_000, Some((1_000, 1_000, 0)), now),
            &unbounded,
            now
        ));
    }

    fn target(id: &str) -> Target {
        let record = WorkerRecord::from_json(
            json!({"worker_id": id, "url": format!("http://{id}"), "model_name": "m", "engine": "vllm"})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        Target {
            record: Arc::new(record),
            key: id.to_owned(),
            dp_rank: None,
        }
    }

    #[test]
    fn plans_keep_the_workers_with_room_and_wait_when_a_role_has_none() {
        let pool = vec![target("a:1"), target("b:1")];
        let full = |t: &Target| t.key == "a:1";
        let mixed = Plan::Mixed(Cow::Borrowed(&pool));
        let Some(Plan::Mixed(kept)) = with_room(&mixed, |t| !full(t)) else {
            panic!("b has room");
        };
        assert_eq!(
            kept.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
            ["b:1"]
        );
        assert!(with_room(&mixed, |_| false).is_none());
        let prefill = vec![target("a:1")];
        let disagg = Plan::Disagg(Cow::Borrowed(&prefill), Cow::Borrowed(&pool));
        assert!(
            with_room(&disagg, |t| !full(t)).is_none(),
            "the one prefill is full"
        );
        assert!(matches!(
            with_room(&disagg, |_| true),
            Some(Plan::Disagg(..))
        ));
    }
}
