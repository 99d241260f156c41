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
