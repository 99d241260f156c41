//! A worker spanning two nodes, on the real node with the real LeaderWorkerSet controller
//! (sigs.k8s.io/lws v0.7.0, its manager and webhooks, installed by
//! `testenv/lws.sh install`): an InferaDeployment with `nodesPerWorker: 2` becomes a
//! LeaderWorkerSet, LWS makes a leader pod and a follower pod of one group (its pod
//! webhook giving them `LWS_LEADER_ADDRESS` and `LWS_WORKER_INDEX`, which the engine's
//! command line uses), only the leader runs the sidecar and registers, and the gateway
//! serves a chat request through the leader.
//!
//! The CRD refuses `kind: sim` with `nodesPerWorker` > 1 ("a simulated worker does not
//! span nodes"), so the deployment is a vLLM one whose image is the simulator's:
//! vLLM's command line (`vllm serve /model-store ... --nnodes 2 --node-rank
//! $(LWS_WORKER_INDEX) --master-addr $(LWS_LEADER_ADDRESS)`, `--headless` on the
//! follower) runs infera-sim, which accepts it, found as `vllm` through a symlink in the
//! model folder (a host folder: the node is this machine) put first on the engine's
//! PATH. The folder also holds a real tokenizer, which the gateway of a real engine
//! loads from the model folder.
//!
//! Run by `scripts/test` in its cluster stage (`scripts/cluster create` installs LWS).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::Cluster;
use infera_e2e::sim_engine::{model_folder, sim_image, vllm_manifest};
use infera_proto::discovery::WORKER_INFO_ANNOTATION;
use serde_json::{Value, json};
use std::time::Instant;

/// LWS's labels on the pods of a group.
const WORKER_INDEX: &str = "leaderworkerset.sigs.k8s.io/worker-index";
const GROUP_INDEX: &str = "leaderworkerset.sigs.k8s.io/group-index";

/// Fails with what to run when the LWS API or its controller is missing.
async fn assert_lws_installed(cluster: &Cluster) {
    let how = "install the LeaderWorkerSet controller on the cluster first: \
               testenv/lws.sh install (scripts/cluster create does it)";
    if let Err(e) = cluster
        .kubectl(&["get", "--raw", "/apis/leaderworkerset.x-k8s.io/v1"])
        .await
    {
        panic!("the API server does not serve leaderworkerset.x-k8s.io/v1 ({e}): {how}");
    }
    let manager = cluster
        .get_json(&[
            "get",
            "deployment",
            "lws-controller-manager",
            "-n",
            "lws-system",
        ])
        .await
        .unwrap_or_else(|e| panic!("no LWS manager Deployment in lws-system ({e}): {how}"));
    assert!(
        manager["status"]["readyReplicas"].as_i64().unwrap_or(0) >= 1,
        "the LWS manager has no ready pod ({}): {how}",
        manager["status"]
    );
}

fn label<'a>(pod: &'a Value, key: &str) -> &'a str {
    pod["metadata"]["labels"][key].as_str().unwrap_or("")
}

fn env_names(pod: &Value, container: &str) -> Vec<String> {
    pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == container)
        .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect()
}

