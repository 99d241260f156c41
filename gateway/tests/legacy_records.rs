//! Workers registered exactly as the earlier Python launchers registered them, behind
//! this gateway, over real etcd: a mixed vLLM worker (`"disagg_meta": {}`,
//! `"dp_size": null`, `"request_transport": "nats"`, the native `kv` block) and an ATOM
//! worker (`"disagg_meta": {}`, every size `null`), with the bytes of
//! `proto/testdata/legacy_records/corpus.json` (only the address changed to the simulated
//! engine's), each under a lease. Both take requests, each pinned request reaches the
//! worker it names, `/v1/workers` and `/health` answer with the earlier fields, and a
//! revoked lease takes its worker out.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use etcd_client::PutOptions;
use infera_proto::discovery::build_worker_key;
use infera_proto::worker::EngineKind;
use infera_sim::worker::RunningWorker;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The model the corpus records serve.
const LEGACY_MODEL: &str = "Qwen/Qwen3-0.6B";

/// The record bytes of a corpus entry, and its worker id.
fn corpus_record(name: &str) -> (String, String) {
    let e = infera_testkit::legacy_records::entry(name).unwrap();
    let bytes = e["record_json"].as_str().unwrap().to_owned();
    let id: Value = serde_json::from_str(&bytes).unwrap();
    (bytes, id["worker_id"].as_str().unwrap().to_owned())
}

async fn start_legacy_sim(engine: EngineKind) -> RunningWorker {
    start_sim_with(engine, 50.0, |c| c.model = LEGACY_MODEL.into()).await
}

/// Puts the corpus bytes of `name` for `sim` (its address in place of the recorded one)
/// under a 30 s lease; returns the lease.
async fn register_as_launcher(prefix: &str, name: &str, sim: &RunningWorker) -> i64 {
    let (bytes, recorded_id) = corpus_record(name);
    let addr = sim.addr.to_string();
    let value = bytes.replace(&recorded_id, &addr);
    assert_eq!(
        value.replace(&addr, &recorded_id),
        bytes,
        "only the address differs from what the launcher wrote"
    );
    let mut etcd = infera_testkit::etcd_client().await.unwrap();
    let lease = etcd.lease_grant(30, None).await.unwrap().id();
    etcd.put(
        build_worker_key(prefix, &addr),
        value,
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    lease
}

fn completion(prompt: &str) -> Value {
    json!({"model": LEGACY_MODEL, "prompt": prompt, "max_tokens": 2})
}

#[tokio::test]
async fn the_earlier_launchers_mixed_and_atom_records_route_end_to_end() {
    let prefix = unique_prefix();
    let vllm = start_legacy_sim(EngineKind::Vllm).await;
    let atom = start_legacy_sim(EngineKind::Atom).await;
    register_as_launcher(&prefix, "vllm-mixed", &vllm).await;
    let atom_lease = register_as_launcher(&prefix, "atom-mixed", &atom).await;
    let gw = start_gw(&prefix, &["--router-mode", "direct"]).await;
    wait_workers(&gw, 2).await;
    let http = reqwest::Client::new();

    // Unpinned: round-robin over both.
    for i in 0..4 {
        let r = http
            .post(gw_url(&gw, "/v1/completions"))
            .json(&completion(&format!("q{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    assert_eq!((served(&vllm), served(&atom)), (2, 2));

    // Pinned: each request reaches the worker it names.
    for (sim, before) in [(&vllm, 2), (&atom, 2)] {
        let r = http
            .post(gw_url(&gw, "/v1/chat/completions"))
            .header("x-worker-instance-id", sim.addr.to_string())
            .json(&json!({"model": LEGACY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        assert_eq!(served(sim), before + 1, "{}", sim.addr);
    }

    // What operators' scripts read back, under the earlier names.
    let workers: Value = get_json(&http, &gw, "/v1/workers").await;
    let by_id = |addr: &str| {
        workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["worker_id"] == json!(addr))
            .cloned()
            .unwrap()
    };
    let (v, a) = (by_id(&vllm.addr.to_string()), by_id(&atom.addr.to_string()));
    for w in [&v, &a] {
        assert_eq!(w["status"], "active");
        assert_eq!(w["disagg_meta"], json!({}));
        assert_eq!(w["dp_size"], Value::Null);
        assert_eq!(w["dp_rank"], Value::Null);
    }
    assert_eq!(
        (v["engine"].as_str(), a["engine"].as_str()),
        (Some("vllm"), Some("atom"))
    );
    assert_eq!(v["kv_block_size"], 16);
    assert_eq!(a["kv_events_endpoint"], Value::Null);
    let health: Value = get_json(&http, &gw, "/health").await;
    assert_eq!(health, json!({"status": "ok", "active_workers": 2}));

    // The ATOM launcher's lease goes: its worker leaves routing.
    let mut etcd = infera_testkit::etcd_client().await.unwrap();
    etcd.lease_revoke(atom_lease).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.gateway.registry.snapshot().workers.len() != 1 {
        assert!(Instant::now() < deadline, "the ATOM worker never left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = served(&vllm);
    for i in 0..2 {
        let r = http
            .post(gw_url(&gw, "/v1/completions"))
            .json(&completion(&format!("after{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!((served(&vllm), served(&atom)), (before + 2, 3));
}
