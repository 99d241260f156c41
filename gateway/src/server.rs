//! Running the gateway: discovery, health checks, KV-event ingest and the tokenizer fetch
//! as tasks, the HTTP server (HTTP/1.1 and h2, plain or TLS: `http::listener`), and a
//! graceful shutdown that stops accepting, lets open streams finish (bounded), then
//! stops discovery.

use crate::config::{ConfigError, DiscoveryBackend, KvEventTransport, RequestTransportArg};
use crate::epp::serve::{EppAddrs, start_epp};
use crate::flow::engine_load::run_engine_reads;
use crate::flow::gate::run_wakeups;
use crate::http::build_router;
use crate::http::listener::{ServeOptions, serve};
use crate::http::reload::{RELOAD_INTERVAL, reload_every};
use crate::http::tls::TlsCertificates;
use crate::route::hub::{hub_repo_id, run_hub_fetch};
use crate::route::kv_events::{run_nats_ingest, run_zmq_ingest};
use crate::route::tokenizer::run_tokenizer_fetch;
use crate::send::nats::NatsPlane;
use crate::state::Gateway;
use crate::workers::discovery::etcd::run_etcd_discovery;
use crate::workers::discovery::kubernetes::{
    PoolPorts, build_kube_client, read_inference_pool, run_kubernetes_discovery,
};
use crate::workers::discovery::static_file::{load_worker_file, watch_worker_file};
use crate::workers::health::{HealthChecks, run_health_checks};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A running gateway.
#[derive(Debug)]
pub struct RunningGateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state.
    pub gateway: Arc<Gateway>,
    /// The served certificate (with --tls-cert-file).
    pub tls: Option<Arc<TlsCertificates>>,
    /// Where the endpoint picker listens (with --epp-port).
    pub epp: Option<EppAddrs>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl RunningGateway {
    /// Keeps serving for `--shutdown-delay-s` while not ready and closing connections,
    /// then stops accepting, waits for open responses (up to the configured grace), stops
    /// discovery.
    pub async fn shutdown(mut self) {
        let delay = Duration::from_secs_f64(self.gateway.cfg.shutdown_delay_s);
        if !delay.is_zero() {
            self.gateway
                .draining
                .store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!("not ready; serving {delay:?} more before closing the listener");
            tokio::time::sleep(delay).await;
        }
        let _ = self.stop.send(true);
        let grace = Duration::from_secs_f64(self.gateway.cfg.shutdown_grace_s);
        let drain = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, drain).await.is_err() {
            tracing::warn!("open requests did not finish within {grace:?}; closing them");
            self.tasks.abort_all();
        }
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.tasks.abort_all();
    }
}

/// Starts discovery (per the config) and the HTTP server on `listener`.
pub async fn start_gateway(
    gateway: Arc<Gateway>,
    listener: TcpListener,
) -> Result<RunningGateway, ConfigError> {
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let cfg = &gateway.cfg;
    connect_request_plane(&gateway).await?;
    match cfg.discovery_backend {
        DiscoveryBackend::Etcd => {
            tasks.spawn(run_etcd_discovery(
                cfg.etcd_endpoints.clone(),
                cfg.etcd_security(),
                cfg.etcd_prefix.clone(),
                Duration::from_secs_f64(cfg.empty_resync_grace_s.max(0.0)),
                gateway.registry.clone(),
                gateway.metrics.clone(),
                stop_rx.clone(),
            ));
        }
        DiscoveryBackend::Static => {
            if let Some(path) = cfg.static_workers.clone() {
                let (n, stamp) = load_worker_file(&path, &gateway.registry, &gateway.metrics)
                    .map_err(|e| ConfigError(e.to_string()))?;
                tracing::info!("{}: {n} workers", path.display());
                tasks.spawn(watch_worker_file(
                    path,
                    stamp,
                    gateway.registry.clone(),
                    gateway.metrics.clone(),
                    stop_rx.clone(),
                ));
            }
        }
        DiscoveryBackend::Kubernetes => {
            let client = build_kube_client(cfg.kubeconfig.as_deref())
                .await
                .map_err(|e| ConfigError(e.to_string()))?;
            let namespace = cfg
                .k8s_namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned());
            // `validate` refuses the kubernetes backend without a selector or a pool.
            let mut selector = cfg.k8s_label_selector.clone().unwrap_or_default();
            let mut pool = (!cfg.epp_target_ports.is_empty()).then(|| PoolPorts {
                ports: cfg.epp_target_ports.clone(),
            });
            if let Some(name) = &cfg.epp_pool_name {
                let (labels, ports) = read_inference_pool(client.clone(), &namespace, name)
                    .await
                    .map_err(|e| ConfigError(e.to_string()))?;
                tracing::info!(pool = %name, selector = %labels, ports = ?ports.ports, "routing the InferencePool's Pods");
                selector = labels;
                pool = Some(ports);
            }
            tasks.spawn(run_kubernetes_discovery(
                client,
                namespace,
                selector,
                pool,
                gateway.registry.clone(),
                gateway.metrics.clone(),
                stop_rx.clone(),
            ));
        }
    }
    finish_start(gateway, listener, stop, stop_rx, tasks).await
}

