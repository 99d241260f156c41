//! The gateway's own views: `/v1/models`, `/v1/workers` (the earlier server's entries
//! plus breaker, health and in-flight state), `/health`, `/ready`, `/infera/tokenizer`
//! and `/metrics`. The cache view is in `control`, with the earlier server's other
//! cache and control endpoints.

use crate::http::Shared;
use crate::http::auth::{key_accepted, presented_keys};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use infera_proto::worker::{WorkerRecord, WorkerStatus};
use serde_json::{Value, json};
use std::time::Instant;

pub(crate) async fn models(State(gw): State<Shared>) -> Response {
    let snap = gw.registry.snapshot();
    let data: Vec<Value> = snap
        .model_names()
        .into_iter()
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "infera"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// One `/v1/workers` entry: the earlier server's fields under their earlier names
/// (`status` active/draining/dead, `disagg_meta` as registered or `{}`, `dp_size` as
/// registered), then this gateway's own (`state` with the breaker and the health checks
/// folded in, `breaker`, `health`: `passing`, `failing` or `unchecked`, `inflight`).
pub(crate) fn build_worker_entry(
    w: &WorkerRecord,
    status: WorkerStatus,
    breaker: (&str, u64),
    health: &str,
    inflight: u64,
) -> Value {
    let (breaker_state, trips) = breaker;
    let state = match status {
        WorkerStatus::Active if breaker_state == "closed" && health != "failing" => "active",
        WorkerStatus::Active => "degraded",
        other => other.as_str(),
    };
    json!({
        "worker_id": w.worker_id,
        "url": w.url,
        "model_name": w.model_name,
        "engine": w.engine,
        "status": status.as_str(),
        "disagg_mode": w.disagg_mode,
        "disagg_meta": w.disagg_meta_view(),
        "kv_events_endpoint": w.kv_events_endpoint,
        "kv_block_size": w.kv_block_size,
        "dp_rank": w.dp_rank,
        "dp_size": w.dp_size,
        "state": state,
        "breaker": {"state": breaker_state, "trips": trips},
        "health": health,
        "inflight": inflight,
    })
}

pub(crate) async fn workers(State(gw): State<Shared>) -> Response {
    let snap = gw.registry.snapshot();
    let now = Instant::now();
    let checked = gw.cfg.health_check_interval_s > 0.0;
    let list: Vec<Value> = snap
        .workers
        .values()
        .map(|w| {
            let breaker = gw.breakers.get(&w.worker_id);
            let state = breaker.as_ref().map_or("closed", |b| b.state(now).name());
            let health = match (checked, gw.breakers.health_failing(&w.worker_id)) {
                (false, _) => "unchecked",
                (true, false) => "passing",
                (true, true) => "failing",
            };
            build_worker_entry(
                w,
                snap.status(&w.worker_id).unwrap_or_default(),
                (state, breaker.map_or(0, |b| b.trips())),
                health,
                gw.inflight.get(&w.worker_id),
            )
        })
        .collect();
    axum::Json(json!({"workers": list, "synced": gw.registry.is_synced()})).into_response()
}

/// `/health`: the earlier server's answer, `active_workers` counting the workers that
/// take requests over all models.
pub(crate) async fn health(State(gw): State<Shared>) -> Response {
    let active = gw.registry.snapshot().active_workers();
    axum::Json(json!({"status": "ok", "active_workers": active})).into_response()
}

/// `/infera/tokenizer`: where kv-aware routing's tokenizer stands (the operator reads it
/// into the deployment's `TokenizerLoaded` condition).
/// With `--metrics-require-auth` a caller without a key gets the state without worker
/// addresses.
pub(crate) async fn tokenizer(State(gw): State<Shared>, headers: HeaderMap) -> Response {
    let state = gw.tokenizer.load();
    let keyed = gw.api_keys.as_ref().is_some_and(|keys| {
        let keys = keys.load();
        presented_keys(&headers).any(|k| key_accepted(&keys, k))
    });
    if gw.cfg.metrics_require_auth && !keyed {
        axum::Json(state.redacted()).into_response()
    } else {
        axum::Json(&**state).into_response()
    }
}

pub(crate) async fn ready(State(gw): State<Shared>) -> Response {
    if gw.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "shutting down"})),
        )
            .into_response();
    }
    if gw.registry.is_synced() {
        let n = gw.registry.snapshot().workers.len();
        axum::Json(json!({"status": "ready", "workers": n})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "discovery has not synced yet"})),
        )
            .into_response()
    }
}

pub(crate) async fn metrics(State(gw): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            infera_telemetry::metrics::CONTENT_TYPE,
        )],
        gw.metrics_text(),
    )
        .into_response()
}
