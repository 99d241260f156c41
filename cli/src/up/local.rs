//! Starting a plan on this machine: simulated workers in this process (or real engines
//! through the sidecar), their records in the in-process registry (or etcd), and the
//! gateway, with progress on stdout. Everything stops with [`LocalCluster::shutdown`].

use super::plan::{Launch, LocalDeployment, LocalPlan, Role};
use anyhow::{Context, Result, anyhow, bail};
use infera_engine_prep::prepare::{http_port_flag, model_flags};
use infera_engine_sidecar::node_env::link_model;
use infera_engine_sidecar::registration::{Registration, RegistrationState, run_registration};
use infera_gateway::Gateway;
use infera_gateway::Registry;
use infera_gateway::config::GatewayConfig;
use infera_gateway::server::{RunningGateway, start_embedded, start_gateway};
use infera_operator::api::RoutingPolicy;
use infera_operator::plan::{KvdPlan, Tokenizer};
use infera_operator::render::gateway_flags::{GatewaySite, build_gateway_args};
use infera_prompt::PromptCodec;
use infera_proto::discovery::{LEASE_TTL, build_worker_key};
use infera_proto::kv_tiers::KvTier;
use infera_proto::pd::PdProtocol;
use infera_proto::worker::{EngineKind, WorkerRecord};
use infera_sim::kv_events::KvEventsEndpoint;
use infera_sim::kvd_connector::KvdConfig;
use infera_sim::pd::{PdLeg, PdRole, build_disagg_meta};
use infera_sim::worker::{RunningWorker, build_generator, start_worker};
use serde_json::json;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The etcd prefix of this run's records: its own, so the local gateway routes only to
/// the workers this `infera up` started (not a cluster's, not a previous run's).
pub fn run_prefix() -> String {
    format!("/infera-up/{}/workers/", std::process::id())
}

/// Where records go.
#[derive(Debug, Clone)]
pub enum Discovery {
    /// The gateway's registry, in this process.
    InProcess,
    /// A real etcd.
    Etcd(String),
}

/// A worker that is running.
#[derive(Debug)]
pub struct LocalWorker {
    /// Deployment.
    pub deployment: String,
    /// Role.
    pub role: Role,
    /// Record as registered (None for a launched engine: its sidecar registers it).
    pub record: Option<WorkerRecord>,
    /// The simulated engine (None for a launched one).
    pub sim: Option<RunningWorker>,
    /// A launched sidecar (with its engine).
    pub child: Option<tokio::process::Child>,
}

/// Everything `infera up` started.
#[derive(Debug)]
pub struct LocalCluster {
    /// The gateway.
    pub gateway: RunningGateway,
    /// Workers, in start order.
    pub workers: Vec<LocalWorker>,
    stop_registrations: watch::Sender<bool>,
    registrations: tokio::task::JoinSet<()>,
}

/// A free loopback port (bound then released).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// The record a launcher would register for a simulated worker.
pub fn build_sim_record(
    addr: SocketAddr,
    flavor: EngineKind,
    model: &str,
    role: Option<&PdRole>,
    kv_events: Option<&str>,
    block_size: usize,
) -> Result<WorkerRecord> {
    let mode = match role.map(|r| r.leg) {
        None => "mixed",
        Some(PdLeg::Prefill) => "prefill",
        Some(PdLeg::Decode) => "decode",
    };
    let record = json!({
        "worker_id": addr.to_string(),
        "url": format!("http://{addr}"),
        "model_name": model,
        "engine": flavor.as_str(),
        "disagg_mode": mode,
        "disagg_meta": role.map(build_disagg_meta),
        "kv_events_endpoint": kv_events,
        "kv_block_size": block_size,
        "dp_size": 1,
        "request_transport": "http",
    });
    WorkerRecord::from_json(record.to_string().as_bytes())
        .map_err(|e| anyhow!("building the record of {addr}: {e}"))
}

