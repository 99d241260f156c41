//! Kubernetes discovery: worker records from the `infera.amd.com/worker-info` annotation
//! the engine sidecar writes on its Pod, for clusters without etcd.
//!
//! The gateway lists, then watches, the Pods of one namespace that match a label
//! selector (kube-runtime's watcher). An expired watch (410 Gone) or a broken connection
//! makes the watcher list again; the listed set then *replaces* what the gateway held, so
//! Pods deleted while it was not watching vanish. Each watch event goes through
//! [`PodIndex::apply`], which is pure: it keeps what every Pod contributes and returns
//! the registry changes and warnings; [`run_kubernetes_discovery`] only performs them.
//!
//! What a Pod contributes ([`build_pod_worker`]):
//! - phase other than `Running`, or not `Ready`: nothing, silently (the sidecar writes
//!   the annotation only once the engine is healthy; a Pod the kubelet considers not
//!   ready gets no traffic, as a Service would give it none);
//! - `metadata.deletionTimestamp` set, with a valid annotation: its worker, *draining*:
//!   listed in `/v1/workers` but out of routing at once, until the Pod is gone (its
//!   engine finishes what it holds while the sidecar drains it). The sidecar takes the
//!   annotation off when its drain starts; the worker seen last stays listed, draining,
//!   while the Pod still runs;
//! - a missing or invalid annotation on a live Pod: nothing, with one warning per Pod
//!   (not one per event; again when the reason changes).
//!
//! Two Pods announcing the same `worker_id` (a misconfigured advertise host) yield one
//! worker: a serving Pod wins over a draining one, then the first Pod by name; one
//! warning while it lasts.

use crate::metrics::Metrics;
use crate::workers::registry::{ANY_MODEL, Registry};
use futures::StreamExt;
use infera_proto::discovery::WORKER_INFO_ANNOTATION;
use infera_proto::worker::WorkerRecord;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;

/// Why the Kubernetes API client could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubernetesDiscoveryError {
    /// `--kubeconfig` could not be read or used.
    #[error(
        "kubernetes discovery: kubeconfig {path}: {message}; fix the file or drop --kubeconfig"
    )]
    ReadKubeconfig {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// Neither a kubeconfig nor an in-cluster service account was found.
    #[error(
        "kubernetes discovery: no cluster configuration ({0}); run the gateway in a Pod with a \
         service account, or set KUBECONFIG or --kubeconfig"
    )]
    InferConfig(String),
    /// The InferencePool of --epp-pool-name could not be read or used.
    #[error("InferencePool {namespace}/{name}: {message}")]
    Pool {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// Builds the API client: from `kubeconfig` when given, otherwise as kubectl would
/// (`KUBECONFIG` or `~/.kube/config`, then the in-cluster service account).
pub(crate) async fn build_kube_client(
    kubeconfig: Option<&Path>,
) -> Result<Client, KubernetesDiscoveryError> {
    let Some(path) = kubeconfig else {
        return Client::try_default()
            .await
            .map_err(|e| KubernetesDiscoveryError::InferConfig(e.to_string()));
    };
    let read_err = |message: String| KubernetesDiscoveryError::ReadKubeconfig {
        path: path.display().to_string(),
        message,
    };
    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| read_err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .map_err(|e| read_err(e.to_string()))?;
    Client::try_from(config).map_err(|e| read_err(e.to_string()))
}

/// An InferencePool's label selector (as `k=v,...`) and target ports, read from the API.
pub(crate) async fn read_inference_pool(
    client: Client,
    namespace: &str,
    name: &str,
) -> Result<(String, PoolPorts), KubernetesDiscoveryError> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let fail = |message: String| KubernetesDiscoveryError::Pool {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        message,
    };
    let gvk = GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, namespace, &ApiResource::from_gvk(&gvk));
    let pool = api.get(name).await.map_err(|e| {
        fail(format!(
            "{e} (is the InferencePool CRD installed, and may this service account get inferencepools?)"
        ))
    })?;
    let spec = &pool.data["spec"];
    let labels = spec["selector"]["matchLabels"]
        .as_object()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| fail("spec.selector.matchLabels is empty".into()))?;
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(",");
    let ports: Vec<u16> = spec["targetPorts"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["number"].as_u64())
                .filter_map(|n| u16::try_from(n).ok())
                .collect()
        })
        .unwrap_or_default();
    if ports.is_empty() {
        return Err(fail("spec.targetPorts names no port".into()));
    }
    Ok((selector, PoolPorts { ports }))
}

