//! `spec.gateway.inferencePool`: the deployment served through a Gateway API inference
//! gateway (GAIE). The operator renders an `InferencePool`
//! (`inference.networking.k8s.io/v1`) over the serving workers, the endpoint picker it
//! names (Infera's gateway as GAIE's picker, its Deployment, Service and read-only
//! account), optionally an `HTTPRoute` to the user's Gateway, and for prefill/decode a
//! direct-mode frontend in each decode pod that runs both legs.

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the Gateway does with a request when the picker cannot be reached
/// (`endpointPickerRef.failureMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FailureMode {
    /// Refuse the request (GAIE's default).
    #[default]
    FailClose,
    /// Send it to an endpoint of the Gateway's own choosing.
    FailOpen,
}

impl FailureMode {
    /// The value the InferencePool carries.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailClose => "FailClose",
            Self::FailOpen => "FailOpen",
        }
    }
}

/// The Gateway an `HTTPRoute` attaches the pool to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayParentRef {
    /// The Gateway's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its namespace (default the deployment's). A Gateway in another namespace must
    /// allow routes from this one (`allowedRoutes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
    /// One listener of it (default all that accept the route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub section_name: Option<String>,
}

/// The deployment behind a Gateway API inference gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(self.frontendPort in [5557, 8000, 8090, 8998, 9401, 20000])").message("spec.gateway.inferencePool.frontendPort: 5557, 8000, 8090, 8998, 9401 and 20000 are taken in engine pods (KV events, engine, sidecar, bootstrap, kvd metrics, collectives); choose another, e.g. 8200"))]
pub struct InferencePoolSpec {
    /// Endpoint picker pods (default 2: one may restart while the other picks). With
    /// two or more a PodDisruptionBudget keeps all but one up.
    #[serde(default = "two_i32")]
    #[schemars(range(min = 1, max = 16))]
    pub picker_replicas: i32,
    /// What the Gateway does when no picker answers: FailClose (default) or FailOpen.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// Endpoints the picker lists after its choice, for the Gateway to try when the
    /// first cannot be reached (default 2). Set 0 for a Gateway whose pool cluster
    /// reads one `ip:port` from the `x-gateway-destination-endpoint` header (an
    /// ORIGINAL_DST cluster). Prefill/decode picks have none.
    #[serde(default = "two_u32")]
    #[schemars(range(max = 8))]
    pub fallbacks: u32,
    /// Requests a worker may have in flight before the picker passes it over; with
    /// every worker at the cap the Gateway answers 429 (default 0: no cap).
    #[serde(default)]
    #[schemars(range(max = 100000))]
    pub max_inflight_per_worker: u32,
    /// Prefill/decode: the port of the direct-mode frontend in each decode pod, the
    /// pool's target port (default 8200). Mixed workers are the pool's endpoints
    /// themselves, on the engine port. The frontend runs the gateway image of the engine
    /// pods' platform release (not `spec.gateway.image`), with a command line that no
    /// routing setting changes, so tuning the gateway restarts no engine.
    #[serde(default = "frontend_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub frontend_port: i32,
    /// The Gateway an HTTPRoute sends every path to the pool from. Unset: no
    /// HTTPRoute (the user routes to the InferencePool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_ref: Option<GatewayParentRef>,
    /// Hostnames the HTTPRoute matches (default any), as Gateway API writes them:
    /// lower-case DNS names, optionally starting with `*.`, no port. Two pools behind one
    /// Gateway listener need different hostnames: for the same path the older route wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(
            length(min = 1, max = 253),
            regex(
                pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
            )
        )
    )]
    pub hostnames: Vec<String>,
    /// CPU and memory of a picker pod (default 250m and 128Mi, limit 1Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

impl Default for InferencePoolSpec {
    fn default() -> Self {
        Self {
            picker_replicas: two_i32(),
            failure_mode: FailureMode::default(),
            fallbacks: two_u32(),
            max_inflight_per_worker: 0,
            frontend_port: frontend_port(),
            gateway_ref: None,
            hostnames: Vec::new(),
            resources: None,
        }
    }
}

fn two_i32() -> i32 {
    2
}
fn two_u32() -> u32 {
    2
}
/// The direct-mode frontend's default port (the earlier operator's was 8000, which
/// here is the engine's).
pub const DEFAULT_FRONTEND_PORT: i32 = 8200;
fn frontend_port() -> i32 {
    DEFAULT_FRONTEND_PORT
}

/// `status.inferencePool`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolStatus {
    /// The InferencePool's name.
    pub pool: String,
    /// The picker's Service (the pool's `endpointPickerRef`).
    pub picker: String,
    /// Picker pods wanted.
    pub picker_replicas: i32,
    /// Of those, the ones serving gRPC health.
    pub picker_ready_replicas: i32,
    /// Whether the Gateway controllers that took the InferencePool up accepted it
    /// (its `status.parents`, `Accepted`): absent until one has written it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_accepted: Option<bool>,
    /// The HTTPRoute, when `gatewayRef` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteStatus>,
}

/// The HTTPRoute as its Gateway's controller reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// The HTTPRoute's name.
    pub name: String,
    /// `namespace/name` of the Gateway it attaches to.
    pub gateway: String,
    /// Whether that Gateway exists (absent: it could not be read, see the condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_found: Option<bool>,
    /// The `Accepted` condition its controller wrote in `status.parents` for that
    /// Gateway (false also when `ResolvedRefs` is False: the pool is not a backend it
    /// can route to); absent until one has, or while it says Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<bool>,
    /// That condition's reason and message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
