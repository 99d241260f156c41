//! Serving the endpoint picker: Envoy's `ExternalProcessor` gRPC service (TLS by default,
//! as GAIE's reference picker serves it) with gRPC health beside it, and a plaintext
//! health port for probes. Each ext_proc stream runs an [`Exchange`]; its pick is held
//! until the stream ends (Envoy cancels it after the response's last message, or the
//! client went away), which releases the in-flight count and kv charges.

use crate::epp::exchange::{Exchange, Step};
use crate::epp::pick::{Held, PickOptions, Picker};
use crate::epp::reply::Refusal;
use crate::state::Gateway;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The ext_proc service's name, as Envoy's gRPC health check asks for it.
pub(crate) const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// Health services that turn SERVING once discovery has synced: GAIE's `readiness`,
/// the reference picker's `inference-extension`, the ext_proc service, and `""`.
const READY_SERVICES: [&str; 4] = ["readiness", "inference-extension", EXT_PROC_SERVICE, ""];

/// Why the picker could not start.
#[derive(Debug, thiserror::Error)]
pub enum EppError {
    /// A port could not be bound.
    #[error(
        "binding the endpoint picker's {what} port {addr}: {source} (is another process on it?)"
    )]
    Bind {
        /// `ext_proc` or `health`.
        what: &'static str,
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// The TLS certificate could not be read or made.
    #[error("the endpoint picker's TLS certificate: {0}")]
    Tls(String),
}

/// Where a started picker listens.
#[derive(Debug, Clone, Copy)]
pub struct EppAddrs {
    /// The ext_proc port.
    pub ext_proc: SocketAddr,
    /// The plaintext health port.
    pub health: SocketAddr,
}

struct Service {
    picker: Arc<Picker>,
    max_body: usize,
}

/// The metric label of a refusal's status.
fn refused_label(status: u16) -> &'static str {
    match status {
        400 => "refused_400",
        404 => "refused_404",
        413 => "refused_413",
        429 => "refused_429",
        503 => "refused_503",
        _ => "refused_other",
    }
}

