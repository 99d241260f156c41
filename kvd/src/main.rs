//! The `infera-kvd` command: the daemon, and `infera-kvd stats`.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use infera_kvd::arena::{Arena, ArenaOptions};
use infera_kvd::client::{Client, field, request_map};
use infera_kvd::daemon::Daemon;
use infera_kvd::server::{Limits, bind, serve};
use infera_kvd::store::Store;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};

/// The KV-cache daemon: engines offload KV blocks over a Unix socket (length-prefixed
/// msgpack, the earlier daemon's protocol) and read them in place from a shared memfd
/// arena. Sizes are in bytes.
#[derive(Debug, Parser)]
#[command(name = "infera-kvd", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Unix socket to serve (owner-only).
    #[arg(
        long,
        env = "INFERA_KVD_SOCKET",
        default_value = "/tmp/infera-kvd.sock",
        global = true
    )]
    socket: PathBuf,
    /// Most bytes held in RAM (arena slots and values larger than a slot).
    #[arg(long, default_value_t = 1 << 30)]
    max_bytes: u64,
    /// Size of the shared arena (0: none; values are then answered inline). Default:
    /// --max-bytes.
    #[arg(long)]
    shared_arena_bytes: Option<u64>,
    /// Largest value accepted.
    #[arg(long, default_value_t = 64 << 20)]
    max_value_bytes: usize,
    /// Back the arena with huge pages.
    #[arg(long)]
    hugetlb: bool,
    /// Lock the arena in RAM.
    #[arg(long)]
    mlock: bool,
    /// Address of /metrics (empty: off).
    #[arg(long, default_value = "0.0.0.0:9401")]
    metrics_addr: String,
    /// Also accept clients running as this uid (repeatable; the daemon's own user is
    /// always accepted). Engines of vendor images run as root: `--allow-uid 0`.
    #[arg(long)]
    allow_uid: Vec<u32>,
    /// Name in hello_ack.
    #[arg(long, default_value = "infera-kvd")]
    server_id: String,
    /// Log lines as JSON.
    #[arg(long)]
    log_json: bool,
    /// L3 directory for `long` entries (not available yet: the NVMe tier).
    #[arg(long)]
    long_path: Vec<PathBuf>,
    /// L3 directories, comma-separated (not available yet).
    #[arg(long, value_delimiter = ',')]
    long_paths: Vec<PathBuf>,
    /// L3 budget (not available yet).
    #[arg(long)]
    long_bytes: Option<u64>,
    /// L3/L4 backend (not available yet).
    #[arg(long)]
    long_backend: Option<String>,
    /// L3 I/O mode (not available yet).
    #[arg(long)]
    io_mode: Option<String>,
    /// Distributed tier URL (not available yet).
    #[arg(long)]
    remote_url: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the daemon's counters (as JSON) and exit.
    Stats,
}

fn stats(cli: &Cli) -> Result<()> {
    let mut c = Client::connect(&cli.socket, "infera-kvd-stats", false)
        .with_context(|| format!("connecting to {}", cli.socket.display()))?;
    let reply = c.request(&request_map("stats", vec![]))?;
    let mut out = serde_json::Map::new();
    for name in [
        "entries",
        "host_bytes",
        "spillover_bytes",
        "long_bytes",
        "gets_total",
        "sets_total",
        "hits_total",
        "misses_total",
        "evictions_total",
    ] {
        out.insert(
            name.into(),
            field(&reply, name)
                .and_then(rmpv::Value::as_u64)
                .unwrap_or(0)
                .into(),
        );
    }
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}

fn warn_unavailable(cli: &Cli) {
    let given: Vec<&str> = [
        (
            !cli.long_path.is_empty() || !cli.long_paths.is_empty(),
            "--long-path(s)",
        ),
        (cli.long_bytes.is_some(), "--long-bytes"),
        (cli.long_backend.is_some(), "--long-backend"),
        (cli.io_mode.is_some(), "--io-mode"),
        (cli.remote_url.is_some(), "--remote-url"),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .map(|(_, name)| name)
    .collect();
    if !given.is_empty() {
        tracing::warn!(
            "{}: the NVMe and distributed tiers are not available yet in this build; serving from RAM only",
            given.join(", ")
        );
    }
}

async fn serve_metrics(addr: SocketAddr, daemon: Arc<Daemon>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --metrics-addr {addr}"))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let d = daemon.clone();
            async move {
                let (stats, leases, slot) = {
                    let s = d.store();
                    (s.stats(), s.leases(), s.slot_size())
                };
                d.metrics.render(&stats, leases, slot)
            }
        }),
    );
    tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server: {e}");
        }
    });
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    warn_unavailable(&cli);
    let arena_bytes = cli.shared_arena_bytes.unwrap_or(cli.max_bytes);
    if arena_bytes > cli.max_bytes {
        bail!(
            "--shared-arena-bytes {arena_bytes} exceeds --max-bytes {}: the arena is part of the RAM budget",
            cli.max_bytes
        );
    }
    let arena = if arena_bytes > 0 {
        let options = ArenaOptions {
            hugetlb: cli.hugetlb,
            mlock: cli.mlock,
        };
        Some(
            Arena::create(usize::try_from(arena_bytes)?, options).with_context(|| {
                format!(
                    "creating a {arena_bytes}-byte arena (hugetlb {}, mlock {})",
                    cli.hugetlb, cli.mlock
                )
            })?,
        )
    } else {
        None
    };
    let mut daemon = Daemon::new(
        Store::new(cli.max_bytes, arena),
        cli.server_id.clone(),
        cli.max_value_bytes,
    );
    daemon.allowed_uids = cli.allow_uid.clone();
    let daemon = Arc::new(daemon);
    if !cli.metrics_addr.is_empty() {
        let addr: SocketAddr = cli
            .metrics_addr
            .parse()
            .with_context(|| format!("--metrics-addr {:?}", cli.metrics_addr))?;
        serve_metrics(addr, daemon.clone()).await?;
    }
    let listener =
        bind(&cli.socket).with_context(|| format!("binding {}", cli.socket.display()))?;
    tracing::info!(socket = %cli.socket.display(), max_bytes = cli.max_bytes, arena_bytes, "kvd serving");
    let limits = Limits {
        max_value: cli.max_value_bytes,
        max_frame: cli.max_value_bytes.saturating_add(1 << 20),
    };
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    serve(listener, daemon, limits, shutdown).await;
    let _ = std::fs::remove_file(&cli.socket);
    tracing::info!("kvd stopped");
    Ok(())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if cli.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match cli.command {
        Some(Command::Stats) => stats(&cli),
        None => run(cli).await,
    };
    if let Err(e) = result {
        eprintln!("infera-kvd: {e:#}");
        std::process::exit(2);
    }
}
