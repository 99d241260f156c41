//! A Hugging Face model source on the node: the operator's download Job runs its real
//! script (huggingface_hub, baked into the infera-downloader image) against a stand-in
//! for the Hub's file API running as a pod of the test namespace (`testenv/hf-hub`,
//! reached through its Service by cluster DNS, a gated repository needing the token
//! from a Secret). The cache PVC binds through the node's StorageClass, workers start
//! only after the Job succeeded, and deleting the deployment keeps the downloaded cache.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::ROLLOUT;
use infera_e2e::{Cluster, eventually};
use serde_json::{Value, json};
use std::path::PathBuf;

const REPO: &str = "infera-test/tiny-model";

fn hub(token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Secret
metadata: {{name: hf-token}}
stringData: {{token: {token}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: hf-hub}}
spec:
  selector: {{matchLabels: {{app: hf-hub}}}}
  template:
    metadata: {{labels: {{app: hf-hub}}}}
    spec:
      securityContext: {{runAsNonRoot: true, seccompProfile: {{type: RuntimeDefault}}}}
      containers:
      - name: hub
        image: localhost/infera-testenv/hf-hub:test
        imagePullPolicy: Never
        args: [--repo, {REPO}, --token, {token}, --files, '3']
        ports: [{{containerPort: 8080}}]
        readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
        securityContext: {{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {{drop: [ALL]}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: hf-hub}}
spec:
  selector: {{app: hf-hub}}
  ports: [{{port: 80, targetPort: 8080}}]
"
    )
}

fn deployment(namespace: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: downloaded}}
spec:
  replicas: 1
  model:
    name: downloaded-model
    source:
      huggingFace:
        id: {REPO}
        endpoint: http://hf-hub.{namespace}.svc.cluster.local
        tokenSecretRef: {{name: hf-token, key: token}}
        cacheSize: 1Gi
  engine: {{kind: sim}}
  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
"
    )
}

fn timestamp(value: &Value) -> String {
    value.as_str().unwrap_or("").to_owned()
}

#[tokio::test]
async fn a_hugging_face_model_is_downloaded_in_the_cluster_before_workers_start() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-download").await.unwrap();
    let ns = ns.name.clone();
    cluster.apply(&ns, &hub("fixture-token")).await.unwrap();
    cluster
        .kubectl(&[
            "rollout",
            "status",
            "deployment/hf-hub",
            "-n",
            &ns,
            "--timeout=120s",
        ])
        .await
        .unwrap();
    cluster.apply(&ns, &deployment(&ns)).await.unwrap();

    // Until the download is recorded on the cache PVC, no worker pod may exist while the
    // Job has not completed (the operator renders the workers at 0 replicas until then).
    let early_workers = std::sync::Mutex::new(Vec::new());
    eventually(
        &cluster,
        &ns,
        "the download recorded on the cache PVC",
        ROLLOUT,
        || {
            let early = &early_workers;
            let (cluster, ns) = (&cluster, &ns);
            async move {
                let job = cluster
                    .get_json(&["get", "job", "downloaded-model-download", "-n", ns])
                    .await
                    .ok();
                let workers = cluster
                    .engine_pods(ns, "downloaded")
                    .await
                    .map_err(|e| e.to_string())?;
                if job
                    .as_ref()
                    .is_some_and(|j| !j["status"]["completionTime"].is_string())
                    && !workers.is_empty()
                {
                    early
                        .lock()
                        .unwrap()
                        .push(format!("{} worker pods while the Job runs", workers.len()));
                }
                let pvc = cluster
                    .get_json(&["get", "pvc", "downloaded-model-cache", "-n", ns])
                    .await
                    .map_err(|e| e.to_string())?;
                let recorded = &pvc["metadata"]["annotations"]["infera.amd.com/downloaded"];
                if recorded.is_string() {
                    Ok(())
                } else {
                    Err(format!("Job {:?}", job.map(|j| j["status"].clone())))
                }
            }
        },
    )
    .await
    .unwrap();
    let early = early_workers.lock().unwrap().clone();
    assert!(early.is_empty(), "{early:?}");
    let idep = cluster.wait_ready(&ns, "downloaded").await.unwrap();
    println!("Ready: {}", idep["status"]["conditions"][0]["message"]);
    // The Job's completion, as its Event recorded it, came before every worker pod.
    let events = cluster
        .get_json(&[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            "involvedObject.kind=Job,involvedObject.name=downloaded-model-download,reason=Completed",
        ])
        .await
        .unwrap();
    let completed = events["items"]
        .as_array()
        .and_then(|e| e.first())
        .map(|e| timestamp(&e["lastTimestamp"]))
        .expect("the Job's Completed event");
    println!("download Job completed at {completed}");
    for pod in cluster.engine_pods(&ns, "downloaded").await.unwrap() {
        let created = timestamp(&pod["metadata"]["creationTimestamp"]);
        assert!(
            created >= completed,
            "worker {created} before the download {completed}"
        );
    }

    // The cache: bound through the default StorageClass, recorded as complete, holding
    // the repository's files as the Hub served them.
    let pvc = cluster
        .get_json(&["get", "pvc", "downloaded-model-cache", "-n", &ns])
        .await
        .unwrap();
    assert_eq!(pvc["status"]["phase"], "Bound", "{pvc}");
    assert_eq!(pvc["spec"]["storageClassName"], "infera-local");
    assert_eq!(
        pvc["metadata"]["annotations"]["infera.amd.com/downloaded"],
        format!("{REPO}@main")
    );
    let volume = pvc["spec"]["volumeName"].as_str().unwrap();
    let pv = cluster.get_json(&["get", "pv", volume]).await.unwrap();
    let dir = PathBuf::from(pv["spec"]["local"]["path"].as_str().unwrap()).join(REPO);
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(config.contains("LlamaForCausalLM"), "{config}");
    for i in 1..=3 {
        let weights = dir.join(format!("model-{i:05}-of-00003.safetensors"));
        assert_eq!(
            std::fs::metadata(&weights).unwrap().len(),
            65536,
            "{}",
            weights.display()
        );
    }
    // The Job is gone once recorded; the workers stay.
    eventually(&cluster, &ns, "the Job pruned", ROLLOUT, || async {
        let left = cluster
            .kubectl(&["get", "job", "-n", &ns, "-o", "name"])
            .await
            .map_err(|e| e.to_string())?;
        if left.trim().is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    })
    .await
    .unwrap();

    let gateway = cluster
        .gateway_on_node_port(&ns, "downloaded", 1)
        .await
        .unwrap();
    let answer = gateway
        .post(
            "/v1/chat/completions",
            &json!({"model": "downloaded-model", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "downloaded?"}]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);

    // Deleting the deployment collects its children and keeps the cache.
    cluster.delete_deployment(&ns, "downloaded").await.unwrap();
    eventually(&cluster, &ns, "the workers gone", ROLLOUT, || async {
        let pods = cluster
            .engine_pods(&ns, "downloaded")
            .await
            .map_err(|e| e.to_string())?;
        if pods.is_empty() {
            Ok(())
        } else {
            Err(format!("{} pods", pods.len()))
        }
    })
    .await
    .unwrap();
    let pvc = cluster
        .get_json(&["get", "pvc", "downloaded-model-cache", "-n", &ns])
        .await
        .unwrap();
    assert_eq!(
        pvc["status"]["phase"], "Bound",
        "the cache must outlive the deployment"
    );
    assert!(dir.join("config.json").exists());
}
