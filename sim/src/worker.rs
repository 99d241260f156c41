//! Starting one simulated worker: its engine task, KV-event publisher and HTTP server,
//! all owned by [`RunningWorker`] and stopped with it.

use crate::api::build_router;
use crate::core::{CoreConfig, EngineCore};
use crate::engine::{Timing, spawn_engine};
use crate::faults::{FaultSettings, Faults};
use crate::flavor::Flavor;
use crate::generate::{OUTPUT_TEXT, OutputGenerator};
use crate::kv_events::{KvEventConverter, KvEventsEndpoint, start_publisher};
use crate::kvd_connector::{KvdConfig, KvdHandle};
use crate::pd::PdRole;
use crate::state::WorkerState;
use anyhow::Context;
use infera_prompt::PromptCodec;
use infera_proto::kv_events::encode::KvEventFormat;
use infera_proto::worker::EngineKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Everything one worker needs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// HTTP address (port 0 picks a free one, unless start is delayed).
    pub listen: SocketAddr,
    /// Engine imitated.
    pub engine: EngineKind,
    /// Served model name.
    pub model: String,
    /// Scheduler, cache and timing.
    pub core: CoreConfig,
    /// Simulated versus real time, and jitter.
    pub timing: Timing,
    /// KV-event encoding (the engine's default when `None`).
    pub event_format: Option<KvEventFormat>,
    /// Where to publish KV events (none: not published).
    pub kv_events: Option<KvEventsEndpoint>,
    /// Data-parallel rank stamped on event batches.
    pub dp_rank: Option<u32>,
    /// Prefill/decode role.
    pub pd: Option<PdRole>,
    /// Tensor-parallel size advertised.
    pub tp_size: u32,
    /// Data-parallel size advertised.
    pub dp_size: u32,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// Faults in force at start.
    pub faults: FaultSettings,
    /// Wait this long before listening (a slow model load).
    pub startup_delay: Duration,
    /// Never listen: connections are refused.
    pub refuse_connections: bool,
    /// Serve vLLM's render endpoints (`--enable-scale-out`).
    pub enable_scale_out: bool,
    /// The kvd beside the engine, through the KV connector (none: no tier below HBM).
    pub kvd: Option<KvdConfig>,
}

/// A running worker.
#[derive(Debug)]
pub struct RunningWorker {
    /// HTTP address.
    pub addr: SocketAddr,
    /// Shared state (engine handle, faults).
    pub state: Arc<WorkerState>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    publisher: JoinSet<()>,
    engine_task: tokio::task::JoinHandle<()>,
}

impl RunningWorker {
    /// Stops accepting, lets open responses finish, then stops the engine and its KV
    /// event publisher (which runs until the engine's event channel closes).
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        self.engine_task.abort();
        self.publisher.abort_all();
        while self.publisher.join_next().await.is_some() {}
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.tasks.abort_all();
        self.publisher.abort_all();
        self.engine_task.abort();
    }
}

/// The output-token vocabulary for a codec.
pub fn build_generator(codec: &PromptCodec) -> OutputGenerator {
    OutputGenerator::new(codec.encode(OUTPUT_TEXT, false).unwrap_or_default())
}

/// Starts a worker.
pub async fn start_worker(
    cfg: WorkerConfig,
    codec: Arc<PromptCodec>,
    generator: Arc<OutputGenerator>,
) -> anyhow::Result<RunningWorker> {
    let flavor = Flavor(cfg.engine);
    let mut tasks = JoinSet::new();
    let mut publisher_task = JoinSet::new();
    let format = cfg
        .event_format
        .unwrap_or_else(|| flavor.default_event_format());
    let events = match &cfg.kv_events {
        Some(endpoint) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let publisher = start_publisher(endpoint, format, rx).await?;
            publisher_task.spawn(publisher);
            let converter = KvEventConverter {
                format,
                int_hashes: flavor.int_block_hashes(),
                block_size: cfg.core.block_size as u32,
                dp_rank: cfg.dp_rank,
            };
            Some((converter, tx))
        }
        None => None,
    };
    let mut core: CoreConfig = cfg.core.clone();
    let kvd = match &cfg.kvd {
        Some(kvd_cfg) => {
            core.lower_tiers = kvd_cfg.tiers.clone();
            let index = cfg.dp_rank.unwrap_or(0) as usize;
            Some(
                KvdHandle::spawn(kvd_cfg.clone(), index, events.clone())
                    .context("starting the kvd connector thread")?,
            )
        }
        None => None,
    };
    let (engine, engine_task) = spawn_engine(
        EngineCore::new(core.clone()),
        cfg.timing,
        events,
        kvd.clone(),
    );
    let state = Arc::new(WorkerState {
        flavor,
        model: cfg.model.clone(),
        tokenizer_source: codec.source().to_owned(),
        block_size: core.block_size,
        max_model_len: core.profile.max_model_len,
        default_max_tokens: cfg.default_max_tokens,
        pd: {
            crate::handoff::register_prefill_worker(cfg.pd.as_ref());
            cfg.pd.clone()
        },
        tp_size: cfg.tp_size,
        dp_size: cfg.dp_size,
        codec,
        generator,
        engine,
        faults: Faults::new(&cfg.faults),
        kv_blocks: core.kv_blocks,
        max_num_batched_tokens: core.max_num_batched_tokens,
        max_num_seqs: core.max_num_seqs,
        last_traceparent: Default::default(),
        scale_out: cfg.enable_scale_out,
        kvd,
    });
    let (shutdown, mut stop) = watch::channel(false);
    let router = build_router(state.clone());
    let addr = if cfg.refuse_connections {
        cfg.listen
    } else if cfg.startup_delay.is_zero() {
        let listener = TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("binding {}", cfg.listen))?;
        let addr = listener.local_addr()?;
        tasks.spawn(serve(listener, router, stop));
        addr
    } else {
        let (delay, listen) = (cfg.startup_delay, cfg.listen);
        tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return,
            }
            match TcpListener::bind(listen).await {
                Ok(listener) => serve(listener, router, stop).await,
                Err(e) => tracing::error!("binding {listen} after the startup delay: {e}"),
            }
        });
        listen
    };
    Ok(RunningWorker {
        addr,
        state,
        shutdown,
        tasks,
        publisher: publisher_task,
        engine_task,
    })
}

async fn serve(listener: TcpListener, router: axum::Router, mut stop: watch::Receiver<bool>) {
    // Small SSE writes must not wait for the peer's delayed ACK (Nagle).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let result = axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!("HTTP server failed: {e}");
    }
}
