//! The `infera-operator` command: reconciles InferaDeployments into engine workers and
//! gateways, one active replica at a time (leader election on a Lease).

use axum::Router;
use axum::routing::get;
use clap::Parser;
use infera_operator::cli::OperatorArgs;
use infera_operator::leader::{self, LeaseConfig};
use infera_operator::metrics::Metrics;
use infera_operator::plan::Platform;
use infera_operator::reconcile::{self, Settings};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

async fn client(cli: &OperatorArgs) -> Result<kube::Client, String> {
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
    let cli = OperatorArgs::parse();
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

async fn run(cli: OperatorArgs) -> i32 {
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
            images: cli.images(),
            registry: cli.image_registry.clone(),
            pull_policy: cli.image_pull_policy.map(Into::into),
            pull_secrets: cli.image_pull_secret.clone(),
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
