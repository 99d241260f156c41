//! Choosing where a request goes (pure). AutoRouter, per request and model: both
//! prefill and decode pools present -> the DisaggRouter (a prefill/decode pair); only
//! one of them and no mixed worker -> 503 naming the missing pool; otherwise the
//! MixedRouter. Direct mode resolves the worker ids an external picker pinned into a
//! [`Plan`]; [`crate::route::select`] then chooses within it.

use crate::workers::registry::{ANY_MODEL, Snapshot, Target};
use infera_proto::error_class::{ApiError, ErrorClass};
use infera_proto::worker::DisaggMode;
use std::borrow::Cow;

/// Why a request cannot be routed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RouteError {
    /// No worker serves the model.
    UnknownModel {
        /// Requested model.
        model: String,
        /// Models that are served.
        available: Vec<String>,
    },
    /// The model had workers since the gateway started and has none at the moment (they
    /// left, or etcd lost its records and they are registering again).
    NoWorkerNow {
        /// Requested model.
        model: String,
    },
    /// Only one prefill/decode pool exists and no mixed worker.
    MissingPool {
        /// Model.
        model: String,
        /// `prefill` or `decode`.
        missing: &'static str,
    },
    /// A pinned worker (direct mode) is not registered, or not usable for the role.
    UnknownWorker {
        /// The header that named it.
        header: &'static str,
        /// Worker id.
        worker: String,
        /// Why it cannot take the request.
        why: String,
    },
}

/// Where a request goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Route<'s> {
    /// One worker among these serves it whole.
    Mixed(&'s [Target]),
    /// A prefill worker and a decode worker serve it together.
    Disagg {
        /// Prefill candidates.
        prefill: &'s [Target],
        /// Decode candidates.
        decode: &'s [Target],
    },
}

impl RouteError {
    /// The client-facing error.
    pub(crate) fn to_api_error(&self) -> ApiError {
        match self {
            Self::UnknownModel { model, available } => ApiError::new(
                ErrorClass::ModelNotFound,
                if available.is_empty() {
                    format!("model '{model}' is not served: no worker is registered yet")
                } else {
                    format!("model '{model}' is not served; available: {}", available.join(", "))
                },
            )
            .with_param("model"),
            Self::NoWorkerNow { model } => ApiError::new(
                ErrorClass::ServiceUnavailable,
                format!("model '{model}' has no worker available at the moment (its workers left or are registering again); retry shortly"),
            ),
            Self::MissingPool { model, missing } => ApiError::new(
                ErrorClass::ServiceUnavailable,
                format!("model '{model}' has prefill/decode workers but no {missing} worker is available"),
            )
            .with_code(format!("missing_{missing}_pool")),
            Self::UnknownWorker { header, worker, why } => ApiError::new(
                ErrorClass::ServiceUnavailable,
                format!("{header} names worker '{worker}', which {why} (stale routing in the endpoint picker?)"),
            )
            .with_code("worker_not_found"),
        }
    }
}

/// Where a request for `model` goes; candidates in a stable order.
pub(crate) fn route<'s>(snapshot: &'s Snapshot, model: &str) -> Result<Route<'s>, RouteError> {
    // A model no record names goes to the pool's stock engines, when there are some.
    let pools = snapshot
        .models
        .get(model)
        .or_else(|| snapshot.models.get(ANY_MODEL));
    let Some(pools) = pools else {
        if snapshot.known_models.contains(model) {
            return Err(RouteError::NoWorkerNow {
                model: model.to_owned(),
            });
        }
        return Err(RouteError::UnknownModel {
            model: model.to_owned(),
            available: snapshot
                .model_names()
                .into_iter()
                .map(str::to_owned)
                .collect(),
        });
    };
    match (pools.prefill.is_empty(), pools.decode.is_empty()) {
        (false, false) => Ok(Route::Disagg {
            prefill: &pools.prefill,
            decode: &pools.decode,
        }),
        _ if !pools.mixed.is_empty() => Ok(Route::Mixed(&pools.mixed)),
        (true, _) => Err(RouteError::MissingPool {
            model: model.to_owned(),
            missing: "prefill",
        }),
        (false, true) => Err(RouteError::MissingPool {
            model: model.to_owned(),
            missing: "decode",
        }),
    }
}