/// The worker one Pod contributes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodWorker {
    /// Its record, from the annotation.
    pub record: WorkerRecord,
    /// The Pod is being deleted: listed, not routed.
    pub draining: bool,
}

/// Why a live Pod contributes no worker.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum PodRecordError {
    /// The annotation is not there (yet: the sidecar writes it once the engine is healthy).
    #[error(
        "no {WORKER_INFO_ANNOTATION} annotation (the engine sidecar writes it once the engine \
         is healthy, with --discovery-backend kubernetes); skipped until it appears"
    )]
    MissingAnnotation,
    /// The annotation is not a valid worker record.
    #[error("its {WORKER_INFO_ANNOTATION} annotation is refused: {0}; skipped until it changes")]
    InvalidAnnotation(String),
    /// The record sends requests somewhere other than the Pod itself.
    #[error(
        "its {WORKER_INFO_ANNOTATION} annotation is refused: {0}; a Pod may only announce \
         itself (its own IP, or its name as the first DNS label); skipped until it changes"
    )]
    ForeignUrl(String),
}

fn is_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Running")
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// What `pod` contributes: `Ok(None)` when it should not be listed at all (not running,
/// not ready, or being deleted without a record), an error when a live Pod's annotation
/// is missing or invalid.
pub(crate) fn build_pod_worker(pod: &Pod) -> Result<Option<PodWorker>, PodRecordError> {
    if !is_running(pod) {
        return Ok(None);
    }
    let draining = pod.metadata.deletion_timestamp.is_some();
    // A terminating Pod's Ready condition lags (the kubelet flips it only once its
    // probe fails), and a draining worker must stay listed either way; so readiness
    // only gates live Pods.
    if !draining && !is_ready(pod) {
        return Ok(None);
    }
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WORKER_INFO_ANNOTATION));
    let Some(json) = annotation else {
        // The sidecar removes the annotation when it starts draining: expected, silent.
        return if draining {
            Ok(None)
        } else {
            Err(PodRecordError::MissingAnnotation)
        };
    };
    let record = WorkerRecord::from_json(json.as_bytes())
        .map_err(|e| PodRecordError::InvalidAnnotation(e.to_string()))?;
    if let Some(why) = foreign_url(pod, &record.url) {
        return Err(PodRecordError::ForeignUrl(why));
    }
    Ok(Some(PodWorker { record, draining }))
}

/// An InferencePool's target ports: each is an endpoint of every selected Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PoolPorts {
    /// `spec.targetPorts[].number`.
    pub ports: Vec<u16>,
}

/// The block size prompts to a pool's stock engines are hashed at (their prefixes are
/// approximated from the router's own picks, so it need not be the engine's).
const POOL_BLOCK_TOKENS: u32 = 16;

/// The workers a Ready Pod without an Infera sidecar contributes to a pool: one per
/// target port at the Pod's IP, for any model, their prefixes approximated from the
/// picker's own picks (no KV events, no tokenizer of their own).
pub(crate) fn build_pool_workers(pod: &Pod, pool: &PoolPorts) -> Vec<PodWorker> {
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
    let Some(ip) = ip.filter(|ip| !ip.is_empty()) else {
        return Vec::new();
    };
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    let draining = pod.metadata.deletion_timestamp.is_some();
    pool.ports
        .iter()
        .filter_map(|port| {
            let json = serde_json::json!({
                "worker_id": format!("{host}:{port}"),
                "url": format!("http://{host}:{port}"),
                "model_name": ANY_MODEL,
                "engine": "vllm",
                "disagg_mode": "mixed",
                // The router's own hashing of prompts (approximate, no KV events): vLLM's
                // default block size.
                "kv_block_size": POOL_BLOCK_TOKENS,
                "pod": pod.name_any(),
            });
            WorkerRecord::from_json(json.to_string().as_bytes())
                .ok()
                .map(|record| PodWorker { record, draining })
        })
        .collect()
}

