//! The `infera-engine-sidecar` command.
//!
//! Exit codes: 0 clean shutdown; 2 bad command line or configuration; 3 the engine never
//! became healthy; 4 the engine exited, or stopped answering `/health`, on its own.

use infera_engine_prep::Launch;
use infera_engine_prep::prepare::{ATOM_KV_EVENTS_ENV, PrepareInput, prepare_engine};
use infera_engine_sidecar::cli::{CliError, SidecarArgs, USAGE, parse_args};
use infera_engine_sidecar::disagg::{DisaggRole, detect_role, preflight};
use infera_engine_sidecar::engine::EngineProcess;
use infera_engine_sidecar::engine_args::read_engine_facts;
use infera_engine_sidecar::kvd_watch;
use infera_engine_sidecar::node_env::{self, NodeEnvArgs, run_node_env};
use infera_engine_sidecar::prefetch::build_prefetch_router;
use infera_engine_sidecar::record::build_record;
use infera_engine_sidecar::registration::{Registration, RegistrationState, run_registration};
use infera_engine_sidecar::relay::{RelayCounters, connect_jetstream, relay_rank};
use infera_engine_sidecar::request_plane::RequestServer;
use infera_engine_sidecar::status::{SidecarStatus, build_status_router};
use infera_engine_sidecar::tokenizer_files::{LocalTokenizer, build_tokenizer_router};
use infera_proto::discovery::build_worker_key;
use infera_proto::worker::{RequestTransport, WorkerRecord};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Consecutive failed health checks (each bounded by 5 s) after which the engine counts
/// as gone: launched (a hung process, e.g. stopped or deadlocked, never exits) or attached.
const HEALTH_FAILURES: u32 = 3;

fn free_port() -> Option<u16> {
    std::net::TcpListener::bind("0.0.0.0:0")
        .ok()?
        .local_addr()
        .ok()
        .map(|a| a.port())
}

// Single-threaded: the engine's death signal (PR_SET_PDEATHSIG) is tied to the thread
// that spawned it, which must live as long as the sidecar.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera-engine-sidecar",
        default_filter: "info".into(),
        ..Default::default()
    });
    if let Err(e) = &telemetry {
        eprintln!("infera-engine-sidecar: {e}");
    }
    std::process::exit(run().await);
}

/// `node-env`: the engine pod's init container (see `node_env`).
fn node_env(argv: &[String]) -> i32 {
    use clap::Parser;
    let args = match NodeEnvArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match run_node_env(&args) {
        Ok(text) => {
            eprintln!(
                "infera-engine-sidecar node-env: wrote {}:\n{text}",
                args.out.display()
            );
            0
        }
        Err(e) => fail(format!("node-env: {e}"), 2),
    }
}

fn fail(message: impl std::fmt::Display, code: i32) -> i32 {
    eprintln!("infera-engine-sidecar: {message}");
    code
}

/// Starts the engine (launch mode) or finds it (attach mode) and waits until healthy.
async fn start_engine(
    args: &SidecarArgs,
    port: u16,
    new_kv_port: Option<u16>,
) -> Result<EngineProcess, i32> {
    let base_url = format!("http://127.0.0.1:{port}");
    let mut engine = if args.attach {
        tracing::info!("attach mode: waiting for the engine at {base_url}");
        EngineProcess::attach(base_url)
    } else {
        // The node's RDMA facts, read once, as the init container reads them for a pod.
        let mut facts = node_env::read_node(
            std::path::Path::new(&args.sysfs_root),
            std::path::Path::new("/proc/modules"),
            &node_env::is_local_address,
        );
        if args.gid_index.is_some() {
            facts.gid_index = args.gid_index;
        }
        let gid_index = facts.gid_index;
        if gid_index.is_none() {
            tracing::info!(
                "no RoCEv2 GID found under {}; RDMA variables left unset",
                args.sysfs_root
            );
        }
        let mut prepared = prepare_engine(&PrepareInput {
            launch: args.engine,
            args: &args.engine_args,
            sim_binary: &args.sim_binary,
            kv_events_port: new_kv_port,
            gid_index,
            env_is_set: &|name| std::env::var_os(name).is_some(),
        });
        if let (Launch::Engine(engine), Some(_)) = (args.engine, gid_index) {
            let settings = node_env::build_settings(engine, true, &facts);
            let (add, remove) = node_env::apply(&settings, &|n| {
                prepared
                    .env
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, v)| v.clone())
                    .or_else(|| std::env::var(n).ok())
            });
            for (name, value) in add {
                prepared
                    .notes
                    .push(format!("set {name}={value} (from this node)"));
                prepared.env.push((name, value));
            }
            prepared.unset.extend(remove);
        }
        for note in &prepared.notes {
            tracing::info!("engine preparation: {note}");
        }
        tracing::info!("launching {} {}", prepared.program, prepared.args.join(" "));
        EngineProcess::launch(&prepared, base_url)
            .map_err(|e| fail(format!("cannot start {}: {e}", prepared.program), 2))?
    };
    if let Err(e) = engine.wait_healthy(args.health_timeout).await {
        engine.stop(Duration::from_secs(10)).await;
        return Err(fail(e, 3));
    }
    Ok(engine)
}

