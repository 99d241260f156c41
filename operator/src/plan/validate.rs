//! Validation (pure): an `InferaDeployment`, what was observed around it and the
//! platform become a [`Plan`], or the one reason it cannot run (a `Degraded` condition).

use super::engine_platform::{LiveEngines, choose_platform};
use super::rollout::RolloutLimits;
use super::{
    DeploymentPlan, Discovery, EnginePlan, GatewayPlan, GatewayRouting, KvdPlan, ModelPlan,
    ModelVolume, NvmePlan, Owner, PdLeg, Plan, Platform, PodOverride, PullPlan, PullSecretData,
    RolePlan, ScalingAccess,
};
use crate::api::resolve::{
    Launch, ResolveError, Workers, gpus_per_worker, launch, resolve_workers, unit_size,
};
use crate::api::{
    DiscoveryBackend, EtcdSpec, InferaDeployment, InferaDeploymentSpec, MessagingBackend,
    PDTopology, Parallelism, RoleSpec, ServingMode,
};
use crate::{names, quantity};
use kube::Resource;
use names::Role;
use std::collections::BTreeMap;
use std::path::{Component, Path};

/// What validation needs besides the deployment: read from the API server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observed<'a> {
    /// The referenced topology, if it exists.
    pub topology: Option<&'a PDTopology>,
    /// The model is in place: a PVC or host path, or a finished download (then the
    /// download Job is no longer rendered).
    pub model_ready: bool,
    /// The data of the cluster etcd's client certificate Secret
    /// ([`Platform::etcd_client_secret`]), when the deployment uses that etcd and it
    /// exists.
    pub etcd_client_tls: Option<&'a EtcdClientTls>,
    /// The deployment's engine workloads as they stand, by name (none yet: empty).
    pub engines: Option<&'a BTreeMap<String, LiveEngines>>,
    /// The operator's pull secrets ([`Platform::pull_secrets`]) that exist, by name.
    pub pull_secrets: Option<&'a BTreeMap<String, PullSecretData>>,
}

/// A Secret's data, as stored.
pub type EtcdClientTls = std::collections::BTreeMap<String, k8s_openapi::ByteString>;

/// Why a deployment cannot run, as a `Degraded` reason and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidateError {
    /// A rule across objects (see [`ResolveError`]).
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The name leaves no room for children's suffixes.
    #[error("metadata.name {0:?} is longer than {max} characters: pod names add a role, an ordinal and a hash within Kubernetes' 63-character label limit; use a shorter name", max = names::MAX_NAME_LEN)]
    NameTooLong(String),
    /// etcd discovery without endpoints, and no cluster etcd.
    #[error(
        "spec.discovery.backend is etcd but spec.discovery.etcd.endpoints is unset and the operator knows no cluster etcd (install the chart with etcd.enabled=true, or set the endpoints)"
    )]
    NoEtcd,
    /// The cluster etcd requires a client certificate whose Secret does not exist.
    #[error(
        "spec.discovery uses the cluster etcd, which requires a client certificate, but its Secret {0} does not exist (the chart writes it with etcd.tls.enabled; with etcd.tls.clientSecretName it must exist, e.g. from cert-manager)"
    )]
    NoEtcdClientCertificate(String),
    /// NATS messaging without a URL, and no cluster NATS.
    #[error(
        "spec.messaging.backend is nats but spec.messaging.natsUrl is unset and the operator knows no cluster NATS (install the chart with nats.enabled=true, or set natsUrl)"
    )]
    NoNats,
    /// A size that is not a number of bytes.
    #[error("{field} {value:?} is not a number of bytes (use e.g. 64Gi or 500G)")]
    Quantity {
        /// The field.
        field: &'static str,
        /// What it holds.
        value: String,
    },
    /// An NVMe tier outside the directories the platform allows.
    #[error(
        "spec.kvCache.nvme.path {path:?} is not below a directory this operator allows for NVMe tiers ({allowed}); use a folder below one, or ask the platform team to add one (the chart's operator.kvCacheNvmeHostPaths)"
    )]
    NvmePathNotAllowed {
        /// The path.
        path: String,
        /// The allowed directories.
        allowed: String,
    },
    /// Something the engine cannot do.
    #[error("{field}: {reason}")]
    Engine {
        /// The field.
        field: &'static str,
        /// Why, and what to write instead.
        reason: String,
    },
    /// A `podTemplate` override that cannot be merged or is not a pod template.
    #[error("{field}: {reason}")]
    PodTemplate {
        /// Where in the spec, down to the patch's own path.
        field: String,
        /// Why, and what to write instead.
        reason: String,
    },
    /// The object was never stored (no uid for owner references).
    #[error("the InferaDeployment has no uid or namespace yet")]
    NotStored,
    /// A pull secret the operator was installed with does not exist.
    #[error(
        "the operator pulls images with Secret {0}, which does not exist in its namespace (the chart's imagePullSecrets): create it, or remove it from the chart's values"
    )]
    PullSecretMissing(String),
    /// A role's effective rollout limits are both 0.
    #[error(
        "spec.rollout.{0}: maxSurge and maxUnavailable are both 0 for the {0} role, so none of its workers could ever be replaced; allow a surge or an unavailable worker"
    )]
    RolloutCannotProceed(&'static str),
}

