//! A real etcd server on loopback, in a temp dir, killed on drop.

use crate::TestEnvError;
use crate::binaries::{Binary, locate};
use crate::process::{ServerProcess, free_port};
use crate::ready::wait_ready;
use std::time::Duration;
use tempfile::TempDir;

/// A running etcd.
#[derive(Debug)]
pub struct EtcdServer {
    endpoint: String,
    process: ServerProcess,
    dir: TempDir,
}

impl EtcdServer {
    /// Starts etcd on free ports and waits until a client's status call succeeds
    /// (connecting alone proves nothing: etcd-client connects lazily).
    pub async fn start() -> Result<Self, TestEnvError> {
        let port = free_port().map_err(|e| prepare(e.to_string()))?;
        Self::start_on(port).await
    }

    /// Starts a fresh etcd (empty data) on client port `client`: with the port of a
    /// killed one, it stands for an etcd that restarted and lost its data.
    pub async fn start_on(client: u16) -> Result<Self, TestEnvError> {
        let binary = locate(Binary::Etcd)?;
        let dir = tempfile::Builder::new()
            .prefix("infera-etcd-")
            .tempdir()
            .map_err(|e| prepare(e.to_string()))?;
        let peer = free_port().map_err(|e| prepare(e.to_string()))?;
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let args: Vec<String> = [
            "--name=testkit".to_owned(),
            format!("--data-dir={}", dir.path().join("data").display()),
            format!("--listen-client-urls={endpoint}"),
            format!("--advertise-client-urls={endpoint}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=testkit={peer_url}"),
            // Tests need durability across nothing; skipping fsync saves seconds per test.
            "--unsafe-no-fsync".to_owned(),
            "--log-level=warn".to_owned(),
        ]
        .into();
        let mut process = ServerProcess::start(&binary, &args, &dir.path().join("etcd.log"))
            .map_err(|source| TestEnvError::Spawn {
                name: "etcd",
                source,
            })?;
        let probe_endpoint = endpoint.clone();
        wait_ready("etcd", &mut process, Duration::from_secs(30), || {
            let endpoint = probe_endpoint.clone();
            async move {
                let mut client = etcd_client::Client::connect([endpoint], None)
                    .await
                    .map_err(|e| e.to_string())?;
                client.status().await.map(|_| ()).map_err(|e| e.to_string())
            }
        })
        .await?;
        Ok(Self {
            endpoint,
            process,
            dir,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Folders the server writes to (data, log).
    pub fn dirs(&self) -> Vec<std::path::PathBuf> {
        vec![self.dir.path().to_owned()]
    }

    /// Kills the server now (to test how clients behave when etcd dies).
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

fn prepare(message: String) -> TestEnvError {
    TestEnvError::Prepare {
        name: "etcd",
        message,
    }
}
