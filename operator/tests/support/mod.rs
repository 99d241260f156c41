//! What the operator's integration tests share: kubectl from `testenv/`, CRD
//! installation, throwaway namespaces.

#![allow(dead_code)]

use infera_operator::api::crd::crds;
use infera_operator::api::{InferaDeployment, PDTopology};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// kubectl built by `testenv/` at the kube-apiserver's version.
pub fn kubectl_bin() -> PathBuf {
    infera_testkit::binaries::locate(infera_testkit::binaries::Binary::Kubectl).unwrap()
}

/// Runs kubectl against the test apiserver; returns (success, stdout, stderr).
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", kubectl_bin().display()));
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Installs the CRDs (server-side apply, as `kubectl apply --server-side` would) and
/// waits until the API server serves them.
pub async fn install(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in crds() {
        let name = crd.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("infera-test").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("installing {name}: {e}"));
        wait_established(&api, &name).await;
    }
}

/// Waits until the API server serves the CRD `name`.
pub async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) {
    infera_testkit::kube_apiserver::wait_established(&api.clone().into_client(), name)
        .await
        .unwrap();
}

/// Example folders with a `deployment.yaml`, sorted.
pub fn example_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("deployment.yaml").exists())
        .collect();
    dirs.sort();
    dirs
}

pub async fn namespace(client: &kube::Client) -> String {
    let name = infera_testkit::unique_name("op");
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    name
}

