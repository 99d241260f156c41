//! An upgrade of Infera itself under live traffic, as a user makes it: the previous
//! release (built from its commit by `scripts/previous-release`: its images, its chart,
//! its CRDs) runs a kv-aware deployment whose gateway fetches the tokenizer from the
//! workers; streams of a few hundred tokens are in flight at every moment; then
//! `scripts/upgrade-crds` and `helm upgrade` to this tree's chart and images (another
//! tag). Asserted, with no status written by the test:
//!
//! - no request fails; no engine container restarts; the engine pods are the same
//!   (uids); the operator and gateway pods are replaced by this release's;
//! - the deployment stored under the previous CRD is read, defaulted and reconciled
//!   without a spec change (its generation holds) or a roll (the StatefulSet's generation
//!   holds); `status.platform` says the engines run the previous release and this one
//!   is available, `PlatformCurrent` is `False` (`NewerPlatformAvailable`);
//! - the previous release's sidecars work with this release's gateway and operator:
//!   records (serving), KV events and prefix affinity, the tokenizer fetch
//!   (`TokenizerLoaded`), a drain (a scale-in under load fails nothing);
//! - `spec.platform.version` set to this release rolls the engines onto it (their sidecar
//!   images change) and the report says what that roll cost in failed requests.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time; it leaves the release
//! on this tree's chart, as the cluster had it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::{ROLLOUT, condition};
use infera_e2e::load::Load;
use infera_e2e::roll::RollSampler;
use infera_e2e::{Cluster, RELEASE_NAMESPACE, eventually, repo};
use infera_testkit::binaries::{Binary, locate};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

async fn run(program: &Path, args: &[&str], env: &[(&str, String)]) -> String {
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
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The previous release's worktree and version.
async fn previous_release() -> (PathBuf, String) {
    let script = repo().join("scripts/previous-release");
    let path = run(&script, &["path"], &[]).await;
    let version = run(&script, &["version"], &[]).await;
    (PathBuf::from(path), version)
}

/// `scripts/upgrade-crds` of `tree`, then `helm upgrade` of the release to `tree`'s
/// chart with its one-node values.
async fn install_release(cluster: &Cluster, tree: &Path) {
    let kubeconfig = cluster.kubeconfig().display().to_string();
    let kubectl = locate(Binary::Kubectl).unwrap().display().to_string();
    run(
        &tree.join("scripts/upgrade-crds"),
        &["--kubeconfig", &kubeconfig],
        &[("KUBECTL", kubectl)],
    )
    .await;
    let chart = tree.join("charts/infera");
    let values = chart.join("ci/one-node.yaml");
    run(
        &locate(Binary::Helm).unwrap(),
        &[
            "--kubeconfig",
            &kubeconfig,
            "upgrade",
            "infera",
            chart.to_str().unwrap(),
            "-n",
            RELEASE_NAMESPACE,
            "-f",
            values.to_str().unwrap(),
            "--wait",
            "--timeout",
            "300s",
        ],
        &[],
    )
    .await;
}

/// Waits until every operator pod runs `image` and one of them leads.
async fn operator_on(cluster: &Cluster, image: &str) -> String {
    eventually(
        cluster,
        RELEASE_NAMESPACE,
        "the operator of the release leading",
        ROLLOUT,
        || async {
            let pods = cluster
                .pods(RELEASE_NAMESPACE, "app.kubernetes.io/name=infera-operator")
                .await
                .map_err(|e| e.to_string())?;
            let on: Vec<&str> = pods
                .iter()
                .filter(|p| p["spec"]["containers"][0]["image"] == image)
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .filter_map(|p| p["metadata"]["name"].as_str())
                .collect();
            let holder = cluster.operator_leader().await.map_err(|e| e.to_string())?;
            if on.len() == pods.len() && on.iter().any(|p| holder.starts_with(p)) {
                Ok(holder)
            } else {
                Err(format!(
                    "holder {holder}, pods on {image}: {on:?} of {}",
                    pods.len()
                ))
            }
        },
    )
    .await
    .unwrap()
}

/// Engine pods by name: uid, restarts of every container, the sidecar's image.
async fn engines(cluster: &Cluster, ns: &str) -> BTreeMap<String, (String, i64, String)> {
    cluster
        .engine_pods(ns, "upgraded")
        .await
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let statuses = p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .chain(p["status"]["initContainerStatuses"].as_array())
                .flatten();
            let restarts: i64 = statuses
                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                .sum();
            let sidecar = p["spec"]["initContainers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "sidecar")
                .map(|c| c["image"].as_str().unwrap().to_owned())
                .unwrap();
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                (
                    p["metadata"]["uid"].as_str().unwrap().to_owned(),
                    restarts,
                    sidecar,
                ),
            )
        })
        .collect()
}

