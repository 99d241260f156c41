//! The servers a test binary shares: reused from the environment when the README's test
//! command started them, otherwise started once on first use and kept until the test
//! process exits (they die with it).

use crate::TestEnvError;
use crate::etcd::EtcdServer;
use crate::kube_apiserver::{KubeApiServer, client_from_kubeconfig};
use crate::nats::NatsServer;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::sync::OnceCell;

/// Environment variable holding a running etcd's client URL.
pub const ENV_ETCD: &str = "INFERA_TEST_ETCD_ENDPOINT";
/// Environment variable holding a running NATS server's URL (JetStream enabled).
pub const ENV_NATS: &str = "INFERA_TEST_NATS_URL";
/// Environment variable holding an admin kubeconfig for a running kube-apiserver.
pub const ENV_KUBECONFIG: &str = "INFERA_TEST_KUBECONFIG";

enum Shared<T> {
    External(String),
    Owned(T),
}

/// Folders of shared servers, removed when the test process exits: statics are never
/// dropped, so their `TempDir`s would otherwise stay behind.
static EXIT_CLEANUP: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn owned<T>(dirs: Vec<PathBuf>, server: T) -> Shared<T> {
    if let Ok(mut pending) = EXIT_CLEANUP.lock() {
        if pending.is_empty() {
            register_exit_cleanup();
        }
        pending.extend(dirs);
    }
    Shared::Owned(server)
}

#[allow(unsafe_code)]
fn register_exit_cleanup() {
    extern "C" fn cleanup() {
        if let Ok(dirs) = EXIT_CLEANUP.lock() {
            for dir in dirs.iter() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
    // SAFETY: `cleanup` is a plain `extern "C" fn` with no captured state; libc calls
    // it once at normal process exit (the test harness exits through `exit`).
    unsafe {
        libc::atexit(cleanup);
    }
}

static ETCD: OnceCell<Shared<EtcdServer>> = OnceCell::const_new();
static NATS: OnceCell<Shared<NatsServer>> = OnceCell::const_new();
static KUBE: OnceCell<Shared<KubeApiServer>> = OnceCell::const_new();

/// The client URL of the shared etcd.
pub async fn etcd_endpoint() -> Result<String, TestEnvError> {
    let shared = ETCD
        .get_or_try_init(|| async {
            match std::env::var(ENV_ETCD) {
                Ok(url) => Ok(Shared::External(url)),
                Err(_) => EtcdServer::start().await.map(|s| owned(s.dirs(), s)),
            }
        })
        .await?;
    Ok(match shared {
        Shared::External(url) => url.clone(),
        Shared::Owned(server) => server.endpoint().to_owned(),
    })
}

/// A new client of the shared etcd (clients are per test: each test has its own runtime).
pub async fn etcd_client() -> Result<etcd_client::Client, TestEnvError> {
    let endpoint = etcd_endpoint().await?;
    etcd_client::Client::connect([endpoint], None)
        .await
        .map_err(|e| TestEnvError::Prepare {
            name: "etcd",
            message: e.to_string(),
        })
}

/// The URL of the shared NATS server.
pub async fn nats_url() -> Result<String, TestEnvError> {
    let shared = NATS
        .get_or_try_init(|| async {
            match std::env::var(ENV_NATS) {
                Ok(url) => Ok(Shared::External(url)),
                Err(_) => NatsServer::start().await.map(|s| owned(s.dirs(), s)),
            }
        })
        .await?;
    Ok(match shared {
        Shared::External(url) => url.clone(),
        Shared::Owned(server) => server.url().to_owned(),
    })
}

/// A new client of the shared NATS server.
pub async fn nats_client() -> Result<async_nats::Client, TestEnvError> {
    let url = nats_url().await?;
    async_nats::connect(url)
        .await
        .map_err(|e| TestEnvError::Prepare {
            name: "nats-server",
            message: e.to_string(),
        })
}

/// Returns once the NATS server has read everything `client` sent before, its
/// subscriptions above all: async-nats's `flush` only writes them to the socket, so a
/// publish from another connection right after it can miss a fresh subscriber. A request
/// on an inbox nobody serves comes back "no responders" only after the server got there.
pub async fn nats_round_trip(client: &async_nats::Client) -> Result<(), TestEnvError> {
    match client.request(client.new_inbox(), Default::default()).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => Ok(()),
        Err(e) => Err(TestEnvError::Prepare {
            name: "nats-server",
            message: format!("a round trip to the server: {e}"),
        }),
    }
}

/// Path of an admin kubeconfig for the shared kube-apiserver.
pub async fn kubeconfig() -> Result<PathBuf, TestEnvError> {
    let shared = KUBE
        .get_or_try_init(|| async {
            match std::env::var(ENV_KUBECONFIG) {
                Ok(path) => Ok(Shared::External(path)),
                Err(_) => KubeApiServer::start().await.map(|s| owned(s.dirs(), s)),
            }
        })
        .await?;
    Ok(match shared {
        Shared::External(path) => PathBuf::from(path),
        Shared::Owned(server) => server.kubeconfig().to_owned(),
    })
}

/// A new admin `kube::Client` of the shared kube-apiserver.
pub async fn kube_client() -> Result<kube::Client, TestEnvError> {
    let path = kubeconfig().await?;
    client_from_kubeconfig(&path)
        .await
        .map_err(|message| TestEnvError::Prepare {
            name: "kube-apiserver",
            message,
        })
}

/// A name no other test in any concurrently running test binary uses:
/// `<prefix>-<pid>-<n>`, valid as a Kubernetes name when `prefix` is.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
