//! The `infera-sim` command line. Besides its own flags it accepts the engine flags the
//! sidecar and the operator pass to a real vLLM, SGLang or ATOM server (`--host`,
//! `--port`, `--served-model-name`, `--block-size`/`--page-size`, `--kv-events-config`,
//! `--disaggregation-mode`, `--kv-transfer-config`, ...), so it can be launched exactly
//! as a real engine; other engine flags are ignored with a warning.

use crate::core::CoreConfig;
use crate::engine::Timing;
use crate::faults::FaultSettings;
use crate::kv_events::KvEventsEndpoint;
use crate::kvd_connector::KvdConfig;
use crate::pd::{PdLeg, PdProtocol, PdRole};
use crate::profile::LatencyProfile;
use crate::worker::WorkerConfig;
use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, ValueEnum};
use infera_proto::kv_events::encode::KvEventFormat;
use infera_proto::kv_tiers::{KvTier, TierCost};
use infera_proto::worker::EngineKind;
use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// KV-event layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LayoutArg {
    /// Array batch and array events (SGLang; vLLM 0.10.x with `--engine vllm`).
    Array,
    /// Array batch, tagged-map events (vLLM 0.25.x, ATOM).
    TaggedMap,
    /// Map batch, tagged-map events (newest vLLM).
    MapBatch,
}

/// Simulated vLLM / SGLang / ATOM engines for tests and benchmarks without GPUs.
///
/// Runs N independent workers on one runtime, each serving the OpenAI API
/// (`/v1/chat/completions`, `/v1/completions`, JSON and SSE), `/v1/models`, `/health`,
/// `/metrics` with the engine's metric names, SGLang's `/get_server_info` and
/// `/get_model_info`, and `/sim/faults` to inject failures at run time. Step timing
/// follows a latency model fitted on an H200 (`--profile`); prompts are tokenized with
/// a real tokenizer (`--tokenizer`) or, without one, as UTF-8 bytes.
#[derive(Debug, Parser)]
#[command(name = "infera-sim", version, about, long_about = None, verbatim_doc_comment)]
pub struct Cli {
    /// Model to serve (a real engine's positional model argument); used as the served
    /// name unless --served-model-name is given.
    pub model: Option<String>,

    /// Number of workers.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,

    /// HTTP address(es): one address (workers take consecutive ports from it) or a
    /// comma-separated list with one per worker.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: String,

    /// Engine host (engine flag; overrides --listen's host).
    #[arg(long)]
    pub host: Option<IpAddr>,

    /// Engine port (engine flag; overrides --listen's port).
    #[arg(long)]
    pub port: Option<u16>,

    /// Which engine's API details, metric names and KV-event layout to reproduce: vllm
    /// (tagged-map KV events with 32-byte hashes, `vllm:` metrics), sglang (array KV
    /// events with int hashes, `sglang:` metrics, `/get_server_info`) or atom (vLLM-style
    /// API, tagged-map events; PD over `/v1/completions` only).
    #[arg(long, default_value = "vllm", value_parser = engine_kind)]
    pub engine: EngineKind,

    /// KV-event layout, overriding the engine's default.
    #[arg(long, value_enum)]
    pub kv_event_layout: Option<LayoutArg>,

    /// Model name served and expected in requests.
    #[arg(long, alias = "model-name")]
    pub served_model_name: Option<String>,

    /// Tokenizer: a folder with tokenizer.json and tokenizer_config.json, or a
    /// tokenizer.json file. Default: the built-in byte codec (ChatML chat layout).
    #[arg(long, alias = "tokenizer-path")]
    pub tokenizer: Option<PathBuf>,

    /// Latency profile: a built-in name (h200-llama-3.1-8b, h200-llama-3.2-1b) or a JSON
    /// file of the same shape.
    #[arg(long, default_value = "h200-llama-3.1-8b")]
    pub profile: String,

    /// Tokens per KV block (vLLM --block-size, SGLang --page-size).
    #[arg(long, alias = "page-size", default_value_t = 16)]
    pub block_size: usize,

    /// KV cache size in blocks, per worker (default: 65,536 tokens).
    #[arg(long)]
    pub kv_blocks: Option<usize>,

    /// Token budget of one scheduler step: the chunked-prefill size (vLLM
    /// --max-num-batched-tokens, SGLang --chunked-prefill-size).
    #[arg(long, alias = "chunked-prefill-size", default_value_t = 8192)]
    pub max_num_batched_tokens: usize,