/// A loopback simulated worker's prefill/decode identity, with free connector ports.
pub fn loopback_pd_role(
    protocol: PdProtocol,
    leg: PdLeg,
    port: u16,
    engine_id: String,
) -> Result<PdRole> {
    Ok(PdRole {
        leg,
        protocol,
        host: "127.0.0.1".into(),
        http_port: port,
        handshake_port: free_port()?,
        notify_port: free_port()?,
        tp_size: 1,
        dp_size: 1,
        bootstrap_port: free_port()?,
        engine_id,
    })
}

fn pd_role(
    protocol: PdProtocol,
    role: Role,
    port: u16,
    name: &str,
    index: usize,
) -> Result<Option<PdRole>> {
    let leg = match role {
        Role::Mixed => return Ok(None),
        Role::Prefill => PdLeg::Prefill,
        Role::Decode => PdLeg::Decode,
    };
    let engine_id = format!("{name}-{}-{index}", role.as_str());
    loopback_pd_role(protocol, leg, port, engine_id).map(Some)
}

/// Starts one simulated worker of `d`.
async fn start_sim_worker(
    d: &LocalDeployment,
    role: Role,
    index: usize,
    kv_events: bool,
    codec: &Arc<PromptCodec>,
) -> Result<(RunningWorker, WorkerRecord)> {
    let mut argv = vec!["infera-sim".to_owned()];
    argv.extend(d.plan.engine.args.iter().cloned());
    let (cli, ignored) = infera_sim::cli::parse_lenient(argv)
        .map_err(|e| anyhow!("InferaDeployment {}: spec.engine.args: {e}", d.name()))?;
    for flag in ignored {
        tracing::warn!(deployment = %d.name(), "the simulator ignores engine flag {flag}");
    }
    let mut cfg = cli
        .worker_configs()
        .with_context(|| format!("InferaDeployment {}: spec.engine.args", d.name()))?
        .remove(0);
    let port = free_port()?;
    cfg.listen = SocketAddr::from(([127, 0, 0, 1], port));
    cfg.engine = d.engine();
    cfg.model = d.model().to_owned();
    cfg.event_format = None;
    cfg.pd = match d.protocol() {
        Some(p) => pd_role(p, role, port, d.name(), index)?,
        None => None,
    };
    let events = if kv_events {
        Some(format!("tcp://127.0.0.1:{}", free_port()?))
    } else {
        None
    };
    cfg.kv_events = events.clone().map(|endpoint| KvEventsEndpoint {
        endpoint,
        replay_endpoint: None,
        topic: String::new(),
    });
    let block_size = cfg.core.block_size;
    let role_cfg = cfg.pd.clone();
    // spec.kvCache: a kvd beside the worker, as the operator puts one in its pod.
    let declared = match &d.plan.kvd {
        Some(kvd) => {
            let socket = start_kvd(kvd, &format!("{}-{}-{index}", d.name(), role.as_str())).await?;
            let mut tiers = vec![KvTier::Host];
            if kvd.remote_url.is_some() {
                tiers.push(KvTier::Remote);
            }
            let (config, declared) =
                KvdConfig::measured(socket, &tiers, &cfg.core.profile, block_size, d.model());
            cfg.kvd = Some(config);
            Some(declared)
        }
        None => None,
    };
    let generator = Arc::new(build_generator(codec));
    let worker = start_worker(cfg, codec.clone(), generator)
        .await
        .with_context(|| format!("starting a simulated worker of {}", d.name()))?;
    let mut record = build_sim_record(
        worker.addr,
        d.engine(),
        d.model(),
        role_cfg.as_ref(),
        events.as_deref(),
        block_size,
    )?;
    if let Some(declared) = declared {
        declared.declare_on(&mut record);
    }
    Ok((worker, record))
}

/// Starts an in-process kvd for worker `name` with `kvd`'s RAM (and shared store, when
/// its URL is given), running until this process ends; returns its socket.
async fn start_kvd(kvd: &KvdPlan, name: &str) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("infera-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let socket = dir.join(format!("kvd-{name}.sock"));
    run_kvd_in_process(
        &tokio::runtime::Handle::current(),
        &socket,
        kvd.ram_bytes,
        kvd.remote_url.as_deref(),
        std::future::pending(),
        name,
    )
    .await?;
    tracing::info!(worker = name, socket = %socket.display(), ram_bytes = kvd.ram_bytes, "kvd beside the worker");
    Ok(socket)
}

