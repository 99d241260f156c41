//! The gateway's command line (pure), built once for the operator's gateway pods and for
//! `infera up`: how it routes is the plan's [`GatewayRouting`], the same for both; where
//! it listens, how it stops, where it finds workers and the model, and what it asks of
//! clients differ between a pod and a laptop, and each caller states them.

use crate::api::RoutingPolicy;
use crate::plan::{GatewayRouting, Tokenizer};

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
    /// Where KV events arrive, when not from the workers over ZMQ ([`nats_flags`]).
    pub messaging: Vec<String>,
    /// The model folder a tokenizer in it is found under.
    pub model_path: String,
    /// A tokenizer in the model folder is fetched from the workers' sidecars on this
    /// port instead (`--router-tokenizer-from-workers`): the gateway pod does not mount
    /// the model volume, which may live on other nodes.
    pub tokenizer_from_workers: Option<u16>,
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
    args.extend(site.messaging.iter().cloned());
    match (&routing.tokenizer, site.tokenizer_from_workers) {
        (Some(Tokenizer::InModel(_)), Some(port)) => {
            args.extend(["--router-tokenizer-from-workers".into(), port.to_string()]);
        }
        (Some(tokenizer), _) => {
            args.extend([
                "--router-tokenizer-path".into(),
                tokenizer.path(&site.model_path),
            ]);
        }
        (None, _) => {}
    }
    if let Some(r) = &routing.default_retention {
        args.extend(["--default-retention".into(), r.clone()]);
    }
    if routing.migration_limit > 0 {
        args.extend([
            "--migration-limit".into(),
            routing.migration_limit.to_string(),
        ]);
    }
    args.extend(routing.flow.iter().cloned());
    args.extend(site.access.iter().cloned());
    args
}