/// Runs one exchange to its end.
async fn run_exchange(
    picker: Arc<Picker>,
    max_body: usize,
    mut inbound: Streaming<ProcessingRequest>,
    tx: mpsc::Sender<Result<ProcessingResponse, Status>>,
) {
    let gw = picker.gateway().clone();
    let mut exchange = Exchange::new(max_body);
    // Dropped when the exchange ends, however it ends: the pick's counts are released.
    let mut held: Option<Held> = None;
    loop {
        let message = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            // Envoy cancels the stream at the exchange's end (or when the client goes away).
            Err(status) if status.code() == tonic::Code::Cancelled => break,
            Err(status) => {
                tracing::debug!("ext_proc stream ended: {status}");
                break;
            }
        };
        let replies = match exchange.receive(message) {
            Ok(Step::Send(replies)) => replies,
            Ok(Step::Pick(input)) => match picker.pick(&input) {
                Ok(h) => {
                    gw.metrics.record_epp_exchange("picked");
                    let replies = exchange.answer(Ok(&h.pick));
                    held = Some(h);
                    replies
                }
                Err(e) => {
                    let refusal = Refusal::of(&e);
                    gw.metrics
                        .record_epp_exchange(refused_label(refusal.status));
                    tracing::info!(
                        status = refusal.status,
                        path = input.path,
                        "refused: {}",
                        e.message
                    );
                    exchange.answer(Err(&refusal))
                }
            },
            Ok(Step::Responded {
                replies,
                served,
                status,
            }) => {
                if let Some(h) = &mut held {
                    h.responded(&gw, served.as_deref(), status);
                }
                replies
            }
            Err(e) => {
                gw.metrics.record_epp_exchange("failed");
                let _ = tx.send(Err(Status::invalid_argument(e.to_string()))).await;
                break;
            }
        };
        for reply in replies {
            if tx.send(Ok(reply)).await.is_err() {
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let (tx, rx) = mpsc::channel(32);
        tokio::spawn(run_exchange(
            self.picker.clone(),
            self.max_body,
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A self-signed certificate for `infera-epp` (Envoy's GAIE clusters skip verification).
fn self_signed() -> Result<Identity, EppError> {
    let made = rcgen::generate_simple_self_signed(vec!["infera-epp".to_owned()])
        .map_err(|e| EppError::Tls(e.to_string()))?;
    Ok(Identity::from_pem(
        made.cert.pem(),
        made.signing_key.serialize_pem(),
    ))
}

fn identity(gw: &Gateway) -> Result<Option<Identity>, EppError> {
    let cfg = &gw.cfg;
    if !cfg.epp_secure_serving {
        return Ok(None);
    }
    match (&cfg.epp_tls_cert_file, &cfg.epp_tls_key_file) {
        (Some(cert), Some(key)) => {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|e| EppError::Tls(format!("{}: {e}", p.display())))
            };
            Ok(Some(Identity::from_pem(read(cert)?, read(key)?)))
        }
        _ => self_signed().map(Some),
    }
}

/// Marks the health services: live at once, ready once discovery has synced, not ready
/// once the gateway drains.
async fn report_health(
    gw: Arc<Gateway>,
    reporter: HealthReporter,
    mut stop: watch::Receiver<bool>,
) {
    reporter
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    let mut last = None;
    loop {
        let ready = gw.registry.is_synced() && !gw.draining.load(Ordering::Relaxed);
        if last != Some(ready) {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for service in READY_SERVICES {
                reporter.set_service_status(service, status).await;
            }
            last = Some(ready);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The connections of `listener` with Nagle's algorithm off: each reply is a small
/// frame Envoy waits for, and a delayed ACK would hold it back 40 ms.
fn no_delay(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    })
}

async fn bind(what: &'static str, host: &str, port: u16) -> Result<TcpListener, EppError> {
    let addr = format!("{host}:{port}");
    TcpListener::bind(&addr)
        .await
        .map_err(|source| EppError::Bind { what, addr, source })
}

/// Binds the picker's ports and spawns its servers into `tasks` (`--epp-port` set).
pub(crate) async fn start_epp(
    gw: &Arc<Gateway>,
    port: u16,
    tasks: &mut tokio::task::JoinSet<()>,
    stop: &watch::Receiver<bool>,
) -> Result<EppAddrs, EppError> {
    let cfg = &gw.cfg;
    let ext_proc = bind("ext_proc", &cfg.host, port).await?;
    let health = bind("health", &cfg.host, cfg.epp_health_port).await?;
    let addrs = EppAddrs {
        ext_proc: ext_proc.local_addr().map_err(|source| EppError::Bind {
            what: "ext_proc",
            addr: cfg.host.clone(),
            source,
        })?,
        health: health.local_addr().map_err(|source| EppError::Bind {
            what: "health",
            addr: cfg.host.clone(),
            source,
        })?,
    };
    let (reporter, health_service) = tonic_health::server::health_reporter();
    tasks.spawn(report_health(gw.clone(), reporter, stop.clone()));
    let options = PickOptions {
        destination_port: cfg.epp_destination_port,
        fallbacks: cfg.epp_fallbacks,
        max_inflight: cfg.epp_max_inflight_per_worker,
    };
    let picker = Arc::new(Picker::new(gw.clone(), options));
    let service = ExternalProcessorServer::new(Service {
        picker,
        max_body: cfg.max_body_bytes,
    })
    .max_decoding_message_size(cfg.max_body_bytes.saturating_add(1 << 20));
    let mut builder = Server::builder();
    if let Some(identity) = identity(gw)? {
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(identity))
            .map_err(|e| EppError::Tls(e.to_string()))?;
    }
    let router = builder
        .add_service(health_service.clone())
        .add_service(service);
    let mut stopping = stop.clone();
    tasks.spawn(async move {
        let stopped = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        if let Err(e) = router
            .serve_with_incoming_shutdown(no_delay(ext_proc), stopped)
            .await
        {
            tracing::error!("endpoint picker: {e}");
        }
    });
    let mut stopping = stop.clone();
    tasks.spawn(async move {
        let stopped = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        if let Err(e) = Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(no_delay(health), stopped)
            .await
        {
            tracing::error!("endpoint picker health: {e}");
        }
    });
    tracing::info!(
        ext_proc = %addrs.ext_proc,
        health = %addrs.health,
        tls = cfg.epp_secure_serving,
        "endpoint picker serving (Envoy ext_proc, GAIE's endpoint-picker protocol)"
    );
    Ok(addrs)
}
