//! GitOps as a user runs it, on the node: Flux's source-, kustomize- and helm-controller
//! (built from their Go modules) sync `examples/gitops/flux` from a git server on the
//! node's address, whose repository holds this tree's `charts/` and `examples/gitops/`
//! at their paths. The examples are applied as written but for the repository URL, the
//! one value a user sets, and the cluster's chart values in the optional ConfigMap the
//! HelmRelease reads. Reconciles are asked for (`reconcile.fluxcd.io/requestedAt`), not
//! waited for. In order, with no status written by the test:
//!
//! 1. Flux takes over the chart the cluster runs (a HelmRelease adopts the release) and
//!    syncs the workload; it serves through its gateway;
//! 2. a pushed commit changing the workload's replicas and an engine argument is
//!    applied and rolled under load, with no request failed;
//! 3. a pushed commit with an invalid manifest: the Kustomization reports the API
//!    server's refusal naming the field, and the running deployment is untouched;
//! 4. the zero-drift contract of the GitOps guide: Git leaves `spec.replicas` out once the
//!    operator's autoscaler sizes the deployment; after a scale through `/scale`, an
//!    autoscaler scale-out, its stand-down for an HPA (from Git) and its return, a chart
//!    upgrade through Git (no engine restarts), and many reconciles, a server-side dry
//!    run of the Git manifests under kustomize-controller's field manager changes
//!    nothing, and kustomize-controller's own apply reports every object unchanged.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time. It leaves the release
//! as it found it (a guard hands it back to Helm with its values, also on failure).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::{ROLLOUT, condition};
use infera_e2e::gateway::Gateway;
use infera_e2e::gitops::{Checkout, FLUX_NAMESPACE, GitServer, KUSTOMIZE_MANAGER};
use infera_e2e::load::Load;
use infera_e2e::{Cluster, RELEASE_NAMESPACE, eventually, repo};
use infera_testkit::binaries::{Binary, locate};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NS: &str = "infera-demo";
const NAME: &str = "gitops-sim";
const MODEL: &str = "sim-llama-8b";
const WORKLOAD: &str = "examples/gitops/workloads/inferadeployment.yaml";
/// The placeholder URL of the examples, the one value a user changes.
const EXAMPLE_URL: &str = "https://github.com/infera/infera";
/// A Flux step that runs Helm (an install or upgrade with `--wait`) or a rollout.
const FLUX_STEP: Duration = Duration::from_secs(420);

fn helm(kubeconfig: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(locate(Binary::Helm).unwrap());
    c.arg("--kubeconfig").arg(kubeconfig);
    c
}

/// Hands the release back to Helm when dropped, passed or failed: Flux's objects are
/// suspended and deleted (a suspended HelmRelease is deleted without an uninstall),
/// Flux removed, the workload's namespace deleted, and the chart upgraded from this
/// tree with the values it had before the test.
struct HandBack {
    kubeconfig: PathBuf,
    values: PathBuf,
}

impl Drop for HandBack {
    fn drop(&mut self) {
        let kubectl = locate(Binary::Kubectl).unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args)
                .output();
            if let Ok(o) = out
                && !o.status.success()
            {
                eprintln!(
                    "hand back: kubectl {args:?}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        };
        for object in [
            "kustomization.kustomize.toolkit.fluxcd.io/infera-release",
            "kustomization.kustomize.toolkit.fluxcd.io/infera-workloads",
            "helmrelease.helm.toolkit.fluxcd.io/infera",
        ] {
            run(&[
                "patch",
                object,
                "-n",
                FLUX_NAMESPACE,
                "--type=merge",
                "-p",
                r#"{"spec":{"suspend":true}}"#,
            ]);
        }
        for kind in [
            "kustomizations.kustomize.toolkit.fluxcd.io",
            "helmreleases.helm.toolkit.fluxcd.io",
            // Suspended, the HelmRelease leaves its HelmChart: deleted here, while
            // source-controller still runs to remove its finalizer.
            "helmcharts.source.toolkit.fluxcd.io",
            "gitrepositories.source.toolkit.fluxcd.io",
        ] {
            run(&[
                "delete",
                kind,
                "--all",
                "-n",
                FLUX_NAMESPACE,
                "--wait=true",
                "--timeout=120s",
            ]);
        }
        run(&[
            "delete",
            "namespace",
            NS,
            "--wait=false",
            "--ignore-not-found",
        ]);
        run(&[
            "delete",
            "namespace",
            FLUX_NAMESPACE,
            "--wait=false",
            "--ignore-not-found",
        ]);
        let out = helm(&self.kubeconfig)
            .args(["upgrade", "infera"])
            .arg(repo().join("charts/infera"))
            .args(["-n", RELEASE_NAMESPACE, "-f"])
            .arg(&self.values)
            .args(["--wait", "--timeout", "300s"])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "hand back: helm upgrade: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("hand back: helm upgrade: {e}"),
        }
    }
}

