//! The sidecar's own HTTP endpoints: `/health` (registration and drain state),
//! `/ready` (200 while the worker is registered and not draining: the pod's readiness,
//! so a Ready pod is one the gateways route to), `/metrics`, and `/drain`, which an engine container's `preStop` hook calls: it starts
//! the shutdown (deregister, then drain) and answers only once the engine is idle, so
//! Kubernetes stops the engine after it has left routing.

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use subtle::ConstantTimeEq;
use tokio::sync::{Notify, watch};

/// State the endpoints show and the main task updates.
#[derive(Debug)]
pub struct SidecarStatus {
    /// The record is registered.
    pub registered: AtomicBool,
    /// Registrations so far.
    pub registrations: AtomicU64,
    /// When the current registration was made (lease granted or annotation written).
    pub registered_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// A shutdown (SIGTERM or `/drain`) is under way.
    pub draining: AtomicBool,
    /// KV-event batches relayed.
    pub relayed: AtomicU64,
    /// Asks the main task to shut down.
    pub drain_requested: Notify,
    /// Turns true once the engine is drained.
    pub drained: watch::Sender<bool>,
    /// What a `/drain` caller outside the loopback must present (`None`: loopback only).
    pub drain_token: Option<String>,
}

impl SidecarStatus {
    /// Fresh state; `/drain` from outside the loopback needs `drain_token`.
    pub fn new(drain_token: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            registered: AtomicBool::new(false),
            registrations: AtomicU64::new(0),
            registered_at: std::sync::Mutex::new(None),
            draining: AtomicBool::new(false),
            relayed: AtomicU64::new(0),
            drain_requested: Notify::new(),
            drained: watch::channel(false).0,
            drain_token,
        })
    }
}

type Shared = Arc<SidecarStatus>;

/// The status routes.
pub fn build_status_router(status: Shared) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/drain", get(drain).post(drain))
        .with_state(status)
}

impl SidecarStatus {
    /// Seconds since the current registration, if registered.
    pub fn registration_age(&self) -> Option<f64> {
        if !self.registered.load(Ordering::SeqCst) {
            return None;
        }
        self.registered_at
            .lock()
            .ok()?
            .map(|t| t.elapsed().as_secs_f64())
    }

    /// Records a (re)registration or its loss.
    pub fn set_registered(&self, registered: bool, registrations: u64) {
        let before = self.registrations.swap(registrations, Ordering::SeqCst);
        if registered
            && (before != registrations || !self.registered.load(Ordering::SeqCst))
            && let Ok(mut at) = self.registered_at.lock()
        {
            *at = Some(std::time::Instant::now());
        }
        self.registered.store(registered, Ordering::SeqCst);
    }
}

impl SidecarStatus {
    /// Registered and not draining: gateways route to the worker.
    pub fn routable(&self) -> bool {
        self.registered.load(Ordering::SeqCst) && !self.draining.load(Ordering::SeqCst)
    }
}

async fn ready(State(s): State<Shared>) -> Response {
    let routable = s.routable();
    let status = if routable {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(json!({"ready": routable}))).into_response()
}

async fn health(State(s): State<Shared>) -> Response {
    axum::Json(json!({
        "registered": s.registered.load(Ordering::SeqCst),
        "registration_age_s": s.registration_age(),
        "registrations": s.registrations.load(Ordering::SeqCst),
        "draining": s.draining.load(Ordering::SeqCst),
    }))
    .into_response()
}

async fn metrics(State(s): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            infera_telemetry::metrics::CONTENT_TYPE,
        )],
        render_metrics(&s),
    )
        .into_response()
}

/// The sidecar's `/metrics`: registration, drain and relay state, read now.
pub fn render_metrics(s: &SidecarStatus) -> String {
    let mut scraped = infera_telemetry::metrics::ScrapeValues::default();
    scraped.gauge(
        "infera_sidecar_registered",
        "Whether the worker record is registered.",
        i64::from(s.registered.load(Ordering::SeqCst)),
    );
    scraped.counter(
        "infera_sidecar_registrations_total",
        "Times the record was registered.",
        s.registrations.load(Ordering::SeqCst),
    );
    scraped.gauge(
        "infera_sidecar_registration_age_seconds",
        "Seconds since the current registration (lease granted or annotation written).",
        s.registration_age().unwrap_or(0.0),
    );
    scraped.gauge(
        "infera_sidecar_draining",
        "Whether a drain is under way.",
        i64::from(s.draining.load(Ordering::SeqCst)),
    );
    scraped.counter(
        "infera_sidecar_kv_events_relayed_total",
        "KV-event batches relayed to NATS.",
        s.relayed.load(Ordering::SeqCst),
    );
    infera_telemetry::metrics::render(&Default::default(), scraped)
}

pub use infera_proto::sidecar::{DRAIN_TOKEN_ENV, DRAIN_TOKEN_HEADER};

/// Whether a `/drain` from `peer` presenting `headers` may take this worker out of
/// routing: anyone on the loopback (the Pod itself), others only with the token.
pub fn drain_allowed(peer: IpAddr, headers: &HeaderMap, token: Option<&str>) -> bool {
    if peer.is_loopback() || peer.to_canonical().is_loopback() {
        return true;
    }
    let presented = headers
        .get(DRAIN_TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    token.is_some_and(|t| bool::from(t.as_bytes().ct_eq(presented)))
}

async fn drain(
    State(s): State<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if !drain_allowed(peer.ip(), &headers, s.drain_token.as_deref()) {
        tracing::warn!(
            "refused /drain from {peer}: not loopback and no valid {DRAIN_TOKEN_HEADER}"
        );
        let body = json!({"error": {
            "message": format!("/drain takes this worker out of routing: callers outside the Pod send {DRAIN_TOKEN_HEADER}"),
            "type": "permission_error",
            "code": "forbidden",
        }});
        return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    }
    s.drain_requested.notify_one();
    let mut drained = s.drained.subscribe();
    let _ = drained.wait_for(|d| *d).await;
    axum::Json(json!({"drained": true})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_registered_and_not_draining() {
        let s = SidecarStatus::new(None);
        assert!(!s.routable(), "not registered yet");
        s.registered.store(true, Ordering::SeqCst);
        assert!(s.routable());
        s.draining.store(true, Ordering::SeqCst);
        assert!(!s.routable(), "draining");
    }

    #[test]
    fn drain_from_outside_the_pod_needs_the_exact_token() {
        let with = |token: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(t) = token {
                h.insert(DRAIN_TOKEN_HEADER, t.parse().unwrap());
            }
            h
        };
        let node: IpAddr = "10.244.0.1".parse().unwrap();
        for loopback in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            let ip: IpAddr = loopback.parse().unwrap();
            assert!(drain_allowed(ip, &with(None), None), "{loopback}");
            assert!(drain_allowed(ip, &with(None), Some("t0ken")), "{loopback}");
        }
        assert!(drain_allowed(node, &with(Some("t0ken")), Some("t0ken")));
        for (presented, configured) in [
            (None, Some("t0ken")),
            (Some("t0ke"), Some("t0ken")),
            (Some("t0kenX"), Some("t0ken")),
            (Some(""), Some("t0ken")),
            (Some("t0ken"), None),
            (None, None),
        ] {
            assert!(
                !drain_allowed(node, &with(presented), configured),
                "{presented:?} against {configured:?}"
            );
        }
    }
}
