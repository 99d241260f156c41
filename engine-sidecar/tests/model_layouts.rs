//! Model folders as transformers writes them (`prompt/testdata/layouts`, from its own
//! `save_pretrained`), through a sidecar to a gateway that fetches the tokenizer from the
//! workers: a model whose chat template is `chat_template.jinja` gets prefix hits on
//! chat (its template reached the router, so chat prompts hash as the engine's KV
//! events); named templates arrive with it; a model with only a tiktoken vocabulary is
//! reported on the worker's record and by the gateway, which routes it by bytes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{SIDECAR, args_of, gateway_on_etcd, sim_binary, unique_prefix, wait_key};
use infera_proto::discovery::build_worker_key;
use infera_testkit::process::{ServerProcess, free_port};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn layout(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../prompt/testdata/layouts")
        .join(name)
}

struct Worker {
    sidecar: ServerProcess,
    status_port: u16,
    record: infera_proto::worker::WorkerRecord,
    _dir: tempfile::TempDir,
}

/// A sidecar launching the simulator on the model folder `model` (as the engine's
/// model path, where the sidecar looks for its tokenizer).
async fn launch(etcd: &str, prefix: &str, model: &Path, tokenizer: bool) -> Worker {
    let port = free_port().unwrap();
    let status_port = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut args = args_of(&[
        "sim",
        "--etcd-endpoint",
        etcd,
        "--etcd-prefix",
        prefix,
        "--sim-binary",
        sim_binary().to_str().unwrap(),
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
        "--status-port",
        &status_port.to_string(),
        "--speedup",
        "20",
    ]);
    if tokenizer {
        args.extend(args_of(&["--tokenizer", model.to_str().unwrap()]));
    } else {
        args.extend(args_of(&["--model", model.to_str().unwrap()]));
    }
    let mut sidecar =
        ServerProcess::start(Path::new(SIDECAR), &args, &dir.path().join("sidecar.log")).unwrap();
    let key = build_worker_key(prefix, &format!("127.0.0.1:{port}"));
    let record = wait_key(&key, true, Duration::from_secs(60), &mut sidecar)
        .await
        .unwrap();
    Worker {
        sidecar,
        status_port,
        record,
        _dir: dir,
    }
}

fn from_workers(port: u16) -> Vec<String> {
    args_of(&[
        "--router-policy",
        "kv-aware",
        "--router-tokenizer-from-workers",
    ])
    .into_iter()
    .chain([port.to_string()])
    .collect()
}

async fn wait_state(gw: &infera_gateway::Gateway, state: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = gw.tokenizer_state();
        if now["state"] == state {
            return now;
        }
        assert!(Instant::now() < deadline, "never {state}: {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_chat_template_jinja_model_gets_prefix_hits_through_a_gateway_fed_by_the_workers() {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let prefix = unique_prefix("layout-jinja");
    let mut worker = launch(&etcd, &prefix, &layout("jinja"), true).await;
    assert!(
        worker.record.kv.is_some(),
        "a tokenizer.json model carries its canary"
    );
    let gw = gateway_on_etcd(&etcd, &prefix, &from_workers(worker.status_port)).await;
    wait_state(&gw.gateway, "loaded").await;
    let codec = gw.gateway.router_codec().unwrap();
    assert_eq!(
        codec.chat_template_names(),
        ["default"],
        "chat_template.jinja came with the tokenizer"
    );

    let http = reqwest::Client::new();
    let system = "You answer fixture questions about the fixture catalogue. ".repeat(8);
    let chat = |question: &str| {
        serde_json::json!({"model": "fixture-model", "max_tokens": 2,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]})
    };
    let url = format!("http://{}/v1/chat/completions", gw.addr);
    let first = http.post(&url).json(&chat("first?")).send().await.unwrap();
    assert_eq!(first.status(), 200, "{}", first.text().await.unwrap());
    // The engine's KV events for the first prompt reach the router's view.
    let view = format!(
        "http://{}/v1/admin/cache-view/{}",
        gw.addr, worker.record.worker_id
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v: serde_json::Value = http.get(&view).send().await.unwrap().json().await.unwrap();
        if v["block_count"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no blocks indexed: {v}\n{}",
            worker.sidecar.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = http.post(&url).json(&chat("second?")).send().await.unwrap();
    assert_eq!(second.status(), 200);
    let metrics = gw.gateway.metrics_text();
    let hits = metric(
        &metrics,
        "infera_router_pick_cache_hits_sum{role=\"mixed\"}",
    );
    assert!(
        hits >= 10.0,
        "the second chat request shares the system prompt's blocks: {hits} hits\n{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "infera_gateway_requests_without_blocks_total{reason=\"template\"}"
        ),
        0.0,
        "no chat request went unhashed"
    );
    worker.sidecar.kill();
}

#[tokio::test]
async fn named_templates_arrive_and_a_tiktoken_model_is_reported_not_silently_missed() {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();

    let prefix = unique_prefix("layout-named");
    let mut named = launch(&etcd, &prefix, &layout("named"), true).await;
    let gw = gateway_on_etcd(&etcd, &prefix, &from_workers(named.status_port)).await;
    wait_state(&gw.gateway, "loaded").await;
    assert_eq!(
        gw.gateway.router_codec().unwrap().chat_template_names(),
        ["default", "tool_use"]
    );
    named.sidecar.kill();

    let prefix = unique_prefix("layout-tiktoken");
    let mut tiktoken = launch(&etcd, &prefix, &layout("tiktoken"), false).await;
    assert_eq!(tiktoken.record.tokenizer_format(), Some("tiktoken"));
    assert!(tiktoken.record.kv.is_none(), "no canary to state");
    let gw = gateway_on_etcd(&etcd, &prefix, &from_workers(tiktoken.status_port)).await;
    let failed = wait_state(&gw.gateway, "failed").await;
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("tiktoken vocabulary (tiktoken.model) and no tokenizer.json"),
        "{error}"
    );
    // Served all the same, routed by load.
    let answer = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .json(
            &serde_json::json!({"model": "fixture-model", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    tiktoken.sidecar.kill();
}
