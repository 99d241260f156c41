//! Finding the control-plane binaries: `INFERA_TESTENV_<NAME>` when set (the README's
//! test command and `.ci/run` export them), otherwise by running `testenv/build.sh`,
//! which builds them once into a cache keyed by version and prints their paths.

use crate::TestEnvError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A binary the kit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// kube-apiserver.
    KubeApiserver,
    /// etcd.
    Etcd,
    /// nats-server.
    NatsServer,
    /// helm.
    Helm,
    /// kubectl (the version of the kube-apiserver).
    Kubectl,
    /// The OpenTelemetry Collector (testenv/otelcol: the OTLP receiver and a file
    /// exporter).
    Otelcol,
    /// Prometheus' promtool (testenv/promtool), for the chart's alerting rules.
    Promtool,
    /// GAIE's reference endpoint picker (testenv/lwepp), the control of the picker's
    /// Envoy tests.
    Lwepp,
    /// The GitOps tests' git server (testenv/git-server: `git http-backend` over HTTP);
    /// built with `--node`.
    GitServer,
}

impl Binary {
    /// The `NAME` of `INFERA_TESTENV_<NAME>` and of build.sh's output.
    pub fn key(self) -> &'static str {
        match self {
            Self::KubeApiserver => "KUBE_APISERVER",
            Self::Etcd => "ETCD",
            Self::NatsServer => "NATS_SERVER",
            Self::Helm => "HELM",
            Self::Kubectl => "KUBECTL",
            Self::Otelcol => "OTELCOL",
            Self::Promtool => "PROMTOOL",
            Self::Lwepp => "LWEPP",
            Self::GitServer => "GIT_SERVER",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::KubeApiserver => "kube-apiserver",
            Self::Etcd => "etcd",
            Self::NatsServer => "nats-server",
            Self::Helm => "helm",
            Self::Kubectl => "kubectl",
            Self::Otelcol => "otelcol",
            Self::Promtool => "promtool",
            Self::Lwepp => "lwepp",
            Self::GitServer => "git-server",
        }
    }
}

/// The repository's `testenv/` folder.
pub fn testenv_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testenv")
}

/// The path of `binary`, building the test environment first if needed.
pub fn locate(binary: Binary) -> Result<PathBuf, TestEnvError> {
    if let Some(path) = std::env::var_os(format!("INFERA_TESTENV_{}", binary.key())) {
        return Ok(PathBuf::from(path));
    }
    static BUILT: OnceLock<Result<HashMap<String, PathBuf>, String>> = OnceLock::new();
    let built = BUILT.get_or_init(run_build_script);
    match built {
        Ok(paths) => paths
            .get(binary.key())
            .cloned()
            .ok_or_else(|| TestEnvError::LocateBinary {
                name: binary.name(),
                message: "testenv/build.sh did not print it".into(),
            }),
        Err(message) => Err(TestEnvError::LocateBinary {
            name: binary.name(),
            message: message.clone(),
        }),
    }
}

fn run_build_script() -> Result<HashMap<String, PathBuf>, String> {
    let script = testenv_dir().join("build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}); run it by hand to see why:\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), PathBuf::from(v)))
        .collect())
}
