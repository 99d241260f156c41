//! The gateway (pure): a Deployment and Service running `infera-gateway` with the
//! deployment's routing flags, and the ServiceAccounts, Roles and RoleBindings that the
//! gateway and the engine sidecars need for Kubernetes discovery (the gateway reads Pods;
//! sidecars patch their own Pod's annotation).

use super::engine::ENGINE_PORT;
use super::gateway_flags::{GatewayRouting, GatewaySite, build_gateway_args};
use super::names;
use super::pod::{model_mount, model_volume, restricted_security};
use super::secrets::{etcd_client_args, etcd_secrets, one_key, secret_volume};
use super::{Child, Ctx, Kind, ModelVolume, child};
use crate::api::{DiscoveryBackend, InferaDeploymentSpec, ServiceType};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, HTTPGetAction, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    Service, ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role as RbacRole, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// The ServiceAccounts of the engine pods and of the gateways and, for Kubernetes
/// discovery, their Roles: the engines' sidecars may patch Pods (each its own worker
/// annotation) and nothing else; the gateways may only read Pods. With etcd discovery
/// neither account has any permission (and no pod mounts a token).
pub fn identity(ctx: &Ctx<'_>, spec: &InferaDeploymentSpec) -> Vec<Child> {
    let kubernetes = spec.discovery.backend == DiscoveryBackend::Kubernetes;
    let mut out = Vec::new();
    for (name, component, verbs) in [
        (names::service_account(ctx.name), "identity", &["patch"][..]),
        (
            names::gateway(ctx.name),
            "gateway",
            &["get", "list", "watch"][..],
        ),
    ] {
        let labels = names::instance_labels(ctx.name, component);
        out.push(child(
            Kind::ServiceAccount,
            ServiceAccount {
                metadata: ctx.meta(name.clone(), labels.clone()),
                ..Default::default()
            },
            Some(ctx.owner),
        ));
        if kubernetes {
            out.extend(pod_role(ctx, &name, labels, verbs));
        }
    }
    out
}

/// A Role over Pods with `verbs`, bound to the ServiceAccount `name`.
fn pod_role(
    ctx: &Ctx<'_>,
    name: &str,
    labels: BTreeMap<String, String>,
    verbs: &[&str],
) -> [Child; 2] {
    let role = RbacRole {
        metadata: ctx.meta(name.to_owned(), labels.clone()),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: ctx.meta(name.to_owned(), labels),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.to_owned(),
            namespace: Some(ctx.namespace.to_owned()),
            ..Default::default()
        }]),
    };
    [
        child(Kind::Role, role, Some(ctx.owner)),
        child(Kind::RoleBinding, binding, Some(ctx.owner)),
    ]
}

/// Seconds a stopping gateway keeps serving (`--shutdown-delay-s`): kube-proxy drops a
/// terminating pod from its Service within about a second on an idle node, longer on a
/// loaded one.
const GATEWAY_SHUTDOWN_DELAY_S: u32 = 10;

/// The grace period of a gateway pod: the delay, the gateway's own 30 s for open
/// streams (`--shutdown-grace-s`), and slack.
const GATEWAY_GRACE_S: i64 = GATEWAY_SHUTDOWN_DELAY_S as i64 + 30 + 5;

/// The gateway's command-line flags in its pod, routing as `routing` says.
fn gateway_args(
    ctx: &Ctx<'_>,
    spec: &InferaDeploymentSpec,
    routing: &GatewayRouting,
) -> Vec<String> {
    let g = &spec.gateway;
    let discovery = match (&spec.discovery.backend, &spec.discovery.etcd) {
        (DiscoveryBackend::Etcd, Some(etcd)) => {
            let mut args = vec!["--discovery-backend".into(), "etcd".into()];
            args.extend(etcd_client_args(etcd));
            args
        }
        _ => vec![
            "--discovery-backend".into(),
            "kubernetes".into(),
            "--k8s-label-selector".into(),
            names::engine_selector_string(ctx.name),
            "--k8s-namespace".into(),
            ctx.namespace.into(),
        ],
    };
    let mut access = Vec::new();
    if g.api_keys_secret_ref.is_some() {
        access.extend([
            "--api-keys-file".into(),
            format!("{API_KEYS_DIR}/{API_KEYS_FILE}"),
        ]);
        if g.metrics_require_auth {
            access.push("--metrics-require-auth".into());
        }
    }
    if g.tls.is_some() {
        access.extend(["--tls-cert-file".into(), format!("{TLS_DIR}/tls.crt")]);
        access.extend(["--tls-key-file".into(), format!("{TLS_DIR}/tls.key")]);
    }
    let site = GatewaySite {
        host: "0.0.0.0".into(),
        port: ENGINE_PORT,
        // On SIGTERM, stay up (not ready, closing connections) until the Service has
        // dropped the pod, so a rolling update or a deleted pod refuses no client.
        lifecycle: vec![
            "--shutdown-delay-s".into(),
            GATEWAY_SHUTDOWN_DELAY_S.to_string(),
        ],
        discovery,
        access,
    };
    build_gateway_args(routing, &site)
}

