//! Logging and trace set-up, the same for every binary: logs on stderr (plain or
//! JSON), filtered by `RUST_LOG` or the binary's default, and, when an OTLP endpoint is
//! given, every span exported as OpenTelemetry over OTLP/HTTP (protobuf) in batches,
//! with W3C trace context as the propagator. Export is off by default, and has its own
//! filter ([`SPAN_EVENTS`]), so `RUST_LOG` changes the logs, not the traces.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How a binary logs and traces.
#[derive(Debug, Clone, Default)]
pub struct LogOptions {
    /// `service.name` of exported spans (the binary's name).
    pub service: &'static str,
    /// The filter without `RUST_LOG` (e.g. `info,kube_runtime=warn`).
    pub default_filter: String,
    /// One JSON object per line instead of text.
    pub json: bool,
    /// Text without targets, in colour on a terminal (an interactive command's output).
    pub terse: bool,
    /// OTLP/HTTP traces endpoint, the whole URL (`http://collector:4318/v1/traces`);
    /// `None`: no export.
    pub otlp_traces_endpoint: Option<String>,
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter could not be built (a malformed endpoint).
    #[error("the OTLP trace exporter for {endpoint}: {source}")]
    BuildExporter {
        /// The endpoint given.
        endpoint: String,
        /// The exporter's error.
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// A subscriber was already installed.
    #[error("installing the log subscriber: {0}")]
    Install(#[from] tracing_subscriber::util::TryInitError),
}

/// Keeps the trace exporter running; dropping it sends the spans still buffered.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Longest wait for the last spans to be sent at exit.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

impl Drop for Telemetry {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        // On a thread of its own: the exporter blocks, and this may run on an async
        // worker; a collector that does not answer delays the exit by FLUSH_TIMEOUT at most.
        let (done, flushed) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(provider.shutdown());
        });
        match flushed.recv_timeout(FLUSH_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("flushing the last spans: {e}"),
            Err(_) => eprintln!("flushing the last spans: no answer within {FLUSH_TIMEOUT:?}"),
        }
    }
}

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (OTLP on): trace context sent upstream is then the
/// gateway's own span's rather than the client's, passed through.
pub fn spans_exported() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Installs logging (and span export) for the process.
pub fn init(options: LogOptions) -> Result<Telemetry, TelemetryError> {
    let filter = || {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new(&options.default_filter))
    };
    // An empty value (an unset Helm value rendered as "") means no export.
    let endpoint = options
        .otlp_traces_endpoint
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty());
    let provider = match endpoint {
        Some(endpoint) => Some(build_provider(options.service, endpoint)?),
        None => None,
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(options.service))
            .with_tracked_inactivity(false)
            .with_filter(filter_fn(exported))
    });
    let json = options.json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter())
    });
    let text = (!options.json).then(|| {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(terminal)
            .with_target(!options.terse)
            .with_filter(filter())
    });
    tracing_subscriber::registry()
        .with(json)
        .with(text)
        .with(otel)
        .try_init()?;
    if provider.is_some() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        EXPORTING.store(true, Ordering::Relaxed);
    }
    Ok(Telemetry { provider })
}

/// Target of the events that mark a span's moments (first byte, completion): exported
/// as span events, logged only when `RUST_LOG` asks for them.
pub const SPAN_EVENTS: &str = "infera::span";

/// What span export sees, whatever the log filter: spans at info and above, the span
/// events of [`SPAN_EVENTS`], and warnings and errors.
fn exported(meta: &tracing::Metadata<'_>) -> bool {
    if meta.is_span() {
        *meta.level() <= tracing::Level::INFO
    } else {
        meta.target() == SPAN_EVENTS || *meta.level() <= tracing::Level::WARN
    }
}

fn build_provider(
    service: &'static str,
    endpoint: &str,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .build()
        .map_err(|source| TelemetryError::BuildExporter {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}
