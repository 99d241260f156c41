//! The gateway (pure): a Deployment and Service running `infera-gateway` with the
//! deployment's routing flags, and the ServiceAccounts, Roles and RoleBindings that the
//! gateway and the engine sidecars need for Kubernetes discovery (the gateway reads Pods;
//! sidecars patch their own Pod's annotation), and, with `spec.gateway.scalingApi`, the
//! one Role the scaling API needs (`get` and `patch` of this InferaDeployment alone).

use super::engine::ENGINE_PORT;
use super::gateway_flags::{GatewaySite, build_gateway_args};
use super::gateway_site::{gateway_site, reads_model_volume};
use super::overrides::apply_overrides;
use super::pod::{
    SIDECAR_PORT, cpu_and_memory, drain_token, model_mount, model_volume, placement,
    restricted_security,
};
use super::pull::{PodKind, apply_pull};
use super::secrets::{etcd_secrets, one_key, secret_volume};
use super::workers::one_at_a_time;
use super::{Child, Kind, child};
use crate::api::ServiceType;
use crate::names;
use crate::plan::{Discovery, Plan, ScalingAccess, ValidateError};
use infera_proto::sidecar::DRAIN_TOKEN_ENV;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, HTTPGetAction, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, Service, ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role as RbacRole, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// The ServiceAccounts of the engine pods and of the gateways and, for Kubernetes
/// discovery, their Roles: the engines' sidecars may patch Pods (each its own worker
/// annotation) and nothing else; the gateways may only read Pods. With etcd discovery
/// neither account has any permission (and no pod mounts a token).
pub fn build_identity(plan: &Plan) -> Vec<Child> {
    let kubernetes = plan.discovery == Discovery::Kubernetes;
    // Decode pods' frontends (behind an InferencePool) read the workers' Pods too.
    let engine_verbs: &[&str] = match plan.deployment.frontend_port() {
        Some(_) => &["get", "list", "watch", "patch"],
        None => &["patch"],
    };
    let mut out = Vec::new();
    for (name, component, verbs) in [
        (
            names::service_account(&plan.owner.name),
            "identity",
            engine_verbs,
        ),
        (
            names::gateway(&plan.owner.name),
            "gateway",
            &["get", "list", "watch"][..],
        ),
    ] {
        let labels = names::instance_labels(&plan.owner.name, component);
        out.push(child(
            Kind::ServiceAccount,
            ServiceAccount {
                metadata: plan.owner.meta(name.clone(), labels.clone()),
                ..Default::default()
            },
            Some(&plan.owner.reference),
        ));
        if kubernetes {
            out.extend(pod_role(plan, &name, labels, verbs));
        }
    }
    if let Some(access) = &plan.deployment.gateway.scaling_api {
        out.extend(scaling_role(plan, access));
    }
    out
}

/// The Role of the gateways' scaling API, bound to their ServiceAccount: `get` and
/// `patch` of this InferaDeployment, `get` of the PDTopology it names; nothing else.
fn scaling_role(plan: &Plan, access: &ScalingAccess) -> [Child; 2] {
    let account = names::gateway(&plan.owner.name);
    let name = format!("{account}-scaling");
    let labels = names::instance_labels(&plan.owner.name, "gateway");
    let rule = |resource: &str, object: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec!["infera.amd.com".into()]),
        resources: Some(vec![resource.into()]),
        resource_names: Some(vec![object.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    };
    let mut rules = vec![rule(
        "inferadeployments",
        &plan.owner.name,
        &["get", "patch"],
    )];
    if let Some(topology) = &access.topology {
        rules.push(rule("pdtopologies", topology, &["get"]));
    }
    let role = RbacRole {
        metadata: plan.owner.meta(name.clone(), labels.clone()),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: plan.owner.meta(name.clone(), labels),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account,
            namespace: Some(plan.owner.namespace.clone()),
            ..Default::default()
        }]),
    };
    [
        child(Kind::Role, role, Some(&plan.owner.reference)),
        child(Kind::RoleBinding, binding, Some(&plan.owner.reference)),
    ]
}

/// A Role over Pods with `verbs`, bound to the ServiceAccount `name`.
pub(super) fn pod_role(
    plan: &Plan,
    name: &str,
    labels: BTreeMap<String, String>,
    verbs: &[&str],
) -> [Child; 2] {
    let role = RbacRole {
        metadata: plan.owner.meta(name.to_owned(), labels.clone()),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: plan.owner.meta(name.to_owned(), labels),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.to_owned(),
            namespace: Some(plan.owner.namespace.clone()),
            ..Default::default()
        }]),
    };
    [
        child(Kind::Role, role, Some(&plan.owner.reference)),
        child(Kind::RoleBinding, binding, Some(&plan.owner.reference)),
    ]
}

/// Seconds a stopping gateway keeps serving (`--shutdown-delay-s`): kube-proxy drops a
/// terminating pod from its Service within about a second on an idle node, longer on a
/// loaded one.
const GATEWAY_SHUTDOWN_DELAY_S: u32 = 10;

/// The grace period of a gateway pod: the delay, the gateway's own 30 s for open
/// streams (`--shutdown-grace-s`), and slack.
const GATEWAY_GRACE_S: i64 = GATEWAY_SHUTDOWN_DELAY_S as i64 + 30 + 5;

/// What a gateway process serving the deployment's HTTP API asks of clients: the API
/// keys, and its certificate (mounted by [`secret_volumes`]).
pub(super) fn access_args(plan: &Plan) -> Vec<String> {
    let g = &plan.deployment.gateway;
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
    access
}

