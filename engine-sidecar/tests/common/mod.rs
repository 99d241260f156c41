//! Helpers of the sidecar's integration tests: a sidecar launching `infera-sim`, and a
//! gateway finding it in etcd.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use infera_proto::discovery::build_worker_key;
use infera_proto::worker::WorkerRecord;
use infera_testkit::process::{ServerProcess, free_port};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const SIDECAR: &str = env!("CARGO_BIN_EXE_infera-engine-sidecar");

pub fn args_of(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `target/<profile>/infera-sim`, built by `cargo test --workspace` (the README's test
/// command); `cargo build -p infera-sim` when running this crate's tests alone.
pub fn sim_binary() -> PathBuf {
    infera_testkit::process::workspace_binary("infera-sim").unwrap()
}

/// An etcd prefix no other test uses.
pub fn unique_prefix(name: &str) -> String {
    format!(
        "/infera-test/{}/workers/",
        infera_testkit::unique_name(name)
    )
}

pub struct Launched {
    pub sidecar: ServerProcess,
    pub key: String,
    pub port: u16,
    pub _dir: tempfile::TempDir,
}

pub async fn launch(prefix: &str, ttl: &str) -> Launched {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    launch_with(&etcd, prefix, ttl, &[]).await
}

/// A sidecar launching a simulated engine, registering in `etcd` with `extra` flags.
pub async fn launch_with(etcd: &str, prefix: &str, ttl: &str, extra: &[String]) -> Launched {
    launch_at_speed(etcd, prefix, ttl, "20", extra).await
}

/// [`launch_with`], the simulated engine at `speedup` times its calibrated pace.
pub async fn launch_at_speed(
    etcd: &str,
    prefix: &str,
    ttl: &str,
    speedup: &str,
    extra: &[String],
) -> Launched {
    let port = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = args_of(&[
        "sim",
        "--etcd-endpoint",
        etcd,
        "--etcd-prefix",
        prefix,
        "--advertise-host",
        "127.0.0.1",
        "--lease-ttl",
        ttl,
        "--drain-timeout",
        "10",
        "--sim-binary",
        sim_binary().to_str().unwrap(),
        "fixture/model",
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
        "--engine",
        "vllm",
        "--speedup",
        speedup,
    ]);
    args.extend_from_slice(extra);
    let sidecar =
        ServerProcess::start(Path::new(SIDECAR), &args, &dir.path().join("sidecar.log")).unwrap();
    Launched {
        sidecar,
        key: build_worker_key(prefix, &format!("127.0.0.1:{port}")),
        port,
        _dir: dir,
    }
}

/// A gateway on loopback finding workers in `etcd` under `prefix`, with `flags`.
pub async fn gateway_on_etcd(
    etcd: &str,
    prefix: &str,
    flags: &[String],
) -> infera_gateway::server::RunningGateway {
    let mut args = vec!["g", "--etcd-endpoint", etcd, "--etcd-prefix", prefix];
    args.extend(flags.iter().map(String::as_str));
    let cfg =
        <infera_gateway::config::GatewayConfig as clap::Parser>::try_parse_from(args).unwrap();
    let gw = infera_gateway::Gateway::new(cfg, infera_gateway::Registry::new()).unwrap();
    infera_gateway::server::start_gateway(
        gw,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .await
    .unwrap()
}

pub async fn wait_key(
    key: &str,
    present: bool,
    within: Duration,
    sidecar: &mut ServerProcess,
) -> Option<WorkerRecord> {
    let mut etcd = infera_testkit::etcd_client().await.unwrap();
    let deadline = Instant::now() + within;
    loop {
        let resp = etcd.get(key, None).await.unwrap();
        match (resp.kvs().first(), present) {
            (Some(kv), true) => return Some(WorkerRecord::from_json(kv.value()).unwrap()),
            (None, false) => return None,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "key {key} present={present} not reached; sidecar log:\n{}",
            sidecar.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The child of `parent` (the engine the sidecar launched), from /proc.
pub fn engine_pid(parent: u32) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid ...: the fields after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// A gateway finding workers in the shared etcd under `prefix`, with `flags`, once it
/// routes to `n` workers.
pub async fn gateway_with(
    prefix: &str,
    flags: &[&str],
    n: usize,
) -> infera_gateway::server::RunningGateway {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let gw = gateway_on_etcd(&etcd, prefix, &args_of(flags)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while gw.gateway.registry.snapshot().workers.len() < n {
        assert!(
            Instant::now() < deadline,
            "the gateway never saw {n} workers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw
}

/// [`gateway_with`] over the shared NATS's request plane, with `extra` flags.
pub async fn nats_gateway(
    prefix: &str,
    extra: &[&str],
    n: usize,
) -> infera_gateway::server::RunningGateway {
    let nats = infera_testkit::nats_url().await.unwrap();
    let mut flags = vec!["--request-transport", "nats", "--nats-server", &nats];
    flags.extend_from_slice(extra);
    gateway_with(prefix, &flags, n).await
}

/// POSTs `body` as JSON: the status and the text.
pub async fn post_json(url: &str, body: &serde_json::Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The data lines of an SSE body, as JSON (`[DONE]` as a string).
pub fn sse_values(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| serde_json::Value::String(d.into())))
        .collect()
}

/// `v` without what differs between two servings of one request: `id`, `created`, and
/// the prefix-cache hits (a second serving finds the first one's blocks).
pub fn normalized(mut v: serde_json::Value) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for k in ["id", "created", "cached_tokens", "cache_read_input_tokens"] {
                    m.remove(k);
                }
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}
