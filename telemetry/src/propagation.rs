//! W3C trace context (`traceparent`, `tracestate`) through the gateway: a client's
//! context becomes the parent of the gateway's request span, and every request to a
//! worker carries the context of the span that sends it, so the engine's spans (vLLM's
//! and SGLang's OpenTelemetry tracing read `traceparent`) join the same trace. Without
//! span export the client's headers are passed through unchanged.

use crate::logging::spans_exported;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The trace-context headers, in the order they are sent.
pub const TRACE_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
];

/// The trace-context headers a request arrived with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceContext {
    incoming: Vec<(HeaderName, HeaderValue)>,
}

struct Extract<'h>(&'h HeaderMap);

impl Extractor for Extract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct Inject<'v>(&'v mut Vec<(HeaderName, HeaderValue)>);

impl Injector for Inject<'_> {
    fn set(&mut self, key: &str, value: String) {
        if value.is_empty() {
            return;
        }
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.push((k, v));
        }
    }
}

impl TraceContext {
    /// Reads the context `headers` carry and, when spans are exported, makes it the
    /// parent of `span`.
    pub fn adopt(span: &tracing::Span, headers: &HeaderMap) -> Self {
        let incoming = TRACE_HEADERS
            .iter()
            .filter_map(|name| Some((name.clone(), headers.get(name)?.clone())))
            .collect();
        if spans_exported() {
            let parent =
                opentelemetry::global::get_text_map_propagator(|p| p.extract(&Extract(headers)));
            let _ = span.set_parent(parent);
        }
        Self { incoming }
    }

    /// The headers for a request to a worker sent within `span`.
    pub fn upstream_headers(&self, span: &tracing::Span) -> Vec<(HeaderName, HeaderValue)> {
        if !spans_exported() {
            return self.incoming.clone();
        }
        let mut out = Vec::with_capacity(2);
        let context = span.context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&context, &mut Inject(&mut out));
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_export_the_clients_context_passes_through() {
        let mut headers = HeaderMap::new();
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        headers.insert("traceparent", HeaderValue::from_static(parent));
        headers.insert("tracestate", HeaderValue::from_static("fixture=1"));
        headers.insert("x-other", HeaderValue::from_static("y"));
        let cx = TraceContext::adopt(&tracing::Span::none(), &headers);
        let sent = cx.upstream_headers(&tracing::Span::none());
        assert_eq!(
            sent,
            vec![
                (TRACE_HEADERS[0].clone(), HeaderValue::from_static(parent)),
                (
                    TRACE_HEADERS[1].clone(),
                    HeaderValue::from_static("fixture=1")
                ),
            ]
        );
        let none = TraceContext::adopt(&tracing::Span::none(), &HeaderMap::new());
        assert!(none.upstream_headers(&tracing::Span::none()).is_empty());
    }
}