fn init_container_names(pod: &Value) -> Vec<&str> {
    pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

#[tokio::test]
async fn a_two_node_worker_runs_as_a_leader_worker_set_and_serves_through_its_leader() {
    let started = Instant::now();
    let cluster = Cluster::connect().await.unwrap();
    assert_lws_installed(&cluster).await;
    let image = sim_image(&cluster).await.unwrap();
    let folder = model_folder().unwrap();
    let guard = cluster.namespace("e2e-multinode").await.unwrap();
    let ns = guard.name.clone();

    cluster
        .apply(
            &ns,
            &vllm_manifest(
                "multinode",
                folder.path(),
                &image,
                "    parallelism: {nodesPerWorker: 2}\n",
                "",
            ),
        )
        .await
        .unwrap();
    let idep = cluster.wait_ready(&ns, "multinode").await.unwrap();
    let ready_after = started.elapsed();
    assert_eq!(idep["status"]["readyReplicas"], 1, "{}", idep["status"]);

    // The operator's LeaderWorkerSet, reconciled by LWS: one group of two pods.
    let lws = cluster
        .get_json(&["get", "leaderworkerset", "multinode-mixed", "-n", &ns])
        .await
        .unwrap();
    assert_eq!(lws["spec"]["leaderWorkerTemplate"]["size"], 2, "{lws}");
    assert_eq!(lws["status"]["readyReplicas"], 1, "{}", lws["status"]);
    assert_eq!(
        lws["metadata"]["ownerReferences"][0]["kind"], "InferaDeployment",
        "{}",
        lws["metadata"]
    );
    assert!(
        cluster
            .kubectl(&["get", "statefulset", "-n", &ns, "-o", "name"])
            .await
            .unwrap()
            .lines()
            .all(|s| s.starts_with("statefulset.apps/multinode-mixed")),
        "a StatefulSet that LWS did not make"
    );

    // A leader (worker-index 0) and a follower (worker-index 1) of group 0.
    let pods = cluster.engine_pods(&ns, "multinode").await.unwrap();
    let summary: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{} worker-index={} group-index={}",
                p["metadata"]["name"].as_str().unwrap_or("?"),
                label(p, WORKER_INDEX),
                label(p, GROUP_INDEX)
            )
        })
        .collect();
    assert_eq!(pods.len(), 2, "engine pods: {summary:?}");
    let by_index = |i: &str| {
        pods.iter()
            .find(|p| label(p, WORKER_INDEX) == i)
            .unwrap_or_else(|| panic!("no pod with {WORKER_INDEX}={i}: {summary:?}"))
    };
    let (leader, follower) = (by_index("0"), by_index("1"));
    for pod in [leader, follower] {
        assert_eq!(label(pod, GROUP_INDEX), "0", "{summary:?}");
        assert_eq!(pod["status"]["phase"], "Running", "{}", pod["status"]);
        // LWS's pod webhook gave the engine its rendezvous facts.
        let env = env_names(pod, "engine");
        for var in ["LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX"] {
            assert!(env.contains(&var.to_owned()), "{var} not in {env:?}");
        }
    }
    assert_eq!(init_container_names(leader), ["sidecar"], "leader");
    assert!(
        init_container_names(follower).is_empty(),
        "a follower runs the engine only"
    );

    // Only the leader registered, under its own address.
    let leader_ip = leader["status"]["podIP"].as_str().unwrap();
    let info = leader["metadata"]["annotations"][WORKER_INFO_ANNOTATION]
        .as_str()
        .unwrap_or_else(|| panic!("the leader has no {WORKER_INFO_ANNOTATION}"));
    let info: Value = serde_json::from_str(info).unwrap();
    assert_eq!(info["worker_id"], format!("{leader_ip}:8000"), "{info}");
    assert!(
        follower["metadata"]["annotations"][WORKER_INFO_ANNOTATION].is_null(),
        "the follower registered: {}",
        follower["metadata"]["annotations"]
    );

    // The gateway routes to the leader alone, and a chat request is answered.
    let gateway = cluster
        .gateway_on_node_port(&ns, "multinode", 1)
        .await
        .unwrap();
    assert_eq!(
        gateway.active_workers().await.unwrap(),
        [format!("{leader_ip}:8000")]
    );
    let answer = gateway
        .post(
            "/v1/chat/completions",
            &json!({"model": "multinode-model", "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Hello across two nodes"}]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.body["choices"][0]["message"]["content"].is_string(),
        "{}",
        answer.body
    );
    assert_eq!(answer.picked, [format!("mixed/{leader_ip}:8000")]);

    // Status comes from the controllers: LWS for the LeaderWorkerSet, Kubernetes' own
    // for the StatefulSets and pods, the operator for the InferaDeployment.
    let foreign = cluster.foreign_status_writers(&ns).await.unwrap();
    assert!(
        foreign.is_empty(),
        "status written by non-controllers: {foreign:?}"
    );
    let lws_writers = cluster
        .status_writers("leaderworkersets", &ns)
        .await
        .unwrap();
    assert!(!lws_writers.is_empty(), "LWS wrote no status");
    for (object, manager) in lws_writers {
        assert_eq!(manager, "lws", "leaderworkerset/{object}");
    }
    println!(
        "nodesPerWorker 2: Ready in {ready_after:.1?} (leader {}, follower {}), \
         chat answered through the leader; {:.1?} in all",
        leader["metadata"]["name"].as_str().unwrap_or("?"),
        follower["metadata"]["name"].as_str().unwrap_or("?"),
        started.elapsed()
    );
}
