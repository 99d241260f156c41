//! What `infera up` runs for a set of manifests (pure): each deployment planned as the
//! operator plans it ([`plan_deployment`]), whether its workers are simulated in-process
//! or launched as engines, and the gateway's settings.

use super::manifest::Manifests;
use infera_operator::api::InferaDeployment;
use infera_operator::plan::{
    DeploymentPlan, GatewayRouting, ModelVolume, ValidateError, plan_deployment,
};
use infera_proto::pd::PdProtocol;
use infera_proto::worker::EngineKind;

/// A worker's role (the operator's: mixed, prefill, decode).
pub use infera_operator::names::Role;

/// How a deployment's engines run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// Simulated in this process.
    Simulated,
    /// The real engine, launched by the sidecar as a child process.
    Engine,
}

/// One deployment as run here.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalDeployment {
    /// The operator's plan of it.
    pub plan: DeploymentPlan,
    /// One entry per worker, in start order (prefill before decode).
    pub workers: Vec<Role>,
    /// Simulated or launched.
    pub launch: Launch,
    /// Where a launched engine reads its weights on this machine (a folder or a Hugging
    /// Face id); "" when simulated from a PVC source.
    pub model_path: String,
}

impl LocalDeployment {
    /// Resource name.
    pub fn name(&self) -> &str {
        &self.plan.name
    }

    /// Served model name.
    pub fn model(&self) -> &str {
        &self.plan.model.served_name
    }

    /// The engine run, or the one simulated (its API details and connectors).
    pub fn engine(&self) -> EngineKind {
        self.plan.launch.engine()
    }

    /// Connector between prefill and decode.
    pub fn protocol(&self) -> Option<PdProtocol> {
        self.plan.protocol()
    }

    /// Tensor-parallel size of a launched (mixed) worker.
    pub fn tensor_parallel_size(&self) -> u32 {
        self.plan
            .roles
            .first()
            .map_or(1, |r| r.parallelism.tensor_parallel_size)
    }
}

/// The gateway: routed as the operator's gateway of the first deployment would be (the
/// same plan and flags builder), on `port`.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayPlan {
    /// Policy, weights, tokenizer, default retention.
    pub routing: GatewayRouting,
    /// The first deployment's model folder here, which a relative tokenizer is in.
    pub model_path: String,
    /// Port.
    pub port: u16,
}

/// Everything `infera up` starts.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalPlan {
    /// Deployments.
    pub deployments: Vec<LocalDeployment>,
    /// The one gateway serving all of them.
    pub gateway: GatewayPlan,
}

/// Options of `infera up` that change the plan.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// Simulate every engine, whatever the manifest names.
    pub sim: bool,
    /// Gateway port instead of the manifest's.
    pub port: Option<u16>,
    /// An etcd to register in (needed to launch real engines).
    pub etcd: bool,
}

/// Why a manifest cannot run here.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    /// What the operator would also refuse.
    #[error("InferaDeployment {name}: {source}")]
    Invalid {
        /// Deployment.
        name: String,
        /// Why.
        source: ValidateError,
    },
    /// A real engine that is not installed.
    #[error(
        "InferaDeployment {name} runs engine {engine}, which is not installed on this machine ({probe}); run `infera up --sim` to simulate it"
    )]
    NotInstalled {
        /// Deployment.
        name: String,
        /// Engine.
        engine: &'static str,
        /// What was looked for.
        probe: &'static str,
    },
    /// A real engine without etcd.
    #[error(
        "InferaDeployment {name} runs engine {engine}: launched engines register through the sidecar, which needs etcd; pass --etcd URL (or --sim to simulate it)"
    )]
    NeedsEtcd {
        /// Deployment.
        name: String,
        /// Engine.
        engine: &'static str,
    },
    /// A real engine whose weights are not on this machine.
    #[error(
        "InferaDeployment {name}: engine {engine} needs weights on this machine; a pvc source exists only in a cluster (use hostPath or huggingFace, or --sim)"
    )]
    NoLocalWeights {
        /// Deployment.
        name: String,
        /// Engine.
        engine: &'static str,
    },
    /// A prefill/decode deployment of a real engine.
    #[error(
        "InferaDeployment {name}: launching prefill/decode workers of a real engine is not supported by infera up (role flags, connector ports and GPU split per worker are a cluster's job); run it with --sim here, or apply it to a cluster"
    )]
    DisaggregatedEngine {
        /// Deployment.
        name: String,
    },
    /// Nothing to run.
    #[error("no InferaDeployment to run")]
    NoDeployment,
    /// Two deployments serve the same model name.
    #[error(
        "InferaDeployments {0} and {1} both serve model {2:?}; one gateway routes by model name"
    )]
    DuplicateModel(String, String, String),
}

/// How to tell whether an engine is installed: the command looked for.
pub fn install_probe(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Vllm => "`vllm` on PATH",
        EngineKind::Sglang => "python3 module `sglang`",
        EngineKind::Atom => "python3 module `atom`",
    }
}

fn name_of(d: &InferaDeployment) -> String {
    d.metadata
        .name
        .clone()
        .unwrap_or_else(|| "<no name>".into())
}

/// Where `plan`'s weights are on this machine: a host folder, or the Hugging Face id a
/// launched engine downloads itself; a PVC exists only in a cluster.
fn local_model_path(plan: &DeploymentPlan) -> Option<String> {
    match (&plan.model.volume, &plan.model.hugging_face) {
        (_, Some(hf)) => Some(hf.id.clone()),
        (ModelVolume::Host { path }, None) => Some(path.clone()),
        (ModelVolume::Claim { .. }, None) => None,
    }
}

