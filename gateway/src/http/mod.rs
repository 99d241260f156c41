//! The HTTP front: the listener (connections, header deadlines, TLS), the layers around
//! the routes (API keys, admission, draining), one module per API (OpenAI, Anthropic),
//! the gateway's own views, the earlier server's cache and control endpoints, and the
//! pipeline every API shares between parsing a request and rendering its answer. It parses and renders; choosing is `route/`, sending is
//! `send/`.

pub(crate) mod admin;
pub(crate) mod anthropic;
pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod control;
pub(crate) mod errors;
pub(crate) mod listener;
pub(crate) mod middleware;
pub(crate) mod openai;
pub(crate) mod pipeline;
pub(crate) mod reload;
pub(crate) mod tls;

use crate::state::Gateway;
use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use std::sync::Arc;

/// The state every handler shares.
pub(crate) type Shared = Arc<Gateway>;

/// The gateway's routes.
pub(crate) fn build_router(gw: Shared) -> Router {
    let served = Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .layer(from_fn_with_state(gw.clone(), middleware::admit));
    let api = Router::new()
        .merge(served)
        .route("/v1/models", get(admin::models))
        .route("/v1/workers", get(admin::workers))
        .route("/v1/kv-stats", get(control::kv_stats))
        .route("/v1/admin/cache-view/{worker_id}", get(control::cache_view))
        .route("/v1/cache/prewarm", post(control::prewarm))
        .route("/v1/admin/profile/start", post(control::profile_start))
        .route("/v1/admin/profile/stop", post(control::profile_stop))
        .route(
            "/v1/admin/scale",
            get(control::scale_get).post(control::scale_post),
        )
        .layer(from_fn_with_state(gw.clone(), middleware::require_auth));
    Router::new()
        .merge(api)
        .route("/health", get(admin::health))
        .route("/infera/tokenizer", get(admin::tokenizer))
        .route("/ready", get(admin::ready))
        .route(
            "/metrics",
            get(admin::metrics).layer(from_fn_with_state(gw.clone(), middleware::metrics_auth)),
        )
        .fallback(errors::unknown_route)
        .method_not_allowed_fallback(errors::method_not_allowed)
        .layer(from_fn_with_state(
            gw.clone(),
            middleware::close_when_draining,
        ))
        .with_state(gw)
}
