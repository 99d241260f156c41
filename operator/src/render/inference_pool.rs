//! The deployment behind a Gateway API inference gateway (pure): with
//! `spec.gateway.inferencePool`, an `InferencePool` over the serving workers, the
//! endpoint picker it names (Infera's gateway serving GAIE's ext_proc protocol: a
//! Deployment, a Service, an account that may only read Pods), optionally an
//! `HTTPRoute` to the user's Gateway, and for prefill/decode the direct-mode frontend
//! of each decode pod: the picker names the decode and the prefill worker, the Gateway
//! sends the request to the decode pod's frontend, which runs both legs.
//!
//! The pool's endpoints are the mixed workers on the engine port, or the decode pods
//! on the frontend port. The picker discovers every worker (prefill included) the way
//! the gateway does, so it does not read the pool itself.

use super::engine::ENGINE_PORT;
use super::gateway::{access_args, build_surging_deployment, pod_role, secret_volumes};
use super::gateway_flags::{GatewaySite, build_gateway_args};
use super::gateway_site::{gateway_site, reads_model_volume};
use super::pod::{cpu_and_memory, model_mount, model_volume, placement, restricted_security};
use super::pull::{PodKind, apply_pull};
use super::workers::one_at_a_time;
use super::{Child, Kind, child};
use crate::api::InferencePoolSpec;
use crate::names::{self, Role};
use crate::plan::{Discovery, Plan};
use infera_proto::discovery::DEPLOYMENT_LABEL;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, GRPCAction, PodSpec, PodTemplateSpec, Probe, Service, ServiceAccount,
    ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The picker's ext_proc port (GAIE's).
pub const PICKER_GRPC_PORT: u16 = 9002;
/// Its plaintext gRPC health port (GAIE's).
pub const PICKER_HEALTH_PORT: u16 = 9003;
/// Its HTTP port: `/metrics`, `/health`, `/v1/workers`.
pub const PICKER_HTTP_PORT: u16 = 9090;

/// Seconds a stopping picker stays up answering NOT_SERVING: at least twice the
/// interval of the Gateway's health check on it (GAIE gateways check every second or
/// two), so the Gateway moves new requests to the other pickers first.
const PICKER_SHUTDOWN_DELAY_S: u32 = 5;

/// The role whose pods are the pool's endpoints: decode when disaggregated.
fn endpoint_role(plan: &Plan) -> Role {
    if plan.deployment.frontend_port().is_some() {
        Role::Decode
    } else {
        Role::Mixed
    }
}

/// The label LeaderWorkerSet gives each pod of a group: its index, 0 for the leader.
const LWS_WORKER_INDEX: &str = "leaderworkerset.sigs.k8s.io/worker-index";

/// The pool's pods: the endpoint role's, and of a worker spanning nodes its leader
/// alone (the one that serves; followers run the engine's other ranks).
fn pool_selector(plan: &Plan) -> BTreeMap<String, String> {
    let role = endpoint_role(plan);
    let mut labels = names::role_selector(&plan.owner.name, role);
    let spans_nodes = plan
        .deployment
        .roles
        .iter()
        .any(|r| r.role == role && r.parallelism.nodes_per_worker > 1);
    if spans_nodes {
        labels.insert(LWS_WORKER_INDEX.into(), "0".into());
    }
    labels
}

/// The pool's target port: the decode frontends', else the engines'.
pub fn target_port(plan: &Plan) -> u16 {
    plan.deployment.frontend_port().unwrap_or(ENGINE_PORT)
}

fn picker_selector(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (DEPLOYMENT_LABEL.into(), instance.into()),
        (names::COMPONENT_LABEL.into(), "picker".into()),
    ])
}

