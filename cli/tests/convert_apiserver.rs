//! The migration the README describes, on a real kube-apiserver of its own: the earlier
//! operator's CRD is installed with one of its deployments; this project's CRDs are
//! applied over it (same name); the stored earlier object then reads back pruned to
//! what the new schema knows (so it must be deleted, orphaning its workloads, before
//! this operator runs); and every converted example is accepted by the API server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_testkit::kube_apiserver::{KubeApiServer, client_from_kubeconfig, wait_established};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn api(client: &kube::Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("infera.amd.com", "v1alpha1", kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// Applies `crd` as `manager` (forcing: the other operator's manager owns its fields)
/// and waits until it is established.
async fn apply_crd(client: &kube::Client, crd: &Value, manager: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd["metadata"]["name"].as_str().unwrap();
    crds.patch(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap();
    wait_established(client, name).await.unwrap();
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test]
async fn our_crds_replace_the_earlier_one_and_the_converted_examples_apply() {
    let server = KubeApiServer::start().await.unwrap();
    let client = client_from_kubeconfig(server.kubeconfig()).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "llm"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    // The earlier operator's CRD and one of its deployments.
    let earlier_crd: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join("cli/testdata/legacy_operator/crd.yaml")).unwrap(),
    )
    .unwrap();
    apply_crd(&client, &earlier_crd, "earlier-operator").await;
    let ideps = api(&client, "llm", "InferaDeployment", "inferadeployments");
    let earlier: DynamicObject = serde_json::from_value(
        yaml_docs(&root().join("examples/migrate/earlier-vllm-mixed.yaml")).remove(0),
    )
    .unwrap();
    ideps
        .create(&PostParams::default(), &earlier)
        .await
        .unwrap();

    // This project's CRDs over it.
    for file in ["inferadeployments.yaml", "pdtopologies.yaml"] {
        apply_crd(
            &client,
            &yaml_docs(&root().join("crds").join(file)).remove(0),
            "infera",
        )
        .await;
    }
    // The stored object now reads back pruned to the new schema: its services are gone
    // and it is no deployment this operator can read.
    let deadline = Instant::now() + Duration::from_secs(30);
    let stored = loop {
        let o = ideps.get("qwen-mixed").await.unwrap();
        if o.data["spec"].get("services").is_none() {
            break o;
        }
        assert!(
            Instant::now() < deadline,
            "the earlier spec was not pruned: {:?}",
            o.data["spec"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        stored.data["spec"].get("backendFramework").is_none(),
        "{:?}",
        stored.data
    );
    let typed = serde_json::from_value::<infera_operator::api::InferaDeployment>(
        serde_json::to_value(&stored).unwrap(),
    );
    assert!(
        typed.is_err(),
        "an earlier object read as this schema: {typed:?}"
    );
    // Deleted with its workloads orphaned, as the README says, then converted ones apply.
    ideps
        .delete("qwen-mixed", &DeleteParams::orphan())
        .await
        .unwrap();
    // The orphan finalizer is the garbage collector's to remove once it has released
    // the owned workloads; this server runs no controller manager, so the test does.
    let orphaned = ideps.get("qwen-mixed").await.unwrap();
    assert_eq!(
        orphaned.metadata.finalizers.as_deref(),
        Some(&["orphan".to_owned()][..])
    );
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    ideps
        .patch(
            "qwen-mixed",
            &PatchParams::default(),
            &Patch::Merge(&release),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Some(o) = ideps.get_opt("qwen-mixed").await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the earlier object was not deleted: {:?}",
            o.metadata
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let topologies = api(&client, "llm", "PDTopology", "pdtopologies");
    let dir = root().join("examples/migrate/converted");
    let mut applied = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        for doc in yaml_docs(&entry.unwrap().path()) {
            let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
            let target = if doc["kind"] == "PDTopology" {
                &topologies
            } else {
                &ideps
            };
            let created = target
                .create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", doc["metadata"]["name"]));
            // Stored as written: read as the operator reads it, the same spec (the
            // server adds the schema's defaults, which the typed read adds too).
            let stored = serde_json::to_value(&created).unwrap();
            if doc["kind"] == "PDTopology" {
                let read = |v: Value| {
                    serde_json::from_value::<infera_operator::api::PDTopology>(v)
                        .unwrap()
                        .spec
                };
                assert_eq!(read(stored), read(doc.clone()));
            } else {
                let read = |v: Value| {
                    serde_json::from_value::<infera_operator::api::InferaDeployment>(v)
                        .unwrap()
                        .spec
                };
                assert_eq!(read(stored), read(doc.clone()));
            }
            applied += 1;
        }
    }
    assert_eq!(applied, 9, "5 deployments and 4 topologies");
}
