//! Engine rollouts on the node under streaming load: an engine change on 1P1D and 2P1D
//! deployments (every role surges, prefill and decode roll as one topology, and every
//! answer's headers name a prefill and a decode worker of one revision), a mixed pair
//! that never drops below two ready workers, a rollout with no free GPU for its surge
//! pod (RolloutBlocked, with the scheduler's reason; nothing old is removed), and a
//! decode pod deleted by force mid-stream (`--grace-period=0 --force`) on a 1P2D
//! deployment, over HTTP and over the NATS request plane: its streams continue on the
//! other decode, and its requests not yet answered go to another pair.
//!
//! Ready counts are sampled twice a second ([`RollSampler`]); each step prints its
//! figures. Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use futures::StreamExt;
use infera_e2e::deploy::{ROLLOUT, condition};
use infera_e2e::gateway::Gateway;
use infera_e2e::load::{Load, LoadReport};
use infera_e2e::roll::{RollSampler, RollSamples};
use infera_e2e::{Cluster, RELEASE_NAMESPACE, eventually};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Clients of the streaming load.
const CLIENTS: usize = 4;

/// Tokens per answer: a stream is in flight at every moment of a roll.
const TOKENS: u32 = 300;

/// Tokens per answer when a pod is killed: streams of several seconds, longer than the
/// couple of seconds the kubelet gives a force-deleted pod's preStop drain.
const LONG_TOKENS: u32 = 4000;

const SMALL_GATEWAY: &str = "gateway: {resources: {requests: {cpu: 50m, memory: 64Mi}}}";

fn pd(name: &str, flavor: &str, layout: &str, extra: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: PDTopology
metadata: {{name: {name}}}
spec: {{layout: {layout}, transport: {{backend: mooncake}}}}
---
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: {name}-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim, simFlavor: {flavor}, args: [--speedup, '4'], drainSeconds: 30}}
  serving: {{mode: disaggregated, topologyRef: {name}}}
  {SMALL_GATEWAY}
{extra}"
    )
}

fn mixed(name: &str, replicas: u32, engine_extra: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  model: {{name: {name}-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim, args: [--speedup, '4'], drainSeconds: 30{engine_extra}}}
  rollout: {{maxSurge: 1}}
  {SMALL_GATEWAY}
"
    )
}

async fn idep(cluster: &Cluster, ns: &str, name: &str) -> Value {
    cluster
        .get_json(&["get", "idep", name, "-n", ns])
        .await
        .unwrap()
}

