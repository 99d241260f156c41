//! A deployment's life on the node while clients use it: `kubectl scale` up and down,
//! pods deleted gracefully and by force, a gateway pod and the etcd pod killed, the
//! leading operator killed, the deployment deleted. A bounded steady load runs through
//! the gateway Service the whole time; each step prints its figures (failed requests,
//! time to recover) and asserts a bound.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::ROLLOUT;
use infera_e2e::gateway::Gateway;
use infera_e2e::load::{Load, LoadReport};
use infera_e2e::{Cluster, RELEASE_NAMESPACE, eventually};
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Clients of the steady load: in flight at once, so at most this many requests can be
/// lost when a worker dies without warning.
const CLIENTS: usize = 4;

fn mixed(name: &str, replicas: u32, extra: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  model: {{name: {name}-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim, args: [--speedup, '4']}}
  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
{extra}"
    )
}

fn pod_names(pods: &[Value]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// Prints a step's figures (requests answered and failed, with the failures) and hands
/// the report back for the step's assertion.
fn show(step: &str, report: LoadReport, figures: &str) -> LoadReport {
    println!(
        "{step}: {} ok, {} failed, {figures}; failures: {:?}",
        report.ok,
        report.failed.len(),
        report.failed
    );
    report
}

/// Runs the load for `seconds` more, so new and remaining workers take requests.
async fn settle(seconds: u64) {
    tokio::time::sleep(Duration::from_secs(seconds)).await;
}

#[tokio::test]
async fn scaling_up_and_down_under_load_fails_no_request() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-scale").await.unwrap();
    let ns = ns.name.clone();
    cluster.apply(&ns, &mixed("scaled", 2, "")).await.unwrap();
    cluster.wait_ready(&ns, "scaled").await.unwrap();
    let gateway = cluster
        .gateway_on_node_port(&ns, "scaled", 2)
        .await
        .unwrap();
    let load = Load::start(&gateway, "scaled-model", CLIENTS, 8);
    settle(3).await;

    let before = gateway.picks().await.unwrap();
    let started = Instant::now();
    cluster
        .kubectl(&["scale", "idep/scaled", "-n", &ns, "--replicas=4"])
        .await
        .unwrap();
    cluster.wait_active_workers(&ns, &gateway, 4).await.unwrap();
    let up = started.elapsed();
    settle(5).await;
    // The new workers serve.
    let after = gateway.picks().await.unwrap();
    let serving = after
        .iter()
        .filter(|(k, n)| before.get(*k).copied().unwrap_or(0) < **n)
        .count();
    assert_eq!(
        serving, 4,
        "workers that took requests after scaling up: {after:?}"
    );

    let started = Instant::now();
    cluster
        .kubectl(&["scale", "idep/scaled", "-n", &ns, "--replicas=1"])
        .await
        .unwrap();
    cluster.wait_active_workers(&ns, &gateway, 1).await.unwrap();
    eventually(&cluster, &ns, "the removed pods gone", ROLLOUT, || async {
        let pods = cluster
            .engine_pods(&ns, "scaled")
            .await
            .map_err(|e| e.to_string())?;
        if pods.len() == 1 {
            Ok(())
        } else {
            Err(format!("{:?}", pod_names(&pods)))
        }
    })
    .await
    .unwrap();
    let down = started.elapsed();
    settle(2).await;
    let report = load.stop().await;
    println!(
        "scale 2->4: routed to all 4 in {up:.1?}; 4->1: drained and gone in {down:.1?}; \
         {} requests, {} failed, slowest {:.1?}",
        report.ok,
        report.failed.len(),
        report.slowest
    );
    assert!(
        report.failed.is_empty(),
        "failed under scaling: {:?}",
        report.failed
    );
    assert!(
        report.ok > 20,
        "too little load to mean anything: {}",
        report.ok
    );
    // Each removed worker drained through preStop, well within its grace period (90 s):
    // a failed hook would be an Event.
    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            "reason=FailedPreStopHook",
        ])
        .await
        .unwrap();
    assert!(!events.contains("FailedPreStopHook"), "{events}");
    assert!(down < Duration::from_secs(90), "scale-down took {down:?}");
}

#[tokio::test]
async fn scaling_a_pd_deployment_keeps_its_topology_ratio() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-ratio").await.unwrap();
    let ns = ns.name.clone();
    let manifest = "apiVersion: infera.amd.com/v1alpha1
kind: PDTopology
metadata: {name: ratio-1p2d}
spec: {layout: 1P2D, transport: {backend: mooncake}}
---
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: ratio}
spec:
  replicas: 1
  model: {name: ratio-model, source: {hostPath: {path: /models/none}}}
  engine: {kind: sim}
  serving: {mode: disaggregated, topologyRef: ratio-1p2d}
  gateway: {resources: {requests: {cpu: 50m, memory: 64Mi}}}
