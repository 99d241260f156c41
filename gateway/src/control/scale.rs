//! Pool sizes (`GET`/`POST /v1/admin/scale`, with `--enable-scaling-api`): the earlier
//! server's answer, read from and written to the InferaDeployment this gateway serves
//! (`--deployment`), never its workloads, which the operator rewrites.
//!
//! The earlier deployment named its pools in `spec.services`; this one has roles. Its
//! pools are `mixed` (`spec.replicas` workers) or, disaggregated, `prefill` and
//! `decode`, which come in units of the deployment's PDTopology (`spec.replicas` units
//! of, say, 2 prefill and 1 decode). A request for a role is a number of its workers: a
//! whole number of units, the same for every role named, becomes `spec.replicas`
//! (a merge patch; one write for the whole request, or none). `state` is read from the
//! conditions (`Ready` true: `ready`; `Degraded`: `failed`; else `pending`), and a pool
//! short of ready workers is `blocked` when the `Ready` condition names a pod problem.
//! An autoscaled deployment (`spec.autoscaling`) is not scaled here: 409.
//!
//! The mapping is pure ([`build_snapshot`], [`build_patch`]); [`Scaler`] does the three
//! API calls it needs: `get` of the deployment and of its PDTopology, `patch` of the
//! deployment (the Role the operator adds with `spec.gateway.scalingApi`).

use crate::workers::discovery::kubernetes::build_kube_client;
use axum::http::StatusCode;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use tokio::sync::OnceCell;

/// A scale request that cannot be honoured: the status and the `detail`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct ScaleError {
    /// The answer's status.
    pub status: StatusCode,
    /// Its `detail`.
    pub message: String,
}

impl ScaleError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

/// The earlier server's 409 for a gateway no deployment names (`scaling.py:110-116`).
pub(crate) const NOT_OPERATOR_MADE: &str = "this router was not created by the operator (no infera.amd.com/deployment label), so there is no deployment to scale";

/// One pool, read from the deployment (and its topology).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pool {
    /// `mixed`, `prefill` or `decode` (also the role).
    pub name: &'static str,
    /// Workers asked for.
    pub replicas: i64,
    /// Workers that exist, up to `replicas` (the deployment's `status.replicas`, in
    /// workers: disaggregated, the workers of the complete units that exist).
    pub current: i64,
    /// Of those, ready.
    pub ready: i64,
    /// Nodes one worker spans.
    pub nodes: i64,
    /// Workers of this role per topology unit (1 for mixed).
    pub per_unit: i64,
}

fn int_at(v: &Value, path: &[&str]) -> Option<i64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_i64()
}

/// Workers per unit of a PDTopology, prefill then decode.
fn unit_size(topology: &Value) -> Option<(i64, i64)> {
    match topology.pointer("/spec/layout")?.as_str()? {
        "1P1D" => Some((1, 1)),
        "2P1D" => Some((2, 1)),
        "1P2D" => Some((1, 2)),
        "custom" => Some((
            int_at(topology, &["spec", "prefill", "replicas"])?,
            int_at(topology, &["spec", "decode", "replicas"])?,
        )),
        _ => None,
    }
}

fn disaggregated(cr: &Value) -> bool {
    cr.pointer("/spec/serving/mode").and_then(Value::as_str) == Some("disaggregated")
}

/// The PDTopology a disaggregated deployment names.
pub(crate) fn topology_name(cr: &Value) -> Option<String> {
    disaggregated(cr)
        .then(|| {
            cr.pointer("/spec/serving/topologyRef")?
                .as_str()
                .map(str::to_owned)
        })
        .flatten()
}

