//! What the API server cannot check: defaults that depend on other fields, and rules
//! across objects (a deployment's engine against its topology's transport). Pure; the
//! operator reports these as a `Degraded` condition, `infera up` as an error.

use super::common::{EngineKind, Parallelism, SimFlavor};
use super::deployment::{InferaDeploymentSpec, ServingMode};
use super::topology::{Layout, PDTopologySpec, TransportBackend, TransportSpec};
pub use infera_engine_prep::Launch;
use infera_proto::pd::PdProtocol;
use infera_proto::worker::EngineKind as Engine;

/// What a deployment's workers run: the engine its manifest names, or for `sim` the
/// simulator imitating `simFlavor` (vLLM by default). The one place the manifest's
/// engine names become the engine type every part shares.
pub fn launch(kind: EngineKind, sim_flavor: Option<SimFlavor>) -> Launch {
    let imitated = |flavor: SimFlavor| match flavor {
        SimFlavor::Vllm => Engine::Vllm,
        SimFlavor::Sglang => Engine::Sglang,
        SimFlavor::Atom => Engine::Atom,
    };
    match kind {
        EngineKind::Vllm => Launch::Engine(Engine::Vllm),
        EngineKind::Sglang => Launch::Engine(Engine::Sglang),
        EngineKind::Atom => Launch::Engine(Engine::Atom),
        EngineKind::Sim => Launch::Sim(imitated(sim_flavor.unwrap_or_default())),
    }
}

/// The prefill/decode protocol an engine speaks over a transport (the mapping table of
/// PROTOCOLS.md), or why the pair cannot work.
pub fn pd_protocol(engine: Engine, transport: &TransportSpec) -> Result<PdProtocol, String> {
    match (engine, transport.backend) {
        (_, TransportBackend::Nixl) => Err(
            "transport nixl is not supported: the router speaks the mooncake and mori connectors only"
                .into(),
        ),
        (Engine::Sglang, _) => Ok(PdProtocol::SglangBootstrap),
        (Engine::Vllm, TransportBackend::Mooncake) => Ok(PdProtocol::VllmMooncake),
        (Engine::Vllm, TransportBackend::Mori) if transport.read_mode => {
            Ok(PdProtocol::VllmMoriRead)
        }
        (Engine::Vllm, TransportBackend::Mori) => Ok(PdProtocol::VllmMoriWrite),
        (Engine::Atom, TransportBackend::Mooncake) => Ok(PdProtocol::AtomMooncake),
        (Engine::Atom, TransportBackend::Mori) => Err(
            "engine atom supports the mooncake transport only for prefill/decode; set the topology's transport.backend to mooncake"
                .into(),
        ),
    }
}

/// Prefill and decode workers in one unit of a topology.
pub fn unit_size(topology: &PDTopologySpec) -> (u32, u32) {
    match topology.layout {
        Layout::OneOne => (1, 1),
        Layout::TwoOne => (2, 1),
        Layout::OneTwo => (1, 2),
        Layout::Custom => (
            topology.prefill.replicas.unwrap_or(1),
            topology.decode.replicas.unwrap_or(1),
        ),
    }
}

/// GPUs one worker asks for per node: `gpusPerWorker`, else tensor × data parallel
/// size spread over the worker's nodes.
pub fn gpus_per_worker(p: &Parallelism) -> u32 {
    p.gpus_per_worker.unwrap_or_else(|| {
        (p.tensor_parallel_size * p.data_parallel_size).div_ceil(p.nodes_per_worker.max(1))
    })
}

/// Workers to run, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// Mixed workers.
    Mixed(u32),
    /// Prefill and decode workers, and the protocol between them.
    Disaggregated {
        /// Prefill workers.
        prefill: u32,
        /// Decode workers.
        decode: u32,
        /// Connector protocol.
        protocol: PdProtocol,
    },
}

/// What a deployment needs that the API server could not check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The deployment names a topology that does not exist.
    #[error("PDTopology {0:?} (spec.serving.topologyRef) does not exist in this namespace")]
    MissingTopology(String),
    /// The engine and the topology's transport do not work together.
    #[error("engine {engine} with PDTopology {topology:?}: {reason}")]
    Unsupported {
        /// Engine.
        engine: &'static str,
        /// Topology name.
        topology: String,
        /// Why.
        reason: String,
    },
    /// A worker cannot hold the parallelism it asks for.
    #[error("{role}: {reason}")]
    Parallelism {
        /// `engine` or `prefill`/`decode`.
        role: &'static str,
        /// Why.
        reason: String,
    },
}

fn check_parallelism(role: &'static str, p: &Parallelism) -> Result<(), ResolveError> {
    let ranks = p.tensor_parallel_size * p.data_parallel_size;
    let gpus = gpus_per_worker(p) * p.nodes_per_worker;
    if gpus < ranks {
        return Err(ResolveError::Parallelism {
            role,
            reason: format!(
                "tensor × data parallel size is {ranks} but the worker gets {gpus} GPUs ({} per node × {} nodes); raise gpusPerWorker or lower the parallel sizes",
                gpus_per_worker(p),
                p.nodes_per_worker
            ),
        });
    }
    Ok(())
}

/// The workers a deployment runs, given its topology (looked up by the caller).
pub fn resolve_workers(
    spec: &InferaDeploymentSpec,
    topology: Option<(&str, &PDTopologySpec)>,
) -> Result<Workers, ResolveError> {
    let replicas = u32::try_from(spec.replicas).unwrap_or(0);
    match spec.serving.mode {
        ServingMode::Mixed => {
            check_parallelism("spec.engine.parallelism", &spec.engine.parallelism)?;
            Ok(Workers::Mixed(replicas))
        }
        ServingMode::Disaggregated => {
            let name = spec.serving.topology_ref.clone().unwrap_or_default();
            let Some((_, topo)) = topology else {
                return Err(ResolveError::MissingTopology(name));
            };
            let engine = launch(spec.engine.kind, spec.engine.sim_flavor).engine();
            let protocol = pd_protocol(engine, &topo.transport).map_err(|reason| {
                ResolveError::Unsupported {
                    engine: spec.engine.kind.as_str(),
                    topology: name,
                    reason,
                }
            })?;
            check_parallelism("prefill.parallelism", &topo.prefill.parallelism)?;
            check_parallelism("decode.parallelism", &topo.decode.parallelism)?;
            let (p, d) = unit_size(topo);
            let (prefill, decode) = match spec.serving.role_replicas {
                Some(r) if spec.autoscaling.is_some() => (r.prefill, r.decode),
                _ => (p * replicas, d * replicas),
            };
            Ok(Workers::Disaggregated {
                prefill,
                decode,
                protocol,
            })
        }
    }
}

#[cfg(test)]
mod tests;
