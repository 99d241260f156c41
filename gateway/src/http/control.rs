//! The earlier server's cache and control endpoints, answered as it answered them
//! (paths, bodies, status codes and error bytes, pinned by
//! `gateway/testdata/earlier_server/fixtures.json`): `GET /v1/kv-stats`,
//! `GET /v1/admin/cache-view/{worker_id}[?dp_rank=N]`, `POST /v1/cache/prewarm`,
//! `POST /v1/admin/profile/{start,stop}` and `GET`/`POST /v1/admin/scale`. All sit
//! behind the API keys (the earlier server had none; these act on the fleet).

use crate::config::KvEventTransport;
use crate::control::prewarm::{PrewarmError, send_to_sidecars, send_to_socket, sidecar_targets};
use crate::control::profile::{fan_out, select_targets};
use crate::http::Shared;
use crate::http::errors::detail_response;
use crate::request::control::{
    dp_rank_error, parse_dp_rank, parse_prewarm, parse_profile, parse_scale, prewarm_accepted_body,
    validate_scale,
};
use crate::route::kv_state::{IndexStats, IngestCounters};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// `/v1/kv-stats` (`infera/kv/api.py:78-128`): the index, writer and subscriber
/// counters under the earlier names, and the reconciler's with ZMQ KV events. Here the
/// index is the router's prefix index, the writer and subscribers its KV-event ingest,
/// the reconciler the replays from the engines' replay sockets.
pub(crate) fn build_kv_stats(
    index: IndexStats,
    ingest: &IngestCounters,
    endpoints: Vec<String>,
    zmq: bool,
) -> Value {
    let n = IngestCounters::get;
    let mut out = json!({
        "index": {
            "nodes": index.nodes,
            "confirmed_nodes": index.confirmed_nodes,
            "optimistic_nodes": index.optimistic_nodes,
            "publishers": index.publishers,
            "models": index.models,
            "compat_keys": index.compat_keys,
        },
        "writer": {
            "batches_applied": n(&ingest.batches_decoded),
            "events_applied_stored": n(&ingest.stored_applied),
            "events_applied_removed": n(&ingest.removed_applied),
            "events_applied_cleared": n(&ingest.cleared_applied),
            "events_dropped_unknown_role": 0,
            "events_dropped_unknown_tier": 0,
            "events_dropped_malformed": n(&ingest.events_skipped),
        },
        "subscribers": {
            "endpoints": endpoints,
            "batches_received": n(&ingest.batches_received),
            "batches_decoded": n(&ingest.batches_decoded),
            "events_received": n(&ingest.events_received),
            "batches_dropped_overload": 0,
            "batches_dropped_malformed": n(&ingest.batches_undecodable),
            "batches_dropped_version": 0,
        },
    });
    if zmq && let Some(map) = out.as_object_mut() {
        map.insert(
            "reconciler".into(),
            json!({
                "snapshots_pulled": n(&ingest.replays_pulled),
                "snapshots_applied": n(&ingest.replays_applied),
                "snapshots_failed": n(&ingest.replays_failed),
                "snapshots_stale": n(&ingest.replays_stale),
            }),
        );
    }
    out
}

pub(crate) async fn kv_stats(State(gw): State<Shared>) -> Response {
    let zmq = gw.cfg.kv_event_transport == KvEventTransport::Zmq;
    let body = match &gw.kv {
        Some(kv) => {
            let snap = gw.registry.snapshot();
            let endpoints = kv
                .ingest
                .endpoints
                .lock()
                .map(|e| e.clone())
                .unwrap_or_default();
            build_kv_stats(
                kv.index_stats(snap.workers.values().map(|w| &**w)),
                &kv.ingest,
                endpoints,
                zmq,
            )
        }
        // Not kv-aware: no index and no ingest, as a fresh earlier server reported.
        None => build_kv_stats(
            IndexStats::default(),
            &IngestCounters::default(),
            Vec::new(),
            zmq,
        ),
    };
    axum::Json(body).into_response()
}

