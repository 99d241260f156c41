//! Files mounted from Secrets (API keys, the TLS certificate) read again while serving:
//! Kubernetes updates a mounted Secret in place, without restarting the pod.

use std::time::Duration;
use tokio::sync::watch;

/// How often such files are compared with what is served.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// Calls `reload` every `interval` until `stop`: it answers whether what it serves
/// changed, or why the new files were not taken (the old ones stay served).
pub(crate) async fn reload_every(
    what: &'static str,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
    reload: impl Fn() -> Result<bool, String>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        match reload() {
            Ok(true) => tracing::info!("serving the changed {what}"),
            Ok(false) => {}
            Err(e) => tracing::warn!("keeping the served {what}: {e}"),
        }
    }
}
