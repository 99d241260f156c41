//! The engine pods' NetworkPolicy (pure): ingress only from the deployment's own pods
//! and the peers the user adds (`spec.network.networkPolicy`).

use super::names;
use super::{Child, Ctx, Kind, child};
use crate::api::InferaDeploymentSpec;
use infera_proto::discovery::DEPLOYMENT_LABEL;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// `<name>-engines`, unless turned off.
pub fn engine_network_policy(ctx: &Ctx<'_>, spec: &InferaDeploymentSpec) -> Option<Child> {
    let policy = &spec.network.network_policy;
    if !policy.enabled {
        return None;
    }
    let own_pods = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                DEPLOYMENT_LABEL.to_owned(),
                ctx.name.to_owned(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![own_pods]),
        ports: None,
    }];
    if !policy.allow_from.is_empty() {
        ingress.push(NetworkPolicyIngressRule {
            from: Some(policy.allow_from.clone()),
            ports: None,
        });
    }
    let object = NetworkPolicy {
        metadata: ctx.meta(
            names::engine_network_policy(ctx.name),
            names::instance_labels(ctx.name, "engine"),
        ),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(names::engine_selector(ctx.name)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    };
    Some(child(Kind::NetworkPolicy, object, Some(ctx.owner)))
}
