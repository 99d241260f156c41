//! The engine pod of one role (pure): the engine container, the sidecar as a native
//! sidecar in attach mode, kvd when on, GPUs and RDMA devices, RoCE env, shared memory,
//! identity from the downward API, probes sized from the startup budget, and a grace
//! period that covers the drain.

use super::engine::{ENGINE_PORT, EngineCommand, KV_EVENTS_PORT, MODEL_MOUNT};
use super::pull::{PodKind, apply_pull};
use crate::api::{PlatformVersion, SchedulingSpec};
use crate::names;
use crate::plan::{Discovery, EnginePlatform, KvdPlan, ModelVolume, Plan, RolePlan};
use infera_engine_prep::Launch;
use infera_proto::sidecar::{DRAIN_TOKEN_ENV, DRAIN_TOKEN_HEADER};
use infera_proto::worker::EngineKind;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, HTTPHeader, HostPathVolumeSource, Lifecycle, LifecycleHandler,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// Port of the sidecar's `/health`, `/metrics` and `/drain`.
pub const SIDECAR_PORT: u16 = 8090;
/// Margin of the grace period over the drain (deregistration, the engine's own stop),
/// and the shortest grace period: the earlier launchers' max(120, drain + 65).
pub const GRACE_MARGIN_SECONDS: i64 = 65;
/// The shortest grace period of an engine pod.
pub const MIN_GRACE_SECONDS: i64 = 120;

/// The grace period of an engine pod whose sidecar drains for `drain_seconds`.
pub fn grace_period_seconds(drain_seconds: u32) -> i64 {
    (i64::from(drain_seconds) + GRACE_MARGIN_SECONDS).max(MIN_GRACE_SECONDS)
}
/// Seconds between startup-probe checks.
pub const STARTUP_PERIOD_SECONDS: i32 = 10;
/// kvd's socket folder, shared by the engine and kvd containers.
pub const KVD_SOCKET_DIR: &str = "/run/infera-kvd";
/// kvd's /metrics port.
pub const KVD_METRICS_PORT: u16 = 9401;
/// Where kvd's NVMe tier is mounted.
pub const KVD_NVME_DIR: &str = "/var/lib/infera-kvd";
/// Multus's annotation naming a pod's secondary networks.
pub const MULTUS_NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// The folder the node-env init container writes and the engine container reads.
pub const ENGINE_ENV_DIR: &str = "/run/infera";
/// The sh file there the engine container sources before it starts.
pub const ENGINE_ENV_FILE: &str = "/run/infera/engine-env.sh";
/// Where model links are made (the engine's working directory when there is one).
pub const MODEL_LINK_DIR: &str = "/run/infera/models";

/// Whether the engine needs the node-env init container: a real engine moving KV over
/// RDMA (the node's GID and RDMA defaults), or ATOM (its model link). Others start as
/// their image does, without a shell.
fn needs_node_env(plan: &Plan) -> bool {
    let d = &plan.deployment;
    match d.launch {
        Launch::Engine(EngineKind::Atom) => true,
        Launch::Engine(_) => d.network.rdma.enabled,
        Launch::Sim(_) => false,
    }
}

/// A real engine's command, run after sourcing what the node-env init container found.
fn with_node_env(command: &[String]) -> Vec<String> {
    let mut out = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!(". {ENGINE_ENV_FILE} && exec \"$@\""),
        "infera-engine".to_owned(),
    ];
    out.extend(command.iter().cloned());
    out
}

/// The init container of a real engine's pod: `infera-engine-sidecar node-env` finds the
/// node's RDMA facts and makes the model link (see `infera_engine_sidecar::node_env`).
fn node_env_container(
    plan: &Plan,
    engine: &EngineCommand,
    platform: &EnginePlatform,
) -> Option<Container> {
    if !needs_node_env(plan) {
        return None;
    }
    let d = &plan.deployment;
    let engine_word = d.launch.engine().as_str();
    let mut args: Vec<String> = vec!["node-env".into(), "--engine".into(), engine_word.into()];
    if d.network.rdma.enabled {
        args.push("--rdma".into());
    }
    if let Some((name, target)) = &engine.model_link {
        args.extend([
            "--model-link".into(),
            format!("{name}={target}"),
            "--model-dir".into(),
            MODEL_LINK_DIR.into(),
        ]);
    }
    args.extend(["--out".into(), ENGINE_ENV_FILE.into()]);
    Some(Container {
        name: "node-env".into(),
        image: Some(platform.sidecar.clone()),
        args: Some(args),
        volume_mounts: Some(vec![mount("engine-env", ENGINE_ENV_DIR)]),
        security_context: Some(restricted_security()),
        resources: Some(cpu_and_memory("10m", "16Mi", "64Mi")),
        ..Default::default()
    })
}

