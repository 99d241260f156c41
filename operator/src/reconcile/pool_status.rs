//! `status.inferencePool` and its `InferencePoolReady` condition (pure): the picker's
//! readiness from its Deployment, and the HTTPRoute's acceptance as its Gateway's
//! controller writes it in `status.parents` (the operator never writes it).

use crate::api::{InferencePoolStatus, RouteStatus};
use serde_json::Value;

/// The route's standing toward the Gateway `namespace/name`, from the HTTPRoute as the
/// API server returned it (with its status) and whether that Gateway exists.
pub fn build_route_status(
    name: &str,
    route: Option<&Value>,
    gateway: (&str, &str),
    gateway_found: bool,
) -> RouteStatus {
    let (namespace, gw) = gateway;
    let accepted = route
        .and_then(|r| r.pointer("/status/parents"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| {
            let parent = &p["parentRef"];
            parent["name"].as_str() == Some(gw)
                && parent["namespace"].as_str().unwrap_or(namespace) == namespace
        })
        .flat_map(|p| p["conditions"].as_array().into_iter().flatten())
        .find(|c| c["type"].as_str() == Some("Accepted"));
    let text = |key: &str| {
        accepted
            .and_then(|c| c[key].as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    RouteStatus {
        name: name.to_owned(),
        gateway: format!("{namespace}/{gw}"),
        gateway_found,
        accepted: accepted.map(|c| c["status"].as_str() == Some("True")),
        reason: text("reason"),
        message: text("message"),
    }
}

/// Whether the controllers in the InferencePool's `status.parents` accepted it: true
/// when one's `Accepted` is True, false when some wrote it and none is, absent when
/// none wrote it.
pub fn build_pool_accepted(pool: Option<&Value>) -> Option<bool> {
    let accepted: Vec<bool> = pool
        .and_then(|p| p.pointer("/status/parents"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|p| p["conditions"].as_array().into_iter().flatten())
        .filter(|c| c["type"].as_str() == Some("Accepted"))
        .map(|c| c["status"].as_str() == Some("True"))
        .collect();
    (!accepted.is_empty()).then(|| accepted.contains(&true))
}

/// The `InferencePoolReady` condition: whether, reason, message.
pub fn pool_condition(status: &InferencePoolStatus) -> (bool, &'static str, String) {
    let pickers = format!(
        "{} of {} endpoint picker pods ready",
        status.picker_ready_replicas, status.picker_replicas
    );
    if status.picker_ready_replicas == 0 {
        return (
            false,
            "PickerNotReady",
            format!(
                "{pickers} (Service {}): the Gateway cannot route to InferencePool {} until one serves",
                status.picker, status.pool
            ),
        );
    }
    if status.pool_accepted == Some(false) {
        return (
            false,
            "PoolNotAccepted",
            format!(
                "{pickers}; no Gateway controller accepted InferencePool {} (its status.parents): see kubectl describe inferencepool {}",
                status.pool, status.pool
            ),
        );
    }
    let Some(route) = &status.route else {
        return (
            true,
            "Ready",
            format!(
                "{pickers}; InferencePool {} is ready for an HTTPRoute of yours (no spec.gateway.inferencePool.gatewayRef)",
                status.pool
            ),
        );
    };
    if !route.gateway_found {
        return (
            false,
            "GatewayNotFound",
            format!(
                "{pickers}; HTTPRoute {} names Gateway {}, which does not exist: create it, or correct spec.gateway.inferencePool.gatewayRef",
                route.name, route.gateway
            ),
        );
    }
    match route.accepted {
        None => (
            false,
            "RoutePending",
            format!(
                "{pickers}; no controller of Gateway {} has written HTTPRoute {}'s status yet (is a Gateway API implementation with InferencePool support installed?)",
                route.gateway, route.name
            ),
        ),
        Some(false) => (
            false,
            "RouteNotAccepted",
            format!(
                "{pickers}; Gateway {} did not accept HTTPRoute {}: {}: {}",
                route.gateway,
                route.name,
                route.reason.as_deref().unwrap_or("no reason"),
                route.message.as_deref().unwrap_or("no message")
            ),
        ),
        Some(true) => (
            true,
            "Ready",
            format!(
                "{pickers}; Gateway {} accepted HTTPRoute {}",
                route.gateway, route.name
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(parents: Value) -> Value {
        json!({ "status": { "parents": parents } })
    }

    #[test]
    fn acceptance_is_read_from_the_named_gateways_parent_entry() {
        let r = route(json!([
            { "parentRef": { "name": "other", "namespace": "gw" },
              "conditions": [ { "type": "Accepted", "status": "True" } ] },
            { "parentRef": { "name": "inference", "namespace": "gw" },
              "conditions": [ { "type": "ResolvedRefs", "status": "True" },
                              { "type": "Accepted", "status": "False", "reason": "NotAllowedByListeners",
                                "message": "no listener allows routes from namespace app" } ] }
        ]));
        let s = build_route_status("m-route", Some(&r), ("gw", "inference"), true);
        assert_eq!(s.accepted, Some(false));
        assert_eq!(s.reason.as_deref(), Some("NotAllowedByListeners"));
        assert_eq!(s.gateway, "gw/inference");
        let status = InferencePoolStatus {
            pool: "m-pool".into(),
            picker: "m-epp".into(),
            picker_replicas: 2,
            picker_ready_replicas: 2,
            pool_accepted: None,
            route: Some(s),
        };
        let (ok, reason, message) = pool_condition(&status);
        assert!(!ok);
        assert_eq!(reason, "RouteNotAccepted");
        assert!(message.contains("no listener allows routes"), "{message}");
    }

    #[test]
    fn the_pool_is_accepted_when_one_parent_accepts_it() {
        assert_eq!(build_pool_accepted(None), None);
        assert_eq!(build_pool_accepted(Some(&route(json!([])))), None);
        let refused = json!({ "parentRef": { "name": "a" },
            "conditions": [ { "type": "Accepted", "status": "False", "reason": "Unsupported" } ] });
        let accepted = json!({ "parentRef": { "name": "b" },
            "conditions": [ { "type": "Accepted", "status": "True" } ] });
        assert_eq!(
            build_pool_accepted(Some(&route(json!([refused])))),
            Some(false)
        );
        assert_eq!(
            build_pool_accepted(Some(&route(json!([refused, accepted])))),
            Some(true)
        );
    }

    #[test]
    fn a_parent_ref_without_namespace_is_the_routes_own() {
        let r = route(json!([
            { "parentRef": { "name": "inference" },
              "conditions": [ { "type": "Accepted", "status": "True", "reason": "Accepted" } ] }
        ]));
        let s = build_route_status("m-route", Some(&r), ("app", "inference"), true);
        assert_eq!(s.accepted, Some(true));
    }

    #[test]
    fn readiness_follows_picker_gateway_and_route_in_that_order() {
        let mut status = InferencePoolStatus {
            pool: "m-pool".into(),
            picker: "m-epp".into(),
            picker_replicas: 2,
            picker_ready_replicas: 0,
            pool_accepted: None,
            route: Some(build_route_status("m-route", None, ("app", "gw"), false)),
        };
        assert_eq!(pool_condition(&status).1, "PickerNotReady");
        status.picker_ready_replicas = 1;
        assert_eq!(pool_condition(&status).1, "GatewayNotFound");
        status.route = Some(build_route_status("m-route", None, ("app", "gw"), true));
        assert_eq!(pool_condition(&status).1, "RoutePending");
        status.route = None;
        status.pool_accepted = Some(false);
        assert_eq!(pool_condition(&status).1, "PoolNotAccepted");
        status.pool_accepted = Some(true);
        assert_eq!(pool_condition(&status), (true, "Ready", "1 of 2 endpoint picker pods ready; InferencePool m-pool is ready for an HTTPRoute of yours (no spec.gateway.inferencePool.gatewayRef)".into()));
    }
}
