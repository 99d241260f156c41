//! kvd in the serving path, on the node: simulated engines with `spec.kvCache` store their
//! finished requests' blocks in the kvd beside them and load them back once their HBM
//! has evicted them; with the distributed tier (a real Redis), a block one worker stored
//! is read back by another worker's kvd.
//!
//! The Redis is Debian's `redis-server`, run by the test on the node's address (no Redis
//! image can be pulled here); the pods reach it there, as they reach any external store.
//! Each worker is asked directly at its pod address, so the test decides who serves what.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::gitops::NODE_IP;
use infera_e2e::{Cluster, eventually};
use infera_testkit::process::{ServerProcess, free_port};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const NAME: &str = "kvd-sim";
const MODEL: &str = "sim-kvd-model";
const WAIT: Duration = Duration::from_secs(120);

fn manifest(redis: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {NAME}}}
spec:
  replicas: 2
  model: {{name: {MODEL}, source: {{hostPath: {{path: /models/none}}}}}}
  # 64 blocks of 16 tokens of HBM: a 600-token prompt and two others do not fit at once.
  # The shared tier stated as fast as an RDMA store: at the measured same-host Redis
  # rate, recomputing 600 tokens is quicker than loading them, and B would compute.
  engine: {{kind: sim, args: ['--kv-blocks', '64', '--kvd-tier-cost', 'remote=0.37:20']}}
  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
  kvCache:
    enabled: true
    ram: 64Mi
    remoteUrl: {redis}
"
    )
}

/// A prompt of about `chars` characters (the byte codec: a token each), distinct by `tag`.
fn prompt(tag: &str, chars: usize) -> String {
    let mut s = format!("{tag}: ");
    while s.len() < chars {
        s.push_str(tag);
        s.push(' ');
    }
    s.truncate(chars);
    s
}

async fn chat(ip: &str, content: &str) -> Value {
    let resp = infera_e2e::http()
        .post(format!("http://{ip}:8000/v1/chat/completions"))
        .json(&json!({"model": MODEL, "max_tokens": 4,
                      "messages": [{"role": "user", "content": content}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

fn cached(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// A sample of `url`'s Prometheus text: the series `series` as written (labels included
/// when given), or its first sample when `series` names a family; 0 when absent.
async fn sample(url: &str, series: &str) -> f64 {
    let text = infera_e2e::http()
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let rest = l.strip_prefix(series)?;
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                return None;
            }
            l.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or(0.0)
}

fn start_redis(dir: &Path, port: u16) -> ServerProcess {
    let bin = Path::new("/usr/bin/redis-server");
    assert!(
        bin.exists(),
        "this test needs Debian's redis-server (testenv/packages installs it)"
    );
    ServerProcess::start(
        bin,
        &[
            "--bind".into(),
            NODE_IP.into(),
            "--port".into(),
            port.to_string(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--protected-mode".into(),
            "no".into(),
            "--dir".into(),
            dir.display().to_string(),
        ],
        &dir.join("redis.log"),
    )
    .unwrap()
}

#[tokio::test]
async fn blocks_leave_hbm_for_kvd_come_back_from_it_and_reach_another_worker() {
    let cluster = Cluster::connect().await.unwrap();
    let guard = cluster.namespace("e2e-kvd").await.unwrap();
    let ns = guard.name.as_str();
    let scratch = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let _redis = start_redis(scratch.path(), port);
    cluster
        .apply(ns, &manifest(&format!("redis://{NODE_IP}:{port}")))
        .await
        .unwrap();
    cluster.wait_ready(ns, NAME).await.unwrap();
    let pods = cluster.engine_pods(ns, NAME).await.unwrap();
    let ip = |i: usize| pods[i]["status"]["podIP"].as_str().unwrap().to_owned();
    let (a, b) = (ip(0), ip(1));
    let sim = |ip: &str| format!("http://{ip}:8000/metrics");
    let kvd = |ip: &str| format!("http://{ip}:9401/metrics");
    let model = format!("model_name=\"{MODEL}\"");

    // Worker A computes the prompt; its blocks go to its kvd (and, long, to Redis).
    let first = chat(&a, &prompt("alpha", 600)).await;
    assert_eq!(cached(&first), 0, "{first}");
    eventually(
        &cluster,
        ns,
        "alpha's blocks stored in kvd",
        WAIT,
        || async {
            let n = sample(
                &sim(&a),
                &format!("infera_sim_kvd_stored_blocks_total{{{model}}}"),
            )
            .await;
            if n >= 30.0 {
                Ok(())
            } else {
                Err(format!("{n} blocks stored"))
            }
        },
    )
    .await
    .unwrap();
    // Two other prompts push alpha out of A's HBM; the repeat comes back from kvd's RAM.
    for tag in ["bravo", "charlie"] {
        chat(&a, &prompt(tag, 600)).await;
    }
    assert!(sample(&sim(&a), &format!("infera_sim_evictions_total{{{model}}}")).await > 0.0);
    let again = chat(&a, &prompt("alpha", 600)).await;
    let loaded = sample(
        &sim(&a),
        &format!("infera_sim_kvd_loaded_tokens_total{{{model},tier=\"host\"}}"),
    )
    .await;
    println!(
        "worker A: repeat cached {} tokens, {loaded} loaded from kvd's RAM",
        cached(&again)
    );
    assert!(cached(&again) >= 500, "{again}");
    assert!(loaded >= 500.0);
    assert!(sample(&kvd(&a), "infera_kvd_entries").await >= 30.0);
    assert!(sample(&kvd(&a), "infera_kvd_hits_total").await >= 30.0);

    // Worker B never saw the prompt: once A's kvd has written it behind to Redis, B's
    // kvd finds it in the shared tier and B loads it.
    let redis = format!("{NODE_IP}:{port}");
    eventually(&cluster, ns, "alpha's blocks in Redis", WAIT, || async {
        let keys = infera_testkit::redis::key_count(&redis).map_err(|e| e.to_string())?;
        if keys >= 30 {
            Ok(())
        } else {
            Err(format!("{keys} keys"))
        }
    })
    .await
    .unwrap();
    let on_b = chat(&b, &prompt("alpha", 600)).await;
    let remote = sample(
        &sim(&b),
        &format!("infera_sim_kvd_loaded_tokens_total{{{model},tier=\"remote\"}}"),
    )
    .await;
    let hits = sample(&kvd(&b), "infera_kvd_tier_hits_total{tier=\"remote\"}").await;
    println!(
        "worker B: cached {} tokens, {remote} loaded from Redis, {hits} remote hits",
        cached(&on_b)
    );
    assert!(cached(&on_b) >= 500, "{on_b}");
    assert!(remote >= 500.0);
    assert!(hits >= 30.0);
}
