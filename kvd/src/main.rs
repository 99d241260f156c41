//! The `infera-kvd` command: the daemon, and `infera-kvd stats`.

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use infera_kvd::arena::{Arena, ArenaOptions};
use infera_kvd::client::{Client, field, request_map};
use infera_kvd::daemon::Daemon;
use infera_kvd::disk::device::IoMode;
use infera_kvd::disk::{Disk, DiskOptions};
use infera_kvd::lower::Lower;
use infera_kvd::metrics::StoreView;
use infera_kvd::remote::{self, Remote, RemoteOptions};
use infera_kvd::server::{Limits, bind, serve};
use infera_kvd::store::Store;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

/// The KV-cache daemon: engines offload KV blocks over a Unix socket (length-prefixed
/// msgpack, the earlier daemon's protocol) and read them in place from a shared memfd
/// arena. Sizes are in bytes.
#[derive(Debug, Parser)]
#[command(name = "infera-kvd", version, about, long_about = None, args_override_self = true)]
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
    /// Address of /metrics (empty: off). Loopback unless told otherwise: the operator
    /// gives `0.0.0.0:9401` so its PodMonitor can scrape the pod.
    #[arg(long, default_value = "127.0.0.1:9401")]
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
    /// L3 (NVMe tier): a directory for `long` entries, one per device (repeatable;
    /// entries are striped over them by key hash). Each holds a pre-allocated container
    /// file, a journal and a metadata file.
    #[arg(long, help_heading = "NVMe tier (L3)")]
    long_path: Vec<PathBuf>,
    /// L3 directories, comma-separated (added to --long-path).
    #[arg(long, value_delimiter = ',', help_heading = "NVMe tier (L3)")]
    long_paths: Vec<PathBuf>,
    /// L3 container bytes over all devices, split evenly. Default: an existing
    /// container's size, else half of each filesystem's free space.
    #[arg(long, help_heading = "NVMe tier (L3)")]
    long_bytes: Option<u64>,
    /// Free bytes the L3 leaves on each filesystem: the container is sized below it, and
    /// writes stop (counted as `below_floor`) while the filesystem is under it.
    #[arg(long, default_value_t = 1 << 30, help_heading = "NVMe tier (L3)")]
    long_min_free_bytes: u64,
    /// L3 slot size. Default: the first `long` value's size, rounded up to 4 KiB (values
    /// larger than a slot stay in RAM and L4).
    #[arg(long, help_heading = "NVMe tier (L3)")]
    long_slot_bytes: Option<u64>,
    /// Most bytes waiting to be written to each L3 device (more are dropped, counted).
    #[arg(long, default_value_t = 512 << 20, help_heading = "NVMe tier (L3)")]
    long_queue_bytes: u64,
    /// L3 backend: `file` (container files on local disks) is the only one.
    #[arg(long, default_value = "file", help_heading = "NVMe tier (L3)")]
    long_backend: String,
    /// L3 I/O: `auto` (O_DIRECT where the filesystem allows, else buffered with a
    /// warning; ramfs, older tmpfs and some overlay or FUSE mounts refuse it), `direct` (refuse to start without it) or
    /// `buffered`.
    #[arg(long, default_value = "auto", help_heading = "NVMe tier (L3)")]
    io_mode: IoMode,
    /// L4 (distributed tier): `redis://[user[:password]@]host[:port][/db]` or
    /// `valkey://...`. `long` entries are written behind; misses are read through. From
    /// the environment, a password stays off the command line.
    #[arg(
        long,
        env = "INFERA_KVD_REMOTE_URL",
        hide_env_values = true,
        help_heading = "Distributed tier (L4)"
    )]
    remote_url: Option<String>,
    /// First part of every L4 key (`<namespace>:<model>:<compat_key>:<key hex>`); one per
    /// fleet sharing a store.
    #[arg(
        long,
        default_value = "infera-kvd",
        help_heading = "Distributed tier (L4)"
    )]
    remote_namespace: String,
    /// Longest an L4 call may take; past it the lookup is a miss (counted).
    #[arg(long, default_value_t = 250, help_heading = "Distributed tier (L4)")]
    remote_timeout_ms: u64,
    /// After an L4 failure, how long the store is skipped (lookups miss at once).
    #[arg(long, default_value_t = 1000, help_heading = "Distributed tier (L4)")]
    remote_retry_ms: u64,
    /// Most bytes waiting to be written behind to L4 (more are dropped, counted).
    #[arg(long, default_value_t = 512 << 20, help_heading = "Distributed tier (L4)")]
    remote_queue_bytes: u64,
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

