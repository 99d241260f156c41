//! A simulated fleet for a benchmark: simulators on one runtime, gateways on another
//! (threads named `infera-sim*` and `infera-gw*`, so each one's CPU time is measured
//! apart from the driver's), records fed to each gateway's in-process registry.

use crate::up::local::{build_sim_record, free_port, loopback_pd_role};
use anyhow::{Context, Result, anyhow};
use clap::Parser;
use infera_engine_sidecar::request_plane::{PlaneSettings, RequestServer};
use infera_gateway::Gateway;
use infera_gateway::Registry;
use infera_gateway::config::GatewayConfig;
use infera_gateway::server::{RunningGateway, start_embedded};
use infera_prompt::PromptCodec;
use infera_proto::kv_tiers::KvTier;
use infera_proto::pd::PdProtocol;
use infera_sim::core::CoreConfig;
use infera_sim::engine::Timing;
use infera_sim::faults::FaultSettings;
use infera_sim::kv_events::KvEventsEndpoint;
use infera_sim::kvd_connector::KvdConfig;
use infera_sim::pd::PdLeg;
use infera_sim::profile::LatencyProfile;
use infera_sim::worker::{RunningWorker, WorkerConfig, build_generator, start_worker};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::runtime::Runtime;

/// Waits until a kvd listens on `socket`.
/// Model name every bench worker serves.
pub const MODEL: &str = "bench-model";

/// Tokens per KV block of every simulator.
pub const BLOCK_TOKENS: usize = 16;

/// One simulated worker.
#[derive(Debug, Clone)]
pub struct SimSpec {
    /// KV blocks of 16 tokens.
    pub kv_blocks: usize,
    /// Step-time divisor.
    pub speedup: f64,
    /// Latency profile.
    pub profile: String,
    /// Prefill/decode role.
    pub pd: Option<(PdProtocol, PdLeg)>,
    /// Publish KV events.
    pub kv_events: bool,
    /// KV transfer bandwidth (prefill/decode).
    pub transfer_gbytes_per_s: f64,
    /// A kvd beside it (RAM only, in-process), reached through the simulator's KV
    /// connector.
    pub kvd: bool,
}

/// kvd's RAM beside each simulator: its share of any scenario's working set at the
/// connector's 4 KiB payload per block, with room to spare.
const KVD_BYTES: u64 = 64 << 20;

/// Simulators and gateways.
#[derive(Debug)]
pub struct Fleet {
    sim_rt: Option<Runtime>,
    gw_rt: Option<Runtime>,
    /// Simulators.
    pub sims: Vec<RunningWorker>,
    /// Gateways.
    pub gateways: Vec<RunningGateway>,
    /// The simulators' NATS request servers (a fleet over the request plane).
    planes: Vec<RequestServer>,
    /// Each simulator's KV-event endpoint (when it publishes events).
    pub events: Vec<Option<String>>,
    /// The kvds beside simulators: how to stop each, and the folder of their sockets.
    kvds: Vec<tokio::sync::oneshot::Sender<()>>,
    kvd_dir: Option<tempfile::TempDir>,
}

fn runtime(name: &str, threads: usize) -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .with_context(|| format!("starting the {name} runtime"))
}

fn worker_config(spec: &SimSpec, index: usize) -> Result<WorkerConfig> {
    let port = free_port()?;
    let pd = spec
        .pd
        .map(|(protocol, leg)| loopback_pd_role(protocol, leg, port, format!("bench-{index}")))
        .transpose()?;
    Ok(WorkerConfig {
        listen: ([127, 0, 0, 1], port).into(),
        engine: infera_proto::worker::EngineKind::Vllm,
        model: MODEL.into(),
        core: CoreConfig {
            block_size: BLOCK_TOKENS,
            kv_blocks: spec.kv_blocks,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            profile: LatencyProfile::builtin(&spec.profile)
                .ok_or_else(|| anyhow!("unknown simulator profile {}", spec.profile))?,
            kv_transfer_gbytes_per_s: spec.transfer_gbytes_per_s,
            lower_tiers: Vec::new(),
        },
        timing: Timing::exact(spec.speedup),
        // vLLM's own layout (tagged maps), which every router reading events decodes.
        event_format: spec
            .kv_events
            .then_some(infera_proto::kv_events::encode::KvEventFormat::VllmTaggedMap),
        kv_events: if spec.kv_events {
            Some(KvEventsEndpoint {
                endpoint: format!("tcp://127.0.0.1:{}", free_port()?),
                replay_endpoint: None,
                topic: String::new(),
            })
        } else {
            None
        },
        dp_rank: None,
        pd,
        tp_size: 1,
        dp_size: 1,
        default_max_tokens: 16,
        faults: FaultSettings::default(),
        startup_delay: Duration::ZERO,
        refuse_connections: false,
        // vLLM's render endpoints, which vLLM's router asks every worker for.
        enable_scale_out: true,
        kvd: None,
    })
}

