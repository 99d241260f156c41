//! A real kube-apiserver (with its own etcd) on loopback: what controller-runtime's
//! envtest runs. No kubelet, scheduler or controller-manager: objects are stored,
//! validated (schemas, CEL, admission) and served, but no Pod ever runs and owned
//! objects are not garbage-collected.
//!
//! Authentication is a static bearer token in the `system:masters` group, so the
//! client has admin rights under RBAC. The server's self-signed serving certificate is
//! not verified (loopback only).

use crate::TestEnvError;
use crate::binaries::{Binary, locate};
use crate::etcd::EtcdServer;
use crate::process::{ServerProcess, free_port};
use crate::ready::wait_ready;
use k8s_openapi::api::core::v1::Namespace;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;

/// A running kube-apiserver and its etcd.
#[derive(Debug)]
pub struct KubeApiServer {
    kubeconfig: PathBuf,
    url: String,
    process: ServerProcess,
    etcd: EtcdServer,
    dir: TempDir,
}

impl KubeApiServer {
    /// Starts etcd and kube-apiserver, then waits until `/readyz` passes and the
    /// `default` namespace exists.
    pub async fn start() -> Result<Self, TestEnvError> {
        let binary = locate(Binary::KubeApiserver)?;
        let etcd = EtcdServer::start().await?;
        let dir = tempfile::Builder::new()
            .prefix("infera-kube-")
            .tempdir()
            .map_err(|e| prepare(e.to_string()))?;
        let sa_key = dir.path().join("sa.key");
        generate_rsa_key(&sa_key)?;
        let token = random_token();
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{token},testkit-admin,testkit-admin,\"system:masters\"\n"),
        )
        .map_err(|e| prepare(e.to_string()))?;
        let port = free_port().map_err(|e| prepare(e.to_string()))?;
        let url = format!("https://127.0.0.1:{port}");
        let args: Vec<String> = vec![
            format!("--etcd-servers={}", etcd.endpoint()),
            format!("--cert-dir={}", dir.path().join("certs").display()),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // A /16 as real clusters have: envtest's /24 holds 254 Services, fewer than S7 makes.
            "--service-cluster-ip-range=10.0.0.0/16".into(),
            "--allow-privileged=true".into(),
            "--authorization-mode=RBAC".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--service-account-issuer=https://testkit.invalid".into(),
            format!("--service-account-key-file={}", sa_key.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            format!("--token-auth-file={}", tokens.display()),
            // Two cores: request fairness queues only cost CPU in a single-tenant test.
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
        ];
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, build_kubeconfig(&url, &token))
            .map_err(|e| prepare(e.to_string()))?;
        let mut process =
            ServerProcess::start(&binary, &args, &dir.path().join("kube-apiserver.log")).map_err(
                |source| TestEnvError::Spawn {
                    name: "kube-apiserver",
                    source,
                },
            )?;
        let probe_config = kubeconfig.clone();
        wait_ready(
            "kube-apiserver",
            &mut process,
            Duration::from_secs(120),
            || {
                let path = probe_config.clone();
                async move { probe_ready(&path).await }
            },
        )
        .await?;
        Ok(Self {
            kubeconfig,
            url,
            process,
            etcd,
            dir,
        })
    }

    /// Path of an admin kubeconfig (usable by kubectl and helm too).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Folders the server and its etcd write to.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs = self.etcd.dirs();
        dirs.push(self.dir.path().to_owned());
        dirs
    }

    /// The server process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// An admin client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Waits (30 s at most) until the API server serves the CRD `name`.
pub async fn wait_established(client: &kube::Client, name: &str) -> Result<(), String> {
    let crds: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(client.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let crd = crds.get(name).await.map_err(|e| e.to_string())?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("CRD {name} never became Established"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn probe_ready(kubeconfig: &Path) -> Result<(), String> {
    let client = client_from_kubeconfig(kubeconfig).await?;
    let request = http_get("/readyz")?;
    let body = client
        .request_text(request)
        .await
        .map_err(|e| e.to_string())?;
    if body.trim() != "ok" {
        return Err(format!("/readyz answered {body:?}"));
    }
    kube::Api::<Namespace>::all(client)
        .get("default")
        .await
        .map(|_| ())
        .map_err(|e| format!("namespace default: {e}"))
}

fn http_get(path: &str) -> Result<http::Request<Vec<u8>>, String> {
    http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())
}

fn build_kubeconfig(url: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testkit
  cluster:
    server: {url}
    insecure-skip-tls-verify: true
users:
- name: testkit-admin
  user:
    token: {token}
contexts:
- name: testkit
  context:
    cluster: testkit
    user: testkit-admin
    namespace: default
current-context: testkit
"
    )
}

fn generate_rsa_key(path: &Path) -> Result<(), TestEnvError> {
    let out = std::process::Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(path)
        .arg("2048")
        .output()
        .map_err(|e| prepare(format!("running openssl (install Debian's openssl): {e}")))?;
    if !out.status.success() {
        return Err(prepare(format!(
            "openssl genrsa failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

fn random_token() -> String {
    (0..4)
        .map(|_| format!("{:016x}", RandomState::new().build_hasher().finish()))
        .collect()
}

fn prepare(message: String) -> TestEnvError {
    TestEnvError::Prepare {
        name: "kube-apiserver",
        message,
    }
}
