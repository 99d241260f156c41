//! The one forward path, for mixed and prefill/decode requests alike: given the
//! AutoRouter's [`Plan`] and the request's [`RequestRouting`], pick (each role with its
//! selector), send (a mixed request fails over to another worker before the first byte;
//! a pair's decode open is retried on its worker), and hand back the worker's
//! response with a [`RequestGuard`] that owns the request's bookkeeping (metrics,
//! in-flight counts, kv charges) until the relay ends. It sees the gateway only through
//! [`Upstream`]: the client, breakers, metrics and timeouts.

use crate::metrics::Outcome;
use crate::request::validate::ApiKind;
use crate::route::plan::{Plan, build_attempt_candidates};
use crate::route::revision::{decodes_for, pairable_prefills};
use crate::route::select::{RequestRouting, Selector};
use crate::send::failover::send_with_failover;
use crate::send::guard::{Forwarded, RequestGuard, Sent};
use crate::send::pd::connectors::{PdError, PdIds, PdPair, resolve_protocol};
use crate::send::pd::legs::{FailedLeg, send_pair};
use crate::send::served::ServedBy;
use crate::send::upstream::{Outbound, Upstream};
use crate::workers::registry::Target;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::pd::PdProtocol;
use std::borrow::Cow;
use std::time::Instant;

/// Sends `request` where `plan` says, picking with `routing`.
pub(crate) async fn forward(
    upstream: &Upstream,
    plan: &Plan<'_>,
    routing: &RequestRouting<'_>,
    request: &Outbound<'_>,
    started: Instant,
) -> Result<Forwarded, ApiError> {
    let span = tracing::Span::current();
    span.record("router", plan.router());
    let mut guard = RequestGuard::new(upstream.metrics.clone(), plan.router(), started, span);
    match send_planned(upstream, plan, routing, request, &mut guard).await {
        Ok((response, worker, abort)) => {
            guard.outcome = outcome_for(response.status);
            Ok(Forwarded {
                response,
                worker,
                guard,
                abort,
            })
        }
        Err(e) => {
            guard.outcome = outcome_of_error(&e);
            Err(e)
        }
    }
}

/// Sends `request` where `plan` says, its bookkeeping in `guard` (a moved generation's
/// continuation is sent here with the request's own guard).
pub(crate) async fn send_planned(
    upstream: &Upstream,
    plan: &Plan<'_>,
    routing: &RequestRouting<'_>,
    request: &Outbound<'_>,
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
    match plan {
        Plan::Mixed(candidates) => send_mixed(upstream, routing, candidates, request, guard).await,
        Plan::Disagg(prefill, decode) => {
            send_disagg(upstream, routing, prefill, decode, request, guard).await
        }
    }
}

/// The MixedRouter: one worker of the pool serves the request whole.
async fn send_mixed(
    upstream: &Upstream,
    routing: &RequestRouting<'_>,
    candidates: &[Target],
    request: &Outbound<'_>,
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
    let selector = routing.selector("mixed");
    let sent = send_with_failover(upstream, &selector, candidates, request).await?;
    guard.kv_charges.extend(sent.charge);
    let worker = sent.target.record.worker_id.clone();
    guard.hold(&upstream.inflight, &worker);
    if request.stream {
        guard.hold_pending(&upstream.inflight, &worker);
    }
    guard.span.record("worker", worker.as_str());
    if guard.served.worker.is_empty() {
        guard.served = ServedBy {
            worker: worker.clone(),
            prefill: None,
            revision: sent.target.record.revision().map(str::to_owned),
        };
    }
    Ok((sent.response, worker, None))
}

/// The DisaggRouter: a prefill and a decode worker, each picked with its own selector
/// among available workers, then both legs sent. A pair whose worker fails before the
/// decode answered (unreachable, broken, timed out) is replaced by another pair without
/// that worker, up to `--request-max-retries` times: the client has seen nothing yet.
async fn send_disagg(
    upstream: &Upstream,
    routing: &RequestRouting<'_>,
    prefill: &[Target],
    decode: &[Target],
    request: &Outbound<'_>,
    guard: &mut RequestGuard,
) -> Result<Sent, ApiError> {
    let selectors = [routing.selector("prefill"), routing.selector("decode")];
    let mut failed: Vec<String> = Vec::new();
    let mut last: Option<ApiError> = None;
    let mut attempt = 0;
    loop {
        let (p, d, protocol) = match (without_failed(prefill, decode, &failed), last) {
            (Some((p, d)), _) => pick_pair(upstream, &selectors, &p, &d, request.kind)?,
            // No other pair: the last pair's failure is the answer.
            (None, Some(e)) => return Err(e),
            (None, None) => {
                return Err(ApiError::new(
                    ErrorClass::ServiceUnavailable,
                    "no prefill/decode pair is available",
                ));
            }
        };
        guard.pd_protocol = Some(protocol);
        let now = Instant::now();
        for (target, selector) in [(&p, &selectors[0]), (&d, &selectors[1])] {
            let worker = &target.record.worker_id;
            upstream.breakers.try_acquire(worker, now);
            upstream.metrics.record_pick(selector.role(), worker);
            guard.kv_charges.extend(selector.commit(target));
            guard.hold(&upstream.inflight, worker);
            if request.stream {
                guard.hold_pending(&upstream.inflight, worker);
            }
        }
        let pair = PdPair {
            protocol,
            prefill: &p,
            decode: &d,
            ids: PdIds::random(&p),
            retention: request.retention,
        };
        guard.span.record("worker", d.record.worker_id.as_str());
        guard
            .span
            .record("prefill_worker", p.record.worker_id.as_str());
        let opened = match send_pair(upstream, &pair, request).await {
            Ok(opened) => opened,
            Err(e) if e.retryable() && attempt < upstream.max_retries => {
                let worker = match e.leg {
                    FailedLeg::Prefill => &p.record.worker_id,
                    _ => &d.record.worker_id,
                };
                tracing::warn!(worker = %worker, rid = request.request_id, "prefill/decode pair failed ({}); trying another pair", e.error.message);
                guard.release(&p.record.worker_id);
                guard.release(&d.record.worker_id);
                failed.push(worker.clone());
                upstream.metrics.record_pd_failure("pair_retried");
                last = Some(e.error);
                attempt += 1;
                continue;
            }
            Err(e) => return Err(e.error),
        };
        if guard.served.worker.is_empty() {
            guard.served = ServedBy {
                worker: d.record.worker_id.clone(),
                prefill: Some(p.record.worker_id.clone()),
                revision: p
                    .record
                    .revision()
                    .or(d.record.revision())
                    .map(str::to_owned),
            };
        }
        return Ok((opened.response, d.record.worker_id.clone(), opened.abort));
    }
}