    /// Most requests running at once (SGLang --max-running-requests).
    #[arg(long, alias = "max-running-requests", default_value_t = 256)]
    pub max_num_seqs: usize,

    /// Longest prompt + output accepted (SGLang --context-length); default: the profile's.
    #[arg(long, alias = "context-length")]
    pub max_model_len: Option<usize>,

    /// Divide every simulated duration by K (K > 1 runs faster than a real GPU).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,

    /// Make each step last 1 ± F times its modelled duration (0 = exact, the default).
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,

    /// Seed for jitter (output tokens are seeded by the request's `seed` or its prompt).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// `max_tokens` for requests that give none.
    #[arg(long, default_value_t = 64)]
    pub default_max_tokens: usize,

    /// KV events as a real engine is configured, e.g.
    /// '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}'.
    /// With several workers, worker i adds i to both ports.
    #[arg(long)]
    pub kv_events_config: Option<String>,

    /// Publish KV events on this port base (worker i on BASE+i), topic kv-events.
    #[arg(long)]
    pub kv_events_port: Option<u16>,

    /// Serve KV-event replay on this port base (worker i on BASE+i).
    #[arg(long)]
    pub kv_events_replay_port: Option<u16>,

    /// SGLang prefill/decode role (`null`, `prefill`, `decode`): protocol sglang-bootstrap.
    #[arg(long)]
    pub disaggregation_mode: Option<String>,

    /// SGLang bootstrap port (advertised in disagg_meta.bootstrap_addr).
    #[arg(long, default_value_t = 8998)]
    pub disaggregation_bootstrap_port: u16,

    /// SGLang KV transfer backend (mooncake or mori); the protocol stays sglang-bootstrap.
    #[arg(long)]
    pub disaggregation_transfer_backend: Option<String>,

    /// vLLM/ATOM KV connector config JSON: kv_role kv_producer|kv_consumer, kv_connector
    /// MooncakeConnector|MoRIIOConnector (vLLM) or mooncake (ATOM),
    /// kv_connector_extra_config {handshake_port, notify_port, read_mode}.
    #[arg(long)]
    pub kv_transfer_config: Option<String>,

    /// KV transfer bandwidth for decode workers, GB/s (170 RDMA; 10 for TCP).
    #[arg(long, default_value_t = 170.0)]
    pub kv_transfer_gbytes_per_s: f64,

    /// Tensor-parallel size to advertise.
    #[arg(
        long,
        short = 't',
        alias = "tp",
        alias = "tp-size",
        default_value_t = 1
    )]
    pub tensor_parallel_size: u32,

    /// Data-parallel size to advertise.
    #[arg(long, alias = "dp", alias = "dp-size", default_value_t = 1)]
    pub data_parallel_size: u32,

    /// Fault: answer the first N generation requests with a 500.
    #[arg(long, default_value_t = 0)]
    pub fail_first: u64,

    /// Fault: break every stream after K tokens.
    #[arg(long)]
    pub fail_after_tokens: Option<u64>,

    /// Fault: the process exits (as if killed) once a stream has sent K tokens.
    #[arg(long)]
    pub exit_after_tokens: Option<u64>,

    /// Fault: accept generation requests and never answer.
    #[arg(long)]
    pub hang: bool,

    /// Fault: wait this many seconds before listening (a slow model load).
    #[arg(long, default_value_t = 0.0)]
    pub startup_delay: f64,

    /// Fault: never listen, so connections are refused.
    #[arg(long)]
    pub refuse_connections: bool,

    /// Serve `POST /v1/completions/render` and `/v1/chat/completions/render` (prompt
    /// to token ids, as vLLM does with this flag; without it they are 404 and routers
    /// fall back to `POST /tokenize`, which is always served).
    #[arg(long)]
    pub enable_scale_out: bool,

    /// kvd's socket: a KV connector stores finished requests' blocks there and loads a
    /// prompt's blocks missing from HBM back, at the modelled cost of their tier (the
    /// operator sets INFERA_KVD_SOCKET in engine pods). With several workers, a
    /// comma-separated list with one per worker, or one kvd they all share.
    #[arg(long, env = "INFERA_KVD_SOCKET")]
    pub kvd_socket: Option<String>,

    /// The tiers the kvd has: host (its RAM, always), disk (its NVMe tier) and remote (a
    /// shared Redis/Valkey tier), comma-separated; `long` blocks reach disk and remote.
    #[arg(long, env = "INFERA_KV_TIERS", value_delimiter = ',', value_parser = lower_tier)]
    pub kvd_tiers: Vec<KvTier>,

    /// What loading from a tier costs, TIER=RTT_MS:GBYTES_PER_S (repeatable), instead of
    /// the measured defaults: host 0.1:54.8 (kvd's arena DMA'd to the GPU), disk
    /// 1:0.439 and remote 0.37:0.338 (the reference VM's NVMe and same-host Redis).
    #[arg(long, value_parser = tier_cost)]
    pub kvd_tier_cost: Vec<(KvTier, TierCost)>,

    /// Bytes stored in kvd per block, standing for its real KV bytes (the time model
    /// charges the real size: block size x the profile's KV bytes per token).
    #[arg(long, default_value_t = 4096)]
    pub kvd_payload_bytes: usize,
}