/// The gateway's command-line flags in its pod, the model folder at `model_path`: the
/// routing every gateway process of the deployment shares, then what only the gateway
/// pods serve (the earlier server's control endpoints).
fn gateway_args(plan: &Plan, model_path: &str) -> Vec<String> {
    let site = GatewaySite {
        access: access_args(plan),
        ..gateway_site(plan, model_path, ENGINE_PORT, GATEWAY_SHUTDOWN_DELAY_S)
    };
    let mut args = build_gateway_args(&plan.deployment.gateway.routing, &site);
    if plan.deployment.kvd.is_some() {
        // Prewarm hints go to the kvd beside each engine through its sidecar.
        args.extend(["--worker-sidecar-port".into(), SIDECAR_PORT.to_string()]);
    }
    if plan.deployment.gateway.scaling_api.is_some() {
        args.extend([
            "--enable-scaling-api".into(),
            "--deployment".into(),
            plan.owner.name.clone(),
        ]);
    }
    args
}

/// Where the API keys Secret is mounted, and the one file of it the gateway reads.
const API_KEYS_DIR: &str = "/etc/infera/api-keys";
const API_KEYS_FILE: &str = "keys";
/// Where the TLS Secret is mounted.
const TLS_DIR: &str = "/etc/infera/tls";

/// The Secret volumes (and their mounts) the gateway reads: API keys, its certificate,
/// etcd's TLS and auth.
pub(super) fn secret_volumes(plan: &Plan) -> Vec<(Volume, VolumeMount)> {
    let g = &plan.deployment.gateway;
    let mut out = Vec::new();
    if let Some(keys) = &g.api_keys_secret_ref {
        let items = one_key(keys, API_KEYS_FILE);
        out.push(secret_volume("api-keys", &keys.name, items, API_KEYS_DIR));
    }
    if let Some(tls) = &g.tls {
        out.push(secret_volume("tls", &tls.secret_name, None, TLS_DIR));
    }
    out.extend(etcd_secrets(&plan.discovery));
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
    cpu_and_memory("500m", "256Mi", "2Gi")
}

/// A Deployment of `replicas` pods from `template` that rolls one new pod in before
/// taking an old one out: it never serves with fewer.
pub(super) fn build_surging_deployment(
    metadata: ObjectMeta,
    replicas: i32,
    selector: BTreeMap<String, String>,
    template: PodTemplateSpec,
) -> Deployment {
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The gateway Deployment and Service, the model folder at `model_path` in its pod.
pub fn build_gateway(plan: &Plan, model_path: &str) -> Result<Vec<Child>, ValidateError> {
    let instance = plan.owner.name.as_str();
    let g = &plan.deployment.gateway;
    let name = names::gateway(instance);
    let labels = names::instance_labels(instance, "gateway");
    let selector = names::gateway_selector(instance);
    let tls = g.tls.is_some();
    let (mut volumes, mut mounts): (Vec<Volume>, Vec<VolumeMount>) =
        secret_volumes(plan).into_iter().unzip();
    if reads_model_volume(plan) {
        volumes.push(model_volume(&plan.deployment.model.volume));
        mounts.push(model_mount());
    }
    let container = Container {
        name: "gateway".into(),
        image: Some(
            g.image
                .clone()
                .unwrap_or_else(|| plan.images.gateway.clone()),
        ),
        args: Some(gateway_args(plan, model_path)),
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
        resources: Some(g.resources.clone().unwrap_or_else(default_resources)),
        security_context: Some(restricted_security()),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        // What the sidecars ask of a caller outside their pod: the gateway forwards
        // prewarm hints to them.
        env: plan.deployment.kvd.as_ref().map(|_| {
            vec![EnvVar {
                name: DRAIN_TOKEN_ENV.into(),
                value: Some(drain_token(&plan.owner.reference.uid)),
                ..Default::default()
            }]
        }),
        ..Default::default()
    };
    let mut spec = PodSpec {
        service_account_name: Some(names::gateway(instance)),
        // Only Kubernetes discovery and the scaling API talk to the API server.
        automount_service_account_token: Some(
            plan.discovery == Discovery::Kubernetes || g.scaling_api.is_some(),
        ),
        termination_grace_period_seconds: Some(GATEWAY_GRACE_S),
        containers: vec![container],
        volumes: (!volumes.is_empty()).then_some(volumes),
        enable_service_links: Some(false),
        ..placement(&g.scheduling)
    };
    apply_pull(&mut spec, &plan.pull, PodKind::Platform, &["gateway"]);
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            ..Default::default()
        }),
        spec: Some(spec),
    };
    let template = apply_overrides(template, &g.pod_override.iter().collect::<Vec<_>>())?;
    let deployment = build_surging_deployment(
        plan.owner.meta(name.clone(), labels.clone()),
        g.replicas,
        selector.clone(),
        template,
    );
    let service_type = match g.service.type_ {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
        ServiceType::LoadBalancer => "LoadBalancer",
    };
    let mut service_labels = labels;
    if let Some(access) = names::metrics_access(tls, g.metrics_require_auth) {
        service_labels.insert(names::METRICS_ACCESS_LABEL.into(), access.into());
    }
    let service = Service {
        metadata: plan.owner.meta(name, service_labels),
        spec: Some(ServiceSpec {
            type_: Some(service_type.into()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: g.service.port,
                target_port: Some(IntOrString::String("http".into())),
                app_protocol: tls.then(|| "https".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut out = vec![
        child(Kind::Service, service, Some(&plan.owner.reference)),
        child(Kind::Deployment, deployment, Some(&plan.owner.reference)),
    ];
    if g.replicas >= 2 {
        // Node drains take gateways one at a time; the rest keep serving.
        out.push(one_at_a_time(
            plan,
            names::gateway(instance),
            names::instance_labels(instance, "gateway"),
            names::gateway_selector(instance),
        ));
    }
    Ok(out)
}