/// Header naming the worker (mixed or decode) an external picker chose.
pub(crate) const WORKER_PIN_HEADER: &str = "x-worker-instance-id";

/// Header naming the prefill worker an external picker chose.
pub(crate) const PREFILL_PIN_HEADER: &str = "x-prefill-instance-id";

/// The workers an external picker pinned (direct mode: `x-worker-instance-id`,
/// `x-prefill-instance-id`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pins<'h> {
    /// The mixed or decode worker.
    pub worker: Option<&'h str>,
    /// The prefill worker.
    pub prefill: Option<&'h str>,
}

/// Where a request goes once direct mode's pins are applied.
#[derive(Debug, Clone)]
pub(crate) enum Plan<'s> {
    /// One worker of these serves it whole.
    Mixed(Cow<'s, [Target]>),
    /// A prefill worker of the first and a decode worker of the second serve it.
    Disagg(Cow<'s, [Target]>, Cow<'s, [Target]>),
}

impl<'s> Plan<'s> {
    /// The router label of its metrics: `mixed` or `disagg`.
    pub(crate) fn router(&self) -> &'static str {
        match self {
            Self::Mixed(_) => "mixed",
            Self::Disagg(..) => "disagg",
        }
    }

    /// The plan without `workers` (those a moved generation failed on); `None` when a
    /// pool it needs is left empty.
    pub(crate) fn without(self, workers: &[String]) -> Option<Self> {
        let keep = |pool: Cow<'s, [Target]>| -> Option<Cow<'s, [Target]>> {
            let kept: Vec<Target> = pool
                .iter()
                .filter(|t| !workers.contains(&t.record.worker_id))
                .cloned()
                .collect();
            (!kept.is_empty()).then_some(Cow::Owned(kept))
        };
        Some(match self {
            Self::Mixed(c) => Self::Mixed(keep(c)?),
            Self::Disagg(p, d) => Self::Disagg(keep(p)?, keep(d)?),
        })
    }

    /// Every candidate, for the block sizes a request is hashed at.
    pub(crate) fn targets(&self) -> impl Iterator<Item = &Target> {
        let (first, second): (&[Target], &[Target]) = match self {
            Self::Mixed(c) => (c, &[]),
            Self::Disagg(p, d) => (p, d),
        };
        first.iter().chain(second)
    }
}

/// The AutoRouter's decision for `model`, with the pins replacing the picks they name.
pub(crate) fn plan<'s>(
    snapshot: &'s Snapshot,
    model: &str,
    pins: Pins<'_>,
) -> Result<Plan<'s>, RouteError> {
    if pins.worker.is_none() && pins.prefill.is_none() {
        return Ok(match route(snapshot, model)? {
            Route::Mixed(t) => Plan::Mixed(Cow::Borrowed(t)),
            Route::Disagg { prefill, decode } => {
                Plan::Disagg(Cow::Borrowed(prefill), Cow::Borrowed(decode))
            }
        });
    }
    let pool = |mode: DisaggMode| -> Result<Cow<'s, [Target]>, RouteError> {
        let pools = snapshot.models.get(model);
        let targets = pools.map_or(&[][..], |p| match mode {
            DisaggMode::Prefill => &p.prefill,
            _ => &p.decode,
        });
        if targets.is_empty() {
            return Err(RouteError::MissingPool {
                model: model.to_owned(),
                missing: mode.as_str(),
            });
        }
        Ok(Cow::Borrowed(targets))
    };
    let prefill = match pins.prefill {
        Some(id) => Some(Cow::Owned(pinned(
            snapshot,
            PREFILL_PIN_HEADER,
            id,
            model,
            &[DisaggMode::Prefill],
        )?)),
        None => None,
    };
    match pins.worker {
        Some(id) => {
            let modes: &[DisaggMode] = if prefill.is_some() {
                &[DisaggMode::Decode]
            } else {
                &[DisaggMode::Mixed, DisaggMode::Decode]
            };
            let worker = pinned(snapshot, WORKER_PIN_HEADER, id, model, modes)?;
            if worker[0].record.disagg_mode == DisaggMode::Mixed {
                return Ok(Plan::Mixed(Cow::Owned(worker)));
            }
            let prefill = match prefill {
                Some(p) => p,
                None => pool(DisaggMode::Prefill)?,
            };
            Ok(Plan::Disagg(prefill, Cow::Owned(worker)))
        }
        None => Ok(Plan::Disagg(
            prefill.unwrap_or_default(),
            pool(DisaggMode::Decode)?,
        )),
    }
}

