//! S5 control plane scale: worker records written into a real etcd under a lease, churn
//! (joins and leaves), the time from a put to the worker being routable (and from a
//! delete to it leaving), the idle gateway's CPU, and the prefix index's figures.

use super::Ctx;
use super::cpu::threads_cpu;
use super::fleet::Fleet;
use super::stats::{quantile, summary};
use anyhow::{Context, Result, anyhow};
use etcd_client::PutOptions;
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Sizes of S5.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    records: usize,
    churn_per_second: f64,
    churn_seconds: f64,
    idle_seconds: f64,
    index_workers: usize,
    index_blocks_per_worker: usize,
}

fn record(i: usize) -> String {
    let (a, b) = (i / 250, i % 250);
    json!({"worker_id": format!("10.{a}.{b}.1:8000"), "url": format!("http://10.{a}.{b}.1:8000"),
           "model_name": "bench-model", "engine": "vllm", "disagg_mode": "mixed",
           "kv_block_size": 16, "dp_size": 1, "request_transport": "http"})
    .to_string()
}

fn id(i: usize) -> String {
    format!("10.{}.{}.1:8000", i / 250, i % 250)
}

/// Waits until the worker `id` is (or is no longer) in the gateway's registry.
async fn until(fleet: &Fleet, id: &str, present: bool) -> Result<Duration> {
    let t0 = Instant::now();
    loop {
        let has = fleet.gateways[0]
            .gateway
            .registry
            .snapshot()
            .workers
            .contains_key(id);
        if has == present {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(30) {
            return Err(anyhow!(
                "worker {id} never {}",
                if present { "became routable" } else { "left" }
            ));
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

/// Runs S5 against the etcd at `etcd`.
pub async fn run(ctx: &Ctx, size: &Size, etcd: &str) -> Result<Value> {
    let prefix = format!("/infera-bench/{}-{}/workers/", std::process::id(), ctx.seed);
    let flags: Vec<String> = [
        "--router-policy",
        "round-robin",
        "--etcd-endpoint",
        etcd,
        "--etcd-prefix",
        &prefix,
        "--shutdown-grace-s",
        "1",
    ]
    .map(String::from)
    .to_vec();
    let fleet = Fleet::start_discovering(&flags).await?;
    let mut client = etcd_client::Client::connect([etcd], None)
        .await
        .with_context(|| format!("connecting to etcd at {etcd}"))?;
    let lease = client.lease_grant(300, None).await?.id();
    let put = |i: usize| (format!("{prefix}{}", id(i)), record(i));
    let t0 = Instant::now();
    for i in 0..size.records {
        let (k, v) = put(i);
        client
            .put(k, v, Some(PutOptions::new().with_lease(lease)))
            .await?;
    }
    let written = t0.elapsed();
    let last = id(size.records.saturating_sub(1));
    until(&fleet, &last, true).await?;
    let all_routable = t0.elapsed();
    // Churn: joins and leaves at the given rate, each timed to the gateway's registry.
    let mut joins = Vec::new();
    let mut leaves = Vec::new();
    let n = (size.churn_per_second * size.churn_seconds) as usize;
    let gap = Duration::from_secs_f64(1.0 / size.churn_per_second.max(0.1));
    for k in 0..n {
        let tick = Instant::now();
        if k % 2 == 0 {
            let i = size.records + k;
            let (key, value) = put(i);
            let t = Instant::now();
            client
                .put(key, value, Some(PutOptions::new().with_lease(lease)))
                .await?;
            until(&fleet, &id(i), true).await?;
            joins.push(t.elapsed().as_secs_f64());
        } else {
            let i = k;
            let t = Instant::now();
            client.delete(format!("{prefix}{}", id(i)), None).await?;
            until(&fleet, &id(i), false).await?;
            leaves.push(t.elapsed().as_secs_f64());
        }
        tokio::time::sleep(gap.saturating_sub(tick.elapsed())).await;
    }
    let workers = fleet.gateways[0].gateway.registry.snapshot().workers.len();
    // Idle: nothing changes; the gateway's threads should sleep.
    let cpu0 = threads_cpu("infera-gw");
    tokio::time::sleep(Duration::from_secs_f64(size.idle_seconds)).await;
    let idle_pct =
        threads_cpu("infera-gw").saturating_sub(cpu0).as_secs_f64() / size.idle_seconds * 100.0;
    let _ = client.lease_revoke(lease).await;
    fleet.shutdown().await;
    let (w, b) = (size.index_workers, size.index_blocks_per_worker);
    let index = tokio::task::spawn_blocking(move || infera_gateway::bench::measure(w, b))
        .await?
        .map_err(|e| anyhow!("index measurement: {e}"))?;
    Ok(json!({
        "runs": [{
            "records": size.records,
            "workers_at_end": workers,
            "write_s": written.as_secs_f64(),
            "all_routable_s": all_routable.as_secs_f64(),
            "join_to_routable_ms": summary(&joins, 1e3),
            "leave_to_gone_ms": summary(&leaves, 1e3),
            "idle_gateway_cpu_percent": idle_pct,
            "index_inserts_per_s": index.inserts_per_s,
            "index_bytes_per_block": index.bytes_per_block,
            "index_hit_counts_per_s": index.hit_counts_per_s,
            "route_decision_us": index.decision_us,
            "route_decision_workers": w,
        }],
        "verdicts": {
            "join_to_routable_p99_ms": quantile(&joins, 0.99) * 1e3,
            "idle_gateway_cpu_percent": idle_pct,
            "index_inserts_per_s": index.inserts_per_s,
            "index_bytes_per_block": index.bytes_per_block,
            "targets": {"routable_ms": "< 100", "idle_cpu_percent": "< 1", "index_ops_per_s": ">= 1e6", "bytes_per_block": "<= 64"},
        },
    }))
}