/// Why `url` does not point at `pod`, if it does not: whoever can write one Pod's
/// annotation must not steer requests (prompts) to another address. Pods on the host
/// network share the node's addresses (an RDMA rail's, say) and are not checked.
fn foreign_url(pod: &Pod, url: &str) -> Option<String> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if host_network {
        return None;
    }
    let status = pod.status.as_ref()?;
    let mut ips: Vec<&str> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|ip| ip.ip.as_str())
        .collect();
    ips.extend(status.pod_ip.as_deref());
    if ips.is_empty() {
        return None;
    }
    let parsed = reqwest::Url::parse(url).ok();
    let host = parsed
        .as_ref()
        .and_then(|u| u.host_str())
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'));
    let Some(host) = host else {
        return Some(format!("its url {url:?} has no host"));
    };
    let own = if host.parse::<std::net::IpAddr>().is_ok() {
        ips.contains(&host)
    } else {
        let label = host.split('.').next().unwrap_or_default();
        let names = [
            pod.metadata.name.as_deref(),
            pod.spec.as_ref().and_then(|s| s.hostname.as_deref()),
        ];
        names.contains(&Some(label))
    };
    (!own).then(|| {
        format!(
            "its url {url} names {host}, not this Pod ({})",
            ips.join(", ")
        )
    })
}

/// A change to make in the registry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RegistryOp {
    /// Add or update a worker and set whether it drains.
    Upsert(Box<PodWorker>),
    /// Remove a worker by id.
    Remove(String),
}

/// Something worth one log line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PodWarning {
    /// A live Pod contributes no worker.
    Skipped {
        /// Pod name.
        pod: String,
        /// Why.
        reason: PodRecordError,
    },
    /// Two or more Pods announce the same worker.
    DuplicateWorker {
        /// The worker id.
        worker_id: String,
        /// The Pod whose record is used.
        kept: String,
        /// The Pods ignored.
        ignored: Vec<String>,
    },
}

/// What one watch event asks for.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct IndexUpdate {
    /// Registry changes, in order.
    pub ops: Vec<RegistryOp>,
    /// New warnings.
    pub warnings: Vec<PodWarning>,
    /// A full list just completed (the first one marks the registry synced).
    pub listed: bool,
}

/// The Pods seen and what each contributes, plus what the registry was last told.
#[derive(Debug, Default)]
pub(crate) struct PodIndex {
    /// Pods by name, with the workers each contributes (none, one, or one per pool port).
    pods: BTreeMap<String, Vec<PodWorker>>,
    /// Pods gathered by a list in progress (between `Init` and `InitDone`).
    listing: Option<BTreeMap<String, Vec<PodWorker>>>,
    /// The last reason each Pod was warned about.
    warned: BTreeMap<String, PodRecordError>,
    /// Worker ids currently warned as announced by several Pods.
    warned_duplicates: BTreeSet<String>,
    /// The workers the registry holds, by id.
    applied: BTreeMap<String, PodWorker>,
    /// Whether a full list has completed.
    listed_once: bool,
    /// Pods without an Infera sidecar are routed on these ports (an InferencePool's).
    pool: Option<PoolPorts>,
}

impl PodIndex {
    /// An index that routes Pods without a worker record on `pool`'s ports.
    pub(crate) fn with_pool(pool: Option<PoolPorts>) -> Self {
        Self {
            pool,
            ..Self::default()
        }
    }

    /// Whether a full list has completed.
    pub(crate) fn is_synced(&self) -> bool {
        self.listed_once
    }

