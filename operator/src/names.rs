//! Names and labels of the objects a deployment owns. Every child carries the instance
//! labels, which is how the operator finds (and prunes) what it made.

use infera_proto::discovery::{DEPLOYMENT_LABEL, ROLE_LABEL};
use std::collections::BTreeMap;

/// Field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "infera-operator";
/// `app.kubernetes.io/managed-by` value of children.
pub const MANAGED_BY: &str = "infera-operator";
/// Longest `InferaDeployment` name: StatefulSet Pods add `-<role>-<ordinal>` and a
/// 10-character revision hash to it within the 63-character label limit.
pub const MAX_NAME_LEN: usize = 40;

/// A worker role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Whole requests.
    Mixed,
    /// Prefill legs.
    Prefill,
    /// Decode legs.
    Decode,
}

impl Role {
    /// The label value and name suffix.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mixed => "mixed",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

/// The label naming a pod's part: `engine` or `gateway`.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";

/// Labels every child of `instance` carries.
pub fn instance_labels(instance: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "infera".into()),
        ("app.kubernetes.io/instance".into(), instance.into()),
        ("app.kubernetes.io/managed-by".into(), MANAGED_BY.into()),
        (COMPONENT_LABEL.into(), component.into()),
        (DEPLOYMENT_LABEL.into(), instance.into()),
    ])
}

/// Selector labels of one role's engine pods (a subset of their labels, stable across
/// updates: selectors are immutable).
pub fn role_selector(instance: &str, role: Role) -> BTreeMap<String, String> {
    BTreeMap::from([
        (DEPLOYMENT_LABEL.into(), instance.into()),
        (ROLE_LABEL.into(), role.as_str().into()),
    ])
}

/// Labels of one role's engine pods and their controllers.
pub fn role_labels(instance: &str, role: Role) -> BTreeMap<String, String> {
    let mut labels = instance_labels(instance, "engine");
    labels.extend(role_selector(instance, role));
    labels
}

/// Selector of the gateway pods.
pub fn gateway_selector(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (DEPLOYMENT_LABEL.into(), instance.into()),
        (COMPONENT_LABEL.into(), "gateway".into()),
    ])
}

/// Every engine pod of the deployment: the label pairs, in `status.selector`'s order.
fn engine_selector_pairs(instance: &str) -> [(&'static str, &str); 2] {
    [(DEPLOYMENT_LABEL, instance), (COMPONENT_LABEL, "engine")]
}

/// Every engine pod of the deployment, as labels.
pub fn engine_selector(instance: &str) -> BTreeMap<String, String> {
    engine_selector_pairs(instance)
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into()
}

/// Label of a gateway Service whose `/metrics` needs more than plain HTTP: `tls`,
/// `auth` (an API key) or `tls-auth`. The chart's ServiceMonitor leaves these gateways
/// to one configured for them (`metrics.serviceMonitor.securedGateways`).
pub const METRICS_ACCESS_LABEL: &str = "infera.amd.com/metrics-access";

/// The [`METRICS_ACCESS_LABEL`] value; none for plain HTTP without a key.
pub fn metrics_access(tls: bool, auth: bool) -> Option<&'static str> {
    match (tls, auth) {
        (false, false) => None,
        (true, false) => Some("tls"),
        (false, true) => Some("auth"),
        (true, true) => Some("tls-auth"),
    }
}

/// The deployment's copy of the cluster etcd's client certificate.
pub fn etcd_client_secret(instance: &str) -> String {
    format!("{instance}-etcd-client")
}

/// The engine pods' NetworkPolicy.
pub fn engine_network_policy(instance: &str) -> String {
    format!("{instance}-engines")
}

/// `InferaDeployment.status.selector`: every engine pod of the deployment.
pub fn engine_selector_string(instance: &str) -> String {
    engine_selector_pairs(instance)
        .map(|(k, v)| format!("{k}={v}"))
        .join(",")
}

/// Label selector that finds every child of `instance` (for pruning).
pub fn children_selector(instance: &str) -> String {
    format!("{DEPLOYMENT_LABEL}={instance},app.kubernetes.io/managed-by={MANAGED_BY}")
}

/// The workers of `role` (StatefulSet or LeaderWorkerSet, headless Service, PDB).
pub fn workers(instance: &str, role: Role) -> String {
    format!("{instance}-{}", role.as_str())
}

/// The gateway Deployment, Service and ServiceAccount (and its Role and RoleBinding).
pub fn gateway(instance: &str) -> String {
    format!("{instance}-gateway")
}

/// The endpoint picker's Deployment, Service and ServiceAccount (and its Role and
/// RoleBinding): the earlier operator's name.
pub fn picker(instance: &str) -> String {
    format!("{instance}-epp")
}

/// The InferencePool.
pub fn inference_pool(instance: &str) -> String {
    format!("{instance}-pool")
}

/// The HTTPRoute to the user's Gateway.
pub fn http_route(instance: &str) -> String {
    format!("{instance}-route")
}

/// The ServiceAccount of engine pods, and its Role and RoleBinding.
pub fn service_account(instance: &str) -> String {
    format!("{instance}-infera")
}

/// The model-cache PVC (Hugging Face sources).
pub fn model_cache(instance: &str) -> String {
    format!("{instance}-model-cache")
}

/// The model download Job.
pub fn model_download(instance: &str) -> String {
    format!("{instance}-model-download")
}

/// The copy, in a deployment's namespace, of the operator's pull secret `secret`.
pub fn pull_secret_copy(instance: &str, secret: &str) -> String {
    format!("{instance}-pull-{secret}")
}
