//! Anthropic's `/v1/messages`: the request translated to an OpenAI chat request
//! ([`crate::request::anthropic`]), routed and forwarded like any chat request, and the
//! worker's answer translated back, whole or re-framed event by event.

use crate::http::Shared;
use crate::http::body::read_body;
use crate::http::errors::{Shape, error_response, with_request_id};
use crate::http::pipeline::{
    build_migration, migration_state, reject, request_span, route_and_forward, route_input,
};
use crate::metrics::Outcome;
use crate::offload::off_workers;
use crate::request::anthropic::{StreamTranslator, build_chat_request, build_message_response};
use crate::request::validate::ApiKind;
use crate::send::guard::Forwarded;
use crate::send::relay::{Migration, relay_body};
use crate::send::upstream::Outbound;
use crate::send::upstream::Upstream;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_telemetry::propagation::TraceContext;
use serde_json::{Map, Value};
use std::time::Instant;
use tracing::Instrument;

pub(crate) async fn messages(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let (span, rid, trace) = request_span("/v1/messages", &headers);
    anthropic_messages(gw, headers, body, rid, trace)
        .instrument(span)
        .await
}

async fn anthropic_messages(
    gw: Shared,
    headers: HeaderMap,
    body: Body,
    rid: String,
    trace: TraceContext,
) -> Response {
    let started = Instant::now();
    let prepared = async {
        let (bytes, budget) = read_body(&gw, &headers, body).await?;
        let (original, chat) = off_workers(bytes.len(), || {
            let original: Value = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::new(
                    ErrorClass::BadRequest,
                    format!("request body is not valid JSON: {e}"),
                )
            })?;
            let chat = build_chat_request(&original)?;
            Ok::<_, ApiError>((original, chat))
        })?;
        // build_chat_request refuses anything but an object.
        let empty = Map::new();
        let object = original.as_object().unwrap_or(&empty);
        let input = route_input(&gw, object, bytes.len())?;
        Ok::<_, ApiError>((chat, input, budget))
    }
    .await;
    // The body budget's bytes are held until the request is sent (or answered).
    let (chat, input, _budget) = match prepared {
        Ok(p) => p,
        Err(e) => {
            reject(&gw, Outcome::ClientError, started);
            return error_response(&e, Shape::Anthropic, &rid);
        }
    };
    let model = chat
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let stream = chat.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let state = migration_state(&gw, &chat, ApiKind::Chat, stream);
    let request = Outbound {
        kind: ApiKind::Chat,
        body: &chat,
        body_bytes: input.body_bytes,
        retention: input.retention,
        request_id: &rid,
        trace: &trace,
        stream,
        migratable: state.is_some(),
    };
    let answered =
        match route_and_forward(&gw, &headers, &model, input.hint, &request, started).await {
            Ok(forwarded) => {
                let migration =
                    state.map(|state| build_migration(&gw, state, &model, &input, &request));
                answer(forwarded, &gw.upstream, &model, &rid, stream, migration).await
            }
            Err(e) => Err(e),
        };
    match answered {
        Ok(resp) => with_request_id(resp, &rid),
        Err(e) => error_response(&e, Shape::Anthropic, &rid),
    }
}

/// The Messages answer to a forwarded chat completion: the worker's error as an error,
/// a whole response translated, or (`stream` in the request) its SSE stream re-framed.
async fn answer(
    forwarded: Forwarded,
    upstream: &Upstream,
    model: &str,
    request_id: &str,
    stream: bool,
    migration: Option<Migration>,
) -> Result<Response, ApiError> {
    let status = forwarded.response.status;
    if !status.is_success() {
        let body = forwarded.response.bytes().await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let class = if status.is_client_error() {
            ErrorClass::BadRequest
        } else {
            ErrorClass::BadGateway
        };
        return Err(ApiError::new(
            class,
            format!("worker answered {status}: {text}"),
        ));
    }
    if !stream {
        let Forwarded {
            response,
            mut guard,
            ..
        } = forwarded;
        let parsed = match response.bytes().await {
            Ok(b) => serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let chat = parsed.map_err(|e| {
            guard.outcome = Outcome::UpstreamError;
            ApiError::new(
                ErrorClass::BadGateway,
                format!("worker response is not JSON: {e}"),
            )
        })?;
        guard.outcome = Outcome::Ok;
        let mut resp = axum::Json(build_message_response(&chat, model)).into_response();
        guard.served.write(resp.headers_mut());
        return Ok(resp);
    }
    let served = forwarded.guard.served.clone();
    let relayed = relay_body(forwarded, upstream, true, migration);
    let translated = StreamTranslator::new(model, request_id).translate(relayed);
    let mut resp = Response::new(Body::from_stream(translated));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    served.write(resp.headers_mut());
    Ok(resp)
}
