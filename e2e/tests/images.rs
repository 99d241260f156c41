//! `scripts/images push`, the documented way to put Infera's images in a registry of the
//! user's choosing, against a real registry: Debian's `docker-registry` (the CNCF
//! distribution server) on loopback. Each pushed image must run as the chart declares
//! (non-root user, the component's entry point).
//!
//! Run by `scripts/test` in its cluster stage, after `scripts/cluster create` built the
//! binaries the images take (`--no-cargo`: no cargo build inside a running `cargo test`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::repo;
use infera_testkit::process::{ServerProcess, free_port};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// (image, entry point, title label)
const PARTS: &[(&str, &str, &str)] = &[
    (
        "operator",
        "/usr/local/bin/infera-operator",
        "infera-operator",
    ),
    ("gateway", "/usr/local/bin/infera-gateway", "infera-gateway"),
    (
        "engine-sidecar",
        "/usr/local/bin/infera-engine-sidecar",
        "infera-engine-sidecar",
    ),
    ("sim", "/usr/local/bin/infera-sim", "infera-sim"),
    ("kvd", "/usr/local/bin/infera-kvd", "infera-kvd"),
    ("cli", "/usr/local/bin/infera", "infera"),
    ("downloader", "python3", "infera-downloader"),
];

fn registry_binary() -> std::path::PathBuf {
    let path = Path::new("/usr/bin/docker-registry");
    assert!(
        path.exists(),
        "this test needs Debian's docker-registry (apt-get install docker-registry)"
    );
    path.to_owned()
}

async fn get_json(http: &reqwest::Client, url: &str, accept: &str) -> Value {
    let resp = http.get(url).header("accept", accept).send().await.unwrap();
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.json().await.unwrap()
}

#[tokio::test]
async fn images_push_to_a_registry_and_run_as_the_chart_declares() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nstorage:\n  filesystem: {{rootdirectory: {}}}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let _registry = ServerProcess::start(
        &registry_binary(),
        &["serve".into(), config.display().to_string()],
        &dir.path().join("registry.log"),
    )
    .unwrap();
    let http = infera_e2e::http();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(format!("{base}/v2/")).send().await.is_err() {
        assert!(Instant::now() < deadline, "the registry did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let target = format!("127.0.0.1:{port}/infera");
    let out = tokio::process::Command::new(repo().join("scripts/images"))
        .args([
            "push",
            &target,
            "--tag",
            "e2e",
            "--tls-verify=false",
            "--no-cargo",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/images push: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let catalog = get_json(&http, &format!("{base}/v2/_catalog"), "application/json").await;
    for (part, entrypoint, title) in PARTS {
        let name = format!("infera/infera-{part}");
        assert!(
            catalog["repositories"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == name.as_str()),
            "{name} not pushed: {catalog}"
        );
        let manifest = get_json(
            &http,
            &format!("{base}/v2/{name}/manifests/e2e"),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .await;
        let digest = manifest["config"]["digest"].as_str().unwrap();
        let image = get_json(
            &http,
            &format!("{base}/v2/{name}/blobs/{digest}"),
            "application/octet-stream",
        )
        .await;
        let config = &image["config"];
        assert_eq!(config["User"], "65532:65532", "{name}: {config}");
        assert_eq!(config["Entrypoint"][0], *entrypoint, "{name}: {config}");
        assert_eq!(
            config["Labels"]["org.opencontainers.image.title"], *title,
            "{name}"
        );
    }
}
