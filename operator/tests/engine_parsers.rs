//! Every engine command line Infera produces, parsed by the engine's own argument
//! parser at the version the examples pin: vLLM 0.25.1 and SGLang 0.5.17 imported from
//! their wheels (`testenv/engine-parsers`: installed with `--no-deps` beside the light
//! dependencies their parsers import, torch and triton stubbed as `stubs.py` lists), and
//! ATOM 0.1.4 rebuilt from the fixture `atom_fixture.py` generated from its source at
//! that tag (ATOM is not on PyPI).
//!
//! The command lines: what the operator renders for every example, and for variants
//! covering each engine, each connector, mixed and prefill/decode workers, multi-node
//! leaders and followers, kvd, and every quantization and KV-cache dtype; and what the
//! sidecar adds when it launches an engine itself. A bogus flag must fail each parser.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use infera_engine_prep::Launch;
use infera_engine_prep::prepare::{PrepareInput, launcher, prepare_engine};
use infera_operator::api::{
    InferaDeployment, KvCacheDtype, PDTopology, Quantization, TransportBackend,
};
use infera_operator::plan::{Images, Observed, Platform};
use infera_operator::render::{Kind, render};
use infera_proto::worker::EngineKind;
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One command line for one engine's parser.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    engine: EngineKind,
    argv: Vec<String>,
}

/// What the kubelet substitutes for `$(VAR)` in an engine pod's command.
fn expand(arg: &str) -> String {
    [
        ("$(POD_NAME)", "qwen-prefill-0"),
        ("$(POD_IP)", "10.0.3.7"),
        ("$(POD_NAMESPACE)", "infera"),
        ("$(NODE_NAME)", "node-1"),
        ("$(LWS_LEADER_ADDRESS)", "r1-mixed-0.r1-mixed.infera"),
        ("$(LWS_WORKER_INDEX)", "1"),
    ]
    .iter()
    .fold(arg.to_owned(), |a, (var, value)| a.replace(var, value))
}

/// The engine's arguments in a container command: after the node-env wrapper and the
/// launcher's own words (`vllm serve`, `python3 -m ...`); none for the simulator.
fn engine_argv(command: &[String]) -> Option<(EngineKind, Vec<String>)> {
    let command = match command.first().map(String::as_str) {
        Some("/bin/sh") => &command[4..],
        _ => command,
    };
    for engine in [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Atom] {
        let (program, words) = launcher(Launch::Engine(engine), "");
        let n = words.len() + 1;
        if command.first() == Some(&program) && command.get(1..n) == Some(&words[..]) {
            return Some((engine, command[n..].iter().map(|a| expand(a)).collect()));
        }
    }
    None
}

