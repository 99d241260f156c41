//! Choosing where a request goes (pure). AutoRouter: mixed workers serve the request;
//! a model with only prefill/decode pools needs both (a missing pool is a 503 naming
//! it); prefill/decode disaggregation itself arrives with the DisaggRouter.

use crate::registry::{Snapshot, Target};
use infera_proto::error_class::{ApiError, ErrorClass};

/// Why a request cannot be routed.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteError {
    /// No worker serves the model.
    UnknownModel {
        /// Requested model.
        model: String,
        /// Models that are served.
        available: Vec<String>,
    },
    /// Only one prefill/decode pool exists and no mixed worker.
    MissingPool {
        /// Model.
        model: String,
        /// `prefill` or `decode`.
        missing: &'static str,
    },
    /// Both pools exist but this gateway cannot split requests yet.
    DisaggregationUnavailable {
        /// Model.
        model: String,
    },
}

impl RouteError {
    /// The client-facing error.
    pub fn to_api_error(&self) -> ApiError {
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
            Self::MissingPool { model, missing } => ApiError::new(
                ErrorClass::ServiceUnavailable,
                format!("model '{model}' has prefill/decode workers but no {missing} worker is available"),
            )
            .with_code(format!("missing_{missing}_pool")),
            Self::DisaggregationUnavailable { model } => ApiError::new(
                ErrorClass::NotImplemented,
                format!(
                    "model '{model}' is served by prefill/decode workers only; prefill/decode routing is not available yet in this gateway"
                ),
            ),
        }
    }
}

/// The candidate targets for `model`, in a stable order.
pub fn route<'s>(snapshot: &'s Snapshot, model: &str) -> Result<&'s [Target], RouteError> {
    let Some(pools) = snapshot.models.get(model) else {
        return Err(RouteError::UnknownModel {
            model: model.to_owned(),
            available: snapshot
                .model_names()
                .into_iter()
                .map(str::to_owned)
                .collect(),
        });
    };
    if !pools.mixed.is_empty() {
        return Ok(&pools.mixed);
    }
    match (pools.prefill.is_empty(), pools.decode.is_empty()) {
        (false, false) => Err(RouteError::DisaggregationUnavailable {
            model: model.to_owned(),
        }),
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

/// The candidates still worth trying: not yet tried, and with a breaker that takes
/// traffic; when every untried candidate's breaker is open, all untried ones (the
/// router dispatches anyway rather than refuse).
pub fn build_attempt_candidates<'t>(
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
    use crate::registry::Registry;
    use infera_proto::worker::{DisaggMode, WorkerRecord};

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
        reg.upsert(mk_record("d:1", DisaggMode::Decode));
        assert_eq!(
            route(&reg.snapshot(), "m")
                .unwrap_err()
                .to_api_error()
                .class
                .status(),
            501
        );
        reg.upsert(mk_record("x:1", DisaggMode::Mixed));
        assert_eq!(route(&reg.snapshot(), "m").unwrap().len(), 1);
        let err = route(&reg.snapshot(), "other").unwrap_err().to_api_error();
        assert_eq!(err.class.status(), 404);
        assert!(err.message.contains("available: m"));
    }

    #[test]
    fn attempt_candidates_skip_tried_and_open_breakers_unless_all_open() {
        let reg = Registry::new();
        for id in ["a:1", "b:1", "c:1"] {
            reg.upsert(mk_record(id, DisaggMode::Mixed));
        }
        let snap = reg.snapshot();
        let all = route(&snap, "m").unwrap();
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
