//! A real NATS server with JetStream on loopback, in a temp dir, killed on drop.

use crate::TestEnvError;
use crate::binaries::{Binary, locate};
use crate::process::{ServerProcess, free_port};
use crate::ready::wait_ready;
use std::time::Duration;
use tempfile::TempDir;

/// A running nats-server with JetStream enabled.
#[derive(Debug)]
pub struct NatsServer {
    url: String,
    process: ServerProcess,
    dir: TempDir,
}

impl NatsServer {
    /// Starts nats-server on a free port and waits until JetStream answers an
    /// account-info request.
    pub async fn start() -> Result<Self, TestEnvError> {
        let binary = locate(Binary::NatsServer)?;
        let dir = tempfile::Builder::new()
            .prefix("infera-nats-")
            .tempdir()
            .map_err(|e| prepare(e.to_string()))?;
        let port = free_port().map_err(|e| prepare(e.to_string()))?;
        let url = format!("nats://127.0.0.1:{port}");
        let args: Vec<String> = vec![
            "--addr=127.0.0.1".into(),
            format!("--port={port}"),
            "--jetstream".into(),
            format!("--store_dir={}", dir.path().join("js").display()),
        ];
        let mut process = ServerProcess::start(&binary, &args, &dir.path().join("nats.log"))
            .map_err(|source| TestEnvError::Spawn {
                name: "nats-server",
                source,
            })?;
        let probe_url = url.clone();
        wait_ready("nats-server", &mut process, Duration::from_secs(30), || {
            let url = probe_url.clone();
            async move {
                let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
                let js = async_nats::jetstream::new(client);
                js.query_account()
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .await?;
        Ok(Self { url, process, dir })
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Folders the server writes to (data, log).
    pub fn dirs(&self) -> Vec<std::path::PathBuf> {
        vec![self.dir.path().to_owned()]
    }

    /// Kills the server now.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

fn prepare(message: String) -> TestEnvError {
    TestEnvError::Prepare {
        name: "nats-server",
        message,
    }
}