/// Every engine container of `dep` (StatefulSet pods, LeaderWorkerSet leaders and
/// followers) as cases named after `label`.
fn rendered(label: &str, dep: &InferaDeployment, topos: &[PDTopology]) -> Vec<Case> {
    let topology = topos
        .iter()
        .find(|t| t.metadata.name.as_deref() == dep.spec.serving.topology_ref.as_deref());
    let platform = Platform::with_images(Images::from_registry("r", "t"));
    let observed = Observed {
        topology,
        model_ready: true,
        ..Default::default()
    };
    let r = render(dep, observed, &platform).unwrap_or_else(|e| panic!("{label}: {e}"));
    let mut out = Vec::new();
    for child in &r.children {
        let templates: Vec<(&str, &Value)> = match child.kind {
            Kind::StatefulSet => vec![("", &child.object["spec"]["template"])],
            Kind::LeaderWorkerSet => {
                let t = &child.object["spec"]["leaderWorkerTemplate"];
                vec![
                    ("/leader", &t["leaderTemplate"]),
                    ("/follower", &t["workerTemplate"]),
                ]
            }
            _ => continue,
        };
        for (place, pod) in templates {
            let engine = pod["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "engine")
                .unwrap();
            let command: Vec<String> = serde_json::from_value(engine["command"].clone()).unwrap();
            if let Some((kind, argv)) = engine_argv(&command) {
                out.push(Case {
                    name: format!("{label}: {}{place}", child.name),
                    engine: kind,
                    argv,
                });
            }
        }
    }
    out
}

/// The examples, then variants for what no example shows.
fn operator_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for dir in support::example_dirs() {
        let (deps, topos) = support::load_manifests(&dir.join("deployment.yaml"));
        let label = dir.file_name().unwrap().to_string_lossy().into_owned();
        for dep in &deps {
            cases.extend(rendered(&label, dep, &topos));
        }
    }
    // vLLM over MoRI, writing and reading.
    let (deps, topos) = support::example("vllm-2p1d-mooncake");
    for read in [false, true] {
        let mut t = topos.clone();
        t[0].spec.transport.backend = TransportBackend::Mori;
        t[0].spec.transport.read_mode = read;
        cases.extend(rendered(&format!("vllm mori read={read}"), &deps[0], &t));
    }
    // SGLang over Mooncake; SGLang mixed on one node.
    let (deps, topos) = support::example("sglang-1p1d-mori");
    let mut t = topos.clone();
    t[0].spec.transport.backend = TransportBackend::Mooncake;
    cases.extend(rendered("sglang mooncake", &deps[0], &t));
    let (deps, topos) = support::example("multi-node-worker");
    let mut one = deps[0].clone();
    one.spec.engine.parallelism.nodes_per_worker = 1;
    one.spec.engine.parallelism.gpus_per_worker = None;
    one.spec.engine.parallelism.tensor_parallel_size = 8;
    cases.extend(rendered("sglang mixed", &one, &topos));
    // vLLM spanning nodes (leader and headless follower), with data parallelism.
    let (deps, topos) = support::example("vllm-mixed-fp8-mi355x");
    let mut multi = deps[0].clone();
    multi.spec.engine.parallelism.nodes_per_worker = 2;
    multi.spec.engine.parallelism.data_parallel_size = 2;
    cases.extend(rendered("vllm multi-node", &multi, &topos));
    // Every quantization and KV-cache dtype, on each engine.
    for (name, engine_example) in [
        ("vllm", "mxfp4"),
        ("sglang", "multi-node-worker"),
        ("atom", "atom-1p2d"),
    ] {
        let (deps, topos) = support::example(engine_example);
        for q in [Quantization::Bf16, Quantization::Fp8, Quantization::Mxfp4] {
            for dtype in [KvCacheDtype::Auto, KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
                let mut d = deps[0].clone();
                d.spec.model.quantization = q;
                d.spec.engine.kv_cache_dtype = dtype;
                let label = format!("{name} {q:?} kv {dtype:?}");
                cases.extend(rendered(&label, &d, &topos));
            }
        }
    }
    // ATOM mixed; vLLM mixed with kvd.
    let (deps, topos) = support::example("atom-1p2d");
    let mut mixed = deps[0].clone();
    mixed.spec.serving.mode = infera_operator::api::ServingMode::Mixed;
    mixed.spec.serving.topology_ref = None;
    cases.extend(rendered("atom mixed", &mixed, &topos));
    let (mut deps, topos) = support::example("mxfp4");
    deps[0].spec.kv_cache.enabled = true;
    cases.extend(rendered("vllm mixed kvd", &deps[0], &topos));
    cases
}

/// What the sidecar launches when it runs the engine itself (`infera up`, or by hand).
fn launched_cases() -> Vec<Case> {
    let user: [(EngineKind, &str); 3] = [
        (
            EngineKind::Vllm,
            "/models/m --served-model-name m --port 31000 --tensor-parallel-size 2",
        ),
        (
            EngineKind::Sglang,
            "--model-path /models/m --served-model-name m --port 31000 --tensor-parallel-size 2",
        ),
        (
            EngineKind::Atom,
            "--model org/m --server-port 31000 --tensor-parallel-size 2",
        ),
    ];
    user.into_iter()
        .map(|(engine, argv)| {
            let args: Vec<String> = argv.split_whitespace().map(str::to_owned).collect();
            let prepared = prepare_engine(&PrepareInput {
                launch: Launch::Engine(engine),
                args: &args,
                sim_binary: "infera-sim",
                kv_events_port: Some(40123),
                gid_index: Some(1),
                env_is_set: &|_| false,
            });
            let mut command = vec![prepared.program];
            command.extend(prepared.args);
            let (kind, argv) = engine_argv(&command).unwrap();
            Case {
                name: format!("sidecar launches {}", engine.as_str()),
                engine: kind,
                argv,
            }
        })
        .collect()
}

