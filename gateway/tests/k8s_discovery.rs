//! Kubernetes discovery against a real kube-apiserver: worker records in Pod annotations
//! (as the engine sidecar writes them) route to simulated workers; a Pod being deleted
//! leaves routing at once but stays listed as draining until it is gone; Pods with a bad
//! record or other labels are left out.
//!
//! The test apiserver runs no kubelet, so each Pod's status (Running, Ready) is written
//! through the status subresource as a kubelet would.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::k8s::*;
use common::*;
use infera_proto::discovery::{DEPLOYMENT_LABEL, WORKER_INFO_ANNOTATION};
use infera_proto::worker::EngineKind;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn set_annotation(pods: &Api<Pod>, name: &str, annotation: &str) {
    let patch = json!({"metadata": {"annotations": {WORKER_INFO_ANNOTATION: annotation}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn start_k8s_gw(ns: &str, selector: &str) -> infera_gateway::server::RunningGateway {
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    start_gw_args(&[
        "--discovery-backend",
        "kubernetes",
        "--k8s-namespace",
        ns,
        "--k8s-label-selector",
        selector,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ])
    .await
}

/// The gateway's `/v1/workers` entries by worker id.
async fn listed(http: &reqwest::Client, gw: &infera_gateway::server::RunningGateway) -> Value {
    let body: Value = get_json(http, gw, "/v1/workers").await;
    let by_id = body["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["worker_id"].as_str().unwrap().to_owned(), w.clone()))
        .collect();
    Value::Object(by_id)
}

/// Polls `/v1/workers` until `done` holds, failing after `within`.
async fn wait_listed(
    http: &reqwest::Client,
    gw: &infera_gateway::server::RunningGateway,
    within: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let workers = listed(http, gw).await;
        if done(&workers) {
            return workers;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}; /v1/workers: {workers:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_ready(http: &reqwest::Client, gw: &infera_gateway::server::RunningGateway) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = http
            .get(gw_url(gw, "/ready"))
            .send()
            .await
            .unwrap()
            .status();
        if status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "/ready stayed {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn complete(http: &reqwest::Client, gw: &infera_gateway::server::RunningGateway, n: usize) {
    for i in 0..n {
        let r = http
            .post(gw_url(gw, "/v1/chat/completions"))
            .json(&chat(&format!("q{i}"), 1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
}

#[tokio::test]
async fn a_pod_being_deleted_drains_then_leaves() {
    let client = infera_testkit::kube_client().await.unwrap();
    let ns = create_namespace(&client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (a, b) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    let (id_a, id_b) = (a.addr.to_string(), b.addr.to_string());
    let record =
        |w: &infera_sim::worker::RunningWorker| record_for(w.addr, EngineKind::Vllm).to_json();
    create_serving_pod(&pods, "engine-a", "fixture-workers", &record(&a)).await;
    create_serving_pod(&pods, "engine-b", "fixture-workers", &record(&b)).await;

    let gw = start_k8s_gw(&ns, &format!("{DEPLOYMENT_LABEL}=fixture-workers")).await;
    let http = reqwest::Client::new();
    wait_ready(&http, &gw).await;
    let workers = listed(&http, &gw).await;
    assert_eq!(workers[&id_a]["state"], "active", "{workers:#}");
    assert_eq!(workers[&id_b]["state"], "active", "{workers:#}");
    complete(&http, &gw, 4).await;
    assert_eq!(
        (served(&a), served(&b)),
        (2, 2),
        "round robin over both Pods"
    );

    // A finalizer keeps the Pod with its deletionTimestamp set, as a kubelet running
    // the preStop hook and the drain would.
    let finalizer = json!({"metadata": {"finalizers": ["infera.amd.com/test"]}});
    pods.patch(
        "engine-a",
        &PatchParams::default(),
        &Patch::Merge(&finalizer),
    )
    .await
    .unwrap();
    pods.delete("engine-a", &DeleteParams::default())
        .await
        .unwrap();
    let workers = wait_listed(
        &http,
        &gw,
        Duration::from_secs(1),
        "the deleted Pod's worker is not draining",
        |w| w[&id_a]["state"] == "draining",
    )
    .await;
    assert_eq!(workers[&id_b]["state"], "active");
    let before = served(&a);
    complete(&http, &gw, 4).await;
    assert_eq!(served(&a), before, "a draining worker gets no new request");
    assert_eq!(served(&b), 6);

    // The sidecar takes its annotation off when its drain starts: the worker stays
    // listed. Pod b's change, seen after (one watch stream, in order), shows the
    // gateway has read the removal.
    let unannotate = json!({"metadata": {"annotations": {WORKER_INFO_ANNOTATION: null}}});
    pods.patch(
        "engine-a",
        &PatchParams::default(),
        &Patch::Merge(&unannotate),
    )
    .await
    .unwrap();
    let mut changed_b = record_for(b.addr, EngineKind::Vllm);
    changed_b.kv_block_size = Some(32);
    set_annotation(&pods, "engine-b", &changed_b.to_json()).await;
    let workers = wait_listed(
        &http,
        &gw,
        Duration::from_secs(5),
        "pod b's new record is not seen",
        |w| w[&id_b]["kv_block_size"] == 32,
    )
    .await;
    assert_eq!(workers[&id_a]["state"], "draining", "{workers:#}");

    let release = json!({"metadata": {"finalizers": null}});
    pods.patch("engine-a", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    let workers = wait_listed(
        &http,
        &gw,
        Duration::from_secs(5),
        "the deleted Pod's worker is still listed",
        |w| w.get(&id_a).is_none(),
    )
    .await;
    assert_eq!(workers[&id_b]["state"], "active");

    gw.shutdown().await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
async fn pods_with_a_bad_record_or_other_labels_are_left_out() {
    let client = infera_testkit::kube_client().await.unwrap();
    let ns = create_namespace(&client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (good, stray) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
    );
    let good_record = record_for(good.addr, EngineKind::Vllm);
    let stray_record = record_for(stray.addr, EngineKind::Vllm);
    create_serving_pod(&pods, "engine-bad", "fixture-workers", "{\"worker_id\": 7}").await;
    create_serving_pod(
        &pods,
        "engine-other",
        "fixture-others",
        &stray_record.to_json(),
    )
    .await;
    create_serving_pod(
        &pods,
        "engine-good",
        "fixture-workers",
        &good_record.to_json(),
    )
    .await;

    let gw = start_k8s_gw(&ns, &format!("{DEPLOYMENT_LABEL}=fixture-workers")).await;
    let http = reqwest::Client::new();
    wait_ready(&http, &gw).await;
    let workers = listed(&http, &gw).await;
    let ids: Vec<&String> = workers.as_object().unwrap().keys().collect();
    assert_eq!(ids, vec![&good_record.worker_id], "{workers:#}");
    complete(&http, &gw, 3).await;
    assert_eq!((served(&good), served(&stray)), (3, 0));

    // Another event on the bad Pod is not another warning; the good Pod's change, seen
    // after it (one watch stream, in order), shows the gateway has read it.
    let touch = json!({"metadata": {"labels": {"fixture-touch": "1"}}});
    pods.patch("engine-bad", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    let mut changed = good_record.clone();
    changed.kv_block_size = Some(32);
    set_annotation(&pods, "engine-good", &changed.to_json()).await;
    wait_listed(
        &http,
        &gw,
        Duration::from_secs(5),
        "the good Pod's new record is not seen",
        |w| w[&good_record.worker_id]["kv_block_size"] == 32,
    )
    .await;
    let metrics = http
        .get(gw_url(&gw, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "infera_gateway_rejected_worker_records_total{reason=\"invalid_record\"} 1\n"
        ),
        "{metrics}"
    );

    // Fixing the record brings the Pod in.
    set_annotation(&pods, "engine-bad", &stray_record.to_json()).await;
    wait_listed(
        &http,
        &gw,
        Duration::from_secs(5),
        "the fixed Pod is not listed",
        |w| w[&stray_record.worker_id]["state"] == "active",
    )
    .await;

    gw.shutdown().await;
    drop_namespace(&client, &ns).await;
}

/// An InferencePool's Pods as GAIE selects them: a stock engine's Pod (no sidecar, no
/// record) is routed on every target port, for any model no record names; a Pod with
/// a sidecar brings its record as always; both fronts (the HTTP API and the endpoint
/// picker) route the same way.
#[tokio::test]
async fn an_inference_pools_stock_pods_are_routed_on_its_target_ports() {
    use common::ext_proc::{exchange, set_header};
    let client = infera_testkit::kube_client().await.unwrap();
    if !install_inference_pool_crd(&client).await {
        return;
    }
    let ns = create_namespace(&client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Two ranks of one stock engine (two ports of one Pod), and a sidecar'd engine of
    // another model.
    let (rank0, rank1, other) = (
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim(EngineKind::Vllm, 50.0).await,
        start_sim_with(EngineKind::Vllm, 50.0, |c| c.model = "other-model".into()).await,
    );
    create_stock_pod(&pods, "stock-0", "pool").await;
    let mut record = record_for(other.addr, EngineKind::Vllm);
    record.model_name = "other-model".into();
    create_serving_pod(&pods, "sidecar-0", "pool", &record.to_json()).await;
    create_pool(
        &client,
        &ns,
        "pool",
        "pool",
        &[rank0.addr.port(), rank1.addr.port()],
    )
    .await;

    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    let gw = start_gw_args(&[
        "--discovery-backend",
        "kubernetes",
        "--k8s-namespace",
        &ns,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--epp-pool-name",
        "pool",
        "--router-policy",
        "kv-aware",
        "--kv-overlap-weight",
        "2",
        "--epp-port",
        "0",
        "--epp-health-port",
        "0",
        "--epp-secure-serving",
        "false",
    ])
    .await;
    let http = reqwest::Client::new();
    let (r0, r1) = (rank0.addr.to_string(), rank1.addr.to_string());
    let workers = wait_listed(
        &http,
        &gw,
        Duration::from_secs(10),
        "the pool's three endpoints are not listed",
        |w| w.get(&r0).is_some() && w.get(&r1).is_some() && w.get(&record.worker_id).is_some(),
    )
    .await;
    assert_eq!(workers[&r0]["model_name"], "*", "{workers:#}");

    // The HTTP API: the stock engine's model goes to its ranks, the other to its record.
    let before = (served(&rank0) + served(&rank1), served(&other));
    complete(&http, &gw, 4).await;
    let r = post_json(
        &http,
        &gw,
        "/v1/completions",
        &json!({"model": "other-model", "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        (served(&rank0) + served(&rank1), served(&other)),
        (before.0 + 4, before.1 + 1)
    );

    // The endpoint picker: a shared prefix lands on one rank, every time.
    let port = gw.epp.unwrap().ext_proc.port();
    let prefix = "pool: you are a meticulous assistant. ".repeat(12);
    let ask = |q: &str| {
        json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": prefix}, {"role": "user", "content": q}]})
    };
    let first = set_header(
        &exchange(port, &ask("first"), None).await,
        "x-gateway-destination-endpoint",
    )
    .unwrap();
    let first = first.split(',').next().unwrap().to_owned();
    assert!(first == r0 || first == r1, "{first}");
    for i in 0..4 {
        let picked = set_header(
            &exchange(port, &ask(&format!("q{i}")), None).await,
            "x-gateway-destination-endpoint",
        )
        .unwrap();
        assert_eq!(
            picked.split(',').next(),
            Some(first.as_str()),
            "follow-up {i}"
        );
    }
    let picked = set_header(
        &exchange(port, &json!({"model": "other-model", "prompt": "y"}), None).await,
        "x-gateway-destination-endpoint",
    )
    .unwrap();
    assert_eq!(picked, record.worker_id);

    gw.shutdown().await;
    drop_namespace(&client, &ns).await;
}
