//! The engine's command line and environment for one role (pure). Flags that make the
//! worker routable (port, served name, parallelism, KV-cache dtype, the prefill/decode
//! connector) are rendered here; KV events and the rest of what routing needs come from
//! the engine preparation the sidecar launches with (`infera_engine_prep::prepare`), so
//! flags are decided in one place. The user's `args` follow verbatim and win.

use crate::api::{
    KvCacheDtype, Parallelism, Quantization, RdmaSpec, RoutingPolicy, TransportBackend,
};
use crate::names::Role;
use crate::plan::{PdLeg, Plan, RolePlan};
use infera_engine_prep::Launch;
use infera_engine_prep::prepare::{
    PrepareInput, fp8_kv_cache_dtype, http_port_flag, launcher, model_flags, prepare_engine,
};
use infera_proto::pd::PdProtocol;
use infera_proto::worker::EngineKind;
use serde_json::{Value, json};

/// HTTP port of every engine container.
pub const ENGINE_PORT: u16 = 8000;
/// Port of the engine's KV-event publisher (data-parallel rank r on +r).
pub const KV_EVENTS_PORT: u16 = 5557;
/// Default SGLang / vLLM Mooncake bootstrap port.
pub const BOOTSTRAP_PORT: u16 = 8998;
/// Rendezvous port of a multi-node worker's leader.
pub const DIST_INIT_PORT: u16 = 20000;
/// Where the model volume is mounted in engine and gateway pods.
pub const MODEL_MOUNT: &str = "/model-store";
/// Program of `kind: sim` engines in the simulator image.
pub const SIM_PROGRAM: &str = "infera-sim";

/// One role's engine, as the pod runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineCommand {
    /// Program and arguments (the container's `command`).
    pub command: Vec<String>,
    /// The arguments after the program: what the sidecar reads its facts from.
    pub engine_args: Vec<String>,
    /// Environment the operator adds (before the user's `env`).
    pub env: Vec<(String, String)>,
    /// A link to make before the engine starts, its name relative to the working
    /// directory: ATOM serves its model under the name it loads, so it loads the served
    /// name, linked to the model folder.
    pub model_link: Option<(String, String)>,
}

fn push(args: &mut Vec<String>, flag: &str, value: impl Into<String>) {
    args.push(flag.to_owned());
    args.push(value.into());
}

/// The KV-cache dtype flag and value (ATOM: `--kv_cache_dtype` bf16 or fp8, its
/// default bf16 standing for auto).
fn kv_cache_dtype(engine: EngineKind, dtype: KvCacheDtype) -> Option<(&'static str, &'static str)> {
    if engine == EngineKind::Atom {
        return match dtype {
            KvCacheDtype::Fp8 => Some(("--kv_cache_dtype", "fp8")),
            KvCacheDtype::Bf16 => Some(("--kv_cache_dtype", "bf16")),
            KvCacheDtype::Auto => None,
        };
    }
    let value = match dtype {
        KvCacheDtype::Fp8 => fp8_kv_cache_dtype(engine),
        KvCacheDtype::Auto => "auto",
        KvCacheDtype::Bf16 => "bfloat16",
    };
    Some(("--kv-cache-dtype", value))
}

/// The vLLM / ATOM `--kv-transfer-config` of a prefill or decode worker. Pod identity
/// comes from the downward API (`$(POD_NAME)`, `$(POD_IP)`), which Kubernetes expands in
/// arguments, so the sidecar reads the same values the engine uses.
fn kv_transfer_config(leg: &PdLeg, role: Role, rdma: &RdmaSpec, tp: u32) -> Value {
    let kv_role = match role {
        Role::Prefill => "kv_producer",
        _ => "kv_consumer",
    };
    let t = &leg.transport;
    match leg.protocol {
        PdProtocol::VllmMooncake => json!({
            "kv_connector": "MooncakeConnector",
            "kv_role": kv_role,
            "engine_id": "$(POD_NAME)",
            "kv_ip": "$(POD_IP)",
            "kv_connector_extra_config": {"mooncake_protocol": if rdma.enabled { "rdma" } else { "tcp" }},
        }),
        PdProtocol::VllmMoriWrite | PdProtocol::VllmMoriRead => json!({
            "kv_connector": "MoRIIOConnector",
            "kv_role": kv_role,
            "engine_id": "$(POD_NAME)",
            "kv_ip": "$(POD_IP)",
            "kv_connector_extra_config": {
                "handshake_port": t.handshake_port.unwrap_or(6301),
                "notify_port": t.notify_port.unwrap_or(61005),
                "tp_size": tp,
                "read_mode": leg.protocol == PdProtocol::VllmMoriRead,
            },
        }),
        _ => {
            // ATOM's mooncake connector: where its peer's proxy hand-off reaches it.
            let mut config = json!({
                "kv_connector": "mooncake",
                "kv_role": kv_role,
                "handshake_port": t.handshake_port.unwrap_or(6301),
                "http_port": ENGINE_PORT,
                "proxy_ip": "$(POD_IP)",
            });
            if rdma.enabled && !rdma.interfaces.is_empty() {
                config["ib_device"] = json!(rdma.interfaces.join(","));
            }
            config
        }
    }
}

