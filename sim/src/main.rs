//! The `infera-sim` command: starts the workers, prints where they listen, and runs
//! until interrupted.

use anyhow::Result;
use infera_prompt::PromptCodec;
use infera_sim::cli::parse_lenient;
use infera_sim::worker::{build_generator, start_worker};
use std::sync::Arc;

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("infera-sim: {e:#}");
        std::process::exit(2);
    }
}

async fn run() -> Result<()> {
    let _telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera-sim",
        default_filter: "info".into(),
        ..Default::default()
    })?;
    let (cli, ignored) = match parse_lenient(std::env::args().collect()) {
        Ok(parsed) => parsed,
        Err(e) => e.exit(),
    };
    for flag in ignored {
        tracing::warn!("ignoring engine flag the simulator does not model: {flag}");
    }
    let configs = cli.worker_configs()?;
    let codec = Arc::new(match &cli.tokenizer {
        Some(path) => match PromptCodec::load(path) {
            // A real engine reads it through transformers' remote code; the simulator
            // counts bytes instead, as a gateway routing such a model does.
            Err(e @ infera_prompt::PromptError::TiktokenOnly { .. }) => {
                tracing::warn!("{e}; the simulator counts UTF-8 bytes as tokens");
                PromptCodec::bytes()
            }
            loaded => loaded?,
        },
        None => PromptCodec::bytes(),
    });
    let generator = Arc::new(build_generator(&codec));
    let mut workers = Vec::new();
    for cfg in configs {
        let events = cfg.kv_events.as_ref().map(|e| e.endpoint.clone());
        let worker = start_worker(cfg, codec.clone(), generator.clone()).await?;
        tracing::info!(
            "worker {} ({}) listening on http://{}{}",
            workers.len(),
            worker.state.flavor.0.as_str(),
            worker.addr,
            events
                .map(|e| format!(", KV events on {e}"))
                .unwrap_or_default()
        );
        workers.push(worker);
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping {} workers", workers.len());
    for worker in workers {
        worker.shutdown().await;
    }
    Ok(())
}
