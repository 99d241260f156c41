//! `infera up` as a user runs it: the built-in mixed example and the 1P1D example with
//! `--check`, a long-running `up` answering the OpenAI API and stopping on Ctrl-C with
//! nothing left listening, registration in a real etcd, and a clear refusal of an
//! engine that is not installed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_infera");

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
        .display()
        .to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn up(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).arg("up").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_on_the_default_example_shows_cache_aware_routing() {
    let port = free_port().to_string();
    let (code, out, err) = up(&["--check", "--port", &port]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("examples/local/deployment.yaml (built in)"),
        "{out}"
    );
    assert!(out.contains("[2/2] mixed worker 127.0.0.1:"), "{out}");
    assert!(
        out.contains(&format!("OpenAI API on http://127.0.0.1:{port}/v1")),
        "{out}"
    );
    assert!(out.contains("curl -s http://127.0.0.1:"), "{out}");
    // The second question shares the first one's system prompt: served from its cache.
    let second = out.split("#2 ").nth(1).unwrap();
    let second = second.split("#3 ").next().unwrap();
    assert!(second.contains("were already cached there"), "{second}");
    assert!(
        out.contains("check passed") && out.ends_with("stopped\n"),
        "{out}"
    );
    // The short log: one access line per request with the worker.
    assert_eq!(
        err.matches("request router=\"mixed\" outcome=\"ok\"")
            .count(),
        4,
        "{err}"
    );
}

#[test]
fn check_on_the_1p1d_example_uses_both_legs() {
    let port = free_port().to_string();
    let (code, out, err) = up(&[
        &repo("examples/local-1p1d/deployment.yaml"),
        "--check",
        "--port",
        &port,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("prefill/decode over vllm-mooncake"), "{out}");
    assert_eq!(out.matches("(prefill) + 127.0.0.1:").count(), 4, "{out}");
    assert!(out.contains("check passed"), "{out}");
}

#[test]
fn up_serves_until_ctrl_c_and_leaves_nothing_running() {
    for manifest in [None, Some(repo("examples/local-1p1d/deployment.yaml"))] {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.arg("up").args(["--port", &port.to_string()]);
        if let Some(m) = &manifest {
            cmd.arg(m);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = String::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !seen.contains("Ctrl-C stops everything") {
            assert!(Instant::now() < deadline, "never came up: {seen}");
            seen.push_str(&lines.next().unwrap().unwrap());
            seen.push('\n');
        }
        let body = serde_json::json!({"model": "sim-llama-8b", "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hello"}]});
        let client = reqwest::blocking::Client::new();
        let resp = client
            .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(resp.status(), 200);
        let answer: serde_json::Value = resp.json().unwrap();
        assert!(
            !answer["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .is_empty()
        );
        // Ctrl-C.
        let pid = i32::try_from(child.id()).unwrap();
        // SAFETY: signalling our own child process.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGINT);
        }
        let status = child.wait().unwrap();
        assert!(status.success(), "{status:?}");
        let rest: Vec<String> = lines.map(Result::unwrap).collect();
        assert_eq!(rest.last().map(String::as_str), Some("stopped"), "{rest:?}");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the gateway port is still open"
        );
    }
}

#[test]
fn an_engine_that_is_not_installed_is_refused_with_the_way_out() {
    let (code, out, err) = up(&[&repo("examples/atom-1p2d/deployment.yaml")]);
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains(
            "InferaDeployment atom-r1 runs engine atom, which is not installed on this machine"
        ) && err.contains("infera up --sim"),
        "{err}"
    );
    let (code, _, err) = up(&["/nonexistent.yaml"]);
    assert_eq!(code, 2);
    assert!(err.contains("reading /nonexistent.yaml"), "{err}");
}

#[tokio::test]
async fn with_etcd_workers_register_under_leases_and_leave_on_exit() {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let port = free_port().to_string();
    let out = tokio::process::Command::new(BIN)
        .args(["up", "--check", "--port", &port, "--etcd", &etcd])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("check passed"), "{stdout}");
    // Both records were registered in etcd, and the leases were revoked on exit.
    let workers: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.split("mixed worker ").nth(1))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert_eq!(workers.len(), 2, "{stdout}");
    let mut client = infera_testkit::etcd_client().await.unwrap();
    for w in workers {
        let key = infera_proto::discovery::build_worker_key(
            infera_proto::discovery::DEFAULT_ETCD_PREFIX,
            &w,
        );
        let got = client.get(key.clone(), None).await.unwrap();
        assert!(got.kvs().is_empty(), "{key} is still registered");
    }
}
