//! A queue bounded in bytes between request handlers and a background writer (the
//! NVMe tier's per-device writers, the distributed tier's write-behind): a push that
//! would exceed the bound is refused at once rather than making an engine wait.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

#[derive(Debug)]
struct State<T> {
    items: VecDeque<(T, u64)>,
    bytes: u64,
    closed: bool,
}

/// A multi-producer queue of at most `max_bytes` queued bytes, drained in batches.
#[derive(Debug)]
pub struct ByteQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    max_bytes: u64,
}

impl<T> ByteQueue<T> {
    /// A queue holding at most `max_bytes` (an item larger than that is still taken
    /// when the queue is empty, so no size is refused forever).
    pub fn new(max_bytes: u64) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                bytes: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `item` of `bytes`; false (and the item dropped) when full or closed.
    pub fn push(&self, item: T, bytes: u64) -> bool {
        let mut s = self.lock();
        if s.closed || (!s.items.is_empty() && s.bytes.saturating_add(bytes) > self.max_bytes) {
            return false;
        }
        s.bytes = s.bytes.saturating_add(bytes);
        s.items.push_back((item, bytes));
        drop(s);
        self.ready.notify_one();
        true
    }

    /// Queues a control item of no size past the bound (still not once closed).
    pub fn push_always(&self, item: T) -> bool {
        let mut s = self.lock();
        if s.closed {
            return false;
        }
        s.items.push_back((item, 0));
        drop(s);
        self.ready.notify_one();
        true
    }

    /// Waits for items and takes up to `max_items` of them (at least one); empty once the
    /// queue is closed and drained.
    pub fn pop_batch(&self, max_items: usize) -> Vec<T> {
        let mut s = self.lock();
        while s.items.is_empty() && !s.closed {
            s = self.ready.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        let n = s.items.len().min(max_items.max(1));
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            if let Some((item, bytes)) = s.items.pop_front() {
                s.bytes -= bytes;
                out.push(item);
            }
        }
        out
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Refuses new items; the consumer drains what is queued, then gets an empty batch.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_byte_bound_but_always_takes_one_item() {
        let q = ByteQueue::new(10);
        assert!(q.push("big", 50), "an empty queue takes any size");
        assert!(!q.push("more", 1), "full");
        assert_eq!(q.pop_batch(8), vec!["big"]);
        assert!(q.push("a", 6));
        assert!(q.push("b", 4));
        assert!(!q.push("c", 1));
        assert_eq!(q.pop_batch(1), vec!["a"]);
        assert!(q.push("c", 6));
        assert_eq!(q.pop_batch(8), vec!["b", "c"]);
    }

    #[test]
    fn close_drains_then_ends() {
        let q = std::sync::Arc::new(ByteQueue::new(100));
        assert!(q.push(1, 1));
        q.close();
        assert!(!q.push(2, 1), "closed");
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || (q.pop_batch(8), q.pop_batch(8)))
        };
        let (first, second) = consumer.join().unwrap();
        assert_eq!(first, vec![1]);
        assert!(second.is_empty());
    }
}
