//! Heavy work on behalf of one request (checking, parsing, rendering, tokenizing and
//! serializing a large body) kept from holding the other requests: one request of a few
//! megabytes took a worker thread for up to a second, and `/health` with it.

/// Bodies from this size on are checked, parsed and tokenized off the async workers
/// (a few thousand tokens; below it, handing the worker over costs more than it saves).
pub(crate) const OFF_WORKERS_BYTES: usize = 32 * 1024;

/// Runs `work` for a body of `body_bytes`: a large one's parsing, rendering and
/// tokenizing take milliseconds to seconds, so on a worker thread of its own (the
/// runtime moves its other tasks, `/health` among them, to another), a small one here.
pub(crate) fn off_workers<R>(body_bytes: usize, work: impl FnOnce() -> R) -> R {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if body_bytes >= OFF_WORKERS_BYTES && multi_thread {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// Whether a task queued on the only worker ran while `body_bytes` of work held it.
    async fn others_ran_during(body_bytes: usize, hold: Duration) -> bool {
        tokio::spawn(async move {
            let ran = Arc::new(AtomicBool::new(false));
            let flag = ran.clone();
            tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
            off_workers(body_bytes, || {
                let until = Instant::now() + hold;
                while !ran.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                ran.load(Ordering::SeqCst)
            })
        })
        .await
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn other_requests_run_while_a_large_body_is_worked_on() {
        assert!(others_ran_during(OFF_WORKERS_BYTES, Duration::from_secs(10)).await);
        // A small body's work stays inline: on one worker nothing else runs meanwhile.
        assert!(!others_ran_during(OFF_WORKERS_BYTES - 1, Duration::from_millis(200)).await);
    }

    #[tokio::test]
    async fn a_single_threaded_runtime_works_inline() {
        assert_eq!(off_workers(OFF_WORKERS_BYTES * 2, || 7), 7);
    }
}
