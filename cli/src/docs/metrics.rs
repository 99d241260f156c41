//! The metric series each binary exports: every family its registry was given (as
//! [`infera_telemetry::metrics::declarations_of`] records them while the binary's
//! metrics are built; a family without a sample is not written on `/metrics` at all, so
//! an idle exposition would miss it), then the values read at scrape time, from its own
//! `/metrics` rendered over a small state (a gateway with one worker and kv-aware
//! routing, a simulated worker of each engine, an idle kvd, sidecar and operator).

use super::Page;
use super::markdown::{cell, code, table};
use anyhow::{Context, Result, anyhow};
use clap::Parser;
use infera_telemetry::metrics::{Declared, declarations_of};
use std::sync::Arc;

/// The metrics page.
pub async fn page() -> Result<Page> {
    let mut out = String::from(
        "# Metrics\n\n\
         Every series each binary serves on `/metrics` (OpenMetrics text), by family: its \
         name, type and help text, as the binaries declare them. Counters are listed by \
         their `_total` series; histograms are sampled as `_bucket`, `_sum` and `_count`. Labels are bounded \
         (roles, workers, outcomes, never request ids or prompts).\n\n",
    );
    let sections = [
        (
            "`infera-gateway`",
            "The gateway (`:8000/metrics`; with `--metrics-require-auth` behind the API keys). Series the earlier server exported keep its names, labels and buckets.",
            gateway().await?,
        ),
        (
            "`infera-engine-sidecar`",
            "The sidecar's status port (`:8090/metrics`).",
            sidecar(),
        ),
        ("`infera-kvd`", "kvd (`--metrics-addr`, `:9401`).", kvd()),
        (
            "`infera-operator`",
            "The operator (`--metrics-bind-address`, `:8080/metrics`).",
            operator(),
        ),
    ];
    for (name, about, families) in sections {
        out.push_str(&format!("## {name}\n\n{about}\n\n"));
        out.push_str(&families_table(&families));
        out.push('\n');
    }
    out.push_str(
        "## `infera-sim`\n\n\
         The simulator answers with the metric names of the engine it imitates, so the \
         sidecar, the autoscaler and dashboards read it as they read that engine.\n\n",
    );
    for engine in ["vllm", "sglang", "atom"] {
        out.push_str(&format!("### `--engine {engine}`\n\n"));
        out.push_str(&families_table(&families(&sim(engine).await?)));
        out.push('\n');
    }
    Ok(Page {
        file: "metrics.md",
        text: out,
    })
}

/// `(name, type, help)` of every family an exposition declares, in its order (pure).
pub fn families(exposition: &str) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.splitn(2, ' ');
            let (name, kind) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            match out.iter_mut().find(|(n, _, _)| n == name) {
                Some(entry) => entry.1 = kind.to_owned(),
                None => out.push((name.to_owned(), kind.to_owned(), String::new())),
            }
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let mut parts = rest.splitn(2, ' ');
            let (name, help) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            match out.iter_mut().find(|(n, _, _)| n == name) {
                Some(entry) => entry.2 = help.to_owned(),
                None => out.push((name.to_owned(), String::new(), help.to_owned())),
            }
        }
    }
    out
}

/// A binary's families: what it declared, then what its exposition adds (pure).
pub fn merged(declared: &[Declared], exposition: &str) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = declared
        .iter()
        .map(|d| (d.name.clone(), d.kind.clone(), d.help.clone()))
        .collect();
    for family in families(exposition) {
        if !out.iter().any(|(n, _, _)| *n == family.0) {
            out.push(family);
        }
    }
    out
}

fn families_table(families: &[(String, String, String)]) -> String {
    let rows: Vec<Vec<String>> = families
        .iter()
        .map(|(name, kind, help)| {
            // Counters as they are queried: the samples' `_total` name.
            let series = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.clone()
            };
            vec![code(&series), kind.clone(), cell(help)]
        })
        .collect();
    table(&["series", "type", "help"], &rows)
}

async fn gateway() -> Result<Vec<(String, String, String)>> {
    let cfg = infera_gateway::config::GatewayConfig::try_parse_from([
        "infera-gateway",
        "--router-policy",
        "kv-aware",
    ])
    .map_err(|e| anyhow!("gateway flags: {e}"))?;
    let registry = infera_gateway::Registry::new();
    let (gateway, declared) =
        declarations_of(|| infera_gateway::Gateway::new(cfg, registry.clone()));
    let gateway = gateway.map_err(|e| anyhow!("gateway: {e}"))?;
    let record = infera_proto::worker::WorkerRecord::from_json(
        br#"{"worker_id":"127.0.0.1:1","url":"http://127.0.0.1:1","model_name":"m",
            "engine":"vllm","disagg_mode":"mixed","disagg_meta":null,
            "kv_events_endpoint":null,"kv_block_size":16,"dp_rank":null,"dp_size":null}"#,
    )
    .context("the example worker record")?;
    registry.upsert(record);
    registry.mark_synced();
    Ok(merged(&declared, &gateway.metrics_text()))
}

fn sidecar() -> Vec<(String, String, String)> {
    families(&infera_engine_sidecar::status::render_metrics(
        &infera_engine_sidecar::status::SidecarStatus::new(None),
    ))
}

fn kvd() -> Vec<(String, String, String)> {
    let (metrics, declared) = declarations_of(infera_kvd::metrics::Metrics::default);
    let text = metrics.render(
        &infera_kvd::metrics::StoreView::default(),
        &infera_kvd::lower::Lower::default(),
        &infera_kvd::metrics::PrefetchCounters::default(),
    );
    merged(&declared, &text)
}

fn operator() -> Vec<(String, String, String)> {
    let (metrics, declared) = declarations_of(infera_operator::metrics::Metrics::default);
    merged(&declared, &metrics.render())
}

async fn sim(engine: &str) -> Result<String> {
    let (cli, _) = infera_sim::cli::parse_lenient(
        ["infera-sim", "--engine", engine, "--listen", "127.0.0.1:0"]
            .map(str::to_owned)
            .to_vec(),
    )
    .map_err(|e| anyhow!("simulator flags: {e}"))?;
    let cfg = cli
        .worker_configs()?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no simulated worker"))?;
    let codec = Arc::new(infera_prompt::PromptCodec::bytes());
    let generator = Arc::new(infera_sim::worker::build_generator(&codec));
    let worker = infera_sim::worker::start_worker(cfg, codec, generator).await?;
    let text = infera_sim::metrics::render_metrics(&worker.state);
    worker.shutdown().await;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_come_from_help_and_type_lines() {
        let text = "# HELP a Things.\n# TYPE a counter\na_total 1\n# HELP b Sizes.\n# TYPE b gauge\nb 1\n# EOF\n";
        assert_eq!(
            families(text),
            vec![
                ("a".into(), "counter".into(), "Things.".into()),
                ("b".into(), "gauge".into(), "Sizes.".into()),
            ]
        );
    }
}
