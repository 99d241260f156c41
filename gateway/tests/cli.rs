//! The `infera-gateway` binary: `--help` names every flag of the earlier server, and a
//! setting that cannot work stops start-up with a message saying what to change.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_infera-gateway");

#[test]
fn help_lists_the_earlier_servers_flags() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--host",
        "--port",
        "--router-mode",
        "--router-policy",
        "--router-tokenizer-path",
        "--discovery-backend",
        "--etcd-endpoint",
        "--etcd-prefix",
        "--k8s-label-selector",
        "--k8s-namespace",
        "--kv-event-transport",
        "--nats-server",
        "--request-transport",
        "--kv-overlap-weight",
        "--kv-prefill-overlap-weight",
        "--kv-decode-overlap-weight",
        "--request-max-retries",
        "--breaker-failure-threshold",
        "--breaker-cooldown-s",
        "--breaker-max-cooldown-s",
        "INFERA_PORT",
    ] {
        assert!(help.contains(flag), "--help does not mention {flag}");
    }
}

#[test]
fn unusable_settings_stop_startup_with_a_reason() {
    let out = Command::new(BIN)
        .args(["--kv-decode-overlap-weight=-2", "--port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("--kv-decode-overlap-weight must be zero or positive"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args([
            "--router-policy",
            "kv-aware",
            "--router-tokenizer-path",
            "/nonexistent/tok",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("--router-tokenizer-path"),
        "a bad tokenizer path is named"
    );
    let out = Command::new(BIN)
        .args(["--port", "0"])
        .env("INFERA_DISCOVERY_BACKEND", "static")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("--static-workers"),
        "environment variables are read"
    );
}
