//! `spec.autoscaling` on the node: the operator reads the signals off the real gateway
//! and simulated engine pods and sizes the workers itself. A step load doubles, then
//! halves, through the gateway Service; each step prints what the autoscaler saw and
//! how long it took to act.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::ROLLOUT;
use infera_e2e::gateway::Gateway;
use infera_e2e::load::Load;
use infera_e2e::{Cluster, TestNamespace, eventually};
use serde_json::Value;
use std::time::{Duration, Instant};

/// TTFT p90 the deployment is to keep, seconds. A worker runs two requests at once, so
/// a third waits a whole answer (about 0.25 s at 32 tokens) for its first token.
const TTFT_TARGET: f64 = 0.1;

fn autoscaled(name: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: {name}-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim, args: [--max-num-seqs, '2']}}
  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
  autoscaling:
    minReplicas: 1
    maxReplicas: 3
    targets: {{ttftP90Seconds: {TTFT_TARGET}, waitingPerWorker: 1}}
    scaleDownStabilizationSeconds: 10
    intervalSeconds: 2
"
    )
}

async fn idep(cluster: &Cluster, ns: &str, name: &str) -> Result<Value, String> {
    cluster
        .get_json(&["get", "idep", name, "-n", ns])
        .await
        .map_err(|e| e.to_string())
}

fn replicas(idep: &Value) -> i64 {
    idep["spec"]["replicas"].as_i64().unwrap_or(-1)
}

fn autoscaling(idep: &Value) -> &Value {
    &idep["status"]["autoscaling"]
}

fn condition(idep: &Value, kind: &str) -> Value {
    infera_e2e::deploy::condition(idep, kind)
        .cloned()
        .unwrap_or_default()
}

