//! The endpoint picker's decision, through the gateway's own routing core: the plan
//! (mixed pool, or a prefill/decode pair), the selector under the configured policy
//! (kv-aware over the same kv state and tokenizer, or round robin), the breakers the
//! health checks and failures feed; then GAIE's constraints on top: the subset hint,
//! fallbacks in the order the picker would try them, a per-worker in-flight cap (all
//! full: 429). The pick's in-flight counts and kv charges are held by a [`Held`] until
//! the exchange ends.

use crate::epp::exchange::PickInput;
use crate::epp::reply::Pick;
use crate::metrics::Outcome;
use crate::request::validate::ApiKind;
use crate::route::plan::{Pins, Plan, build_attempt_candidates, plan};
use crate::route::select::RoutingInput;
use crate::send::forward::pick_pair;
use crate::send::guard::RequestGuard;
use crate::state::Gateway;
use crate::workers::registry::Target;
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::retention::parse_retention_hint;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// How the picker shapes its picks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PickOptions {
    /// The port written into endpoints instead of the worker's own.
    pub destination_port: Option<u16>,
    /// Fallback endpoints after the chosen one.
    pub fallbacks: usize,
    /// Requests a worker may have in flight before it is not picked (0: no cap).
    pub max_inflight: u64,
}

/// A pick with its bookkeeping, held until the exchange ends.
#[derive(Debug)]
pub(crate) struct Held {
    /// What Envoy is told.
    pub pick: Pick,
    /// Endpoint and worker id of each endpoint in the pick.
    workers: Vec<(String, String)>,
    guard: RequestGuard,
}

impl Held {
    /// The response started at `served` (Envoy's report; `None`: the first endpoint)
    /// with `status`: the breakers learn of it, and the request is counted on the worker
    /// that serves it.
    pub(crate) fn responded(&mut self, gw: &Gateway, served: Option<&str>, status: Option<u16>) {
        let first = self.workers.first().map(|(_, w)| w.clone());
        let server = served
            .and_then(|e| self.workers.iter().find(|(ep, _)| ep == e))
            .map(|(_, w)| w.clone())
            .or_else(|| first.clone());
        if let (Some(first), Some(server)) = (&first, &server)
            && first != server
        {
            // Envoy went down the list: the first endpoint could not be reached.
            gw.breakers.on_failure(first, Instant::now());
            self.guard.release(first);
            self.guard.hold(&gw.inflight, server);
        }
        for charge in &mut self.guard.kv_charges {
            charge.prefilled();
        }
        let Some(server) = server else { return };
        match status {
            Some(s) if s >= 500 => {
                gw.breakers.on_failure(&server, Instant::now());
                self.guard.set_outcome(Outcome::UpstreamError);
            }
            Some(s) if s >= 400 => self.guard.set_outcome(Outcome::ClientError),
            _ => {
                gw.breakers.on_success(&server);
                self.guard.set_outcome(Outcome::Ok);
            }
        }
    }
}

/// The API a path is, for how its prompt is tokenized (`None`: not a generation).
fn api_kind(path: &str) -> Option<ApiKind> {
    if path.ends_with("/chat/completions") || path.ends_with("/messages") {
        Some(ApiKind::Chat)
    } else if path.ends_with("/completions") {
        Some(ApiKind::Completions)
    } else {
        None
    }
}

/// `ip:port` of a worker's URL (`[v6]:port` for IPv6), with `port` instead of its own.
pub(crate) fn endpoint_of(url: &str, port: Option<u16>) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next()?;
    let (host, own) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h, p.parse::<u16>().ok())
        }
        _ => (authority, None),
    };
    let own = own.or_else(|| match url.split_once("://") {
        Some(("https", _)) => Some(443),
        _ => Some(80),
    });
    let port = port.or(own)?;
    (!host.is_empty()).then(|| format!("{host}:{port}"))
}

/// Whether `endpoint` is in the subset hint: an exact `ip:port`, or its bare ip.
pub(crate) fn in_subset(subset: &[String], endpoint: &str) -> bool {
    let host = endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h);
    subset.iter().any(|s| {
        let s = s.as_str();
        s == endpoint || s == host || s.trim_matches(['[', ']']) == host.trim_matches(['[', ']'])
    })
}

