//! The cluster's own autoscalers scale an InferaDeployment through its `/scale`, as users
//! who already run them would: `examples/autoscaling/hpa.yaml` (a HorizontalPodAutoscaler
//! on the engine pods' CPU from metrics-server) and `examples/autoscaling/keda.yaml` (a
//! KEDA ScaledObject whose metrics-api trigger sums the gateways' requests in flight),
//! applied as written but for shorter stabilization windows and the namespace. The node
//! runs metrics-server and KEDA from their own manifests (testenv/autoscalers.sh).
//!
//! For each: a step load raises the metric and the deployment scales out with no
//! `kubectl scale` and no write to `/scale` by the test (the HPA controller's is the only
//! one: `managedFields` says so), the load drops and it scales back in, and no request
//! fails on the way, the scale-in's drains included.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::gateway::Gateway;
use infera_e2e::load::{Load, LoadReport};
use infera_e2e::{Cluster, eventually, repo};
use serde_json::Value;
use std::time::{Duration, Instant};

/// How long a scale-out or a scale-in may take: a metric resolution or polling
/// interval, the HPA's 15 s sync, the window, and a pod's start or drain.
const SCALE: Duration = Duration::from_secs(240);

fn example(file: &str) -> String {
    std::fs::read_to_string(repo().join("examples/autoscaling").join(file)).unwrap()
}

async fn idep(cluster: &Cluster, ns: &str, name: &str) -> Value {
    cluster
        .get_json(&["get", "idep", name, "-n", ns])
        .await
        .unwrap()
}

