//! The `infera-operator` command: reconciles InferaDeployments into engine workers and
//! gateways, one active replica at a time (leader election on a Lease).

use axum::Router;
use axum::routing::get;
use clap::Parser;
use infera_operator::leader::{self, LeaseConfig};
use infera_operator::metrics::Metrics;
use infera_operator::plan::{DEFAULT_NVME_HOST_PATHS, Images, Platform};
use infera_operator::reconcile::{self, Settings};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

/// Reconciles InferaDeployment and PDTopology resources into engine StatefulSets (or
/// LeaderWorkerSets), gateways, Services, PodDisruptionBudgets and RBAC, and reports
/// Ready / Progressing / Degraded conditions.
#[derive(Debug, Parser)]
#[command(name = "infera-operator", version, about, long_about = None)]
struct Cli {
    /// Kubeconfig to use; unset: `KUBECONFIG`, `~/.kube/config`, then in-cluster.
    #[arg(long, env = "INFERA_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Reconcile only this namespace; unset: every namespace.
    #[arg(long, env = "INFERA_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Deployments reconciled at once.
    #[arg(long, env = "INFERA_CONCURRENCY", default_value_t = 8)]
    concurrency: u16,
    /// Elect one active replica through a coordination.k8s.io Lease.
    #[arg(long, env = "INFERA_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the Lease; unset: POD_NAMESPACE, else `default`.
    #[arg(long, env = "INFERA_LEADER_ELECTION_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long,
        env = "INFERA_LEADER_ELECTION_ID",
        default_value = "infera-operator"
    )]
    leader_election_id: String,
    /// Seconds a Lease holds without renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "INFERA_METRICS_BIND_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    metrics_bind_address: SocketAddr,
    /// Registry of Infera's images (`<registry>/infera-<part>:<tag>`).
    #[arg(long, env = "INFERA_IMAGE_REGISTRY", default_value = "ghcr.io/infera")]
    image_registry: String,
    /// Tag of Infera's images.
    #[arg(long, env = "INFERA_IMAGE_TAG", default_value = env!("CARGO_PKG_VERSION"))]
    image_tag: String,
    /// Gateway image (overrides registry and tag).
    #[arg(long, env = "INFERA_GATEWAY_IMAGE")]
    gateway_image: Option<String>,
    /// Engine sidecar image (overrides registry and tag).
    #[arg(long, env = "INFERA_SIDECAR_IMAGE")]
    sidecar_image: Option<String>,
    /// Simulator image for `engine.kind: sim` (overrides registry and tag).
    #[arg(long, env = "INFERA_SIM_IMAGE")]
    sim_image: Option<String>,
    /// kvd image (overrides registry and tag).
    #[arg(long, env = "INFERA_KVD_IMAGE")]
    kvd_image: Option<String>,
    /// Image of model download Jobs for simulated engines, with `huggingface_hub` baked
    /// in (vendor engine images download their own models; overrides registry and tag).
    #[arg(long, env = "INFERA_DOWNLOADER_IMAGE")]
    downloader_image: Option<String>,
    /// etcd client URLs (comma-separated) for deployments that choose etcd discovery
    /// without endpoints: the chart sets its bundled etcd here.
    #[arg(long, env = "INFERA_DEFAULT_ETCD_ENDPOINTS", value_delimiter = ',')]
    default_etcd_endpoints: Vec<String>,
    /// `NAMESPACE/NAME` of the Secret holding the CA and a client certificate (`ca.crt`,
    /// `tls.crt`, `tls.key`) of that etcd, when it requires TLS: each deployment using it
    /// gets a copy in its own namespace. The chart sets the one it generates.
    #[arg(long, env = "INFERA_DEFAULT_ETCD_CLIENT_SECRET", value_parser = namespaced_name)]
    default_etcd_client_secret: Option<(String, String)>,
    /// NATS URL for deployments that choose NATS messaging without a URL: the chart sets
    /// its bundled NATS here.
    #[arg(long, env = "INFERA_DEFAULT_NATS_URL")]
    default_nats_url: Option<String>,
    /// Node directories under which `kvCache.nvme.path` may lie (comma-separated): kvd
    /// runs as root in that hostPath, so a deployment must not reach the node's system
    /// directories.
    #[arg(
        long,
        env = "INFERA_KV_CACHE_NVME_HOST_PATHS",
        value_delimiter = ',',
        default_values_t = DEFAULT_NVME_HOST_PATHS.map(String::from)
    )]
    kv_cache_nvme_host_paths: Vec<String>,
    /// Log lines as JSON.
    #[arg(long, env = "INFERA_LOG_JSON")]
    log_json: bool,
}

