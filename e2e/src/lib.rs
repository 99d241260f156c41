//! What the end-to-end tests share: the one-node cluster that `scripts/cluster create`
//! started (kubelet, containerd, scheduler, controllers, kube-proxy, DNS, fake GPUs and
//! RDMA NICs, the chart installed), kubectl against it, bounded waits that report what
//! they were waiting for, and the gateway reached from this machine through its
//! Service's NodePort on 127.0.0.1.
//!
//! Nothing here writes a workload's status: readiness comes from the kubelet's probes,
//! and [`Cluster::status_writers`] lets a test prove it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

pub mod deploy;
pub mod envoy;
pub mod etcd;
pub mod gateway;
pub mod gitops;
pub mod load;
pub mod process;
pub mod roll;
pub mod sim_engine;

/// Environment variable holding the cluster's admin kubeconfig (`scripts/test` sets it
/// from `scripts/cluster kubeconfig`).
pub const ENV_KUBECONFIG: &str = "INFERA_CLUSTER_KUBECONFIG";

/// The chart's release namespace in the test cluster (`scripts/cluster`).
pub const RELEASE_NAMESPACE: &str = "infera-system";

/// Field managers allowed to write workload status: the controllers that own it.
pub const STATUS_WRITERS: &[&str] = &[
    "kube-controller-manager",
    "kubelet",
    "kube-scheduler",
    "infera-operator",
    // The operator's autoscaler: status.autoscaling of InferaDeployments only.
    "infera-autoscaler",
];

/// Why an end-to-end step failed.
#[derive(Debug, thiserror::Error)]
pub enum E2eError {
    /// No cluster to test against.
    #[error(
        "{ENV_KUBECONFIG} is not set: start the node with `scripts/cluster create` and \
         export {ENV_KUBECONFIG}=$(scripts/cluster kubeconfig) (scripts/test does both)"
    )]
    NoCluster,
    /// A client could not be built from the kubeconfig.
    #[error("connecting to the cluster with {path}: {message}")]
    Connect {
        /// The kubeconfig.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// kubectl failed.
    #[error("kubectl {args}: {stderr}")]
    Kubectl {
        /// Its arguments.
        args: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A wait ran out.
    #[error("{what}: not within {seconds}s; last: {last}\n{diagnostics}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The bound.
        seconds: u64,
        /// The last observation.
        last: String,
        /// The cluster's state at that moment, for the reader of a failed run.
        diagnostics: String,
    },
    /// A request to a gateway or a pod failed.
    #[error("{0}")]
    Http(String),
    /// Preparing something on this machine (the node) failed.
    #[error("{what}: {message}")]
    Local {
        /// What was prepared.
        what: String,
        /// What failed.
        message: String,
    },
    /// kubectl's or a server's output was not the JSON expected.
    #[error("decoding {what}: {message}")]
    Decode {
        /// What was read.
        what: String,
        /// Why it did not decode.
        message: String,
    },
}

/// The running test cluster.
#[derive(Clone)]
pub struct Cluster {
    kubeconfig: PathBuf,
    client: kube::Client,
}

impl Cluster {
    /// Connects with the kubeconfig named by [`ENV_KUBECONFIG`].
    pub async fn connect() -> Result<Self, E2eError> {
        let path = std::env::var_os(ENV_KUBECONFIG)
            .map(PathBuf::from)
            .ok_or(E2eError::NoCluster)?;
        let client = infera_testkit::kube_apiserver::client_from_kubeconfig(&path)
            .await
            .map_err(|message| E2eError::Connect {
                path: path.clone(),
                message,
            })?;
        Ok(Self {
            kubeconfig: path,
            client,
        })
    }