/// Plans `manifests`; `installed` says whether a real engine can be launched here.
pub fn plan(
    manifests: &Manifests,
    opts: &PlanOptions,
    installed: &dyn Fn(EngineKind) -> bool,
) -> Result<LocalPlan, PlanError> {
    let mut deployments: Vec<LocalDeployment> = Vec::new();
    for d in &manifests.deployments {
        let name = name_of(d);
        let topology = d.spec.serving.topology_ref.as_deref().and_then(|r| {
            manifests
                .topologies
                .iter()
                .find(|t| t.metadata.name.as_deref() == Some(r))
        });
        let plan =
            plan_deployment(&name, &d.spec, topology).map_err(|source| PlanError::Invalid {
                name: name.clone(),
                source,
            })?;
        let workers: Vec<Role> = plan
            .roles
            .iter()
            .flat_map(|r| std::iter::repeat_n(r.role, r.workers as usize))
            .collect();
        let engine = plan.launch.engine();
        let launch = if plan.launch.is_sim() || opts.sim {
            Launch::Simulated
        } else if !installed(engine) {
            return Err(PlanError::NotInstalled {
                name,
                engine: engine.as_str(),
                probe: install_probe(engine),
            });
        } else if plan.protocol().is_some() {
            return Err(PlanError::DisaggregatedEngine { name });
        } else if !opts.etcd {
            return Err(PlanError::NeedsEtcd {
                name,
                engine: engine.as_str(),
            });
        } else {
            Launch::Engine
        };
        let model_path = match local_model_path(&plan) {
            Some(path) => path,
            None if launch == Launch::Engine => {
                return Err(PlanError::NoLocalWeights {
                    name,
                    engine: engine.as_str(),
                });
            }
            None => String::new(),
        };
        if let Some(other) = deployments
            .iter()
            .find(|o| o.model() == plan.model.served_name)
        {
            return Err(PlanError::DuplicateModel(
                other.name().to_owned(),
                name,
                plan.model.served_name.clone(),
            ));
        }
        deployments.push(LocalDeployment {
            plan,
            workers,
            launch,
            model_path,
        });
    }
    // Parsing refuses a file without a deployment.
    let first = deployments.first().ok_or(PlanError::NoDeployment)?;
    let g = &first.plan.gateway;
    let port = opts
        .port
        .unwrap_or_else(|| u16::try_from(g.service.port).unwrap_or(8000));
    Ok(LocalPlan {
        gateway: GatewayPlan {
            routing: g.routing.clone(),
            model_path: first.model_path.clone(),
            port,
        },
        deployments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::up::manifest::parse_manifests;
    use infera_operator::api::RoutingPolicy;

    fn manifests(text: &str) -> Manifests {
        parse_manifests(text, "test.yaml").unwrap()
    }

    const VLLM: &str = "apiVersion: infera.amd.com/v1alpha1\nkind: InferaDeployment\nmetadata: {name: real}\nspec:\n  model: {name: m, source: {hostPath: {path: /models/m}}}\n  engine: {kind: vllm, image: x, parallelism: {tensorParallelSize: 2}}\n";

    #[test]
    fn the_local_examples_plan_as_documented() {
        let p = plan(
            &manifests(include_str!("../../../examples/local/deployment.yaml")),
            &PlanOptions::default(),
            &|_| false,
        )
        .unwrap();
        let d = &p.deployments[0];
        assert_eq!(
            (d.workers.clone(), d.launch),
            (vec![Role::Mixed; 2], Launch::Simulated)
        );
        assert_eq!(p.gateway.routing.policy, RoutingPolicy::KvAware);
        assert_eq!(p.gateway.routing.weights[0], 4.0);
        assert_eq!(p.gateway.port, 8000);
        let p = plan(
            &manifests(include_str!("../../../examples/local-1p1d/deployment.yaml")),
            &PlanOptions {
                port: Some(9000),
                ..PlanOptions::default()
            },
            &|_| false,
        )
        .unwrap();
        let d = &p.deployments[0];
        assert_eq!(d.workers, vec![Role::Prefill, Role::Decode]);
        assert_eq!(d.protocol(), Some(PdProtocol::VllmMooncake));
        assert_eq!(p.gateway.port, 9000);
    }

    #[test]
    fn real_engines_need_an_install_and_etcd_or_sim() {
        let m = manifests(VLLM);
        let err = plan(&m, &PlanOptions::default(), &|_| false).unwrap_err();
        assert!(
            err.to_string()
                .contains("not installed on this machine (`vllm` on PATH); run `infera up --sim`"),
            "{err}"
        );
        let err = plan(&m, &PlanOptions::default(), &|_| true).unwrap_err();
        assert!(matches!(err, PlanError::NeedsEtcd { .. }));
        let opts = PlanOptions {
            etcd: true,
            ..PlanOptions::default()
        };
        let p = plan(&m, &opts, &|_| true).unwrap();
        assert_eq!(p.deployments[0].launch, Launch::Engine);
        assert_eq!(p.deployments[0].model_path, "/models/m");
        assert_eq!(p.deployments[0].tensor_parallel_size(), 2);
        let sim = PlanOptions {
            sim: true,
            ..PlanOptions::default()
        };
        let p = plan(&m, &sim, &|_| false).unwrap();
        assert_eq!(
            (p.deployments[0].launch, p.deployments[0].engine()),
            (Launch::Simulated, EngineKind::Vllm)
        );
    }

    #[test]
    fn a_missing_topology_is_named() {
        let text = include_str!("../../../examples/local-1p1d/deployment.yaml");
        let only_deployment = text.split("---").nth(1).unwrap();
        let err = plan(
            &manifests(only_deployment),
            &PlanOptions::default(),
            &|_| false,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "InferaDeployment local-pd: PDTopology \"local-1p1d\" (spec.serving.topologyRef) does not exist in this namespace"
        );
    }
}
