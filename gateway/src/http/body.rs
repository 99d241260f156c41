//! Reading a request body within the gateway's bounds: bytes, time, and JSON values and
//! depth (checked before anything parses it).

use crate::offload::off_workers;
use crate::request::json_limits::{JsonLimits, check_json_limits};
use crate::state::Gateway;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use infera_proto::error_class::{ApiError, ErrorClass};
use std::time::Duration;

/// Reads the body: 413 past the byte limit (at once when `Content-Length` declares it),
/// 408 when it does not arrive within `--body-read-timeout-s`, 400 past the JSON limits.
pub(crate) async fn read_body(
    gw: &Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = gw.cfg.max_body_bytes;
    let too_large = || {
        ApiError::new(
            ErrorClass::PayloadTooLarge,
            format!("request body is larger than the gateway's limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let timeout = Duration::from_secs_f64(gw.cfg.body_read_timeout_s.max(0.0));
    let bytes = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorClass::RequestTimeout,
                format!("request body did not arrive within {timeout:?} (--body-read-timeout-s)"),
            )
        })?
        .map_err(|_| too_large())?;
    let limits = JsonLimits {
        max_values: gw.cfg.max_request_values,
        max_depth: gw.cfg.max_request_depth,
    };
    off_workers(bytes.len(), || check_json_limits(&bytes, limits)).map_err(|e| e.to_api_error())?;
    Ok(bytes)
}