/// Starts KV-event ingestion when routing is kv-aware.
fn spawn_kv_ingest(gateway: &Arc<Gateway>, tasks: &mut JoinSet<()>, stop: &watch::Receiver<bool>) {
    let Some(kv) = gateway.kv.clone() else { return };
    let (registry, metrics) = (gateway.registry.clone(), gateway.metrics.clone());
    match gateway.cfg.kv_event_transport {
        KvEventTransport::Nats => {
            tasks.spawn(run_nats_ingest(
                gateway.cfg.nats_url(|k| std::env::var(k).ok()),
                registry,
                kv,
                metrics,
                stop.clone(),
            ));
        }
        KvEventTransport::Zmq => {
            tasks.spawn(run_zmq_ingest(registry, kv, metrics, stop.clone()));
        }
    }
}

/// A gateway fed in-process (no discovery task): the caller upserts into its registry.
pub async fn start_embedded(
    gateway: Arc<Gateway>,
    listener: TcpListener,
) -> Result<RunningGateway, ConfigError> {
    connect_request_plane(&gateway).await?;
    let (stop, stop_rx) = watch::channel(false);
    let tasks = JoinSet::new();
    finish_start(gateway, listener, stop, stop_rx, tasks).await
}

/// Connects the NATS request plane (`--request-transport nats`), before the listener
/// opens.
async fn connect_request_plane(gateway: &Gateway) -> Result<(), ConfigError> {
    let cfg = &gateway.cfg;
    if cfg.request_transport != RequestTransportArg::Nats {
        return Ok(());
    }
    let url = cfg.nats_url(|k| std::env::var(k).ok());
    let plane = NatsPlane::connect(&url, cfg.plane_settings())
        .await
        .map_err(ConfigError)?;
    tracing::info!(url, settings = ?plane.settings(), "NATS request plane connected");
    // Set once per gateway: a second start keeps the first connection.
    let _ = gateway.upstream.nats.set(plane);
    Ok(())
}

/// Starts KV ingestion, the endpoint picker (with --epp-port) and the HTTP server: the
/// part every way of starting shares.
async fn finish_start(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    stop: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    mut tasks: JoinSet<()>,
) -> Result<RunningGateway, ConfigError> {
    spawn_kv_ingest(&gateway, &mut tasks, &stop_rx);
    let epp = match gateway.cfg.epp_port {
        Some(port) => Some(
            start_epp(&gateway, port, &mut tasks, &stop_rx)
                .await
                .map_err(|e| ConfigError(e.to_string()))?,
        ),
        None => None,
    };
    let cfg = &gateway.cfg;
    let checks = HealthChecks {
        registry: gateway.registry.clone(),
        breakers: gateway.breakers.clone(),
        metrics: gateway.metrics.clone(),
        client: gateway.client.clone(),
        interval: Duration::from_secs_f64(cfg.health_check_interval_s.max(0.0)),
        timeout: Duration::from_secs_f64(cfg.health_check_timeout_s),
        failures: cfg.health_check_failures,
    };
    tasks.spawn(run_health_checks(checks, stop_rx.clone()));
    if let Some(flow) = &gateway.flow {
        tasks.spawn(run_wakeups(
            flow.clone(),
            gateway.registry.clone(),
            stop_rx.clone(),
        ));
        if let Some(interval) = flow.args().engine_scrape() {
            tasks.spawn(run_engine_reads(
                gateway.registry.clone(),
                gateway.inflight.clone(),
                gateway.client.clone(),
                interval,
                stop_rx.clone(),
            ));
        }
    }
    if let (Some(repo), Some(kv)) = (
        cfg.router_tokenizer_path.as_deref().and_then(hub_repo_id),
        &gateway.kv,
    ) {
        let token = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|t| !t.is_empty()));
        tasks.spawn(run_hub_fetch(
            kv.clone(),
            gateway.tokenizer.clone(),
            cfg.hf_endpoint.clone(),
            token,
            repo,
            stop_rx.clone(),
        ));
    }
    if let (Some(port), Some(kv)) = (gateway.cfg.router_tokenizer_from_workers, &gateway.kv) {
        tasks.spawn(run_tokenizer_fetch(
            kv.clone(),
            gateway.tokenizer.clone(),
            gateway.registry.clone(),
            port,
            stop_rx.clone(),
        ));
    }
    let addr = listener
        .local_addr()
        .map_err(|e| ConfigError(e.to_string()))?;
    let tls = match (&gateway.cfg.tls_cert_file, &gateway.cfg.tls_key_file) {
        (Some(cert), Some(key)) => {
            let tls = TlsCertificates::load(cert, key).map_err(ConfigError)?;
            let watched = tls.clone();
            tasks.spawn(reload_every(
                "TLS certificate",
                RELOAD_INTERVAL,
                stop_rx.clone(),
                move || watched.reload_if_changed(),
            ));
            Some(tls)
        }
        _ => None,
    };
    if gateway.api_keys.is_some() {
        let watched = gateway.clone();
        tasks.spawn(reload_every(
            "API keys",
            RELOAD_INTERVAL,
            stop_rx.clone(),
            move || watched.reload_api_keys().map_err(|e| e.0),
        ));
    }
    let opts = ServeOptions {
        header_read_timeout: Duration::from_secs_f64(gateway.cfg.header_read_timeout_s),
        max_connections: gateway.cfg.max_connections,
        tls: tls.clone(),
        open: gateway.metrics.connections_open.clone(),
    };
    tasks.spawn(serve(
        listener,
        build_router(gateway.clone()),
        opts,
        stop_rx,
    ));
    Ok(RunningGateway {
        addr,
        gateway,
        tls,
        epp,
        stop,
        tasks,
    })
}