/// Every object of the InferencePool (none without `spec.gateway.inferencePool`).
pub fn build_inference_pool(plan: &Plan, model_path: &str) -> Vec<Child> {
    let Some(pool) = &plan.deployment.gateway.inference_pool else {
        return Vec::new();
    };
    let instance = plan.owner.name.as_str();
    let name = names::picker(instance);
    let labels = names::instance_labels(instance, "picker");
    let mut out = vec![child(
        Kind::ServiceAccount,
        ServiceAccount {
            metadata: plan.owner.meta(name.clone(), labels.clone()),
            ..Default::default()
        },
        Some(&plan.owner.reference),
    )];
    if plan.discovery == Discovery::Kubernetes {
        out.extend(pod_role(
            plan,
            &name,
            labels.clone(),
            &["get", "list", "watch"],
        ));
    }
    out.push(picker_service(plan, &name, labels.clone()));
    out.push(picker_deployment(
        plan,
        pool,
        model_path,
        &name,
        labels.clone(),
    ));
    if pool.picker_replicas >= 2 {
        out.push(one_at_a_time(plan, name, labels, picker_selector(instance)));
    }
    out.push(inference_pool(plan, pool));
    if pool.gateway_ref.is_some() {
        out.push(http_route(plan, pool));
    }
    out
}

/// The picker's command line.
fn picker_args(plan: &Plan, pool: &InferencePoolSpec, model_path: &str) -> Vec<String> {
    // Its HTTP port serves the deployment's API too: behind the same keys and
    // certificate as the gateway's.
    let site = GatewaySite {
        access: access_args(plan),
        ..gateway_site(plan, model_path, PICKER_HTTP_PORT, PICKER_SHUTDOWN_DELAY_S)
    };
    let mut args = build_gateway_args(&plan.deployment.gateway.routing, &site);
    args.extend([
        "--epp-port".into(),
        PICKER_GRPC_PORT.to_string(),
        "--epp-health-port".into(),
        PICKER_HEALTH_PORT.to_string(),
        "--epp-fallbacks".into(),
        pool.fallbacks.to_string(),
    ]);
    if pool.max_inflight_per_worker > 0 {
        args.extend([
            "--epp-max-inflight-per-worker".into(),
            pool.max_inflight_per_worker.to_string(),
        ]);
    }
    if let Some(port) = plan.deployment.frontend_port() {
        // The decode worker's frontend, not its engine, takes the request.
        args.extend(["--epp-destination-port".into(), port.to_string()]);
    }
    args
}

fn grpc_probe(service: &str, period: i32, failures: i32) -> Probe {
    Probe {
        grpc: Some(GRPCAction {
            port: i32::from(PICKER_HEALTH_PORT),
            service: Some(service.into()),
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Default::default()
    }
}

fn port(name: &str, number: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: i32::from(number),
        ..Default::default()
    }
}

/// The volumes (and mounts) the picker reads: the gateway's Secrets (API keys, its
/// certificate, etcd's), and the model when its tokenizer is there.
fn gateway_volumes(plan: &Plan) -> (Vec<Volume>, Vec<VolumeMount>) {
    let (mut volumes, mut mounts): (Vec<Volume>, Vec<VolumeMount>) =
        secret_volumes(plan).into_iter().unzip();
    if reads_model_volume(plan) {
        volumes.push(model_volume(&plan.deployment.model.volume));
        mounts.push(model_mount());
    }
    (volumes, mounts)
}

fn picker_deployment(
    plan: &Plan,
    pool: &InferencePoolSpec,
    model_path: &str,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Child {
    let g = &plan.deployment.gateway;
    let (volumes, mounts) = gateway_volumes(plan);
    let container = Container {
        name: "picker".into(),
        image: Some(
            g.image
                .clone()
                .unwrap_or_else(|| plan.images.gateway.clone()),
        ),
        args: Some(picker_args(plan, pool, model_path)),
        ports: Some(vec![
            port("grpc", PICKER_GRPC_PORT),
            port("grpc-health", PICKER_HEALTH_PORT),
            port("http", PICKER_HTTP_PORT),
        ]),
        // Serving once discovery has synced; NOT_SERVING again while it drains.
        readiness_probe: Some(grpc_probe("readiness", 2, 2)),
        liveness_probe: Some(grpc_probe("liveness", 10, 3)),
        resources: Some(
            pool.resources
                .clone()
                .unwrap_or_else(|| cpu_and_memory("250m", "128Mi", "1Gi")),
        ),
        security_context: Some(restricted_security()),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    };
    let mut spec = PodSpec {
        service_account_name: Some(name.to_owned()),
        automount_service_account_token: Some(plan.discovery == Discovery::Kubernetes),
        // The delay, the exchanges still open (a stream's lasts as long as it does), slack.
        termination_grace_period_seconds: Some(i64::from(PICKER_SHUTDOWN_DELAY_S) + 30 + 5),
        containers: vec![container],
        volumes: (!volumes.is_empty()).then_some(volumes),
        enable_service_links: Some(false),
        ..placement(&g.scheduling)
    };
    apply_pull(&mut spec, &plan.pull, PodKind::Platform, &["picker"]);
    let selector = picker_selector(&plan.owner.name);
    let deployment = build_surging_deployment(
        plan.owner.meta(name.to_owned(), labels.clone()),
        pool.picker_replicas,
        selector,
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..Default::default()
            }),
            spec: Some(spec),
        },
    );
    child(Kind::Deployment, deployment, Some(&plan.owner.reference))
}

