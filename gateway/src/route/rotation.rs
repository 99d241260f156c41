//! Load-balancing policies: pure choices over an immutable candidate list. Round-robin
//! keeps one counter per distinct candidate list (so prefill and decode pools, or a
//! pool minus a failed worker, rotate independently); random picks uniformly.

use crate::workers::registry::Target;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

/// Which policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicyKind {
    /// Rotate through the candidates.
    RoundRobin,
    /// Uniformly at random.
    Random,
}

/// A policy with its state.
#[derive(Debug)]
pub(crate) struct Policy {
    kind: PolicyKind,
    counters: Mutex<HashMap<u64, u64>>,
}

impl Policy {
    /// A fresh policy.
    pub(crate) fn new(kind: PolicyKind) -> Self {
        Self {
            kind,
            counters: Mutex::new(HashMap::new()),
        }
    }

    /// Index of the chosen candidate, `None` for an empty list.
    pub(crate) fn pick(&self, candidates: &[&Target]) -> Option<usize> {
        if candidates.is_empty() {
            return None;
        }
        match self.kind {
            PolicyKind::Random => Some(fastrand::usize(..candidates.len())),
            PolicyKind::RoundRobin => {
                let mut h = DefaultHasher::new();
                for t in candidates {
                    t.key.hash(&mut h);
                }
                let key = h.finish();
                let mut counters = self.counters.lock().ok()?;
                let n = counters.entry(key).or_insert(0);
                let pick = (*n % candidates.len() as u64) as usize;
                *n = n.wrapping_add(1);
                Some(pick)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infera_proto::worker::WorkerRecord;
    use std::sync::Arc;

    fn mk_target(key: &str) -> Target {
        let record = WorkerRecord::from_json(
            format!(
                r#"{{"worker_id":"{key}","url":"http://{key}","model_name":"m","engine":"vllm"}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        Target {
            record: Arc::new(record),
            key: key.to_owned(),
            dp_rank: None,
        }
    }

    #[test]
    fn round_robin_rotates_per_distinct_list() {
        let (a, b, c) = (mk_target("a:1"), mk_target("b:1"), mk_target("c:1"));
        let p = Policy::new(PolicyKind::RoundRobin);
        let abc = [&a, &b, &c];
        let picks: Vec<usize> = (0..6).map(|_| p.pick(&abc).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        // Another list has its own counter.
        assert_eq!(p.pick(&[&b, &c]), Some(0));
        assert_eq!(p.pick(&abc), Some(0));
        assert_eq!(p.pick(&[]), None);
    }

    #[test]
    fn random_stays_in_range() {
        let (a, b) = (mk_target("a:1"), mk_target("b:1"));
        let p = Policy::new(PolicyKind::Random);
        let mut seen = [0; 2];
        for _ in 0..200 {
            seen[p.pick(&[&a, &b]).unwrap()] += 1;
        }
        assert!(seen[0] > 50 && seen[1] > 50, "{seen:?}");
    }
}
