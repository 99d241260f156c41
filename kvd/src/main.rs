//! The `infera-kvd` command: the daemon, and `infera-kvd stats`.

use anyhow::{Context, Result};
use clap::Parser;
use infera_kvd::cli::{Command, KvdArgs};
use infera_kvd::client::{Client, field, request_map};
use tokio::signal::unix::{SignalKind, signal};

fn stats(cli: &KvdArgs) -> Result<()> {
    let mut c = Client::connect(&cli.socket, "infera-kvd-stats", false)
        .with_context(|| format!("connecting to {}", cli.socket.display()))?;
    let reply = c.request(&request_map("stats", vec![]))?;
    let mut out = serde_json::Map::new();
    for name in [
        "entries",
        "host_bytes",
        "spillover_bytes",
        "long_bytes",
        "gets_total",
        "sets_total",
        "hits_total",
        "misses_total",
        "evictions_total",
    ] {
        out.insert(
            name.into(),
            field(&reply, name)
                .and_then(rmpv::Value::as_u64)
                .unwrap_or(0)
                .into(),
        );
    }
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}

#[tokio::main]
async fn main() {
    let cli = KvdArgs::parse();
    let telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera-kvd",
        default_filter: "info".into(),
        json: cli.log_json,
        ..Default::default()
    });
    if let Err(e) = &telemetry {
        eprintln!("infera-kvd: {e}");
    }
    let result = match cli.command {
        Some(Command::Stats) => stats(&cli),
        None => {
            let shutdown = async move {
                match (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                ) {
                    (Ok(mut term), Ok(mut int)) => {
                        tokio::select! {
                            _ = term.recv() => {}
                            _ = int.recv() => {}
                        }
                    }
                    _ => std::future::pending::<()>().await,
                }
            };
            infera_kvd::service::run(cli, shutdown).await
        }
    };
    if let Err(e) = result {
        eprintln!("infera-kvd: {e:#}");
        std::process::exit(2);
    }
}