/// Where the API keys Secret is mounted, and the one file of it the gateway reads.
const API_KEYS_DIR: &str = "/etc/infera/api-keys";
const API_KEYS_FILE: &str = "keys";
/// Where the TLS Secret is mounted.
const TLS_DIR: &str = "/etc/infera/tls";

/// The Secret volumes (and their mounts) the gateway reads: API keys, its certificate,
/// etcd's TLS and auth.
fn secret_volumes(spec: &InferaDeploymentSpec) -> Vec<(Volume, VolumeMount)> {
    let mut out = Vec::new();
    if let Some(keys) = &spec.gateway.api_keys_secret_ref {
        let items = one_key(keys, API_KEYS_FILE);
        out.push(secret_volume("api-keys", &keys.name, items, API_KEYS_DIR));
    }
    if let Some(tls) = &spec.gateway.tls {
        out.push(secret_volume("tls", &tls.secret_name, None, TLS_DIR));
    }
    out.extend(etcd_secrets(spec));
    out
}

fn probe(path: &str, tls: bool) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            scheme: tls.then(|| "HTTPS".into()),
            ..Default::default()
        }),
        period_seconds: Some(5),
        failure_threshold: Some(3),
        timeout_seconds: Some(3),
        ..Default::default()
    }
}

fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), Quantity("500m".into())),
            ("memory".into(), Quantity("256Mi".into())),
        ])),
        limits: Some(BTreeMap::from([("memory".into(), Quantity("2Gi".into()))])),
        ..Default::default()
    }
}

/// The gateway Deployment and Service.
pub fn gateway(
    ctx: &Ctx<'_>,
    spec: &InferaDeploymentSpec,
    model: &ModelVolume,
    model_path: &str,
) -> Vec<Child> {
    let name = names::gateway(ctx.name);
    let labels = names::instance_labels(ctx.name, "gateway");
    let selector = names::gateway_selector(ctx.name);
    let routing = GatewayRouting::from_spec(spec, model_path);
    let tls = spec.gateway.tls.is_some();
    let (mut volumes, mut mounts): (Vec<Volume>, Vec<VolumeMount>) =
        secret_volumes(spec).into_iter().unzip();
    if routing.reads_model_volume() {
        volumes.push(model_volume(model));
        mounts.push(model_mount());
    }
    let container = Container {
        name: "gateway".into(),
        image: Some(
            spec.gateway
                .image
                .clone()
                .unwrap_or_else(|| ctx.images.gateway.clone()),
        ),
        args: Some(gateway_args(ctx, spec, &routing)),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: i32::from(ENGINE_PORT),
            ..Default::default()
        }]),
        readiness_probe: Some(probe("/ready", tls)),
        liveness_probe: Some(Probe {
            period_seconds: Some(10),
            ..probe("/health", tls)
        }),
        resources: Some(
            spec.gateway
                .resources
                .clone()
                .unwrap_or_else(default_resources),
        ),
        security_context: Some(restricted_security()),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    };
    let deployment = Deployment {
        metadata: ctx.meta(name.clone(), labels.clone()),
        spec: Some(DeploymentSpec {
            replicas: Some(spec.gateway.replicas),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(names::gateway(ctx.name)),
                    // Only Kubernetes discovery talks to the API server.
                    automount_service_account_token: Some(
                        spec.discovery.backend == DiscoveryBackend::Kubernetes,
                    ),
                    termination_grace_period_seconds: Some(GATEWAY_GRACE_S),
                    containers: vec![container],
                    volumes: (!volumes.is_empty()).then_some(volumes),
                    enable_service_links: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let service_type = match spec.gateway.service.type_ {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
        ServiceType::LoadBalancer => "LoadBalancer",
    };
    let mut service_labels = labels;
    if let Some(access) = names::metrics_access(tls, spec.gateway.metrics_require_auth) {
        service_labels.insert(names::METRICS_ACCESS_LABEL.into(), access.into());
    }
    let service = Service {
        metadata: ctx.meta(name, service_labels),
        spec: Some(ServiceSpec {
            type_: Some(service_type.into()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: spec.gateway.service.port,
                target_port: Some(IntOrString::String("http".into())),
                app_protocol: tls.then(|| "https".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![
        child(Kind::Service, service, Some(ctx.owner)),
        child(Kind::Deployment, deployment, Some(ctx.owner)),
    ]
}