/// `/v1/admin/cache-view/{worker_id}[?dp_rank=N]` (`app.py:110-117`): the blocks the
/// router believes the worker's rank holds (rank 0 when none is given; 0 for a worker
/// or rank it does not know). `?targets=true`, this gateway's own, adds each target's
/// blocks, load and where its view comes from.
pub(crate) async fn cache_view(
    State(gw): State<Shared>,
    Path(worker_id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let last = |name: &str| {
        query
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let rank = match last("dp_rank") {
        None => None,
        Some(raw) => match parse_dp_rank(raw) {
            Some(rank) => Some(rank),
            None => {
                return (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    axum::Json(dp_rank_error(raw)),
                )
                    .into_response();
            }
        },
    };
    let Some(kv) = &gw.kv else {
        return detail_response(StatusCode::SERVICE_UNAVAILABLE, "KV-aware mode disabled");
    };
    let snap = gw.registry.snapshot();
    let record = snap.workers.get(&worker_id).map(|w| &**w);
    let blocks = match rank.as_deref() {
        None => kv.blocks_of(record, None),
        // A rank past any integer here is a rank no worker has.
        Some(r) => r.parse().map_or(0, |n| kv.blocks_of(record, Some(n))),
    };
    // Written out by hand: the rank goes back as the client wrote it, an integer of any
    // size (serde_json would turn one past 64 bits into a float).
    let mut body = format!(
        "{{\"worker_id\":{},\"dp_rank\":{},\"block_count\":{blocks}",
        json!(worker_id),
        rank.as_deref().unwrap_or("null"),
    );
    if last("targets") == Some("true")
        && let Some(record) = record
        && let Value::Object(detail) = kv.cache_view(record)
    {
        for key in ["kv_block_size", "source", "targets"] {
            if let Some(v) = detail.get(key) {
                body.push_str(&format!(",{}:{v}", json!(key)));
            }
        }
    }
    body.push('}');
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `POST /v1/cache/prewarm` (`app.py:318-406`): the hint checked as before, then left
/// with kvd (`control::prewarm`); 202 with the earlier server's own bytes.
pub(crate) async fn prewarm(State(gw): State<Shared>, body: Bytes) -> Response {
    let accepted = |n: usize| {
        (
            StatusCode::ACCEPTED,
            [(header::CONTENT_TYPE, "application/json")],
            prewarm_accepted_body(n),
        )
            .into_response()
    };
    let hint = match parse_prewarm(&body) {
        Ok(Some(hint)) => hint,
        Ok(None) => return accepted(0),
        Err(e) => return detail_response(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let sent = match (&gw.cfg.kvd_socket_path, gw.cfg.sidecar_port()) {
        (Some(socket), _) => send_to_socket(socket, &hint).await,
        (None, Some(port)) => {
            let targets = sidecar_targets(&gw.registry.snapshot(), &hint.model, port);
            send_to_sidecars(&gw.client, &targets, &hint, gw.drain_token.as_deref()).await
        }
        (None, None) => Err(PrewarmError::Unconfigured),
    };
    match sent {
        Ok(()) => accepted(hint.keys.len()),
        Err(e) => detail_response(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

async fn profile(gw: Shared, action: &str, query: &[(String, String)], body: &[u8]) -> Response {
    if !gw.cfg.enable_profiling {
        return detail_response(
            StatusCode::FORBIDDEN,
            "profiling disabled; start the server with --enable-profiling",
        );
    }
    let request = match parse_profile(query, body) {
        Ok(r) => r,
        Err(message) => return detail_response(StatusCode::BAD_REQUEST, &message),
    };
    let targets = select_targets(&gw.registry.snapshot(), &request);
    if targets.is_empty() {
        return detail_response(
            StatusCode::NOT_FOUND,
            "no active worker matched the given worker_id/model/role",
        );
    }
    axum::Json(fan_out(&gw.profile_client, &targets, action, &request.forward).await)
        .into_response()
}

/// `POST /v1/admin/profile/start` (`app.py:128-176`).
pub(crate) async fn profile_start(
    State(gw): State<Shared>,
    Query(query): Query<Vec<(String, String)>>,
    body: Bytes,
) -> Response {
    profile(gw, "start", &query, &body).await
}

/// `POST /v1/admin/profile/stop` (`app.py:179-181`).
pub(crate) async fn profile_stop(
    State(gw): State<Shared>,
    Query(query): Query<Vec<(String, String)>>,
    body: Bytes,
) -> Response {
    profile(gw, "stop", &query, &body).await
}

fn scaling_disabled() -> Response {
    detail_response(
        StatusCode::FORBIDDEN,
        "scaling API disabled; start the server with --enable-scaling-api",
    )
}

/// `GET /v1/admin/scale` (`app.py:191-203`).
pub(crate) async fn scale_get(State(gw): State<Shared>) -> Response {
    if !gw.cfg.enable_scaling_api {
        return scaling_disabled();
    }
    match gw.scaler.snapshot().await {
        Ok(snapshot) => axum::Json(snapshot).into_response(),
        Err(e) => detail_response(e.status, &e.message),
    }
}

/// `POST /v1/admin/scale` (`app.py:206-239`).
pub(crate) async fn scale_post(State(gw): State<Shared>, body: Bytes) -> Response {
    if !gw.cfg.enable_scaling_api {
        return scaling_disabled();
    }
    let requested = match parse_scale(&body) {
        Ok(r) => r,
        Err(e) => return detail_response(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if requested.is_empty() {
        return detail_response(StatusCode::BAD_REQUEST, "no services named");
    }
    let known = match gw.scaler.services().await {
        Ok(k) => k,
        Err(e) => return detail_response(e.status, &e.message),
    };
    let counts = match validate_scale(&requested, &known) {
        Ok(c) => c,
        Err(message) => return detail_response(StatusCode::BAD_REQUEST, &message),
    };
    match gw.scaler.scale(&counts).await {
        Ok(snapshot) => axum::Json(snapshot).into_response(),
        Err(e) => detail_response(e.status, &e.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_stats_keep_the_earlier_keys_in_order() {
        let ingest = IngestCounters::default();
        IngestCounters::add(&ingest.batches_received, 3);
        IngestCounters::add(&ingest.batches_decoded, 2);
        IngestCounters::add(&ingest.batches_undecodable, 1);
        let stats = build_kv_stats(
            IndexStats {
                nodes: 5,
                confirmed_nodes: 4,
                optimistic_nodes: 1,
                publishers: 2,
                models: 1,
                compat_keys: 1,
            },
            &ingest,
            vec!["tcp://10.0.0.1:5557".into()],
            true,
        );
        assert_eq!(
            stats.to_string(),
            r#"{"index":{"nodes":5,"confirmed_nodes":4,"optimistic_nodes":1,"publishers":2,"models":1,"compat_keys":1},"writer":{"batches_applied":2,"events_applied_stored":0,"events_applied_removed":0,"events_applied_cleared":0,"events_dropped_unknown_role":0,"events_dropped_unknown_tier":0,"events_dropped_malformed":0},"subscribers":{"endpoints":["tcp://10.0.0.1:5557"],"batches_received":3,"batches_decoded":2,"events_received":0,"batches_dropped_overload":0,"batches_dropped_malformed":1,"batches_dropped_version":0},"reconciler":{"snapshots_pulled":0,"snapshots_applied":0,"snapshots_failed":0,"snapshots_stale":0}}"#
        );
    }
}
