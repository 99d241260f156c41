//! One earlier worker service (`componentType: worker`) read into what this project
//! spells differently: its role and counts, the engine it launches and that engine's
//! flags, its image, env, resources, GPUs and RDMA, and its pod's leftovers.

use super::command::{Program, parse_invocation};
use super::engine_flags::{EngineFlags, read_engine_flags};
use super::fields::Fields;
use super::findings::Findings;
use super::pod::{OPERATOR_ENV, PodParts, take_apart, take_cpu_memory, take_pod_labels};
use infera_proto::discovery::ROLE_LABEL;
use serde_json::{Map, Value, json};

/// The earlier defaults for a service.
pub const DEFAULT_WORKER_PORT: i64 = 30000;

/// An earlier worker service.
#[derive(Debug, Clone, Default)]
pub struct Worker {
    /// Service name.
    pub name: String,
    /// `spec.services.<name>`.
    pub path: String,
    /// `mixed`, `prefill` or `decode`.
    pub role: String,
    /// Pods (or LeaderWorkerSet groups).
    pub replicas: i64,
    /// Nodes per replica.
    pub nodes: i64,
    /// `sglang`, `vllm` or `atom`.
    pub engine: String,
    /// The image.
    pub image: Option<String>,
    /// Where the image was written.
    pub image_path: String,
    /// The flags.
    pub flags: EngineFlags,
    /// Where the flags were written.
    pub flags_path: String,
    /// Env of the engine container.
    pub env: Vec<Value>,
    /// cpu, memory, ... requests and limits.
    pub resources: Map<String, Value>,
    /// GPUs per pod and their resource name.
    pub gpus: Option<(i64, String)>,
    /// `/dev/shm` size.
    pub shm: Option<String>,
    /// The RDMA resource and count.
    pub rdma_resource: Option<(String, i64)>,
    /// /dev/infiniband mounted from the host.
    pub host_devices: bool,
    /// Pod on the host network.
    pub host_network: bool,
    /// Drain seconds (flag, else INFERA_DRAIN_TIMEOUT).
    pub drain_seconds: Option<i64>,
    /// Startup budget from the startup probe.
    pub startup_seconds: Option<i64>,
    /// Placement.
    pub scheduling: Map<String, Value>,
    /// The earlier kvd container's flags and mounts.
    pub kvd: Option<super::pod::SideContainer>,
    /// `NATS_SERVER` in the env.
    pub nats_env: Option<String>,
    /// The earlier launchers' fp8 KV-cache default was on (`INFERA_DEFAULT_KV_FP8`).
    pub default_kv_fp8: bool,
    /// `VLLM_MORIIO_CONNECTOR_READ_MODE` on.
    pub mori_read_env: bool,
    /// What is left of the pod (or the service's podLabels).
    pub pod: Option<PodParts>,
    /// `podLabels`.
    pub labels: Map<String, Value>,
}

