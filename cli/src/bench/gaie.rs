//! GAIE's reference endpoint picker (`cmd/lwepp` v1.6.0) for S12: it reads its
//! InferencePool and the pool's Pods from a kube-apiserver, so each run makes a
//! namespace there with GAIE's CRD, a pool whose target ports are the simulators' ports,
//! and one Ready Pod at 127.0.0.1 (status written as a kubelet would: the API server has
//! none), then starts lwepp on it.

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const CRD_NAME: &str = "inferencepools.inference.networking.k8s.io";
const CRD_FILE: &str = "inference.networking.k8s.io_inferencepools.yaml";

/// What the reference picker needs.
#[derive(Debug, Clone)]
pub struct Reference {
    /// An admin kubeconfig of the API server it reads.
    pub kubeconfig: PathBuf,
    /// The lwepp binary.
    pub lwepp: PathBuf,
    /// The folder with GAIE's InferencePool CRD (`testenv/crds.sh`'s GAIE folder).
    pub crds: PathBuf,
}

/// A running lwepp and the objects it reads.
pub struct Lwepp {
    child: tokio::process::Child,
    client: kube::Client,
    namespace: String,
    /// Its ext_proc port.
    pub port: u16,
}

/// Installs the InferencePool CRD unless it is there, and waits until it is served.
async fn ensure_crd(client: &kube::Client, folder: &Path) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds.get_opt(CRD_NAME).await?.is_none() {
        let path = folder.join(CRD_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)?;
        crds.create(&PostParams::default(), &crd).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let established = crds
            .get(CRD_NAME)
            .await?
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(anyhow!("{CRD_NAME} never became Established"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Lwepp {
    /// A pool of the simulators on `ports` (all at 127.0.0.1) and lwepp reading it.
    pub async fn start(reference: &Reference, ports: &[u16]) -> Result<Lwepp> {
        let client = super::s7::client(&reference.kubeconfig).await?;
        ensure_crd(&client, &reference.crds).await?;
        let namespace = format!(
            "s12-{}-{}",
            std::process::id(),
            ports.first().copied().unwrap_or(0)
        );
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        let gvk = GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool");
        let pools: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &ApiResource::from_gvk(&gvk));
        let target_ports: Vec<_> = ports.iter().map(|p| json!({"number": p})).collect();
        let pool: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "pool"},
            "spec": {"selector": {"matchLabels": {"app": "s12"}}, "targetPorts": target_ports,
                     "endpointPickerRef": {"name": "lwepp", "port": {"number": 9002}}},
        }))?;
        pools.create(&PostParams::default(), &pool).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "engines", "labels": {"app": "s12"}},
            "spec": {"containers": [{"name": "engine", "image": "bench.invalid/engine:0"}]},
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let status = json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}});
        pods.patch_status("engines", &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        let free = crate::up::local::free_port;
        let (port, health, metrics) = (free()?, free()?, free()?);
        let log =
            std::env::temp_dir().join(format!("infera-bench-lwepp-{}.log", std::process::id()));
        let out = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(&reference.lwepp)
            .args(["--pool-name", "pool", "--pool-namespace", &namespace])
            .args([
                "--grpc-port",
                &port.to_string(),
                "--grpc-health-port",
                &health.to_string(),
            ])
            .args(["--metrics-port", &metrics.to_string(), "--health-checking"])
            .arg("--kubeconfig")
            .arg(&reference.kubeconfig)
            .args(["--zap-log-level", "error"])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", reference.lwepp.display()))?;
        Ok(Lwepp {
            child,
            client,
            namespace,
            port,
        })
    }

    /// Stops lwepp and deletes its namespace's objects.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &DeleteParams::default())
            .await;
    }
}
