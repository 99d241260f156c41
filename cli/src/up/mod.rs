//! `infera up`: runs `InferaDeployment` (and `PDTopology`) manifests on this machine.
//! Simulated engines, the registry and the gateway share this process (no etcd needed);
//! `--etcd` registers in a real etcd instead, which also lets real engines be launched
//! through the sidecar.

pub mod check;
pub mod local;
pub mod manifest;
pub mod plan;

use anyhow::{Context, Result};
use clap::Args;
use infera_proto::worker::EngineKind;
use local::Discovery;
use plan::{PlanOptions, plan};
use std::path::PathBuf;

/// The manifest `infera up` runs without an argument (`examples/local/deployment.yaml`).
pub const DEFAULT_MANIFEST: &str = include_str!("../../../examples/local/deployment.yaml");

/// `infera up` flags.
#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// InferaDeployment/PDTopology manifest (multi-document YAML); default
    /// examples/local/deployment.yaml (two simulated vLLM workers, kv-aware gateway).
    pub manifest: Option<PathBuf>,
    /// Simulate every engine, even those the manifest names as vllm, sglang or atom.
    #[arg(long)]
    pub sim: bool,
    /// Gateway port (default: the manifest's spec.gateway.service.port, 8000).
    #[arg(long)]
    pub port: Option<u16>,
    /// Address the gateway listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Register workers in this etcd (and discover them there) instead of in-process;
    /// needed to launch real engines through the sidecar.
    #[arg(long, value_name = "URL")]
    pub etcd: Option<String>,
    /// Send a few requests, print where each was routed and why, then stop (exit 1 if
    /// one failed).
    #[arg(long)]
    pub check: bool,
}

/// Whether `engine` can be launched here.
fn installed(engine: EngineKind) -> bool {
    let python_module = |m: &str| {
        std::process::Command::new("python3")
            .args(["-c", &format!("import {m}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    match engine {
        EngineKind::Vllm => std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("vllm").is_file())),
        EngineKind::Sglang => python_module("sglang"),
        EngineKind::Atom => python_module("atom"),
    }
}

/// Runs `infera up`; returns the process exit code.
pub async fn run(args: UpArgs) -> Result<i32> {
    let (text, origin) = match &args.manifest {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        None => (
            DEFAULT_MANIFEST.to_owned(),
            "examples/local/deployment.yaml (built in)".to_owned(),
        ),
    };
    let manifests = manifest::parse_manifests(&text, &origin)?;
    let opts = PlanOptions {
        sim: args.sim,
        port: args.port,
        etcd: args.etcd.is_some(),
    };
    let plan = plan(&manifests, &opts, &installed)?;
    println!("infera up: {origin}");
    let discovery = match &args.etcd {
        Some(url) => Discovery::Etcd(url.clone()),
        None => Discovery::InProcess,
    };
    let cluster = local::start(&plan, &args.host, discovery).await?;
    let url = cluster.url();
    let first = &plan.deployments[0];
    let completions_only = first.protocol().is_some_and(|p| p.completions_only());
    println!(
        "\nOpenAI API on {url}/v1 (models: {})",
        plan.deployments
            .iter()
            .map(|d| d.model())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if completions_only {
        println!(
            "  curl -s {url}/v1/completions -H 'content-type: application/json' -d '{{\"model\":\"{}\",\"prompt\":\"Hello\",\"max_tokens\":16}}'",
            first.model()
        );
    } else {
        println!(
            "  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"max_tokens\":16}}'",
            first.model()
        );
    }
    println!("  workers: {url}/v1/workers   metrics: {url}/metrics");
    let code = if args.check {
        let ok = check::run_check(
            &cluster,
            first.model(),
            plan.gateway.routing.policy,
            completions_only,
        )
        .await?;
        i32::from(!ok)
    } else {
        println!("Ctrl-C stops everything.\n");
        wait_for_stop().await?;
        println!("\nstopping");
        0
    };
    cluster.shutdown().await;
    println!("stopped");
    Ok(code)
}

async fn wait_for_stop() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}
