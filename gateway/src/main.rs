//! The `infera-gateway` command.

use anyhow::{Context, Result};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use infera_gateway::Gateway;
use infera_gateway::Registry;
use infera_gateway::config::{
    GatewayConfig, build_earlier_default_notice, compute_earlier_default_differences,
    compute_earlier_flag_notices,
};
use infera_gateway::server::start_gateway;

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("infera-gateway: {e:#}");
        std::process::exit(2);
    }
}

async fn run() -> Result<()> {
    let matches = GatewayConfig::command().get_matches();
    let cfg = GatewayConfig::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Kept to the end: dropping it sends the spans still buffered.
    let _telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera-gateway",
        default_filter: "info".into(),
        json: cfg.log_json,
        otlp_traces_endpoint: cfg.otlp_traces_endpoint.clone(),
        ..Default::default()
    })?;
    let differences = compute_earlier_default_differences(
        &cfg,
        |id| {
            matches!(
                matches.value_source(id),
                None | Some(ValueSource::DefaultValue)
            )
        },
        |name| std::env::var(name).ok(),
    );
    if !differences.is_empty() {
        tracing::warn!("{}", build_earlier_default_notice(&differences));
    }
    for notice in compute_earlier_flag_notices(&cfg) {
        tracing::info!("{notice}");
    }
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