fn open_lower(cli: &Cli) -> Result<Lower> {
    let paths: Vec<PathBuf> = cli
        .long_path
        .iter()
        .chain(&cli.long_paths)
        .cloned()
        .collect();
    if cli.long_backend != "file" {
        bail!(
            "--long-backend {:?}: the NVMe tier's only backend is `file`; a distributed store is --remote-url",
            cli.long_backend
        );
    }
    let disk = if paths.is_empty() {
        None
    } else {
        Some(Arc::new(Disk::open(&DiskOptions {
            paths,
            bytes: cli.long_bytes,
            min_free: cli.long_min_free_bytes,
            io: cli.io_mode,
            slot_bytes: cli.long_slot_bytes,
            queue_bytes: cli.long_queue_bytes,
            compact_min_bytes: infera_kvd::disk::COMPACT_MIN,
        })?))
    };
    let remote = match &cli.remote_url {
        None => None,
        Some(_) if cli.remote_timeout_ms == 0 => {
            bail!(
                "--remote-timeout-ms 0: every lookup would time out; give the longest wait an engine can afford (default 250)"
            )
        }
        Some(url) => {
            let backend = remote::open(url, Duration::from_millis(cli.remote_timeout_ms))
                .map_err(|e| anyhow!("--remote-url: {e}"))?;
            let r = Remote::new(
                backend,
                RemoteOptions {
                    namespace: cli.remote_namespace.clone(),
                    retry_after: Duration::from_millis(cli.remote_retry_ms),
                    queue_bytes: cli.remote_queue_bytes,
                },
            );
            tracing::info!(store = %r.describe(), namespace = %cli.remote_namespace, timeout_ms = cli.remote_timeout_ms, "distributed tier");
            Some(Arc::new(r))
        }
    };
    Ok(Lower { disk, remote })
}

/// Starts the background threads: one writer per NVMe device, the distributed tier's
/// writer, the prefetcher.
fn start_workers(daemon: &Arc<Daemon>) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let mut handles = Vec::new();
    let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .context("starting a kvd worker thread")
    };
    if let Some(disk) = &daemon.lower.disk {
        for device in 0..disk.devices() {
            let disk = disk.clone();
            handles.push(spawn(
                format!("kvd-l3-{device}"),
                Box::new(move || disk.run_writer(device)),
            )?);
        }
    }
    if let Some(remote) = &daemon.lower.remote {
        let remote = remote.clone();
        handles.push(spawn(
            "kvd-l4".into(),
            Box::new(move || remote.run_writer()),
        )?);
    }
    let d = daemon.clone();
    handles.push(spawn(
        "kvd-prefetch".into(),
        Box::new(move || d.run_prefetcher()),
    )?);
    Ok(handles)
}

/// Lets the workers finish queued writes, for at most `limit`.
async fn drain(handles: Vec<std::thread::JoinHandle<()>>, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while handles.iter().any(|h| !h.is_finished()) {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("stopping with writes still queued for the slower tiers");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
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
                let store = {
                    let s = d.store();
                    StoreView {
                        stats: s.stats(),
                        leases: s.leases(),
                        slot_size: s.slot_size(),
                    }
                };
                let text = d.metrics.render(&store, &d.lower, &d.prefetched);
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        infera_telemetry::metrics::CONTENT_TYPE,
                    )],
                    text,
                )
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
    let daemon = Arc::new(daemon.with_lower(open_lower(&cli)?));
    let workers = start_workers(&daemon)?;
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
    serve(listener, daemon.clone(), limits, shutdown).await;
    let _ = std::fs::remove_file(&cli.socket);
    daemon.close();
    drain(workers, Duration::from_secs(30)).await;
    tracing::info!("kvd stopped");
    Ok(())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera-kvd",
        default_filter: "info".into(),
        json: cli.log_json,
        ..Default::default()
    });
    if let Err(e) = &telemetry {
        eprintln!("infera-kvd: {e}");
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
