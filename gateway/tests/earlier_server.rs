//! The earlier server's scaling API on a real kube-apiserver: the cases of
//! `testdata/earlier_server/fixtures.json` that need a deployment to read and patch
//! (`setup` `scaling_mixed` and `scaling_pd`), replayed byte for byte against a gateway
//! with `--enable-scaling-api --deployment fixture`. The InferaDeployment and its
//! PDTopology are this project's, in the shapes the earlier fixture's pools map onto
//! (a mixed pool of 2 workers, 1 ready, its pod unschedulable; a 1P2D deployment of one
//! unit, ready), with the status the operator would write. The other cases run in
//! `src/earlier_server_tests.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{embedded, gw_url};
use infera_testkit::kube_apiserver::wait_established;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "fixture-ns";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn api(client: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("infera.amd.com", "v1alpha1", kind);
    Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

async fn install(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in ["inferadeployments.yaml", "pdtopologies.yaml"] {
        let text = std::fs::read_to_string(root().join("crds").join(file)).unwrap();
        let crd: Value = serde_saphyr::from_multiple::<Value>(&text)
            .unwrap()
            .remove(0);
        let name = crd["metadata"]["name"].as_str().unwrap();
        crds.patch(
            name,
            &PatchParams::apply("infera").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
        wait_established(client, name).await.unwrap();
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(NAMESPACE).await.unwrap().is_none() {
        let ns = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
        let _ = namespaces.create(&PostParams::default(), &ns).await;
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Replaces the deployment `fixture` with `spec`, then writes `status` as the operator
/// would.
async fn deployment(client: &kube::Client, spec: Value, status: Value) {
    let ideps = api(client, "InferaDeployment", "inferadeployments");
    if ideps.get_opt("fixture").await.unwrap().is_some() {
        ideps
            .delete("fixture", &DeleteParams::default())
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while ideps.get_opt("fixture").await.unwrap().is_some() {
            assert!(
                Instant::now() < deadline,
                "the old fixture deployment stayed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment",
        "metadata": {"name": "fixture", "namespace": NAMESPACE},
        "spec": spec,
    }))
    .unwrap();
    ideps.create(&PostParams::default(), &object).await.unwrap();
    ideps
        .patch_status(
            "fixture",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
        .unwrap();
}

fn mixed_spec() -> Value {
    json!({
        "replicas": 2,
        "model": {"name": "fixture-model", "source": {"hostPath": {"path": "/models/none"}}},
        "engine": {"kind": "sim"},
    })
}

async fn replay(
    gw: &infera_gateway::server::RunningGateway,
    fixtures: &Value,
    setup: &str,
) -> usize {
    let http = reqwest::Client::new();
    let mut n = 0;
    for case in fixtures["cases"].as_array().unwrap() {
        if case["setup"] != setup {
            continue;
        }
        let name = case["name"].as_str().unwrap();
        let url = gw_url(gw, case["path"].as_str().unwrap());
        let request = match case["method"].as_str().unwrap() {
            "GET" => http.get(url),
            _ => http
                .post(url)
                .header("content-type", "application/json")
                .body(case["request_body"].as_str().unwrap_or_default().to_owned()),
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = response.text().await.unwrap();
        assert_eq!(status, case["status"], "{name}: status; body {body}");
        assert_eq!(
            content_type.as_deref(),
            case["content_type"].as_str(),
            "{name}"
        );
        assert_eq!(body, case["body"].as_str().unwrap(), "{name}: body");
        n += 1;
    }
    n
}

#[tokio::test]
async fn the_scaling_api_reads_and_patches_the_deployment_as_the_earlier_server_did() {
    let fixtures: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("gateway/testdata/earlier_server/fixtures.json"))
            .unwrap(),
    )
    .unwrap();
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    let topologies = api(&client, "PDTopology", "pdtopologies");
    if topologies.get_opt("fixture-1p2d").await.unwrap().is_none() {
        let topology: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "infera.amd.com/v1alpha1", "kind": "PDTopology",
            "metadata": {"name": "fixture-1p2d", "namespace": NAMESPACE},
            "spec": {"layout": "1P2D", "transport": {"backend": "mori"}},
        }))
        .unwrap();
        topologies
            .create(&PostParams::default(), &topology)
            .await
            .unwrap();
    }
    let gw = embedded(
        Vec::new(),
        &[
            "--enable-scaling-api",
            "--deployment",
            "fixture",
            "--k8s-namespace",
            NAMESPACE,
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
    )
    .await;

    // The earlier fixture's mixed pool: 2 asked for, 2 there, 1 ready, the other's pod
    // unschedulable (its message as the generator's pending pod had it).
    let pending = fixtures["pending_pods"][0]["message"].as_str().unwrap();
    deployment(
        &client,
        mixed_spec(),
        json!({
            "replicas": 2, "readyReplicas": 1,
            "roles": [{"role": "mixed", "replicas": 2, "readyReplicas": 1}],
            "conditions": [
                condition("Ready", "False", "Unschedulable", pending),
                condition("Progressing", "True", "RollingOut", "mixed 1/2 ready"),
                condition("Degraded", "False", "AsExpected", ""),
            ],
        }),
    )
    .await;
    let mixed = replay(&gw, &fixtures, "scaling_mixed").await;
    assert!(mixed >= 10, "{mixed} cases");
    let stored = api(&client, "InferaDeployment", "inferadeployments")
        .get("fixture")
        .await
        .unwrap();
    assert_eq!(
        stored.data["spec"]["replicas"], 3,
        "the POST patched spec.replicas"
    );

    // One unit of a 1P2D topology, ready.
    let mut pd = mixed_spec();
    pd["replicas"] = json!(1);
    pd["serving"] = json!({"mode": "disaggregated", "topologyRef": "fixture-1p2d"});
    deployment(
        &client,
        pd,
        json!({
            "replicas": 1, "readyReplicas": 1,
            "roles": [{"role": "prefill", "replicas": 1, "readyReplicas": 1},
                      {"role": "decode", "replicas": 2, "readyReplicas": 2}],
            "conditions": [
                condition("Ready", "True", "AllReady", "prefill 1/1 ready, decode 2/2 ready"),
                condition("Degraded", "False", "AsExpected", ""),
            ],
        }),
    )
    .await;
    assert!(replay(&gw, &fixtures, "scaling_pd").await >= 3);
    // Scaled in whole units: 4 decode workers are 2 units of 1P2D.
    let http = reqwest::Client::new();
    let scaled: Value = http
        .post(gw_url(&gw, "/v1/admin/scale"))
        .body(r#"{"services": {"decode": {"replicas": 4}}}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(scaled["services"]["decode"]["replicas"], 4, "{scaled}");
    assert_eq!(scaled["services"]["prefill"]["replicas"], 2, "{scaled}");
    let refused = http
        .post(gw_url(&gw, "/v1/admin/scale"))
        .body(r#"{"services": {"decode": 3}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("not a whole number of units of PDTopology 'fixture-1p2d'")
    );
    api(&client, "InferaDeployment", "inferadeployments")
        .delete("fixture", &DeleteParams::default())
        .await
        .unwrap();
}