/// Candidates of one role, borrowed until something is left out.
type Pool<'t> = Cow<'t, [Target]>;

/// The pools without the workers a pair already failed on; `None` when a pool is left
/// empty.
fn without_failed<'t>(
    prefill: &'t [Target],
    decode: &'t [Target],
    failed: &[String],
) -> Option<(Pool<'t>, Pool<'t>)> {
    let keep = |pool: &'t [Target]| -> Option<Pool<'t>> {
        if failed.is_empty() {
            return Some(Cow::Borrowed(pool));
        }
        let kept: Vec<Target> = pool
            .iter()
            .filter(|t| !failed.contains(&t.record.worker_id))
            .cloned()
            .collect();
        (!kept.is_empty()).then_some(Cow::Owned(kept))
    };
    Some((keep(prefill)?, keep(decode)?))
}

/// A prefill worker, then a decode worker that speaks its protocol (a fleet
/// mid-migration may hold several; with none, the decode pick names the mismatch), and
/// the protocol between them.
pub(crate) fn pick_pair(
    upstream: &Upstream,
    [prefill_selector, decode_selector]: &[Selector<'_>; 2],
    prefill: &[Target],
    decode: &[Target],
    kind: ApiKind,
) -> Result<(Target, Target, PdProtocol), ApiError> {
    let pick = |selector: &Selector<'_>, pool: &[Target]| -> Result<Target, ApiError> {
        let now = Instant::now();
        let options = build_attempt_candidates(pool, &[], |t| {
            upstream.breakers.is_available(&t.record.worker_id, now)
        });
        let index = selector.choose(&options).ok_or_else(|| {
            ApiError::new(
                ErrorClass::ServiceUnavailable,
                format!("no {} worker is available", selector.role()),
            )
        })?;
        Ok(options[index].clone())
    };
    // Only a prefill with a decode of its revision (mid-rollout, two run side by side).
    let prefill = pairable_prefills(prefill, decode);
    if prefill.is_empty() {
        upstream.metrics.record_pd_failure("no_revision_pair");
        return Err(ApiError::new(
            ErrorClass::ServiceUnavailable,
            "no prefill and decode worker of one engine revision is available; retry shortly",
        )
        .with_code("no_revision_pair"));
    }
    let p = pick(prefill_selector, &prefill)?;
    let decode = decodes_for(&p, decode);
    let compatible: Vec<Target> = decode
        .iter()
        .filter(|d| resolve_protocol(&p.record, &d.record).is_ok())
        .cloned()
        .collect();
    let pool = if compatible.is_empty() {
        &decode[..]
    } else {
        &compatible[..]
    };
    let d = pick(decode_selector, pool)?;
    let protocol = resolve_protocol(&p.record, &d.record)
        .and_then(|protocol| {
            if protocol.completions_only() && kind == ApiKind::Chat {
                Err(PdError::CompletionsOnly { protocol })
            } else {
                Ok(protocol)
            }
        })
        .map_err(|e| {
            upstream.metrics.record_pd_failure(e.reason());
            e.to_api_error()
        })?;
    Ok((p, d, protocol))
}

/// The guard's outcome for a worker's status, until the body is relayed.
fn outcome_for(status: reqwest::StatusCode) -> Outcome {
    if status.is_server_error() {
        Outcome::UpstreamError
    } else if status.is_client_error() {
        Outcome::ClientError
    } else {
        Outcome::Cancelled
    }
}

/// The guard's outcome for an error answered instead of a worker's response.
fn outcome_of_error(e: &ApiError) -> Outcome {
    match e.class {
        ErrorClass::GatewayTimeout => Outcome::Timeout,
        ErrorClass::BadRequest | ErrorClass::RateLimited => Outcome::ClientError,
        _ => Outcome::UpstreamError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_of_statuses_and_errors() {
        let table = [
            (200, Outcome::Cancelled),
            (404, Outcome::ClientError),
            (503, Outcome::UpstreamError),
        ];
        for (status, want) in table {
            let status = reqwest::StatusCode::from_u16(status).unwrap();
            assert_eq!(outcome_for(status), want, "{status}");
        }
        let table = [
            (ErrorClass::GatewayTimeout, Outcome::Timeout),
            (ErrorClass::BadRequest, Outcome::ClientError),
            (ErrorClass::RateLimited, Outcome::ClientError),
            (ErrorClass::BadGateway, Outcome::UpstreamError),
            (ErrorClass::ServiceUnavailable, Outcome::UpstreamError),
        ];
        for (class, want) in table {
            assert_eq!(outcome_of_error(&ApiError::new(class, "x")), want);
        }
    }
}
