//! The engine pods' NetworkPolicy (pure): ingress only from the deployment's own pods
//! and the peers the user adds (`spec.network.networkPolicy`).

use super::engine::ENGINE_PORT;
use super::{Child, Kind, child};
use crate::names;
use crate::plan::Plan;
use infera_proto::discovery::DEPLOYMENT_LABEL;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// `<name>-engines`, unless turned off.
pub fn build_engine_network_policy(plan: &Plan) -> Option<Child> {
    let policy = &plan.deployment.network.network_policy;
    let instance = plan.owner.name.as_str();
    if !policy.enabled {
        return None;
    }
    let own_pods = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                DEPLOYMENT_LABEL.to_owned(),
                instance.to_owned(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![own_pods]),
        ports: None,
    }];
    if let Some(namespace) = &plan.autoscaler_namespace {
        // The autoscaler reads the engines' /metrics.
        ingress.push(NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        "kubernetes.io/metadata.name".to_owned(),
                        namespace.clone(),
                    )])),
                    ..Default::default()
                }),
                pod_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/name".to_owned(),
                        "infera-operator".to_owned(),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ports: Some(vec![NetworkPolicyPort {
                port: Some(IntOrString::Int(i32::from(ENGINE_PORT))),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
        });
    }
    if !policy.allow_from.is_empty() {
        ingress.push(NetworkPolicyIngressRule {
            from: Some(policy.allow_from.clone()),
            ports: None,
        });
    }
    let object = NetworkPolicy {
        metadata: plan.owner.meta(
            names::engine_network_policy(instance),
            names::instance_labels(instance, "engine"),
        ),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(names::engine_selector(instance)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    };
    Some(child(
        Kind::NetworkPolicy,
        object,
        Some(&plan.owner.reference),
    ))
}
