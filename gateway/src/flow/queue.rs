//! The gateway's wait queue (pure): requests whose workers have no room, per model,
//! ordered by class (higher first), then deadline, then arrival. It is bounded in
//! requests and in body bytes: when full, a newcomer takes the place of queued
//! requests of a lower class (the lowest, latest-deadline ones are shed first), or is
//! refused; it never grows past its bounds.

use crate::flow::class::Priority;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// A queued request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Waiter {
    /// Its ticket.
    pub id: u64,
    /// The model it asks for.
    pub model: String,
    /// Its class.
    pub class: Priority,
    /// When its first token is due.
    pub deadline: Instant,
    /// Its body's bytes.
    pub bytes: usize,
    /// The pool it waits for (`mixed`, `prefill` or `decode`).
    pub role: &'static str,
}

/// The queue's bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bounds {
    /// Requests queued at once.
    pub requests: usize,
    /// Body bytes queued at once.
    pub bytes: usize,
}

/// What offering a request did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Offer {
    /// Queued; these lower-class requests were shed to make room.
    Queued(Vec<Waiter>),
    /// Refused: the queue is full of requests of its class or higher.
    Refused,
}

type Key = (Reverse<Priority>, Instant, u64);

/// Requests waiting for room, per model.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    models: HashMap<String, BTreeMap<Key, Waiter>>,
    keys: HashMap<u64, (String, Key)>,
    bytes: usize,
}

fn key(w: &Waiter) -> Key {
    (Reverse(w.class), w.deadline, w.id)
}

