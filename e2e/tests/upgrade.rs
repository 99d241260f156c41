//! Upgrades that spare engines: `helm upgrade` to a rebuilt operator image rolls the
//! operator pods, and the new leader, rendering every deployment again, restarts no
//! engine pod whose rendered spec is unchanged (a real engine restart costs 5-30 minutes
//! of model loading); then `scripts/upgrade-crds` re-applies the CRDs. A steady load runs
//! through the gateway the whole time and no request may fail.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time. It puts the release
//! back as it found it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::ROLLOUT;
use infera_e2e::load::Load;
use infera_e2e::{Cluster, RELEASE_NAMESPACE, eventually, repo};
use infera_testkit::binaries::{Binary, locate};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const OPERATOR: &str = "ghcr.io/infera/infera-operator";
const CONTAINERD: &str = "/run/infera-cluster/containerd.sock";

async fn run(program: &std::path::Path, args: &[&str], env: &[(&str, String)]) {
    let out = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn helm_upgrade(cluster: &Cluster, operator_image: &str) {
    let helm = locate(Binary::Helm).unwrap();
    let chart = repo().join("charts/infera");
    let kubeconfig = cluster.kubeconfig().display().to_string();
    let set = format!("images.operator={operator_image}");
    run(
        &helm,
        &[
            "--kubeconfig",
            &kubeconfig,
            "upgrade",
            "infera",
            chart.to_str().unwrap(),
            "-n",
            RELEASE_NAMESPACE,
            "--reuse-values",
            "--set",
            &set,
            "--wait",
            "--timeout",
            "300s",
        ],
        &[],
    )
    .await;
}

/// Engine pods by name: uid and restarts of every container.
async fn engines(cluster: &Cluster, ns: &str) -> BTreeMap<String, String> {
    cluster
        .engine_pods(ns, "upgraded")
        .await
        .unwrap()
        .iter()
        .map(|p| {
            let restarts: i64 = p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .chain(p["status"]["initContainerStatuses"].as_array())
                .flatten()
                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                .sum();
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                format!(
                    "{} restarts {restarts}",
                    p["metadata"]["uid"].as_str().unwrap()
                ),
            )
        })
        .collect()
}

async fn generation(cluster: &Cluster, ns: &str) -> Value {
    cluster
        .get_json(&["get", "statefulset", "upgraded-mixed", "-n", ns])
        .await
        .unwrap()["metadata"]["generation"]
        .clone()
}

#[tokio::test]
async fn helm_upgrade_and_a_crd_upgrade_restart_no_engine_and_fail_no_request() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-upgrade").await.unwrap();
    let ns = ns.name.clone();
    let manifest = "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: upgraded}
spec:
  replicas: 2
  model: {name: upgraded-model, source: {hostPath: {path: /models/none}}}
  engine: {kind: sim, args: [--speedup, '4']}
  gateway: {resources: {requests: {cpu: 50m, memory: 64Mi}}}
";
    cluster.apply(&ns, manifest).await.unwrap();
    cluster.wait_ready(&ns, "upgraded").await.unwrap();
    let gateway = cluster
        .gateway_on_node_port(&ns, "upgraded", 2)
        .await
        .unwrap();
    let before = engines(&cluster, &ns).await;
    let generation_before = generation(&cluster, &ns).await;
    let load = Load::start(&gateway, "upgraded-model", 3, 8);

    // A rebuilt operator image under a new reference (the same build, tagged anew: the
    // pods roll as for any new image).
    let rebuilt = format!("{OPERATOR}:e2e-rebuilt");
    run(
        std::path::Path::new("ctr"),
        &[
            "--address",
            CONTAINERD,
            "-n",
            "k8s.io",
            "images",
            "tag",
            "--force",
            &format!("{OPERATOR}:0.1.0"),
            &rebuilt,
        ],
        &[],
    )
    .await;
    let started = Instant::now();
    helm_upgrade(&cluster, &rebuilt).await;
    let leader = eventually(
        &cluster,
        RELEASE_NAMESPACE,
        "the upgraded operator leading",
        ROLLOUT,
        || async {
            let pods = cluster
                .pods(RELEASE_NAMESPACE, "app.kubernetes.io/name=infera-operator")
                .await
                .map_err(|e| e.to_string())?;
            let upgraded: Vec<&str> = pods
                .iter()
                .filter(|p| p["spec"]["containers"][0]["image"] == rebuilt.as_str())
                .filter_map(|p| p["metadata"]["name"].as_str())
                .collect();
            let holder = cluster.operator_leader().await.map_err(|e| e.to_string())?;
            if upgraded.len() == pods.len() && upgraded.iter().any(|p| holder.starts_with(p)) {
                Ok(holder)
            } else {
                Err(format!(
                    "holder {holder}, upgraded pods {upgraded:?} of {}",
                    pods.len()
                ))
            }
        },
    )
    .await
    .unwrap();
    let upgraded_in = started.elapsed();
    // The new leader renders the deployment again (a change to its metadata wakes it).
    cluster.wait_leader_caught_up(&ns).await.unwrap();

    // The CRDs re-applied as an upgrade does.
    let kubeconfig = cluster.kubeconfig().display().to_string();
    let kubectl = locate(Binary::Kubectl).unwrap().display().to_string();
    run(
        &repo().join("scripts/upgrade-crds"),
        &["--kubeconfig", &kubeconfig],
        &[("KUBECTL", kubectl)],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = load.stop().await;
    println!(
        "operator upgraded in {upgraded_in:.1?} ({leader} leads), CRDs re-applied: {} requests, {} failed",
        report.ok,
        report.failed.len()
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        engines(&cluster, &ns).await,
        before,
        "engine pods restarted or replaced"
    );
    assert_eq!(
        generation(&cluster, &ns).await,
        generation_before,
        "the StatefulSet was rewritten"
    );
    cluster.wait_ready(&ns, "upgraded").await.unwrap();

    // Back to the release's own image.
    helm_upgrade(&cluster, "").await;
}
