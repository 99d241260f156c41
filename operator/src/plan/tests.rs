use super::*;
use crate::api::{InferaDeployment, PDTopology};
use crate::plan::validate::ValidateError;
use serde_json::{Value, json};

fn mk_deployment(spec: Value) -> InferaDeployment {
    serde_json::from_value(json!({
        "apiVersion": "infera.amd.com/v1alpha1",
        "kind": "InferaDeployment",
        "metadata": {"name": "d", "namespace": "ns", "uid": "uid-d"},
        "spec": spec,
    }))
    .unwrap()
}

fn mk_topology(spec: Value) -> PDTopology {
    serde_json::from_value(json!({
        "apiVersion": "infera.amd.com/v1alpha1",
        "kind": "PDTopology",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": spec,
    }))
    .unwrap()
}

fn model() -> Value {
    json!({"name": "m", "source": {"pvc": {"claimName": "weights", "subPath": "/m/"}}})
}

fn platform() -> Platform {
    Platform {
        etcd_endpoints: vec!["https://etcd.infera-system:2379".into()],
        nats_url: Some("nats://nats.infera-system:4222".into()),
        etcd_client_secret: Some(("infera-system".into(), "etcd-client".into())),
        ..Platform::with_images(Images::from_registry("r", "t"))
    }
}

fn observed<'a>(topology: Option<&'a PDTopology>, tls: Option<&'a EtcdClientTls>) -> Observed<'a> {
    Observed {
        topology,
        model_ready: true,
        etcd_client_tls: tls,
        ..Default::default()
    }
}

#[test]
fn a_2p1d_topology_plans_each_role_from_its_own_section() {
    let dep = mk_deployment(json!({
        "replicas": 2,
        "model": model(),
        "engine": {
            "kind": "vllm", "image": "vllm:x",
            "parallelism": {"expertParallel": true},
            "resources": {"limits": {"memory": "64Gi"}},
        },
        "serving": {"mode": "disaggregated", "topologyRef": "t"},
    }));
    let topo = mk_topology(json!({
        "layout": "2P1D",
        "prefill": {"parallelism": {"tensorParallelSize": 4}, "args": ["--p"]},
        "decode": {"parallelism": {"tensorParallelSize": 8},
                   "resources": {"limits": {"memory": "1Ti"}}},
        "transport": {"backend": "mooncake", "bootstrapPort": 8998},
    }));
    let plan = plan_deployment("d", &dep.spec, Some(&topo)).unwrap();
    let roles: Vec<_> = plan
        .roles
        .iter()
        .map(|r| {
            (
                r.role,
                r.workers,
                r.unit,
                r.gpus,
                r.parallelism.expert_parallel,
                r.args.clone(),
                r.resources.as_ref().and_then(|r| r.limits.clone()).unwrap()["memory"]
                    .0
                    .clone(),
            )
        })
        .collect();
    assert_eq!(
        roles,
        vec![
            (
                Role::Prefill,
                4,
                2,
                4,
                true,
                vec!["--p".to_owned()],
                "64Gi".to_owned()
            ),
            (Role::Decode, 2, 1, 8, true, vec![], "1Ti".to_owned()),
        ]
    );
    assert_eq!(plan.protocol(), Some(PdProtocol::VllmMooncake));
    assert_eq!(
        plan.model.volume,
        ModelVolume::Claim {
            claim: "weights".into(),
            sub_path: "/m/".into()
        }
    );
}

#[test]
fn simulated_workers_ask_for_no_gpus_and_the_gateway_no_tokenizer() {
    let dep = mk_deployment(json!({
        "model": model(),
        "engine": {"kind": "sim", "simFlavor": "sglang",
                   "parallelism": {"tensorParallelSize": 8}},
    }));
    let plan = plan_deployment("d", &dep.spec, None).unwrap();
    assert_eq!(
        plan.launch,
        Launch::Sim(infera_proto::worker::EngineKind::Sglang)
    );
    assert_eq!(plan.roles[0].gpus, 0);
    assert_eq!(plan.gateway.routing.tokenizer, None);
    let real = mk_deployment(json!({
        "model": model(),
        "engine": {"kind": "sglang", "image": "s:x"},
    }));
    let plan = plan_deployment("d", &real.spec, None).unwrap();
    // A real engine's model folder holds its tokenizer.
    assert_eq!(
        plan.gateway.routing.tokenizer,
        Some(Tokenizer::InModel(String::new()))
    );
}

