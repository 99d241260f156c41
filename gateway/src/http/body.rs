//! Reading a request body within the gateway's bounds: bytes, time, and JSON values and
//! depth (checked before anything parses it).

use crate::flow::gate::BodyPermit;
use crate::offload::off_workers;
use crate::request::json_limits::{JsonLimits, check_json_limits};
use crate::state::Gateway;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use bytes::BytesMut;
use futures::StreamExt;
use infera_proto::error_class::{ApiError, ErrorClass};
use std::time::Duration;

/// Reads the body: 413 past the byte limit (at once when `Content-Length` declares it),
/// 408 when it does not arrive within `--body-read-timeout-s`, 400 past the JSON limits.
/// With flow control, its bytes are taken from the body budget as they arrive (the
/// declared length at once): 429 when the gateway holds its budget's worth. The permit
/// returned holds them until dropped.
pub(crate) async fn read_body(
    gw: &Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Option<BodyPermit>), ApiError> {
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
    let mut held = None;
    let budget = gw.flow.as_deref();
    if let (Some(flow), Some(n)) = (budget, declared) {
        flow.take_body_bytes(&mut held, n as usize)?;
    }
    let per_chunk = budget.filter(|_| held.is_none());
    let read = async {
        let mut stream = body.into_data_stream();
        let mut buf = BytesMut::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| too_large())?;
            if buf.len() + chunk.len() > limit {
                return Err(too_large());
            }
            if let Some(flow) = per_chunk {
                flow.take_body_bytes(&mut held, chunk.len())?;
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    };
    let timeout = Duration::from_secs_f64(gw.cfg.body_read_timeout_s.max(0.0));
    let bytes = tokio::time::timeout(timeout, read).await.map_err(|_| {
        ApiError::new(
            ErrorClass::RequestTimeout,
            format!("request body did not arrive within {timeout:?} (--body-read-timeout-s)"),
        )
    })??;
    let limits = JsonLimits {
        max_values: gw.cfg.max_request_values,
        max_depth: gw.cfg.max_request_depth,
    };
    off_workers(bytes.len(), || check_json_limits(&bytes, limits)).map_err(|e| e.to_api_error())?;
    Ok((bytes, held))
}
