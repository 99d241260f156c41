//! What the sidecar needs to know from the engine's own flags (pure): its port, served
//! model name, page size, KV-event endpoint, data-parallel size and, for `sim`, which
//! engine it imitates.

use infera_engine_prep::Launch;
pub use infera_engine_prep::flags::flag_value;
use infera_engine_prep::prepare::http_port_flag;
use infera_proto::worker::EngineKind;
use serde_json::Value;

/// Facts read from the engine flags.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineFacts {
    /// Engine kind the worker record names.
    pub kind: EngineKind,
    /// HTTP port.
    pub port: u16,
    /// Served model name.
    pub model: String,
    /// KV page size given on the command line.
    pub block_size: Option<u32>,
    /// The KV-event PUB port, from `--kv-events-config` (or `--kv-events-port` for sim).
    pub kv_events_port: Option<u16>,
    /// Data-parallel size.
    pub dp_size: u32,
}

fn default_port(launch: Launch) -> u16 {
    match launch {
        Launch::Engine(EngineKind::Sglang) => 30000,
        Launch::Engine(_) | Launch::Sim(_) => 8000,
    }
}

/// The node rank of this process in a multi-node worker: `LWS_WORKER_INDEX` (set by
/// LeaderWorkerSet) or the engine's `--node-rank`; 0 when neither is given. Only rank 0
/// registers: the other nodes serve no HTTP of their own.
pub fn node_rank(args: &[String], lws_worker_index: Option<&str>) -> u32 {
    lws_worker_index
        .and_then(|v| v.parse().ok())
        .or_else(|| flag_value(args, &["--node-rank"]).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// The port of a ZMQ endpoint like `tcp://*:5557`.
pub fn endpoint_port(endpoint: &str) -> Option<u16> {
    endpoint.rsplit_once(':')?.1.parse().ok()
}

/// Reads the facts; the model name falls back to the first positional argument.
pub fn read_engine_facts(launch: Launch, args: &[String]) -> Result<EngineFacts, String> {
    let port_flag = http_port_flag(launch);
    let port = match flag_value(args, &[port_flag]) {
        Some(p) => p
            .parse()
            .map_err(|_| format!("engine flag {port_flag} {p:?} is not a port"))?,
        None => default_port(launch),
    };
    let positional = args.first().filter(|a| !a.starts_with('-')).cloned();
    let model = flag_value(args, &["--served-model-name", "--model-name"])
        .map(str::to_owned)
        .or_else(|| flag_value(args, &["--model", "--model-path"]).map(str::to_owned))
        .or(positional)
        .ok_or_else(|| {
            "the engine flags name no model (--served-model-name, --model or a positional model)"
                .to_owned()
        })?;
    let block_size =
        flag_value(args, &["--block-size", "--page-size"]).and_then(|v| v.parse().ok());
    let kv_events_port = flag_value(args, &["--kv-events-config"])
        .and_then(|json| serde_json::from_str::<Value>(json).ok())
        .and_then(|v| {
            v.get("endpoint")
                .and_then(Value::as_str)
                .and_then(endpoint_port)
        })
        .or_else(|| flag_value(args, &["--kv-events-port"]).and_then(|p| p.parse().ok()));
    let dp_size = flag_value(args, &["--data-parallel-size", "--dp-size", "--dp"])
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let kind = launch.engine();
    Ok(EngineFacts {
        kind,
        port,
        model,
        block_size,
        kv_events_port,
        dp_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn node_rank_from_lws_or_flags() {
        assert_eq!(node_rank(&args("m --node-rank 2"), None), 2);
        assert_eq!(
            node_rank(&args("m --node-rank 2"), Some("1")),
            1,
            "LWS_WORKER_INDEX wins"
        );
        assert_eq!(node_rank(&args("m"), None), 0);
    }

    #[test]
    fn reads_each_engines_flags() {
        let f = read_engine_facts(
            Launch::Engine(EngineKind::Sglang),
            &args("--model-path /models/q --served-model-name q --page-size 64 --dp 2"),
        )
        .unwrap();
        assert_eq!(
            (f.kind, f.port, f.model.as_str(), f.block_size, f.dp_size),
            (EngineKind::Sglang, 30000, "q", Some(64), 2)
        );
        let f = read_engine_facts(
            Launch::Engine(EngineKind::Vllm),
            &args("/models/llama --port=8100 --block-size 32"),
        )
        .unwrap();
        assert_eq!(
            (f.port, f.model.as_str(), f.block_size),
            (8100, "/models/llama", Some(32))
        );
        let cfg = vec![
            "m".to_owned(),
            "--kv-events-config".to_owned(),
            r#"{"publisher":"zmq","endpoint":"tcp://*:5600"}"#.to_owned(),
        ];
        assert_eq!(
            read_engine_facts(Launch::Engine(EngineKind::Vllm), &cfg)
                .unwrap()
                .kv_events_port,
            Some(5600)
        );
        let sim = args("--engine sglang --served-model-name s --port 9000");
        let f = read_engine_facts(Launch::from_word("sim", &sim).unwrap(), &sim).unwrap();
        assert_eq!((f.kind, f.port), (EngineKind::Sglang, 9000));
        assert!(
            read_engine_facts(Launch::Engine(EngineKind::Vllm), &args("--port 1"))
                .unwrap_err()
                .contains("no model")
        );
        assert!(read_engine_facts(Launch::Engine(EngineKind::Vllm), &args("m --port x")).is_err());
    }
}