/// The worker a direct-mode header pins, as a one-target list (no data-parallel
/// steering, the picker addressed the worker, except for a data-parallel prefill,
/// which is steered to one rank that the prefill/decode handoff names).
pub(crate) fn pinned(
    snapshot: &Snapshot,
    header: &'static str,
    worker_id: &str,
    model: &str,
    modes: &[DisaggMode],
) -> Result<Vec<Target>, RouteError> {
    let unknown = |why: String| RouteError::UnknownWorker {
        header,
        worker: worker_id.to_owned(),
        why,
    };
    let record = snapshot
        .workers
        .get(worker_id)
        .ok_or_else(|| unknown("is not registered".into()))?;
    if snapshot.is_draining(worker_id) {
        return Err(unknown("is draining (its Pod is being deleted)".into()));
    }
    if record.model_name != model {
        return Err(unknown(format!(
            "serves model '{}', not '{model}'",
            record.model_name
        )));
    }
    if !modes.contains(&record.disagg_mode) {
        return Err(unknown(format!(
            "is a {} worker",
            record.disagg_mode.as_str()
        )));
    }
    // A pinned prefill running data-parallel is steered to one rank, so the bootstrap
    // room (and vLLM's `_dp<rank>` engine id) can name where its KV is.
    let dp_rank = (record.disagg_mode == DisaggMode::Prefill && record.dp_ranks() > 1).then(|| {
        record
            .dp_rank
            .unwrap_or_else(|| fastrand::u32(..record.dp_ranks()))
    });
    Ok(vec![Target {
        record: record.clone(),
        key: record.worker_id.clone(),
        dp_rank,
    }])
}