async fn events(cluster: &Cluster, ns: &str, reason: &str) -> Vec<String> {
    let list = cluster
        .get_json(&[
            "get",
            "events.events.k8s.io",
            "-n",
            ns,
            "--field-selector",
            &format!("reason={reason}"),
        ])
        .await
        .unwrap();
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// `manifest` applied in a fresh namespace (deleted when the guard drops), ready, its
/// gateway on a NodePort routing to `workers` workers.
async fn deployed(
    prefix: &str,
    name: &str,
    manifest: &str,
    workers: usize,
) -> (Cluster, TestNamespace, Gateway) {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace(prefix).await.unwrap();
    cluster.apply(&ns.name, manifest).await.unwrap();
    cluster.wait_ready(&ns.name, name).await.unwrap();
    let gateway = cluster
        .gateway_on_node_port(&ns.name, name, workers)
        .await
        .unwrap();
    (cluster, ns, gateway)
}

#[tokio::test]
async fn a_step_load_scales_out_meets_its_ttft_target_then_scales_back_in() {
    let name = "auto";
    let (cluster, guard, gateway) = deployed("e2e-autoscale", name, &autoscaled(name), 1).await;
    let ns = guard.name.clone();
    let model = format!("{name}-model");

    // The base load: two clients fit one worker's two seats; nothing changes.
    let base = Load::start(&gateway, &model, 2, 32);
    let seen = eventually(&cluster, &ns, "looks at the base load", ROLLOUT, || async {
        let d = idep(&cluster, &ns, name).await?;
        let a = autoscaling(&d);
        let looked = a["state"] == "Active"
            && condition(&d, "Autoscaling")["status"] == "True"
            && a["observed"]["ttftP90Seconds"].is_f64()
            && a["lastDecision"]
                .as_str()
                .unwrap_or_default()
                .starts_with("mixed at 1");
        if looked { Ok(d) } else { Err(format!("{a}")) }
    })
    .await
    .unwrap();
    assert_eq!(replicas(&seen), 1, "{}", autoscaling(&seen));
    println!("base load: {}", autoscaling(&seen)["lastDecision"]);

    // The load doubles: requests queue for a seat, TTFT p90 rises past the target.
    let doubled_at = Instant::now();
    let extra = Load::start(&gateway, &model, 2, 32);
    let out = eventually(
        &cluster,
        &ns,
        "a scale-out",
        Duration::from_secs(90),
        || async {
            let d = idep(&cluster, &ns, name).await?;
            if replicas(&d) >= 2 {
                Ok(d)
            } else {
                Err(format!("{}", autoscaling(&d)))
            }
        },
    )
    .await
    .unwrap();
    let react = doubled_at.elapsed();
    let scaled_to = replicas(&out);
    let scaled_out = events(&cluster, &ns, "ScaledOut").await;
    assert!(
        scaled_out.iter().any(|n| n.starts_with("mixed 1 -> ")),
        "{scaled_out:?}"
    );
    assert!(
        scaled_out
            .iter()
            .any(|n| n.contains("TTFT p90") || n.contains("waiting per worker")),
        "a scale-out says why: {scaled_out:?}"
    );
    println!(
        "load doubled: scaled to {scaled_to} in {react:.1?}: {}",
        autoscaling(&out)["lastDecision"]
    );
    // ... and TTFT p90 returns under the target once the new workers serve.
    let met = eventually(
        &cluster,
        &ns,
        "TTFT p90 back under its target",
        ROLLOUT,
        || async {
            let d = idep(&cluster, &ns, name).await?;
            let ttft = autoscaling(&d)["observed"]["ttftP90Seconds"].as_f64();
            let all_ready = d["status"]["readyReplicas"] == d["spec"]["replicas"];
            match ttft {
                Some(t) if all_ready && t < TTFT_TARGET => Ok((d, t)),
                _ => Err(format!("{}", autoscaling(&d))),
            }
        },
    )
    .await
    .unwrap();
    println!(
        "TTFT p90 {:.3} s at {} workers, {:.1?} after the load doubled",
        met.1,
        replicas(&met.0),
        doubled_at.elapsed()
    );
    // It holds there for longer than the scale-down window: four clients need the seats
    // of two workers even though latency is now far under the target.
    let hold_until = Instant::now() + Duration::from_secs(14);
    while Instant::now() < hold_until {
        let d = idep(&cluster, &ns, name).await.unwrap();
        assert!(
            replicas(&d) >= 2,
            "scaled in under the doubled load: {}",
            autoscaling(&d)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The load halves: back to one worker, through its drain.
    let halved_at = Instant::now();
    let extra_report = extra.stop().await;
    let back = eventually(
        &cluster,
        &ns,
        "a scale-in",
        Duration::from_secs(90),
        || async {
            let d = idep(&cluster, &ns, name).await?;
            if replicas(&d) == 1 {
                Ok(d)
            } else {
                Err(format!("{}", autoscaling(&d)))
            }
        },
    )
    .await
    .unwrap();
    let react_in = halved_at.elapsed();
    eventually(&cluster, &ns, "the removed pods gone", ROLLOUT, || async {
        let pods = cluster
            .engine_pods(&ns, name)
            .await
            .map_err(|e| e.to_string())?;
        if pods.len() == 1 {
            Ok(())
        } else {
            Err(format!("{} engine pods", pods.len()))
        }
    })
    .await
    .unwrap();
    let scaled_in = events(&cluster, &ns, "ScaledIn").await;
    assert!(
        scaled_in.iter().any(|n| n.contains(" -> 1")),
        "{scaled_in:?}"
    );
    println!(
        "load halved: back to 1 in {react_in:.1?} (scale-down window 10 s): {}",
        autoscaling(&back)["lastDecision"]
    );
    let base_report = base.stop().await;
    let failed: Vec<&String> = base_report
        .failed
        .iter()
        .chain(&extra_report.failed)
        .collect();
    println!(
        "{} requests, {} failed, slowest {:.1?}",
        base_report.ok + extra_report.ok,
        failed.len(),
        base_report.slowest.max(extra_report.slowest)
    );
    assert!(failed.is_empty(), "failed while autoscaling: {failed:?}");
    assert!(base_report.ok + extra_report.ok > 50);
    // Nothing but the controllers (and the autoscaler, on status.autoscaling) wrote status.
    let foreign = cluster.foreign_status_writers(&ns).await.unwrap();
    assert!(foreign.is_empty(), "{foreign:?}");
}

#[tokio::test]
async fn the_operator_stands_down_for_a_horizontal_pod_autoscaler_and_resumes_after_it() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-autoscale-hpa").await.unwrap();
    let ns = ns.name.clone();
    cluster.apply(&ns, &autoscaled("held")).await.unwrap();
    // The example's HorizontalPodAutoscaler, aimed at this deployment.
    let example =
        std::fs::read_to_string(infera_e2e::repo().join("examples/autoscaling/hpa.yaml")).unwrap();
    let hpa = example
        .split("\n---\n")
        .find(|doc| doc.contains("kind: HorizontalPodAutoscaler"))
        .unwrap()
        .replace("chat-hpa", "held");
    cluster.apply(&ns, &hpa).await.unwrap();
    let d = eventually(
        &cluster,
        &ns,
        "the autoscaler standing down",
        ROLLOUT,
        || async {
            let d = idep(&cluster, &ns, "held").await?;
            let c = condition(&d, "Autoscaling");
            if c["reason"] == "StoodDown" && c["status"] == "False" {
                Ok(d)
            } else {
                Err(format!("{c} {}", autoscaling(&d)))
            }
        },
    )
    .await
    .unwrap();
    assert!(
        autoscaling(&d)["message"]
            .as_str()
            .unwrap()
            .contains("HorizontalPodAutoscaler held"),
        "{}",
        autoscaling(&d)
    );
    assert!(
        !events(&cluster, &ns, "AutoscalerStoodDown")
            .await
            .is_empty()
    );
    // The HPA removed: the operator's autoscaler takes over again.
    cluster
        .kubectl(&["delete", "hpa", "held", "-n", &ns])
        .await
        .unwrap();
    eventually(&cluster, &ns, "the autoscaler back", ROLLOUT, || async {
        let d = idep(&cluster, &ns, "held").await?;
        let c = condition(&d, "Autoscaling");
        if c["status"] == "True" && autoscaling(&d)["state"] != "StoodDown" {
            Ok(())
        } else {
            Err(format!("{c} {}", autoscaling(&d)))
        }
    })
    .await
    .unwrap();
}

/// TTFT p90 the disaggregated deployment keeps, seconds. A prefill worker's two seats
/// prefill a pair of 4,000-character prompts in about 0.11 s: four clients keep up to
/// two pairs in line (TTFT p90 about 0.25 s), eight up to four (about 0.45 s, with
/// about four waiting in prefill's queue); decode's queue (two waiting behind two seats
/// at four clients) shows decode's load. Under decode-bound
/// load the prefill legs stay quick (about 0.03 s), so a first token that waited for a
/// decode seat never adds a prefill worker.
const PD_TTFT_TARGET: f64 = 0.36;

fn autoscaled_pd(name: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: PDTopology
metadata: {{name: {name}-1p1d}}
spec:
  layout: 1P1D
  transport: {{backend: mori, readMode: true}}
  prefill: {{args: [--max-num-seqs, '2']}}
  decode: {{args: [--max-num-seqs, '2']}}
---
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: {name}-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim}}
  serving: {{mode: disaggregated, topologyRef: {name}-1p1d}}
  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
  autoscaling:
    minReplicas: 1
    maxReplicas: 3
    targets: {{ttftP90Seconds: {PD_TTFT_TARGET}, waitingPerWorker: 1}}
    # A need must show in two looks: a request waiting for its KV to arrive counts
    # in decode's queue for a moment.
    scaleUpStabilizationSeconds: 3
    # Longer than the doubled phase holds: prefill's load shows only in TTFT, which a
    # look may give decode when a request waits for its KV there.
    scaleDownStabilizationSeconds: 30
    intervalSeconds: 2
"
    )
}

