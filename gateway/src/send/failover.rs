//! Sending a request to one of a pool: pick a target with the role's selector, POST
//! it, and fail over to another worker while no byte has come back (unreachable, 5xx).
//! Breakers learn from every attempt. Timeouts answer 504 instead of waiting on a
//! worker forever. The mixed path of [`crate::send::forward`] sends through here.

use crate::offload::off_workers;
use crate::route::kv_state::KvCharge;
use crate::route::plan::build_attempt_candidates;
use crate::route::select::{Selection, Selector};
use crate::send::migration::asks_token_ids;
use crate::send::nats::{NatsPlane, Outgoing, PlaneError};
use crate::send::upstream::{
    Outbound, REQUEST_ID_HEADER, Upstream, build_post, record_answer, root_cause, send_span,
    stall_error,
};
use crate::send::worker_response::WorkerResponse;
use crate::workers::inflight::PendingHold;
use crate::workers::registry::Target;
use bytes::Bytes;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::retention::retention_fields;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use std::time::Instant;
use tracing::Instrument;

/// A worker's answer, headers received.
#[derive(Debug)]
pub(crate) struct Dispatched {
    /// The response (body not yet read).
    pub response: WorkerResponse,
    /// Who answered.
    pub target: Target,
    /// The request's kv-aware charge on it (the pick's), released when dropped.
    pub charge: Option<KvCharge>,
}

/// The body as `target`'s engine should see it: the retention in its own field, and
/// (a stream the gateway may move) `return_token_ids` where the engine honours it, so a
/// move continues from exact ids. The request is serialized as it stands with those few
/// fields put in place, never copied.
fn body_for(target: &Target, request: &Outbound<'_>) -> Bytes {
    let (body, engine) = (request.body, target.record.engine);
    let mut fields = retention_fields(body, engine, request.retention);
    if request.migratable
        && !body.contains_key("return_token_ids")
        && asks_token_ids(engine, request.kind)
    {
        fields.insert("return_token_ids".into(), Value::Bool(true));
    }
    Bytes::from(
        serde_json::to_vec(&WithFields {
            body,
            fields: &fields,
        })
        .unwrap_or_default(),
    )
}

/// `body` with `fields` replacing its entries of the same name, the others appended.
struct WithFields<'a> {
    body: &'a Map<String, Value>,
    fields: &'a Map<String, Value>,
}

