//! What `infera up` runs for a set of manifests (pure): the workers of each deployment
//! with their roles, whether each is simulated in-process or launched as an engine,
//! and the gateway's settings.

use super::manifest::Manifests;
use infera_operator::api::resolve::{self, ResolveError, Workers, resolve_workers};
use infera_operator::api::{EngineKind, InferaDeployment};
use infera_operator::render::gateway_flags::GatewayRouting;
use infera_proto::pd::PdProtocol;

/// A worker's role (the operator's: mixed, prefill, decode).
pub use infera_operator::render::names::Role;

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
    /// Resource name.
    pub name: String,
    /// Served model name.
    pub model: String,
    /// The engine named in the manifest.
    pub engine: EngineKind,
    /// The engine whose behaviour and connectors are used (the one `sim` imitates).
    pub flavor: infera_proto::worker::EngineKind,
    /// Workers, in start order (prefill before decode).
    pub roles: Vec<Role>,
    /// Connector between prefill and decode.
    pub protocol: Option<PdProtocol>,
    /// Simulated or launched.
    pub launch: Launch,
    /// The manifest's engine arguments.
    pub args: Vec<String>,
    /// Where a launched engine reads its weights.
    pub model_path: String,
    /// Tensor-parallel size of a launched engine.
    pub tensor_parallel_size: u32,
}

/// The gateway: routed as the operator's gateway of the first deployment would be (the
/// same flags builder), on `port`.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayPlan {
    /// Policy, weights, tokenizer, default retention, NATS.
    pub routing: GatewayRouting,
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
    /// What the API server or operator would also refuse.
    #[error("InferaDeployment {name}: {source}")]
    Resolve {
        /// Deployment.
        name: String,
        /// Why.
        source: ResolveError,
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
        EngineKind::Sim => "built in",
    }
}

fn name_of(d: &InferaDeployment) -> String {
    d.metadata
        .name
        .clone()
        .unwrap_or_else(|| "<no name>".into())
}

/// Plans `manifests`; `installed` says whether a real engine can be launched here.
pub fn plan(
    manifests: &Manifests,
    opts: &PlanOptions,
    installed: &dyn Fn(EngineKind) -> bool,
) -> Result<LocalPlan, PlanError> {
    let mut deployments = Vec::new();
    for d in &manifests.deployments {
        let name = name_of(d);
        let spec = &d.spec;
        let topology = spec.serving.topology_ref.as_deref().and_then(|r| {
            manifests
                .topologies
                .iter()
                .find(|t| t.metadata.name.as_deref() == Some(r))
                .map(|t| (r, &t.spec))
        });
        let workers = resolve_workers(spec, topology).map_err(|source| PlanError::Resolve {
            name: name.clone(),
            source,
        })?;
        let (roles, protocol) = match workers {
            Workers::Mixed(n) => (vec![Role::Mixed; n as usize], None),
            Workers::Disaggregated {
                prefill,
                decode,
                protocol,
            } => {
                let mut roles = vec![Role::Prefill; prefill as usize];
                roles.extend(vec![Role::Decode; decode as usize]);
                (roles, Some(protocol))
            }
        };
        let engine = spec.engine.kind;
        let launch = if engine == EngineKind::Sim || opts.sim {
            Launch::Simulated
        } else if !installed(engine) {
            return Err(PlanError::NotInstalled {
                name,
                engine: engine.as_str(),
                probe: install_probe(engine),
            });
        } else if protocol.is_some() {
            return Err(PlanError::DisaggregatedEngine { name });
        } else if !opts.etcd {
            return Err(PlanError::NeedsEtcd {
                name,
                engine: engine.as_str(),
            });
        } else {
            Launch::Engine
        };
        let source = &spec.model.source;
        let model_path = match (&source.host_path, &source.hugging_face) {
            (Some(h), _) => h.path.clone(),
            (None, Some(hf)) => hf.id.clone(),
            (None, None) if launch == Launch::Engine => {
                return Err(PlanError::NoLocalWeights {
                    name,
                    engine: engine.as_str(),
                });
            }
            (None, None) => String::new(),
        };
        if let Some(other) = deployments
            .iter()
            .find(|o: &&LocalDeployment| o.model == spec.model.name)
        {
            return Err(PlanError::DuplicateModel(
                other.name.clone(),
                name,
                spec.model.name.clone(),
            ));
        }
        deployments.push(LocalDeployment {
            name,
            model: spec.model.name.clone(),
            engine,
            flavor: resolve::launch(engine, spec.engine.sim_flavor).engine(),
            roles,
            protocol,
            launch,
            args: spec.engine.args.clone(),
            model_path,
            tensor_parallel_size: spec.engine.parallelism.tensor_parallel_size,
        });
    }
    let first = &manifests.deployments[0].spec;
    let port = opts
        .port
        .unwrap_or_else(|| u16::try_from(first.gateway.service.port).unwrap_or(8000));
    let model_path = deployments
        .first()
        .map(|d| d.model_path.as_str())
        .unwrap_or_default();
    Ok(LocalPlan {
        gateway: GatewayPlan {
            routing: GatewayRouting::from_spec(first, model_path),
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
            (d.roles.clone(), d.launch),
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
        assert_eq!(d.roles, vec![Role::Prefill, Role::Decode]);
        assert_eq!(d.protocol, Some(PdProtocol::VllmMooncake));
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
        assert_eq!(p.deployments[0].tensor_parallel_size, 2);
        let sim = PlanOptions {
            sim: true,
            ..PlanOptions::default()
        };
        let p = plan(&m, &sim, &|_| false).unwrap();
        assert_eq!(
            (p.deployments[0].launch, p.deployments[0].flavor),
            (Launch::Simulated, infera_proto::worker::EngineKind::Vllm)
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