/// The deployment's pools. A disaggregated one whose topology cannot be read takes its
/// counts from its status.
pub(crate) fn build_pools(cr: &Value, topology: Option<&Value>) -> Vec<Pool> {
    let spec_replicas = int_at(cr, &["spec", "replicas"]).unwrap_or(1);
    let role_status = |role: &str| {
        cr.pointer("/status/roles")
            .and_then(Value::as_array)
            .and_then(|roles| roles.iter().find(|r| r["role"] == role))
            .cloned()
            .unwrap_or(Value::Null)
    };
    // `status.replicas`: workers (mixed) or complete topology units (disaggregated)
    // that exist, up to the count asked for.
    let existing = int_at(cr, &["status", "replicas"]).unwrap_or(0);
    let ready_of = |role: &str| role_status(role)["readyReplicas"].as_i64().unwrap_or(0);
    if !disaggregated(cr) {
        let (current, ready) = (existing, ready_of("mixed"));
        return vec![Pool {
            name: "mixed",
            replicas: spec_replicas,
            current,
            ready,
            nodes: int_at(cr, &["spec", "engine", "parallelism", "nodesPerWorker"]).unwrap_or(1),
            per_unit: 1,
        }];
    }
    let units = topology.and_then(unit_size);
    let autoscaled = cr
        .pointer("/spec/autoscaling")
        .is_some_and(|a| !a.is_null());
    [("decode", 1), ("prefill", 0)]
        .into_iter()
        .map(|(name, side)| {
            let per_unit = units.map_or(1, |(p, d)| if side == 0 { p } else { d });
            let by_autoscaler = autoscaled
                .then(|| int_at(cr, &["spec", "serving", "roleReplicas", name]))
                .flatten();
            let replicas = match (by_autoscaler, units) {
                (Some(n), _) => n,
                (None, Some(_)) => per_unit * spec_replicas,
                (None, None) => role_status(name)["replicas"].as_i64().unwrap_or(0),
            };
            let ready = ready_of(name);
            let current = match units {
                Some(_) => existing * per_unit,
                None => ready,
            };
            Pool {
                name,
                replicas,
                current,
                ready,
                nodes: topology
                    .and_then(|t| int_at(t, &["spec", name, "parallelism", "nodesPerWorker"]))
                    .unwrap_or(1),
                per_unit,
            }
        })
        .collect()
}

fn condition<'a>(cr: &'a Value, type_: &str) -> Option<&'a Value> {
    cr.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The earlier `state` from the conditions.
fn state_of(cr: &Value) -> &'static str {
    let is_true = |c: Option<&Value>| c.is_some_and(|c| c["status"] == "True");
    if cr.pointer("/status/conditions").is_none() {
        "unknown"
    } else if is_true(condition(cr, "Ready")) {
        "ready"
    } else if is_true(condition(cr, "Degraded")) {
        "failed"
    } else {
        "pending"
    }
}

/// The reasons the operator's `Ready` condition gives for pods that cannot run.
const POD_PROBLEMS: [&str; 4] = [
    "Unschedulable",
    "ImagePullBackOff",
    "CrashLoopBackOff",
    "CreateContainerError",
];

/// `reason: message` of a `Ready` condition naming a pod problem, on one line and cut
/// at 300 characters, as the earlier `blocked` was.
fn blocked_of(cr: &Value) -> Option<String> {
    let ready = condition(cr, "Ready")?;
    let reason = ready["reason"].as_str()?;
    if ready["status"] == "True" || !POD_PROBLEMS.contains(&reason) {
        return None;
    }
    let mut text = ready["message"]
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if text.chars().count() > 300 {
        text = text.chars().take(297).collect::<String>() + "...";
    }
    Some(if text.is_empty() {
        reason.to_owned()
    } else {
        format!("{reason}: {text}")
    })
}

/// The earlier answer (`scaling.py:139-180`): the deployment, its namespace, its state
/// and each pool, by name.
pub(crate) fn build_snapshot(
    name: &str,
    namespace: &str,
    cr: &Value,
    topology: Option<&Value>,
) -> Value {
    let blocked = blocked_of(cr);
    let mut services = Map::new();
    for pool in build_pools(cr, topology) {
        let mut entry = json!({
            "role": pool.name,
            "replicas": pool.replicas,
            "current_replicas": pool.current,
            "ready_replicas": pool.ready,
            "nodes_per_replica": pool.nodes,
        });
        if pool.ready < pool.replicas
            && let (Some(b), Some(map)) = (&blocked, entry.as_object_mut())
        {
            map.insert("blocked".into(), json!(b));
        }
        services.insert(pool.name.to_owned(), entry);
    }
    json!({
        "deployment": name,
        "namespace": namespace,
        "state": state_of(cr),
        "services": services,
    })
}

