//! What the sidecar needs to know from the engine's own flags (pure): its port, served
//! model name, page size, KV-event endpoint, data-parallel size and, for `sim`, which
//! engine it imitates.

use crate::cli::EngineArg;
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

/// The value of `flag` (`--flag value` or `--flag=value`), last one winning.
pub fn flag_value<'a>(args: &'a [String], names: &[&str]) -> Option<&'a str> {
    let mut found = None;
    for (i, a) in args.iter().enumerate() {
        for name in names {
            if a == name {
                found = args.get(i + 1).map(String::as_str);
            } else if let Some(v) = a.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
                found = Some(v);
            }
        }
    }
    found
}

fn default_port(engine: EngineArg) -> u16 {
    match engine {
        EngineArg::Sglang => 30000,
        EngineArg::Vllm | EngineArg::Atom | EngineArg::Sim => 8000,
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
pub fn read_engine_facts(engine: EngineArg, args: &[String]) -> Result<EngineFacts, String> {
    let port = match flag_value(args, &["--port"]) {
        Some(p) => p
            .parse()
            .map_err(|_| format!("engine flag --port {p:?} is not a port"))?,
        None => default_port(engine),
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
    let kind = match engine {
        EngineArg::Vllm => EngineKind::Vllm,
        EngineArg::Sglang => EngineKind::Sglang,
        EngineArg::Atom => EngineKind::Atom,
        EngineArg::Sim => match flag_value(args, &["--engine"]) {
            Some("sglang") => EngineKind::Sglang,
            Some("atom") => EngineKind::Atom,
            _ => EngineKind::Vllm,
        },
    };
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
            EngineArg::Sglang,
            &args("--model-path /models/q --served-model-name q --page-size 64 --dp 2"),
        )
        .unwrap();
        assert_eq!(
            (f.kind, f.port, f.model.as_str(), f.block_size, f.dp_size),
            (EngineKind::Sglang, 30000, "q", Some(64), 2)
        );
        let f = read_engine_facts(
            EngineArg::Vllm,
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
            read_engine_facts(EngineArg::Vllm, &cfg)
                .unwrap()
                .kv_events_port,
            Some(5600)
        );
        let f = read_engine_facts(
            EngineArg::Sim,
            &args("--engine sglang --served-model-name s --port 9000"),
        )
        .unwrap();
        assert_eq!((f.kind, f.port), (EngineKind::Sglang, 9000));
        assert!(
            read_engine_facts(EngineArg::Vllm, &args("--port 1"))
                .unwrap_err()
                .contains("no model")
        );
        assert!(read_engine_facts(EngineArg::Vllm, &args("m --port x")).is_err());
    }
}
