//! Dev-only test kit: real etcd, NATS with JetStream, and a kube-apiserver (with its own
//! etcd) on loopback, for Infera's integration tests. Nothing here is mocked.
//!
//! Tests call [`etcd_endpoint`], [`nats_url`] or [`kube_client`]. When the README's test
//! command has already started a set of servers it exports their endpoints
//! ([`ENV_ETCD`], [`ENV_NATS`], [`ENV_KUBECONFIG`]) and the kit reuses them; otherwise the
//! kit starts its own, once per test binary, on free ports in temp dirs, and waits until
//! each answers a real call. The binaries come from `testenv/build.sh` (built from Go
//! modules, cached by version). Child processes die with their parent (`PR_SET_PDEATHSIG`)
//! so nothing leaks when a test process is killed.

pub mod binaries;
pub mod certs;
pub mod envoy;
pub mod etcd;
pub mod kube_apiserver;
pub mod legacy_records;
pub mod model_files;
pub mod nats;
pub mod otelcol;
pub mod process;
pub mod python_tools;
mod ready;
pub mod redis;
mod shared;

pub use shared::{
    ENV_ETCD, ENV_KUBECONFIG, ENV_NATS, etcd_client, etcd_endpoint, kube_client, kubeconfig,
    nats_client, nats_round_trip, nats_url, unique_name,
};

/// The test cache: `INFERA_TESTENV_CACHE`, else `~/.cache/infera-testenv` (built
/// binaries, npm tokenizer packages, tool virtualenvs).
pub fn cache_root() -> std::path::PathBuf {
    std::env::var_os("INFERA_TESTENV_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".cache/infera-testenv"))
        })
        .unwrap_or_else(|| std::env::temp_dir().join("infera-testenv"))
}

/// Why a test server could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    /// A binary could not be located or built.
    #[error("locating test binary {name}: {message}")]
    LocateBinary {
        /// Binary name.
        name: &'static str,
        /// What went wrong and what to do.
        message: String,
    },
    /// A server process could not be spawned.
    #[error("starting {name}: {source}")]
    Spawn {
        /// Server name.
        name: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A server did not become ready.
    #[error("{name} did not become ready within {seconds}s: {last_error}\n{log_tail}")]
    NotReady {
        /// Server name.
        name: &'static str,
        /// How long we waited.
        seconds: u64,
        /// The last readiness probe failure.
        last_error: String,
        /// The end of the server's log.
        log_tail: String,
    },
    /// Preparing files for a server failed.
    #[error("preparing {name}: {message}")]
    Prepare {
        /// Server name.
        name: &'static str,
        /// What went wrong.
        message: String,
    },
}