/// The merge patch that gives each named pool its count (checked already: known names,
/// counts of 1 and more): `spec.replicas`, in workers (mixed) or in topology units
/// (disaggregated, the same number of units for every role named).
pub(crate) fn build_patch(
    name: &str,
    cr: &Value,
    topology: Option<&Value>,
    counts: &[(String, i64)],
) -> Result<Value, ScaleError> {
    if cr
        .pointer("/spec/autoscaling")
        .is_some_and(|a| !a.is_null())
    {
        return Err(ScaleError::new(
            StatusCode::CONFLICT,
            format!(
                "InferaDeployment '{name}' is sized by its autoscaler (spec.autoscaling): \
                 remove spec.autoscaling to set its workers here"
            ),
        ));
    }
    let pools = build_pools(cr, topology);
    if !disaggregated(cr) {
        let n = counts.first().map_or(1, |(_, n)| *n);
        return Ok(json!({"spec": {"replicas": n}}));
    }
    let Some(topology) = topology.filter(|t| unit_size(t).is_some()) else {
        return Err(ScaleError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "InferaDeployment '{name}' is disaggregated, and its PDTopology cannot be read: \
                 its unit of prefill and decode workers is unknown"
            ),
        ));
    };
    let layout = topology
        .pointer("/spec/layout")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let shape = unit_size(topology)
        .map(|(p, d)| format!("{p} prefill and {d} decode"))
        .unwrap_or_default();
    let topology_name = topology_name(cr).unwrap_or_default();
    let mut units: Vec<(&str, i64, i64)> = Vec::new();
    for (svc, n) in counts {
        let per_unit = pools
            .iter()
            .find(|p| p.name == svc)
            .map_or(1, |p| p.per_unit)
            .max(1);
        if n % per_unit != 0 {
            return Err(ScaleError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "{svc}: {n} is not a whole number of units of PDTopology '{topology_name}' \
                     ({layout}: {shape} workers a unit); ask for a multiple of {per_unit}"
                ),
            ));
        }
        units.push((svc, *n, n / per_unit));
    }
    if let [(first, n1, u1), rest @ ..] = units.as_slice()
        && let Some((other, n2, u2)) = rest.iter().find(|(_, _, u)| u != u1)
    {
        return Err(ScaleError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{first} {n1} and {other} {n2} are {u1} and {u2} units of PDTopology \
                 '{topology_name}' ({layout}): prefill and decode scale together, in whole units"
            ),
        ));
    }
    let n = units.first().map_or(1, |(_, _, u)| *u);
    Ok(json!({"spec": {"replicas": n}}))
}

fn infera_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("infera.amd.com", "v1alpha1", kind),
        plural,
    )
}

/// The scaling API's Kubernetes side: the client (made on first use) and which
/// deployment it scales.
pub(crate) struct Scaler {
    deployment: Option<String>,
    namespace: Option<String>,
    kubeconfig: Option<PathBuf>,
    client: OnceCell<kube::Client>,
}

impl std::fmt::Debug for Scaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scaler")
            .field("deployment", &self.deployment)
            .field("namespace", &self.namespace)
            .field("connected", &self.client.initialized())
            .finish()
    }
}

impl Scaler {
    /// Scales `deployment` (none: 409) in `namespace` (none: the client's).
    pub(crate) fn new(
        deployment: Option<String>,
        namespace: Option<String>,
        kubeconfig: Option<PathBuf>,
    ) -> Self {
        Self {
            deployment: deployment.filter(|d| !d.trim().is_empty()),
            namespace,
            kubeconfig,
            client: OnceCell::new(),
        }
    }

