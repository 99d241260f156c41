//! The tiers a worker declares last only as long as its kvd: the record names them while
//! kvd's socket takes connections and drops them while it does not, so routers stop
//! crediting a worker whose kvd died with blocks it can no longer load (its RAM and NVMe
//! tiers, and the shared tier it reached through kvd).

use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;

/// How often kvd's socket is tried.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// The record JSON to register, with and without the declared tiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TieredRecord {
    /// With `kv.tiers`: kvd answers.
    pub with_tiers: String,
    /// Without them: kvd is gone.
    pub without_tiers: String,
}

impl TieredRecord {
    /// The record for kvd `up` or not.
    pub fn for_kvd(&self, up: bool) -> &str {
        if up {
            &self.with_tiers
        } else {
            &self.without_tiers
        }
    }
}

/// Tries kvd's `socket` every [`PROBE_INTERVAL`] and keeps `record` at the version for
/// what it found, until `stop`.
pub async fn watch_kvd(
    socket: PathBuf,
    records: TieredRecord,
    record: watch::Sender<String>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let up = tokio::net::UnixStream::connect(&socket).await.is_ok();
        let want = records.for_kvd(up);
        record.send_if_modified(|current| {
            if current == want {
                return false;
            }
            if up {
                tracing::info!(
                    "kvd answers at {}: the record declares its tiers again",
                    socket.display()
                );
            } else {
                tracing::warn!(
                    "kvd does not answer at {}: the record declares no tier below the engine until it does",
                    socket.display()
                );
            }
            want.clone_into(current);
            true
        });
        tokio::select! {
            _ = tokio::time::sleep(PROBE_INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_record_follows_whether_kvd_takes_connections() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kvd.sock");
        let records = TieredRecord {
            with_tiers: "with".into(),
            without_tiers: "without".into(),
        };
        let (tx, mut rx) = watch::channel(records.with_tiers.clone());
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(watch_kvd(socket.clone(), records, tx, stop));
        // Nothing listens yet.
        rx.wait_for(|v| v == "without").await.unwrap();
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        rx.wait_for(|v| v == "with").await.unwrap();
        drop(listener);
        std::fs::remove_file(&socket).unwrap();
        rx.wait_for(|v| v == "without").await.unwrap();
    }
}
