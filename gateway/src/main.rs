//! The `infera-gateway` command.

use anyhow::{Context, Result};
use clap::Parser;
use infera_gateway::config::GatewayConfig;
use infera_gateway::gateway::Gateway;
use infera_gateway::registry::Registry;
use infera_gateway::server::start_gateway;

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("infera-gateway: {e:#}");
        std::process::exit(2);
    }
}

async fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cfg = GatewayConfig::parse();
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let gateway = Gateway::new(cfg, Registry::new())?;
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| {
            format!("binding {addr} (is another process on that port? change --port)")
        })?;
    let running = start_gateway(gateway, listener).await?;
    tracing::info!("infera-gateway listening on http://{}", running.addr);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: no new connections, letting open streams finish");
    running.shutdown().await;
    Ok(())
}
