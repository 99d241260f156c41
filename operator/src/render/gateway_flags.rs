//! The gateway's command line (pure), built once for the operator's gateway pods and for
//! `infera up`: how it routes comes from the deployment's spec the same way for both;
//! where it listens, how it stops, where it finds workers and what it asks of clients
//! differ between a pod and a laptop, and each caller states them.

use super::engine::MODEL_MOUNT;
use crate::api::resolve::launch;
use crate::api::{InferaDeploymentSpec, RoutingPolicy};

/// How a deployment's gateway routes.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayRouting {
    /// Policy.
    pub policy: RoutingPolicy,
    /// kv-aware overlap weights: mixed, prefill, decode.
    pub weights: [f64; 3],
    /// NATS server the KV events arrive through (messaging backend nats).
    pub nats_url: Option<String>,
    /// Tokenizer folder (see [`GatewayRouting::from_spec`]).
    pub tokenizer: Option<String>,
    /// Retention class of KV without a client hint, when kvd is on.
    pub default_retention: Option<String>,
}

impl GatewayRouting {
    /// From `spec` (the platform's endpoints filled in) with the model at `model_path`.
    /// The tokenizer is `spec.gateway.tokenizer` (relative to the model folder unless
    /// absolute), else the model's tokenizer, else, for real engines, the model folder
    /// itself (a simulator without a tokenizer counts bytes, and so does the gateway).
    pub fn from_spec(spec: &InferaDeploymentSpec, model_path: &str) -> Self {
        let g = &spec.gateway;
        let relative = |t: &str| {
            if t.starts_with('/') {
                t.to_owned()
            } else {
                format!("{model_path}/{}", t.trim_matches('/'))
            }
        };
        let real = !launch(spec.engine.kind, spec.engine.sim_flavor).is_sim();
        let tokenizer = g
            .tokenizer
            .as_deref()
            .or(spec.model.tokenizer.as_deref())
            .map(relative)
            .or_else(|| real.then(|| model_path.to_owned()));
        let nats_url = super::nats_url(spec).map(str::to_owned);
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
            nats_url,
            tokenizer,
            default_retention,
        }
    }

    /// Whether the tokenizer lies in the model volume (the pod must mount it).
    pub fn reads_model_volume(&self) -> bool {
        self.tokenizer
            .as_deref()
            .is_some_and(|t| t.starts_with(MODEL_MOUNT))
    }
}

/// What differs between a gateway pod and `infera up`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewaySite {
    /// Listen address.
    pub host: String,
    /// Listen port.
    pub port: u16,
    /// How it stops (`--shutdown-delay-s`, `--shutdown-grace-s`).
    pub lifecycle: Vec<String>,
    /// Where it finds workers (`--discovery-backend` and its settings).
    pub discovery: Vec<String>,
    /// What it asks of clients (API keys, TLS).
    pub access: Vec<String>,
}

fn policy(p: RoutingPolicy) -> &'static str {
    match p {
        RoutingPolicy::KvAware => "kv-aware",
        RoutingPolicy::RoundRobin => "round-robin",
        RoutingPolicy::Random => "random",
    }
}

/// `--kv-event-transport nats --nats-server URL` (the gateway and the sidecar take the
/// same flags).
pub fn nats_flags(url: &str) -> [String; 4] {
    [
        "--kv-event-transport".into(),
        "nats".into(),
        "--nats-server".into(),
        url.into(),
    ]
}

/// The gateway's flags.
pub fn build_gateway_args(routing: &GatewayRouting, site: &GatewaySite) -> Vec<String> {
    let [mixed, prefill, decode] = routing.weights;
    let mut args: Vec<String> = vec![
        "--host".into(),
        site.host.clone(),
        "--port".into(),
        site.port.to_string(),
        "--router-policy".into(),
        policy(routing.policy).into(),
        "--kv-overlap-weight".into(),
        mixed.to_string(),
        "--kv-prefill-overlap-weight".into(),
        prefill.to_string(),
        "--kv-decode-overlap-weight".into(),
        decode.to_string(),
    ];
    args.extend(site.lifecycle.iter().cloned());
    args.extend(site.discovery.iter().cloned());
    if let Some(url) = &routing.nats_url {
        args.extend(nats_flags(url));
    }
    if let Some(tokenizer) = &routing.tokenizer {
        args.extend(["--router-tokenizer-path".into(), tokenizer.clone()]);
    }
    if let Some(r) = &routing.default_retention {
        args.extend(["--default-retention".into(), r.clone()]);
    }
    args.extend(site.access.iter().cloned());
    args
}
