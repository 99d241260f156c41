//! The OpenAI endpoints, `/v1/chat/completions` and `/v1/completions`: read and check
//! the body, route and forward it, relay the worker's answer as it arrives.

use crate::http::Shared;
use crate::http::body::read_body;
use crate::http::errors::{Shape, error_response};
use crate::http::pipeline::{
    build_migration, default_model, migration_state, reject, relay_response, request_span,
    route_and_forward, route_input,
};
use crate::metrics::Outcome;
use crate::offload::off_workers;
use crate::request::validate::{ApiKind, validate_request};
use crate::send::upstream::Outbound;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use infera_proto::error_class::ApiError;
use infera_telemetry::propagation::TraceContext;
use serde_json::Value;
use std::time::Instant;
use tracing::Instrument;

pub(crate) async fn chat(State(gw): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let (span, rid, trace) = request_span(ApiKind::Chat.path(), &headers);
    openai(gw, ApiKind::Chat, headers, body, rid, trace)
        .instrument(span)
        .await
}

pub(crate) async fn completions(
    State(gw): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (span, rid, trace) = request_span(ApiKind::Completions.path(), &headers);
    openai(gw, ApiKind::Completions, headers, body, rid, trace)
        .instrument(span)
        .await
}

async fn openai(
    gw: Shared,
    kind: ApiKind,
    headers: HeaderMap,
    body: Body,
    rid: String,
    trace: TraceContext,
) -> Response {
    let started = Instant::now();
    let prepared = async {
        let (bytes, budget) = read_body(&gw, &headers, body).await?;
        let model = default_model(&gw);
        let (body, info) = off_workers(bytes.len(), || {
            validate_request(kind, &bytes, model.as_deref())
        })?;
        let input = route_input(&gw, &body, bytes.len())?;
        drop(bytes);
        Ok::<_, ApiError>((body, info, input, budget))
    }
    .await;
    // The body budget's bytes are held until the request is sent (or answered).
    let (body, info, input, _budget) = match prepared {
        Ok(p) => p,
        Err(e) => {
            reject(&gw, Outcome::ClientError, started);
            return error_response(&e, Shape::OpenAi, &rid);
        }
    };
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let state = migration_state(&gw, &body, kind, stream);
    let request = Outbound {
        kind,
        body: &body,
        body_bytes: input.body_bytes,
        retention: input.retention,
        request_id: &rid,
        trace: &trace,
        stream,
        migratable: state.is_some(),
    };
    match route_and_forward(&gw, &headers, &info.model, input.hint, &request, started).await {
        Ok(forwarded) => {
            let migration =
                state.map(|state| build_migration(&gw, state, &info.model, &input, &request));
            relay_response(forwarded, &gw.upstream, &rid, migration)
        }
        Err(e) => error_response(&e, Shape::OpenAi, &rid),
    }
}
