//! A real engine's pod with the simulator standing in for the engine: the image the
//! operator runs for `kind: sim`, and a model folder on the node (this machine) in
//! which `vllm` is the simulator and a real tokenizer lies. A deployment of `kind: vllm`
//! with that image, the folder as a hostPath model and its mount first on the
//! engine's PATH gets the operator's whole vLLM pod, and infera-sim accepts vLLM's
//! command line.

use crate::{Cluster, E2eError, RELEASE_NAMESPACE};
use infera_testkit::model_files::{FixtureModel, model_dir};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The engine PATH that finds the folder's `vllm` first: the model volume is mounted at
/// `/model-store` in engine pods.
const ENGINE_PATH: &str =
    "/model-store:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The Infera sim image the operator runs for `kind: sim` (its registry and tag flags).
pub async fn sim_image(cluster: &Cluster) -> Result<String, E2eError> {
    let operator = cluster
        .get_json(&[
            "get",
            "deployment",
            "infera-operator",
            "-n",
            RELEASE_NAMESPACE,
        ])
        .await?;
    let args: Vec<String> = serde_json::from_value(
        operator["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
    )
    .unwrap_or_default();
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_owned))
            .ok_or_else(|| E2eError::Decode {
                what: "the operator's arguments".into(),
                message: format!("no --{name}: {args:?}"),
            })
    };
    Ok(format!(
        "{}/infera-sim:{}",
        flag("image-registry")?,
        flag("image-tag")?
    ))
}

/// A model folder on this machine (the node): `vllm` -> infera-sim, and a tokenizer.
pub fn model_folder() -> Result<tempfile::TempDir, E2eError> {
    let local = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| E2eError::Local {
            what,
            message: e.to_string(),
        }
    };
    // Kept with the namespace when INFERA_E2E_KEEP asks for it (the pods mount it).
    let dir = tempfile::Builder::new()
        .prefix("infera-e2e-model-")
        .disable_cleanup(std::env::var_os("INFERA_E2E_KEEP").is_some())
        .tempdir()
        .map_err(local("a model folder"))?;
    // The engine runs as the image's user (65532): it must traverse and read the folder.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(local("the folder's mode"))?;
    std::os::unix::fs::symlink("/usr/local/bin/infera-sim", dir.path().join("vllm"))
        .map_err(local("the vllm link"))?;
    let tokenizer = model_dir(FixtureModel::Qwen3).map_err(|e| E2eError::Local {
        what: "the Qwen3 tokenizer".into(),
        message: e.to_string(),
    })?;
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        let to = dir.path().join(file);
        std::fs::copy(tokenizer.join(file), &to).map_err(local(file))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644))
            .map_err(local(file))?;
    }
    Ok(dir)
}

/// An `InferaDeployment` named `name` of `kind: vllm` running the simulator `image` on
/// the model `folder` (see the module docs), with `engine` and `spec` appended to its
/// `spec.engine` and `spec` (YAML lines indented as they sit there) and a small gateway.
pub fn vllm_manifest(name: &str, folder: &Path, image: &str, engine: &str, spec: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: {name}-model, source: {{hostPath: {{path: {dir}}}}}}}
  engine:
    kind: vllm
    image: {image}
    env: [{{name: PATH, value: '{ENGINE_PATH}'}}]
    args: [--speedup, '4']
{engine}  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
{spec}",
        dir = folder.display()
    )
}
