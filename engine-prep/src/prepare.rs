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
    /// Variables to remove from the inherited environment.
    pub unset: Vec<String>,
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

/// The flag that sets the engine's HTTP port. ATOM's `--port` is its internal torch
/// master port (default 8006); its OpenAI server listens on `--server-port`.
pub fn http_port_flag(launch: Launch) -> &'static str {
    match launch {
        Launch::Engine(EngineKind::Atom) => "--server-port",
        _ => "--port",
    }
}

/// The variables that carry the RoCEv2 GID index, one per transfer engine (Mooncake,
/// RCCL, MoRI).
pub const GID_VARS: [&str; 3] = ["MC_GID_INDEX", "NCCL_IB_GID_INDEX", "MORI_IB_GID_INDEX"];

/// Whether `name` can be a model link: a relative path of plain segments (an ATOM worker
/// loads its served name, linked to the weights, from its working directory).
pub fn is_linkable_model_name(name: &str) -> bool {
    !name.is_empty()
        && std::path::Path::new(name)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// The flags naming the model: where `launch` reads its weights (`model_path`) and the
/// name it serves (`served`). ATOM has no `--served-model-name` and answers to the model
/// it loads, so it loads `served`, and the link `served` -> `model_path` is returned for
/// the caller to make in the engine's working directory.
pub fn model_flags(
    launch: Launch,
    model_path: &str,
    served: &str,
) -> (Vec<String>, Option<(String, String)>) {
    let path = model_path.to_owned();
    let mut flags = match launch {
        Launch::Engine(EngineKind::Atom) => {
            let link = (served.to_owned(), path);
            return (vec!["--model".into(), served.to_owned()], Some(link));
        }
        _ => match launch.engine() {
            EngineKind::Vllm => vec![path],
            EngineKind::Sglang => vec!["--model-path".into(), path],
            EngineKind::Atom => vec!["--model".into(), path],
        },
    };
    flags.extend(["--served-model-name".into(), served.to_owned()]);
    (flags, None)
}

/// The variable through which an ATOM image with the earlier launchers' KV-event hook
/// (a `.pth` bootstrap patching its block manager) publishes KV events: ATOM itself has
/// no KV-event flag.
pub const ATOM_KV_EVENTS_ENV: &str = "INFERA_ATOM_KV_EVENTS_ENDPOINT";

/// The engine's `--kv-cache-dtype` value for an FP8 KV cache (SGLang names the format).
pub fn fp8_kv_cache_dtype(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Sglang => "fp8_e4m3",
        EngineKind::Vllm | EngineKind::Atom => "fp8",
    }
}

/// The `--kv-events-config` of `launch` publishing on `port`. vLLM publishes only with
/// `enable_kv_cache_events`; SGLang refuses keys it does not know, so it gets none.
pub fn kv_events_config(launch: Launch, port: u16) -> String {
    let endpoint = format!("tcp://*:{port}");
    match launch {
        Launch::Engine(EngineKind::Sglang) | Launch::Sim(EngineKind::Sglang | EngineKind::Atom) => {
            format!(r#"{{"publisher":"zmq","endpoint":"{endpoint}","topic":"kv-events"}}"#)
        }
        _ => format!(
            r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"{endpoint}","topic":"kv-events"}}"#
        ),
    }
}

/// What a launch is prepared from.
#[derive(Clone, Copy)]
pub struct PrepareInput<'a> {
    /// What runs.
    pub launch: Launch,
    /// The user's engine flags (after the launcher's words).
    pub args: &'a [String],
    /// Program of `sim`.
    pub sim_binary: &'a str,
    /// The port chosen for KV events when they are on and the user gave no config.
    pub kv_events_port: Option<u16>,
    /// The RoCEv2 GID index, when known here (the node's is found at start otherwise).
    pub gid_index: Option<u32>,
    /// Which variables the user already set (they are left alone).
    pub env_is_set: &'a dyn Fn(&str) -> bool,
}

