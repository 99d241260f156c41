//! The daemon assembled from its flags and run until a shutdown: the arena and RAM
//! store, the NVMe and distributed tiers with their writer threads, the prefetcher, the
//! metrics endpoint and the socket server. `infera-kvd` runs it until SIGTERM or SIGINT;
//! `infera up` runs one in-process beside each simulated worker that wants kvd.

use crate::arena::{Arena, ArenaOptions};
use crate::cli::KvdArgs;
use crate::daemon::Daemon;
use crate::disk::{Disk, DiskOptions};
use crate::lower::Lower;
use crate::metrics::StoreView;
use crate::remote::{self, Remote, RemoteOptions};
use crate::server::{Limits, bind, serve};
use crate::store::Store;
use anyhow::{Context, Result, anyhow, bail};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn open_lower(cli: &KvdArgs) -> Result<Lower> {
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
            compact_min_bytes: crate::disk::COMPACT_MIN,
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

/// Runs the daemon `cli` describes until `shutdown` resolves, then lets the slower
/// tiers' queued writes finish (at most 30 s) and removes the socket.
pub async fn run(
    cli: KvdArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
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
    serve(listener, daemon.clone(), limits, shutdown).await;
    let _ = std::fs::remove_file(&cli.socket);
    daemon.close();
    drain(workers, Duration::from_secs(30)).await;
    tracing::info!("kvd stopped");
    Ok(())
}