async fn idep(cluster: &Cluster) -> Value {
    cluster
        .get_json(&["get", "idep", NAME, "-n", NS])
        .await
        .unwrap()
}

/// Engine pods by name: (uid, the engine's restart count).
async fn engines(cluster: &Cluster) -> BTreeMap<String, (String, i64)> {
    cluster
        .engine_pods(NS, NAME)
        .await
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let restarts = p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                (p["metadata"]["uid"].as_str().unwrap().to_owned(), restarts),
            )
        })
        .collect()
}

/// The gateway reached through a NodePort Service of the test's own (the workload's
/// spec stays as Git has it).
async fn gateway(cluster: &Cluster, workers: usize) -> Gateway {
    let svc = cluster
        .get_json(&["get", "service", &format!("{NAME}-gateway"), "-n", NS])
        .await
        .unwrap();
    let node_port = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "gitops-test-node-port", "namespace": NS},
        "spec": {"type": "NodePort", "selector": svc["spec"]["selector"],
                 "ports": [{"port": svc["spec"]["ports"][0]["port"],
                            "targetPort": svc["spec"]["ports"][0]["targetPort"]}]}
    });
    cluster.apply(NS, &node_port.to_string()).await.unwrap();
    let svc = cluster
        .get_json(&["get", "service", "gitops-test-node-port", "-n", NS])
        .await
        .unwrap();
    let port = svc["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
    let gateway = Gateway::new(format!("http://127.0.0.1:{port}")).unwrap();
    cluster
        .wait_active_workers(NS, &gateway, workers)
        .await
        .unwrap();
    gateway
}

/// Pushes, asks Flux to fetch it, and waits for the workloads' Kustomization to apply it.
async fn push_and_sync(cluster: &Cluster, checkout: &Checkout, message: &str) -> String {
    let sha = checkout.push(message).await.unwrap();
    cluster
        .flux_reconcile("gitrepository", "infera")
        .await
        .unwrap();
    cluster
        .wait_flux_ready("kustomization", "infera-workloads", &sha, FLUX_STEP)
        .await
        .unwrap();
    sha
}

/// Waits for the deployment to settle at `workers` ready workers, its spec observed.
async fn settled(cluster: &Cluster, workers: i64) -> Value {
    eventually(
        cluster,
        NS,
        &format!("{NAME} settled at {workers} workers"),
        ROLLOUT,
        || async {
            let d = idep(cluster).await;
            let ready = condition(&d, "Ready").is_some_and(|c| c["status"] == "True");
            let observed = d["status"]["observedGeneration"] == d["metadata"]["generation"];
            let pods = engines(cluster).await.len() as i64;
            if ready
                && observed
                && d["status"]["readyReplicas"] == workers
                && d["status"]["replicas"] == workers
                && pods == workers
            {
                Ok(d)
            } else {
                Err(format!(
                    "ready {ready}, observed {observed}, pods {pods}, status {}",
                    d["status"]
                ))
            }
        },
    )
    .await
    .unwrap()
}

/// The managers whose applied configuration (server-side apply) holds the workload's
/// `spec.replicas`.
async fn replicas_appliers(cluster: &Cluster) -> Vec<String> {
    let d = cluster
        .get_json(&["get", "idep", NAME, "-n", NS, "--show-managed-fields"])
        .await
        .unwrap();
    d["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["operation"] == "Apply")
        .filter(|e| !e["fieldsV1"]["f:spec"]["f:replicas"].is_null())
        .filter_map(|e| e["manager"].as_str().map(str::to_owned))
        .collect()
}

/// kustomize-controller's `server-side apply completed` log lines for the workloads'
/// Kustomization since `since` (RFC 3339): each its map of object to action.
async fn applied_since(cluster: &Cluster, since: &str) -> Vec<BTreeMap<String, String>> {
    let logs = cluster
        .kubectl(&[
            "logs",
            "-n",
            FLUX_NAMESPACE,
            "deploy/kustomize-controller",
            &format!("--since-time={since}"),
        ])
        .await
        .unwrap();
    logs.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["msg"] == "server-side apply completed"
                && (l["name"] == "infera-workloads"
                    || l["Kustomization"]["name"] == "infera-workloads")
        })
        .map(|l| serde_json::from_value(l["output"].clone()).unwrap_or_default())
        .collect()
}