/// `NAMESPACE/NAME`.
fn namespaced_name(value: &str) -> Result<(String, String), String> {
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{value:?}: expected NAMESPACE/NAME")),
    }
}

fn images(cli: &Cli) -> Images {
    let mut images = Images::from_registry(&cli.image_registry, &cli.image_tag);
    let pick = |slot: &mut String, value: &Option<String>| {
        if let Some(v) = value {
            slot.clone_from(v);
        }
    };
    pick(&mut images.gateway, &cli.gateway_image);
    pick(&mut images.sidecar, &cli.sidecar_image);
    pick(&mut images.sim, &cli.sim_image);
    pick(&mut images.kvd, &cli.kvd_image);
    pick(&mut images.downloader, &cli.downloader_image);
    images
}

async fn client(cli: &Cli) -> Result<kube::Client, String> {
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no kubeconfig and not in a cluster: {e}"))?,
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

async fn serve_probes(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("binding --metrics-bind-address {addr}: {e}"))?;
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            infera_telemetry::metrics::CONTENT_TYPE,
                        )],
                        m.render(),
                    )
                }
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server: {e}");
        }
    });
    Ok(())
}

fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "infera-operator".into());
    format!("{host}_{}", std::process::id())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera-operator",
        default_filter: "info,kube_runtime=warn".into(),
        json: cli.log_json,
        ..Default::default()
    });
    if let Err(e) = &telemetry {
        eprintln!("infera-operator: {e}");
    }
    std::process::exit(run(cli).await);
}

async fn run(cli: Cli) -> i32 {
    let client = match client(&cli).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("infera-operator: {e}");
            return 2;
        }
    };
    let metrics = Arc::new(Metrics::default());
    if let Err(e) = serve_probes(cli.metrics_bind_address, metrics.clone()).await {
        eprintln!("infera-operator: {e}");
        return 2;
    }
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("infera-operator: cannot install signal handlers");
        return 2;
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("stopping");
        let _ = stop_tx.send(true);
    });
    let id = identity();
    let lease = LeaseConfig {
        namespace: cli
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".into()),
        name: cli.leader_election_id.clone(),
        identity: id.clone(),
        duration: Duration::from_secs(cli.lease_duration_seconds.max(2)),
        retry: Duration::from_secs((cli.lease_duration_seconds / 5).max(1)),
    };
    if cli.leader_elect {
        let mut stopped = stop_rx.clone();
        tokio::select! {
            _ = leader::acquire(&client, &lease) => {}
            _ = stopped.wait_for(|s| *s) => return 0,
        }
        metrics.leader.store(true, Ordering::Relaxed);
    }
    let settings = Settings {
        platform: Platform {
            images: images(&cli),
            etcd_endpoints: cli.default_etcd_endpoints.clone(),
            nats_url: cli.default_nats_url.clone(),
            etcd_client_secret: cli.default_etcd_client_secret.clone(),
            nvme_host_paths: cli.kv_cache_nvme_host_paths.clone(),
            operator_namespace: std::env::var("POD_NAMESPACE").ok(),
        },
        namespace: cli.namespace.clone(),
        concurrency: cli.concurrency.max(1),
        instance: id,
    };
    let mut stopped = stop_rx.clone();
    let shutdown = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let controller = reconcile::run(client.clone(), settings, metrics.clone(), shutdown);
    let code = if cli.leader_elect {
        tokio::select! {
            _ = controller => 0,
            _ = leader::hold(&client, &lease) => {
                // Another replica may be reconciling now: stop at once (a restart
                // rejoins as a candidate).
                1
            }
        }
    } else {
        controller.await;
        0
    };
    if cli.leader_elect && code == 0 {
        leader::release(&client, &lease).await;
    }
    code
}