";
    cluster.apply(&ns, manifest).await.unwrap();
    cluster.wait_ready(&ns, "ratio").await.unwrap();
    cluster
        .kubectl(&["scale", "idep/ratio", "-n", &ns, "--replicas=2"])
        .await
        .unwrap();
    let idep = eventually(&cluster, &ns, "2 units ready", ROLLOUT, || async {
        let idep = cluster
            .wait_ready(&ns, "ratio")
            .await
            .map_err(|e| e.to_string())?;
        if idep["status"]["readyReplicas"] == 2 {
            Ok(idep)
        } else {
            Err(format!("{}", idep["status"]))
        }
    })
    .await
    .unwrap();
    let pods = cluster.engine_pods(&ns, "ratio").await.unwrap();
    let count = |role: &str| {
        pods.iter()
            .filter(|p| p["metadata"]["labels"]["infera.amd.com/role"] == role)
            .count()
    };
    assert_eq!(
        (count("prefill"), count("decode")),
        (2, 4),
        "{}",
        idep["status"]
    );
}

/// Deletes a pod and measures how long until the gateway routes to `workers` workers
/// again.
async fn delete_and_recover(
    cluster: &Cluster,
    ns: &str,
    gateway: &Gateway,
    pod: &str,
    extra: &[&str],
    workers: usize,
) -> Duration {
    let started = Instant::now();
    let mut args = vec!["delete", "pod", pod, "-n", ns, "--wait=false"];
    args.extend_from_slice(extra);
    cluster.kubectl(&args).await.unwrap();
    // The pod leaves routing, then its replacement joins.
    eventually(cluster, ns, "a replacement pod routed", ROLLOUT, || async {
        let pods = cluster
            .engine_pods(ns, "faults")
            .await
            .map_err(|e| e.to_string())?;
        let active = gateway.active_workers().await.map_err(|e| e.to_string())?;
        let replaced = pods.iter().any(|p| {
            p["metadata"]["name"] == pod
                && p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["podIP"]
                    .as_str()
                    .is_some_and(|ip| active.contains(&format!("{ip}:8000")))
        });
        if replaced && active.len() == workers {
            Ok(())
        } else {
            Err(format!("active {active:?}"))
        }
    })
    .await
    .unwrap();
    started.elapsed()
}