    /// An admin client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Runs kubectl (built by `testenv/` at the cluster's version); stdout on success.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String, E2eError> {
        self.kubectl_with_input(args, None).await
    }

    /// Runs kubectl with `input` on its stdin.
    pub async fn kubectl_with_input(
        &self,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String, E2eError> {
        let failed = |stderr: String| E2eError::Kubectl {
            args: args.join(" "),
            stderr,
        };
        let bin = infera_testkit::binaries::locate(infera_testkit::binaries::Binary::Kubectl)
            .map_err(|e| failed(e.to_string()))?;
        let mut child = tokio::process::Command::new(bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(e.to_string()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.unwrap_or("").as_bytes())
                .await
                .map_err(|e| failed(e.to_string()))?;
        }
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .map_err(|_| failed("did not finish within 120 s".into()))?
            .map_err(|e| failed(e.to_string()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(failed(String::from_utf8_lossy(&out.stderr).into_owned()))
        }
    }

    /// Creates a namespace `<prefix>-<unique>`, deleted (without waiting) when the guard
    /// is dropped.
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace, E2eError> {
        let name = infera_testkit::unique_name(prefix);
        self.kubectl(&["create", "namespace", &name]).await?;
        Ok(TestNamespace {
            name,
            kubeconfig: self.kubeconfig.clone(),
        })
    }

    /// What a reader of a failed run needs: pods, workloads, events and custom resources
    /// of `namespace`.
    pub async fn diagnostics(&self, namespace: &str) -> String {
        let mut out = String::new();
        for args in [
            vec!["get", "idep,pdt,sts,deploy,svc,pvc", "-o", "wide"],
            vec!["get", "pods", "-o", "wide"],
            vec!["get", "events", "--sort-by=.lastTimestamp"],
        ] {
            let mut full = args.clone();
            full.extend(["-n", namespace]);
            match self.kubectl(&full).await {
                Ok(text) => out.push_str(&text),
                Err(e) => out.push_str(&e.to_string()),
            }
            out.push('\n');
        }
        out
    }

    /// Managers of the `status` subresource of every object of `resource` (e.g.
    /// `statefulsets`) in `namespace`, as `(object, manager)` pairs.
    pub async fn status_writers(
        &self,
        resource: &str,
        namespace: &str,
    ) -> Result<Vec<(String, String)>, E2eError> {
        let text = self
            .kubectl(&[
                "get",
                resource,
                "-n",
                namespace,
                "-o",
                "json",
                "--show-managed-fields",
            ])
            .await?;
        let list: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| E2eError::Decode {
                what: format!("kubectl get {resource}"),
                message: e.to_string(),
            })?;
        let mut out = Vec::new();
        for item in list["items"].as_array().into_iter().flatten() {
            let name = item["metadata"]["name"].as_str().unwrap_or("?").to_owned();
            let entries: Vec<ManagedFieldsEntry> =
                serde_json::from_value(item["metadata"]["managedFields"].clone())
                    .unwrap_or_default();
            for entry in entries {
                if entry.subresource.as_deref() == Some("status") {
                    out.push((name.clone(), entry.manager.unwrap_or_default()));
                }
            }
        }
        Ok(out)
    }
}

/// A namespace made for one test.
pub struct TestNamespace {
    /// Its name.
    pub name: String,
    kubeconfig: PathBuf,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Keep it for inspection when asked to (a failed run's pods and events).
        if std::env::var_os("INFERA_E2E_KEEP").is_some() {
            return;
        }
        if let Ok(bin) = infera_testkit::binaries::locate(infera_testkit::binaries::Binary::Kubectl)
        {
            let _ = Command::new(bin)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                // Not waiting: engines drain and gateways linger (about 30 s a
                // namespace); the small requests of the tests' pods fit beside them.
                .args(["delete", "namespace", &self.name, "--wait=false"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Retries `probe` every half second until it returns `Ok`, for at most `timeout`. On
/// timeout the error carries the last observation and `namespace`'s diagnostics.
pub async fn eventually<T, F, Fut>(
    cluster: &Cluster,
    namespace: &str,
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> Result<T, E2eError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            return Err(E2eError::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs(),
                last,
                diagnostics: cluster.diagnostics(namespace).await,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An HTTP client whose every request is bounded (10 s): a probe of a pod that drops
/// packets fails instead of hanging a test.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