fn now_rfc3339() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The Git manifests of the workloads as kustomize-controller applies them (with the
/// two labels it adds to every object), server-side applied as a dry run under its field
/// manager (forcing, as it does): each result beside the live object, by `kind/name`.
async fn dry_run_against_live(
    cluster: &Cluster,
    checkout: &Checkout,
) -> Vec<(String, Value, Value)> {
    let dir = checkout.path("examples/gitops/workloads");
    let labelled = cluster
        .kubectl(&[
            "label",
            "--local",
            "-f",
            &dir.display().to_string(),
            "-o",
            "json",
            "kustomize.toolkit.fluxcd.io/name=infera-workloads",
            "kustomize.toolkit.fluxcd.io/namespace=flux-system",
        ])
        .await
        .unwrap();
    let out = cluster
        .kubectl_with_input(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--dry-run=server",
                &format!("--field-manager={KUSTOMIZE_MANAGER}"),
                "-f",
                "-",
                "-o",
                "json",
            ],
            Some(&labelled),
        )
        .await
        .unwrap();
    // One object, or a List of them.
    let applied: Value = serde_json::from_str(&out).unwrap();
    let items = match applied["kind"].as_str() {
        Some("List") => applied["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![applied],
    };
    let mut pairs = Vec::new();
    for item in items {
        let kind = item["kind"].as_str().unwrap().to_owned();
        let name = item["metadata"]["name"].as_str().unwrap().to_owned();
        let mut args = vec!["get".to_owned(), kind.clone(), name.clone()];
        if let Some(ns) = item["metadata"]["namespace"].as_str() {
            args.extend(["-n".to_owned(), ns.to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let live = cluster.get_json(&args).await.unwrap();
        pairs.push((format!("{kind}/{name}"), item, live));
    }
    pairs
}

/// The workload autoscaled, as the GitOps guide shows it: `spec.autoscaling` added
/// (engines with two seats each, so a modest load queues), then, once the autoscaler
/// runs, `spec.replicas` left out of Git.
fn autoscaled_workload(example: &str, keep_replicas: bool) -> String {
    let kept: String = example
        .lines()
        .filter(|l| keep_replicas || !l.trim_start().starts_with("replicas:"))
        .map(|l| format!("{l}\n"))
        .collect();
    format!(
        "{}  autoscaling:
    minReplicas: 2
    maxReplicas: 3
    targets: {{waitingPerWorker: 1}}
    scaleDownStabilizationSeconds: 10
    intervalSeconds: 2
",
        kept.replace(
            r#"args: ["--speedup", "2"]"#,
            r#"args: ["--speedup", "2", "--max-num-seqs", "2"]"#
        )
    )
}

const HPA: &str =
    "# An HPA on the deployment's /scale: the operator's autoscaler stands down while it exists.
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: gitops-sim
  namespace: infera-demo
spec:
  scaleTargetRef: {apiVersion: infera.amd.com/v1alpha1, kind: InferaDeployment, name: gitops-sim}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 90}}
";

#[tokio::test]
async fn flux_syncs_rolls_a_push_reports_a_bad_one_and_leaves_no_drift() {
    let started = std::time::Instant::now();
    let cluster = Cluster::connect().await.unwrap();
    let scratch = tempfile::tempdir().unwrap();
    // The release's values now, for the HelmRelease (Flux upgrades it with the same) and
    // for handing it back.
    let values = scratch.path().join("values.yaml");
    let out = helm(cluster.kubeconfig())
        .args([
            "get",
            "values",
            "infera",
            "-n",
            RELEASE_NAMESPACE,
            "-o",
            "yaml",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&values, &out.stdout).unwrap();
    let _hand_back = HandBack {
        kubeconfig: cluster.kubeconfig().to_owned(),
        values: values.clone(),
    };

    // The repository, pushed over HTTP as a user pushes.
    let served = scratch.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let server = GitServer::start(&served).await.unwrap();
    let url = server.create("infera.git").await.unwrap();
    let checkout = Checkout::seed(&scratch.path().join("work"), &url)
        .await
        .unwrap();
    let first = checkout.push("Infera from git").await.unwrap();

    // 1. Flux, the cluster's values, the GitRepository with its URL set, the
    //    Kustomizations as written.
    cluster.install_flux().await.unwrap();
    cluster
        .kubectl(&[
            "create",
            "configmap",
            "infera-values",
            "-n",
            FLUX_NAMESPACE,
            &format!("--from-file=values.yaml={}", values.display()),
        ])
        .await
        .unwrap();
    let source = checkout
        .read("examples/gitops/flux/gitrepository.yaml")
        .unwrap();
    assert!(source.contains(EXAMPLE_URL), "{source}");
    cluster
        .apply(FLUX_NAMESPACE, &source.replace(EXAMPLE_URL, &url))
        .await
        .unwrap();
    let kustomizations = checkout.path("examples/gitops/flux/kustomizations.yaml");
    cluster
        .kubectl(&["apply", "-f", &kustomizations.display().to_string()])
        .await
        .unwrap();
    let operator_pods = |cluster: Cluster| async move {
        cluster
            .pods(RELEASE_NAMESPACE, "app.kubernetes.io/name=infera-operator")
            .await
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["uid"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    cluster
        .wait_flux_ready("gitrepository", "infera", &first, ROLLOUT)
        .await
        .unwrap();
    let release = cluster
        .wait_flux_ready("helmrelease", "infera", &first[..12], FLUX_STEP)
        .await
        .unwrap();
    println!(
        "HelmRelease adopted the release: {}",
        release["status"]["history"][0]
    );
    cluster
        .wait_flux_ready("kustomization", "infera-release", &first, FLUX_STEP)
        .await
        .unwrap();
    cluster
        .wait_flux_ready("kustomization", "infera-workloads", &first, FLUX_STEP)
        .await
        .unwrap();
    settled(&cluster, 3).await;
    let gateway = gateway(&cluster, 3).await;
    let chat = gateway
        .post(
            "/v1/chat/completions",
            &json!({"model": MODEL, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "synced from git"}]}),
        )
        .await
        .unwrap();
    assert_eq!(chat.status, 200, "{}", chat.body);

    // 2. A commit changing replicas and an engine argument, rolled under load. The
    //    chart is rebuilt for the commit too (reconcileStrategy: Revision): Helm upgrades
    //    the release and no operator pod restarts for it.
    let operators = operator_pods(cluster.clone()).await;
    let example = checkout.read(WORKLOAD).unwrap();
    assert!(
        example.contains("replicas: 3") && example.contains(r#"args: ["--speedup", "1"]"#),
        "{example}"
    );
    checkout
        .write(
            WORKLOAD,
            &example
                .replace("replicas: 3", "replicas: 2")
                .replace(r#"args: ["--speedup", "1"]"#, r#"args: ["--speedup", "2"]"#),
        )
        .unwrap();
    let load = Load::start(&gateway, MODEL, 2, 16);
    let second = push_and_sync(&cluster, &checkout, "gitops-sim: 2 workers, speedup 2").await;
    let rolled = eventually(
        &cluster,
        NS,
        "the engines on --speedup 2",
        ROLLOUT,
        || async {
            let pods = cluster
                .engine_pods(NS, NAME)
                .await
                .map_err(|e| e.to_string())?;
            let args: Vec<String> = pods
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .map(|p| {
                    p["spec"]["containers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|c| c["name"] == "engine")
                        .map(|c| c["command"].to_string())
                        .unwrap_or_default()
                })
                .collect();
            if args.len() == 2 && args.iter().all(|a| a.contains(r#""--speedup","2""#)) {
                Ok(args)
            } else {
                Err(format!("{args:?}"))
            }
        },
    )
    .await
    .unwrap();
    settled(&cluster, 2).await;
    let report = load.stop().await;
    println!(
        "rolled to --speedup 2 on {} engines under load: {} requests, {} failed, slowest {:?}",
        rolled.len(),
        report.ok,
        report.failed.len(),
        report.slowest
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(report.ok >= 10, "{report:?}");
    cluster
        .wait_flux_ready("helmrelease", "infera", &second[..12], FLUX_STEP)
        .await
        .unwrap();
    assert_eq!(
        operator_pods(cluster.clone()).await,
        operators,
        "a workload commit restarted the operator"
    );

    // 3. An invalid manifest: refused, reported, nothing of it applied.
    let before = idep(&cluster).await;
    let pods_before = engines(&cluster).await;
    let good = checkout.read(WORKLOAD).unwrap();
    checkout
        .write(WORKLOAD, &good.replace("kind: sim", "kind: tpu"))
        .unwrap();
    let bad = checkout
        .push("gitops-sim: an engine that does not exist")
        .await
        .unwrap();
    cluster
        .flux_reconcile("gitrepository", "infera")
        .await
        .unwrap();
    let refused = eventually(
        &cluster,
        FLUX_NAMESPACE,
        "the bad commit reported",
        FLUX_STEP,
        || async {
            let k = cluster
                .get_json(&[
                    "get",
                    "kustomization",
                    "infera-workloads",
                    "-n",
                    FLUX_NAMESPACE,
                ])
                .await
                .map_err(|e| e.to_string())?;
            let attempted = k["status"]["lastAttemptedRevision"]
                .as_str()
                .unwrap_or_default();
            match condition(&k, "Ready") {
                Some(c) if c["status"] == "False" && attempted.contains(&bad) => {
                    Ok(c["message"].as_str().unwrap_or_default().to_owned())
                }
                other => Err(format!("{other:?}, attempted {attempted}")),
            }
        },
    )
    .await
    .unwrap();
    println!("Flux reports: {refused}");
    assert!(refused.contains("spec.engine.kind"), "{refused}");
    assert!(refused.contains("tpu"), "{refused}");
    let after = idep(&cluster).await;
    assert_eq!(
        after["metadata"]["generation"],
        before["metadata"]["generation"]
    );
    assert_eq!(after["spec"], before["spec"]);
    assert_eq!(engines(&cluster).await, pods_before, "engine pods changed");

    // 4. The zero-drift contract, in the guide's two steps: spec.autoscaling added (the
    //    autoscaler then holds the count too: its own applied configuration carries
    //    spec.replicas beside Git's), then spec.replicas left out of Git: the count stays.
    checkout
        .write(WORKLOAD, &autoscaled_workload(&good, true))
        .unwrap();
    push_and_sync(&cluster, &checkout, "gitops-sim: autoscaled").await;
    let holders = eventually(
        &cluster,
        NS,
        "the autoscaler active and holding spec.replicas",
        ROLLOUT,
        || async {
            let d = idep(&cluster).await;
            let holders = replicas_appliers(&cluster).await;
            if d["status"]["autoscaling"]["state"] == "Active"
                && holders.iter().any(|m| m == "infera-autoscaler")
            {
                Ok(holders)
            } else {
                Err(format!(
                    "{} held by {holders:?}",
                    d["status"]["autoscaling"]
                ))
            }
        },
    )
    .await
    .unwrap();
    println!("spec.replicas applied by {holders:?}");
    settled(&cluster, 2).await;
    let pods_before = engines(&cluster).await;
    checkout
        .write(WORKLOAD, &autoscaled_workload(&good, false))
        .unwrap();
    push_and_sync(
        &cluster,
        &checkout,
        "gitops-sim: replicas left to the autoscaler",
    )
    .await;
    let d = idep(&cluster).await;
    assert_eq!(
        d["spec"]["replicas"], 2,
        "dropping spec.replicas from Git moved it: {}",
        d["spec"]
    );
    assert_eq!(
        engines(&cluster).await,
        pods_before,
        "dropping spec.replicas from Git touched the engines"
    );
    let message = d["status"]["autoscaling"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !message.contains("over the autoscaler's count"),
        "{message}"
    );
    // An autoscaler scale-out: a load the two workers cannot seat.
    let load = Load::start(&gateway, MODEL, 8, 64);
    eventually(
        &cluster,
        NS,
        "the autoscaler scaled out",
        ROLLOUT,
        || async {
            let d = idep(&cluster).await;
            let last = d["status"]["autoscaling"]["lastScale"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if last == "mixed 2 -> 3" {
                Ok(())
            } else {
                Err(format!("{}", d["status"]["autoscaling"]))
            }
        },
    )
    .await
    .unwrap();
    // An HPA from Git: the autoscaler stands down; removed from Git: it comes back.
    checkout
        .write("examples/gitops/workloads/hpa.yaml", HPA)
        .unwrap();
    push_and_sync(&cluster, &checkout, "gitops-sim: an HPA").await;
    eventually(
        &cluster,
        NS,
        "the autoscaler stood down",
        ROLLOUT,
        || async {
            let d = idep(&cluster).await;
            if d["status"]["autoscaling"]["state"] == "StoodDown" {
                Ok(())
            } else {
                Err(format!("{}", d["status"]["autoscaling"]))
            }
        },
    )
    .await
    .unwrap();
    checkout
        .remove("examples/gitops/workloads/hpa.yaml")
        .unwrap();
    push_and_sync(&cluster, &checkout, "gitops-sim: no HPA").await;
    eventually(&cluster, NS, "the autoscaler back", ROLLOUT, || async {
        let d = idep(&cluster).await;
        if d["status"]["autoscaling"]["state"] == "Active" {
            Ok(())
        } else {
            Err(format!("{}", d["status"]["autoscaling"]))
        }
    })
    .await
    .unwrap();
    let report = load.stop().await;
    println!(
        "autoscaler scale-out, HPA stand-down and return: {} requests, {} failed",
        report.ok,
        report.failed.len()
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    // A scale through /scale: Git does not hold spec.replicas, so nothing of Git's
    // fights it (the autoscaler sizes it again at its next decision).
    cluster
        .kubectl(&["scale", "idep", NAME, "-n", NS, "--replicas=2"])
        .await
        .unwrap();

    // A chart upgrade through Git: a new chart version (the operator rolls), no engine
    // restarts.
    let pods_before = engines(&cluster).await;
    let chart = checkout.read("charts/infera/Chart.yaml").unwrap();
    let version_line = chart
        .lines()
        .find(|l| l.starts_with("version:"))
        .unwrap()
        .to_owned();
    checkout
        .write(
            "charts/infera/Chart.yaml",
            &chart.replace(
                &version_line,
                &format!("{}-gitops.1", version_line.trim_end()),
            ),
        )
        .unwrap();
    let load = Load::start(&gateway, MODEL, 2, 16);
    let upgraded = push_and_sync(&cluster, &checkout, "chart: a new version").await;
    let release = cluster
        .wait_flux_ready("helmrelease", "infera", &upgraded[..12], FLUX_STEP)
        .await
        .unwrap();
    let chart_version = release["status"]["history"][0]["chartVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(chart_version.contains("-gitops.1"), "{chart_version}");
    let report = load.stop().await;
    println!(
        "chart {chart_version} through Git: {} requests, {} failed",
        report.ok,
        report.failed.len()
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let pods_after = engines(&cluster).await;
    for (pod, (uid, restarts)) in &pods_before {
        if let Some((now_uid, now_restarts)) = pods_after.get(pod) {
            assert_eq!(
                (now_uid, now_restarts),
                (uid, restarts),
                "{pod} restarted across the chart upgrade"
            );
        }
    }

    // Many reconciles, then the checks.
    let since = now_rfc3339();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..5 {
        cluster
            .flux_reconcile("kustomization", "infera-workloads")
            .await
            .unwrap();
        cluster
            .wait_flux_ready("kustomization", "infera-workloads", &upgraded, FLUX_STEP)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let applies = applied_since(&cluster, &since).await;
    assert!(
        !applies.is_empty(),
        "no apply of infera-workloads logged since {since}"
    );
    for apply in &applies {
        for (object, action) in apply {
            assert_eq!(
                action, "unchanged",
                "kustomize-controller changed {object}: {applies:?}"
            );
        }
    }
    for (object, dry, live) in dry_run_against_live(&cluster, &checkout).await {
        assert_eq!(
            dry["metadata"]["generation"], live["metadata"]["generation"],
            "{object}: a dry run of Git's manifest would change its spec"
        );
        assert_eq!(dry["spec"], live["spec"], "{object}");
        assert_eq!(
            dry["metadata"]["labels"], live["metadata"]["labels"],
            "{object}"
        );
        assert_eq!(
            dry["metadata"]["annotations"], live["metadata"]["annotations"],
            "{object}"
        );
    }
    println!(
        "{} applies since {since}, all unchanged; the dry run changes nothing ({} s in all)",
        applies.len(),
        started.elapsed().as_secs()
    );
}