impl ValidateError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Resolve(ResolveError::MissingTopology(_)) => "TopologyNotFound",
            Self::Resolve(ResolveError::Unsupported { .. }) => "UnsupportedTransport",
            Self::Resolve(ResolveError::Parallelism { .. }) => "InvalidParallelism",
            Self::NameTooLong(_) => "NameTooLong",
            Self::NoEtcd => "EtcdEndpointsMissing",
            Self::NoEtcdClientCertificate(_) => "EtcdClientCertificateMissing",
            Self::NoNats => "NatsUrlMissing",
            Self::Quantity { .. } => "InvalidQuantity",
            Self::NvmePathNotAllowed { .. } => "NvmePathNotAllowed",
            Self::Engine { .. } => "UnsupportedByEngine",
            Self::PodTemplate { .. } => "InvalidPodTemplate",
            Self::NotStored => "NotStored",
            Self::PullSecretMissing(_) => "PullSecretMissing",
            Self::RolloutCannotProceed(_) => "InvalidRollout",
        }
    }
}

/// The plan of `idep` on `platform`, given what was observed.
pub fn validate(
    idep: &InferaDeployment,
    observed: Observed<'_>,
    platform: &Platform,
) -> Result<Plan, ValidateError> {
    let name = idep.metadata.name.clone().unwrap_or_default();
    if name.len() > names::MAX_NAME_LEN {
        return Err(ValidateError::NameTooLong(name));
    }
    let (Some(namespace), Some(mut reference)) = (
        idep.metadata.namespace.clone(),
        idep.controller_owner_ref(&()),
    ) else {
        return Err(ValidateError::NotStored);
    };
    // Foreground deletion of the deployment waits for its children.
    reference.block_owner_deletion = Some(true);
    let spec = &idep.spec;
    let discovery = discovery(&name, spec, platform)?;
    let nats_url = nats_url(spec, platform)?;
    let deployment = plan_deployment(&name, spec, observed.topology)?;
    if let Some(nvme) = deployment.kvd.as_ref().and_then(|k| k.nvme.as_ref()) {
        check_nvme_path(&nvme.path, platform)?;
    }
    let etcd_client_copy = match (
        Platform::uses_cluster_etcd(spec),
        &platform.etcd_client_secret,
    ) {
        (true, Some((secret_ns, secret))) => {
            Some(observed.etcd_client_tls.cloned().ok_or_else(|| {
                ValidateError::NoEtcdClientCertificate(format!("{secret_ns}/{secret}"))
            })?)
        }
        _ => None,
    };
    let engine_platforms = deployment
        .roles
        .iter()
        .map(|role| {
            let live = observed
                .engines
                .and_then(|e| e.get(&names::workers(&name, role.role)));
            let sim_engine =
                matches!(deployment.launch, Launch::Sim(_)) && deployment.engine.image.is_none();
            let choice = choose_platform(
                spec.platform.as_ref().map(|p| p.version),
                live,
                sim_engine,
                &platform.images,
                &platform.registry,
            );
            (role.role, choice)
        })
        .collect();
    let copies = platform
        .pull_secrets
        .iter()
        .map(|secret| {
            observed
                .pull_secrets
                .and_then(|found| found.get(secret))
                .map(|data| (names::pull_secret_copy(&name, secret), data.clone()))
                .ok_or_else(|| ValidateError::PullSecretMissing(secret.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pull = PullPlan {
        policy: spec.image_pull_policy,
        platform_policy: platform.pull_policy,
        secrets: spec
            .image_pull_secrets
            .iter()
            .map(|s| s.name.clone())
            .collect(),
        copies,
    };
    let live_workers = deployment
        .roles
        .iter()
        .filter_map(|role| {
            let live = observed
                .engines?
                .get(&names::workers(&name, role.role))?
                .workers
                .clone()?;
            Some((role.role, live))
        })
        .collect();
    Ok(Plan {
        engine_platforms,
        pull,
        live_workers,
        owner: Owner {
            name,
            namespace,
            reference,
        },
        images: platform.images.clone(),
        deployment,
        discovery,
        nats_url,
        request_plane: spec.messaging.request_plane_flags(),
        etcd_client_copy,
        model_ready: observed.model_ready,
        autoscaler_namespace: spec
            .autoscaling
            .as_ref()
            .and(platform.operator_namespace.clone()),
    })
}

/// Where deployment `name` registers workers: its own etcd, else the platform's (with
/// the client certificate from the copy named [`names::etcd_client_secret`]).
fn discovery(
    name: &str,
    spec: &InferaDeploymentSpec,
    platform: &Platform,
) -> Result<Discovery, ValidateError> {
    if spec.discovery.backend == DiscoveryBackend::Kubernetes {
        return Ok(Discovery::Kubernetes);
    }
    if let Some(etcd) = &spec.discovery.etcd {
        return Ok(Discovery::Etcd(etcd.clone()));
    }
    if platform.etcd_endpoints.is_empty() {
        return Err(ValidateError::NoEtcd);
    }
    Ok(Discovery::Etcd(EtcdSpec {
        endpoints: platform.etcd_endpoints.clone(),
        prefix: infera_proto::discovery::DEFAULT_ETCD_PREFIX.into(),
        tls_secret_name: platform
            .etcd_client_secret
            .as_ref()
            .map(|_| names::etcd_client_secret(name)),
        user: None,
        password_secret_ref: None,
    }))
}

/// The NATS server KV events go through, when they do: the deployment's, else the
/// platform's.
fn nats_url(
    spec: &InferaDeploymentSpec,
    platform: &Platform,
) -> Result<Option<String>, ValidateError> {
    if spec.messaging.backend != MessagingBackend::Nats {
        return Ok(None);
    }
    match (&spec.messaging.nats_url, &platform.nats_url) {
        (Some(url), _) | (None, Some(url)) => Ok(Some(url.clone())),
        (None, None) => Err(ValidateError::NoNats),
    }
}

/// What deployment `name` runs, given its topology (`None`: not found or none named).
/// Everything here holds wherever it runs: `infera up` plans with it too.
pub fn plan_deployment(
    name: &str,
    spec: &InferaDeploymentSpec,
    topology: Option<&PDTopology>,
) -> Result<DeploymentPlan, ValidateError> {
    let kvd = kvd_plan(spec)?;
    let launch = launch(spec.engine.kind, spec.engine.sim_flavor);
    check_engine(spec, launch, topology)?;
    check_role_templates(spec)?;
    let workers = resolve_workers(
        spec,
        topology.map(|t| (t.metadata.name.as_deref().unwrap_or_default(), &t.spec)),
    )?;
    let roles = match workers {
        Workers::Mixed(n) => {
            let parallelism = spec.engine.parallelism.clone();
            vec![RolePlan {
                role: Role::Mixed,
                workers: n,
                unit: 1,
                gpus: gpus(launch, &parallelism),
                parallelism,
                args: Vec::new(),
                resources: spec.engine.resources.clone(),
                pd: None,
                pod_overrides: pod_overrides(spec, Role::Mixed),
                rollout: rollout_limits(spec, Role::Mixed),
            }]
        }
        Workers::Disaggregated {
            prefill,
            decode,
            protocol,
        } => {
            let Some(t) = topology else {
                let named = spec.serving.topology_ref.clone().unwrap_or_default();
                return Err(ResolveError::MissingTopology(named).into());
            };
            let (p, d) = unit_size(&t.spec);
            let leg = PdLeg {
                protocol,
                transport: t.spec.transport.clone(),
            };
            let role = |role, workers, unit, topo| {
                topology_role(spec, launch, (role, workers, unit), topo, &leg)
            };
            vec![
                role(Role::Prefill, prefill, p, &t.spec.prefill),
                role(Role::Decode, decode, d, &t.spec.decode),
            ]
        }
    };
    if let Some(stuck) = roles
        .iter()
        .find(|r| r.rollout.max_surge == 0 && r.rollout.max_unavailable == 0)
    {
        return Err(ValidateError::RolloutCannotProceed(stuck.role.as_str()));
    }
    let g = &spec.gateway;
    Ok(DeploymentPlan {
        name: name.to_owned(),
        launch,
        engine: EnginePlan {
            image: spec.engine.image.clone(),
            args: spec.engine.args.clone(),
            env: spec.engine.env.clone(),
            kv_cache_dtype: spec.engine.kv_cache_dtype,
            shared_memory_size: spec.engine.shared_memory_size.clone(),
            drain_seconds: spec.engine.drain_seconds,
            gpu_resource_name: spec.engine.gpu_resource_name.clone(),
        },
        model: ModelPlan {
            served_name: spec.model.name.clone(),
            volume: model_volume(name, spec),
            hugging_face: spec.model.source.hugging_face.clone(),
            quantization: spec.model.quantization,
            tokenizer: spec
                .model
                .tokenizer
                .as_ref()
                .map(|t| t.trim_matches('/').to_owned()),
            startup_budget_seconds: spec.model.startup_budget_seconds,
        },
        roles,
        gateway: GatewayPlan {
            replicas: g.replicas,
            routing: GatewayRouting::from_spec(spec, launch),
            image: g.image.clone(),
            resources: g.resources.clone(),
            service: g.service.clone(),
            api_keys_secret_ref: g.api_keys_secret_ref.clone(),
            metrics_require_auth: g.metrics_require_auth,
            tls: g.tls.clone(),
            scheduling: g.scheduling.clone(),
            pod_override: g.pod_template.as_ref().map(|patch| PodOverride {
                field: "spec.gateway.podTemplate".into(),
                patch: patch.clone(),
            }),
            inference_pool: g.inference_pool.clone(),
            scaling_api: g.scaling_api.then(|| ScalingAccess {
                topology: (spec.serving.mode == ServingMode::Disaggregated)
                    .then(|| spec.serving.topology_ref.clone())
                    .flatten(),
            }),
        },
        kvd,
        network: spec.network.clone(),
        scheduling: spec.scheduling.clone(),
    })
}

/// What the engine's own command line cannot express. ATOM (0.1.4) answers to the model
/// it loads, so it loads the served name (a link to the weights), which must be a
/// relative path; and it has no flags for a worker spanning nodes.
fn check_engine(
    spec: &InferaDeploymentSpec,
    launch: Launch,
    topology: Option<&PDTopology>,
) -> Result<(), ValidateError> {
    if launch != Launch::Engine(infera_proto::worker::EngineKind::Atom) {
        return Ok(());
    }
    let name = &spec.model.name;
    if !infera_engine_prep::prepare::is_linkable_model_name(name) {
        return Err(ValidateError::Engine {
            field: "spec.model.name",
            reason: format!(
                "{name:?}: ATOM serves its model under the name it loads, so the name must be a relative path such as a Hugging Face id (org/model)"
            ),
        });
    }
    let mut nodes = vec![spec.engine.parallelism.nodes_per_worker];
    if let Some(t) = topology {
        nodes.extend([
            t.spec.prefill.parallelism.nodes_per_worker,
            t.spec.decode.parallelism.nodes_per_worker,
        ]);
    }
    if nodes.iter().any(|n| *n > 1) {
        return Err(ValidateError::Engine {
            field: "parallelism.nodesPerWorker",
            reason: "engine atom has no multi-node flags: a worker runs on one node (use data parallelism across workers)".into(),
        });
    }
    Ok(())
}

/// GPUs per pod: none for the simulator.
fn gpus(launch: Launch, p: &Parallelism) -> u32 {
    if launch.is_sim() {
        0
    } else {
        gpus_per_worker(p)
    }
}

/// A topology role: its parallelism (the deployment's `expertParallel` carried over, a
/// MoE model is one on every role), its args, and its resources else the engine's.
fn topology_role(
    spec: &InferaDeploymentSpec,
    launch: Launch,
    (role, workers, unit): (Role, u32, u32),
    topo: &RoleSpec,
    leg: &PdLeg,
) -> RolePlan {
    let mut parallelism = topo.parallelism.clone();
    parallelism.expert_parallel |= spec.engine.parallelism.expert_parallel;
    RolePlan {
        role,
        workers,
        unit,
        gpus: gpus(launch, &parallelism),
        parallelism,
        args: topo.args.clone(),
        resources: topo
            .resources
            .clone()
            .or_else(|| spec.engine.resources.clone()),
        pd: Some(leg.clone()),
        pod_overrides: pod_overrides(spec, role),
        rollout: rollout_limits(spec, role),
    }
}

/// A role's rollout limits: its own, else the deployment's.
fn rollout_limits(spec: &InferaDeploymentSpec, role: Role) -> RolloutLimits {
    let r = &spec.rollout;
    let own = match role {
        Role::Mixed => None,
        Role::Prefill => r.prefill.as_ref(),
        Role::Decode => r.decode.as_ref(),
    };
    RolloutLimits {
        max_surge: own.and_then(|o| o.max_surge).unwrap_or(r.max_surge),
        max_unavailable: own
            .and_then(|o| o.max_unavailable)
            .unwrap_or(r.max_unavailable),
    }
}

/// The pod-template overrides of `role`: the engine's, then the role's own.
fn pod_overrides(spec: &InferaDeploymentSpec, role: Role) -> Vec<PodOverride> {
    let per_role = &spec.engine.role_pod_templates;
    let own = match role {
        Role::Mixed => None,
        Role::Prefill => per_role.prefill.as_ref().map(|p| ("prefill", p)),
        Role::Decode => per_role.decode.as_ref().map(|p| ("decode", p)),
    };
    let engine = spec
        .engine
        .pod_template
        .as_ref()
        .map(|p| ("spec.engine.podTemplate".to_owned(), p));
    let own = own.map(|(r, p)| (format!("spec.engine.rolePodTemplates.{r}"), p));
    engine
        .into_iter()
        .chain(own)
        .map(|(field, patch)| PodOverride {
            field,
            patch: patch.clone(),
        })
        .collect()
}

/// Role templates name roles of a prefill/decode deployment only.
fn check_role_templates(spec: &InferaDeploymentSpec) -> Result<(), ValidateError> {
    let per_role = &spec.engine.role_pod_templates;
    if spec.serving.mode == ServingMode::Mixed
        && (per_role.prefill.is_some() || per_role.decode.is_some())
    {
        return Err(ValidateError::PodTemplate {
            field: "spec.engine.rolePodTemplates".into(),
            reason: "prefill and decode templates apply to serving.mode: disaggregated; a mixed deployment takes spec.engine.podTemplate".into(),
        });
    }
    Ok(())
}

/// The model volume of deployment `name`.
fn model_volume(name: &str, spec: &InferaDeploymentSpec) -> ModelVolume {
    let source = &spec.model.source;
    if let Some(hf) = &source.hugging_face {
        ModelVolume::Claim {
            claim: names::model_cache(name),
            sub_path: hf.id.clone(),
        }
    } else if let Some(pvc) = &source.pvc {
        ModelVolume::Claim {
            claim: pvc.claim_name.clone(),
            sub_path: pvc.sub_path.clone().unwrap_or_default(),
        }
    } else {
        ModelVolume::Host {
            path: source
                .host_path
                .as_ref()
                .map(|h| h.path.clone())
                .unwrap_or_else(|| "/".into()),
        }
    }
}

/// kvd's tiers, when on: its sizes must be whole bytes.
fn kvd_plan(spec: &InferaDeploymentSpec) -> Result<Option<KvdPlan>, ValidateError> {
    let kv = &spec.kv_cache;
    if !kv.enabled {
        return Ok(None);
    }
    let bytes = |field: &'static str, value: &str| {
        quantity::bytes(value)
            .filter(|b| *b > 0)
            .ok_or_else(|| ValidateError::Quantity {
                field,
                value: value.to_owned(),
            })
    };
    let ram_bytes = bytes("spec.kvCache.ram", &kv.ram.0)?;
    let nvme = match &kv.nvme {
        Some(n) => Some(NvmePlan {
            path: n.path.clone(),
            bytes: bytes("spec.kvCache.nvme.size", &n.size.0)?,
        }),
        None => None,
    };
    Ok(Some(KvdPlan {
        ram: kv.ram.clone(),
        ram_bytes,
        nvme,
        remote_url: kv.remote_url.clone(),
        remote_url_secret_ref: kv.remote_url_secret_ref.clone(),
    }))
}

/// An NVMe tier's hostPath must lie under a directory the platform allows: kvd writes
/// there as root, so the spec must not reach the node's system directories.
fn check_nvme_path(path: &str, platform: &Platform) -> Result<(), ValidateError> {
    let p = Path::new(path);
    let plain = p
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let allowed = platform
        .nvme_host_paths
        .iter()
        .any(|dir| p.starts_with(dir) && p != Path::new(dir.as_str()));
    if plain && allowed {
        return Ok(());
    }
    Err(ValidateError::NvmePathNotAllowed {
        path: path.to_owned(),
        allowed: platform.nvme_host_paths.join(", "),
    })
}