/// A `--kvd-tiers` value (`host`, always there, is accepted as the sidecar's
/// `--kv-tiers` names it).
fn lower_tier(value: &str) -> Result<KvTier, String> {
    KvTier::parse_lower(value).map_err(|e| e.to_string())
}

/// A `--kvd-tier-cost` value.
fn tier_cost(value: &str) -> Result<(KvTier, TierCost), String> {
    TierCost::parse_stated(value).map_err(|e| e.to_string())
}

/// Parses `args`, dropping engine flags the simulator does not know (with a warning
/// each) so a real engine's command line is accepted.
pub fn parse_lenient(mut args: Vec<String>) -> Result<(Cli, Vec<String>), clap::Error> {
    let mut ignored = Vec::new();
    loop {
        match Cli::try_parse_from(&args) {
            Ok(cli) => return Ok((cli, ignored)),
            Err(e) if e.kind() == clap::error::ErrorKind::UnknownArgument => {
                let Some(flag) = e
                    .get(clap::error::ContextKind::InvalidArg)
                    .map(|v| v.to_string())
                else {
                    return Err(e);
                };
                let name = flag.split('=').next().unwrap_or(&flag).to_owned();
                let Some(pos) = args
                    .iter()
                    .position(|a| a == &name || a.starts_with(&format!("{name}=")))
                else {
                    return Err(e);
                };
                let removed = args.remove(pos);
                // `--flag value`: drop the value too.
                if !removed.contains('=') && args.get(pos).is_some_and(|v| !v.starts_with('-')) {
                    ignored.push(format!("{removed} {}", args.remove(pos)));
                } else {
                    ignored.push(removed);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// `--engine`'s value.
fn engine_kind(value: &str) -> Result<EngineKind, String> {
    value
        .parse()
        .map_err(|()| format!("{value:?}: expected vllm, sglang or atom"))
}

impl Cli {
    /// The connector to the kvd at `socket`: host always, the tiers `--kvd-tiers` adds,
    /// each at its stated or measured cost.
    fn kvd_config(&self, socket: &str, model: &str) -> KvdConfig {
        let mut tiers = vec![KvTier::Host];
        for t in &self.kvd_tiers {
            if !tiers.contains(t) {
                tiers.push(*t);
            }
        }
        tiers.sort();
        KvdConfig {
            socket: PathBuf::from(socket),
            tiers: tiers
                .into_iter()
                .filter_map(|t| {
                    TierCost::stated_or_measured(&self.kvd_tier_cost, t).map(|c| (t, c))
                })
                .collect(),
            payload_bytes: self.kvd_payload_bytes.max(8),
            model: model.to_owned(),
            compat_key: format!("{}/bs{}", self.profile, self.block_size),
        }
    }

    fn profile(&self) -> Result<LatencyProfile> {
        if let Some(p) = LatencyProfile::builtin(&self.profile) {
            return Ok(p);
        }
        let text = std::fs::read_to_string(&self.profile).with_context(|| {
            format!(
                "--profile {}: not a built-in profile (h200-llama-3.1-8b, h200-llama-3.2-1b) nor a readable file",
                self.profile
            )
        })?;
        serde_json::from_str(&text)
            .with_context(|| format!("--profile {}: not a latency profile", self.profile))
    }

    fn listen_addrs(&self) -> Result<Vec<SocketAddr>> {
        let list: Vec<SocketAddr> = self
            .listen
            .split(',')
            .map(|a| {
                a.trim()
                    .parse()
                    .with_context(|| format!("--listen {a:?} is not HOST:PORT"))
            })
            .collect::<Result<_>>()?;
        let mut base = match list.as_slice() {
            [one] => *one,
            many if many.len() == self.workers => return Ok(many.to_vec()),
            many => bail!(
                "--listen names {} addresses for {} workers",
                many.len(),
                self.workers
            ),
        };
        if let Some(host) = self.host {
            base.set_ip(host);
        }
        if let Some(port) = self.port {
            base.set_port(port);
        }
        (0..self.workers)
            .map(|i| {
                let port = base
                    .port()
                    .checked_add(i as u16)
                    .ok_or_else(|| anyhow!("port range overflows"))?;
                Ok(SocketAddr::new(
                    base.ip(),
                    if base.port() == 0 { 0 } else { port },
                ))
            })
            .collect()
    }

    fn kv_events(&self, worker: usize, host: IpAddr) -> Result<Option<KvEventsEndpoint>> {
        if let Some(json) = &self.kv_events_config {
            let v: Value = serde_json::from_str(json).context("--kv-events-config is not JSON")?;
            if v.get("publisher")
                .and_then(Value::as_str)
                .is_some_and(|p| p != "zmq")
            {
                return Ok(None);
            }
            if v.get("enable_kv_cache_events").and_then(Value::as_bool) == Some(false) {
                return Ok(None);
            }
            let endpoint = v
                .get("endpoint")
                .and_then(Value::as_str)
                .unwrap_or("tcp://*:5557");
            let topic = v
                .get("topic")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            return Ok(Some(KvEventsEndpoint {
                endpoint: offset_port(endpoint, worker)?,
                replay_endpoint: v
                    .get("replay_endpoint")
                    .and_then(Value::as_str)
                    .map(|e| offset_port(e, worker))
                    .transpose()?,
                topic,
            }));
        }
        Ok(self.kv_events_port.map(|base| KvEventsEndpoint {
            endpoint: format!("tcp://{host}:{}", base as usize + worker),
            replay_endpoint: self
                .kv_events_replay_port
                .map(|r| format!("tcp://{host}:{}", r as usize + worker)),
            topic: infera_proto::kv_stream::ZMQ_TOPIC.to_owned(),
        }))
    }

    fn event_format(&self) -> Option<KvEventFormat> {
        self.kv_event_layout
            .map(|layout| match (layout, self.engine) {
                (LayoutArg::Array, EngineKind::Sglang) => KvEventFormat::Sglang,
                (LayoutArg::Array, _) => KvEventFormat::VllmArray,
                (LayoutArg::TaggedMap, _) => KvEventFormat::VllmTaggedMap,
                (LayoutArg::MapBatch, _) => KvEventFormat::VllmMapBatch,
            })
    }

    fn pd_role(&self, addr: SocketAddr) -> Result<Option<PdRole>> {
        let mk = |leg, protocol, handshake_port, notify_port| PdRole {
            leg,
            protocol,
            host: addr.ip().to_string(),
            http_port: addr.port(),
            handshake_port,
            notify_port,
            tp_size: self.tensor_parallel_size,
            dp_size: self.data_parallel_size,
            bootstrap_port: self.disaggregation_bootstrap_port,
            engine_id: format!("sim-{addr}"),
        };
        if let Some(mode) = &self.disaggregation_mode {
            let leg = match mode.as_str() {
                "prefill" => PdLeg::Prefill,
                "decode" => PdLeg::Decode,
                "null" | "" => return Ok(None),
                other => bail!("--disaggregation-mode {other:?}: expected null, prefill or decode"),
            };
            return Ok(Some(mk(leg, PdProtocol::SglangBootstrap, 0, 0)));
        }
        let Some(json) = &self.kv_transfer_config else {
            return Ok(None);
        };
        let cfg: Value = serde_json::from_str(json).context("--kv-transfer-config is not JSON")?;
        let leg = match cfg.get("kv_role").and_then(Value::as_str) {
            Some("kv_producer") => PdLeg::Prefill,
            Some("kv_consumer") => PdLeg::Decode,
            Some("kv_both") | None => return Ok(None),
            Some(other) => bail!(
                "--kv-transfer-config kv_role {other:?}: expected kv_producer, kv_consumer or kv_both"
            ),
        };
        let extra = cfg
            .get("kv_connector_extra_config")
            .cloned()
            .unwrap_or(Value::Null);
        let port = |v: Option<&Value>, default: u16| -> u16 {
            v.and_then(|p| p.as_u64().or_else(|| p.as_str()?.parse().ok()))
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(default)
        };
        let connector = cfg
            .get("kv_connector")
            .and_then(Value::as_str)
            .unwrap_or("mooncake");
        let protocol = match (self.engine, connector) {
            (EngineKind::Atom, "mooncake") => PdProtocol::AtomMooncake,
            (EngineKind::Vllm, "MooncakeConnector" | "MooncakeStoreConnector") => {
                PdProtocol::VllmMooncake
            }
            (EngineKind::Vllm, "MoRIIOConnector") => {
                let read = extra.get("read_mode").is_some_and(|v| {
                    v.as_bool() == Some(true) || matches!(v.as_str(), Some("true" | "1"))
                }) || std::env::var("VLLM_MORIIO_CONNECTOR_READ_MODE")
                    .is_ok_and(|v| v == "1" || v == "true");
                if read {
                    PdProtocol::VllmMoriRead
                } else {
                    PdProtocol::VllmMoriWrite
                }
            }
            (engine, other) => bail!(
                "--kv-transfer-config kv_connector {other:?} is not a supported prefill/decode connector for {engine:?} \
                 (supported: vllm MooncakeConnector or MoRIIOConnector, atom mooncake); NIXL is not supported"
            ),
        };
        let handshake = port(
            extra
                .get("handshake_port")
                .or_else(|| cfg.get("handshake_port")),
            6301,
        );
        let notify = port(extra.get("notify_port"), 61005);
        let mut role = mk(leg, protocol, handshake, notify);
        // The connector's engine id, as the engine registers it with its peers.
        if let Some(id) = cfg.get("engine_id").and_then(Value::as_str) {
            role.engine_id = id.to_owned();
        }
        Ok(Some(role))
    }

    /// One config per worker.
    pub fn worker_configs(&self) -> Result<Vec<WorkerConfig>> {
        if self.workers == 0 {
            bail!("--workers must be at least 1");
        }
        if self.block_size == 0 {
            bail!("--block-size must be at least 1");
        }
        if self.speedup.is_nan() || self.speedup <= 0.0 {
            bail!("--speedup must be positive");
        }
        let mut profile = self.profile()?;
        if let Some(len) = self.max_model_len {
            profile.max_model_len = len;
        }
        let kv_blocks = self.kv_blocks.unwrap_or(65_536 / self.block_size);
        let model = self
            .served_model_name
            .clone()
            .or_else(|| self.model.clone())
            .unwrap_or_else(|| "sim-model".to_owned());
        let faults = FaultSettings {
            fail_next: self.fail_first,
            fail_after_tokens: self.fail_after_tokens,
            exit_after_tokens: self.exit_after_tokens,
            hang: self.hang,
            unhealthy: false,
        };
        let core = CoreConfig {
            block_size: self.block_size,
            kv_blocks,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            profile,
            kv_transfer_gbytes_per_s: self.kv_transfer_gbytes_per_s,
            lower_tiers: Vec::new(),
        };
        let sockets: Vec<&str> = self
            .kvd_socket
            .as_deref()
            .map(|s| s.split(',').map(str::trim).collect())
            .unwrap_or_default();
        if sockets.len() > 1 && sockets.len() != self.workers {
            bail!(
                "--kvd-socket names {} sockets for {} workers",
                sockets.len(),
                self.workers
            );
        }
        self.listen_addrs()?
            .into_iter()
            .enumerate()
            .map(|(i, addr)| {
                Ok(WorkerConfig {
                    listen: addr,
                    engine: self.engine,
                    model: model.clone(),
                    core: core.clone(),
                    timing: Timing {
                        speedup: self.speedup,
                        jitter: self.jitter,
                        seed: self.seed,
                    },
                    event_format: self.event_format(),
                    kv_events: self.kv_events(i, addr.ip())?,
                    dp_rank: None,
                    pd: self.pd_role(addr)?,
                    tp_size: self.tensor_parallel_size,
                    dp_size: self.data_parallel_size,
                    default_max_tokens: self.default_max_tokens,
                    faults: faults.clone(),
                    startup_delay: Duration::from_secs_f64(self.startup_delay.max(0.0)),
                    refuse_connections: self.refuse_connections,
                    enable_scale_out: self.enable_scale_out,
                    kvd: sockets
                        .get(if sockets.len() > 1 { i } else { 0 })
                        .map(|socket| self.kvd_config(socket, &model)),
                })
            })
            .collect()
    }
}

fn offset_port(endpoint: &str, offset: usize) -> Result<String> {
    if offset == 0 {
        return Ok(endpoint.to_owned());
    }
    let (base, port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("KV event endpoint {endpoint:?} has no port"))?;
    let port: usize = port
        .parse()
        .with_context(|| format!("KV event endpoint {endpoint:?}: bad port"))?;
    Ok(format!("{base}:{}", port + offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        std::iter::once("infera-sim")
            .chain(s.split_whitespace())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn consecutive_ports_for_workers() {
        let (cli, _) = parse_lenient(args("--workers 3 --listen 127.0.0.1:9100")).unwrap();
        let ports: Vec<u16> = cli
            .worker_configs()
            .unwrap()
            .iter()
            .map(|w| w.listen.port())
            .collect();
        assert_eq!(ports, vec![9100, 9101, 9102]);
    }

    #[test]
    fn accepts_a_real_engine_command_line() {
        let (cli, ignored) = parse_lenient(args(
            "fixture/model --host 127.0.0.1 --port 30000 --served-model-name m --page-size 64 \
             --gpu-memory-utilization 0.9 --trust-remote-code --engine sglang --disaggregation-mode prefill",
        ))
        .unwrap();
        assert_eq!(
            ignored,
            vec!["--gpu-memory-utilization 0.9", "--trust-remote-code"]
        );
        let w = &cli.worker_configs().unwrap()[0];
        assert_eq!(w.listen, "127.0.0.1:30000".parse().unwrap());
        assert_eq!((w.model.as_str(), w.core.block_size), ("m", 64));
        assert_eq!(w.pd.as_ref().unwrap().protocol, PdProtocol::SglangBootstrap);
        assert_eq!(w.pd.as_ref().unwrap().leg, PdLeg::Prefill);
    }

    #[test]
    fn kv_transfer_config_selects_the_protocol() {
        let role = |engine: &str, cfg: &str| {
            let (cli, _) = parse_lenient(vec![
                "infera-sim".into(),
                "--engine".into(),
                engine.into(),
                "--kv-transfer-config".into(),
                cfg.into(),
            ])
            .unwrap();
            cli.worker_configs().map(|w| w[0].pd.clone())
        };
        let p = role(
            "vllm",
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (p.protocol, p.leg),
            (PdProtocol::VllmMooncake, PdLeg::Decode)
        );
        let p = role("vllm", r#"{"kv_connector":"MoRIIOConnector","kv_role":"kv_producer","kv_connector_extra_config":{"read_mode":"true","handshake_port":"7000"}}"#).unwrap().unwrap();
        assert_eq!(
            (p.protocol, p.handshake_port, p.notify_port),
            (PdProtocol::VllmMoriRead, 7000, 61005)
        );
        let p = role("atom", r#"{"kv_role":"kv_producer"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(p.protocol, PdProtocol::AtomMooncake);
        assert!(
            role(
                "vllm",
                r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both"}"#
            )
            .unwrap()
            .is_none()
        );
        let err = role(
            "vllm",
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_producer"}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("NIXL is not supported"), "{err}");
    }

    #[test]
    fn kv_events_config_offsets_ports_per_worker() {
        let (cli, _) = parse_lenient(vec![
            "infera-sim".into(), "--workers".into(), "2".into(), "--kv-events-config".into(),
            r#"{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5600","topic":"kv-events"}"#.into(),
        ])
        .unwrap();
        let w = cli.worker_configs().unwrap();
        let e = w[1].kv_events.as_ref().unwrap();
        assert_eq!(e.endpoint, "tcp://*:5558");
        assert_eq!(e.replay_endpoint.as_deref(), Some("tcp://*:5601"));
        assert_eq!(e.topic, "kv-events");
    }

    #[test]
    fn bad_values_say_what_to_change() {
        let (cli, _) = parse_lenient(args(
            "--workers 2 --listen 127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        ))
        .unwrap();
        assert!(
            cli.worker_configs()
                .unwrap_err()
                .to_string()
                .contains("3 addresses for 2 workers")
        );
        let (cli, _) = parse_lenient(args("--profile no-such-profile")).unwrap();
        assert!(
            cli.worker_configs()
                .unwrap_err()
                .to_string()
                .contains("not a built-in profile")
        );
    }
}
