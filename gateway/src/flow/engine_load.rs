//! Reading each worker's engine `/metrics` for its own queue and running counts
//! (vLLM's `vllm:num_requests_waiting` and `vllm:num_requests_running`, SGLang's
//! `sglang:num_queue_reqs` and `sglang:num_running_reqs`), every
//! `--flow-engine-scrape-ms`. The engine counts every client's requests, so gateway
//! replicas (and anything else sending there) see one load. A worker that cannot be
//! read within the interval keeps no counts, and flow control goes by this gateway's
//! own requests for it until it answers again.

use crate::workers::inflight::{EngineCounts, Inflight};
use crate::workers::registry::Registry;
use futures::future::join_all;
use infera_proto::prom_text::engine_load;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What one read of a worker's `/metrics` gives, when it has the counts.
pub(crate) fn counts_of(text: &str, at: Instant) -> Option<EngineCounts> {
    let load = engine_load(text);
    Some(EngineCounts {
        waiting: load.waiting?.max(0.0) as u64,
        running: load.running.unwrap_or(0.0).max(0.0) as u64,
        at,
        ours: 0,
    })
}

async fn read(client: &reqwest::Client, url: &str, timeout: Duration) -> Option<EngineCounts> {
    let resp = client
        .get(format!("{}/metrics", url.trim_end_matches('/')))
        .timeout(timeout)
        .send()
        .await
        .ok()?
        .error_for_status()
        .ok()?;
    let text = resp.text().await.ok()?;
    counts_of(&text, Instant::now())
}

/// Reads every registered worker's engine every `interval` until `stop`.
pub(crate) async fn run_engine_reads(
    registry: Arc<Registry>,
    inflight: Arc<Inflight>,
    client: reqwest::Client,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let snapshot = registry.snapshot();
        let reads = snapshot.workers.values().map(|r| {
            let (client, inflight) = (&client, &inflight);
            async move {
                let ours = inflight.load(&r.worker_id).pending;
                let counts = read(client, &r.url, interval).await;
                inflight.set_engine(&r.worker_id, counts, ours);
            }
        });
        join_all(reads).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_come_from_either_engines_names_and_need_a_queue() {
        let at = Instant::now();
        let vllm = "vllm:num_requests_waiting{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"1\"} 2\nvllm:num_requests_running{engine=\"0\"} 7\n";
        assert_eq!(
            counts_of(vllm, at),
            Some(EngineCounts {
                waiting: 5,
                running: 7,
                at,
                ours: 0
            })
        );
        let sglang = "sglang:num_queue_reqs{model_name=\"m\"} 1\nsglang:num_running_reqs{model_name=\"m\"} 4\n";
        assert_eq!(
            counts_of(sglang, at),
            Some(EngineCounts {
                waiting: 1,
                running: 4,
                at,
                ours: 0
            })
        );
        assert_eq!(counts_of("# a sidecar's own metrics only\n", at), None);
    }
}