#[test]
fn the_platform_fills_in_etcd_and_nats_only_where_the_deployment_names_none() {
    let tls = EtcdClientTls::new();
    let cluster = mk_deployment(json!({
        "model": model(), "engine": {"kind": "sim"},
        "discovery": {"backend": "etcd"},
        "messaging": {"backend": "nats"},
    }));
    let plan = validate(&cluster, observed(None, Some(&tls)), &platform()).unwrap();
    let Discovery::Etcd(etcd) = &plan.discovery else {
        panic!("{:?}", plan.discovery)
    };
    assert_eq!(etcd.endpoints, platform().etcd_endpoints);
    assert_eq!(etcd.tls_secret_name.as_deref(), Some("d-etcd-client"));
    assert_eq!(plan.nats_url, platform().nats_url);
    assert_eq!(plan.etcd_client_copy, Some(tls.clone()));
    assert_eq!(plan.owner.reference.block_owner_deletion, Some(true));

    let own = mk_deployment(json!({
        "model": model(), "engine": {"kind": "sim"},
        "discovery": {"backend": "etcd", "etcd": {"endpoints": ["http://mine:2379"]}},
        "messaging": {"backend": "nats", "natsUrl": "nats://mine:4222"},
    }));
    let plan = validate(&own, observed(None, None), &platform()).unwrap();
    let Discovery::Etcd(etcd) = &plan.discovery else {
        panic!("{:?}", plan.discovery)
    };
    assert_eq!(etcd.endpoints, vec!["http://mine:2379".to_owned()]);
    assert_eq!(plan.nats_url.as_deref(), Some("nats://mine:4222"));
    assert_eq!(plan.etcd_client_copy, None);

    let bare = Platform::with_images(Images::from_registry("r", "t"));
    assert_eq!(
        validate(&cluster, observed(None, None), &bare).unwrap_err(),
        ValidateError::NoEtcd
    );
    assert_eq!(
        validate(&cluster, observed(None, None), &platform())
            .unwrap_err()
            .reason(),
        "EtcdClientCertificateMissing"
    );
}

#[test]
fn kv_sizes_become_bytes_and_nvme_stays_below_the_allowed_directories() {
    let kv = |path: &str, size: &str| {
        mk_deployment(json!({
            "model": model(), "engine": {"kind": "sim"},
            "kvCache": {"enabled": true, "ram": "1Gi", "nvme": {"path": path, "size": size}},
        }))
    };
    let plan = validate(&kv("/mnt/kv", "2G"), observed(None, None), &platform()).unwrap();
    let kvd = plan.deployment.kvd.unwrap();
    assert_eq!(kvd.ram_bytes, 1 << 30);
    assert_eq!(
        kvd.nvme,
        Some(NvmePlan {
            path: "/mnt/kv".into(),
            bytes: 2_000_000_000
        })
    );
    for (path, size, reason) in [
        ("/etc/kv", "2G", "NvmePathNotAllowed"),
        ("/mnt", "2G", "NvmePathNotAllowed"),
        ("/mnt/../etc", "2G", "NvmePathNotAllowed"),
        ("/mnt/kv", "0", "InvalidQuantity"),
    ] {
        let err = validate(&kv(path, size), observed(None, None), &platform()).unwrap_err();
        assert_eq!(err.reason(), reason, "{path} {size}: {err}");
    }
}

#[test]
fn each_role_rolls_with_its_own_limits_else_the_deployments_and_never_with_none() {
    let topology = mk_topology(json!({"layout": "1P1D", "transport": {"backend": "mooncake"}}));
    let spec = |rollout: Value| {
        mk_deployment(json!({
            "model": model(),
            "engine": {"kind": "sim", "simFlavor": "vllm"},
            "serving": {"mode": "disaggregated", "topologyRef": "t"},
            "rollout": rollout,
        }))
    };
    let limits = |plan: &Plan| -> Vec<(u32, u32)> {
        plan.deployment
            .roles
            .iter()
            .map(|r| (r.rollout.max_surge, r.rollout.max_unavailable))
            .collect()
    };
    let defaults = validate(
        &spec(json!({})),
        observed(Some(&topology), None),
        &platform(),
    )
    .unwrap();
    assert_eq!(
        limits(&defaults),
        [(1, 0), (1, 0)],
        "surge one, never fewer"
    );
    let own = validate(
        &spec(json!({"maxSurge": 2, "decode": {"maxSurge": 0, "maxUnavailable": 1}})),
        observed(Some(&topology), None),
        &platform(),
    )
    .unwrap();
    assert_eq!(limits(&own), [(2, 0), (0, 1)]);
    let err = validate(
        &spec(json!({"decode": {"maxSurge": 0}})),
        observed(Some(&topology), None),
        &platform(),
    )
    .unwrap_err();
    assert_eq!(err, ValidateError::RolloutCannotProceed("decode"));
    assert_eq!(
        err.to_string(),
        "spec.rollout.decode: maxSurge and maxUnavailable are both 0 for the decode role, so none of its workers could ever be replaced; allow a surge or an unavailable worker"
    );
}