fn picker_service(plan: &Plan, name: &str, mut labels: BTreeMap<String, String>) -> Child {
    let g = &plan.deployment.gateway;
    if let Some(access) = names::metrics_access(g.tls.is_some(), g.metrics_require_auth) {
        labels.insert(names::METRICS_ACCESS_LABEL.into(), access.into());
    }
    let service_port = |name: &str, number: u16, protocol: &str| ServicePort {
        name: Some(name.into()),
        port: i32::from(number),
        target_port: Some(IntOrString::String(name.into())),
        app_protocol: Some(protocol.into()),
        ..Default::default()
    };
    let service = Service {
        metadata: plan.owner.meta(name.to_owned(), labels),
        spec: Some(ServiceSpec {
            selector: Some(picker_selector(&plan.owner.name)),
            ports: Some(vec![
                service_port("grpc", PICKER_GRPC_PORT, "http2"),
                service_port("grpc-health", PICKER_HEALTH_PORT, "kubernetes.io/h2c"),
                service_port("http", PICKER_HTTP_PORT, "http"),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    child(Kind::Service, service, Some(&plan.owner.reference))
}

/// A custom resource as a child: `apiVersion`, `kind`, metadata with the owner.
fn custom(plan: &Plan, kind: Kind, name: String, spec: Value) -> Child {
    let ar = kind.api_resource();
    let meta = ObjectMeta {
        owner_references: Some(vec![plan.owner.reference.clone()]),
        ..plan.owner.meta(
            name.clone(),
            names::instance_labels(&plan.owner.name, "picker"),
        )
    };
    Child {
        kind,
        name,
        object: json!({
            "apiVersion": ar.api_version,
            "kind": ar.kind,
            "metadata": meta,
            "spec": spec,
        }),
    }
}

fn inference_pool(plan: &Plan, pool: &InferencePoolSpec) -> Child {
    let instance = plan.owner.name.as_str();
    custom(
        plan,
        Kind::InferencePool,
        names::inference_pool(instance),
        json!({
            "selector": { "matchLabels": pool_selector(plan) },
            "targetPorts": [ { "number": target_port(plan) } ],
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": names::picker(instance),
                "port": { "number": PICKER_GRPC_PORT },
                "failureMode": pool.failure_mode.as_str(),
            },
        }),
    )
}

fn http_route(plan: &Plan, pool: &InferencePoolSpec) -> Child {
    let instance = plan.owner.name.as_str();
    let mut parent = json!({ "group": "gateway.networking.k8s.io", "kind": "Gateway" });
    if let (Some(gw), Some(map)) = (&pool.gateway_ref, parent.as_object_mut()) {
        map.insert("name".into(), gw.name.clone().into());
        map.insert(
            "namespace".into(),
            gw.namespace
                .clone()
                .unwrap_or_else(|| plan.owner.namespace.clone())
                .into(),
        );
        if let Some(section) = &gw.section_name {
            map.insert("sectionName".into(), section.clone().into());
        }
    }
    let mut spec = json!({
        "parentRefs": [parent],
        "rules": [{
            "matches": [ { "path": { "type": "PathPrefix", "value": "/" } } ],
            "backendRefs": [{
                "group": "inference.networking.k8s.io",
                "kind": "InferencePool",
                "name": names::inference_pool(instance),
            }],
        }],
    });
    if !pool.hostnames.is_empty()
        && let Some(map) = spec.as_object_mut()
    {
        map.insert("hostnames".into(), json!(pool.hostnames));
    }
    custom(plan, Kind::HttpRoute, names::http_route(instance), spec)
}
