//! The layers around the routes: API keys on the API (and on `/metrics` with
//! `--metrics-require-auth`), admission (`--max-concurrent-requests`), and closing
//! connections while the gateway drains.

use crate::http::Shared;
use crate::http::auth::{key_accepted, presented_keys};
use crate::http::errors::{error_response, request_id, shape_of};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;
use infera_proto::error_class::{ApiError, ErrorClass};

/// While the gateway shuts down, every response asks the client to close its
/// connection, so its next request opens a new one, which the Service sends to a
/// replica that stays.
pub(crate) async fn close_when_draining(
    State(gw): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if gw.draining.load(std::sync::atomic::Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// `/metrics` (it lists worker addresses) behind the API keys with `--metrics-require-auth`.
pub(crate) async fn metrics_auth(State(gw): State<Shared>, req: Request, next: Next) -> Response {
    if gw.cfg.metrics_require_auth {
        require_auth(State(gw), req, next).await
    } else {
        next.run(req).await
    }
}

/// Admission control: a request is served only with a permit, held until the last byte
/// of its answer (streams included); without one it is refused at once with 429 and
/// `Retry-After`, before its body is read.
pub(crate) async fn admit(State(gw): State<Shared>, req: Request, next: Next) -> Response {
    let Some(admission) = &gw.admission else {
        return next.run(req).await;
    };
    let Ok(permit) = admission.clone().try_acquire_owned() else {
        gw.metrics.record_admission_refused();
        let err = ApiError::new(
            ErrorClass::RateLimited,
            format!(
                "the gateway is serving its limit of {} requests (--max-concurrent-requests); retry shortly",
                gw.cfg.max_concurrent_requests
            ),
        );
        return error_response(&err, shape_of(req.uri().path()), &request_id(req.headers()));
    };
    let (parts, body) = next.run(req).await.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &permit;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

pub(crate) async fn require_auth(State(gw): State<Shared>, req: Request, next: Next) -> Response {
    let Some(keys) = &gw.api_keys else {
        return next.run(req).await;
    };
    let keys = keys.load();
    if presented_keys(req.headers()).any(|k| key_accepted(&keys, k)) {
        return next.run(req).await;
    }
    let shape = shape_of(req.uri().path());
    let err = ApiError::new(
        ErrorClass::Unauthorized,
        "missing or unknown API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>') with a key from the gateway's keys file",
    );
    error_response(&err, shape, &request_id(req.headers()))
}
