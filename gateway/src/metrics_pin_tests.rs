//! Every metric the earlier server exposed, pinned twice: series by series against
//! `testdata/earlier_metrics/earlier.txt` (rendered by the Python `prometheus_client`
//! the earlier server used, after the scenario of its `make_fixture.py`, which
//! [`drive`] repeats), and byte for byte against this gateway's own text in
//! `testdata/earlier_metrics/ours.txt` (`INFERA_UPDATE_SNAPSHOTS=1` rewrites it).
//!
//! Allowed differences, which Prometheus reads alike: a counter's `# TYPE` line names
//! the family without `_total` (OpenMetrics; the samples keep it), values are written
//! as integers where they are whole, and help texts are this gateway's.

use crate::metrics::{KvGauges, Metrics, Outcome};
use crate::workers::breaker::Breakers;
use crate::workers::registry::Registry;
use infera_proto::worker::WorkerRecord;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

const MIXED: &str = "10.0.0.1:8000";
const PREFILL: &str = "10.0.0.2:8000";
const DECODE: &str = "10.0.0.3:8000";

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/earlier_metrics")
        .join(name)
}

/// `make_fixture.py`'s scenario, through this gateway's metrics.
fn drive() -> String {
    let m = Metrics::default();
    m.record_pick("mixed", MIXED);
    m.record_pick("mixed", MIXED);
    m.record_pick("prefill", PREFILL);
    m.record_pick("decode", DECODE);
    m.record_cache_hits("mixed", 3);
    m.record_cache_hits("prefill", 0);
    m.observe_pick_request_blocks("mixed", 5);
    m.observe_pick_request_blocks("prefill", 2);
    m.observe_request("mixed", Outcome::Ok, 0.02);
    m.observe_request("disagg", Outcome::Ok, 0.3);
    m.request_started("mixed");
    m.request_started("mixed");
    m.observe_pd_leg("prefill", PREFILL, 0.2);
    m.observe_pd_leg("decode", DECODE, 0.04);
    m.record_pd_failure("prefill_unreachable");
    m.record_migration("stream_broken");
    m.record_migration_failed("no_candidate");
    m.record_cache_control("long");
    m.record_cache_locality_skipped("multimodal");
    m.record_cache_locality_skipped("multimodal");
    let registry = Registry::new();
    for (id, mode) in [(MIXED, "mixed"), (PREFILL, "prefill"), (DECODE, "decode")] {
        let record = json!({"worker_id": id, "url": format!("http://{id}"), "model_name": "m",
                            "engine": "vllm", "disagg_mode": mode});
        registry.upsert(WorkerRecord::from_json(record.to_string().as_bytes()).unwrap());
    }
    let breakers = Breakers::default();
    let now = Instant::now();
    while !breakers.on_failure(MIXED, now) {}
    let kv = KvGauges {
        targets: vec![(MIXED.to_owned(), 4, 3)],
        ..KvGauges::default()
    };
    m.render(
        &crate::state::worker_gauges(&registry.snapshot(), &breakers),
        Some(kv),
    )
}

/// A family's `# TYPE` and its samples (values as numbers).
#[derive(Debug, Default, PartialEq)]
struct Family {
    kind: String,
    samples: BTreeSet<String>,
}

fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let name = match kind {
                // The Python client names a counter's family with its `_total`.
                "counter" => name.trim_end_matches("_total"),
                _ => name,
            };
            current = name.to_owned();
            out.entry(current.clone()).or_default().kind = kind.to_owned();
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap();
            let family = out.entry(current.clone()).or_default();
            family.samples.insert(format!("{series} {value}"));
        }
    }
    out
}

/// This gateway's lines of the earlier families, samples sorted within each family
/// (label sets are kept in a hash map).
fn our_lines(text: &str, earlier: &BTreeMap<String, Family>) -> String {
    let mut out = String::new();
    let mut block: Vec<&str> = Vec::new();
    let mut keep = false;
    let flush = |block: &mut Vec<&str>, keep: bool, out: &mut String| {
        if keep {
            let split = 2.min(block.len());
            let (head, samples) = block.split_at_mut(split);
            samples.sort_unstable();
            for line in head.iter().chain(samples.iter()) {
                out.push_str(line);
                out.push('\n');
            }
        }
        block.clear();
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush(&mut block, keep, &mut out);
            let name = rest.split(' ').next().unwrap_or("");
            keep = earlier.contains_key(name);
        }
        if line != "# EOF" {
            block.push(line);
        }
    }
    flush(&mut block, keep, &mut out);
    out
}

#[test]
fn every_earlier_series_is_served_as_the_earlier_server_served_it() {
    let earlier = families(&std::fs::read_to_string(testdata("earlier.txt")).unwrap());
    let text = drive();
    let ours = families(&text);
    assert_eq!(earlier.len(), 16, "the earlier server's 16 metrics");
    for (name, want) in &earlier {
        assert_eq!(ours.get(name), Some(want), "{name}\n{text}");
    }
    let pinned = our_lines(&text, &earlier);
    let path = testdata("ours.txt");
    if std::env::var_os("INFERA_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &pinned).unwrap();
    }
    assert_eq!(
        pinned,
        std::fs::read_to_string(&path).unwrap(),
        "the exposition changed (INFERA_UPDATE_SNAPSHOTS=1 rewrites {})",
        path.display()
    );
}