/// The candidates still worth trying: not yet tried, and with a breaker that takes
/// traffic; when every untried candidate's breaker is open, all untried ones (the
/// router dispatches anyway rather than refuse).
pub(crate) fn build_attempt_candidates<'t>(
    candidates: &'t [Target],
    tried: &[String],
    available: impl Fn(&Target) -> bool,
) -> Vec<&'t Target> {
    let untried: Vec<&Target> = candidates
        .iter()
        .filter(|t| !tried.contains(&t.key))
        .collect();
    let healthy: Vec<&Target> = untried.iter().copied().filter(|t| available(t)).collect();
    if healthy.is_empty() { untried } else { healthy }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::registry::Registry;
    use infera_proto::worker::WorkerRecord;

    fn mk_record(id: &str, mode: DisaggMode) -> WorkerRecord {
        let mut r = WorkerRecord::from_json(
            format!(
                r#"{{"worker_id":"{id}","url":"http://{id}","model_name":"m","engine":"vllm"}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        r.disagg_mode = mode;
        r
    }

    #[test]
    fn auto_router_rules() {
        let reg = Registry::new();
        assert!(matches!(
            route(&reg.snapshot(), "m"),
            Err(RouteError::UnknownModel { .. })
        ));
        reg.upsert(mk_record("p:1", DisaggMode::Prefill));
        let err = route(&reg.snapshot(), "m").unwrap_err();
        assert_eq!(
            err,
            RouteError::MissingPool {
                model: "m".into(),
                missing: "decode"
            }
        );
        assert_eq!(err.to_api_error().class.status(), 503);
        reg.upsert(mk_record("x:1", DisaggMode::Mixed));
        // One pool plus mixed workers: the mixed workers serve.
        assert!(matches!(route(&reg.snapshot(), "m").unwrap(), Route::Mixed(t) if t.len() == 1));
        reg.upsert(mk_record("d:1", DisaggMode::Decode));
        // Both pools: disaggregated, even with mixed workers around.
        assert!(matches!(
            route(&reg.snapshot(), "m").unwrap(),
            Route::Disagg { prefill, decode } if prefill.len() == 1 && decode.len() == 1
        ));
        let err = route(&reg.snapshot(), "other").unwrap_err().to_api_error();
        assert_eq!(err.class.status(), 404);
        assert!(err.message.contains("available: m"));
        // Its workers gone, a model served before is unavailable, not unknown.
        for id in ["p:1", "x:1", "d:1"] {
            reg.remove(id);
        }
        let err = route(&reg.snapshot(), "m").unwrap_err();
        assert_eq!(err, RouteError::NoWorkerNow { model: "m".into() });
        assert_eq!(err.to_api_error().class.status(), 503);
        assert_eq!(
            route(&reg.snapshot(), "other")
                .unwrap_err()
                .to_api_error()
                .class
                .status(),
            404
        );
    }

    #[test]
    fn pins_resolve_registered_workers_of_the_right_role() {
        let reg = Registry::new();
        reg.upsert(mk_record("p:1", DisaggMode::Prefill));
        reg.upsert(mk_record("x:1", DisaggMode::Mixed));
        let snap = reg.snapshot();
        let mixed = [DisaggMode::Mixed, DisaggMode::Decode];
        let t = pinned(&snap, "x-worker-instance-id", "x:1", "m", &mixed).unwrap();
        assert_eq!((t.len(), t[0].key.as_str(), t[0].dp_rank), (1, "x:1", None));
        let err = pinned(&snap, "x-worker-instance-id", "p:1", "m", &mixed).unwrap_err();
        assert!(err.to_api_error().message.contains("is a prefill worker"));
        let err = pinned(&snap, "x-worker-instance-id", "gone:1", "m", &mixed)
            .unwrap_err()
            .to_api_error();
        assert_eq!(
            (err.class.status(), err.code.as_deref()),
            (503, Some("worker_not_found"))
        );
        assert!(
            err.message
                .contains("x-worker-instance-id names worker 'gone:1'")
        );
        let err = pinned(&snap, "x-worker-instance-id", "x:1", "other", &mixed).unwrap_err();
        assert!(err.to_api_error().message.contains("serves model 'm'"));
    }

    #[test]
    fn attempt_candidates_skip_tried_and_open_breakers_unless_all_open() {
        let reg = Registry::new();
        for id in ["a:1", "b:1", "c:1"] {
            reg.upsert(mk_record(id, DisaggMode::Mixed));
        }
        let snap = reg.snapshot();
        let Route::Mixed(all) = route(&snap, "m").unwrap() else {
            panic!("mixed")
        };
        let keys = |v: Vec<&Target>| v.iter().map(|t| t.key.clone()).collect::<Vec<_>>();
        assert_eq!(
            keys(build_attempt_candidates(all, &["a:1".into()], |t| t.key != "b:1")),
            vec!["c:1"]
        );
        assert_eq!(
            keys(build_attempt_candidates(all, &["a:1".into()], |_| false)),
            vec!["b:1", "c:1"]
        );
        assert!(
            build_attempt_candidates(all, &["a:1".into(), "b:1".into(), "c:1".into()], |_| true)
                .is_empty()
        );
    }
}