/// Relays KV events to JetStream, one task per data-parallel rank.
async fn start_relays(
    args: &SidecarArgs,
    record: &WorkerRecord,
    kv_port: Option<u16>,
    stop: &watch::Receiver<bool>,
    status: &Arc<SidecarStatus>,
) -> Result<JoinSet<()>, String> {
    let mut relays = JoinSet::new();
    let (Some(url), Some(port)) = (&args.relay_nats, kv_port) else {
        return Ok(relays);
    };
    let js = connect_jetstream(url).await?;
    let counters = Arc::new(RelayCounters::default());
    for rank in 0..record.dp_ranks() {
        let endpoint = format!("tcp://127.0.0.1:{}", u32::from(port) + rank);
        relays.spawn(relay_rank(
            endpoint,
            record.worker_id.clone(),
            rank,
            js.clone(),
            counters.clone(),
            stop.clone(),
        ));
    }
    let (counters, status) = (counters, status.clone());
    relays.spawn(async move {
        loop {
            status
                .relayed
                .store(counters.relayed.load(Ordering::Relaxed), Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    Ok(relays)
}

/// Registers in etcd (see [`run_registration`]) or in the Pod's annotation, unless
/// `skip` (a follower node of a multi-node worker), which only waits for the stop.
async fn run_registration_unless(
    skip: bool,
    pod: Option<(String, String)>,
    reg: Registration,
    state: watch::Sender<RegistrationState>,
    mut stop: watch::Receiver<bool>,
) {
    match (skip, pod) {
        (true, _) => {
            let _ = stop.wait_for(|s| *s).await;
        }
        (false, Some((namespace, name))) => {
            let target = infera_engine_sidecar::annotation::PodTarget { namespace, name };
            infera_engine_sidecar::annotation::run_annotation(target, reg.value, state, stop).await;
        }
        (false, None) => run_registration(reg, state, stop).await,
    }
}

/// vLLM connectors need an `engine_id` that the record and the engine agree on: pin one
/// into the engine's `--kv-transfer-config` when the user gave none (launch mode).
fn pin_engine_id(role: &mut DisaggRole, args: &mut SidecarArgs, port: u16) {
    if !role.protocol.starts_with("vllm-") || role.transfer_config.get("engine_id").is_some() {
        return;
    }
    if args.attach {
        tracing::warn!(
            "attach mode: the engine's --kv-transfer-config has no engine_id; the record's engine_id is null"
        );
        return;
    }
    let engine_id = format!("infera-{}-{port}", args.advertise_host);
    if let Some(map) = role.transfer_config.as_object_mut() {
        map.insert(
            "engine_id".into(),
            serde_json::Value::from(engine_id.clone()),
        );
    }
    let config = role.transfer_config.to_string();
    if let Some(pos) = args
        .engine_args
        .iter()
        .position(|a| a == "--kv-transfer-config")
    {
        if let Some(v) = args.engine_args.get_mut(pos + 1) {
            *v = config;
        }
    } else if let Some(a) = args
        .engine_args
        .iter_mut()
        .find(|a| a.starts_with("--kv-transfer-config="))
    {
        *a = format!("--kv-transfer-config={config}");
    }
    tracing::info!("engine preparation: pinned the vLLM connector engine_id {engine_id}");
}

async fn run() -> i32 {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().is_some_and(|a| a == "node-env") {
        return node_env(&argv);
    }
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(CliError::Help) => {
            println!(
                "usage: infera-engine-sidecar <vllm|sglang|atom|sim> [infera flags] [engine flags]\n\n{USAGE}"
            );
            return 0;
        }
        Err(e) => return fail(e, 2),
    };
    if args.attach && args.status_port == 0 {
        return fail(
            "--attach needs --status-port: the engine's preStop hook calls /drain there",
            2,
        );
    }
    let mut facts = match read_engine_facts(args.engine, &args.engine_args) {
        Ok(f) => f,
        Err(e) => return fail(e, 2),
    };
    if args.engine == Launch::Engine(infera_proto::worker::EngineKind::Atom)
        && facts.kv_events_port.is_none()
    {
        // ATOM has no KV-event flag: the operator names the endpoint in the environment.
        facts.kv_events_port = std::env::var(ATOM_KV_EVENTS_ENV)
            .ok()
            .and_then(|e| infera_engine_sidecar::engine_args::endpoint_port(&e));
    }
    // Attached engines were configured by the operator; a launched one gets a port.
    let kv_port = match (args.enable_kv_events, facts.kv_events_port, args.attach) {
        (false, _, _) => None,
        (true, Some(p), _) => Some(p),
        (true, None, true) => None,
        (true, None, false) => free_port(),
    };
    // Refuse what cannot work before loading a model for minutes.
    let moriio_read =
        std::env::var("VLLM_MORIIO_CONNECTOR_READ_MODE").is_ok_and(|v| v == "1" || v == "true");
    let mut role = match detect_role(facts.kind, &args.engine_args, moriio_read) {
        Ok(r) => r,
        Err(e) => return fail(e, 2),
    };
    let mut args = args;
    if let Some(role) = role.as_mut() {
        if let Err(e) = preflight(role, &args.advertise_host, args.disaggregation_allow_tcp) {
            return fail(e, 2);
        }
        pin_engine_id(role, &mut args, facts.port);
    }
    let tokenizer = match infera_engine_sidecar::tokenizer_id::tokenizer_location(&args.engine_args)
    {
        Some(path) => match infera_engine_sidecar::tokenizer_id::read_identity(&path) {
            Ok(t) if t.tiktoken_only => {
                tracing::warn!(
                    "tokenizer {}: a tiktoken vocabulary without tokenizer.json (digest {}): \
                     the record reports tokenizer_format tiktoken and carries no canary; \
                     gateways hash this model's prompts as bytes, so prefix routing misses",
                    path.display(),
                    t.digest
                );
                Some(t)
            }
            Ok(t) => {
                tracing::info!(
                    "tokenizer {}: digest {}, canary of {} tokens",
                    path.display(),
                    t.digest,
                    t.canary.len()
                );
                Some(t)
            }
            Err(e) => {
                return fail(
                    format!("reading the tokenizer at {}: {e}", path.display()),
                    2,
                );
            }
        },
        None => {
            tracing::info!(
                "no local tokenizer in the engine flags: the record carries no tokenizer canary"
            );
            None
        }
    };
    if let Err(e) = build_record(
        &facts,
        role.as_ref(),
        &args.advertise_host,
        16,
        kv_port,
        tokenizer.as_ref(),
    ) {
        return fail(e, 2);
    }
    let status = SidecarStatus::new(args.drain_token.clone());
    let (status_stop, mut status_stop_rx) = watch::channel(false);
    let mut status_server = None;
    if args.status_port != 0 {
        let listener = match tokio::net::TcpListener::bind(("0.0.0.0", args.status_port)).await {
            Ok(l) => l,
            Err(e) => {
                return fail(
                    format!("binding --status-port {}: {e}", args.status_port),
                    2,
                );
            }
        };
        let served = tokenizer.as_ref().map(|t| LocalTokenizer {
            path: t.path.clone(),
            digest: t.digest.clone(),
        });
        let router = build_status_router(status.clone())
            .merge(build_tokenizer_router(served))
            .merge(build_prefetch_router(
                args.kvd_socket.clone(),
                args.drain_token.clone(),
            ));
        status_server = Some(tokio::spawn(async move {
            let shutdown = async move {
                let _ = status_stop_rx.wait_for(|s| *s).await;
            };
            let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
            if let Err(e) = axum::serve(listener, service)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!("status server: {e}");
            }
        }));
    }
    let new_kv_port = kv_port.filter(|_| facts.kv_events_port.is_none());
    let mut engine = match start_engine(&args, facts.port, new_kv_port).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    let block_size = match facts.block_size {
        Some(bs) => bs,
        None => engine.resolved_block_size().await.unwrap_or_else(|| {
            tracing::warn!("the engine reports no page size; registering kv_block_size 16");
            16
        }),
    };
    let mut record = match build_record(
        &facts,
        role.as_ref(),
        &args.advertise_host,
        block_size,
        kv_port,
        tokenizer.as_ref(),
    ) {
        Ok(r) => r,
        Err(e) => {
            engine.stop(Duration::from_secs(10)).await;
            return fail(e, 2);
        }
    };
    if let Some(revision) = &args.revision {
        record.set_revision(revision);
    }
    // Serving the subject before registering: a gateway that sees the record can send.
    let plane = match &args.request_plane {
        Some(settings) => {
            let engine_url = format!("http://127.0.0.1:{}", facts.port);
            match RequestServer::start(settings, &record.worker_id, &engine_url).await {
                Ok(server) => {
                    record.request_transport = RequestTransport::Nats;
                    Some(server)
                }
                Err(e) => {
                    engine.stop(Duration::from_secs(10)).await;
                    return fail(e, 2);
                }
            }
        }
        None => None,
    };
    let (stop, stop_rx) = watch::channel(false);
    let (relay_stop, relay_stop_rx) = watch::channel(false);
    let mut relays = match start_relays(&args, &record, kv_port, &relay_stop_rx, &status).await {
        Ok(r) => r,
        Err(e) => {
            engine.stop(Duration::from_secs(10)).await;
            return fail(e, 2);
        }
    };
    let rank = infera_engine_sidecar::engine_args::node_rank(
        &args.engine_args,
        std::env::var("LWS_WORKER_INDEX").ok().as_deref(),
    );
    // The tiers below the engine, declared while the kvd beside it answers.
    let bare = record.to_json();
    if args.kv_tiers.any() {
        args.kv_tiers.declare_on(&mut record);
    }
    let (record_tx, record_rx) = watch::channel(record.to_json());
    if let Some(socket) = args.kvd_socket.clone().filter(|_| args.kv_tiers.any()) {
        tokio::spawn(kvd_watch::watch_kvd(
            socket,
            kvd_watch::TieredRecord {
                with_tiers: record.to_json(),
                without_tiers: bare,
            },
            record_tx,
            stop_rx.clone(),
        ));
    }
    let (state, mut state_rx) = watch::channel(RegistrationState::default());
    if rank != 0 {
        tracing::info!("node rank {rank}: only rank 0 of a multi-node worker registers");
    }
    let registration = tokio::spawn(run_registration_unless(
        rank != 0,
        args.kubernetes_pod.clone(),
        Registration {
            endpoints: args.etcd_endpoints.clone(),
            key: build_worker_key(&args.etcd_prefix, &record.worker_id),
            value: record_rx,
            ttl: args.lease_ttl,
            security: args.etcd_security.clone(),
        },
        state,
        stop_rx,
    ));
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return fail("cannot install signal handlers", 2);
    };
    let mut health_failures = 0;
    let mut drain_via_http = false;
    let engine_died = loop {
        tokio::select! {
            _ = term.recv() => break false,
            _ = int.recv() => break false,
            _ = status.drain_requested.notified() => { drain_via_http = true; break false }
            _ = state_rx.changed() => {
                let current = *state_rx.borrow();
                status.set_registered(current.registered, current.registrations);
            }
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                if let Some(code) = engine.exited() {
                    tracing::error!("the engine exited with {code}; deregistering");
                    break true;
                }
                health_failures = if engine.is_healthy().await { 0 } else { health_failures + 1 };
                if health_failures >= HEALTH_FAILURES {
                    tracing::error!(
                        "the engine failed {HEALTH_FAILURES} health checks in a row (hung?); deregistering and stopping it"
                    );
                    break true;
                }
            }
        }
    };
    // Deregister first, so routers stop sending before the engine goes away.
    status.draining.store(true, Ordering::SeqCst);
    let _ = stop.send(true);
    let _ = registration.await;
    status.registered.store(false, Ordering::SeqCst);
    // One drain window for the NATS requests and the engine's own.
    let drain_deadline = std::time::Instant::now() + args.drain_timeout;
    if let Some(plane) = plane {
        // Migratable requests go back to the gateway at once; the others get the window.
        let window = (!engine_died).then_some(args.drain_timeout);
        plane.stop(window).await;
    }
    if !engine_died {
        let left = drain_deadline.saturating_duration_since(std::time::Instant::now());
        tracing::info!("draining (up to {left:?})");
        if !engine.drain(Duration::from_millis(500), left).await {
            tracing::warn!("requests were still running after {:?}", args.drain_timeout);
        }
    }
    let _ = relay_stop.send(true);
    relays.abort_all();
    while relays.join_next().await.is_some() {}
    if let Some(code) = engine.stop(Duration::from_secs(10)).await {
        tracing::info!("engine stopped ({code})");
    }
    status.drained.send_replace(true);
    if drain_via_http {
        // Attached: the engine container stops next; stay (draining) until Kubernetes
        // stops this sidecar too, so a restart policy never brings it back mid-drain.
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    let _ = status_stop.send(true);
    if let Some(server) = status_server {
        let _ = server.await;
    }
    if engine_died { 4 } else { 0 }
}