impl WaitQueue {
    /// Requests queued.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    #[cfg(test)]
    /// Body bytes queued.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    /// Whether `id` is queued.
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.keys.contains_key(&id)
    }

    /// The first request of `model`.
    pub(crate) fn head(&self, model: &str) -> Option<&Waiter> {
        self.models.get(model)?.values().next()
    }

    /// The first request of every model.
    pub(crate) fn heads(&self) -> impl Iterator<Item = &Waiter> {
        self.models.values().filter_map(|q| q.values().next())
    }

    /// Requests ahead of `id` in its model's queue.
    pub(crate) fn ahead_of(&self, id: u64) -> usize {
        let Some((model, k)) = self.keys.get(&id) else {
            return 0;
        };
        self.models.get(model).map_or(0, |q| q.range(..k).count())
    }

    #[cfg(test)]
    /// Requests queued for `model`, per class (in [`Priority::ALL`]'s order).
    pub(crate) fn depth(&self, model: &str) -> [usize; 4] {
        let mut out = [0; 4];
        for w in self
            .models
            .get(model)
            .into_iter()
            .flat_map(BTreeMap::values)
        {
            out[w.class.index()] += 1;
        }
        out
    }

    /// The requests queued for `model`, first first.
    pub(crate) fn waiters(&self, model: &str) -> impl Iterator<Item = &Waiter> {
        self.models
            .get(model)
            .into_iter()
            .flat_map(BTreeMap::values)
    }

    /// Records the pool `id` now waits for.
    pub(crate) fn set_role(&mut self, id: u64, role: &'static str) {
        if let Some((model, k)) = self.keys.get(&id)
            && let Some(w) = self.models.get_mut(model).and_then(|q| q.get_mut(k))
        {
            w.role = role;
        }
    }

    /// Queues `w` within `bounds`, shedding lower classes if that makes room.
    pub(crate) fn offer(&mut self, w: Waiter, bounds: Bounds) -> Offer {
        let fits = |n: usize, bytes: usize| n < bounds.requests && bytes + w.bytes <= bounds.bytes;
        if w.bytes > bounds.bytes {
            return Offer::Refused;
        }
        let (mut n, mut bytes) = (self.len(), self.bytes);
        let mut victims: Vec<(String, Key, usize)> = Vec::new();
        if !fits(n, bytes) {
            // The lowest classes first, latest deadline first within one.
            let mut lower: Vec<(String, Key, usize)> = self
                .models
                .iter()
                .flat_map(|(m, q)| q.iter().map(move |(k, v)| (m.clone(), *k, v.bytes)))
                .filter(|(_, k, _)| k.0.0 < w.class)
                .collect();
            lower.sort_by(|a, b| {
                (a.1.0.0, Reverse(a.1.1), Reverse(a.1.2)).cmp(&(
                    b.1.0.0,
                    Reverse(b.1.1),
                    Reverse(b.1.2),
                ))
            });
            for v in lower {
                if fits(n, bytes) {
                    break;
                }
                n -= 1;
                bytes -= v.2;
                victims.push(v);
            }
            if !fits(n, bytes) {
                return Offer::Refused;
            }
        }
        let shed = victims
            .into_iter()
            .filter_map(|(_, k, _)| self.remove(k.2))
            .collect();
        let k = key(&w);
        self.bytes += w.bytes;
        self.keys.insert(w.id, (w.model.clone(), k));
        self.models.entry(w.model.clone()).or_default().insert(k, w);
        Offer::Queued(shed)
    }

    /// Takes `id` out of the queue.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Waiter> {
        let (model, k) = self.keys.remove(&id)?;
        let w = self.models.get_mut(&model)?.remove(&k)?;
        self.bytes -= w.bytes;
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn waiter(
        id: u64,
        model: &str,
        class: Priority,
        due_ms: u64,
        bytes: usize,
        t0: Instant,
    ) -> Waiter {
        Waiter {
            id,
            model: model.into(),
            class,
            deadline: t0 + Duration::from_millis(due_ms),
            bytes,
            role: "mixed",
        }
    }

    const ROOMY: Bounds = Bounds {
        requests: 100,
        bytes: 1 << 20,
    };

    #[test]
    fn heads_go_by_class_then_deadline_then_arrival_per_model() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        let table = [
            (1, "m", Priority::Batch, 10),
            (2, "m", Priority::Standard, 900),
            (3, "m", Priority::Standard, 500),
            (4, "m", Priority::Interactive, 2_000),
            (5, "other", Priority::Batch, 1),
            (6, "m", Priority::Standard, 500),
        ];
        for (id, model, class, due) in table {
            assert_eq!(
                q.offer(waiter(id, model, class, due, 10, t0), ROOMY),
                Offer::Queued(vec![])
            );
        }
        let mut order = Vec::new();
        while let Some(h) = q.head("m").map(|w| w.id) {
            order.push((h, q.ahead_of(h)));
            q.remove(h);
        }
        assert_eq!(order, [(4, 0), (3, 0), (6, 0), (2, 0), (1, 0)]);
        assert_eq!(
            (q.len(), q.bytes(), q.head("other").map(|w| w.id)),
            (1, 10, Some(5))
        );
    }

    #[test]
    fn full_sheds_the_lowest_class_latest_deadline_first_or_refuses() {
        let t0 = Instant::now();
        let bounds = Bounds {
            requests: 3,
            bytes: 100,
        };
        let mut q = WaitQueue::default();
        for (id, class, due) in [
            (1, Priority::Batch, 100),
            (2, Priority::Batch, 200),
            (3, Priority::Standard, 50),
        ] {
            assert_eq!(
                q.offer(waiter(id, "m", class, due, 10, t0), bounds),
                Offer::Queued(vec![])
            );
        }
        assert_eq!(q.ahead_of(1), 1);
        // A batch request finds no lower class: refused.
        assert_eq!(
            q.offer(waiter(4, "m", Priority::Batch, 1, 10, t0), bounds),
            Offer::Refused
        );
        // An interactive one sheds the batch request due last.
        let Offer::Queued(shed) = q.offer(waiter(5, "m", Priority::Interactive, 1, 10, t0), bounds)
        else {
            panic!("queued");
        };
        assert_eq!(shed.iter().map(|w| w.id).collect::<Vec<_>>(), [2]);
        // Bytes bound too: 90 more bytes need both lower-class requests gone.
        let Offer::Queued(shed) = q.offer(waiter(6, "m", Priority::Critical, 1, 90, t0), bounds)
        else {
            panic!("queued");
        };
        assert_eq!(shed.iter().map(|w| w.id).collect::<Vec<_>>(), [1, 3]);
        assert_eq!((q.len(), q.bytes()), (2, 100));
        assert_eq!(q.depth("m"), [0, 0, 1, 1]);
        // Larger than the whole bound: refused, nothing shed.
        assert_eq!(
            q.offer(waiter(7, "m", Priority::Critical, 1, 101, t0), bounds),
            Offer::Refused
        );
        assert_eq!(q.len(), 2);
    }

    proptest! {
        #[test]
        fn never_past_its_bounds_and_sheds_only_lower_classes(
            offers in proptest::collection::vec((0usize..4, 0u64..1_000, 0usize..60, any::<bool>()), 1..80),
            requests in 1usize..12,
            bytes in 1usize..300,
        ) {
            let t0 = Instant::now();
            let bounds = Bounds { requests, bytes };
            let mut q = WaitQueue::default();
            for (id, (class, due, size, take_head)) in offers.into_iter().enumerate() {
                let class = Priority::ALL[class];
                match q.offer(waiter(id as u64, "m", class, due, size, t0), bounds) {
                    Offer::Queued(shed) => {
                        prop_assert!(shed.iter().all(|w| w.class < class));
                        prop_assert!(q.contains(id as u64));
                    }
                    Offer::Refused => prop_assert!(!q.contains(id as u64)),
                }
                prop_assert!(q.len() <= requests && q.bytes() <= bytes);
                prop_assert_eq!(q.depth("m").iter().sum::<usize>(), q.len());
                if take_head && let Some(h) = q.head("m").map(|w| w.id) {
                    prop_assert_eq!(q.ahead_of(h), 0);
                    q.remove(h);
                }
            }
        }
    }
}
