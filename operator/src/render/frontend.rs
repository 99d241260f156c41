//! The direct-mode frontend of a decode pod behind an InferencePool (pure): a gateway
//! on the pool's target port that sends each request to the decode worker (its pod's)
//! and the prefill worker the endpoint picker named (`x-worker-instance-id`,
//! `x-prefill-instance-id`), running both legs; a request without them is routed as
//! the gateway routes it.

use super::gateway_flags::build_gateway_args;
use super::gateway_site::{gateway_site, reads_model_volume};
use super::model::model_path;
use super::pod::{cpu_and_memory, model_mount, restricted_security};
use super::secrets::etcd_secrets;
use crate::names::Role;
use crate::plan::{Discovery, EnginePlatform, Plan, RolePlan};
use k8s_openapi::api::core::v1::{Container, ContainerPort, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Seconds a stopping frontend keeps serving while the Gateway drops its pod.
const FRONTEND_SHUTDOWN_DELAY_S: u32 = 10;

/// The frontend of `role`'s pods under `platform` (its release's gateway image): only
/// decode pods of a disaggregated deployment with an InferencePool have one.
pub fn build_frontend(
    plan: &Plan,
    role: &RolePlan,
    platform: &EnginePlatform,
) -> Option<Container> {
    let listen = plan.deployment.frontend_port()?;
    if role.role != Role::Decode {
        return None;
    }
    let model_path = model_path(&plan.deployment.model.volume);
    let site = gateway_site(plan, &model_path, listen, FRONTEND_SHUTDOWN_DELAY_S);
    let mut args = vec!["--router-mode".to_owned(), "direct".to_owned()];
    args.extend(build_gateway_args(&plan.deployment.gateway.routing, &site));
    // The sidecar's API token (Kubernetes discovery) or etcd's Secrets, and the model
    // when the tokenizer is read from it.
    let mut mounts = Vec::new();
    if plan.discovery == Discovery::Kubernetes {
        mounts.push(super::token::mount());
    }
    mounts.extend(etcd_secrets(&plan.discovery).into_iter().map(|(_, m)| m));
    if reads_model_volume(plan) {
        mounts.push(model_mount());
    }
    Some(Container {
        name: "frontend".into(),
        image: Some(platform.gateway.clone()),
        args: Some(args),
        ports: Some(vec![ContainerPort {
            name: Some("frontend".into()),
            container_port: i32::from(listen),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/ready".into()),
                port: IntOrString::Int(i32::from(listen)),
                ..Default::default()
            }),
            period_seconds: Some(2),
            failure_threshold: Some(2),
            ..Default::default()
        }),
        resources: Some(cpu_and_memory("100m", "128Mi", "1Gi")),
        security_context: Some(restricted_security()),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    })
}
