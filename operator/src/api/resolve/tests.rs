use super::*;
use crate::api::{
    DiscoveryBackend, InferaDeployment, KvCacheDtype, PDTopology, RoutingPolicy, ServiceType,
};

fn deployment(yaml: &str) -> InferaDeployment {
    serde_saphyr::from_str(yaml).unwrap()
}

fn topology(yaml: &str) -> PDTopology {
    serde_saphyr::from_str(yaml).unwrap()
}

const MINIMAL: &str = r#"
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: m}
spec:
  model:
    name: llama
    source: {hostPath: {path: /models/llama}}
  engine: {kind: sim}
"#;

#[test]
fn a_minimal_manifest_gets_the_documented_defaults() {
    let d = deployment(MINIMAL).spec;
    assert_eq!(d.replicas, 1);
    assert_eq!(d.serving.mode, ServingMode::Mixed);
    assert_eq!(d.model.startup_budget_seconds, 1800);
    assert_eq!(d.engine.kv_cache_dtype, KvCacheDtype::Fp8);
    assert_eq!(d.engine.shared_memory_size.0, "64Gi");
    assert_eq!(d.engine.parallelism.tensor_parallel_size, 1);
    assert!(!d.network.rdma.enabled);
    assert_eq!(d.network.rdma.resource_name, "rdma/hca");
    assert_eq!(d.gateway.replicas, 1);
    assert_eq!(d.gateway.policy, RoutingPolicy::KvAware);
    assert_eq!(d.gateway.kv_overlap_weight, 4.0);
    assert_eq!(d.gateway.kv_prefill_overlap_weight, 20.0);
    assert_eq!(d.gateway.service.type_, ServiceType::ClusterIP);
    assert_eq!(d.gateway.service.port, 8000);
    assert_eq!(d.discovery.backend, DiscoveryBackend::Kubernetes);
    assert!(!d.kv_cache.enabled);
    assert_eq!(
        launch(d.engine.kind, d.engine.sim_flavor),
        Launch::Sim(Engine::Vllm)
    );
    assert_eq!(resolve_workers(&d, None), Ok(Workers::Mixed(1)));
}

#[test]
fn gpus_default_to_the_ranks_spread_over_nodes() {
    let mut p = Parallelism {
        tensor_parallel_size: 8,
        ..Parallelism::default()
    };
    assert_eq!(gpus_per_worker(&p), 8);
    p.nodes_per_worker = 2;
    p.tensor_parallel_size = 16;
    assert_eq!(gpus_per_worker(&p), 8);
    p.gpus_per_worker = Some(4);
    let err = check_parallelism("spec.engine.parallelism", &p).unwrap_err();
    assert!(
        err.to_string()
            .contains("tensor × data parallel size is 16 but the worker gets 8 GPUs"),
        "{err}"
    );
}

#[test]
fn every_engine_transport_pair_maps_to_its_protocol_or_a_reason() {
    let t = |backend, read_mode| TransportSpec {
        backend,
        read_mode,
        ..TransportSpec::default()
    };
    use TransportBackend::*;
    let cases = [
        (
            Engine::Sglang,
            t(Mooncake, false),
            Ok(PdProtocol::SglangBootstrap),
        ),
        (
            Engine::Sglang,
            t(Mori, false),
            Ok(PdProtocol::SglangBootstrap),
        ),
        (
            Engine::Vllm,
            t(Mooncake, false),
            Ok(PdProtocol::VllmMooncake),
        ),
        (Engine::Vllm, t(Mori, false), Ok(PdProtocol::VllmMoriWrite)),
        (Engine::Vllm, t(Mori, true), Ok(PdProtocol::VllmMoriRead)),
        (
            Engine::Atom,
            t(Mooncake, false),
            Ok(PdProtocol::AtomMooncake),
        ),
    ];
    for (engine, transport, want) in cases {
        assert_eq!(
            pd_protocol(engine, &transport),
            want,
            "{engine:?} {transport:?}"
        );
    }
    assert!(
        pd_protocol(Engine::Atom, &t(Mori, false))
            .unwrap_err()
            .contains("mooncake transport only")
    );
    assert!(
        pd_protocol(Engine::Vllm, &t(Nixl, false))
            .unwrap_err()
            .contains("nixl is not supported")
    );
}

#[test]
fn disaggregated_deployments_scale_in_topology_units() {
    let mut d = deployment(MINIMAL).spec;
    d.serving.mode = ServingMode::Disaggregated;
    d.serving.topology_ref = Some("shape".into());
    d.replicas = 2;
    assert_eq!(
        resolve_workers(&d, None),
        Err(ResolveError::MissingTopology("shape".into()))
    );
    let one_two = topology(
        "apiVersion: infera.amd.com/v1alpha1\nkind: PDTopology\nmetadata: {name: shape}\nspec: {layout: 1P2D}\n",
    )
    .spec;
    assert_eq!(
        resolve_workers(&d, Some(("shape", &one_two))),
        Ok(Workers::Disaggregated {
            prefill: 2,
            decode: 4,
            protocol: PdProtocol::VllmMooncake
        })
    );
    let custom = topology(
        "apiVersion: infera.amd.com/v1alpha1\nkind: PDTopology\nmetadata: {name: shape}\nspec: {layout: custom, prefill: {replicas: 3}, decode: {replicas: 2}, transport: {backend: mori, readMode: true}}\n",
    )
    .spec;
    assert_eq!(
        resolve_workers(&d, Some(("shape", &custom))),
        Ok(Workers::Disaggregated {
            prefill: 6,
            decode: 4,
            protocol: PdProtocol::VllmMoriRead
        })
    );
    d.engine.sim_flavor = Some(SimFlavor::Atom);
    let err = resolve_workers(&d, Some(("shape", &custom))).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("engine sim with PDTopology \"shape\""),
        "{err}"
    );
}