async fn pod_names(cluster: &Cluster, ns: &str, selector: &str) -> Vec<String> {
    cluster
        .pods(ns, selector)
        .await
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

async fn idep(cluster: &Cluster, ns: &str) -> Value {
    cluster
        .get_json(&["get", "idep", "upgraded", "-n", ns])
        .await
        .unwrap()
}

async fn statefulset_generation(cluster: &Cluster, ns: &str) -> Value {
    cluster
        .get_json(&["get", "statefulset", "upgraded-mixed", "-n", ns])
        .await
        .unwrap()["metadata"]["generation"]
        .clone()
}

#[tokio::test]
async fn an_upgrade_from_the_previous_release_restarts_no_engine_and_fails_no_request() {
    use infera_testkit::model_files::{FixtureModel, model_dir};
    let cluster = Cluster::connect().await.unwrap();
    let (previous, version) = previous_release().await;
    let current = env!("CARGO_PKG_VERSION");
    assert_ne!(version, current);
    let operator = |v: &str| format!("ghcr.io/infera/infera-operator:{v}");

    // The previous release, as a cluster running it has it.
    let started = Instant::now();
    install_release(&cluster, &previous).await;
    operator_on(&cluster, &operator(&version)).await;
    println!("release {version} installed in {:.1?}", started.elapsed());

    // A kv-aware deployment whose gateway fetches the workers' tokenizer (a real one,
    // Qwen3's, in a model folder on the node).
    let ns = cluster.namespace("e2e-upgrade").await.unwrap();
    let ns = ns.name.clone();
    let parent = Path::new("/var/lib/infera-e2e/models");
    std::fs::create_dir_all(parent).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("upgrade-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .tempdir_in(parent)
        .unwrap();
    std::fs::create_dir_all(dir.path().join("tok")).unwrap();
    let source = model_dir(FixtureModel::Qwen3).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(source.join(file), dir.path().join("tok").join(file)).unwrap();
    }
    let manifest = format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: upgraded}}