/// The earlier project's vLLM connector to kvd (it speaks the wire protocol kvd keeps);
/// the engine image must hold the `infera` Python package that provides it.
pub const KVD_CONNECTOR_MODULE: &str = "infera.engine.vllm.kvd_connector";

/// vLLM's connector to kvd, on its own (`kv_both`: it saves and loads).
fn kvd_connector() -> Value {
    json!({
        "kv_connector": "InferaKvdConnector",
        "kv_role": "kv_both",
        "kv_connector_module_path": KVD_CONNECTOR_MODULE,
    })
}

/// A vLLM prefill worker with kvd: kvd and the prefill/decode connector under vLLM's
/// `MultiConnector`, the pair's role at the top (what the sidecar registers). Decode
/// workers keep the plain connector, as the earlier manual documents.
fn with_kvd(mut pd: Value) -> Value {
    // vLLM hands the inner connectors the outer engine id (naming it inside too is an
    // error there).
    let engine_id = pd.as_object_mut().and_then(|m| m.remove("engine_id"));
    let mut top = json!({
        "kv_connector": "MultiConnector",
        "kv_role": pd["kv_role"].clone(),
        "kv_connector_extra_config": {"connectors": [kvd_connector(), pd]},
    });
    if let Some(id) = engine_id {
        top["engine_id"] = id;
    }
    top
}

fn pd_flags(
    args: &mut Vec<String>,
    env: &mut Vec<(String, String)>,
    leg: &PdLeg,
    role: &RolePlan,
    rdma: &RdmaSpec,
    kvd: bool,
) {
    if leg.protocol == PdProtocol::SglangBootstrap {
        push(args, "--disaggregation-mode", role.role.as_str());
        let backend = match leg.transport.backend {
            TransportBackend::Mori => "mori",
            _ => "mooncake",
        };
        push(args, "--disaggregation-transfer-backend", backend);
        let port = leg.transport.bootstrap_port.unwrap_or(BOOTSTRAP_PORT);
        push(args, "--disaggregation-bootstrap-port", port.to_string());
        if rdma.enabled && !rdma.interfaces.is_empty() {
            push(
                args,
                "--disaggregation-ib-device",
                rdma.interfaces.join(","),
            );
        }
        return;
    }
    let tp = role.parallelism.tensor_parallel_size;
    let mut config = kv_transfer_config(leg, role.role, rdma, tp);
    if kvd && role.role == Role::Prefill {
        config = with_kvd(config);
    }
    push(args, "--kv-transfer-config", config.to_string());
    if leg.protocol == PdProtocol::VllmMooncake
        && let Some(port) = leg.transport.bootstrap_port
    {
        env.push(("VLLM_MOONCAKE_BOOTSTRAP_PORT".into(), port.to_string()));
    }
    if leg.protocol == PdProtocol::VllmMoriRead {
        env.push(("VLLM_MORIIO_CONNECTOR_READ_MODE".into(), "1".into()));
    }
}