/// kvd on `socket` with `ram_bytes` of RAM (and the shared tier at `remote_url`), run from
/// its library on `runtime` until `stop` resolves; returns once it listens. `name` says
/// whose it is in errors.
pub(crate) async fn run_kvd_in_process(
    runtime: &tokio::runtime::Handle,
    socket: &std::path::Path,
    ram_bytes: u64,
    remote_url: Option<&str>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    name: &str,
) -> Result<()> {
    let mut argv = vec![
        "infera-kvd".to_owned(),
        "--socket".into(),
        socket.display().to_string(),
        "--max-bytes".into(),
        ram_bytes.to_string(),
        "--metrics-addr".into(),
        String::new(),
    ];
    if let Some(url) = remote_url {
        argv.extend(["--remote-url".into(), url.to_owned()]);
    }
    let args = <infera_kvd::cli::KvdArgs as clap::Parser>::try_parse_from(argv)
        .map_err(|e| anyhow!("kvd for {name}: {e}"))?;
    let owner = name.to_owned();
    runtime.spawn(async move {
        if let Err(e) = infera_kvd::service::run(args, stop).await {
            tracing::error!("kvd for {owner}: {e:#}");
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if std::time::Instant::now() >= deadline {
            anyhow::bail!("kvd for {name} did not listen on {}", socket.display());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The sidecar binary: beside this one, else on PATH.
fn sidecar_binary() -> std::path::PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("infera-engine-sidecar")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "infera-engine-sidecar".into())
}

/// The sidecar's command line for a launched engine of `d` on `port`, and the model link
/// to make in its working directory (ATOM loads its served name, see `model_flags`).
fn local_engine_argv(
    d: &LocalDeployment,
    etcd: &str,
    port: u16,
) -> (Vec<String>, Option<(String, String)>) {
    let mut args: Vec<String> = vec![
        d.engine().as_str().into(),
        "--etcd-endpoint".into(),
        etcd.into(),
        "--etcd-prefix".into(),
        run_prefix(),
        "--advertise-host".into(),
        "127.0.0.1".into(),
    ];
    let (model, link) = model_flags(d.plan.launch, &d.model_path, d.model());
    args.extend(model);
    args.extend([
        http_port_flag(d.plan.launch).into(),
        port.to_string(),
        "--tensor-parallel-size".into(),
        d.tensor_parallel_size().to_string(),
    ]);
    args.extend(d.plan.engine.args.iter().cloned());
    (args, link)
}

/// Launches a real engine through the sidecar (which registers it in etcd).
fn launch_engine(d: &LocalDeployment, etcd: &str, port: u16) -> Result<tokio::process::Child> {
    let (args, link) = local_engine_argv(d, etcd, port);
    let mut cmd = tokio::process::Command::new(sidecar_binary());
    if let Some((name, target)) = link {
        let dir = std::env::temp_dir().join(format!("infera-up-{}-models", std::process::id()));
        link_model(&dir, &name, std::path::Path::new(&target))
            .with_context(|| format!("linking {name} to {target}"))?;
        cmd.current_dir(dir);
    }
    cmd.args(&args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of the calling (child) process;
    // it is async-signal-safe and touches no memory of the parent.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    cmd.spawn().with_context(|| {
        format!(
            "launching {} through infera-engine-sidecar",
            d.engine().as_str()
        )
    })
}

/// The tokenizer the gateway and the simulated workers share: the plan's, when it is on
/// this machine (a manifest written for a cluster may name a node's path, and a model
/// folder may hold no tokenizer), else none and both count bytes.
fn local_tokenizer(plan: &LocalPlan) -> Option<String> {
    let g = &plan.gateway;
    g.routing
        .tokenizer
        .as_ref()
        .map(|t| t.path(&g.model_path))
        .filter(|t| {
            let path = std::path::Path::new(t);
            path.join("tokenizer.json").is_file() || path.is_file()
        })
}

fn gateway_config(plan: &LocalPlan, host: &str, discovery: &Discovery) -> Result<GatewayConfig> {
    use clap::Parser;
    let mut routing = plan.gateway.routing.clone();
    routing.tokenizer = local_tokenizer(plan).map(Tokenizer::Absolute);
    let site = GatewaySite {
        host: host.into(),
        port: plan.gateway.port,
        lifecycle: vec!["--shutdown-grace-s".into(), "2".into()],
        discovery: match discovery {
            Discovery::Etcd(url) => vec![
                "--etcd-endpoint".into(),
                url.clone(),
                "--etcd-prefix".into(),
                run_prefix(),
            ],
            Discovery::InProcess => Vec::new(),
        },
        // Workers here publish KV events over ZMQ (the simulator, or a sidecar given no
        // NATS); a cluster's NATS is not what this machine reaches.
        messaging: Vec::new(),
        model_path: plan.gateway.model_path.clone(),
        // The folder is on this machine: read it.
        tokenizer_from_workers: None,
        access: Vec::new(),
    };
    let mut args = vec!["infera-gateway".to_owned()];
    args.extend(build_gateway_args(&routing, &site));
    GatewayConfig::try_parse_from(args).map_err(|e| anyhow!("gateway settings: {e}"))
}

/// Starts everything in `plan`, printing progress.
pub async fn start(plan: &LocalPlan, host: &str, discovery: Discovery) -> Result<LocalCluster> {
    let started = Instant::now();
    let registry = Registry::new();
    let kv_events = plan.gateway.routing.policy == RoutingPolicy::KvAware;
    // The simulated workers tokenize as the gateway does, so their KV events hash the
    // blocks the router looks up.
    let codec = Arc::new(match local_tokenizer(plan) {
        Some(path) => PromptCodec::load(std::path::Path::new(&path))
            .with_context(|| format!("loading the tokenizer {path}"))?,
        None => PromptCodec::bytes(),
    });
    let (stop_registrations, stop_rx) = watch::channel(false);
    let mut registrations = tokio::task::JoinSet::new();
    let mut workers = Vec::new();
    let total: usize = plan.deployments.iter().map(|d| d.workers.len()).sum();
    for d in &plan.deployments {
        let what = match d.launch {
            Launch::Simulated => format!("simulated {}", d.engine().as_str()),
            Launch::Engine => format!("{} (launched by the sidecar)", d.engine().as_str()),
        };
        println!(
            "deployment {}: model {}, {} {} worker(s){}",
            d.name(),
            d.model(),
            d.workers.len(),
            what,
            d.protocol()
                .map(|p| format!(", prefill/decode over {p}"))
                .unwrap_or_default()
        );
        for (i, role) in d.workers.iter().enumerate() {
            let t0 = Instant::now();
            let (record, sim, child) = match d.launch {
                Launch::Simulated => {
                    let (w, r) = start_sim_worker(d, *role, i, kv_events, &codec).await?;
                    (Some(r), Some(w), None)
                }
                Launch::Engine => {
                    let Discovery::Etcd(url) = &discovery else {
                        bail!("launching {} needs --etcd", d.engine().as_str());
                    };
                    let port = free_port()?;
                    (None, None, Some(launch_engine(d, url, port)?))
                }
            };
            let n = workers.len() + 1;
            if let Some(record) = &record {
                match &discovery {
                    Discovery::InProcess => {
                        registry.upsert(record.clone());
                    }
                    Discovery::Etcd(url) => {
                        let reg = Registration {
                            endpoints: vec![url.clone()],
                            key: build_worker_key(&run_prefix(), &record.worker_id),
                            // A record that never changes: the sender goes at once.
                            value: watch::channel(record.to_json()).1,
                            ttl: LEASE_TTL,
                            security: Default::default(),
                        };
                        let (state, _) = watch::channel(RegistrationState::default());
                        registrations.spawn(run_registration(reg, state, stop_rx.clone()));
                    }
                }
                println!(
                    "  [{n}/{total}] {} worker {} ready in {} ms",
                    role.as_str(),
                    record.worker_id,
                    t0.elapsed().as_millis()
                );
            } else {
                println!(
                    "  [{n}/{total}] {} engine launching (the sidecar registers it when healthy)",
                    role.as_str()
                );
            }
            workers.push(LocalWorker {
                deployment: d.name().to_owned(),
                role: *role,
                record,
                sim,
                child,
            });
        }
    }
    let cfg = gateway_config(plan, host, &discovery)?;
    let bind = format!("{host}:{}", plan.gateway.port);
    let listener = tokio::net::TcpListener::bind(&bind).await.map_err(|e| {
        anyhow!("the gateway cannot listen on {bind}: {e} (pass --port to choose another)")
    })?;
    let gateway = match &discovery {
        Discovery::InProcess => {
            registry.mark_synced();
            let gw = Gateway::new(cfg, registry).map_err(|e| anyhow!("{e}"))?;
            start_embedded(gw, listener)
                .await
                .map_err(|e| anyhow!("{e}"))?
        }
        Discovery::Etcd(_) => {
            let gw = Gateway::new(cfg, Registry::new()).map_err(|e| anyhow!("{e}"))?;
            start_gateway(gw, listener)
                .await
                .map_err(|e| anyhow!("{e}"))?
        }
    };
    let mut cluster = LocalCluster {
        gateway,
        workers,
        stop_registrations,
        registrations,
    };
    cluster
        .wait_routable(total, Duration::from_secs(1800))
        .await?;
    println!(
        "gateway routes to {total} worker(s), up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(cluster)
}

impl LocalCluster {
    /// Waits until the gateway has every worker in its routing tables.
    async fn wait_routable(&mut self, total: usize, budget: Duration) -> Result<()> {
        let deadline = Instant::now() + budget;
        let mut last = usize::MAX;
        loop {
            for w in &mut self.workers {
                if let Some(status) = w.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    bail!(
                        "the engine of deployment {} ({} worker) exited before it registered: {status} (its sidecar's log is above)",
                        w.deployment,
                        w.role.as_str()
                    );
                }
            }
            let n = self.gateway.gateway.registry.snapshot().workers.len();
            if n >= total && self.gateway.gateway.registry.is_synced() {
                return Ok(());
            }
            if n != last {
                if last != usize::MAX {
                    println!("  gateway sees {n}/{total} workers");
                }
                last = n;
            }
            if Instant::now() > deadline {
                bail!("only {n} of {total} workers registered within {budget:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The gateway's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.gateway.addr)
    }

    /// Stops the gateway, deregisters, stops workers and launched engines.
    pub async fn shutdown(mut self) {
        let _ = self.stop_registrations.send(true);
        while self.registrations.join_next().await.is_some() {}
        self.gateway.shutdown().await;
        for w in self.workers {
            if let Some(sim) = w.sim {
                sim.shutdown().await;
            }
            if let Some(mut child) = w.child {
                if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    // SAFETY: kill(2) on the sidecar's own pid; it drains and stops its engine.
                    #[allow(unsafe_code)]
                    unsafe {
                        libc::kill(pid, libc::SIGTERM);
                    }
                }
                let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
                let _ = child.kill().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `infera up`'s gateway routes as the operator's gateway of that manifest would:
    /// the tokenizer and the default retention were lost before the flags were built by
    /// one function.
    #[test]
    fn a_launched_atom_loads_its_served_name_and_listens_on_its_server_port() {
        use crate::up::manifest::parse_manifests;
        use crate::up::plan::{PlanOptions, plan};
        let manifest = "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: a}
spec:
  model: {name: org/m, source: {hostPath: {path: /models/m}}}
  engine: {kind: atom, image: x}
";
        let opts = PlanOptions {
            etcd: true,
            ..PlanOptions::default()
        };
        let local = plan(
            &parse_manifests(manifest, "a.yaml").unwrap(),
            &opts,
            &|_| true,
        )
        .unwrap();
        let (argv, link) = local_engine_argv(&local.deployments[0], "http://e:2379", 31000);
        assert_eq!(link, Some(("org/m".to_owned(), "/models/m".to_owned())));
        let tail = argv[7..].join(" ");
        assert_eq!(
            tail,
            "--model org/m --server-port 31000 --tensor-parallel-size 1"
        );
    }

    #[test]
    fn the_gateway_gets_the_flags_the_operator_renders() {
        use crate::up::manifest::parse_manifests;
        use crate::up::plan::{PlanOptions, plan};
        let dir = tempfile::tempdir().unwrap();
        let manifest = format!(
            "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: t}}
spec:
  model: {{name: m, tokenizer: tok, source: {{hostPath: {{path: {}}}}}}}
  engine: {{kind: sim}}
  kvCache: {{enabled: true, defaultRetention: short}}
  messaging: {{backend: nats, natsUrl: 'nats://127.0.0.1:4222'}}
",
            dir.path().display()
        );
        let local = plan(
            &parse_manifests(&manifest, "t.yaml").unwrap(),
            &PlanOptions::default(),
            &|_| false,
        )
        .unwrap();
        // The tokenizer is not there: counted in bytes by the gateway and workers.
        let cfg = gateway_config(&local, "127.0.0.1", &Discovery::InProcess).unwrap();
        assert_eq!(cfg.router_tokenizer_path, None);
        assert_eq!(
            cfg.default_retention,
            infera_gateway::config::RetentionArg::Short
        );
        // KV events arrive over ZMQ here, whatever the cluster's messaging.
        assert_eq!(cfg.nats_server, None);
        std::fs::create_dir(dir.path().join("tok")).unwrap();
        let cfg = gateway_config(&local, "127.0.0.1", &Discovery::InProcess).unwrap();
        assert_eq!(
            cfg.router_tokenizer_path, None,
            "a folder without tokenizer.json"
        );
        std::fs::write(dir.path().join("tok/tokenizer.json"), "{}").unwrap();
        let cfg = gateway_config(&local, "127.0.0.1", &Discovery::InProcess).unwrap();
        assert_eq!(cfg.router_tokenizer_path, Some(dir.path().join("tok")));
    }

    /// The records `infera up` registers (in-process or in etcd) are read back, by the
    /// gateway's parse, as what they were built to mean.
    #[test]
    fn sim_records_read_back_as_built() {
        let addr: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let check = |built: &WorkerRecord, protocol: Option<&str>| {
            let bytes = built.to_json();
            let read = WorkerRecord::from_json(bytes.as_bytes()).unwrap();
            assert_eq!(&read, built);
            assert_eq!(read.to_json(), bytes);
            assert_eq!(read.protocol(), protocol);
            assert_eq!(read.kv_block_size, Some(16));
            assert_eq!(read.route_targets().len(), 1);
        };
        let mixed = build_sim_record(
            addr,
            EngineKind::Vllm,
            "fixture-model",
            None,
            Some("tcp://127.0.0.1:5557"),
            16,
        )
        .unwrap();
        check(&mixed, None);
        assert_eq!(mixed.events_endpoint(), Some("tcp://127.0.0.1:5557"));
        for protocol in PdProtocol::ALL {
            let flavor = protocol.engine();
            for leg in [PdLeg::Prefill, PdLeg::Decode] {
                let role = loopback_pd_role(protocol, leg, 8000, "fixture-engine".into()).unwrap();
                let built =
                    build_sim_record(addr, flavor, "fixture-model", Some(&role), None, 16).unwrap();
                check(&built, Some(protocol.as_str()));
                // A decode may register `"params": {}` (SGLang's does, as before).
                let params = built.disagg_params().unwrap();
                assert!(leg == PdLeg::Decode || !params.is_empty(), "{protocol:?}");
            }
        }
    }
}
