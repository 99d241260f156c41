//! A `PDTopology`'s status (pure): the deployments that use it, and a `Valid` condition
//! saying whether its transport works for each one's engine.

use crate::api::resolve::{launch, pd_protocol};
use crate::api::{InferaDeployment, PDTopology, PDTopologyStatus, ServingMode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The status of `topology` given every deployment of its namespace.
pub fn topology_status<'a>(
    topology: &PDTopology,
    deployments: impl IntoIterator<Item = &'a InferaDeployment>,
    now: &Time,
) -> PDTopologyStatus {
    let name = topology.metadata.name.as_deref().unwrap_or_default();
    let mut users: Vec<&InferaDeployment> = deployments
        .into_iter()
        .filter(|d| {
            d.metadata.namespace == topology.metadata.namespace
                && d.spec.serving.mode == ServingMode::Disaggregated
                && d.spec.serving.topology_ref.as_deref() == Some(name)
        })
        .collect();
    users.sort_by_key(|d| d.metadata.name.clone());
    let problems: Vec<String> = users
        .iter()
        .filter_map(|d| {
            let engine = launch(d.spec.engine.kind, d.spec.engine.sim_flavor).engine();
            pd_protocol(engine, &topology.spec.transport)
                .err()
                .map(|reason| {
                    format!(
                        "{} (engine {}): {reason}",
                        d.metadata.name.as_deref().unwrap_or_default(),
                        d.spec.engine.kind.as_str()
                    )
                })
        })
        .collect();
    let (status, reason, message) = match (users.is_empty(), problems.is_empty()) {
        (true, _) => (
            "True",
            "Unused",
            "no InferaDeployment references this topology".to_owned(),
        ),
        (false, true) => (
            "True",
            "TransportSupported",
            "the transport works for every deployment using it".to_owned(),
        ),
        (false, false) => ("False", "UnsupportedTransport", problems.join("; ")),
    };
    let previous = topology
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let since = previous
        .iter()
        .find(|c| c.type_ == "Valid" && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PDTopologyStatus {
        used_by: users
            .iter()
            .filter_map(|d| d.metadata.name.clone())
            .collect(),
        conditions: vec![Condition {
            type_: "Valid".into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: topology.metadata.generation,
            last_transition_time: since,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(name: &str, kind: &str, topology: &str) -> InferaDeployment {
        serde_json::from_value(json!({
            "apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"model": {"name": "m", "source": {"hostPath": {"path": "/m"}}},
                     "engine": {"kind": kind, "image": "x"},
                     "serving": {"mode": "disaggregated", "topologyRef": topology}}
        }))
        .unwrap()
    }

    #[test]
    fn users_are_listed_and_an_engine_the_transport_cannot_carry_is_named() {
        let topology: PDTopology = serde_json::from_value(json!({
            "apiVersion": "infera.amd.com/v1alpha1", "kind": "PDTopology",
            "metadata": {"name": "shape", "namespace": "ns", "generation": 2},
            "spec": {"layout": "1P1D", "transport": {"backend": "mori"}}
        }))
        .unwrap();
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap());
        let deps = [
            deployment("b", "vllm", "shape"),
            deployment("a", "atom", "shape"),
            deployment("c", "vllm", "other"),
        ];
        let s = topology_status(&topology, &deps, &now);
        assert_eq!(s.used_by, vec!["a", "b"]);
        assert_eq!(s.conditions[0].status, "False");
        assert!(
            s.conditions[0]
                .message
                .starts_with("a (engine atom): engine atom supports the mooncake transport only"),
            "{}",
            s.conditions[0].message
        );
        let ok = topology_status(&topology, &deps[..1], &now);
        assert_eq!(
            (
                ok.conditions[0].status.as_str(),
                ok.conditions[0].reason.as_str()
            ),
            ("True", "TransportSupported")
        );
        assert_eq!(ok.conditions[0].observed_generation, Some(2));
    }
}