/// The managers that wrote the deployment's `spec.replicas` through `/scale`.
async fn scale_writers(cluster: &Cluster, ns: &str, name: &str) -> Vec<String> {
    let d = cluster
        .get_json(&["get", "idep", name, "-n", ns, "--show-managed-fields"])
        .await
        .unwrap();
    d["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["subresource"] == "scale")
        .filter_map(|e| e["manager"].as_str().map(str::to_owned))
        .collect()
}

/// Runs `load` until the deployment has more than one worker (its status and its engine
/// pods), then stops it and waits until it is back at one; returns the load's report and
/// the most workers seen.
async fn step(cluster: &Cluster, ns: &str, name: &str, hpa: &str, load: Load) -> (LoadReport, i64) {
    let started = Instant::now();
    let out = eventually(cluster, ns, "a scale-out", SCALE, || async {
        let d = idep(cluster, ns, name).await;
        let pods = cluster
            .engine_pods(ns, name)
            .await
            .map_err(|e| e.to_string())?
            .len() as i64;
        let replicas = d["status"]["replicas"].as_i64().unwrap_or(0);
        if replicas >= 2 && pods >= 2 {
            Ok(replicas)
        } else {
            let h = cluster
                .get_json(&["get", "hpa", hpa, "-n", ns])
                .await
                .map(|h| h["status"].clone())
                .unwrap_or_default();
            Err(format!(
                "status.replicas {replicas}, {pods} engine pods; HPA {h}"
            ))
        }
    })
    .await
    .unwrap();
    println!(
        "scaled out to {out} workers {:.1?} after the load began",
        started.elapsed()
    );
    // The load holds until the new workers serve, then drops.
    cluster.wait_ready(ns, name).await.unwrap();
    let most = std::cell::Cell::new(out);
    let report = load.stop().await;
    let dropped = Instant::now();
    eventually(cluster, ns, "a scale-in", SCALE, || async {
        let d = idep(cluster, ns, name).await;
        let replicas = d["status"]["replicas"].as_i64().unwrap_or(0);
        most.set(most.get().max(replicas));
        let pods = cluster
            .engine_pods(ns, name)
            .await
            .map_err(|e| e.to_string())?
            .len();
        if d["spec"]["replicas"] == 1 && replicas == 1 && pods == 1 {
            Ok(())
        } else {
            Err(format!(
                "spec.replicas {}, status.replicas {replicas}, {pods} engine pods",
                d["spec"]["replicas"]
            ))
        }
    })
    .await
    .unwrap();
    println!(
        "back to 1 worker {:.1?} after the load dropped",
        dropped.elapsed()
    );
    (report, most.get())
}

/// Whether the HPA `h` is active and has read its first metric of type `source`
/// (`resource`, `external`).
fn hpa_reads(h: &Value, source: &str) -> bool {
    let active = h["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "ScalingActive" && c["status"] == "True");
    active && h["status"]["currentMetrics"][0][source]["current"].is_object()
}

#[tokio::test]
async fn an_hpa_on_the_engines_cpu_scales_out_and_back_in() {
    let cluster = Cluster::connect().await.unwrap();
    let guard = cluster.namespace("e2e-hpa").await.unwrap();
    let ns = guard.name.as_str();
    let name = "chat-hpa";
    let manifest = example("hpa.yaml").replace(
        "stabilizationWindowSeconds: 120",
        "stabilizationWindowSeconds: 10",
    );
    cluster.apply(ns, &manifest).await.unwrap();
    cluster.wait_ready(ns, name).await.unwrap();
    let gateway: Gateway = cluster.gateway_on_node_port(ns, name, 1).await.unwrap();
    // The HPA reads the pods' CPU from metrics-server before anything is asked of it.
    eventually(&cluster, ns, "the HPA reading CPU", SCALE, || async {
        let h = cluster
            .get_json(&["get", "hpa", name, "-n", ns])
            .await
            .map_err(|e| e.to_string())?;
        if hpa_reads(&h, "resource") {
            Ok(())
        } else {
            Err(format!("{}", h["status"]))
        }
    })
    .await
    .unwrap();
    let model = "sim-llama-8b-hpa";
    let load = Load::start(&gateway, model, 8, 64);
    let (report, most) = step(&cluster, ns, name, name, load).await;
    println!(
        "HPA on CPU: up to {most} workers, {} requests, {} failed, slowest {:.1?}",
        report.ok,
        report.failed.len(),
        report.slowest
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(report.ok > 50, "{report:?}");
    let writers = scale_writers(&cluster, ns, name).await;
    assert_eq!(
        writers,
        vec!["kube-controller-manager".to_owned()],
        "/scale written by {writers:?}"
    );
    let foreign = cluster.foreign_status_writers(ns).await.unwrap();
    assert!(foreign.is_empty(), "{foreign:?}");
}

#[tokio::test]
async fn a_keda_scaled_object_on_the_gateways_requests_scales_out_and_back_in() {
    let cluster = Cluster::connect().await.unwrap();
    let guard = cluster.namespace("e2e-keda").await.unwrap();
    let ns = guard.name.as_str();
    let name = "chat-keda";
    let manifest = example("keda.yaml")
        .replace(".default.svc.", &format!(".{ns}.svc."))
        .replace(
            "stabilizationWindowSeconds: 120",
            "stabilizationWindowSeconds: 10",
        )
        .replace("pollingInterval: 10", "pollingInterval: 2");
    cluster.apply(ns, &manifest).await.unwrap();
    cluster.wait_ready(ns, name).await.unwrap();
    let gateway: Gateway = cluster.gateway_on_node_port(ns, name, 1).await.unwrap();
    // KEDA's HPA reads the external metric before anything is asked of it.
    let hpa = format!("keda-hpa-{name}");
    eventually(
        &cluster,
        ns,
        "KEDA's HPA reading the gateways",
        SCALE,
        || async {
            let so = cluster
                .get_json(&["get", "scaledobject", name, "-n", ns])
                .await
                .map_err(|e| e.to_string())?;
            let h = cluster
                .get_json(&["get", "hpa", &hpa, "-n", ns])
                .await
                .map_err(|e| e.to_string())?;
            if hpa_reads(&h, "external") {
                Ok(())
            } else {
                Err(format!(
                    "ScaledObject {}; HPA {}",
                    so["status"], h["status"]
                ))
            }
        },
    )
    .await
    .unwrap();
    // The operator's own autoscaler would stand down for it (the deployment has none).
    let model = "sim-llama-8b-keda";
    let load = Load::start(&gateway, model, 6, 64);
    let (report, most) = step(&cluster, ns, name, &hpa, load).await;
    println!(
        "KEDA on the gateways' requests in flight: up to {most} workers, {} requests, {} failed, slowest {:.1?}",
        report.ok,
        report.failed.len(),
        report.slowest
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(report.ok > 50, "{report:?}");
    let writers = scale_writers(&cluster, ns, name).await;
    assert!(
        writers
            .iter()
            .all(|w| w == "kube-controller-manager" || w == "keda"),
        "/scale written by {writers:?}"
    );
    assert!(
        writers.iter().any(|w| w == "kube-controller-manager"),
        "{writers:?}"
    );
    // Before the namespace goes: KEDA's finalizer on the ScaledObject needs its operator.
    cluster
        .kubectl(&["delete", "scaledobject", name, "-n", ns, "--wait=true"])
        .await
        .unwrap();
}