/// Builds the launch: the user's flags plus what routing needs, and the earlier
/// launchers' defaults.
pub fn prepare_engine(input: &PrepareInput<'_>) -> PreparedEngine {
    let launch = input.launch;
    let (program, mut full) = launcher(launch, input.sim_binary);
    full.extend(input.args.iter().cloned());
    let mut notes = Vec::new();
    let mut env = Vec::new();
    let add = |full: &mut Vec<String>,
               notes: &mut Vec<String>,
               flag: &str,
               value: Option<String>,
               why: &str| {
        if !has_flag(full, flag) {
            full.push(flag.to_owned());
            if let Some(v) = value {
                full.push(v);
            }
            notes.push(format!("added {flag}: {why}"));
        }
    };
    let set = |env: &mut Vec<(String, String)>,
               notes: &mut Vec<String>,
               name: &str,
               value: String,
               why: &str| {
        if !(input.env_is_set)(name) && !env.iter().any(|(n, _)| n == name) {
            notes.push(format!("set {name}={value} ({why})"));
            env.push((name.to_owned(), value));
        }
    };
    match (launch, input.kv_events_port) {
        (Launch::Engine(EngineKind::Atom), Some(port)) => set(
            &mut env,
            &mut notes,
            ATOM_KV_EVENTS_ENV,
            format!("tcp://*:{port}"),
            "KV events for kv-aware routing, from images with the KV-event hook",
        ),
        (_, Some(port)) => add(
            &mut full,
            &mut notes,
            "--kv-events-config",
            Some(kv_events_config(launch, port)),
            "KV events for kv-aware routing",
        ),
        (_, None) => {}
    }
    if let Launch::Engine(engine @ (EngineKind::Vllm | EngineKind::Sglang)) = launch {
        add(
            &mut full,
            &mut notes,
            "--kv-cache-dtype",
            Some(fp8_kv_cache_dtype(engine).into()),
            "fp8 KV cache, as the earlier launchers chose",
        );
    }
    if launch == Launch::Engine(EngineKind::Sglang) {
        add(
            &mut full,
            &mut notes,
            "--enable-metrics",
            None,
            "the sidecar reads the engine's load from /metrics",
        );
    }
    if launch == Launch::Engine(EngineKind::Vllm) {
        set(
            &mut env,
            &mut notes,
            "VLLM_ROCM_USE_AITER",
            "1".into(),
            "AMD's AITER kernels; some ROCm configurations need them (0 opts out)",
        );
        if has_flag(&full, "--kv-events-config") {
            set(
                &mut env,
                &mut notes,
                "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES",
                "1".into(),
                "KV events carry integer block hashes, as the earlier launchers asked",
            );
        }
    }
    if let Some(gid) = input.gid_index {
        for name in GID_VARS {
            set(
                &mut env,
                &mut notes,
                name,
                gid.to_string(),
                "RoCEv2 GID index",
            );
        }
    }
    PreparedEngine {
        program,
        args: full,
        env,
        unset: Vec::new(),
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn prepare(launch: Launch, argv: &str, kv: Option<u16>, gid: Option<u32>) -> PreparedEngine {
        prepare_engine(&PrepareInput {
            launch,
            args: &args(argv),
            sim_binary: "/bin/infera-sim",
            kv_events_port: kv,
            gid_index: gid,
            env_is_set: &|name| name == "VLLM_ROCM_USE_AITER",
        })
    }

    fn env(p: &PreparedEngine, name: &str) -> Option<String> {
        p.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn vllm_gets_kv_events_and_fp8_unless_given() {
        let p = prepare(
            Launch::Engine(EngineKind::Vllm),
            "/m --port 8000",
            Some(5557),
            Some(3),
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
                r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}"#,
                "--kv-cache-dtype",
                "fp8"
            ]
        );
        assert_eq!(env(&p, "NCCL_IB_GID_INDEX").as_deref(), Some("3"));
        assert_eq!(
            env(&p, "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES").as_deref(),
            Some("1")
        );
        assert_eq!(env(&p, "VLLM_ROCM_USE_AITER"), None, "the user set it");
        let user = prepare(
            Launch::Engine(EngineKind::Vllm),
            "/m --kv-cache-dtype auto",
            None,
            None,
        );
        assert_eq!(
            user.args,
            args("serve /m --kv-cache-dtype auto"),
            "the user's choice wins"
        );
        assert_eq!(env(&user, "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"), None);
    }

    #[test]
    fn sglang_atom_and_sim() {
        let p = prepare(
            Launch::Engine(EngineKind::Sglang),
            "--model-path /m",
            Some(5557),
            None,
        );
        assert_eq!(
            p.args,
            args(
                r#"-m sglang.launch_server --model-path /m --kv-events-config {"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"} --kv-cache-dtype fp8_e4m3 --enable-metrics"#
            )
        );
        let atom = prepare(
            Launch::Engine(EngineKind::Atom),
            "--model m",
            Some(5557),
            None,
        );
        assert_eq!(
            atom.args,
            args("-m atom.entrypoints.openai_server --model m"),
            "ATOM has no KV-event or kv-cache-dtype flag of these names"
        );
        assert_eq!(
            env(&atom, ATOM_KV_EVENTS_ENV).as_deref(),
            Some("tcp://*:5557")
        );
        assert_eq!(
            http_port_flag(Launch::Engine(EngineKind::Atom)),
            "--server-port"
        );
        assert_eq!(http_port_flag(Launch::Sim(EngineKind::Atom)), "--port");
        let s = prepare(Launch::Sim(EngineKind::Vllm), "--port 9", Some(7000), None);
        assert_eq!(s.program, "/bin/infera-sim");
        assert_eq!(s.args[..2], args("--port 9")[..]);
        assert!(s.env.is_empty(), "the simulator needs no engine defaults");
    }

    #[test]
    fn model_flags_name_the_weights_and_the_served_name() {
        let flags = |launch| model_flags(launch, "/w", "org/m");
        assert_eq!(
            flags(Launch::Engine(EngineKind::Vllm)),
            (args("/w --served-model-name org/m"), None)
        );
        assert_eq!(
            flags(Launch::Engine(EngineKind::Sglang)),
            (args("--model-path /w --served-model-name org/m"), None)
        );
        assert_eq!(
            flags(Launch::Engine(EngineKind::Atom)),
            (
                args("--model org/m"),
                Some(("org/m".to_owned(), "/w".to_owned()))
            )
        );
        assert_eq!(
            flags(Launch::Sim(EngineKind::Atom)),
            (args("--model /w --served-model-name org/m"), None),
            "the simulator takes a served name"
        );
        for (name, ok) in [
            ("org/m", true),
            ("m", true),
            ("/abs", false),
            ("a/../b", false),
            ("", false),
        ] {
            assert_eq!(is_linkable_model_name(name), ok, "{name}");
        }
    }
}