    /// The deployment, the namespace and the client.
    async fn target(&self) -> Result<(&str, String, kube::Client), ScaleError> {
        let Some(name) = self.deployment.as_deref() else {
            return Err(ScaleError::new(StatusCode::CONFLICT, NOT_OPERATOR_MADE));
        };
        let client = self
            .client
            .get_or_try_init(|| build_kube_client(self.kubeconfig.as_deref()))
            .await
            .map_err(|e| {
                ScaleError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the scaling API needs the Kubernetes API: {e}"),
                )
            })?
            .clone();
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        Ok((name, namespace, client))
    }

    /// The deployment and its topology.
    async fn read(
        &self,
        name: &str,
        namespace: &str,
        client: &kube::Client,
    ) -> Result<(Value, Option<Value>), ScaleError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            namespace,
            &infera_resource("InferaDeployment", "inferadeployments"),
        );
        let cr = api
            .get(name)
            .await
            .map_err(|e| api_error(e, "read", name))?;
        let cr = serde_json::to_value(&cr).unwrap_or_default();
        let topology = match topology_name(&cr) {
            Some(t) => {
                let api: Api<DynamicObject> = Api::namespaced_with(
                    client.clone(),
                    namespace,
                    &infera_resource("PDTopology", "pdtopologies"),
                );
                match api.get(&t).await {
                    Ok(t) => serde_json::to_value(&t).ok(),
                    Err(e) => {
                        tracing::warn!(topology = %t, "scaling API: reading the PDTopology: {e}");
                        None
                    }
                }
            }
            None => None,
        };
        Ok((cr, topology))
    }

    /// `GET /v1/admin/scale`.
    pub(crate) async fn snapshot(&self) -> Result<Value, ScaleError> {
        let (name, namespace, client) = self.target().await?;
        let (cr, topology) = self.read(name, &namespace, &client).await?;
        Ok(build_snapshot(name, &namespace, &cr, topology.as_ref()))
    }

    /// The services the deployment has, for checking a request.
    pub(crate) async fn services(&self) -> Result<Vec<String>, ScaleError> {
        let (name, namespace, client) = self.target().await?;
        let (cr, topology) = self.read(name, &namespace, &client).await?;
        Ok(build_pools(&cr, topology.as_ref())
            .into_iter()
            .map(|p| p.name.to_owned())
            .collect())
    }

    /// `POST /v1/admin/scale`, its counts checked against [`Self::services`]: one merge
    /// patch, then the snapshot after it.
    pub(crate) async fn scale(&self, counts: &[(String, i64)]) -> Result<Value, ScaleError> {
        let (name, namespace, client) = self.target().await?;
        let (cr, topology) = self.read(name, &namespace, &client).await?;
        let patch = build_patch(name, &cr, topology.as_ref(), counts)?;
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &namespace,
            &infera_resource("InferaDeployment", "inferadeployments"),
        );
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| api_error(e, "patch", name))?;
        tracing::info!(
            deployment = %name,
            "scaled: {}",
            counts
                .iter()
                .map(|(s, n)| format!("{s}={n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let (cr, topology) = self.read(name, &namespace, &client).await?;
        Ok(build_snapshot(name, &namespace, &cr, topology.as_ref()))
    }
}

fn api_error(e: kube::Error, verb: &str, name: &str) -> ScaleError {
    match &e {
        kube::Error::Api(r) if r.code == 403 => ScaleError::new(
            StatusCode::FORBIDDEN,
            format!(
                "the gateway's ServiceAccount cannot {verb} InferaDeployment '{name}': \
                 set spec.gateway.scalingApi: true on it (the operator then grants exactly that)"
            ),
        ),
        kube::Error::Api(r) if r.code == 404 => ScaleError::new(
            StatusCode::NOT_FOUND,
            format!("InferaDeployment '{name}' not found"),
        ),
        _ => ScaleError::new(
            StatusCode::BAD_GATEWAY,
            format!("the Kubernetes API, asked to {verb} InferaDeployment '{name}': {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mixed(replicas: i64, ready: i64) -> Value {
        json!({
            "spec": {"replicas": replicas, "model": {}, "engine": {}},
            "status": {
                "replicas": replicas, "readyReplicas": ready,
                "roles": [{"role": "mixed", "replicas": replicas, "readyReplicas": ready}],
                "conditions": [
                    {"type": "Ready", "status": if ready >= replicas { "True" } else { "False" },
                     "reason": if ready >= replicas { "AllReady" } else { "Unschedulable" },
                     "message": "mixed 1/2 ready; pod fixture-mixed-1: 0/3 nodes are available:\n 3 Insufficient amd.com/gpu."},
                    {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": ""},
                ],
            },
        })
    }

    fn pd(units: i64) -> (Value, Value) {
        let cr = json!({
            "spec": {"replicas": units, "serving": {"mode": "disaggregated", "topologyRef": "fixture-1p2d"}},
            "status": {"replicas": units, "roles": [
                {"role": "prefill", "replicas": units, "readyReplicas": units},
                {"role": "decode", "replicas": 2 * units, "readyReplicas": 2 * units},
            ], "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady"}]},
        });
        let topology =
            json!({"spec": {"layout": "1P2D", "decode": {"parallelism": {"nodesPerWorker": 2}}}});
        (cr, topology)
    }

    #[test]
    fn a_mixed_deployment_reads_as_one_pool() {
        let snapshot = build_snapshot("fixture", "fixture-ns", &mixed(2, 1), None);
        assert_eq!(
            snapshot.to_string(),
            r#"{"deployment":"fixture","namespace":"fixture-ns","state":"pending","services":{"mixed":{"role":"mixed","replicas":2,"current_replicas":2,"ready_replicas":1,"nodes_per_replica":1,"blocked":"Unschedulable: mixed 1/2 ready; pod fixture-mixed-1: 0/3 nodes are available: 3 Insufficient amd.com/gpu."}}}"#
        );
        let ready = build_snapshot("fixture", "fixture-ns", &mixed(2, 2), None);
        assert_eq!(ready["state"], "ready");
        assert!(ready["services"]["mixed"].get("blocked").is_none());
        assert_eq!(
            build_snapshot("fixture", "ns", &json!({"spec": {}}), None)["state"],
            "unknown"
        );
        assert_eq!(
            build_patch("fixture", &mixed(2, 2), None, &[("mixed".into(), 3)]),
            Ok(json!({"spec": {"replicas": 3}}))
        );
    }

    #[test]
    fn a_disaggregated_deployment_scales_in_whole_topology_units() {
        let (cr, topology) = pd(1);
        let snapshot = build_snapshot("fixture", "ns", &cr, Some(&topology));
        assert_eq!(
            snapshot["services"].to_string(),
            r#"{"decode":{"role":"decode","replicas":2,"current_replicas":2,"ready_replicas":2,"nodes_per_replica":2},"prefill":{"role":"prefill","replicas":1,"current_replicas":1,"ready_replicas":1,"nodes_per_replica":1}}"#
        );
        let patch = |counts: &[(&str, i64)]| {
            let counts: Vec<(String, i64)> =
                counts.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect();
            build_patch("fixture", &cr, Some(&topology), &counts)
        };
        assert_eq!(
            patch(&[("decode", 6)]),
            Ok(json!({"spec": {"replicas": 3}}))
        );
        assert_eq!(
            patch(&[("decode", 4), ("prefill", 2)]),
            Ok(json!({"spec": {"replicas": 2}}))
        );
        let odd = patch(&[("decode", 3)]).unwrap_err();
        assert_eq!(odd.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            odd.message,
            "decode: 3 is not a whole number of units of PDTopology 'fixture-1p2d' (1P2D: 1 prefill and 2 decode workers a unit); ask for a multiple of 2"
        );
        let apart = patch(&[("decode", 2), ("prefill", 3)]).unwrap_err();
        assert!(
            apart.message.contains("scale together"),
            "{}",
            apart.message
        );
        let mut autoscaled = cr.clone();
        autoscaled["spec"]["autoscaling"] = json!({"minReplicas": 1});
        autoscaled["spec"]["serving"]["roleReplicas"] = json!({"prefill": 3, "decode": 5});
        let pools = build_pools(&autoscaled, Some(&topology));
        assert_eq!(
            pools
                .iter()
                .map(|p| (p.name, p.replicas))
                .collect::<Vec<_>>(),
            [("decode", 5), ("prefill", 3)]
        );
        let refused = build_patch("fixture", &autoscaled, Some(&topology), &[]).unwrap_err();
        assert_eq!(refused.status, StatusCode::CONFLICT);
    }
}
