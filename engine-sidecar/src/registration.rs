//! Keeping the worker record in etcd under a lease: grant, put, keep alive every third
//! of the TTL, and register again whenever the lease is gone (expired, revoked, or etcd
//! lost its data). Deregistration revokes the lease, so the key disappears at once.

use etcd_client::{Client, ConnectOptions, PutOptions};
use infera_etcd_conn::{EtcdSecurity, EtcdSecurityError};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// First wait after a failed registration round; doubled per failure up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest wait between registration attempts.
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Registration state, for logs and the sidecar's own status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegistrationState {
    /// The record is in etcd under a live lease.
    pub registered: bool,
    /// Times the record was (re)registered.
    pub registrations: u64,
}

/// Why a registration round ended.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// An etcd call failed.
    #[error("etcd {action}: {source}")]
    Call {
        /// What was being done.
        action: &'static str,
        /// The client error.
        #[source]
        source: etcd_client::Error,
    },
    /// The TLS or auth files cannot be read.
    #[error("{0}")]
    Security(#[from] EtcdSecurityError),
}

fn call(action: &'static str) -> impl FnOnce(etcd_client::Error) -> RegisterError {
    move |source| RegisterError::Call { action, source }
}

/// What to register where.
#[derive(Debug, Clone)]
pub struct Registration {
    /// etcd endpoints.
    pub endpoints: Vec<String>,
    /// Key.
    pub key: String,
    /// Record JSON, put again under the same lease whenever it changes (the tiers a
    /// worker declares come and go with its kvd).
    pub value: watch::Receiver<String>,
    /// Lease TTL.
    pub ttl: Duration,
    /// TLS and auth of the etcd connection.
    pub security: EtcdSecurity,
}

/// Keeps the record registered until `stop` turns true, then revokes the lease.
pub async fn run_registration(
    reg: Registration,
    state: watch::Sender<RegistrationState>,
    mut stop: watch::Receiver<bool>,
) {
    let lease: Mutex<Option<i64>> = Mutex::new(None);
    let mut backoff = RETRY_MIN;
    loop {
        let registrations = state.borrow().registrations;
        let result = tokio::select! {
            r = keep_registered(&reg, &state, &lease) => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        state.send_modify(|s| s.registered = false);
        // A round that registered ends a run of failures: the next attempt comes soon
        // (etcd restarted empty after a long outage must not wait out the old backoff).
        if state.borrow().registrations > registrations {
            backoff = RETRY_MIN;
        }
        if let Err(e) = result {
            tracing::warn!("registration of {}: {e}; retrying in {backoff:?}", reg.key);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        backoff = (backoff * 2).min(RETRY_MAX);
    }
    let current = lease.lock().ok().and_then(|mut l| l.take());
    if let Some(lease) = current {
        deregister(&reg, lease).await;
    }
    state.send_modify(|s| s.registered = false);
}

async fn connect(reg: &Registration) -> Result<Client, RegisterError> {
    let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(3));
    let options = reg.security.apply(options)?;
    Client::connect(&reg.endpoints, Some(options))
        .await
        .map_err(call("connect"))
}

/// Registers once and keeps the lease alive; returns `Ok` when the lease is gone.
async fn keep_registered(
    reg: &Registration,
    state: &watch::Sender<RegistrationState>,
    current: &Mutex<Option<i64>>,
) -> Result<(), RegisterError> {
    let mut client = connect(reg).await?;
    let mut record = reg.value.clone();
    let ttl_secs = reg.ttl.as_secs().max(1) as i64;
    let lease = client
        .lease_grant(ttl_secs, None)
        .await
        .map_err(call("lease grant"))?
        .id();
    if let Ok(mut l) = current.lock() {
        *l = Some(lease);
    }
    let value = record.borrow_and_update().clone();
    client
        .put(
            reg.key.as_str(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .map_err(call("put"))?;
    state.send_modify(|s| {
        s.registered = true;
        s.registrations += 1;
    });
    tracing::info!(
        "registered {} under lease {lease:x} (ttl {ttl_secs}s)",
        reg.key
    );
    let (mut keeper, mut responses) = client
        .lease_keep_alive(lease)
        .await
        .map_err(call("keepalive"))?;
    let interval = reg.ttl / 3;
    // Once every sender is gone the record cannot change: only the keepalive remains.
    let mut changes = true;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {
                keeper.keep_alive().await.map_err(call("keepalive"))?;
                match responses.message().await.map_err(call("keepalive"))? {
                    Some(resp) if resp.ttl() > 0 => {}
                    _ => {
                        tracing::warn!("lease {lease:x} of {} is gone; registering again", reg.key);
                        return Ok(());
                    }
                }
            }
            changed = record.changed(), if changes => {
                if changed.is_err() {
                    changes = false;
                    continue;
                }
                let value = record.borrow_and_update().clone();
                client
                    .put(reg.key.as_str(), value, Some(PutOptions::new().with_lease(lease)))
                    .await
                    .map_err(call("put"))?;
                tracing::info!("updated the record of {}", reg.key);
            }
        }
    }
}

async fn deregister(reg: &Registration, lease: i64) {
    let result = match connect(reg).await {
        Ok(mut client) => client
            .lease_revoke(lease)
            .await
            .map(|_| ())
            .map_err(call("lease revoke")),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => tracing::info!("deregistered {} (lease {lease:x} revoked)", reg.key),
        Err(e) => tracing::warn!(
            "deregistering {}: {e}; the key expires with its TTL",
            reg.key
        ),
    }
}