spec:
  replicas: 2
  model: {{name: upgraded-model, tokenizer: tok, source: {{hostPath: {{path: {}}}}}}}
  engine: {{kind: sim, simFlavor: vllm, args: [--speedup, '4'], drainSeconds: 30}}
  gateway: {{replicas: 2, resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
",
        dir.path().display()
    );
    cluster.apply(&ns, &manifest).await.unwrap();
    cluster.wait_ready(&ns, "upgraded").await.unwrap();
    let gateway = cluster
        .gateway_on_node_port(&ns, "upgraded", 2)
        .await
        .unwrap();
    let before = engines(&cluster, &ns).await;
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(
        before
            .values()
            .all(|(_, _, sidecar)| sidecar.ends_with(&format!(":{version}"))),
        "{before:?}"
    );
    let stored = idep(&cluster, &ns).await;
    let generation = stored["metadata"]["generation"].clone();
    let sts_generation = statefulset_generation(&cluster, &ns).await;
    let gateways_before = pod_names(&cluster, &ns, "app.kubernetes.io/component=gateway").await;
    let operators_before = pod_names(
        &cluster,
        RELEASE_NAMESPACE,
        "app.kubernetes.io/name=infera-operator",
    )
    .await;

    // Streams of 300 tokens from 4 clients: some are in flight at every moment.
    let load = Load::start(&gateway, "upgraded-model", 4, 300);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    install_release(&cluster, &repo()).await;
    let leader = operator_on(&cluster, &operator(current)).await;
    cluster.wait_leader_caught_up(&ns).await.unwrap();
    // The gateways roll onto this release's image.
    let gateway_image = format!("ghcr.io/infera/infera-gateway:{current}");
    eventually(
        &cluster,
        &ns,
        "the gateways on this release",
        ROLLOUT,
        || async {
            let pods = cluster
                .pods(&ns, "app.kubernetes.io/component=gateway")
                .await
                .map_err(|e| e.to_string())?;
            let ready = pods
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .filter(|p| p["spec"]["containers"][0]["image"] == gateway_image.as_str())
                .filter(|p| p["status"]["containerStatuses"][0]["ready"] == true)
                .count();
            (ready == 2 && pods.len() == 2)
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "{ready} ready of {} gateway pods on {gateway_image}",
                        pods.len()
                    )
                })
        },
    )
    .await
    .unwrap();
    let upgraded_in = started.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let upgrade = load.stop().await;
    println!(
        "upgraded {version} -> {current} in {upgraded_in:.1?} ({leader} leads): {} requests, {} failed, slowest {:.1?}",
        upgrade.ok,
        upgrade.failed.len(),
        upgrade.slowest
    );
    assert!(upgrade.failed.is_empty(), "{:?}", upgrade.failed);
    assert!(upgrade.ok > 20, "{} requests", upgrade.ok);
    assert_eq!(
        engines(&cluster, &ns).await,
        before,
        "engine pods restarted or replaced"
    );
    assert_eq!(
        statefulset_generation(&cluster, &ns).await,
        sts_generation,
        "the engine StatefulSet was rewritten"
    );
    let gateways_after = pod_names(&cluster, &ns, "app.kubernetes.io/component=gateway").await;
    assert!(
        gateways_after.iter().all(|p| !gateways_before.contains(p)),
        "{gateways_before:?} -> {gateways_after:?}"
    );
    let operators_after = pod_names(
        &cluster,
        RELEASE_NAMESPACE,
        "app.kubernetes.io/name=infera-operator",
    )
    .await;
    assert!(
        operators_after
            .iter()
            .all(|p| !operators_before.contains(p)),
        "{operators_before:?} -> {operators_after:?}"
    );

    // The object the previous CRD stored: read, defaulted, reconciled, its spec as it was.
    let status = eventually(&cluster, &ns, "status.platform", ROLLOUT, || async {
        let d = idep(&cluster, &ns).await;
        match d["status"]["platform"].clone() {
            Value::Null => Err("no status.platform yet".to_owned()),
            p => Ok((d, p)),
        }
    })
    .await
    .unwrap();
    let (upgraded, platform) = status;
    assert_eq!(
        upgraded["metadata"]["generation"], generation,
        "the spec changed"
    );
    assert_eq!(upgraded["spec"]["platform"], Value::Null);
    assert_eq!(platform["engines"], version.as_str());
    assert_eq!(platform["available"], current);
    let cond = condition(&upgraded, "PlatformCurrent").unwrap();
    assert_eq!(
        (cond["status"].as_str(), cond["reason"].as_str()),
        (Some("False"), Some("NewerPlatformAvailable")),
        "{cond}"
    );
    let sts = cluster
        .get_json(&["get", "statefulset", "upgraded-mixed", "-n", &ns])
        .await
        .unwrap();
    assert_eq!(
        sts["metadata"]["annotations"]["infera.amd.com/platform-version"],
        version.as_str()
    );

    // The previous release's sidecars with this release's gateway and operator: the
    // tokenizer they serve is loaded, their KV events steer prefix affinity.
    eventually(&cluster, &ns, "TokenizerLoaded True", ROLLOUT, || async {
        let d = idep(&cluster, &ns).await;
        match condition(&d, "TokenizerLoaded") {
            Some(c) if c["status"] == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    let questions = ["And the atlases?", "Who keeps the index?"];
    let (first, answers) = cluster
        .shared_prefix_exchange(
            &ns,
            &gateway,
            "upgraded-model",
            "Where are the maps?",
            &questions,
        )
        .await
        .unwrap();
    assert_eq!(first.status, 200, "{}", first.body);
    for answer in &answers {
        assert_eq!(answer.picked, first.picked);
        assert!(answer.cached_tokens() > 0, "{}", answer.body["usage"]);
    }
    // A drain of a previous-release sidecar under load: a scale-in fails nothing.
    let load = Load::start(&gateway, "upgraded-model", 4, 300);
    cluster
        .kubectl(&["scale", "idep", "upgraded", "-n", &ns, "--replicas=1"])
        .await
        .unwrap();
    cluster.wait_active_workers(&ns, &gateway, 1).await.unwrap();
    eventually(&cluster, &ns, "one engine pod", ROLLOUT, || async {
        let n = cluster
            .engine_pods(&ns, "upgraded")
            .await
            .map_err(|e| e.to_string())?
            .len();
        (n == 1)
            .then_some(())
            .ok_or_else(|| format!("{n} engine pods"))
    })
    .await
    .unwrap();
    let drain = load.stop().await;
    println!(
        "scale-in under load (a {version} sidecar drained): {} requests, {} failed",
        drain.ok,
        drain.failed.len()
    );
    assert!(drain.failed.is_empty(), "{:?}", drain.failed);
    cluster
        .kubectl(&["scale", "idep", "upgraded", "-n", &ns, "--replicas=2"])
        .await
        .unwrap();
    cluster.wait_active_workers(&ns, &gateway, 2).await.unwrap();
    let kept = engines(&cluster, &ns).await;
    assert!(
        kept.values()
            .all(|(_, _, s)| s.ends_with(&format!(":{version}"))),
        "a new pod of a kept release runs it too: {kept:?}"
    );

    // The user's opt-in: the engines roll onto this release, a new worker beside the
    // old ones (never fewer than two ready).
    let sampler = RollSampler::start(&cluster, &ns, "upgraded");
    let load = Load::start(&gateway, "upgraded-model", 4, 300);
    let started = Instant::now();
    cluster
        .kubectl(&[
            "patch",
            "idep",
            "upgraded",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"platform":{{"version":"{current}"}}}}}}"#),
        ])
        .await
        .unwrap();
    let sidecar = format!("ghcr.io/infera/infera-engine-sidecar:{current}");
    eventually(
        &cluster,
        &ns,
        "the engines on this release",
        ROLLOUT,
        || async {
            let now = engines(&cluster, &ns).await;
            let on = now.values().filter(|(_, _, s)| *s == sidecar).count();
            let d = idep(&cluster, &ns).await;
            let ready = d["status"]["readyReplicas"].as_i64().unwrap_or(0);
            (on == 2 && now.len() == 2 && ready == 2)
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "{on} of {} engine pods on {sidecar}, {ready} ready",
                        now.len()
                    )
                })
        },
    )
    .await
    .unwrap();
    cluster.wait_active_workers(&ns, &gateway, 2).await.unwrap();
    let rolled_in = started.elapsed();
    let roll = load.stop().await;
    let samples = sampler.stop().await;
    println!(
        "opt-in to {current}: engines rolled in {rolled_in:.1?}: {} requests, {} failed {:?}; lowest ready {} ({} samples)",
        roll.ok,
        roll.failed.len(),
        roll.failed.iter().take(3).collect::<Vec<_>>(),
        samples.min_ready["mixed"],
        samples.samples,
    );
    assert!(roll.failed.is_empty(), "{:?}", roll.failed);
    assert!(samples.min_ready["mixed"] >= 2, "{samples:?}");
    let d = idep(&cluster, &ns).await;
    assert_eq!(d["status"]["platform"]["engines"], current);
    assert_eq!(d["status"]["platform"]["available"], Value::Null);
    let cond = condition(&d, "PlatformCurrent").unwrap();
    assert_eq!(cond["status"], "True", "{cond}");
}