#[tokio::test]
async fn faults_under_load_lose_at_most_what_was_in_flight() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-faults").await.unwrap();
    let ns = ns.name.clone();
    // etcd discovery, so the etcd restart below is on this deployment's path; two
    // gateways behind the Service.
    let manifest = mixed("faults", 3, "  discovery: {backend: etcd}\n")
        .replace("gateway: {resources", "gateway: {replicas: 2, resources");
    cluster.apply(&ns, &manifest).await.unwrap();
    cluster.wait_ready(&ns, "faults").await.unwrap();
    let gateway = cluster
        .gateway_on_node_port(&ns, "faults", 3)
        .await
        .unwrap();

    // 1. An engine pod deleted gracefully: preStop drains it first; nothing fails.
    let load = Load::start(&gateway, "faults-model", CLIENTS, 8);
    settle(3).await;
    let took = delete_and_recover(&cluster, &ns, &gateway, "faults-mixed-0", &[], 3).await;
    let report = load.stop().await;
    let report = show(
        "graceful delete",
        report,
        &format!("back to 3 workers in {took:.1?}"),
    );
    assert!(
        report.failed.is_empty(),
        "graceful delete: {:?}",
        report.failed
    );

    // 2. One killed without warning: at most its in-flight requests fail.
    let load = Load::start(&gateway, "faults-model", CLIENTS, 8);
    settle(3).await;
    let took = delete_and_recover(
        &cluster,
        &ns,
        &gateway,
        "faults-mixed-1",
        &["--grace-period=0", "--force"],
        3,
    )
    .await;
    settle(2).await;
    let report = load.stop().await;
    let report = show(
        "forced delete",
        report,
        &format!("back to 3 workers in {took:.1?}"),
    );
    assert!(
        report.failed.len() <= CLIENTS,
        "forced delete: {:?}",
        report.failed
    );

    // 3. A gateway pod deleted: the Service's other replica keeps serving.
    let gateways = cluster
        .pods(
            &ns,
            "infera.amd.com/deployment=faults,app.kubernetes.io/component=gateway",
        )
        .await
        .unwrap();
    assert_eq!(gateways.len(), 2);
    let victim = gateways[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let load = Load::start(&gateway, "faults-model", CLIENTS, 8);
    settle(3).await;
    let started = Instant::now();
    cluster
        .kubectl(&[
            "delete",
            "pod",
            &victim,
            "-n",
            &ns,
            "--wait=true",
            "--timeout=120s",
        ])
        .await
        .unwrap();
    let gone = started.elapsed();
    settle(3).await;
    let report = load.stop().await;
    let report = show(
        "gateway pod deleted",
        report,
        &format!("gone in {gone:.1?}"),
    );
    // The stopping gateway stays up, unready and closing connections, until the Service
    // has dropped it (`--shutdown-delay-s`): no client is refused.
    assert!(
        report.failed.is_empty(),
        "gateway delete: {:?}",
        report.failed
    );
    assert!(report.ok > 10, "{}", report.ok);
    eventually(&cluster, &ns, "two gateways again", ROLLOUT, || async {
        let idep = cluster
            .wait_ready(&ns, "faults")
            .await
            .map_err(|e| e.to_string())?;
        let gw = cluster
            .pods(
                &ns,
                "infera.amd.com/deployment=faults,app.kubernetes.io/component=gateway",
            )
            .await
            .map_err(|e| e.to_string())?;
        let ready = gw
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        if ready == 2 {
            Ok(idep)
        } else {
            Err(format!("{ready} gateways"))
        }
    })
    .await
    .unwrap();

    // 4. The etcd pod restarted: sidecars keep or renew their leases, gateways keep
    // their view and re-sync; no request fails.
    let load = Load::start(&gateway, "faults-model", CLIENTS, 8);
    settle(3).await;
    let started = Instant::now();
    cluster
        .kubectl(&[
            "delete",
            "pod",
            "infera-etcd-0",
            "-n",
            RELEASE_NAMESPACE,
            "--wait=true",
        ])
        .await
        .unwrap();
    eventually(&cluster, &ns, "etcd Ready again", ROLLOUT, || async {
        let pod = cluster
            .get_json(&["get", "pod", "infera-etcd-0", "-n", RELEASE_NAMESPACE])
            .await
            .map_err(|e| e.to_string())?;
        let ready = pod["status"]["containerStatuses"][0]["ready"] == true;
        if ready {
            Ok(())
        } else {
            Err("not ready".into())
        }
    })
    .await
    .unwrap();
    let etcd_back = started.elapsed();
    // The load goes on across the sidecars' next lease keepalive (every 10 s), which
    // meets the restarted etcd.
    settle(12).await;
    cluster.wait_active_workers(&ns, &gateway, 3).await.unwrap();
    let report = load.stop().await;
    let report = show(
        "etcd restarted",
        report,
        &format!("ready in {etcd_back:.1?}"),
    );
    assert!(
        report.failed.is_empty(),
        "etcd restart: {:?}",
        report.failed
    );

    // 5. The leading operator killed: the standby takes the Lease; nothing it owns is
    // recreated or rewritten.
    let children = |kind: &'static str| {
        let cluster = cluster.clone();
        let ns = ns.clone();
        async move {
            let list = cluster.get_json(&["get", kind, "-n", &ns]).await.unwrap();
            list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| {
                    format!(
                        "{}/{}@{}",
                        o["metadata"]["name"].as_str().unwrap(),
                        o["metadata"]["uid"].as_str().unwrap(),
                        o["metadata"]["generation"]
                    )
                })
                .collect::<BTreeSet<_>>()
        }
    };
    let before: Vec<_> = vec![
        children("statefulsets").await,
        children("deployments").await,
        children("services").await,
    ];
    let leader = cluster.operator_leader().await.unwrap();
    let leader_pod = leader.split('_').next().unwrap().to_owned();
    let started = Instant::now();
    cluster
        .kubectl(&[
            "delete",
            "pod",
            &leader_pod,
            "-n",
            RELEASE_NAMESPACE,
            "--grace-period=0",
            "--force",
        ])
        .await
        .unwrap();
    let new_leader = eventually(
        &cluster,
        RELEASE_NAMESPACE,
        "a new leader",
        ROLLOUT,
        || async {
            let holder = cluster.operator_leader().await.map_err(|e| e.to_string())?;
            if !holder.is_empty() && !holder.starts_with(&leader_pod) {
                Ok(holder)
            } else {
                Err(format!("holder {holder}"))
            }
        },
    )
    .await
    .unwrap();
    let took_over = started.elapsed();
    // Let the new leader reconcile everything once, then compare.
    cluster.wait_leader_caught_up(&ns).await.unwrap();
    let after: Vec<_> = vec![
        children("statefulsets").await,
        children("deployments").await,
        children("services").await,
    ];
    println!("operator {leader_pod} killed: {new_leader} leads after {took_over:.1?}");
    assert_eq!(
        before, after,
        "children recreated or rewritten by the new leader"
    );
    cluster.wait_ready(&ns, "faults").await.unwrap();
    let foreign = cluster.foreign_status_writers(&ns).await.unwrap();
    assert!(foreign.is_empty(), "{foreign:?}");
}

