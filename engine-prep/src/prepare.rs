//! Preparing the engine's command line and environment (pure): what the sidecar adds to
//! the user's flags before launching, each addition logged. Set-if-unset throughout: a
//! flag or variable the user gave always wins.

use crate::Launch;
use crate::flags::has_flag;
use infera_proto::worker::EngineKind;

/// A prepared launch.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedEngine {
    /// Program.
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment additions.
    pub env: Vec<(String, String)>,
    /// What was added and why, for the log.
    pub notes: Vec<String>,
}

/// The program that runs `launch` and the words before its flags (`vllm serve`,
/// `python3 -m sglang.launch_server`, ...).
pub fn launcher(launch: Launch, sim_binary: &str) -> (String, Vec<String>) {
    match launch {
        Launch::Engine(EngineKind::Vllm) => ("vllm".into(), vec!["serve".into()]),
        Launch::Engine(EngineKind::Sglang) => (
            "python3".into(),
            vec!["-m".into(), "sglang.launch_server".into()],
        ),
        Launch::Engine(EngineKind::Atom) => (
            "python3".into(),
            vec!["-m".into(), "atom.entrypoints.openai_server".into()],
        ),
        Launch::Sim(_) => (sim_binary.to_owned(), Vec::new()),
    }
}

/// The engine's `--kv-cache-dtype` value for an FP8 KV cache (SGLang names the format).
pub fn fp8_kv_cache_dtype(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Sglang => "fp8_e4m3",
        EngineKind::Vllm | EngineKind::Atom => "fp8",
    }
}

/// Builds the launch for `launch` with the user's `args`; `kv_events_port` is the free
/// port chosen for KV events when they are on and the user gave no config;
/// `env_is_set` says which variables the user already set (they are left alone).
pub fn prepare_engine(
    launch: Launch,
    args: &[String],
    sim_binary: &str,
    kv_events_port: Option<u16>,
    gid_index: Option<u32>,
    env_is_set: &dyn Fn(&str) -> bool,
) -> PreparedEngine {
    let (program, mut full) = launcher(launch, sim_binary);
    full.extend(args.iter().cloned());
    let mut notes = Vec::new();
    let mut add = |full: &mut Vec<String>, flag: &str, value: Option<String>, why: &str| {
        if !has_flag(full, flag) {
            full.push(flag.to_owned());
            if let Some(v) = value {
                full.push(v);
            }
            notes.push(format!("added {flag}: {why}"));
        }
    };
    if let Some(port) = kv_events_port {
        let config =
            format!(r#"{{"publisher":"zmq","endpoint":"tcp://*:{port}","topic":"kv-events"}}"#);
        add(
            &mut full,
            "--kv-events-config",
            Some(config),
            "KV events for kv-aware routing",
        );
    }
    if let Launch::Engine(engine @ (EngineKind::Vllm | EngineKind::Sglang)) = launch {
        add(
            &mut full,
            "--kv-cache-dtype",
            Some(fp8_kv_cache_dtype(engine).into()),
            "fp8 KV cache, as the earlier launchers chose",
        );
    }
    if launch == Launch::Engine(EngineKind::Sglang) {
        add(
            &mut full,
            "--enable-metrics",
            None,
            "the sidecar reads the engine's load from /metrics",
        );
    }
    let mut env = Vec::new();
    if let Some(gid) = gid_index {
        for name in ["MC_GID_INDEX", "NCCL_IB_GID_INDEX", "MORI_IB_GID_INDEX"] {
            if !env_is_set(name) {
                env.push((name.to_owned(), gid.to_string()));
                notes.push(format!("set {name}={gid} (RoCEv2 GID index)"));
            }
        }
    }
    PreparedEngine {
        program,
        args: full,
        env,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn vllm_gets_kv_events_and_fp8_unless_given() {
        let p = prepare_engine(
            Launch::Engine(EngineKind::Vllm),
            &args("/m --port 8000"),
            "infera-sim",
            Some(5557),
            Some(3),
            &|_| false,
        );
        assert_eq!(p.program, "vllm");
        assert_eq!(
            p.args,
            vec![
                "serve",
                "/m",
                "--port",
                "8000",
                "--kv-events-config",
                r#"{"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}"#,
                "--kv-cache-dtype",
                "fp8"
            ]
        );
        assert!(
            p.env
                .contains(&("NCCL_IB_GID_INDEX".to_owned(), "3".to_owned()))
        );
        let user = prepare_engine(
            Launch::Engine(EngineKind::Vllm),
            &args("/m --kv-cache-dtype auto"),
            "x",
            None,
            None,
            &|_| false,
        );
        assert_eq!(
            user.args,
            args("serve /m --kv-cache-dtype auto"),
            "the user's choice wins"
        );
    }

    #[test]
    fn sglang_and_sim() {
        let p = prepare_engine(
            Launch::Engine(EngineKind::Sglang),
            &args("--model-path /m"),
            "x",
            None,
            None,
            &|_| false,
        );
        assert_eq!(
            p.args,
            args(
                "-m sglang.launch_server --model-path /m --kv-cache-dtype fp8_e4m3 --enable-metrics"
            )
        );
        let s = prepare_engine(
            Launch::Sim(EngineKind::Vllm),
            &args("--port 9"),
            "/bin/infera-sim",
            Some(7000),
            None,
            &|_| false,
        );
        assert_eq!(s.program, "/bin/infera-sim");
        assert_eq!(s.args[..2], args("--port 9")[..]);
    }
}
