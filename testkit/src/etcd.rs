//! A real etcd server on loopback, in a temp dir, killed on drop.

use crate::TestEnvError;
use crate::binaries::{Binary, locate};
use crate::certs::Pki;
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
        Self::launch(client, None).await
    }

    /// Starts etcd serving `https://` with a certificate `pki` issues and requiring
    /// client certificates it signed (`--client-cert-auth`).
    pub async fn start_tls(pki: &Pki) -> Result<Self, TestEnvError> {
        let port = free_port().map_err(|e| prepare(e.to_string()))?;
        Self::launch(port, Some(pki)).await
    }

    async fn launch(client: u16, tls: Option<&Pki>) -> Result<Self, TestEnvError> {
        let binary = locate(Binary::Etcd)?;
        let dir = tempfile::Builder::new()
            .prefix("infera-etcd-")
            .tempdir()
            .map_err(|e| prepare(e.to_string()))?;
        let peer = free_port().map_err(|e| prepare(e.to_string()))?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut args: Vec<String> = [
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
        // The probe below connects as a client of the same CA.
        let mut probe_options = None;
        if let Some(pki) = tls {
            let (cert, key) = pki.issue("etcd-server").map_err(prepare)?;
            let (probe_cert, probe_key) = pki.issue("testkit-probe").map_err(prepare)?;
            args.extend([
                format!("--cert-file={}", cert.display()),
                format!("--key-file={}", key.display()),
                format!("--trusted-ca-file={}", pki.ca.display()),
                "--client-cert-auth".to_owned(),
            ]);
            let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| prepare(e.to_string()));
            let tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(read(&pki.ca)?))
                .identity(etcd_client::Identity::from_pem(
                    read(&probe_cert)?,
                    read(&probe_key)?,
                ));
            probe_options = Some(etcd_client::ConnectOptions::new().with_tls(tls));
        }
        let mut process = ServerProcess::start(&binary, &args, &dir.path().join("etcd.log"))
            .map_err(|source| TestEnvError::Spawn {
                name: "etcd",
                source,
            })?;
        let probe_endpoint = endpoint.clone();
        wait_ready("etcd", &mut process, Duration::from_secs(30), || {
            let endpoint = probe_endpoint.clone();
            let options = probe_options.clone();
            async move {
                let mut client = etcd_client::Client::connect([endpoint], options)
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

/// Turns etcd's auth on as an operator of it would: `root` (password `root-password`;
/// a client certificate with CN `root` also acts as it) and `user` (password
/// `password`) allowed to read, or with `write` also write, keys under `prefix`.
pub async fn enable_auth(
    admin: &mut etcd_client::Client,
    prefix: &str,
    user: &str,
    password: &str,
    write: bool,
) -> Result<(), etcd_client::Error> {
    use etcd_client::Permission;
    admin.user_add("root", "root-password", None).await?;
    admin.user_grant_role("root", "root").await?;
    let role = format!("{user}-role");
    admin.role_add(role.as_str()).await?;
    let permission = if write {
        Permission::read_write(prefix)
    } else {
        Permission::read(prefix)
    };
    admin
        .role_grant_permission(role.as_str(), permission.with_prefix())
        .await?;
    admin.user_add(user, password, None).await?;
    admin.user_grant_role(user, role.as_str()).await?;
    admin.auth_enable().await?;
    Ok(())
}

fn prepare(message: String) -> TestEnvError {
    TestEnvError::Prepare {
        name: "etcd",
        message,
    }
}