fn parallel_flags(args: &mut Vec<String>, engine: EngineKind, p: &Parallelism) {
    let (tp, dp) = match engine {
        EngineKind::Sglang => ("--tp-size", "--dp-size"),
        EngineKind::Vllm | EngineKind::Atom => ("--tensor-parallel-size", "--data-parallel-size"),
    };
    push(args, tp, p.tensor_parallel_size.to_string());
    if p.data_parallel_size > 1 {
        push(args, dp, p.data_parallel_size.to_string());
    }
    if p.expert_parallel {
        args.push(match engine {
            EngineKind::Sglang => "--enable-ep-moe".into(),
            _ => "--enable-expert-parallel".into(),
        });
    }
    if p.nodes_per_worker > 1 {
        // LeaderWorkerSet sets LWS_LEADER_ADDRESS and LWS_WORKER_INDEX in every pod.
        match engine {
            EngineKind::Sglang => {
                push(args, "--nnodes", p.nodes_per_worker.to_string());
                push(args, "--node-rank", "$(LWS_WORKER_INDEX)");
                push(
                    args,
                    "--dist-init-addr",
                    format!("$(LWS_LEADER_ADDRESS):{DIST_INIT_PORT}"),
                );
            }
            EngineKind::Vllm | EngineKind::Atom => {
                push(args, "--nnodes", p.nodes_per_worker.to_string());
                push(args, "--node-rank", "$(LWS_WORKER_INDEX)");
                push(args, "--master-addr", "$(LWS_LEADER_ADDRESS)");
                push(args, "--master-port", DIST_INIT_PORT.to_string());
            }
        }
    }
}

fn quantization_flags(args: &mut Vec<String>, engine: EngineKind, q: Quantization) {
    if engine == EngineKind::Atom {
        return;
    }
    match q {
        Quantization::Auto => {}
        Quantization::Fp8 => push(args, "--quantization", "fp8"),
        Quantization::Mxfp4 => push(args, "--quantization", "mxfp4"),
        Quantization::Bf16 => push(args, "--dtype", "bfloat16"),
    }
}

/// The engine command of one role, the model folder at `model_path` in the pod.
pub fn build_engine_command(plan: &Plan, role: &RolePlan, model_path: &str) -> EngineCommand {
    let d = &plan.deployment;
    let runs = d.launch;
    let engine = runs.engine();
    let rdma = &d.network.rdma;
    let mut env = Vec::new();
    let (mut args, model_link) = model_flags(runs, model_path, &d.model.served_name);
    push(&mut args, "--host", "0.0.0.0");
    push(&mut args, http_port_flag(runs), ENGINE_PORT.to_string());
    if runs.is_sim() {
        push(&mut args, "--engine", engine.as_str());
        if let Some(tokenizer) = &d.model.tokenizer {
            push(
                &mut args,
                "--tokenizer",
                format!("{model_path}/{tokenizer}"),
            );
        }
    }
    parallel_flags(&mut args, engine, &role.parallelism);
    quantization_flags(&mut args, engine, d.model.quantization);
    if let Some((flag, dtype)) = kv_cache_dtype(engine, d.engine.kv_cache_dtype) {
        push(&mut args, flag, dtype);
    }
    // kvd reaches a real vLLM through the earlier project's connector.
    let kvd = d.kvd.is_some() && runs == Launch::Engine(EngineKind::Vllm);
    match &role.pd {
        Some(leg) => pd_flags(&mut args, &mut env, leg, role, rdma, kvd),
        None if kvd => push(
            &mut args,
            "--kv-transfer-config",
            kvd_connector().to_string(),
        ),
        None => {}
    }
    if kvd {
        // Block hashes must agree across workers and restarts.
        env.push(("PYTHONHASHSEED".into(), "0".into()));
    }
    args.extend(d.engine.args.iter().cloned());
    args.extend(role.args.iter().cloned());
    let user_env: Vec<&str> = d.engine.env.iter().map(|e| e.name.as_str()).collect();
    // kv-aware routing needs the engine's KV events.
    let kv_events = d.gateway.routing.policy == RoutingPolicy::KvAware;
    let prepared = prepare_engine(&PrepareInput {
        launch: runs,
        args: &args,
        sim_binary: SIM_PROGRAM,
        kv_events_port: kv_events.then_some(KV_EVENTS_PORT),
        gid_index: rdma.gid_index.filter(|_| rdma.enabled),
        env_is_set: &|name| user_env.contains(&name) || env.iter().any(|(n, _)| n == name),
    });
    env.extend(prepared.env);
    if rdma.enabled && !rdma.interfaces.is_empty() {
        let hcas = rdma.interfaces.join(",");
        if !user_env.contains(&"NCCL_IB_HCA") {
            env.push(("NCCL_IB_HCA".into(), hcas));
        }
    }
    // The sidecar reads its facts from the arguments after the launcher's own words.
    let (_, words) = launcher(runs, SIM_PROGRAM);
    let engine_args = prepared
        .args
        .get(words.len()..)
        .unwrap_or_default()
        .to_vec();
    let mut command = vec![prepared.program];
    command.extend(prepared.args);
    EngineCommand {
        command,
        engine_args,
        env,
        model_link,
    }
}
