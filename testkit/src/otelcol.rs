//! A real OpenTelemetry Collector (`testenv/otelcol`: the OTLP receiver and the file
//! exporter) on loopback, receiving OTLP/HTTP and writing every span it gets to a
//! JSON-lines file, which [`OtelCollector::spans`] reads back. Killed on drop.

use crate::TestEnvError;
use crate::binaries::{Binary, locate};
use crate::process::{ServerProcess, free_port};
use serde_json::Value;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// A running collector.
#[derive(Debug)]
pub struct OtelCollector {
    port: u16,
    dir: TempDir,
    process: ServerProcess,
}

/// One received span with its resource's `service.name` and attributes flattened.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// `service.name` of the exporting process.
    pub service: String,
    /// Span name.
    pub name: String,
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex parent span id (empty for a root).
    pub parent_span_id: String,
    /// OTLP span kind (2 server, 3 client).
    pub kind: u64,
    /// Attributes, each value as its string form.
    pub attributes: Vec<(String, String)>,
    /// Event names, in order.
    pub events: Vec<String>,
    /// OTLP status code (0 unset, 1 ok, 2 error).
    pub status_code: u64,
}

impl ReceivedSpan {
    /// An attribute's value.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn prepare(message: String) -> TestEnvError {
    TestEnvError::Prepare {
        name: "otelcol",
        message,
    }
}

impl OtelCollector {
    /// Starts the collector on a free port and waits until the receiver listens.
    pub fn start() -> Result<Self, TestEnvError> {
        let binary = locate(Binary::Otelcol)?;
        let dir = tempfile::Builder::new()
            .prefix("infera-otelcol-")
            .tempdir()
            .map_err(|e| prepare(e.to_string()))?;
        let port = free_port().map_err(|e| prepare(e.to_string()))?;
        // `rotation` makes the file exporter write unbuffered: a span is in the file by
        // the time its export is acknowledged. `level: none` keeps the collector's own
        // metrics endpoint (a fixed port) closed.
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
             exporters:\n  file:\n    path: {}\n    rotation:\n      max_megabytes: 100\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
            dir.path().join("spans.jsonl").display()
        );
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config).map_err(|e| prepare(e.to_string()))?;
        let args = vec![format!("--config={}", config_path.display())];
        let mut process = ServerProcess::start(&binary, &args, &dir.path().join("otelcol.log"))
            .map_err(|source| TestEnvError::Spawn {
                name: "otelcol",
                source,
            })?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() >= deadline || process.exited().is_some() {
                return Err(TestEnvError::NotReady {
                    name: "otelcol",
                    seconds: 20,
                    last_error: format!("nothing listens on 127.0.0.1:{port}"),
                    log_tail: process.log_tail(20),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self { port, dir, process })
    }

    /// The OTLP/HTTP traces endpoint.
    pub fn traces_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.port)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        let text = std::fs::read_to_string(self.dir.path().join("spans.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .flat_map(|export| read_spans(&export))
            .collect()
    }

    /// The end of the collector's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

fn string_form(value: &Value) -> String {
    value
        .as_object()
        .and_then(|o| o.values().next())
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}

fn attributes(list: Option<&Value>) -> Vec<(String, String)> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["key"].as_str().unwrap_or_default().to_owned(),
                string_form(&a["value"]),
            )
        })
        .collect()
}

/// The spans of one OTLP/JSON export request.
fn read_spans(export: &Value) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource in export["resourceSpans"].as_array().into_iter().flatten() {
        let service = attributes(resource.pointer("/resource/attributes"))
            .into_iter()
            .find(|(k, _)| k == "service.name")
            .map(|(_, v)| v)
            .unwrap_or_default();
        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
            for span in scope["spans"].as_array().into_iter().flatten() {
                let text = |key: &str| span[key].as_str().unwrap_or_default().to_owned();
                out.push(ReceivedSpan {
                    service: service.clone(),
                    name: text("name"),
                    trace_id: text("traceId"),
                    span_id: text("spanId"),
                    parent_span_id: text("parentSpanId"),
                    kind: span["kind"].as_u64().unwrap_or(0),
                    attributes: attributes(span.get("attributes")),
                    events: span["events"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|e| e["name"].as_str().map(str::to_owned))
                        .collect(),
                    status_code: span
                        .pointer("/status/code")
                        .and_then(Value::as_u64)
                        .unwrap_or(0),
                });
            }
        }
    }
    out
}