/// (prefill, decode) workers the autoscaler set; (1, 1) before it wrote any.
fn role_replicas(idep: &Value) -> (i64, i64) {
    let r = &idep["spec"]["serving"]["roleReplicas"];
    (
        r["prefill"].as_i64().unwrap_or(1),
        r["decode"].as_i64().unwrap_or(1),
    )
}

/// Runs a doubled load of `clients` more clients on top of `base` until the workers
/// are `(prefill, decode)`, asserting on the way that the counts never leave the
/// allowed pairs; then stops it and waits until they are back at one each.
async fn step(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    what: &str,
    extra: Load,
    want: (i64, i64),
) -> infera_e2e::load::LoadReport {
    let started = Instant::now();
    let out = eventually(cluster, ns, what, Duration::from_secs(120), || async {
        let d = idep(cluster, ns, name).await?;
        let counts = role_replicas(&d);
        // Only the loaded role moves.
        if (want.0 == 1 && counts.0 != 1) || (want.1 == 1 && counts.1 != 1) {
            return Ok(Err(format!("{counts:?}: {}", autoscaling(&d))));
        }
        if counts == want {
            Ok(Ok(d))
        } else {
            Err(format!("{counts:?}: {}", autoscaling(&d)))
        }
    })
    .await
    .unwrap();
    let out = out.unwrap_or_else(|wrong| panic!("{what}: the wrong role scaled: {wrong}"));
    println!(
        "{what}: {:?} in {:.1?}: {}",
        want,
        started.elapsed(),
        autoscaling(&out)["lastDecision"]
    );
    // Both hold for as long as the doubled load runs (the new workers start, serve,
    // and the scale-down window passes): the other role at one, the loaded one not
    // flapping back while the load still needs it. On a slower machine the doubled
    // load may need one more worker of the loaded role (up to maxReplicas): that is
    // the autoscaler doing its work, not a wrong move.
    let hold_until = Instant::now() + Duration::from_secs(20);
    let mut legs_seen = false;
    let mut most = want;
    while Instant::now() < hold_until {
        let d = idep(cluster, ns, name).await.unwrap();
        // The status shows how long the prefill legs took.
        legs_seen |= autoscaling(&d)["observed"]["prefillP90Seconds"].is_f64();
        let counts = role_replicas(&d);
        let held = if want.0 > 1 {
            counts.0 >= want.0 && counts.1 == 1
        } else {
            counts.1 >= want.1 && counts.0 == 1
        };
        assert!(
            held,
            "{what}: the workers moved under the doubled load to {counts:?}: {}",
            autoscaling(&d)
        );
        most = (most.0.max(counts.0), most.1.max(counts.1));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if most != want {
        println!("{what}: grew to {most:?} while the doubled load ran");
    }
    assert!(
        legs_seen,
        "{what}: no prefillP90Seconds in status.autoscaling.observed"
    );
    let report = extra.stop().await;
    let halved = Instant::now();
    let back = eventually(
        cluster,
        ns,
        "back to 1P1D",
        Duration::from_secs(120),
        || async {
            let d = idep(cluster, ns, name).await?;
            if role_replicas(&d) == (1, 1) {
                Ok(d)
            } else {
                Err(format!("{:?}: {}", role_replicas(&d), autoscaling(&d)))
            }
        },
    )
    .await
    .unwrap();
    println!(
        "{what}, load halved: back to (1, 1) in {:.1?}: {}",
        halved.elapsed(),
        autoscaling(&back)["lastDecision"]
    );
    eventually(cluster, ns, "the removed pods gone", ROLLOUT, || async {
        let pods = cluster
            .engine_pods(ns, name)
            .await
            .map_err(|e| e.to_string())?;
        if pods.len() == 2 {
            Ok(())
        } else {
            Err(format!("{} engine pods", pods.len()))
        }
    })
    .await
    .unwrap();
    report
}

#[tokio::test]
async fn prefill_load_scales_only_prefill_and_decode_load_only_decode() {
    let name = "auto-pd";
    let (cluster, guard, gateway) =
        deployed("e2e-autoscale-pd", name, &autoscaled_pd(name), 2).await;
    let ns = guard.name.clone();
    let model = format!("{name}-model");
    let mut reports = Vec::new();

    // Long prompts, short answers: prefill's two seats fill and its queue grows.
    let base = Load::with_prompt(&gateway, &model, 4, 2, 4000);
    let extra = Load::with_prompt(&gateway, &model, 4, 2, 4000);
    reports.push(
        step(
            &cluster,
            &ns,
            name,
            "prefill-bound load doubled",
            extra,
            (2, 1),
        )
        .await,
    );
    reports.push(base.stop().await);

    // Short prompts, long answers: decode's seats fill.
    let base = Load::start(&gateway, &model, 2, 64);
    let extra = Load::start(&gateway, &model, 2, 64);
    reports.push(
        step(
            &cluster,
            &ns,
            name,
            "decode-bound load doubled",
            extra,
            (1, 2),
        )
        .await,
    );
    reports.push(base.stop().await);

    // Every scale-out named only the loaded role.
    let scaled_out = events(&cluster, &ns, "ScaledOut").await;
    assert!(
        scaled_out.iter().any(|n| n.starts_with("prefill 1 -> 2"))
            && scaled_out.iter().any(|n| n.contains("decode 1 -> 2")),
        "{scaled_out:?}"
    );
    let failed: Vec<&String> = reports.iter().flat_map(|r| &r.failed).collect();
    let ok: u64 = reports.iter().map(|r| r.ok).sum();
    println!("{ok} requests, {} failed", failed.len());
    assert!(failed.is_empty(), "failed while autoscaling: {failed:?}");
    assert!(ok > 50);
    // The shared topology was never changed.
    let topology = cluster
        .get_json(&["get", "pdt", &format!("{name}-1p1d"), "-n", &ns])
        .await
        .unwrap();
    assert_eq!(topology["metadata"]["generation"], 1, "{topology}");
}
