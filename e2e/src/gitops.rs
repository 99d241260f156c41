//! GitOps on the node: a git server on the node's address (testenv/git-server, `git
//! http-backend` over HTTP) holding a repository laid out as this one, a working clone
//! the tests commit to and push from as a user would, and Flux's controllers
//! (testenv/flux/flux.yaml) syncing from it. Reconciles are asked for with Flux's
//! `reconcile.fluxcd.io/requestedAt` annotation, not waited for.

use crate::deploy::{ROLLOUT, condition};
use crate::{Cluster, E2eError, eventually, repo};
use infera_testkit::binaries::{Binary, locate};
use infera_testkit::process::{ServerProcess, free_port};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The node's address (the bridge's, `scripts/cluster`): pods reach the host there.
pub const NODE_IP: &str = "10.244.0.1";

/// Flux's namespace.
pub const FLUX_NAMESPACE: &str = "flux-system";

/// The field manager kustomize-controller applies with.
pub const KUSTOMIZE_MANAGER: &str = "kustomize-controller";

fn local(what: &str, message: impl std::fmt::Display) -> E2eError {
    E2eError::Local {
        what: what.to_owned(),
        message: message.to_string(),
    }
}

/// A git server on [`NODE_IP`], serving the bare repositories under its folder.
pub struct GitServer {
    _process: ServerProcess,
    root: PathBuf,
    base: String,
}

