//! `examples/gitops/`: the Argo CD and Flux objects apply with `--dry-run=server` once
//! those tools' CRDs (fetched from their Go modules' sources by `testenv/crds.sh`) are
//! installed, and the workload they sync is a valid InferaDeployment.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use support::{install, install_crd_dir, kubectl, repo, third_party_crds};

#[tokio::test]
async fn argo_cd_and_flux_objects_are_accepted_by_the_api_server() {
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    for name in ["ARGOCD", "FLUX"] {
        let dir = third_party_crds(name).unwrap_or_else(|| {
            panic!("testenv/crds.sh could not fetch the {name} CRDs; see its output")
        });
        install_crd_dir(&client, &kubeconfig, &dir).await;
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    for ns in ["argocd", "flux-system"] {
        if nss.get_opt(ns).await.unwrap().is_none() {
            let n: Namespace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
            let _ = nss.create(&PostParams::default(), &n).await;
        }
    }
    let gitops = repo().join("examples/gitops");
    // The workload's namespace for real (a dry run cannot place objects in a namespace
    // that a dry run created).
    let ns_file = gitops
        .join("workloads/namespace.yaml")
        .to_string_lossy()
        .into_owned();
    let (ok, out, err) = support::apply_retrying(&kubeconfig, &["apply", "-f", &ns_file], None);
    assert!(ok, "{out}{err}");
    let dirs: Vec<String> = ["argocd", "flux", "flux/release", "workloads"]
        .iter()
        .map(|d| gitops.join(d).to_string_lossy().into_owned())
        .collect();
    let mut args = vec!["apply", "--dry-run=server"];
    for d in &dirs {
        args.extend(["-f", d.as_str()]);
    }
    let (ok, out, err) = support::apply_retrying(&kubeconfig, &args, None);
    assert!(
        ok,
        "kubectl apply --dry-run=server of examples/gitops: {out}{err}"
    );
    for object in [
        "application.argoproj.io/infera",
        "helmrelease.helm.toolkit.fluxcd.io/infera",
        "gitrepository.source.toolkit.fluxcd.io/infera",
        "inferadeployment.infera.amd.com/gitops-sim",
    ] {
        assert!(out.contains(object), "{object} missing from:\n{out}");
    }
    // And a broken one is refused: the check can fail.
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &["apply", "--dry-run=server", "-f", "-"],
        Some(
            "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata: {name: bad, namespace: flux-system}\nspec: {interval: 10m, install: {crds: Always}}\n",
        ),
    );
    assert!(!ok && err.contains("crds"), "{err}");
}

/// The zero-drift contract's ownership half, on the API server: Git (applied under
/// kustomize-controller's field manager, as Flux applies) sets `spec.replicas`; the
/// autoscaler applies the same count under its own (what it does once it runs and
/// does not hold the field); Git then drops `spec.replicas`, as the GitOps guide says
/// to. The count stays where it was, and a dry run of Git's manifest changes nothing.
/// Without the autoscaler's apply, the same drop resets the count to the schema's
/// default: the hazard the autoscaler's apply removes.
#[tokio::test]
async fn git_dropping_replicas_leaves_the_autoscalers_count() {
    use infera_operator::api::ServingMode;
    use infera_operator::autoscale::{FIELD_MANAGER, ownership};
    use kube::api::{Patch, PatchParams};
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    use serde_json::json;

    let client = infera_testkit::kube_client().await.unwrap();
    install(&client).await;
    let ns = support::namespace(&client).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("infera.amd.com", "v1alpha1", "InferaDeployment"),
        "inferadeployments",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let git = |name: &str, replicas: Option<u32>| {
        let mut spec = json!({
            "model": {"name": "sim-llama-8b", "source": {"hostPath": {"path": "/models/none"}}},
            "engine": {"kind": "sim"},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "targets": {"waitingPerWorker": 1}},
        });
        if let Some(n) = replicas {
            spec["replicas"] = json!(n);
        }
        json!({"apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment",
               "metadata": {"name": name}, "spec": spec})
    };
    let flux = PatchParams::apply("kustomize-controller").force();
    let replicas = |o: &DynamicObject| o.data["spec"]["replicas"].as_i64();
    let managed = |o: &DynamicObject| o.metadata.managed_fields.clone().unwrap_or_default();
    let path = ownership::held_path(&ServingMode::Mixed);

    for (name, autoscaler_applies, expected) in [("held", true, 2), ("unheld", false, 1)] {
        let o = api
            .patch(name, &flux, &Patch::Apply(&git(name, Some(2))))
            .await
            .unwrap();
        assert_eq!(replicas(&o), Some(2));
        if autoscaler_applies {
            let config = ownership::build_apply(
                "infera.amd.com/v1alpha1",
                "InferaDeployment",
                name,
                &ServingMode::Mixed,
                Some((2, 0)),
            );
            let o = api
                .patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&config),
                )
                .await
                .unwrap();
            // Both hold it now: the autoscaler would say Git still applies it.
            assert!(ownership::held_by_autoscaler(&managed(&o), path));
            assert_eq!(
                ownership::other_appliers(&managed(&o), path),
                vec!["kustomize-controller".to_owned()]
            );
        }
        let o = api
            .patch(name, &flux, &Patch::Apply(&git(name, None)))
            .await
            .unwrap();
        assert_eq!(replicas(&o), Some(expected), "{name}: {:?}", o.data["spec"]);
        assert!(ownership::other_appliers(&managed(&o), path).is_empty());
        // Git's manifest, dry-run applied again: no change (the generation holds).
        let dry = api
            .patch(
                name,
                &PatchParams::apply("kustomize-controller").force().dry_run(),
                &Patch::Apply(&git(name, None)),
            )
            .await
            .unwrap();
        assert_eq!(dry.metadata.generation, o.metadata.generation, "{name}");
    }
    support::drop_namespace(&client, &ns).await;
}
