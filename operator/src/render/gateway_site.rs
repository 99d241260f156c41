//! A gateway process of the deployment (pure): the gateway's pods, the endpoint
//! picker's and the decode pods' frontends all find workers, events and the tokenizer
//! the same way; what differs is where each listens and what it asks of clients.

use super::engine::MODEL_MOUNT;
use super::gateway_flags::{GatewaySite, nats_flags};
use super::pod::SIDECAR_PORT;
use super::secrets::etcd_client_args;
use crate::names;
use crate::plan::{Discovery, Plan, Tokenizer};

/// Where a gateway process of the deployment finds workers: the gateway's, the
/// endpoint picker's and the decode pods' frontends alike.
pub fn discovery_args(plan: &Plan) -> Vec<String> {
    match &plan.discovery {
        Discovery::Etcd(etcd) => {
            let mut args = vec!["--discovery-backend".into(), "etcd".into()];
            args.extend(etcd_client_args(etcd));
            args
        }
        Discovery::Kubernetes => vec![
            "--discovery-backend".into(),
            "kubernetes".into(),
            "--k8s-label-selector".into(),
            names::engine_selector_string(&plan.owner.name),
            "--k8s-namespace".into(),
            plan.owner.namespace.clone(),
        ],
    }
}

/// A gateway process of the deployment listening on `port` and stopping after
/// `shutdown_delay_s`: discovery, messaging and tokenizer as the gateway's, no client
/// access settings (the caller adds those it serves).
pub fn gateway_site(
    plan: &Plan,
    model_path: &str,
    port: u16,
    shutdown_delay_s: u32,
) -> GatewaySite {
    GatewaySite {
        host: "0.0.0.0".into(),
        port,
        // On SIGTERM, stay up (not ready, closing connections) until the Service has
        // dropped the pod, so a rolling update or a deleted pod refuses no client.
        lifecycle: vec!["--shutdown-delay-s".into(), shutdown_delay_s.to_string()],
        discovery: discovery_args(plan),
        messaging: plan
            .nats_url
            .as_deref()
            .map(|url| [&nats_flags(url)[..], &plan.request_plane].concat())
            .unwrap_or_default(),
        model_path: model_path.to_owned(),
        tokenizer_from_workers: tokenizer_from_workers(plan).then_some(SIDECAR_PORT),
        access: Vec::new(),
    }
}

/// Whether the gateway fetches its tokenizer from the workers' sidecars: when it is the
/// one the engines load, which a sidecar serves: the model folder itself, or for the
/// simulator the `model.tokenizer` folder it is given. Then the gateway pod mounts no
/// model volume, wherever that lives.
pub fn tokenizer_from_workers(plan: &Plan) -> bool {
    let d = &plan.deployment;
    match &d.gateway.routing.tokenizer {
        Some(Tokenizer::InModel(rel)) => {
            rel.is_empty() || (d.launch.is_sim() && d.model.tokenizer.as_ref() == Some(rel))
        }
        _ => false,
    }
}

/// Whether the gateway reads its tokenizer from the model volume (the pod must mount
/// it): a folder in the model other than the engines' own, or an absolute path into it.
pub fn reads_model_volume(plan: &Plan) -> bool {
    match &plan.deployment.gateway.routing.tokenizer {
        Some(Tokenizer::InModel(_)) => !tokenizer_from_workers(plan),
        Some(Tokenizer::Absolute(path)) => path.starts_with(MODEL_MOUNT),
        None => false,
    }
}