/// Where in a multi-node worker a pod sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePlace {
    /// A single-node worker, or the leader (rank 0) of a multi-node one: runs the sidecar.
    Leader,
    /// A follower node of a multi-node worker: the engine only.
    Follower,
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `name` from a Secret's key (which must exist: the pod waits for it).
pub fn secret_env(name: &str, secret: &crate::api::SecretKeyRef) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.name.clone(),
                key: secret.key.clone(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Identity from the downward API (first, so `$(POD_IP)` expands in later values).
fn identity_env() -> Vec<EnvVar> {
    vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_IP", "status.podIP"),
        field_env("NODE_NAME", "spec.nodeName"),
    ]
}

/// One variable per name, the last one given winning (the user's `env` comes last), in
/// the order of first appearance: server-side apply refuses duplicate names, and
/// `$(VAR)` references need the identity variables first.
pub fn dedupe_env(env: Vec<EnvVar>) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = Vec::with_capacity(env.len());
    for var in env {
        match out.iter_mut().find(|v| v.name == var.name) {
            Some(slot) => *slot = var,
            None => out.push(var),
        }
    }
    out
}

fn plain_env(pairs: &[(String, String)]) -> Vec<EnvVar> {
    pairs
        .iter()
        .map(|(name, value)| EnvVar {
            name: name.clone(),
            value: Some(value.clone()),
            ..Default::default()
        })
        .collect()
}

fn http_get(path: &str, port: u16) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(i32::from(port)),
        ..Default::default()
    }
}

fn probe(path: &str, port: u16, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(http_get(path, port)),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(5),
        ..Default::default()
    }
}

/// Requests of `cpu` and `memory`, and a `memory_limit` (no CPU limit: no throttling).
pub fn cpu_and_memory(cpu: &str, memory: &str, memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), quantity(cpu)),
            ("memory".into(), quantity(memory)),
        ])),
        limits: Some(BTreeMap::from([("memory".into(), quantity(memory_limit))])),
        ..Default::default()
    }
}

fn quantity(s: impl Into<String>) -> Quantity {
    Quantity(s.into())
}