impl Serialize for WithFields<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (k, v) in self.body {
            map.serialize_entry(k, self.fields.get(k).unwrap_or(v))?;
        }
        for (k, v) in self.fields {
            if !self.body.contains_key(k) {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

/// Sends `request` to one of `candidates` (each attempt's target chosen by `selector`
/// among the untried, available ones), failing over before the first byte.
pub(crate) async fn send_with_failover(
    upstream: &Upstream,
    selector: &Selector<'_>,
    candidates: &[Target],
    request: &Outbound<'_>,
) -> Result<Dispatched, ApiError> {
    let request_id = request.request_id;
    let mut tried: Vec<String> = Vec::new();
    let mut last_error: Option<ApiError> = None;
    // Attempts that failed (a worker at its admission limit is passed over, not counted).
    let mut failed = 0;
    while failed <= upstream.max_retries {
        let now = Instant::now();
        let options = build_attempt_candidates(candidates, &tried, |t| {
            upstream.breakers.is_available(&t.record.worker_id, now)
        });
        // A failover's new pick drops (releases) the previous one's charge.
        let Some(Selection { index, charge }) = selector.select(&options) else {
            break;
        };
        let target = options[index].clone();
        tried.push(target.key.clone());
        let worker = target.record.worker_id.clone();
        upstream.breakers.try_acquire(&worker, now);
        upstream.metrics.record_pick(selector.role(), &worker);
        // A stream counts as waiting on the worker from the pick (the guard takes over
        // at the headers); a JSON answer's first byte is its last, so the engine's own
        // queue count stands for it.
        let _pending = request
            .stream
            .then(|| PendingHold::new(&upstream.inflight, &worker));
        let body = off_workers(request.body_bytes, || body_for(&target, request));
        let span = send_span(selector.role(), &target, request.kind.path());
        let sent = async {
            match upstream.nats_for(&target) {
                Some(plane) => send_nats(plane, &target, request, &span, body).await,
                None => send_http(upstream, &target, request, &span, body).await,
            }
        };
        let attempt = tokio::select! {
            attempt = sent.instrument(span.clone()) => attempt,
            stalled = stall_error(&upstream.breakers, "worker", &worker) => {
                span.record("otel.status_code", "ERROR");
                // A hung engine: try another, as for one that cannot be reached.
                tracing::warn!(worker = %worker, request_id, "{}", stalled.message);
                last_error = Some(stalled);
                failed += 1;
                continue;
            }
        };
        let response = match attempt {
            Attempt::Answered(response) => response,
            Attempt::Busy(e) => {
                // Full or draining, not faulty: another worker may take it.
                upstream.breakers.on_success(&worker);
                last_error = Some(e);
                continue;
            }
            Attempt::Retry(e) => {
                upstream.breakers.on_failure(&worker, Instant::now());
                tracing::warn!(worker = %worker, request_id, "{}", e.message);
                last_error = Some(e);
                failed += 1;
                continue;
            }
            Attempt::Fail(e) => {
                upstream.breakers.on_failure(&worker, Instant::now());
                return Err(e);
            }
        };
        if response.status.is_server_error() {
            upstream.breakers.on_failure(&worker, Instant::now());
            tracing::warn!(worker = %worker, request_id, status = %response.status, "worker answered with a server error");
            failed += 1;
            if failed > upstream.max_retries
                || build_attempt_candidates(candidates, &tried, |_| true).is_empty()
            {
                return Ok(Dispatched {
                    response,
                    target,
                    charge,
                });
            }
            continue;
        }
        // Any answer below 500 shows the worker is up (4xx never count as faults).
        upstream.breakers.on_success(&worker);
        return Ok(Dispatched {
            response,
            target,
            charge,
        });
    }
    Err(last_error
        .unwrap_or_else(|| ApiError::new(ErrorClass::ServiceUnavailable, "no worker is available")))
}

/// How one attempt went.
enum Attempt {
    /// The worker answered (headers, or a NATS request's first frame).
    Answered(WorkerResponse),
    /// The worker is at its admission limit, or draining: another may take it.
    Busy(ApiError),
    /// The worker failed before answering: another may serve it.
    Retry(ApiError),
    /// Give up (a timeout: the request may be running there).
    Fail(ApiError),
}

/// One attempt over HTTP.
async fn send_http(
    upstream: &Upstream,
    target: &Target,
    request: &Outbound<'_>,
    span: &tracing::Span,
    body: Bytes,
) -> Attempt {
    let worker = &target.record.worker_id;
    let mut post = build_post(
        upstream,
        target,
        request.kind.path(),
        (request.request_id, request.trace, span),
        body,
    );
    if let Some(rank) = target.dp_rank {
        post = post.header("x-data-parallel-rank", rank.to_string());
    }
    let answer = tokio::time::timeout(upstream.request_timeout, post.send()).await;
    record_answer(span, &answer);
    match answer {
        Err(_) => Attempt::Fail(ApiError::new(
            ErrorClass::GatewayTimeout,
            format!(
                "worker {worker} did not answer within {:?}",
                upstream.request_timeout
            ),
        )),
        Ok(Err(e)) => Attempt::Retry(ApiError::new(
            ErrorClass::BadGateway,
            format!("worker {worker} is unreachable: {}", root_cause(&e)),
        )),
        Ok(Ok(response)) => Attempt::Answered(WorkerResponse::from_http(response)),
    }
}

/// One attempt over the NATS request plane: the same headers an HTTP attempt sends,
/// in the envelope.
async fn send_nats(
    plane: &NatsPlane,
    target: &Target,
    request: &Outbound<'_>,
    span: &tracing::Span,
    body: Bytes,
) -> Attempt {
    let worker = &target.record.worker_id;
    let mut headers: Vec<(&str, String)> = vec![(REQUEST_ID_HEADER, request.request_id.to_owned())];
    let trace = request.trace.upstream_headers(span);
    for (name, value) in &trace {
        if let Ok(v) = value.to_str() {
            headers.push((name.as_str(), v.to_owned()));
        }
    }
    if let Some(rank) = target.dp_rank {
        headers.push(("x-data-parallel-rank", rank.to_string()));
    }
    let out = Outgoing {
        path: request.kind.path(),
        stream: request.stream,
        headers: &headers,
        body: &body,
        migratable: request.migratable,
    };
    let answer = plane.send(worker, &out).await;
    match &answer {
        Ok(r) => {
            span.record("http.status_code", r.status.as_u16());
            if r.status.is_server_error() {
                span.record("otel.status_code", "ERROR");
            }
        }
        Err(_) => {
            span.record("otel.status_code", "ERROR");
        }
    }
    match answer {
        Ok(response) => Attempt::Answered(response),
        Err(e @ (PlaneError::Busy(_) | PlaneError::Draining)) => {
            Attempt::Busy(e.to_api_error(worker))
        }
        Err(e) if e.retryable() => Attempt::Retry(e.to_api_error(worker)),
        Err(e) => Attempt::Fail(e.to_api_error(worker)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_replace_in_place_and_new_ones_follow() {
        let body = json!({"model": "m", "priority": 1, "stream": true});
        let fields = json!({"priority": 5, "infera_retention": "long"});
        let (body, fields) = (body.as_object().unwrap(), fields.as_object().unwrap());
        let mut want = body.clone();
        for (k, v) in fields {
            want.insert(k.clone(), v.clone());
        }
        assert_eq!(
            serde_json::to_string(&WithFields { body, fields }).unwrap(),
            serde_json::to_string(&want).unwrap()
        );
        assert_eq!(
            serde_json::to_string(&want).unwrap(),
            r#"{"model":"m","priority":5,"stream":true,"infera_retention":"long"}"#
        );
    }
}
