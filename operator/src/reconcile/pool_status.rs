//! `status.inferencePool` and its `InferencePoolReady` condition (pure): the picker's
//! readiness from its Deployment, and the HTTPRoute's acceptance as its Gateway's
//! controller writes it in `status.parents` (the operator never writes it).

use crate::api::{InferencePoolStatus, RouteStatus};
use crate::render::Kind;
use serde_json::Value;

/// What a controller's `Accepted` and `ResolvedRefs` conditions say of a parent entry:
/// accepted (and its references resolved), refused (with that condition), or nothing
/// yet (absent, or Unknown).
fn parent_verdict(conditions: &[Value]) -> Option<(bool, &Value)> {
    let find = |t: &str| conditions.iter().find(|c| c["type"].as_str() == Some(t));
    let accepted = find("Accepted")?;
    match accepted["status"].as_str() {
        Some("True") => match find("ResolvedRefs") {
            Some(r) if r["status"].as_str() == Some("False") => Some((false, r)),
            _ => Some((true, accepted)),
        },
        Some("False") => Some((false, accepted)),
        _ => None,
    }
}

/// The route's standing toward the Gateway `namespace/name`, from the HTTPRoute as the
/// API server returned it (with its status) and whether that Gateway exists (`None`:
/// it could not be read).
pub fn build_route_status(
    name: &str,
    route: Option<&Value>,
    gateway: (&str, &str),
    gateway_found: Option<bool>,
) -> RouteStatus {
    let (namespace, gw) = gateway;
    let conditions: Vec<Value> = route
        .and_then(|r| r.pointer("/status/parents"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| {
            let parent = &p["parentRef"];
            parent["name"].as_str() == Some(gw)
                && parent["namespace"].as_str().unwrap_or(namespace) == namespace
        })
        .flat_map(|p| p["conditions"].as_array().cloned().unwrap_or_default())
        .collect();
    let verdict = parent_verdict(&conditions);
    let text = |key: &str| {
        verdict
            .and_then(|(_, c)| c[key].as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    RouteStatus {
        name: name.to_owned(),
        gateway: format!("{namespace}/{gw}"),
        gateway_found,
        accepted: verdict.map(|(ok, _)| ok),
        reason: text("reason"),
        message: text("message"),
    }
}

/// Whether the controllers in the InferencePool's `status.parents` accepted it: true
/// when one did (its references resolved), false when some decided and none did,
/// absent when none has decided.
pub fn build_pool_accepted(pool: Option<&Value>) -> Option<bool> {
    let verdicts: Vec<bool> = pool
        .and_then(|p| p.pointer("/status/parents"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let conditions = p["conditions"].as_array().cloned().unwrap_or_default();
            parent_verdict(&conditions).map(|(ok, _)| ok)
        })
        .collect();
    (!verdicts.is_empty()).then(|| verdicts.contains(&true))
}

/// The `InferencePoolReady` condition: whether, reason, message. `missing` names the
/// optional kinds whose CRDs the cluster lacks (nothing of them was applied).
pub fn pool_condition(
    status: &InferencePoolStatus,
    missing: &[Kind],
) -> (bool, &'static str, String) {
    let pickers = format!(
        "{} of {} endpoint picker pods ready",
        status.picker_ready_replicas, status.picker_replicas
    );
    if missing.contains(&Kind::InferencePool) {
        return (
            false,
            "InferencePoolCrdMissing",
            format!(
                "{pickers}; InferencePool {} is not created: the cluster has no InferencePool CRD (inference.networking.k8s.io/v1)",
                status.pool
            ),
        );
    }
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
    if missing.contains(&Kind::HttpRoute) {
        return (
            false,
            "GatewayApiCrdMissing",
            format!(
                "{pickers}; HTTPRoute {} is not created: the cluster has no HTTPRoute CRD (gateway.networking.k8s.io/v1)",
                route.name
            ),
        );
    }
    // What the Gateway's controller wrote wins: it has read the Gateway, whether or not
    // this operator may.
    match (route.accepted, route.gateway_found) {
        (Some(true), _) => (
            true,
            "Ready",
            format!(
                "{pickers}; Gateway {} accepted HTTPRoute {}",
                route.gateway, route.name
            ),
        ),
        (Some(false), _) => (
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
        (None, Some(false)) => (
            false,
            "GatewayNotFound",
            format!(
                "{pickers}; HTTPRoute {} names Gateway {}, which does not exist: create it, or correct spec.gateway.inferencePool.gatewayRef",
                route.name, route.gateway
            ),
        ),
        (None, found) => (
            false,
            "RoutePending",
            format!(
                "{pickers}; no controller of Gateway {} has written HTTPRoute {}'s status yet{} (is a Gateway API implementation with InferencePool support installed?)",
                route.gateway,
                route.name,
                if found.is_none() {
                    " (the operator cannot read that Gateway: no get on gateways in its namespace)"
                } else {
                    ""
                }
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
        let s = build_route_status("m-route", Some(&r), ("gw", "inference"), Some(true));
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
        let (ok, reason, message) = pool_condition(&status, &[]);
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
        let s = build_route_status("m-route", Some(&r), ("app", "inference"), Some(true));
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
            route: Some(build_route_status(
                "m-route",
                None,
                ("app", "gw"),
                Some(false),
            )),
        };
        assert_eq!(pool_condition(&status, &[]).1, "PickerNotReady");
        status.picker_ready_replicas = 1;
        assert_eq!(pool_condition(&status, &[]).1, "GatewayNotFound");
        status.route = Some(build_route_status(
            "m-route",
            None,
            ("app", "gw"),
            Some(true),
        ));
        assert_eq!(pool_condition(&status, &[]).1, "RoutePending");
        status.route = None;
        status.pool_accepted = Some(false);
        assert_eq!(pool_condition(&status, &[]).1, "PoolNotAccepted");
        status.pool_accepted = Some(true);
        assert_eq!(pool_condition(&status, &[]), (true, "Ready", "1 of 2 endpoint picker pods ready; InferencePool m-pool is ready for an HTTPRoute of yours (no spec.gateway.inferencePool.gatewayRef)".into()));
    }

    #[test]
    fn unresolved_refs_refuse_unknown_waits_and_a_written_verdict_beats_an_unreadable_gateway() {
        // Accepted, but the pool is not a backend this implementation routes to.
        let r = route(json!([{ "parentRef": { "name": "gw" }, "conditions": [
            { "type": "Accepted", "status": "True" },
            { "type": "ResolvedRefs", "status": "False", "reason": "InvalidKind", "message": "InferencePool is not supported" } ] }]));
        let s = build_route_status("m-route", Some(&r), ("app", "gw"), None);
        assert_eq!(
            (s.accepted, s.reason.as_deref()),
            (Some(false), Some("InvalidKind"))
        );
        let unknown = route(json!([{ "parentRef": { "name": "gw" }, "conditions": [
            { "type": "Accepted", "status": "Unknown", "reason": "Pending" } ] }]));
        let s = build_route_status("m-route", Some(&unknown), ("app", "gw"), None);
        assert_eq!(s.accepted, None);
        let mut status = InferencePoolStatus {
            pool: "m-pool".into(),
            picker: "m-epp".into(),
            picker_replicas: 1,
            picker_ready_replicas: 1,
            pool_accepted: None,
            route: Some(s),
        };
        let (_, reason, message) = pool_condition(&status, &[]);
        assert_eq!(reason, "RoutePending");
        assert!(message.contains("cannot read that Gateway"), "{message}");
        let ok = route(json!([{ "parentRef": { "name": "gw" }, "conditions": [
            { "type": "Accepted", "status": "True" } ] }]));
        status.route = Some(build_route_status(
            "m-route",
            Some(&ok),
            ("app", "gw"),
            None,
        ));
        assert_eq!(pool_condition(&status, &[]).1, "Ready");
        // A missing CRD is said first (nothing of it was applied).
        assert_eq!(
            pool_condition(&status, &[Kind::InferencePool]).1,
            "InferencePoolCrdMissing"
        );
        assert_eq!(
            pool_condition(&status, &[Kind::HttpRoute]).1,
            "GatewayApiCrdMissing"
        );
    }
}