fn parsers_dir() -> PathBuf {
    support::repo().join("testenv/engine-parsers")
}

/// Runs `check.py` for `engine` over `cases`: one JSON result per case.
fn check(engine: EngineKind, cases: &[Case]) -> Vec<Value> {
    let dir = parsers_dir();
    let (python, extra): (PathBuf, Vec<String>) = match engine {
        EngineKind::Vllm => (
            infera_testkit::python_tools::python_with_requirements(&dir.join("vllm-0.25.1.txt"))
                .unwrap(),
            Vec::new(),
        ),
        EngineKind::Sglang => (
            infera_testkit::python_tools::python_with_requirements(&dir.join("sglang-0.5.17.txt"))
                .unwrap(),
            Vec::new(),
        ),
        EngineKind::Atom => (
            "python3".into(),
            vec![
                "--fixture".into(),
                dir.join("atom-0.1.4.json").display().to_string(),
            ],
        ),
    };
    let input: Vec<Value> = cases
        .iter()
        .map(|c| json!({"name": c.name, "argv": c.argv}))
        .collect();
    let mut child = Command::new(python)
        .arg(dir.join("check.py"))
        .arg(engine.as_str())
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&input).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "check.py {}: {}",
        engine.as_str(),
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), cases.len(), "one result per case");
    results
}

#[test]
fn every_engine_command_line_parses_with_the_engines_own_parser() {
    let mut all = operator_cases();
    all.extend(launched_cases());
    for engine in [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Atom] {
        let mut cases: Vec<Case> = all.iter().filter(|c| c.engine == engine).cloned().collect();
        assert!(
            cases.len() >= 5,
            "{}: {} cases",
            engine.as_str(),
            cases.len()
        );
        // The negative control: the first accepted command line with a flag no engine has.
        let mut bogus = cases[0].clone();
        bogus.name = "negative control".into();
        bogus.argv.push("--bogus-flag".into());
        cases.push(bogus);
        eprintln!(
            "{}: {} command lines and the negative control",
            engine.as_str(),
            cases.len() - 1
        );
        let results = check(engine, &cases);
        let (control, results) = results.split_last().unwrap();
        assert_eq!(control["ok"], false, "{}: {control}", engine.as_str());
        assert!(
            control["error"].as_str().unwrap().contains("--bogus-flag"),
            "{control}"
        );
        let refused: Vec<String> = results
            .iter()
            .zip(&cases)
            .filter(|(r, _)| r["ok"] != true)
            .map(|(r, c)| format!("{}: {}\n  argv: {}", c.name, r["error"], c.argv.join(" ")))
            .collect();
        assert!(
            refused.is_empty(),
            "{} refused:\n{}",
            engine.as_str(),
            refused.join("\n")
        );
        for (r, c) in results.iter().zip(&cases) {
            let parsed = &r["parsed"];
            match engine {
                // vLLM publishes KV events only when the config says so.
                EngineKind::Vllm => {
                    assert_eq!(parsed["kv_events_enabled"], true, "{}: {parsed}", c.name)
                }
                EngineKind::Sglang => assert_eq!(
                    parsed["kv_events_endpoint"]
                        .as_str()
                        .map(|e| e.starts_with("tcp://*:")),
                    Some(true),
                    "{}: {parsed}",
                    c.name
                ),
                // ATOM answers on --server-port and to the model it loads.
                EngineKind::Atom => {
                    assert!(
                        matches!(parsed["server_port"].as_u64(), Some(8000 | 31000)),
                        "{}: {parsed}",
                        c.name
                    );
                    assert!(
                        parsed["model"].as_str().unwrap().contains('/'),
                        "{}: {parsed}",
                        c.name
                    );
                }
            }
        }
    }
}
