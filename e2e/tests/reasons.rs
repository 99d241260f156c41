//! Why a deployment is not running, as the user reads it from the InferaDeployment
//! alone (`kubectl get idep`, `kubectl describe idep`): the scheduler's verdict when
//! pods ask for more GPUs or RDMA devices than the node has (the kubelet's device
//! manager counts what the device plugin advertises), an image that cannot be pulled,
//! an engine that keeps crashing. Each becomes the `Ready` condition's reason with the
//! pod's message, and a Warning Event of the same reason.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::{ROLLOUT, condition};
use infera_e2e::{Cluster, eventually};

fn manifest(name: &str, engine_extra: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: {name}-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine:
    kind: sim
{engine_extra}
  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
{spec_extra}"
    )
}

#[tokio::test]
async fn the_deployment_says_why_its_pods_do_not_run() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-reasons").await.unwrap();
    let ns = ns.name.clone();
    // (deployment, engine fields, spec fields, Ready reason, words the message holds)
    let cases = [
        (
            "too-many-gpus",
            "    resources: {limits: {amd.com/gpu: '16'}}",
            "",
            "Unschedulable",
            "Insufficient amd.com/gpu",
        ),
        (
            "too-many-nics",
            "",
            "  network: {rdma: {enabled: true, count: 16}}",
            "Unschedulable",
            "Insufficient rdma/hca",
        ),
        (
            // A registry on this machine's loopback that nothing serves.
            "no-image",
            "    image: 127.0.0.1:9/infera/absent:0",
            "",
            "ImagePullBackOff",
            "127.0.0.1:9/infera/absent:0",
        ),
        (
            "crashing",
            "    args: [--speedup, not-a-number]",
            "",
            "CrashLoopBackOff",
            "container engine CrashLoopBackOff",
        ),
    ];
    for (name, engine, spec, ..) in cases {
        cluster
            .apply(&ns, &manifest(name, engine, spec))
            .await
            .unwrap();
    }
    for (name, _, _, reason, words) in cases {
        let message = eventually(
            &cluster,
            &ns,
            &format!("{name}: Ready reason {reason}"),
            ROLLOUT,
            || async {
                let idep = cluster
                    .get_json(&["get", "idep", name, "-n", &ns])
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = condition(&idep, "Ready").cloned().unwrap_or_default();
                if ready["status"] == "False" && ready["reason"] == reason {
                    Ok(ready["message"].as_str().unwrap_or("").to_owned())
                } else {
                    Err(format!(
                        "Ready {} {}: {}",
                        ready["status"], ready["reason"], ready["message"]
                    ))
                }
            },
        )
        .await
        .unwrap();
        println!("{name}: {reason}: {message}");
        assert!(message.contains(words), "{name}: {message}");
        let events = cluster
            .kubectl(&[
                "get",
                "events",
                "-n",
                &ns,
                "--field-selector",
                &format!("involvedObject.kind=InferaDeployment,involvedObject.name={name},reason={reason}"),
                "-o",
                "name",
            ])
            .await
            .unwrap();
        assert!(!events.trim().is_empty(), "{name}: no {reason} Event");
    }
}