/// The endpoint picker's routing over a gateway's state.
#[derive(Debug)]
pub(crate) struct Picker {
    gw: Arc<Gateway>,
    opts: PickOptions,
    /// Rotation of requests that name no model.
    next: AtomicUsize,
}

impl Picker {
    /// A picker over `gw`'s workers and routing.
    pub(crate) fn new(gw: Arc<Gateway>, opts: PickOptions) -> Self {
        Self {
            gw,
            opts,
            next: AtomicUsize::new(0),
        }
    }

    /// The gateway it routes with.
    pub(crate) fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }

    fn endpoint(&self, target: &Target) -> Option<String> {
        endpoint_of(&target.record.url, self.opts.destination_port)
    }

    /// Keeps the targets Envoy may be sent to: in the subset hint, and under the
    /// in-flight cap. Empty after the hint: 503; everything at the cap: 429.
    fn eligible<'t>(
        &self,
        pool: Cow<'t, [Target]>,
        subset: Option<&[String]>,
    ) -> Result<Cow<'t, [Target]>, ApiError> {
        let hinted: Vec<Target> = pool
            .iter()
            .filter(|t| subset.is_none_or(|s| self.endpoint(t).is_some_and(|e| in_subset(s, &e))))
            .cloned()
            .collect();
        if hinted.is_empty() {
            return Err(ApiError::new(
                ErrorClass::ServiceUnavailable,
                "no worker of this pool is in the endpoint subset the gateway allowed",
            )
            .with_code("no_endpoint_in_subset"));
        }
        if self.opts.max_inflight == 0 {
            return Ok(Cow::Owned(hinted));
        }
        let open: Vec<Target> = hinted
            .iter()
            .filter(|t| self.gw.inflight.get(&t.record.worker_id) < self.opts.max_inflight)
            .cloned()
            .collect();
        if open.is_empty() {
            return Err(ApiError::new(
                ErrorClass::RateLimited,
                format!(
                    "every worker has {} requests in flight (--epp-max-inflight-per-worker); retry shortly",
                    self.opts.max_inflight
                ),
            ));
        }
        Ok(Cow::Owned(open))
    }

    /// Picks where the request of `input` goes.
    pub(crate) fn pick(&self, input: &PickInput) -> Result<Held, ApiError> {
        let kind = api_kind(&input.path);
        let body: Map<String, Value> = match (kind, input.body.is_empty()) {
            (Some(_), false) => match serde_json::from_slice(&input.body) {
                Ok(Value::Object(m)) => m,
                _ => {
                    return Err(ApiError::new(
                        ErrorClass::BadRequest,
                        "the request body is not a JSON object",
                    ));
                }
            },
            _ => Map::new(),
        };
        let snapshot = self.gw.registry.snapshot();
        let names: Vec<&str> = snapshot.model_names().into_iter().collect();
        let model = match body.get("model").and_then(Value::as_str) {
            Some(m) => m.to_owned(),
            None if names.is_empty() => {
                return Err(ApiError::new(
                    ErrorClass::ServiceUnavailable,
                    "no worker is registered in this pool yet",
                ));
            }
            // No model named (a GET, or a body without one): any model's workers.
            None => names[self.next.fetch_add(1, Ordering::Relaxed) % names.len()].to_owned(),
        };
        let planned = plan(&snapshot, &model, Pins::default()).map_err(|e| e.to_api_error())?;
        let subset = input.subset.as_deref();
        let planned = match planned {
            Plan::Mixed(pool) => Plan::Mixed(self.eligible(pool, subset)?),
            Plan::Disagg(p, d) => Plan::Disagg(p, self.eligible(d, subset)?),
        };
        let hint = parse_retention_hint(&body).ok().flatten();
        let routing = self.gw.routing.for_request(
            RoutingInput {
                kind: kind.unwrap_or(ApiKind::Completions),
                body: &body,
                body_bytes: input.body.len(),
                hint,
            },
            planned.targets(),
        );
        let upstream = &self.gw.upstream;
        let mut guard = RequestGuard::new(
            upstream.metrics.clone(),
            planned.router(),
            Instant::now(),
            tracing::Span::none(),
        );
        let now = Instant::now();
        let mut workers = Vec::new();
        let (worker, prefill) = match &planned {
            Plan::Mixed(pool) => {
                let selector = routing.selector("mixed");
                let options = build_attempt_candidates(pool, &[], |t| {
                    upstream.breakers.is_available(&t.record.worker_id, now)
                });
                let selection = selector.select(&options).ok_or_else(|| {
                    ApiError::new(ErrorClass::ServiceUnavailable, "no worker is available")
                })?;
                guard.kv_charges.extend(selection.charge);
                // The chosen one, then the rest in the order they were listed after it.
                let n = options.len();
                for t in (0..n).map(|i| options[(selection.index + i) % n]) {
                    if workers.len() > self.opts.fallbacks {
                        break;
                    }
                    if let Some(e) = self.endpoint(t)
                        && !workers.iter().any(|(w, _)| *w == e)
                    {
                        workers.push((e, t.record.worker_id.clone()));
                    }
                }
                let chosen = options[selection.index];
                upstream.breakers.try_acquire(&chosen.record.worker_id, now);
                upstream
                    .metrics
                    .record_pick("mixed", &chosen.record.worker_id);
                (chosen.record.worker_id.clone(), None)
            }
            Plan::Disagg(prefill, decode) => {
                let selectors = [routing.selector("prefill"), routing.selector("decode")];
                let (p, d, _) = pick_pair(
                    upstream,
                    &selectors,
                    prefill,
                    decode,
                    kind.unwrap_or(ApiKind::Completions),
                )?;
                for (target, selector) in [(&p, &selectors[0]), (&d, &selectors[1])] {
                    upstream.breakers.try_acquire(&target.record.worker_id, now);
                    upstream
                        .metrics
                        .record_pick(selector.role(), &target.record.worker_id);
                    guard.kv_charges.extend(selector.commit(target));
                }
                guard.hold(&self.gw.inflight, &p.record.worker_id);
                if let Some(e) = self.endpoint(&d) {
                    workers.push((e, d.record.worker_id.clone()));
                }
                (d.record.worker_id.clone(), Some(p.record.worker_id.clone()))
            }
        };
        if workers.is_empty() {
            return Err(ApiError::new(
                ErrorClass::Internal,
                format!("worker {worker}'s URL names no endpoint"),
            ));
        }
        guard.hold(&self.gw.inflight, &worker);
        Ok(Held {
            pick: Pick {
                endpoints: workers.iter().map(|(e, _)| e.clone()).collect(),
                worker,
                prefill,
            },
            workers,
            guard,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_come_from_worker_urls() {
        assert_eq!(
            endpoint_of("http://10.0.0.5:8000", None).as_deref(),
            Some("10.0.0.5:8000")
        );
        assert_eq!(
            endpoint_of("http://10.0.0.5:8000/v1", Some(8200)).as_deref(),
            Some("10.0.0.5:8200")
        );
        assert_eq!(
            endpoint_of("http://[fd00::5]:8000", None).as_deref(),
            Some("[fd00::5]:8000")
        );
        assert_eq!(
            endpoint_of("http://worker-0.svc", None).as_deref(),
            Some("worker-0.svc:80")
        );
        assert_eq!(endpoint_of("https://w", None).as_deref(), Some("w:443"));
        assert_eq!(endpoint_of("http://", None), None);
    }

    #[test]
    fn the_subset_hint_matches_endpoints_or_their_ip() {
        let subset = vec![
            "10.0.0.5:8000".to_owned(),
            "10.0.0.6".to_owned(),
            "[fd00::7]".to_owned(),
        ];
        assert!(in_subset(&subset, "10.0.0.5:8000"));
        assert!(!in_subset(&subset, "10.0.0.5:8001"));
        assert!(in_subset(&subset, "10.0.0.6:9000"));
        assert!(in_subset(&subset, "[fd00::7]:8000"));
        assert!(!in_subset(&subset, "10.0.0.8:8000"));
        assert!(!in_subset(&[], "10.0.0.5:8000"));
    }

    #[test]
    fn paths_say_how_prompts_are_tokenized() {
        assert_eq!(api_kind("/v1/chat/completions"), Some(ApiKind::Chat));
        assert_eq!(api_kind("/v1/messages"), Some(ApiKind::Chat));
        assert_eq!(api_kind("/v1/completions"), Some(ApiKind::Completions));
        assert_eq!(api_kind("/v1/models"), None);
    }
}