/// A hardened container security context (what a non-root image needs).
pub fn restricted_security() -> SecurityContext {
    SecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// kvd's: restricted, except that with an NVMe tier it runs as root (still without any
/// capability) to own the files it creates in the hostPath directory, which the kubelet
/// creates root-owned.
fn kvd_security(nvme: bool) -> SecurityContext {
    let mut s = restricted_security();
    if nvme {
        s.run_as_non_root = Some(false);
        s.run_as_user = Some(0);
    }
    s
}

/// The volume of the host's RDMA devices (`network.rdma.hostDevices`).
const RDMA_DEVICES: &str = "rdma-devices";
const RDMA_DEVICES_PATH: &str = "/dev/infiniband";

/// The engine mounts the host's RDMA devices instead of a device plugin's.
fn host_devices(plan: &Plan) -> bool {
    let rdma = &plan.deployment.network.rdma;
    rdma.enabled && rdma.host_devices
}

/// The engine container's resources: the user's CPU and memory plus GPUs and RDMA
/// devices (extended resources: requests equal limits).
fn engine_resources(plan: &Plan, role: &RolePlan) -> ResourceRequirements {
    let mut res = role.resources.clone().unwrap_or_default();
    let mut extended = BTreeMap::new();
    if role.gpus > 0 {
        extended.insert(
            plan.deployment.engine.gpu_resource_name.clone(),
            quantity(role.gpus.to_string()),
        );
    }
    let rdma = &plan.deployment.network.rdma;
    if rdma.enabled && rdma.rails.is_empty() && !rdma.host_devices {
        extended.insert(rdma.resource_name.clone(), quantity(rdma.count.to_string()));
    }
    for rail in rdma.rails.iter().filter(|_| rdma.enabled) {
        extended.insert(rail.resource_name.clone(), quantity(rail.count.to_string()));
    }
    if !extended.is_empty() {
        let mut limits = res.limits.take().unwrap_or_default();
        let mut requests = res.requests.take().unwrap_or_default();
        for (k, v) in extended {
            limits.insert(k.clone(), v.clone());
            requests.insert(k, v);
        }
        res.limits = Some(limits);
        res.requests = Some(requests);
    }
    res
}

fn sidecar_args(plan: &Plan, engine: &EngineCommand) -> Vec<String> {
    let d = &plan.deployment;
    let rdma = &d.network.rdma;
    let mut args: Vec<String> = vec![
        // The sidecar's first word: the engine, or `sim`.
        d.launch.word().into(),
        "--attach".into(),
        "--status-port".into(),
        SIDECAR_PORT.to_string(),
        "--advertise-host".into(),
        "$(POD_IP)".into(),
        "--drain-timeout".into(),
        d.engine.drain_seconds.to_string(),
        "--health-timeout".into(),
        d.model.startup_budget_seconds.to_string(),
    ];
    match &plan.discovery {
        Discovery::Etcd(etcd) => args.extend(super::secrets::etcd_client_args(etcd)),
        Discovery::Kubernetes => {
            args.extend(["--discovery-backend".into(), "kubernetes".into()]);
            args.extend(["--k8s-namespace".into(), plan.owner.namespace.clone()]);
        }
    }
    if let Some(url) = &plan.nats_url {
        args.extend(super::gateway_flags::nats_flags(url));
        args.extend(plan.request_plane.iter().cloned());
    }
    if let Some(gid) = rdma.gid_index.filter(|_| rdma.enabled) {
        args.extend(["--gid-index".into(), gid.to_string()]);
    }
    if !rdma.enabled {
        // Without RDMA the KV moves over TCP: say so rather than have the sidecar refuse.
        args.push("--disaggregation-allow-tcp".into());
    }
    args.extend(engine.engine_args.iter().cloned());
    args
}

/// Inputs of one role's pod template.
#[derive(Debug, Clone, Copy)]
pub struct PodInput<'a> {
    /// The deployment's plan.
    pub plan: &'a Plan,
    /// The role.
    pub role: &'a RolePlan,
    /// Leader or follower of a multi-node worker.
    pub place: NodePlace,
    /// The engine command of the role.
    pub engine: &'a EngineCommand,
    /// What the `preStop` hook presents to the sidecar's `/drain` (`drain_token`).
    pub drain_token: &'a str,
    /// The release of Infera's parts the pod runs, with its images.
    pub platform: &'a EnginePlatform,
    /// A container beside the engine on the leader: the decode frontend behind an
    /// InferencePool ([`super::frontend`]).
    pub frontend: Option<&'a Container>,
}

/// The sidecar's `/drain` answers loopback callers and whoever presents this: the
/// kubelet's `preStop` hook, which calls from the node. Derived from the deployment's
/// uid, so it is stable across reconciles and unguessable from the network; like the
/// rest of the pod spec it is visible to those who may read Pods.
pub fn drain_token(owner_uid: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("infera-drain-token/{owner_uid}"));
    hex::encode(&digest[..16])
}

/// The sidecar's mounts: the model, and its API token or etcd's Secrets.
fn sidecar_mounts(plan: &Plan) -> Vec<VolumeMount> {
    let mut mounts = vec![model_mount()];
    if kubernetes_discovery(plan) {
        mounts.push(super::token::mount());
    }
    mounts.extend(
        super::secrets::etcd_secrets(&plan.discovery)
            .into_iter()
            .map(|(_, m)| m),
    );
    mounts
}

/// Whether the sidecar registers through its Pod's annotation (and so holds a token).
fn kubernetes_discovery(plan: &Plan) -> bool {
    plan.discovery == Discovery::Kubernetes
}

