//! Objects in the test kube-apiserver (no kubelet, no controllers): namespaces, Pods
//! marked Running and Ready as a kubelet would, GAIE's InferencePool CRD and pools.

use infera_proto::discovery::{DEPLOYMENT_LABEL, WORKER_INFO_ANNOTATION};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A fresh namespace; deleted by [`drop_namespace`].
pub async fn create_namespace(client: &kube::Client) -> String {
    let name = infera_testkit::unique_name("gw-k8s");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    name
}

/// Removes every Pod's finalizers, deletes the Pods, then the namespace (which stays
/// `Terminating`: no namespace controller runs here).
pub async fn drop_namespace(client: &kube::Client, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for pod in pods.list(&Default::default()).await.unwrap() {
        let name = pod.metadata.name.unwrap();
        let patch = json!({"metadata": {"finalizers": null}});
        let _ = pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        let _ = pods.delete(&name, &DeleteParams::default()).await;
    }
    Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await
        .unwrap();
}

/// Creates a Pod labelled `deployment` carrying `annotation`, then marks it Running and
/// Ready as the kubelet would.
pub async fn create_serving_pod(pods: &Api<Pod>, name: &str, deployment: &str, annotation: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {DEPLOYMENT_LABEL: deployment},
            "annotations": {WORKER_INFO_ANNOTATION: annotation},
        },
        "spec": {"containers": [{"name": "engine", "image": "fixture.invalid/engine:0"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Installs GAIE's InferencePool CRD (from `testenv/crds.sh`) in the test apiserver;
/// `false` when the test environment has not fetched it.
pub async fn install_inference_pool_crd(client: &kube::Client) -> bool {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let Some(dir) = std::env::var_os("INFERA_TESTENV_CRDS_GAIE") else {
        eprintln!("skipped: INFERA_TESTENV_CRDS_GAIE is unset (scripts/test runs testenv/crds.sh)");
        return false;
    };
    let path = std::path::Path::new(&dir).join("inference.networking.k8s.io_inferencepools.yaml");
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating the InferencePool CRD: {e}"),
    }
    infera_testkit::kube_apiserver::wait_established(
        client,
        "inferencepools.inference.networking.k8s.io",
    )
    .await
    .unwrap();
    true
}

/// Creates the InferencePool `name` selecting Pods labelled `deployment`, on `ports`.
pub async fn create_pool(
    client: &kube::Client,
    ns: &str,
    name: &str,
    deployment: &str,
    ports: &[u16],
) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let gvk = GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool");
    let pools: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk));
    let ports: Vec<_> = ports.iter().map(|p| json!({"number": p})).collect();
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: deployment}},
            "targetPorts": ports,
            "endpointPickerRef": {"name": format!("{name}-epp"), "port": {"number": 9002}},
        },
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
}

/// A Ready Pod labelled `deployment` at 127.0.0.1 with no worker record (a stock
/// engine's).
pub async fn create_stock_pod(pods: &Api<Pod>, name: &str, deployment: &str) {
    create_serving_pod(pods, name, deployment, "").await;
    let patch = json!({"metadata": {"annotations": {WORKER_INFO_ANNOTATION: null}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}
