//! Infera on the real node (`scripts/cluster create`: kubelet, containerd, scheduler,
//! controllers, kube-proxy, DNS, fake GPUs and RDMA NICs, images built here, the chart
//! installed with `helm`): what a user's first `helm install` and `kubectl apply` do,
//! observed, never simulated. No test here writes a workload's status; each test checks
//! that nothing but the controllers did.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time (they share one node
//! with 2 CPUs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::ROLLOUT;
use infera_e2e::etcd::ChartEtcd;
use infera_e2e::process::container_process;
use infera_e2e::{Cluster, RELEASE_NAMESPACE, eventually, repo};
use serde_json::{Value, json};
use std::os::unix::fs::FileTypeExt;

/// Fails when anything but the controllers wrote the status of a workload in `namespace`.
async fn assert_status_written_by_controllers(cluster: &Cluster, namespace: &str) {
    let foreign = cluster.foreign_status_writers(namespace).await.unwrap();
    assert!(
        foreign.is_empty(),
        "status written by non-controllers in {namespace}: {foreign:?}"
    );
}

fn started_at(statuses: &Value, name: &str) -> String {
    statuses
        .as_array()
        .and_then(|s| s.iter().find(|c| c["name"] == name))
        .map(|c| {
            c["state"]["running"]["startedAt"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_chart_runs_the_operator_etcd_and_nats_as_pods() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = RELEASE_NAMESPACE;
    // Every operator replica Ready (a test before may have rolled them).
    eventually(
        &cluster,
        ns,
        "the operator's replicas Ready",
        ROLLOUT,
        || async {
            let deploy = cluster
                .get_json(&["get", "deployment", "infera-operator", "-n", ns])
                .await
                .map_err(|e| e.to_string())?;
            let (want, ready) = (
                &deploy["spec"]["replicas"],
                &deploy["status"]["readyReplicas"],
            );
            if want.as_i64().is_some() && want == ready && deploy["status"]["replicas"] == *want {
                Ok(())
            } else {
                Err(format!("{}", deploy["status"]))
            }
        },
    )
    .await
    .unwrap();
    let pods = cluster
        .get_json(&[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            "app.kubernetes.io/name=infera-operator",
        ])
        .await
        .unwrap();
    let pods = pods["items"].as_array().unwrap();
    let names: Vec<&str> = pods
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    for pod in pods {
        // In-cluster auth: a projected token of the chart's ServiceAccount, mounted by the
        // ServiceAccount admission plugin.
        assert_eq!(pod["spec"]["serviceAccountName"], "infera-operator");
        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        assert!(
            volumes.iter().any(|v| v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s.get("serviceAccountToken").is_some()))),
            "no ServiceAccount token volume: {volumes:?}"
        );
        assert_eq!(pod["status"]["phase"], "Running");
    }
    // The leader took the Lease through the API, acting as that ServiceAccount.
    let lease = eventually(
        &cluster,
        ns,
        "an operator holding the Lease",
        ROLLOUT,
        || async {
            let holder = cluster.operator_leader().await.map_err(|e| e.to_string())?;
            if names.iter().any(|n| holder.contains(n)) {
                Ok(holder)
            } else {
                Err(format!("holder {holder:?}, pods {names:?}"))
            }
        },
    )
    .await
    .unwrap();
    println!("operator leader: {lease}");
    // etcd and NATS run from their (stand-in) images on volumes bound on this node
    // (etcd's health on its metrics port: its client port asks for a certificate).
    for (sts, port, path) in [
        ("infera-etcd", 2381, "/health"),
        ("infera-nats", 8222, "/healthz"),
    ] {
        let set = cluster
            .get_json(&["get", "statefulset", sts, "-n", ns])
            .await
            .unwrap();
        assert_eq!(
            set["status"]["readyReplicas"], 1,
            "{sts}: {}",
            set["status"]
        );
        let pod = cluster
            .get_json(&["get", "pod", &format!("{sts}-0"), "-n", ns])
            .await
            .unwrap();
        let ip = pod["status"]["podIP"].as_str().unwrap();
        let body = infera_e2e::http()
            .get(format!("http://{ip}:{port}{path}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            body.contains("true") || body.contains("ok"),
            "{sts} {path}: {body}"
        );
        let pvc = cluster
            .get_json(&["get", "pvc", &format!("data-{sts}-0"), "-n", ns])
            .await
            .unwrap();
        assert_eq!(pvc["status"]["phase"], "Bound", "{pvc}");
        assert_eq!(pvc["spec"]["storageClassName"], "infera-local");
    }
    // etcd serves clients over TLS only, and only those with a certificate of its CA
    // (#20: one unauthenticated put of a worker record used to receive prompts).
    let etcd = ChartEtcd::connect(&cluster).await.unwrap();
    let put = json!({"key": "L2luZmVyYS93b3JrZXJzL2V2aWw=", "value": "e30="});
    let plain = infera_e2e::http()
        .post(format!("http://{}:2379/v3/kv/put", etcd.ip))
        .json(&put)
        .send()
        .await;
    assert!(
        plain.as_ref().map_or(true, |r| !r.status().is_success()),
        "plain HTTP accepted: {plain:?}"
    );
    let anonymous = etcd
        .anonymous()
        .unwrap()
        .post(format!("{}/v3/kv/put", etcd.url))
        .json(&put)
        .send()
        .await;
    assert!(
        anonymous.is_err(),
        "no client certificate, yet: {anonymous:?}"
    );
    let status = etcd
        .client()
        .unwrap()
        .post(format!("{}/v3/maintenance/status", etcd.url))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 200, "with the chart's client certificate");
    assert_status_written_by_controllers(&cluster, ns).await;
}

#[tokio::test]
async fn the_mixed_sim_example_serves_through_its_gateway_service() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-sim").await.unwrap();
    let ns = ns.name.clone();
    let example = repo().join("examples/sim/deployment.yaml");
    cluster
        .kubectl(&["apply", "-n", &ns, "-f", example.to_str().unwrap()])
        .await
        .unwrap();
    let idep = cluster.wait_ready(&ns, "sim-mixed").await.unwrap();
    assert_eq!(idep["status"]["readyReplicas"], 3, "{}", idep["status"]);

    let pods = cluster.engine_pods(&ns, "sim-mixed").await.unwrap();
    assert_eq!(pods.len(), 3);
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let ip = pod["status"]["podIP"].as_str().unwrap();
        // $(POD_IP) in the sidecar's arguments expanded by the kubelet: the record it
        // wrote on its Pod names the Pod's address.
        let record = pod["metadata"]["annotations"]
            [infera_proto::discovery::WORKER_INFO_ANNOTATION]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no worker record annotation"));
        let record: Value = serde_json::from_str(record).unwrap();
        assert_eq!(record["url"], format!("http://{ip}:8000"), "{name}");
        assert_eq!(record["model_name"], "sim-llama-8b");
        // The sidecar is a native sidecar: started before the engine, still running.
        let sidecar = started_at(&pod["status"]["initContainerStatuses"], "sidecar");
        let engine = started_at(&pod["status"]["containerStatuses"], "engine");
        assert!(
            !sidecar.is_empty() && sidecar <= engine,
            "{name}: sidecar {sidecar}, engine {engine}"
        );
        for status in pod["status"]["containerStatuses"].as_array().unwrap() {
            assert_eq!(status["ready"], true, "{name}: {status}");
        }
    }

    let gateway = cluster
        .gateway_on_node_port(&ns, "sim-mixed", 3)
        .await
        .unwrap();
    let model = "sim-llama-8b";
    let chat = gateway
        .post(
            "/v1/chat/completions",
            &json!({"model": model, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Hello from the node"}]}),
        )
        .await
        .unwrap();
    assert_eq!(chat.status, 200, "{}", chat.body);
    assert!(
        chat.body["choices"][0]["message"]["content"].is_string(),
        "{}",
        chat.body
    );
    assert_eq!(chat.picked.len(), 1, "{:?}", chat.picked);

    let completion = gateway
        .post(
            "/v1/completions",
            &json!({"model": model, "max_tokens": 8, "prompt": "Once upon a time"}),
        )
        .await
        .unwrap();
    assert_eq!(completion.status, 200, "{}", completion.body);
    assert!(
        completion.body["choices"][0]["text"].is_string(),
        "{}",
        completion.body
    );

    let stream = gateway
        .post(
            "/v1/chat/completions",
            &json!({"model": model, "max_tokens": 8, "stream": true,
                    "messages": [{"role": "user", "content": "Stream to me"}]}),
        )
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    let events = stream.body.as_array().unwrap();
    assert_eq!(events.last(), Some(&Value::from("[DONE]")), "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| e["choices"][0]["delta"]["content"].is_string()),
        "{events:?}"
    );

    // Requests sharing a long prefix land on the worker that holds it, known to the
    // gateway from the engines' KV events (ZMQ from each engine pod to the gateway pod).
    let questions = [
        "And the atlases?",
        "Who keeps the index?",
        "When do you close?",
    ];
    let (first, answers) = cluster
        .shared_prefix_exchange(&ns, &gateway, model, "Where are the maps?", &questions)
        .await
        .unwrap();
    assert_eq!(first.status, 200, "{}", first.body);
    for (question, answer) in questions.iter().zip(&answers) {
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            answer.picked, first.picked,
            "{question}: another worker than the prefix's"
        );
        assert!(
            answer.cached_tokens() > 0,
            "{question}: no cached prompt tokens: {}",
            answer.body["usage"]
        );
    }

    assert_status_written_by_controllers(&cluster, &ns).await;
}