fn volumes(plan: &Plan) -> Vec<Volume> {
    let d = &plan.deployment;
    let mut v = vec![
        Volume {
            name: "dshm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(d.engine.shared_memory_size.clone()),
            }),
            ..Default::default()
        },
        model_volume(&d.model.volume),
    ];
    if kubernetes_discovery(plan) {
        v.push(super::token::volume());
    }
    v.extend(
        super::secrets::etcd_secrets(&plan.discovery)
            .into_iter()
            .map(|(v, _)| v),
    );
    if host_devices(plan) {
        v.push(Volume {
            name: RDMA_DEVICES.into(),
            host_path: Some(HostPathVolumeSource {
                path: RDMA_DEVICES_PATH.into(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        });
    }
    if needs_node_env(plan) {
        v.push(Volume {
            name: "engine-env".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
    }
    if let Some(kvd) = &d.kvd {
        v.push(Volume {
            name: "kvd-socket".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
        if let Some(nvme) = &kvd.nvme {
            v.push(Volume {
                name: "kvd-nvme".into(),
                host_path: Some(HostPathVolumeSource {
                    path: nvme.path.clone(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                ..Default::default()
            });
        }
    }
    v
}

/// The model volume (read-only in every pod that mounts it).
pub fn model_volume(model: &ModelVolume) -> Volume {
    match model {
        ModelVolume::Claim { claim, .. } => Volume {
            name: "model".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(true),
            }),
            ..Default::default()
        },
        ModelVolume::Host { path } => Volume {
            name: "model".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.clone(),
                type_: None,
            }),
            ..Default::default()
        },
    }
}

/// The read-only mount of the model volume.
pub fn model_mount() -> VolumeMount {
    VolumeMount {
        name: "model".into(),
        mount_path: MODEL_MOUNT.into(),
        read_only: Some(true),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

/// kvd's flags (the earlier daemon's): the RAM budget is both `--max-bytes` and the
/// shared arena engines map; NVMe is the `long` tier; the distributed tier is its URL.
fn kvd_args(kv: &KvdPlan) -> Vec<String> {
    let ram = kv.ram_bytes.to_string();
    let mut args = vec![
        "--socket".into(),
        format!("{KVD_SOCKET_DIR}/kvd.sock"),
        // Engines of vendor images run as root; kvd runs as its image's user.
        "--allow-uid".into(),
        "0".into(),
        "--metrics-addr".into(),
        format!("0.0.0.0:{KVD_METRICS_PORT}"),
        "--max-bytes".into(),
        ram.clone(),
        "--shared-arena-bytes".into(),
        ram,
    ];
    if let Some(nvme) = &kv.nvme {
        args.extend([
            "--long-path".into(),
            KVD_NVME_DIR.into(),
            "--long-bytes".into(),
            nvme.bytes.to_string(),
        ]);
    }
    if let Some(url) = &kv.remote_url {
        args.extend(["--remote-url".into(), url.clone()]);
    }
    args
}

fn kvd_container(kv: &KvdPlan, image: &str) -> Container {
    let mut mounts = vec![mount("kvd-socket", KVD_SOCKET_DIR)];
    if kv.nvme.is_some() {
        mounts.push(mount("kvd-nvme", KVD_NVME_DIR));
    }
    Container {
        name: "kvd".into(),
        image: Some(image.to_owned()),
        args: Some(kvd_args(kv)),
        // Declared so hostNetwork pods of one node do not collide on it unseen.
        ports: Some(vec![ContainerPort {
            name: Some("kvd-metrics".into()),
            container_port: i32::from(KVD_METRICS_PORT),
            ..Default::default()
        }]),
        restart_policy: Some("Always".into()),
        volume_mounts: Some(mounts),
        // kvd reads the distributed tier's URL from here: a password stays in the Secret.
        env: kv
            .remote_url_secret_ref
            .as_ref()
            .map(|secret| vec![secret_env("INFERA_KVD_REMOTE_URL", secret)]),
        security_context: Some(kvd_security(kv.nvme.is_some())),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), quantity("500m")),
                ("memory".into(), kv.ram.clone()),
            ])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The tiers kvd gives the engine, as `--kv-tiers` names them: its RAM (`host`), its
/// NVMe tier (`disk`) and the shared store (`remote`) when configured.
fn kv_tiers(plan: &Plan) -> String {
    let mut tiers = vec!["host"];
    if let Some(kvd) = &plan.deployment.kvd {
        if kvd.nvme.is_some() {
            tiers.push("disk");
        }
        if kvd.remote_url.is_some() || kvd.remote_url_secret_ref.is_some() {
            tiers.push("remote");
        }
    }
    tiers.join(",")
}

fn sidecar_container(input: &PodInput<'_>) -> Container {
    let mut env = identity_env();
    env.extend(plain_env(&input.engine.env));
    env.push(EnvVar {
        name: DRAIN_TOKEN_ENV.into(),
        value: Some(input.drain_token.to_owned()),
        ..Default::default()
    });
    let mut args = sidecar_args(input.plan, input.engine);
    let mut mounts = sidecar_mounts(input.plan);
    // From 0.2.0 the sidecar takes prewarm hints for the kvd beside the engine; an
    // earlier sidecar would hand the flag to the engine.
    if input.plan.deployment.kvd.is_some()
        && input.platform.version.at_least(PlatformVersion::V0_2_0)
    {
        // After the first word, with the sidecar's own flags (it takes them anywhere).
        // The record declares the tiers the engine's connector loads from.
        args.splice(
            1..1,
            [
                "--kvd-socket".to_owned(),
                format!("{KVD_SOCKET_DIR}/kvd.sock"),
                "--kv-tiers".to_owned(),
                kv_tiers(input.plan),
            ],
        );
        mounts.push(mount("kvd-socket", KVD_SOCKET_DIR));
    }
    Container {
        name: "sidecar".into(),
        image: Some(input.platform.sidecar.clone()),
        args: Some(args),
        env: Some(dedupe_env(env)),
        // A native sidecar: started before the engine, stopped after it.
        restart_policy: Some("Always".into()),
        ports: Some(vec![ContainerPort {
            name: Some("sidecar".into()),
            container_port: i32::from(SIDECAR_PORT),
            ..Default::default()
        }]),
        volume_mounts: Some(mounts),
        security_context: Some(restricted_security()),
        resources: Some(cpu_and_memory("50m", "64Mi", "256Mi")),
        // From 0.2.0 a Ready pod is a registered one: a rollout retires an old worker
        // only once its replacement takes requests.
        readiness_probe: input
            .platform
            .version
            .at_least(PlatformVersion::V0_2_0)
            .then(|| probe("/ready", SIDECAR_PORT, 2, 2)),
        ..Default::default()
    }
}

fn engine_container(input: &PodInput<'_>) -> Container {
    let plan = input.plan;
    let d = &plan.deployment;
    let mut env = identity_env();
    env.extend(plain_env(&input.engine.env));
    env.extend(d.engine.env.iter().cloned());
    let mut mounts = vec![mount("dshm", "/dev/shm"), model_mount()];
    if host_devices(plan) {
        mounts.push(mount(RDMA_DEVICES, RDMA_DEVICES_PATH));
    }
    if needs_node_env(plan) {
        mounts.push(mount("engine-env", ENGINE_ENV_DIR));
    }
    if d.kvd.is_some() {
        mounts.push(mount("kvd-socket", KVD_SOCKET_DIR));
        env.push(EnvVar {
            name: "INFERA_KVD_SOCKET".into(),
            value: Some(format!("{KVD_SOCKET_DIR}/kvd.sock")),
            ..Default::default()
        });
        // The simulator's KV connector reads which of kvd's tiers long blocks reach.
        if matches!(d.launch, Launch::Sim(_)) {
            env.push(EnvVar {
                name: "INFERA_KV_TIERS".into(),
                value: Some(kv_tiers(plan)),
                ..Default::default()
            });
        }
    }
    let budget = i32::try_from(d.model.startup_budget_seconds).unwrap_or(i32::MAX);
    let leader = input.place == NodePlace::Leader;
    let startup_failures = ((budget + STARTUP_PERIOD_SECONDS - 1) / STARTUP_PERIOD_SECONDS).max(1);
    let mut ports = vec![ContainerPort {
        name: Some("http".into()),
        container_port: i32::from(ENGINE_PORT),
        ..Default::default()
    }];
    ports.push(ContainerPort {
        name: Some("kv-events".into()),
        container_port: i32::from(KV_EVENTS_PORT),
        ..Default::default()
    });
    let mut command = if needs_node_env(plan) {
        with_node_env(&input.engine.command)
    } else {
        input.engine.command.clone()
    };
    if input.place == NodePlace::Follower && d.launch != Launch::Engine(EngineKind::Sglang) {
        // vLLM and ATOM follower nodes run headless (no API server of their own).
        command.push("--headless".into());
    }
    Container {
        name: "engine".into(),
        // The API server requires an image for every kind but sim.
        image: Some(
            d.engine
                .image
                .clone()
                .unwrap_or_else(|| input.platform.sim.clone()),
        ),
        command: Some(command),
        env: Some(dedupe_env(env)),
        ports: Some(ports),
        resources: Some(engine_resources(plan, input.role)),
        volume_mounts: Some(mounts),
        startup_probe: leader.then(|| {
            probe(
                "/health",
                ENGINE_PORT,
                STARTUP_PERIOD_SECONDS,
                startup_failures,
            )
        }),
        readiness_probe: leader.then(|| probe("/health", ENGINE_PORT, 10, 3)),
        lifecycle: leader.then(|| Lifecycle {
            // Deregister and drain before Kubernetes stops the engine.
            pre_stop: Some(LifecycleHandler {
                http_get: Some(HTTPGetAction {
                    http_headers: Some(vec![HTTPHeader {
                        name: DRAIN_TOKEN_HEADER.into(),
                        value: input.drain_token.to_owned(),
                    }]),
                    ..http_get("/drain", SIDECAR_PORT)
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        security_context: engine_security(d.launch, d.network.rdma.enabled, host_devices(plan)),
        ..Default::default()
    }
}

/// The engine container's: the simulator runs restricted. Real engines run as their
/// image's user (root in the vLLM, SGLang and ATOM ROCm images) with the cluster's
/// default seccomp handling (RuntimeDefault refuses NUMA placement calls such as `mbind`
/// without `CAP_SYS_NICE`); with RDMA they add `IPC_LOCK` to pin memory for the NIC.
/// Pod Security: "restricted" for simulated engines with a PVC or Hugging Face model,
/// "baseline" for real ones without RDMA, "privileged" with it (or with a hostPath).
/// `network.rdma.hostDevices` makes the engine container privileged: the only way a
/// device node mounted from the host, not handed out by a plugin, opens.
fn engine_security(launch: Launch, rdma: bool, host_devices: bool) -> Option<SecurityContext> {
    if host_devices {
        return Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
    }
    if launch.is_sim() {
        return Some(restricted_security());
    }
    rdma.then(|| SecurityContext {
        capabilities: Some(Capabilities {
            add: Some(vec!["IPC_LOCK".into()]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The pod template of one role.
pub fn build_pod_template(input: &PodInput<'_>) -> PodTemplateSpec {
    let plan = input.plan;
    let d = &plan.deployment;
    let instance = plan.owner.name.as_str();
    let mut init: Vec<Container> = node_env_container(plan, input.engine, input.platform)
        .into_iter()
        .collect();
    if let Some(kvd) = &d.kvd {
        init.push(kvd_container(kvd, &input.platform.kvd));
    }
    if input.place == NodePlace::Leader {
        init.push(sidecar_container(input));
    }
    let mut labels = names::role_labels(instance, input.role.role);
    // The manifest's word: the engine, or `sim`.
    labels.insert("infera.amd.com/engine".into(), d.launch.word().into());
    let sched = &d.scheduling;
    let host_network = d.network.rdma.enabled && d.network.rdma.host_network;
    let mut containers = vec![engine_container(input)];
    if input.place == NodePlace::Leader {
        containers.extend(input.frontend.cloned());
    }
    let mut spec = PodSpec {
        service_account_name: Some(names::service_account(instance)),
        // The sidecar alone gets a token (`token`), and only for Kubernetes discovery.
        automount_service_account_token: Some(false),
        init_containers: (!init.is_empty()).then_some(init),
        containers,
        volumes: Some(volumes(plan)),
        termination_grace_period_seconds: Some(grace_period_seconds(d.engine.drain_seconds)),
        // Service env vars would collide with engine settings (a Service named
        // `vllm` sets VLLM_PORT).
        enable_service_links: Some(false),
        host_network: host_network.then_some(true),
        dns_policy: host_network.then(|| "ClusterFirstWithHostNet".into()),
        ..placement(sched)
    };
    // The simulator is Infera's image; a vendor engine's is not.
    let mut infera = vec!["node-env", "kvd", "sidecar", "frontend"];
    if d.engine.image.is_none() {
        infera.push("engine");
    }
    apply_pull(
        &mut spec,
        &plan.pull,
        PodKind::Engine(input.platform.version),
        &infera,
    );
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: (!d.network.secondary_networks.is_empty()).then(|| {
                BTreeMap::from([(
                    MULTUS_NETWORKS.to_owned(),
                    d.network.secondary_networks.join(","),
                )])
            }),
            ..Default::default()
        }),
        spec: Some(spec),
    }
}

/// The placement fields of a pod spec from `sched` (the rest default).
pub fn placement(sched: &SchedulingSpec) -> PodSpec {
    PodSpec {
        node_selector: (!sched.node_selector.is_empty()).then(|| sched.node_selector.clone()),
        tolerations: (!sched.tolerations.is_empty()).then(|| sched.tolerations.clone()),
        affinity: sched.affinity.clone(),
        priority_class_name: sched.priority_class_name.clone(),
        topology_spread_constraints: (!sched.topology_spread_constraints.is_empty())
            .then(|| sched.topology_spread_constraints.clone()),
        ..Default::default()
    }
}