/// The one decode worker of a 2P1D deployment killed without warning, under the steady
/// load: with flow control (on by default), requests that arrive before the replacement
/// is Ready wait for it, and streams the loss cut wait to continue on it, so none fails
/// while the replacement starts within the deadline.
#[tokio::test]
async fn the_one_decode_pod_of_a_2p1d_killed_fails_no_request() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-nodecode").await.unwrap();
    let ns = ns.name.clone();
    let manifest = "apiVersion: infera.amd.com/v1alpha1
kind: PDTopology
metadata: {name: nodecode-2p1d}
spec: {layout: 2P1D, transport: {backend: mooncake}}
---
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: nodecode}
spec:
  replicas: 1
  model: {name: nodecode-model, source: {hostPath: {path: /models/none}}}
  engine: {kind: sim, args: [--speedup, '4']}
  serving: {mode: disaggregated, topologyRef: nodecode-2p1d}
  gateway:
    resources: {requests: {cpu: 50m, memory: 64Mi}}
    flowControl: {ttftDeadlineMs: 60000}
";
    cluster.apply(&ns, manifest).await.unwrap();
    cluster.wait_ready(&ns, "nodecode").await.unwrap();
    let gateway = cluster
        .gateway_on_node_port(&ns, "nodecode", 3)
        .await
        .unwrap();
    let decode = |pods: &[Value]| {
        pods.iter()
            .find(|p| p["metadata"]["labels"]["infera.amd.com/role"] == "decode")
            .map(|p| {
                (
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    p["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                )
            })
    };
    let pods = cluster.engine_pods(&ns, "nodecode").await.unwrap();
    let (pod, uid) = decode(&pods).expect("a decode pod");
    let load = Load::start(&gateway, "nodecode-model", CLIENTS, 8);
    settle(3).await;
    let started = Instant::now();
    cluster
        .kubectl(&[
            "delete",
            "pod",
            &pod,
            "-n",
            &ns,
            "--wait=false",
            "--grace-period=0",
            "--force",
        ])
        .await
        .unwrap();
    eventually(
        &cluster,
        &ns,
        "a new decode pod routed",
        ROLLOUT,
        || async {
            let pods = cluster
                .engine_pods(&ns, "nodecode")
                .await
                .map_err(|e| e.to_string())?;
            let active = gateway.active_workers().await.map_err(|e| e.to_string())?;
            let replaced = pods.iter().any(|p| {
                p["metadata"]["labels"]["infera.amd.com/role"] == "decode"
                    && p["metadata"]["uid"] != uid.as_str()
                    && p["status"]["podIP"]
                        .as_str()
                        .is_some_and(|ip| active.iter().any(|a| a.starts_with(&format!("{ip}:"))))
            });
            if replaced && active.len() == 3 {
                Ok(())
            } else {
                Err(format!("active {active:?}"))
            }
        },
    )
    .await
    .unwrap();
    let took = started.elapsed();
    settle(2).await;
    let report = load.stop().await;
    let slowest = report.slowest;
    let report = show(
        "decode killed",
        report,
        &format!("new decode routed in {took:.1?}, slowest request {slowest:.1?}"),
    );
    assert!(report.ok > 0);
    assert!(
        report.failed.is_empty(),
        "decode killed: {:?}",
        report.failed
    );
}

#[tokio::test]
async fn deleting_a_deployment_collects_every_child() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-delete").await.unwrap();
    let ns = ns.name.clone();
    cluster.apply(&ns, &mixed("doomed", 1, "")).await.unwrap();
    cluster.wait_ready(&ns, "doomed").await.unwrap();
    let selector = "infera.amd.com/deployment=doomed";
    let owned = [
        "statefulsets",
        "deployments",
        "services",
        "poddisruptionbudgets",
        "pods",
    ];
    for kind in owned {
        let list = cluster
            .get_json(&["get", kind, "-n", &ns, "-l", selector])
            .await
            .unwrap();
        assert!(
            !list["items"].as_array().unwrap().is_empty(),
            "no {kind} before delete"
        );
    }
    let started = Instant::now();
    cluster.delete_deployment(&ns, "doomed").await.unwrap();
    eventually(&cluster, &ns, "every child collected", ROLLOUT, || async {
        let mut left = Vec::new();
        for kind in owned
            .iter()
            .chain(&["roles", "rolebindings", "serviceaccounts"])
        {
            let list = cluster
                .get_json(&["get", kind, "-n", &ns, "-l", selector])
                .await
                .map_err(|e| e.to_string())?;
            for item in list["items"].as_array().into_iter().flatten() {
                left.push(format!("{kind}/{}", item["metadata"]["name"]));
            }
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("left {left:?}"))
        }
    })
    .await
    .unwrap();
    println!(
        "children collected {:.1?} after the delete",
        started.elapsed()
    );
}