    /// Takes one watcher event; returns what to change and log.
    pub(crate) fn apply(&mut self, event: Event<Pod>) -> IndexUpdate {
        let mut warnings = Vec::new();
        let mut listed = false;
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                return IndexUpdate::default();
            }
            Event::InitApply(pod) => {
                let (name, entry) = self.observe(&pod, &mut warnings);
                // Until `InitDone` the registry keeps the previous set, so routing goes
                // on during a re-list.
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, entry);
                return IndexUpdate {
                    warnings,
                    ..IndexUpdate::default()
                };
            }
            Event::InitDone => {
                self.pods = self.listing.take().unwrap_or_default();
                self.warned.retain(|pod, _| self.pods.contains_key(pod));
                self.listed_once = true;
                listed = true;
            }
            Event::Apply(pod) => {
                let (name, entry) = self.observe(&pod, &mut warnings);
                self.pods.insert(name, entry);
            }
            Event::Delete(pod) => {
                let name = pod.name_any();
                self.pods.remove(&name);
                self.warned.remove(&name);
            }
        }
        if !self.listed_once {
            return IndexUpdate {
                warnings,
                ..IndexUpdate::default()
            };
        }
        let view = self.build_view(&mut warnings);
        let ops = compute_registry_ops(&self.applied, &view);
        self.applied = view;
        IndexUpdate {
            ops,
            warnings,
            listed,
        }
    }

    fn observe(&mut self, pod: &Pod, warnings: &mut Vec<PodWarning>) -> (String, Vec<PodWorker>) {
        let name = pod.name_any();
        let found = match build_pod_worker(pod) {
            Err(PodRecordError::MissingAnnotation) => match &self.pool {
                Some(pool) => Ok(build_pool_workers(pod, pool)),
                None => Err(PodRecordError::MissingAnnotation),
            },
            other => other.map(|w| w.into_iter().collect()),
        };
        let entry = match found {
            Ok(workers) if !workers.is_empty() => {
                self.warned.remove(&name);
                workers
            }
            // A terminating Pod whose sidecar removed the annotation to drain: its engine
            // still runs and finishes what it holds, so the worker stays listed.
            Ok(_) if pod.metadata.deletion_timestamp.is_some() && is_running(pod) => self
                .pods
                .get(&name)
                .map(|last| {
                    last.iter()
                        .map(|w| PodWorker {
                            record: w.record.clone(),
                            draining: true,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            // Not running or not ready: nothing to say (a warning given stays given).
            Ok(_) => Vec::new(),
            Err(reason) => {
                if self.warned.get(&name) != Some(&reason) {
                    self.warned.insert(name.clone(), reason.clone());
                    warnings.push(PodWarning::Skipped {
                        pod: name.clone(),
                        reason,
                    });
                }
                Vec::new()
            }
        };
        (name, entry)
    }

    /// The workers by id, one per id (serving beats draining, then the first Pod name).
    fn build_view(&mut self, warnings: &mut Vec<PodWarning>) -> BTreeMap<String, PodWorker> {
        let mut view: BTreeMap<String, (&str, &PodWorker)> = BTreeMap::new();
        let mut claims: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (pod, worker) in self
            .pods
            .iter()
            .flat_map(|(p, ws)| ws.iter().map(move |w| (p, w)))
        {
            let id = worker.record.worker_id.as_str();
            claims.entry(id).or_default().push(pod);
            // Pods come in name order: the first stays unless a serving Pod follows a
            // draining one.
            let replace = view
                .get(id)
                .is_none_or(|(_, kept)| kept.draining && !worker.draining);
            if replace {
                view.insert(id.to_owned(), (pod, worker));
            }
        }
        let mut duplicates = BTreeSet::new();
        for (id, pods) in claims.into_iter().filter(|(_, pods)| pods.len() > 1) {
            duplicates.insert(id.to_owned());
            if self.warned_duplicates.contains(id) {
                continue;
            }
            let kept = view
                .get(id)
                .map(|(pod, _)| (*pod).to_owned())
                .unwrap_or_default();
            warnings.push(PodWarning::DuplicateWorker {
                worker_id: id.to_owned(),
                ignored: pods
                    .into_iter()
                    .filter(|p| *p != kept)
                    .map(str::to_owned)
                    .collect(),
                kept,
            });
        }
        self.warned_duplicates = duplicates;
        view.into_iter()
            .map(|(id, (_, worker))| (id, worker.clone()))
            .collect()
    }
}

/// The registry changes that turn `old` into `new` (removals first, then upserts, each
/// in worker-id order).
pub(crate) fn compute_registry_ops(
    old: &BTreeMap<String, PodWorker>,
    new: &BTreeMap<String, PodWorker>,
) -> Vec<RegistryOp> {
    let removed = old
        .keys()
        .filter(|id| !new.contains_key(*id))
        .map(|id| RegistryOp::Remove(id.clone()));
    let upserted = new
        .iter()
        .filter(|(id, worker)| old.get(*id) != Some(*worker))
        .map(|(_, worker)| RegistryOp::Upsert(Box::new(worker.clone())));
    removed.chain(upserted).collect()
}

/// Performs what [`PodIndex::apply`] decided: logs its warnings, applies its registry
/// changes, marks the registry synced after a full list.
pub(crate) fn apply_update(
    update: IndexUpdate,
    registry: &Registry,
    metrics: &Metrics,
    namespace: &str,
) {
    for warning in update.warnings {
        match warning {
            PodWarning::Skipped { pod, reason } => {
                if matches!(reason, PodRecordError::InvalidAnnotation(_)) {
                    metrics.record_rejected_record("invalid_record");
                }
                tracing::warn!("kubernetes discovery: pod {namespace}/{pod}: {reason}");
            }
            PodWarning::DuplicateWorker {
                worker_id,
                kept,
                ignored,
            } => tracing::warn!(
                "kubernetes discovery: pods {ignored:?} in {namespace} announce worker {worker_id} \
                 like pod {kept}; only {kept}'s record is used (check their advertise hosts)"
            ),
        }
    }
    for op in update.ops {
        match op {
            RegistryOp::Upsert(worker) => {
                let PodWorker { record, draining } = *worker;
                metrics.record_discovery("put");
                let id = record.worker_id.clone();
                let change = registry.upsert_draining(record, draining);
                tracing::info!(worker = %id, draining, "kubernetes discovery: worker {change:?}");
            }
            RegistryOp::Remove(id) => {
                metrics.record_discovery("delete");
                if registry.remove(&id) {
                    tracing::info!(worker = %id, "kubernetes discovery: worker removed");
                }
            }
        }
    }
    if update.listed {
        metrics.record_discovery("sync");
        registry.mark_synced();
    }
}

/// Lists and watches the Pods of `namespace` matching `label_selector` until `stop`
/// turns true, feeding their workers into `registry`.
pub(crate) async fn run_kubernetes_discovery(
    client: Client,
    namespace: String,
    label_selector: String,
    pool: Option<PoolPorts>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&label_selector);
    // The watcher retries every failure itself (re-listing after a 410 Gone); the
    // backoff keeps a persistent one (RBAC, an unreachable server) from spinning.
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    let mut index = PodIndex::with_pool(pool);
    tracing::info!("kubernetes discovery: watching pods in {namespace} matching {label_selector}");
    loop {
        let event = tokio::select! {
            e = events.next() => e,
            _ = stop.wait_for(|s| *s) => return,
        };
        match event {
            Some(Ok(event)) => {
                if matches!(event, Event::Init) && index.is_synced() {
                    metrics.record_discovery("resync");
                }
                let update = index.apply(event);
                apply_update(update, &registry, &metrics, &namespace);
            }
            Some(Err(e)) => {
                metrics.record_discovery("watch_error");
                tracing::warn!(
                    "kubernetes discovery of pods in {namespace} matching {label_selector}: {e}; \
                     retrying (the gateway's service account needs get, list and watch on pods \
                     in {namespace})"
                );
            }
            None => {
                tracing::error!(
                    "kubernetes discovery: the pod watch ended; no further changes are seen"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD_IP: &str = "10.244.0.9";

    fn mk_record_json(id: &str) -> String {
        format!(
            r#"{{"worker_id":"{id}","url":"http://{POD_IP}:8000","model_name":"fixture-model","engine":"vllm"}}"#
        )
    }

    fn mk_pod(
        name: &str,
        phase: &str,
        ready: bool,
        annotation: Option<&str>,
        deleting: bool,
    ) -> Pod {
        let mut metadata = serde_json::json!({"name": name, "namespace": "fixture-ns"});
        if let Some(a) = annotation {
            metadata["annotations"] = serde_json::json!({WORKER_INFO_ANNOTATION: a});
        }
        if deleting {
            metadata["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(serde_json::json!({
            "metadata": metadata,
            "status": {
                "podIP": POD_IP,
                "podIPs": [{"ip": POD_IP}],
                "phase": phase,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
        .unwrap()
    }

    fn mk_worker_pod(name: &str, id: &str) -> Pod {
        mk_pod(name, "Running", true, Some(&mk_record_json(id)), false)
    }

    fn mk_draining_pod(name: &str, id: &str) -> Pod {
        mk_pod(name, "Running", true, Some(&mk_record_json(id)), true)
    }

    fn upserted(update: &IndexUpdate) -> Vec<(&str, bool)> {
        update
            .ops
            .iter()
            .filter_map(|op| match op {
                RegistryOp::Upsert(w) => Some((w.record.worker_id.as_str(), w.draining)),
                RegistryOp::Remove(_) => None,
            })
            .collect()
    }

    fn removed(update: &IndexUpdate) -> Vec<&str> {
        update
            .ops
            .iter()
            .filter_map(|op| match op {
                RegistryOp::Remove(id) => Some(id.as_str()),
                RegistryOp::Upsert(_) => None,
            })
            .collect()
    }

    fn list(index: &mut PodIndex, pods: Vec<Pod>) -> IndexUpdate {
        assert_eq!(index.apply(Event::Init), IndexUpdate::default());
        let mut warnings = Vec::new();
        for pod in pods {
            let update = index.apply(Event::InitApply(pod));
            assert!(
                update.ops.is_empty(),
                "nothing changes before the list is complete"
            );
            warnings.extend(update.warnings);
        }
        let mut update = index.apply(Event::InitDone);
        warnings.append(&mut update.warnings);
        update.warnings = warnings;
        update
    }

    #[test]
    fn a_pod_announcing_another_address_is_refused() {
        let with_url = |url: &str| {
            format!(
                r#"{{"worker_id":"10.244.0.9:8000","url":"{url}","model_name":"fixture-model","engine":"vllm"}}"#
            )
        };
        let worker = |url: &str| {
            build_pod_worker(&mk_pod(
                "engine-0",
                "Running",
                true,
                Some(&with_url(url)),
                false,
            ))
        };
        // Its own IP, its name as the first DNS label: served.
        for own in [
            format!("http://{POD_IP}:8000"),
            "http://engine-0.engines.ns.svc:8000".to_owned(),
        ] {
            let got = worker(&own);
            assert!(matches!(got, Ok(Some(_))), "{own}: {got:?}");
        }
        // A capture server, another Pod, a name that is not its own: refused, saying why.
        for foreign in [
            "http://10.244.0.66:8000",
            "http://capture.example:80",
            "http://engine-1.engines.ns.svc:8000",
        ] {
            match worker(foreign) {
                Err(e @ PodRecordError::ForeignUrl(_)) => {
                    let text = e.to_string();
                    assert!(text.contains(foreign) && text.contains(POD_IP), "{text}");
                }
                other => panic!("{foreign}: {other:?}"),
            }
        }
        // On the host network a Pod shares the node's addresses (an RDMA rail's).
        let mut host = mk_pod(
            "engine-0",
            "Running",
            true,
            Some(&with_url("http://192.168.40.7:8000")),
            false,
        );
        host.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            host_network: Some(true),
            ..Default::default()
        });
        assert!(matches!(build_pod_worker(&host), Ok(Some(_))));
    }

    #[test]
    fn only_running_ready_pods_with_a_record_serve() {
        let record = mk_record_json("10.0.0.1:8000");
        let worker = |pod: Pod| build_pod_worker(&pod);
        assert_eq!(
            worker(mk_pod("p", "Pending", false, Some(&record), false)),
            Ok(None)
        );
        assert_eq!(
            worker(mk_pod("p", "Succeeded", true, Some(&record), false)),
            Ok(None)
        );
        assert_eq!(
            worker(mk_pod("p", "Running", false, Some(&record), false)),
            Ok(None)
        );
        let no_status: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        assert_eq!(
            worker(no_status),
            Ok(None),
            "a Pod the kubelet has not started"
        );
        let serving = worker(mk_pod("p", "Running", true, Some(&record), false))
            .unwrap()
            .unwrap();
        assert_eq!(serving.record.worker_id, "10.0.0.1:8000");
        assert!(!serving.draining);
        assert_eq!(
            worker(mk_pod("p", "Running", true, None, false)),
            Err(PodRecordError::MissingAnnotation)
        );
        assert!(matches!(
            worker(mk_pod("p", "Running", true, Some("{not json"), false)),
            Err(PodRecordError::InvalidAnnotation(_))
        ));
        assert!(matches!(
            worker(mk_pod("p", "Running", true, Some(&mk_record_json("no-port")), false)),
            Err(PodRecordError::InvalidAnnotation(m)) if m.contains("no-port")
        ));
    }

    #[test]
    fn a_pod_being_deleted_drains_whatever_its_readiness() {
        let record = mk_record_json("10.0.0.1:8000");
        for ready in [true, false] {
            let w = build_pod_worker(&mk_pod("p", "Running", ready, Some(&record), true))
                .unwrap()
                .unwrap();
            assert!(w.draining);
        }
        assert_eq!(
            build_pod_worker(&mk_pod("p", "Running", true, None, true)),
            Ok(None),
            "the sidecar removed its annotation: gone, without a warning"
        );
        assert_eq!(
            build_pod_worker(&mk_pod("p", "Failed", true, Some(&record), true)),
            Ok(None)
        );
    }

    #[tokio::test]
    async fn an_unusable_kubeconfig_says_what_to_change() {
        let Err(err) = build_kube_client(Some(Path::new("/nonexistent/fixture-kubeconfig"))).await
        else {
            panic!("a client from a kubeconfig that does not exist");
        };
        assert!(matches!(
            err,
            KubernetesDiscoveryError::ReadKubeconfig { .. }
        ));
        assert!(err.to_string().contains("--kubeconfig"), "{err}");
    }

    #[test]
    fn nothing_is_applied_before_the_first_full_list() {
        let mut index = PodIndex::default();
        assert!(!index.is_synced());
        index.apply(Event::Init);
        index.apply(Event::InitApply(mk_worker_pod("a", "h:1")));
        assert!(!index.is_synced());
        let update = index.apply(Event::InitDone);
        assert!(update.listed && index.is_synced());
        assert_eq!(upserted(&update), vec![("h:1", false)]);
    }

    #[test]
    fn pod_events_become_registry_ops() {
        let mut index = PodIndex::default();
        let update = list(
            &mut index,
            vec![mk_worker_pod("a", "h:1"), mk_worker_pod("b", "h:2")],
        );
        assert_eq!(upserted(&update), vec![("h:1", false), ("h:2", false)]);

        let update = index.apply(Event::Apply(mk_worker_pod("a", "h:1")));
        assert!(
            update.ops.is_empty() && !update.listed,
            "a status update changes nothing"
        );

        let update = index.apply(Event::Apply(mk_draining_pod("a", "h:1")));
        assert_eq!(upserted(&update), vec![("h:1", true)]);
        assert!(removed(&update).is_empty());

        let update = index.apply(Event::Apply(mk_pod("a", "Running", true, None, true)));
        assert!(
            update.ops.is_empty() && update.warnings.is_empty(),
            "the sidecar took its record off to drain: still listed, draining"
        );
        let update = list(
            &mut index,
            vec![
                mk_pod("a", "Running", false, None, true),
                mk_worker_pod("b", "h:2"),
            ],
        );
        assert!(update.ops.is_empty(), "a re-list keeps it too");
        let update = index.apply(Event::Apply(mk_pod("a", "Succeeded", false, None, true)));
        assert_eq!(removed(&update), vec!["h:1"], "its containers exited");

        let update = index.apply(Event::Delete(mk_worker_pod("b", "h:2")));
        assert_eq!(removed(&update), vec!["h:2"]);
        let update = index.apply(Event::Apply(mk_worker_pod("c", "h:3")));
        assert_eq!(upserted(&update), vec![("h:3", false)]);
        let update = index.apply(Event::Apply(mk_pod("c", "Running", false, None, false)));
        assert_eq!(removed(&update), vec!["h:3"], "not ready: out");
    }

    #[test]
    fn a_relist_replaces_the_set_and_removed_pods_vanish() {
        let mut index = PodIndex::default();
        list(
            &mut index,
            vec![mk_worker_pod("a", "h:1"), mk_worker_pod("b", "h:2")],
        );
        // The watch expired (410 Gone); meanwhile `a` was deleted and `c` created.
        let update = list(
            &mut index,
            vec![mk_worker_pod("b", "h:2"), mk_worker_pod("c", "h:3")],
        );
        assert!(update.listed);
        assert_eq!(removed(&update), vec!["h:1"]);
        assert_eq!(upserted(&update), vec![("h:3", false)]);
        let update = list(&mut index, Vec::new());
        assert_eq!(removed(&update), vec!["h:2", "h:3"]);
    }

    #[test]
    fn a_skipped_pod_is_warned_about_once_per_reason() {
        let mut index = PodIndex::default();
        let bad = || mk_pod("bad", "Running", true, Some("{"), false);
        let update = list(&mut index, vec![bad()]);
        assert!(update.ops.is_empty());
        assert!(matches!(
            update.warnings.as_slice(),
            [PodWarning::Skipped { pod, reason: PodRecordError::InvalidAnnotation(_) }] if pod == "bad"
        ));
        assert!(index.apply(Event::Apply(bad())).warnings.is_empty());
        assert!(
            list(&mut index, vec![bad()]).warnings.is_empty(),
            "nor on a re-list"
        );
        let update = index.apply(Event::Apply(mk_pod("bad", "Running", true, None, false)));
        assert_eq!(
            update.warnings,
            vec![PodWarning::Skipped {
                pod: "bad".into(),
                reason: PodRecordError::MissingAnnotation
            }],
            "a new reason is news"
        );
        index.apply(Event::Delete(bad()));
        assert_eq!(
            index.apply(Event::Apply(bad())).warnings.len(),
            1,
            "a Pod recreated under the same name is warned about again"
        );
        let update = index.apply(Event::Apply(mk_worker_pod("bad", "h:9")));
        assert!(update.warnings.is_empty());
        assert_eq!(upserted(&update), vec![("h:9", false)]);
        assert_eq!(index.apply(Event::Apply(bad())).warnings.len(), 1);
    }

    #[test]
    fn pods_announcing_the_same_worker_yield_one() {
        let mut index = PodIndex::default();
        let update = list(
            &mut index,
            vec![mk_draining_pod("a", "h:1"), mk_worker_pod("b", "h:1")],
        );
        assert_eq!(
            upserted(&update),
            vec![("h:1", false)],
            "serving beats draining"
        );
        assert_eq!(
            update.warnings,
            vec![PodWarning::DuplicateWorker {
                worker_id: "h:1".into(),
                kept: "b".into(),
                ignored: vec!["a".into()],
            }]
        );
        let update = index.apply(Event::Apply(mk_worker_pod("c", "h:1")));
        assert!(
            update.ops.is_empty() && update.warnings.is_empty(),
            "warned once"
        );
        index.apply(Event::Delete(mk_worker_pod("b", "h:1")));
        let update = index.apply(Event::Delete(mk_worker_pod("c", "h:1")));
        assert_eq!(
            upserted(&update),
            vec![("h:1", true)],
            "only the draining Pod is left"
        );
    }

    #[test]
    fn updates_drive_the_registry() {
        let registry = Registry::new();
        let metrics = Metrics::default();
        let mut index = PodIndex::default();
        let update = list(
            &mut index,
            vec![
                mk_worker_pod("a", "h:1"),
                mk_worker_pod("b", "h:2"),
                mk_pod("bad", "Running", true, Some("[]"), false),
            ],
        );
        apply_update(update, &registry, &metrics, "fixture-ns");
        assert!(registry.is_synced());
        let update = index.apply(Event::Apply(mk_draining_pod("a", "h:1")));
        apply_update(update, &registry, &metrics, "fixture-ns");
        let snap = registry.snapshot();
        assert_eq!(snap.workers.len(), 2);
        assert!(snap.is_draining("h:1"));
        let routed: Vec<&str> = snap.models["fixture-model"]
            .mixed
            .iter()
            .map(|t| t.key.as_str())
            .collect();
        assert_eq!(routed, vec!["h:2"]);
        let update = index.apply(Event::Delete(mk_draining_pod("a", "h:1")));
        apply_update(update, &registry, &metrics, "fixture-ns");
        assert!(!registry.snapshot().workers.contains_key("h:1"));
    }
}