/// The deployment's revision as its status names it.
async fn revision(cluster: &Cluster, ns: &str, name: &str) -> String {
    idep(cluster, ns, name).await["status"]["revision"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Changes the engine's arguments (a new revision of every role).
async fn change_engine(cluster: &Cluster, ns: &str, name: &str, speedup: &str) {
    let patch = format!(r#"{{"spec":{{"engine":{{"args":["--speedup","{speedup}"]}}}}}}"#);
    cluster
        .kubectl(&[
            "patch",
            "idep",
            name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            &patch,
        ])
        .await
        .unwrap();
}

/// Waits until every one of `engines` engine pods runs a revision other than `from`,
/// ready, and the status reports no rollout; returns the new revision.
async fn wait_rolled(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    from: &str,
    engines: usize,
) -> String {
    eventually(cluster, ns, "the rollout done", ROLLOUT, || async {
        let d = idep(cluster, ns, name).await;
        let to = d["status"]["revision"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if to == from || to.is_empty() {
            return Err(format!("status.revision still {to}"));
        }
        if !d["status"]["rollout"].is_null() {
            return Err(format!("status.rollout {}", d["status"]["rollout"]));
        }
        let pods = cluster
            .engine_pods(ns, name)
            .await
            .map_err(|e| e.to_string())?;
        let done = pods
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| p["metadata"]["labels"]["infera.amd.com/engine-revision"] == to.as_str())
            .filter(|p| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .count();
        if done == engines && pods.len() == engines {
            Ok(to)
        } else {
            Err(format!("{done} of {} pods ready on {to}", pods.len()))
        }
    })
    .await
    .unwrap()
}

/// Answers per revision, after checking that each one's prefill and decode ran the
/// revision its headers name (by the pods' labels the sampler saw).
fn answers_by_revision(report: &LoadReport, samples: &RollSamples) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for served in &report.served {
        let (Some(prefill), Some(decode), Some(revision)) =
            (&served.prefill, &served.decode, &served.revision)
        else {
            panic!("an answer without its pair in the headers: {served:?}");
        };
        for (leg, worker) in [("prefill", prefill), ("decode", decode)] {
            assert_eq!(
                samples.revisions.get(worker),
                Some(revision),
                "the {leg} worker {worker} of an answer named revision {revision}: {served:?}"
            );
        }
        *by.entry(revision.clone()).or_default() += 1;
    }
    by
}

/// An engine change rolled under streaming load on a prefill/decode deployment.
async fn roll_pd(cluster: &Cluster, name: &str, flavor: &str, layout: &str, p: usize, d: usize) {
    let ns = cluster
        .namespace(&format!("e2e-roll-{}", layout.to_lowercase()))
        .await
        .unwrap();
    let ns = ns.name.clone();
    cluster
        .apply(&ns, &pd(name, flavor, layout, ""))
        .await
        .unwrap();
    cluster.wait_ready(&ns, name).await.unwrap();
    let gateway = cluster
        .gateway_on_node_port(&ns, name, p + d)
        .await
        .unwrap();
    let from = revision(cluster, &ns, name).await;
    let sampler = RollSampler::start(cluster, &ns, name);
    let load = Load::start(&gateway, &format!("{name}-model"), CLIENTS, TOKENS);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    change_engine(cluster, &ns, name, "3").await;
    let to = wait_rolled(cluster, &ns, name, &from, p + d).await;
    let took = started.elapsed();
    // Requests on the new revision alone.
    cluster
        .wait_active_workers(&ns, &gateway, p + d)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let report = load.stop().await;
    let samples = sampler.stop().await;
    let by = answers_by_revision(&report, &samples);
    println!(
        "{layout} ({flavor}): rolled {from} -> {to} in {took:.1?}: {} requests ({} streamed), {} failed; lowest ready prefill {}, decode {} ({} samples, longest gap {:.2?}); answers by revision {by:?}",
        report.ok,
        report.ttft.len(),
        report.failed.len(),
        samples.min_ready["prefill"],
        samples.min_ready["decode"],
        samples.samples,
        samples.longest_gap,
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    // A pod's readiness changes at most once per probe period (2 s): samples closer than
    // that see every state a role passes through.
    assert!(samples.longest_gap < Duration::from_secs(2), "{samples:?}");
    assert!(samples.min_ready["prefill"] >= p, "{samples:?}");
    assert!(samples.min_ready["decode"] >= d, "{samples:?}");
    assert!(
        by.get(&from).is_some_and(|n| *n > 0) && by.get(&to).is_some_and(|n| *n > 0),
        "answers on both revisions: {by:?}"
    );
    // The rollout told its story.
    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            &format!("involvedObject.name={name}"),
            "-o",
            "jsonpath={.items[*].reason}",
        ])
        .await
        .unwrap();
    for reason in ["RolloutStarted", "RolloutComplete"] {
        assert!(events.contains(reason), "{reason} not in {events}");
    }
}

#[tokio::test]
async fn engine_changes_roll_1p1d_and_2p1d_without_a_failed_request_or_an_empty_role() {
    let cluster = Cluster::connect().await.unwrap();
    roll_pd(&cluster, "roll-1p1d", "sglang", "1P1D", 1, 1).await;
    roll_pd(&cluster, "roll-2p1d", "vllm", "2P1D", 2, 1).await;
}

#[tokio::test]
async fn a_mixed_pair_rolls_with_one_surge_worker_and_never_below_two_ready() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-roll-mixed").await.unwrap();
    let ns = ns.name.clone();
    let name = "roll-mixed";
    cluster.apply(&ns, &mixed(name, 2, "")).await.unwrap();
    cluster.wait_ready(&ns, name).await.unwrap();
    let gateway = cluster.gateway_on_node_port(&ns, name, 2).await.unwrap();
    let from = revision(&cluster, &ns, name).await;
    let sampler = RollSampler::start(&cluster, &ns, name);
    let load = Load::start(&gateway, &format!("{name}-model"), CLIENTS, TOKENS);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    change_engine(&cluster, &ns, name, "3").await;
    let to = wait_rolled(&cluster, &ns, name, &from, 2).await;
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = load.stop().await;
    let samples = sampler.stop().await;
    let names: Vec<String> = cluster
        .engine_pods(&ns, name)
        .await
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    println!(
        "mixed 2, maxSurge 1: rolled {from} -> {to} in {took:.1?}: {} requests, {} failed; lowest ready {} ({} samples); pods now {names:?}",
        report.ok,
        report.failed.len(),
        samples.min_ready["mixed"],
        samples.samples,
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(samples.min_ready["mixed"] >= 2, "{samples:?}");
    // New pods joined at the top of the window; the old ones left from the bottom.
    assert_eq!(names, ["roll-mixed-mixed-2", "roll-mixed-mixed-3"]);
}

/// `amd.com/gpu` requested by pods on the node that have not finished.
async fn gpus_in_use(cluster: &Cluster) -> i64 {
    let pods = cluster
        .get_json(&["get", "pods", "--all-namespaces"])
        .await
        .unwrap();
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .flat_map(|p| {
            p["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| {
            c["resources"]["limits"]["amd.com/gpu"]
                .as_str()
                .and_then(|n| n.parse::<i64>().ok())
        })
        .sum()
}

async fn allocatable_gpus(cluster: &Cluster) -> i64 {
    let nodes = cluster.get_json(&["get", "nodes"]).await.unwrap();
    nodes["items"][0]["status"]["allocatable"]["amd.com/gpu"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_rollout_without_a_free_gpu_waits_says_why_and_removes_nothing() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-roll-blocked").await.unwrap();
    let ns = ns.name.clone();
    // Earlier tests' pods that asked for GPUs have finished.
    eventually(
        &cluster,
        &ns,
        "no GPU in use on the node",
        ROLLOUT,
        || async {
            match gpus_in_use(&cluster).await {
                0 => Ok(()),
                n => Err(format!("{n} GPUs in use")),
            }
        },
    )
    .await
    .unwrap();
    let total = allocatable_gpus(&cluster).await;
    let name = "roll-gpu";
    let gpu = ", resources: {limits: {amd.com/gpu: '1'}}";
    cluster.apply(&ns, &mixed(name, 1, gpu)).await.unwrap();
    cluster.wait_ready(&ns, name).await.unwrap();
    // Every other GPU taken.
    let filler = mixed(
        "filler",
        1,
        &format!(", resources: {{limits: {{amd.com/gpu: '{}'}}}}", total - 1),
    );
    cluster.apply(&ns, &filler).await.unwrap();
    cluster.wait_ready(&ns, "filler").await.unwrap();
    let gateway = cluster.gateway_on_node_port(&ns, name, 1).await.unwrap();
    let from = revision(&cluster, &ns, name).await;
    let load = Load::start(&gateway, &format!("{name}-model"), CLIENTS, 50);
    change_engine(&cluster, &ns, name, "3").await;
    let blocked = eventually(&cluster, &ns, "RolloutBlocked", ROLLOUT, || async {
        let d = idep(&cluster, &ns, name).await;
        match condition(&d, "RolloutBlocked") {
            Some(c) if c["status"] == "True" => {
                Ok(c["message"].as_str().unwrap_or_default().to_owned())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    // Held for a while: the old worker keeps serving, nothing old is removed.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pods = cluster.engine_pods(&ns, name).await.unwrap();
    let d = idep(&cluster, &ns, name).await;
    let held = load.stop().await;
    println!(
        "blocked: {blocked:?}; {} pods ({:?}), Ready {}; {} requests served meanwhile, {} failed",
        pods.len(),
        pods.iter()
            .map(|p| p["status"]["phase"].clone())
            .collect::<Vec<_>>(),
        condition(&d, "Ready").unwrap()["status"],
        held.ok,
        held.failed.len()
    );
    assert!(blocked.contains("Insufficient amd.com/gpu"), "{blocked}");
    assert!(
        blocked.starts_with("a new mixed worker cannot start"),
        "{blocked}"
    );
    assert_eq!(condition(&d, "Ready").unwrap()["status"], "True");
    assert!(held.failed.is_empty(), "{:?}", held.failed);
    assert!(held.ok > 0);
    let old_serving = pods.iter().any(|p| {
        p["metadata"]["name"] == format!("{name}-mixed-0")
            && p["metadata"]["deletionTimestamp"].is_null()
    });
    assert!(old_serving, "the old worker was removed");
    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            &ns,
            "-o",
            "jsonpath={.items[*].reason}",
        ])
        .await
        .unwrap();
    assert!(events.contains("RolloutBlocked"), "{events}");

    // The GPUs come free: the rollout finishes on its own.
    cluster.delete_deployment(&ns, "filler").await.unwrap();
    let to = wait_rolled(&cluster, &ns, name, &from, 1).await;
    let d = idep(&cluster, &ns, name).await;
    let c = condition(&d, "RolloutBlocked").unwrap();
    assert_eq!(
        (&c["status"], &c["reason"]),
        (&Value::from("False"), &Value::from("RolloutComplete"))
    );
    println!("unblocked: rolled {from} -> {to}");
}

/// Requests the gateway moved off a lost worker: streams continued elsewhere (every
/// reason), and pairs replaced before their decode answered.
async fn moved(gateway: &Gateway) -> (f64, f64) {
    let (_, text) = gateway.get("/metrics").await.unwrap();
    let sum = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    (
        sum("infera_migrations_total{"),
        sum(r#"infera_pd_bootstrap_failures_total{reason="pair_retried"}"#),
    )
}

/// Requests published on the request plane's subjects while `run` runs.
async fn count_plane_messages<F: std::future::Future<Output = LoadReport>>(
    cluster: &Cluster,
    run: F,
) -> (LoadReport, u64) {
    let pods = cluster
        .pods(RELEASE_NAMESPACE, "app.kubernetes.io/name=infera-nats")
        .await
        .unwrap();
    let ip = pods[0]["status"]["podIP"].as_str().unwrap().to_owned();
    let nats = async_nats::connect(format!("nats://{ip}:4222"))
        .await
        .unwrap();
    let mut seen = nats.subscribe("infera.req.>").await.unwrap();
    infera_testkit::nats_round_trip(&nats).await.unwrap();
    let report = run.await;
    let mut published = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), seen.next()).await {
        published += 1;
    }
    (report, published)
}

/// A 1P2D deployment, one decode pod force-deleted mid-stream.
async fn lose_a_decode(cluster: &Cluster, transport: &str) {
    let ns = cluster
        .namespace(&format!("e2e-lose-decode-{transport}"))
        .await
        .unwrap();
    let ns = ns.name.clone();
    let name = format!("lose-{transport}");
    let messaging = if transport == "nats" {
        "  messaging: {backend: nats, requestTransport: nats}\n"
    } else {
        ""
    };
    // Round robin: both decodes carry requests when one is lost.
    let manifest = pd(&name, "sglang", "1P2D", messaging).replace(
        "gateway: {resources",
        "gateway: {policy: round-robin, resources",
    );
    cluster.apply(&ns, &manifest).await.unwrap();
    cluster.wait_ready(&ns, &name).await.unwrap();
    let gateway: Gateway = cluster.gateway_on_node_port(&ns, &name, 3).await.unwrap();
    let pod = cluster
        .pods(
            &ns,
            &format!("infera.amd.com/deployment={name},infera.amd.com/role=decode"),
        )
        .await
        .unwrap()[0]
        .clone();
    let decode = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let engine_metrics = format!(
        "http://{}:8000/metrics",
        pod["status"]["podIP"].as_str().unwrap()
    );
    let before = moved(&gateway).await;
    let mut running_at_kill = 0.0;
    let run = async {
        let load = Load::start(&gateway, &format!("{name}-model"), CLIENTS, LONG_TOKENS);
        // Into the first answers (each takes several seconds), once the decode about to
        // be lost holds some.
        let deadline = Instant::now() + Duration::from_secs(20);
        while running_at_kill < 1.0 {
            assert!(Instant::now() < deadline, "no request reached {decode}");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let text = reqwest::get(&engine_metrics)
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            running_at_kill = text
                .lines()
                .find_map(|l| {
                    l.strip_prefix("sglang:num_running_reqs")?
                        .rsplit_once(' ')?
                        .1
                        .parse()
                        .ok()
                })
                .unwrap_or(0.0);
        }
        cluster
            .kubectl(&[
                "delete",
                "pod",
                &decode,
                "-n",
                &ns,
                "--grace-period=0",
                "--force",
                "--wait=false",
            ])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(12)).await;
        load.stop().await
    };
    let (report, published) = count_plane_messages(cluster, run).await;
    let after = moved(&gateway).await;
    let (streams, pairs) = (after.0 - before.0, after.1 - before.1);
    println!(
        "1P2D over {transport}: decode {decode} killed with {running_at_kill} requests running: {} requests ({} streamed), {} failed; {streams} streams continued on the other decode, {pairs} requests sent to another pair; {published} messages on infera.req.>",
        report.ok,
        report.ttft.len(),
        report.failed.len(),
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    // What the lost decode held either moved (a stream continued elsewhere, a pair
    // sent again) or finished on it while its pod drained: none failed either way.
    if transport == "nats" {
        assert!(
            published >= 2 * report.ok,
            "both legs over NATS: {published} for {} requests",
            report.ok
        );
    } else {
        assert_eq!(published, 0);
    }
}

#[tokio::test]
async fn a_decode_killed_mid_stream_fails_no_request_over_http_or_nats() {
    let cluster = Cluster::connect().await.unwrap();
    lose_a_decode(&cluster, "http").await;
    lose_a_decode(&cluster, "nats").await;
}
