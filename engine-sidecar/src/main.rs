//! The `infera-engine-sidecar` command (launch mode).
//!
//! Exit codes: 0 clean shutdown; 2 bad command line or configuration; 3 the engine never
//! became healthy; 4 the engine exited on its own.

use infera_engine_sidecar::cli::{CliError, parse_args};
use infera_engine_sidecar::engine::EngineProcess;
use infera_engine_sidecar::engine_args::read_engine_facts;
use infera_engine_sidecar::prepare::prepare_engine;
use infera_engine_sidecar::record::build_record;
use infera_engine_sidecar::registration::{Registration, RegistrationState, run_registration};
use infera_proto::discovery::build_worker_key;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    std::process::exit(run().await);
}

async fn run() -> i32 {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(CliError::Help) => {
            println!(
                "usage: infera-engine-sidecar <vllm|sglang|atom|sim> [infera flags] [engine flags]\n\n{}",
                infera_engine_sidecar::cli::USAGE
            );
            return 0;
        }
        Err(e) => {
            eprintln!("infera-engine-sidecar: {e}");
            return 2;
        }
    };
    let facts = match read_engine_facts(args.engine, &args.engine_args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("infera-engine-sidecar: {e}");
            return 2;
        }
    };
    let kv_port = match (args.enable_kv_events, facts.kv_events_port) {
        (false, _) => None,
        (true, Some(p)) => Some(p),
        (true, None) => free_port(),
    };
    // Refuse a configuration that cannot be registered before loading a model for minutes.
    if let Err(e) = build_record(&facts, &args.engine_args, &args.advertise_host, 16, kv_port) {
        eprintln!("infera-engine-sidecar: {e}");
        return 2;
    }
    let new_kv_port = kv_port.filter(|_| facts.kv_events_port.is_none());
    let gid_index = args.gid_index.or_else(|| {
        infera_engine_sidecar::gid::detect_gid_index(std::path::Path::new(&args.sysfs_root))
    });
    if gid_index.is_none() {
        tracing::info!(
            "no RoCEv2 GID found under {}; RDMA GID variables left unset",
            args.sysfs_root
        );
    }
    let prepared = prepare_engine(
        args.engine,
        &args.engine_args,
        &args.sim_binary,
        new_kv_port,
        gid_index,
    );
    for note in &prepared.notes {
        tracing::info!("engine preparation: {note}");
    }
    tracing::info!("launching {} {}", prepared.program, prepared.args.join(" "));
    let mut engine =
        match EngineProcess::launch(&prepared, format!("http://127.0.0.1:{}", facts.port)) {
            Ok(e) => e,
            Err(e) => {
                eprintln!(
                    "infera-engine-sidecar: cannot start {}: {e}",
                    prepared.program
                );
                return 2;
            }
        };
    if let Err(e) = engine.wait_healthy(args.health_timeout).await {
        eprintln!("infera-engine-sidecar: {e}");
        engine.stop(Duration::from_secs(10)).await;
        return 3;
    }
    let block_size = match facts.block_size {
        Some(bs) => bs,
        None => engine.resolved_block_size().await.unwrap_or_else(|| {
            tracing::warn!("the engine reports no page size; registering kv_block_size 16");
            16
        }),
    };
    let record = match build_record(
        &facts,
        &args.engine_args,
        &args.advertise_host,
        block_size,
        kv_port,
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("infera-engine-sidecar: {e}");
            engine.stop(Duration::from_secs(10)).await;
            return 2;
        }
    };
    let (stop, stop_rx) = watch::channel(false);
    let mut relays = tokio::task::JoinSet::new();
    // The relay outlives the registration: events of the drain still reach routers.
    let (relay_stop, relay_stop_rx) = watch::channel(false);
    if let (Some(url), Some(port)) = (&args.relay_nats, kv_port) {
        match infera_engine_sidecar::relay::connect_jetstream(url).await {
            Ok(js) => {
                let counters =
                    std::sync::Arc::new(infera_engine_sidecar::relay::RelayCounters::default());
                for rank in 0..record.dp_size.max(1) {
                    let endpoint = format!("tcp://127.0.0.1:{}", u32::from(port) + rank);
                    relays.spawn(infera_engine_sidecar::relay::relay_rank(
                        endpoint,
                        record.worker_id.clone(),
                        rank,
                        js.clone(),
                        counters.clone(),
                        relay_stop_rx.clone(),
                    ));
                }
            }
            Err(e) => {
                eprintln!("infera-engine-sidecar: {e}");
                engine.stop(Duration::from_secs(10)).await;
                return 2;
            }
        }
    }
    let (state, mut state_rx) = watch::channel(RegistrationState::default());
    let registration = tokio::spawn(run_registration(
        Registration {
            endpoints: args.etcd_endpoints.clone(),
            key: build_worker_key(&args.etcd_prefix, &record.worker_id),
            value: record.to_json(),
            ttl: args.lease_ttl,
        },
        state,
        stop_rx,
    ));
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("infera-engine-sidecar: cannot install signal handlers");
        return 2;
    };
    let engine_died = loop {
        tokio::select! {
            _ = term.recv() => break false,
            _ = int.recv() => break false,
            _ = state_rx.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                if let Some(status) = engine.exited() {
                    tracing::error!("the engine exited with {status}; deregistering");
                    break true;
                }
            }
        }
    };
    // Deregister first, so routers stop sending before the engine goes away.
    let _ = stop.send(true);
    let _ = registration.await;
    if engine_died {
        let _ = relay_stop.send(true);
        while relays.join_next().await.is_some() {}
        return 4;
    }
    tracing::info!("draining (up to {:?})", args.drain_timeout);
    if !engine
        .drain(Duration::from_millis(500), args.drain_timeout)
        .await
    {
        tracing::warn!("requests were still running after {:?}", args.drain_timeout);
    }
    let _ = relay_stop.send(true);
    while relays.join_next().await.is_some() {}
    let status = engine.stop(Duration::from_secs(10)).await;
    tracing::info!("engine stopped ({status:?})");
    0
}