/// Reads worker service `name` (its `componentType` already taken). `backend` is
/// `spec.backendFramework`; `envs` is `spec.envs` (the earlier operator gave it only to
/// services without `extraPodSpec`).
pub fn read_worker(
    name: &str,
    mut svc: Fields,
    backend: &str,
    envs: &[Value],
    findings: &mut Findings,
) -> Worker {
    let mut w = Worker {
        name: name.to_owned(),
        path: svc.path().to_owned(),
        default_kv_fp8: true,
        ..Default::default()
    };
    w.role = svc
        .take_str("role", findings)
        .unwrap_or_else(|| "mixed".into());
    if !matches!(w.role.as_str(), "mixed" | "prefill" | "decode") {
        findings.error(
            svc.at("role"),
            format!("{:?} is not mixed, prefill or decode", w.role),
        );
    }
    w.replicas = svc.take_int("replicas", findings).unwrap_or(1);
    w.nodes = svc.take_int("numberOfNodes", findings).unwrap_or(1).max(1);
    if svc.take_bool("skipReadinessProbe", findings) == Some(true) {
        findings.warn(
            svc.at("skipReadinessProbe"),
            "engines launched out of band (idle pods an SSH session starts the engine in) are not supported: the operator launches the engine and its readiness is the sidecar's registration",
        );
    }
    if let Some(port) = svc
        .take_int("port", findings)
        .filter(|p| *p != DEFAULT_WORKER_PORT)
    {
        findings.warn(svc.at("port"), format!("engines listen on the operator's port (8000); {port} is not kept (the gateway finds workers by their registration)"));
    }
    w.labels = take_pod_labels(&mut svc, &[ROLE_LABEL], findings);
    let flat_image = svc.take_str("image", findings);
    let flat_args = svc.take_strings("args", findings);
    let flat_env = svc.take_list("env", findings);
    let flat_resources = svc.take_fields("resources", findings);
    let words;
    match svc.take("extraPodSpec") {
        Some(pod) => {
            let path = svc.at("extraPodSpec");
            let mut parts = take_apart(&path, pod, findings);
            for (key, set) in [
                ("image", flat_image.is_some()),
                ("args", !flat_args.is_empty()),
                ("env", !flat_env.is_empty()),
                ("resources", flat_resources.is_some()),
            ] {
                if set {
                    findings.warn(svc.at(key), "the earlier operator ignored it beside extraPodSpec (the pod's container was used as written); dropped");
                }
            }
            w.image = parts.image.clone();
            w.image_path = format!("{}.image", parts.main_path);
            words = std::mem::take(&mut parts.words);
            w.flags_path = parts.main_path.clone();
            let env = std::mem::take(&mut parts.env);
            read_env(&mut w, env, &format!("{}.env", parts.main_path), findings);
            w.startup_seconds = parts.startup_seconds;
            w.host_network = parts.host_network;
            w.scheduling = std::mem::take(&mut parts.scheduling);
            w.kvd = parts.kvd.take();
            read_container_resources(&mut w, std::mem::take(&mut parts.resources));
            if let Some(volume) = parts.take_mount_at("/dev/shm") {
                w.shm = volume.pointer("/emptyDir/sizeLimit").map(|q| match q {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
            }
            if let Some(volume) = parts.take_mount_at("/dev/infiniband") {
                w.host_devices = volume.get("hostPath").is_some();
            }
            let overlay = parts.overlay_volumes();
            parts.drop_mounts_of(&overlay);
            if w.host_devices {
                parts.privileged = false;
            }
            if w.host_devices || w.rdma_resource.is_some() {
                parts.capabilities.retain(|c| c != "IPC_LOCK");
            }
            restore_security(&mut parts);
            w.pod = Some(parts);
        }
        None => {
            w.image = flat_image.clone();
            w.image_path = svc.at("image");
            words = [
                vec![
                    "python3".into(),
                    "-m".into(),
                    format!("infera.engine.{backend}"),
                ],
                flat_args,
            ]
            .concat();
            w.flags_path = svc.at("args");
            let env = envs.iter().cloned().chain(flat_env).collect();
            read_env(&mut w, env, &svc.at("env"), findings);
            if let Some(mut r) = flat_resources {
                let gpu = r.take_int("gpu", findings).unwrap_or(0);
                let gpu_type = r
                    .take_str("gpuType", findings)
                    .unwrap_or_else(|| "amd.com/gpu".into());
                if gpu == 0 && gpu_type != "amd.com/gpu" {
                    findings.note(r.at("gpuType"), "no GPUs requested (resources.gpu), so the earlier operator requested none of it; dropped");
                }
                if gpu > 0 {
                    w.gpus = Some((gpu, gpu_type));
                }
                w.resources = take_cpu_memory(&mut r, findings);
                w.shm = r.take_str("sharedMemory", findings);
                r.report_rest(findings, "not a field of the earlier schema; dropped");
            }
        }
    }
    svc.report_rest(findings, "not a field of the earlier schema; dropped");
    match parse_invocation(&words) {
        Ok(inv) => match inv.program {
            Program::Engine(engine) => {
                if !inv.wrapper.is_empty() {
                    findings.note(&w.flags_path, format!("ran through {}: the operator runs the engine itself", inv.wrapper.join(" ")));
                }
                w.engine = engine.to_owned();
                w.flags = read_engine_flags(engine, &inv.flags, &w.flags_path, findings);
                if let Some(d) = w.flags.drain_seconds {
                    w.drain_seconds = Some(d);
                }
            }
            _ => findings.error(&w.flags_path, "a worker service must run an engine launcher (python3 -m infera.engine.<engine>)"),
        },
        Err(why) => findings.error(
            &w.flags_path,
            format!("{why}: the operator launches the engine itself, from the fields; write them by hand (spec.engine.args for the engine's flags)"),
        ),
    }
    if let Some(mode) = w
        .flags
        .disaggregation_mode
        .as_deref()
        .filter(|m| *m != w.role && w.role != "mixed")
    {
        findings.error(
            &w.flags_path,
            format!(
                "--disaggregation-mode {mode} disagrees with role {}",
                w.role
            ),
        );
    }
    w
}

/// The engine container's env: what the earlier launchers read becomes fields (the
/// drain, NATS, the fp8 KV default, MoRI's read mode); what the operator sets goes.
fn read_env(w: &mut Worker, env: Vec<Value>, path: &str, findings: &mut Findings) {
    for e in env {
        let name = e
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let value = e.get("value").and_then(Value::as_str).map(str::to_owned);
        let handled = matches!(
            name.as_str(),
            "INFERA_DRAIN_TIMEOUT"
                | "NATS_SERVER"
                | "INFERA_DEFAULT_KV_FP8"
                | "VLLM_MORIIO_CONNECTOR_READ_MODE"
        );
        if handled && e.get("valueFrom").is_some() {
            findings.warn(
                format!("{path}.{name}"),
                "read from a ConfigMap or Secret, which the converter cannot see: set the field it stands for by hand; dropped",
            );
        }
        match name.as_str() {
            "INFERA_DRAIN_TIMEOUT" => {
                w.drain_seconds = value
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .map(|s| s.ceil() as i64);
            }
            "NATS_SERVER" => w.nats_env = value,
            "INFERA_DEFAULT_KV_FP8" => w.default_kv_fp8 = value.as_deref() != Some("0"),
            "VLLM_MORIIO_CONNECTOR_READ_MODE" => {
                w.mori_read_env = value.is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
            }
            n if OPERATOR_ENV.contains(&n) => {}
            _ => w.env.push(e),
        }
    }
}

/// Puts what is left of the main container's security context back.
fn restore_security(parts: &mut PodParts) {
    if !parts.privileged && parts.capabilities.is_empty() {
        return;
    }
    let sc = parts
        .main_rest
        .entry("securityContext")
        .or_insert_with(|| json!({}));
    if parts.privileged {
        sc["privileged"] = json!(true);
    }
    if !parts.capabilities.is_empty() {
        sc["capabilities"]["add"] = json!(parts.capabilities);
    }
}

/// The main container's `resources`: GPUs and RDMA devices are counted; the rest stays.
fn read_container_resources(w: &mut Worker, resources: Map<String, Value>) {
    let mut kept = Map::new();
    for (section, list) in resources {
        let Value::Object(list) = list else {
            kept.insert(section, list);
            continue;
        };
        let mut rest = Map::new();
        for (name, q) in list {
            let count = match &q {
                Value::String(s) => s.parse::<i64>().ok(),
                other => other.as_i64(),
            };
            if name.contains("gpu") {
                if let Some(n) = count {
                    w.gpus = Some((n, name.clone()));
                }
            } else if name.contains("rdma") || name.ends_with("/hca") {
                if let Some(n) = count {
                    w.rdma_resource = Some((name.clone(), n));
                }
            } else {
                rest.insert(name, q);
            }
        }
        if !rest.is_empty() {
            kept.insert(section, Value::Object(rest));
        }
    }
    w.resources = kept;
}
/// Whether any of the earlier workers used RDMA (a device-plugin resource, or the
/// host's devices).
pub(super) fn rdma_on(all: &[&Worker]) -> bool {
    all.iter()
        .any(|w| w.rdma_resource.is_some() || w.host_devices)
}