#[tokio::test]
async fn a_sim_engine_gets_gpus_rdma_devices_and_a_kvd_beside_it() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-devices").await.unwrap();
    let ns = ns.name.clone();
    let manifest = r#"
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata:
  name: sim-devices
spec:
  replicas: 1
  model:
    name: sim-devices-model
    source:
      hostPath: {path: /models/none}
  engine:
    kind: sim
    resources:
      limits: {amd.com/gpu: "2"}
  network:
    rdma: {enabled: true, count: 1, gidIndex: 3}
  gateway:
    resources:
      requests: {cpu: 50m, memory: 64Mi}
  kvCache:
    enabled: true
    ram: 64Mi
"#;
    cluster
        .kubectl_with_input(&["apply", "-n", &ns, "-f", "-"], Some(manifest))
        .await
        .unwrap();
    cluster.wait_ready(&ns, "sim-devices").await.unwrap();
    let pods = cluster.engine_pods(&ns, "sim-devices").await.unwrap();
    let pod = pods[0]["metadata"]["name"].as_str().unwrap().to_owned();

    // The kubelet's device manager allocated from the plugin: two GPUs (kfd, and a card
    // and render node each) and one NIC (its uverbs node and rdma_cm), all device nodes.
    let proc = container_process(&pod, |argv| argv.join(" ").contains("infera-sim"))
        .expect("the engine's process on this host");
    let root = proc.join("root");
    let count = |dir: &str, prefix: &str| -> usize {
        std::fs::read_dir(root.join(dir))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_char_device()))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(count("dev", "kfd"), 1, "{pod}: /dev/kfd");
    assert_eq!(count("dev/dri", "renderD"), 2, "{pod}: /dev/dri/renderD*");
    assert_eq!(count("dev/dri", "card"), 2, "{pod}: /dev/dri/card*");
    assert_eq!(
        count("dev/infiniband", "uverbs"),
        1,
        "{pod}: /dev/infiniband/uverbs*"
    );
    assert_eq!(
        count("dev/infiniband", "rdma_cm"),
        1,
        "{pod}: /dev/infiniband/rdma_cm"
    );
    let environ = std::fs::read(proc.join("environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    for var in [
        "MC_GID_INDEX=3",
        "NCCL_IB_GID_INDEX=3",
        "MORI_IB_GID_INDEX=3",
        "PCIDEVICE_RDMA_HCA=",
    ] {
        assert!(
            environ
                .split('\0')
                .any(|v| v == var || (var.ends_with('=') && v.starts_with(var))),
            "{pod}: {var} not in the engine's env"
        );
    }

    // kvd answers over the socket on the volume it shares with the engine.
    let stats = cluster
        .kubectl(&[
            "exec",
            "-n",
            &ns,
            &pod,
            "-c",
            "kvd",
            "--",
            "infera-kvd",
            "stats",
            "--socket",
            "/run/infera-kvd/kvd.sock",
        ])
        .await
        .unwrap();
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert!(stats["entries"].is_u64(), "{stats}");

    assert_status_written_by_controllers(&cluster, &ns).await;
}