impl Fleet {
    /// Starts `sims` and `gateways` gateways started with `flags`.
    pub async fn start(sims: &[SimSpec], gateways: usize, flags: &[String]) -> Result<Fleet> {
        Self::start_with(sims, &vec![flags.to_vec(); gateways], None).await
    }

    /// Starts `sims`, each also serving the NATS request plane at `nats` (registered
    /// `request_transport: nats`), and one gateway per entry of `flag_sets`.
    pub async fn start_over_nats(
        sims: &[SimSpec],
        flag_sets: &[Vec<String>],
        nats: &str,
    ) -> Result<Fleet> {
        Self::start_with(sims, flag_sets, Some(nats)).await
    }

    async fn start_with(
        sims: &[SimSpec],
        flag_sets: &[Vec<String>],
        nats: Option<&str>,
    ) -> Result<Fleet> {
        let sim_rt = runtime("infera-sim", 2)?;
        let gw_rt = runtime("infera-gw", 2)?;
        let codec = Arc::new(PromptCodec::bytes());
        let generator = Arc::new(build_generator(&codec));
        let mut running = Vec::new();
        let mut records = Vec::new();
        let mut planes = Vec::new();
        let mut kvds = Vec::new();
        let mut endpoints = Vec::new();
        let kvd_dir = if sims.iter().any(|s| s.kvd) {
            Some(tempfile::tempdir().context("a folder for kvd sockets")?)
        } else {
            None
        };
        for (i, spec) in sims.iter().enumerate() {
            let mut cfg = worker_config(spec, i)?;
            let mut declared = None;
            if let (true, Some(dir)) = (spec.kvd, &kvd_dir) {
                let socket = dir.path().join(format!("kvd-{i}.sock"));
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                crate::up::local::run_kvd_in_process(
                    sim_rt.handle(),
                    &socket,
                    KVD_BYTES,
                    None,
                    async move {
                        let _ = stopped.await;
                    },
                    &format!("bench worker {i}"),
                )
                .await?;
                kvds.push(stop);
                // The record declares what the connector loads from, at the same costs.
                let (kvd, tiers) = KvdConfig::measured(
                    socket,
                    &[KvTier::Host],
                    &cfg.core.profile,
                    BLOCK_TOKENS,
                    MODEL,
                );
                cfg.kvd = Some(kvd);
                declared = Some(tiers);
            }
            let events = cfg.kv_events.as_ref().map(|e| e.endpoint.clone());
            endpoints.push(events.clone());
            let role = cfg.pd.clone();
            let (codec, generator) = (codec.clone(), generator.clone());
            let worker = sim_rt
                .spawn(async move { start_worker(cfg, codec, generator).await })
                .await??;
            let mut record = build_sim_record(
                worker.addr,
                infera_proto::worker::EngineKind::Vllm,
                MODEL,
                role.as_ref(),
                events.as_deref(),
                16,
            )?;
            if let Some(tiers) = &declared {
                tiers.declare_on(&mut record);
            }
            if let Some(url) = nats {
                let settings = PlaneSettings {
                    url: url.to_owned(),
                    max_duration: None,
                    max_pending: 0,
                };
                let (id, engine) = (record.worker_id.clone(), format!("http://{}", worker.addr));
                let plane = sim_rt
                    .spawn(async move { RequestServer::start(&settings, &id, &engine).await })
                    .await?
                    .map_err(|e| anyhow!("{e}"))?;
                planes.push(plane);
                record.request_transport = infera_proto::worker::RequestTransport::Nats;
            }
            records.push(record);
            running.push(worker);
        }
        let mut gws = Vec::new();
        for flags in flag_sets {
            let mut args = vec![
                "infera-gateway".to_owned(),
                "--host".into(),
                "127.0.0.1".into(),
            ];
            args.extend(flags.iter().cloned());
            let cfg =
                GatewayConfig::try_parse_from(args).map_err(|e| anyhow!("gateway flags: {e}"))?;
            let records = records.clone();
            let gw = gw_rt
                .spawn(async move {
                    let registry = Registry::new();
                    for r in records {
                        registry.upsert(r);
                    }
                    registry.mark_synced();
                    let gw = Gateway::new(cfg, registry).map_err(|e| anyhow!("{e}"))?;
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                    start_embedded(gw, listener)
                        .await
                        .map_err(|e| anyhow!("{e}"))
                })
                .await??;
            gws.push(gw);
        }
        // KV-event subscriptions connect in the background: give them a moment.
        if sims.iter().any(|s| s.kv_events) {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(Fleet {
            sim_rt: Some(sim_rt),
            gw_rt: Some(gw_rt),
            sims: running,
            gateways: gws,
            planes,
            events: endpoints,
            kvds,
            kvd_dir,
        })
    }

    /// One gateway discovering workers itself (from `flags`: etcd), no simulators.
    pub async fn start_discovering(flags: &[String]) -> Result<Fleet> {
        let sim_rt = runtime("infera-sim", 1)?;
        let gw_rt = runtime("infera-gw", 2)?;
        let mut args = vec![
            "infera-gateway".to_owned(),
            "--host".into(),
            "127.0.0.1".into(),
        ];
        args.extend(flags.iter().cloned());
        let cfg = GatewayConfig::try_parse_from(args).map_err(|e| anyhow!("gateway flags: {e}"))?;
        let gw = gw_rt
            .spawn(async move {
                let gw = Gateway::new(cfg, Registry::new()).map_err(|e| anyhow!("{e}"))?;
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                infera_gateway::server::start_gateway(gw, listener)
                    .await
                    .map_err(|e| anyhow!("{e}"))
            })
            .await??;
        Ok(Fleet {
            sim_rt: Some(sim_rt),
            gw_rt: Some(gw_rt),
            sims: Vec::new(),
            gateways: vec![gw],
            planes: Vec::new(),
            events: Vec::new(),
            kvds: Vec::new(),
            kvd_dir: None,
        })
    }

    /// `http://gateway{path}` of each gateway.
    pub fn gateway_urls(&self, path: &str) -> Vec<String> {
        self.gateways
            .iter()
            .map(|g| format!("http://{}{path}", g.addr))
            .collect()
    }

    /// `http://sim{path}` of each simulator.
    pub fn sim_urls(&self, path: &str) -> Vec<String> {
        self.sims
            .iter()
            .map(|s| format!("http://{}{path}", s.addr))
            .collect()
    }

    /// Requests each simulator finished.
    pub fn served(&self) -> Vec<u64> {
        self.sims
            .iter()
            .map(|s| s.state.engine.counters.finished.load(Ordering::SeqCst))
            .collect()
    }

    /// Stops everything.
    pub async fn shutdown(mut self) {
        let gateways = std::mem::take(&mut self.gateways);
        let sims = std::mem::take(&mut self.sims);
        let planes = std::mem::take(&mut self.planes);
        if let Some(rt) = &self.gw_rt {
            let _ = rt
                .spawn(async move {
                    for g in gateways {
                        g.shutdown().await;
                    }
                })
                .await;
        }
        if let Some(rt) = &self.sim_rt {
            let _ = rt
                .spawn(async move {
                    for p in planes {
                        p.stop(None).await;
                    }
                    for s in sims {
                        s.shutdown().await;
                    }
                })
                .await;
        }
        for stop in std::mem::take(&mut self.kvds) {
            let _ = stop.send(());
        }
        self.kvd_dir.take();
        if let Some(rt) = self.gw_rt.take() {
            rt.shutdown_background();
        }
        if let Some(rt) = self.sim_rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(rt) = self.gw_rt.take() {
            rt.shutdown_background();
        }
        if let Some(rt) = self.sim_rt.take() {
            rt.shutdown_background();
        }
    }
}
