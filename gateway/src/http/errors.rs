//! How the HTTP front answers what it refuses: the one place an [`ApiError`] becomes a
//! response, in the OpenAI or Anthropic error JSON the route speaks, with the request id
//! and, for "not now" answers, `Retry-After`; and the one place a control endpoint's
//! refusal becomes the earlier server's FastAPI `{"detail": ...}` ([`detail_response`]).
//! Also the 404 and 405 fallbacks.

use crate::send::upstream::REQUEST_ID_HEADER;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use infera_proto::error_class::{ApiError, ErrorClass};

/// Which error JSON a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    OpenAi,
    Anthropic,
}

/// The error shape a path speaks.
pub(crate) fn shape_of(path: &str) -> Shape {
    if path == "/v1/messages" {
        Shape::Anthropic
    } else {
        Shape::OpenAi
    }
}

/// An unknown path: 404 in the API's error JSON, as OpenAI answers it.
pub(crate) async fn unknown_route(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let err = ApiError::new(
        ErrorClass::UnknownRoute,
        format!("Invalid URL ({method} {})", uri.path()),
    );
    error_response(&err, shape_of(uri.path()), &request_id(&headers))
}

/// A known path with a method it does not take: 405.
pub(crate) async fn method_not_allowed(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let err = ApiError::new(
        ErrorClass::MethodNotAllowed,
        format!("{} does not accept {method}", uri.path()),
    );
    error_response(&err, shape_of(uri.path()), &request_id(&headers))
}

pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)))
}

/// Returns the request id to the client.
pub(crate) fn with_request_id(mut resp: Response, request_id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

/// A control endpoint's refusal as the earlier server's FastAPI rendered an
/// `HTTPException`: `{"detail": "<message>"}`, compact, with `status`.
pub(crate) fn detail_response(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({"detail": message}))).into_response()
}

pub(crate) fn error_response(err: &ApiError, shape: Shape, request_id: &str) -> Response {
    let status =
        StatusCode::from_u16(err.class.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match shape {
        Shape::OpenAi => err.to_openai_json(),
        Shape::Anthropic => err.to_anthropic_json(),
    };
    let mut resp = with_request_id((status, axum::Json(body)).into_response(), request_id);
    // Both mean "not now": SDKs retry them, sooner with Retry-After.
    if matches!(
        err.class,
        ErrorClass::RateLimited | ErrorClass::ServiceUnavailable
    ) {
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(err.retry_after_s.unwrap_or(1)),
        );
    }
    resp
}
