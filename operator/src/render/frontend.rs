//! The direct-mode frontend of a decode pod behind an InferencePool (pure): a gateway
//! on the pool's target port that sends each request to the decode worker (its pod's)
//! and the prefill worker the endpoint picker named (`x-worker-instance-id`,
//! `x-prefill-instance-id`), running both legs; a request without them is rotated
//! over the workers.

use super::gateway_site::gateway_site;
use super::pod::{cpu_and_memory, restricted_security};
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
    // Where it listens, how it stops, where it finds workers and how it reaches them;
    // nothing of the gateway's routing (policy, weights, tokenizer, migration): a
    // request without the picker's pins is rotated. So tuning the gateway changes no
    // engine pod, and no prefill or decode engine restarts for it.
    let site = gateway_site(plan, "", listen, FRONTEND_SHUTDOWN_DELAY_S);
    let mut args = vec![
        "--router-mode".to_owned(),
        "direct".to_owned(),
        "--host".to_owned(),
        site.host,
        "--port".to_owned(),
        listen.to_string(),
    ];
    args.extend(site.lifecycle);
    args.extend(site.discovery);
    args.extend(site.messaging);
    // The sidecar's API token (Kubernetes discovery) or etcd's Secrets.
    let mut mounts = Vec::new();
    if plan.discovery == Discovery::Kubernetes {
        mounts.push(super::token::mount());
    }
    mounts.extend(etcd_secrets(&plan.discovery).into_iter().map(|(_, m)| m));
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