pub async fn drop_namespace(client: &kube::Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// Applies `manifest` until the API server has published the types (discovery can lag
/// the Established condition by a moment).
pub fn apply_retrying(
    kubeconfig: &Path,
    args: &[&str],
    manifest: Option<&str>,
) -> (bool, String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = kubectl(kubeconfig, args, manifest);
        let unknown_kind = out.2.contains("no matches for kind")
            || out.2.contains("the server doesn't have a resource type");
        if !unknown_kind || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `check` every 100 ms until it returns `Some` or `timeout` passes (then panics
/// with `what` and the last value seen).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The folder `testenv/crds.sh` fetched a third-party CRD set into (`LWS`, `ARGOCD`,
/// `FLUX`): from `INFERA_TESTENV_CRDS_<NAME>` (set by scripts/test), else by running the
/// script (instant once cached). `None` when the module could not be had.
pub fn third_party_crds(name: &str) -> Option<PathBuf> {
    if let Ok(dir) = std::env::var(format!("INFERA_TESTENV_CRDS_{name}")) {
        return Some(PathBuf::from(dir));
    }
    let out = Command::new(repo().join("testenv/crds.sh")).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")).map(PathBuf::from))
}

/// Applies every CRD in `dir` (server side: some are larger than client-side apply
/// allows) and waits until they are served.
pub async fn install_crd_dir(client: &kube::Client, kubeconfig: &Path, dir: &Path) {
    let dir_s = dir.to_string_lossy().into_owned();
    let (ok, out, err) = kubectl(
        kubeconfig,
        &["apply", "--server-side", "--force-conflicts", "-f", &dir_s],
        None,
    );
    assert!(ok, "installing CRDs from {dir_s}: {out}{err}");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for line in out.lines() {
        let Some(name) = line
            .split_whitespace()
            .next()
            .and_then(|n| n.strip_prefix("customresourcedefinition.apiextensions.k8s.io/"))
        else {
            continue;
        };
        wait_established(&api, name).await;
    }
}

/// Installs GAIE's InferencePool CRD and Gateway API's (what `spec.gateway.inferencePool`
/// renders into), from the folders `testenv/crds.sh` fetched.
pub async fn install_gateway_crds(client: &kube::Client, kubeconfig: &Path) {
    for name in ["GAIE", "GATEWAY_API"] {
        let dir = third_party_crds(name).unwrap_or_else(|| {
            panic!("testenv/crds.sh could not fetch the {name} CRDs; see its output")
        });
        install_crd_dir(client, kubeconfig, &dir).await;
    }
}

/// Namespace of the operator's ServiceAccount in RBAC-checked runs (as the chart
/// installs it with `-n infera-system`).
pub const OPERATOR_NAMESPACE: &str = "infera-system";

/// helm built by `testenv/`.
pub fn helm_bin() -> PathBuf {
    infera_testkit::binaries::locate(infera_testkit::binaries::Binary::Helm).unwrap()
}

/// Runs helm with `args`; returns (success, stdout, stderr).
pub fn helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm_bin())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", helm_bin().display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

static OPERATOR_KUBECONFIG: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();

/// A kubeconfig that acts as the chart's operator ServiceAccount: the chart's RBAC
/// (rendered by `helm template`, release `infera` in `infera-system`) is installed, and
/// every request impersonates `system:serviceaccount:infera-system:infera-operator`, so a
/// verb the chart forgot is a 403 in the operator's log.
pub async fn operator_kubeconfig(client: &kube::Client, admin: &Path) -> PathBuf {
    OPERATOR_KUBECONFIG
        .get_or_init(|| async {
            let nss: Api<Namespace> = Api::all(client.clone());
            if nss.get_opt(OPERATOR_NAMESPACE).await.unwrap().is_none() {
                let ns: Namespace = serde_json::from_value(
                    serde_json::json!({"metadata": {"name": OPERATOR_NAMESPACE}}),
                )
                .unwrap();
                let _ = nss.create(&PostParams::default(), &ns).await;
            }
            let chart = repo().join("charts/infera");
            let (ok, rbac, err) = helm(&[
                "template",
                "infera",
                &chart.to_string_lossy(),
                "-n",
                OPERATOR_NAMESPACE,
                "--kube-version",
                "1.33.0",
                "--show-only",
                "templates/rbac.yaml",
                "--show-only",
                "templates/serviceaccount.yaml",
                // The RBAC of a chart with a pull secret: the copy needs its `get`.
                "--set",
                "imagePullSecrets[0].name=fixture-pull",
            ]);
            assert!(ok, "helm template of the chart's RBAC: {err}");
            let (ok, out, err) = kubectl(
                admin,
                &["apply", "--server-side", "--force-conflicts", "-f", "-"],
                Some(&rbac),
            );
            assert!(ok, "installing the chart's RBAC: {out}{err}");
            let text = std::fs::read_to_string(admin).unwrap();
            let mut config: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            for user in config["users"].as_array_mut().unwrap() {
                user["user"]["as"] =
                    format!("system:serviceaccount:{OPERATOR_NAMESPACE}:infera-operator").into();
                user["user"]["as-groups"] = serde_json::json!([
                    "system:serviceaccounts",
                    format!("system:serviceaccounts:{OPERATOR_NAMESPACE}"),
                    "system:authenticated"
                ]);
            }
            let path = std::env::temp_dir().join(format!(
                "infera-operator-sa-{}.kubeconfig",
                std::process::id()
            ));
            std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
            path
        })
        .await
        .clone()
}

/// The deployments and topologies of a manifest file, stored (namespace `infera`, a uid)
/// as the operator would read them.
pub fn load_manifests(path: &Path) -> (Vec<InferaDeployment>, Vec<PDTopology>) {
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let (mut deps, mut topos) = (Vec::new(), Vec::new());
    for mut doc in docs {
        doc["metadata"]["namespace"] = json!("infera");
        doc["metadata"]["uid"] = json!("uid-1");
        match doc["kind"].as_str() {
            Some("InferaDeployment") => deps.push(serde_json::from_value(doc).unwrap()),
            Some("PDTopology") => topos.push(serde_json::from_value(doc).unwrap()),
            _ => {}
        }
    }
    (deps, topos)
}

/// The deployments and topologies of `examples/<name>`.
pub fn example(name: &str) -> (Vec<InferaDeployment>, Vec<PDTopology>) {
    load_manifests(&repo().join(format!("examples/{name}/deployment.yaml")))
}
