//! How a deployment's gateway routes, decided from its spec once for the operator's
//! gateway pods and for `infera up`; where the model folder is differs between a pod and
//! a laptop, so the tokenizer is kept relative to it until the flags are built.

use crate::api::{InferaDeploymentSpec, RoutingPolicy};
use infera_engine_prep::Launch;

/// Where the gateway's tokenizer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tokenizer {
    /// An absolute path.
    Absolute(String),
    /// A folder relative to the model folder ("" for the model folder itself).
    InModel(String),
}

impl Tokenizer {
    /// From a spec's field: absolute when it starts with `/`, else in the model folder.
    pub fn from_field(path: &str) -> Self {
        if path.starts_with('/') {
            Self::Absolute(path.to_owned())
        } else {
            Self::InModel(path.trim_matches('/').to_owned())
        }
    }

    /// The path, with the model folder at `model_path`.
    pub fn path(&self, model_path: &str) -> String {
        match self {
            Self::Absolute(path) => path.clone(),
            Self::InModel(rel) if rel.is_empty() => model_path.to_owned(),
            Self::InModel(rel) => format!("{model_path}/{rel}"),
        }
    }
}

/// How a deployment's gateway routes.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayRouting {
    /// Policy.
    pub policy: RoutingPolicy,
    /// kv-aware overlap weights: mixed, prefill, decode.
    pub weights: [f64; 3],
    /// Tokenizer (see [`GatewayRouting::from_spec`]).
    pub tokenizer: Option<Tokenizer>,
    /// Retention class of KV without a client hint, when kvd is on.
    pub default_retention: Option<String>,
    /// Moves of a live generation to another worker (`--migration-limit`).
    pub migration_limit: u32,
    /// Flow control's flags (none when it is off).
    pub flow: Vec<String>,
}

impl GatewayRouting {
    /// From `spec`, whose workers run `launch`. The tokenizer is `spec.gateway.tokenizer`
    /// (relative to the model folder unless absolute), else the model's tokenizer, else,
    /// for real engines, the model folder itself (a simulator without a tokenizer counts
    /// bytes, and so does the gateway).
    pub fn from_spec(spec: &InferaDeploymentSpec, launch: Launch) -> Self {
        let g = &spec.gateway;
        let tokenizer = g
            .tokenizer
            .as_deref()
            .or(spec.model.tokenizer.as_deref())
            .map(Tokenizer::from_field)
            .or_else(|| (!launch.is_sim()).then(|| Tokenizer::InModel(String::new())));
        let default_retention = serde_json::to_value(spec.kv_cache.default_retention)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .filter(|_| spec.kv_cache.enabled);
        Self {
            policy: g.policy,
            weights: [
                g.kv_overlap_weight,
                g.kv_prefill_overlap_weight,
                g.kv_decode_overlap_weight,
            ],
            tokenizer,
            default_retention,
            migration_limit: g.migration_limit,
            flow: g.flow_control.gateway_flags(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizers_resolve_against_the_model_folder_unless_absolute() {
        let cases = [
            ("/opt/tok", "/opt/tok"),
            ("tok/", "/model-store/m/tok"),
            ("", "/model-store/m"),
        ];
        for (field, want) in cases {
            assert_eq!(Tokenizer::from_field(field).path("/model-store/m"), want);
        }
    }
}
