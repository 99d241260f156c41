//! `infera-telemetry`: what every Infera binary shares to be observed. [`metrics`]
//! registers and renders Prometheus metrics through `prometheus-client`; [`logging`]
//! installs the log subscriber and, when asked, OpenTelemetry span export over OTLP;
//! [`propagation`] carries W3C trace context from clients through the gateway to the
//! engines.

pub mod logging;
pub mod metrics;
pub mod propagation;

pub use logging::{LogOptions, Telemetry, TelemetryError, init};