impl GitServer {
    /// Starts one over `root` (bare repositories are made in it with [`Self::create`]).
    pub async fn start(root: &Path) -> Result<Self, E2eError> {
        let bin = locate(Binary::GitServer).map_err(|e| local("locating git-server", e))?;
        let port = free_port().map_err(|e| local("a free port", e))?;
        let listen = format!("{NODE_IP}:{port}");
        let process = ServerProcess::start(
            &bin,
            &[
                "--root".into(),
                root.display().to_string(),
                "--listen".into(),
                listen.clone(),
            ],
            &root.join("git-server.log"),
        )
        .map_err(|e| local("starting git-server", e))?;
        let started = std::time::Instant::now();
        while tokio::net::TcpStream::connect(&listen).await.is_err() {
            if started.elapsed() > Duration::from_secs(20) {
                return Err(local(
                    "git-server",
                    format!("not listening on {listen}: {}", process.log_tail(20)),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Self {
            _process: process,
            root: root.to_owned(),
            base: format!("http://{listen}"),
        })
    }

    /// Creates the bare repository `name` (e.g. `infera.git`) that accepts pushes over
    /// HTTP; returns its URL.
    pub async fn create(&self, name: &str) -> Result<String, E2eError> {
        let path = self.root.join(name);
        git(
            &self.root,
            &["init", "--quiet", "--bare", "--initial-branch=main", name],
        )
        .await?;
        git(&path, &["config", "http.receivepack", "true"]).await?;
        Ok(format!("{}/{name}", self.base))
    }
}

/// Runs git in `dir` with a fixed identity; stdout on success.
pub async fn git(dir: &Path, args: &[&str]) -> Result<String, E2eError> {
    let out = tokio::process::Command::new("git")
        .args([
            "-c",
            "user.name=Infera GitOps test",
            "-c",
            "user.email=gitops-test@infera.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .await
        .map_err(|e| local("running git (Debian's git)", e))?;
    if !out.status.success() {
        return Err(local(
            &format!("git {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A user's working clone: this repository's `charts/` and `examples/gitops/` at the
/// same paths, so the examples' paths hold as written.
pub struct Checkout {
    dir: PathBuf,
}

impl Checkout {
    /// Copies the chart and the GitOps examples into `dir`, sets `origin` to `url`.
    pub async fn seed(dir: &Path, url: &str) -> Result<Self, E2eError> {
        std::fs::create_dir_all(dir.join("examples")).map_err(|e| local("mkdir", e))?;
        for (from, to) in [("charts", "."), ("examples/gitops", "examples")] {
            let status = tokio::process::Command::new("cp")
                .arg("-r")
                .arg(repo().join(from))
                .arg(dir.join(to))
                .status()
                .await
                .map_err(|e| local("cp", e))?;
            if !status.success() {
                return Err(local("copying the tree", format!("cp -r {from}: {status}")));
            }
        }
        git(dir, &["init", "--quiet", "--initial-branch=main"]).await?;
        git(dir, &["remote", "add", "origin", url]).await?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// A file of the clone.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// Reads a file of the clone.
    pub fn read(&self, relative: &str) -> Result<String, E2eError> {
        std::fs::read_to_string(self.path(relative)).map_err(|e| local(relative, e))
    }

    /// Writes a file of the clone.
    pub fn write(&self, relative: &str, text: &str) -> Result<(), E2eError> {
        let path = self.path(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| local(relative, e))?;
        }
        std::fs::write(path, text).map_err(|e| local(relative, e))
    }

    /// Removes a file of the clone.
    pub fn remove(&self, relative: &str) -> Result<(), E2eError> {
        std::fs::remove_file(self.path(relative)).map_err(|e| local(relative, e))
    }

    /// Commits everything and pushes `main`; returns the commit's id.
    pub async fn push(&self, message: &str) -> Result<String, E2eError> {
        git(&self.dir, &["add", "--all"]).await?;
        git(&self.dir, &["commit", "--quiet", "-m", message]).await?;
        git(&self.dir, &["push", "--quiet", "origin", "main"]).await?;
        git(&self.dir, &["rev-parse", "HEAD"]).await
    }
}

impl Cluster {
    /// Installs Flux (its CRDs from testenv/crds.sh, then testenv/flux/flux.yaml) and
    /// waits for its three controllers to be available.
    pub async fn install_flux(&self) -> Result<(), E2eError> {
        let crds = std::env::var("INFERA_TESTENV_CRDS_FLUX").map_err(|_| {
            local(
                "Flux's CRDs",
                "INFERA_TESTENV_CRDS_FLUX is not set (scripts/test sets it from testenv/crds.sh)",
            )
        })?;
        // An earlier run's namespace still being deleted takes nothing new.
        eventually(
            self,
            FLUX_NAMESPACE,
            "an earlier flux-system gone",
            ROLLOUT,
            || async {
                match self.get_json(&["get", "namespace", FLUX_NAMESPACE]).await {
                    Ok(ns) if ns["status"]["phase"] == "Terminating" => {
                        Err("terminating".to_owned())
                    }
                    _ => Ok(()),
                }
            },
        )
        .await?;
        self.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &crds])
            .await?;
        let manifest = repo().join("testenv/flux/flux.yaml");
        self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &manifest.display().to_string(),
        ])
        .await?;
        for name in [
            "source-controller",
            "kustomize-controller",
            "helm-controller",
        ] {
            eventually(
                self,
                FLUX_NAMESPACE,
                &format!("{name} available"),
                ROLLOUT,
                || async {
                    let d = self
                        .get_json(&["get", "deployment", name, "-n", FLUX_NAMESPACE])
                        .await
                        .map_err(|e| e.to_string())?;
                    match d["status"]["availableReplicas"].as_i64() {
                        Some(n) if n >= 1 => Ok(()),
                        _ => Err(format!("{}", d["status"])),
                    }
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Asks Flux to reconcile `kind/name` in flux-system now.
    pub async fn flux_reconcile(&self, kind: &str, name: &str) -> Result<(), E2eError> {
        let now = format!("{:?}", std::time::SystemTime::now());
        self.kubectl(&[
            "annotate",
            "--overwrite",
            "-n",
            FLUX_NAMESPACE,
            kind,
            name,
            &format!("reconcile.fluxcd.io/requestedAt={now}"),
        ])
        .await
        .map(|_| ())
    }

    /// Waits until Flux's `kind/name` is Ready at `revision` (a commit id, or the first
    /// 12 digits of one for a HelmRelease; see [`flux_revision`]). Returns it.
    pub async fn wait_flux_ready(
        &self,
        kind: &str,
        name: &str,
        revision: &str,
        timeout: Duration,
    ) -> Result<Value, E2eError> {
        eventually(
            self,
            FLUX_NAMESPACE,
            &format!("{kind} {name} Ready at {revision}"),
            timeout,
            || async {
                let o = self
                    .get_json(&["get", kind, name, "-n", FLUX_NAMESPACE])
                    .await
                    .map_err(|e| e.to_string())?;
                let at = flux_revision(&o);
                match condition(&o, "Ready") {
                    Some(c) if c["status"] == "True" && at.contains(revision) => Ok(o),
                    Some(c) => Err(format!(
                        "Ready={} {}: {} (revision {at})",
                        c["status"], c["reason"], c["message"]
                    )),
                    None => Err(format!("no Ready condition yet (revision {at})")),
                }
            },
        )
        .await
    }
}

/// The revision a Flux object last applied or fetched: a Kustomization's
/// `lastAppliedRevision` (`main@sha1:<commit>`), a source's artifact (the same form), a
/// HelmRelease's latest release's chart version (with `reconcileStrategy: Revision`,
/// `<version>+<the commit's first 12 digits>`).
pub fn flux_revision(object: &Value) -> String {
    let status = &object["status"];
    [
        &status["lastAppliedRevision"],
        &status["artifact"]["revision"],
        &status["history"][0]["chartVersion"],
    ]
    .iter()
    .find_map(|v| v.as_str())
    .unwrap_or_default()
    .to_owned()
}
