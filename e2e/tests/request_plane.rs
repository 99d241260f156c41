//! The NATS request plane on the node, as an operator-made deployment gets it:
//! `messaging: {backend: nats, requestTransport: nats}` with no URL takes the chart's
//! NATS (JetStream), the sidecars register `request_transport: nats`, the gateways
//! (`--request-transport nats`, migration on by default: 3 moves) send every request
//! through the plane's JetStream stream, and streamed answers arrive whole.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use futures::StreamExt;
use infera_e2e::load::Load;
use infera_e2e::{Cluster, RELEASE_NAMESPACE};
use serde_json::Value;
use std::time::Duration;

/// A connection to the chart's NATS at its pod's address (the tests run on the node).
async fn charts_nats(cluster: &Cluster) -> async_nats::Client {
    let pods = cluster
        .pods(RELEASE_NAMESPACE, "app.kubernetes.io/name=infera-nats")
        .await
        .unwrap();
    let ip = pods[0]["status"]["podIP"].as_str().unwrap().to_owned();
    async_nats::connect(format!("nats://{ip}:4222"))
        .await
        .unwrap()
}

/// Requests ever published to the plane's JetStream work queue (its last sequence: a
/// work queue deletes what its consumers acknowledge).
async fn requests_in_stream(client: &async_nats::Client) -> u64 {
    let js = async_nats::jetstream::new(client.clone());
    let mut stream = js
        .get_stream(infera_proto::request_plane::REQUEST_STREAM)
        .await
        .expect("the sidecars create the work queue when admission is on");
    stream.info().await.unwrap().state.last_sequence
}

#[tokio::test]
async fn a_deployment_on_the_charts_nats_serves_streams_through_the_request_plane() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-plane").await.unwrap();
    let ns = ns.name.clone();
    cluster
        .apply(
            &ns,
            "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: plane}
spec:
  replicas: 2
  model: {name: plane-model, source: {hostPath: {path: /models/none}}}
  engine: {kind: sim, args: [--speedup, '4']}
  messaging: {backend: nats, requestTransport: nats, requestMaxPending: 16}
  gateway: {resources: {requests: {cpu: 50m, memory: 64Mi}}}
",
        )
        .await
        .unwrap();
    cluster.wait_ready(&ns, "plane").await.unwrap();
    let deployment = cluster
        .get_json(&["get", "deployment", "plane-gateway", "-n", &ns])
        .await
        .unwrap();
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    assert_eq!(
        flag("--request-transport").as_deref(),
        Some("nats"),
        "{args:?}"
    );
    assert_eq!(flag("--migration-limit").as_deref(), Some("3"), "{args:?}");
    let pods = cluster.engine_pods(&ns, "plane").await.unwrap();
    for pod in &pods {
        let record: Value = serde_json::from_str(
            pod["metadata"]["annotations"][infera_proto::discovery::WORKER_INFO_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(record["request_transport"], "nats", "{record}");
    }
    let gateway = cluster.gateway_on_node_port(&ns, "plane", 2).await.unwrap();
    // Every request on the plane is a message on `infera.req.<worker>`; a plain
    // subscriber sees each one whether it goes through the work queue or not.
    let nats = charts_nats(&cluster).await;
    let mut seen = nats.subscribe("infera.req.>").await.unwrap();
    infera_testkit::nats_round_trip(&nats).await.unwrap();
    let before = requests_in_stream(&nats).await;
    let load = Load::start(&gateway, "plane-model", 3, 200);
    tokio::time::sleep(Duration::from_secs(15)).await;
    let report = load.stop().await;
    let after = requests_in_stream(&nats).await;
    let mut subjects = std::collections::BTreeSet::new();
    let mut published = 0u64;
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_millis(500), seen.next()).await
    {
        published += 1;
        subjects.insert(message.subject.to_string());
    }
    println!(
        "over the request plane: {} requests ({} streamed), {} failed, {published} published \
         on {subjects:?}, {} through the work queue",
        report.ok,
        report.ttft.len(),
        report.failed.len(),
        after - before
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(
        report.ttft.len() >= 3,
        "streamed answers: {}",
        report.ttft.len()
    );
    assert!(
        published >= report.ok,
        "{} requests, {published} published on the plane",
        report.ok
    );
    assert_eq!(
        subjects.len(),
        2,
        "both workers take requests: {subjects:?}"
    );
    assert!(
        after - before >= report.ok,
        "{} requests, {} through the work queue",
        report.ok,
        after - before
    );
}
