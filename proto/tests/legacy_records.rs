//! Records the earlier Python launchers wrote, read here exactly as the earlier reader
//! read them.
//!
//! `testdata/legacy_records/corpus.json` holds what the earlier launchers (commit
//! 5890f7f of AMD-AGI/Infera) PUT into etcd or a Pod annotation, each with what the
//! earlier reader and router made of it; `reader_probes.json` holds that reader on
//! hand-made variations of one record. Every corpus entry must read the same here,
//! field by field: accepted or refused, identity, role, status, connector protocol and
//! parameters, block size, KV-event subscriptions (ZMQ endpoint per rank, NATS subjects),
//! routing targets after data-parallel expansion with their rank headers, request
//! transport. Every probe must too, except the deviations listed in [`DEVIATIONS`],
//! each with the reason; a deviation that stops being one fails the test so the list
//! stays true. `make_corpus.py` (see its README) regenerates the files from a checkout
//! of the earlier repository; CI cannot fetch it, so it checks the commit stamps.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_proto::kv_stream::{build_kv_event_subject, build_rank_endpoint};
use infera_proto::worker::{RequestTransport, WorkerRecord};
use serde_json::{Map, Value, json};
use std::path::PathBuf;

/// The commit the corpus was generated from (full sha; the issue names it 5890f7f).
const SOURCE_COMMIT_PREFIX: &str = "5890f7f";

fn testdata(name: &str) -> Value {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "testdata",
        "legacy_records",
        name,
    ]
    .iter()
    .collect();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// How a probe is read here differently from the earlier reader, and why.
enum Deviation {
    /// The earlier reader accepted the record; this one refuses it.
    Refused,
    /// Accepted by both; these top-level parts of the earlier reading were crashes
    /// (`{"error": ...}`), which this reader does not reproduce.
    NoCrash(&'static [&'static str]),
}

/// Probes read differently on purpose. Each is a value no launcher writes.
const DEVIATIONS: &[(&str, Deviation, &str)] = &[
    (
        "worker_id/null",
        Deviation::Refused,
        "the id keys routing state, breakers and metrics and must match the etcd key; the earlier reader listed a worker its DELETE could never remove",
    ),
    (
        "worker_id=7",
        Deviation::Refused,
        "not a string: as worker_id/null",
    ),
    (
        "worker_id=\"\"",
        Deviation::Refused,
        "not host:port: as worker_id/null",
    ),
    (
        "url/null",
        Deviation::Refused,
        "every request the earlier router sent there failed",
    ),
    (
        "model_name/null",
        Deviation::Refused,
        "no request names a null model: the earlier reader listed a worker nothing could reach",
    ),
    (
        "model_name=7",
        Deviation::Refused,
        "as model_name/null (request models are strings)",
    ),
    (
        "dp_rank=\"1\"",
        Deviation::Refused,
        "a rank must be an integer; the earlier reader kept the string and handed it to the connectors",
    ),
    (
        "dp_rank=true",
        Deviation::Refused,
        "a rank must be an integer (Python's True == 1 is an accident)",
    ),
    (
        "dp_size=\"2\"",
        Deviation::Refused,
        "the earlier router crashed expanding targets (str > int) on every request to the model",
    ),
    (
        "dp_size=\"2\",dp_rank=1",
        Deviation::Refused,
        "as dp_size=\"2\"",
    ),
    (
        "dp_size=true",
        Deviation::Refused,
        "a size must be an integer",
    ),
    (
        "dp_size=2.0",
        Deviation::NoCrash(&["targets", "kv_events"]),
        "2.0 is the JSON number 2: expanded to two ranks where the earlier router crashed (range(2.0))",
    ),
    (
        "kv_block_size=\"16\"",
        Deviation::Refused,
        "a block size must be an integer; the earlier router hashed with a string block size",
    ),
    (
        "kv_block_size=true",
        Deviation::Refused,
        "the earlier router hashed per token (True == 1) against an engine paging per 16: a view that never matches",
    ),
    (
        "kv_block_size=-1",
        Deviation::Refused,
        "a block size must be non-negative; the earlier router subscribed with block size -1",
    ),
    (
        "kv_events_endpoint=5557",
        Deviation::Refused,
        "not an address: the earlier router subscribed to the integer 5557",
    ),
    (
        "kv.tokenizer_canary=\"abc\"",
        Deviation::Refused,
        "the earlier reader took the letters as the canary; as a model's first worker it made every real worker's canary mismatch",
    ),
];

fn deviation(name: &str) -> Option<&'static Deviation> {
    DEVIATIONS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, d, _)| d)
}

/// What this reader makes of `record`, in the corpus's shape (the compared parts).
fn build_reading(r: &WorkerRecord) -> Value {
    let block_size = r.kv_block_size.filter(|bs| *bs > 0);
    let ranks: Vec<u32> = if r.is_rank_multiplexed() {
        (0..r.dp_ranks()).collect()
    } else {
        vec![0]
    };
    let zmq = match (r.events_endpoint(), block_size) {
        (Some(endpoint), Some(bs)) => json!({
            "subscribed": true,
            "block_size": bs,
            "multiplexed": r.is_rank_multiplexed(),
            "endpoints": ranks.iter().map(|rank| json!([rank, build_rank_endpoint(endpoint, *rank)])).collect::<Vec<_>>(),
        }),
        _ => json!({"subscribed": false}),
    };
    let nats = match block_size {
        Some(bs) => json!({
            "tracked": true,
            "block_size": bs,
            "multiplexed": r.is_rank_multiplexed(),
            "subjects": ranks.iter().map(|rank| build_kv_event_subject(&r.worker_id, *rank)).collect::<Vec<_>>(),
        }),
        None => json!({"tracked": false}),
    };
    let kv = r.kv.as_ref().map_or(Value::Null, |kv| {
        json!({
            "engine_block_size": kv.engine_block_size,
            "index_block_size": kv.index_block_size,
            "tokenizer": kv.tokenizer,
            "tokenizer_digest": kv.tokenizer_digest,
            "tokenizer_canary": kv.tokenizer_canary,
            "supports_events": kv.supports_events,
            "event_version": kv.event_version,
            "events_endpoint": kv.events_endpoint,
            "snapshot_endpoint": kv.snapshot_endpoint,
        })
    });
    json!({
        "worker": {
            "worker_id": r.worker_id,
            "url": r.url,
            "model_name": r.model_name,
            "engine": r.engine.as_str(),
            "status": r.status().as_str(),
            "disagg_mode": r.disagg_mode.as_str(),
            "disagg_meta": r.disagg_meta_view(),
            "kv_events_endpoint": r.kv_events_endpoint,
            "kv_block_size": r.kv_block_size,
            "dp_rank": r.dp_rank,
            "dp_size": r.dp_size,
            "kv": kv,
        },
        "targets": r.route_targets().into_iter().map(|t| json!({
            "route_key": t.key,
            "dp_rank": t.dp_rank,
            "headers": t.dp_rank.map_or_else(|| json!({}), |rank| json!({"X-Data-Parallel-Rank": rank.to_string()})),
        })).collect::<Vec<_>>(),
        "rank_multiplexed": r.is_rank_multiplexed(),
        "active_pools": if r.status() == infera_proto::worker::WorkerStatus::Active { json!([r.disagg_mode.as_str()]) } else { json!([]) },
        "kv_events": {"zmq": zmq, "nats": nats},
        "kv_aware": match block_size {
            Some(bs) => json!({"hash_key": [r.engine.as_str(), bs], "load_only": false}),
            None => json!({"hash_key": null, "load_only": true}),
        },
        "request_transport": {
            "over_nats_when_router_has_nats": r.request_transport == RequestTransport::Nats,
        },
        "disagg": {"protocol": r.protocol(), "params": r.disagg_params()},
    })
}

/// The compared parts of the earlier reading: what [`build_reading`] builds, from the
/// corpus's fuller record of it.
fn project_expected(expected: &Value) -> Value {
    let mut worker = expected["worker"].clone();
    if let Some(w) = worker.as_object_mut() {
        w.remove("request_transport");
        if let Some(kv) = w.get_mut("kv").and_then(Value::as_object_mut) {
            kv.remove("tiers");
            // The earlier reader applied str() to these, so a null became "None".
            for key in ["tokenizer", "tokenizer_digest"] {
                if kv.get(key) == Some(&json!("None")) {
                    kv.insert(key.into(), Value::Null);
                }
            }
        }
    }
    let mut kv_events = expected["kv_events"].clone();
    for (feed, drop) in [
        ("zmq", &["decoder"][..]),
        ("nats", &["decoder", "view_bucket_keys"][..]),
    ] {
        if let Some(m) = kv_events.get_mut(feed).and_then(Value::as_object_mut) {
            for key in drop {
                m.remove(*key);
            }
        }
    }
    json!({
        "worker": worker,
        "targets": expected["targets"],
        "rank_multiplexed": expected["rank_multiplexed"],
        "active_pools": expected["active_pools"],
        "kv_events": kv_events,
        "kv_aware": expected["kv_aware"],
        "request_transport": {
            "over_nats_when_router_has_nats": expected["request_transport"]["over_nats_when_router_has_nats"],
        },
        "disagg": expected["disagg"],
    })
}

/// Paths where `a` and `b` differ; numbers compare by value (`16` equals `16.0`).
fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                diff(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff(&format!("{path}[{i}]"), p, q, out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!("{path}: earlier {a}, here {b}")),
    }
}

/// Compares one record's reading with the earlier one, skipping `skip` top-level parts.
fn compare(name: &str, record_json: &str, expected: &Value, skip: &[&str]) -> Vec<String> {
    let earlier_accepted = expected["parse"]["accepted"] == json!(true);
    let ours = WorkerRecord::from_json(record_json.as_bytes());
    match (earlier_accepted, ours) {
        (false, Err(_)) => Vec::new(),
        (false, Ok(_)) => vec![format!(
            "{name}: the earlier reader refused it ({}), this one accepts it",
            expected["parse"]["error"]
        )],
        (true, Err(e)) => vec![format!(
            "{name}: the earlier reader accepted it, this one refuses it: {e}"
        )],
        (true, Ok(record)) => {
            let mut earlier = project_expected(expected);
            let mut here = build_reading(&record);
            for part in skip {
                for side in [&mut earlier, &mut here] {
                    if let Some(m) = side.as_object_mut() {
                        m.remove(*part);
                    }
                }
            }
            let mut out = Vec::new();
            diff(name, &earlier, &here, &mut out);
            out
        }
    }
}

fn entries(file: &Value) -> Vec<&Map<String, Value>> {
    file.as_array()
        .or_else(|| file["probes"].as_array())
        .unwrap()
        .iter()
        .map(|e| e.as_object().unwrap())
        .collect()
}

#[test]
fn every_launcher_record_reads_as_the_earlier_reader_read_it() {
    let corpus = testdata("corpus.json");
    let entries = entries(&corpus);
    assert!(entries.len() >= 71, "{} entries", entries.len());
    let mut failures = Vec::new();
    for e in entries {
        let name = e["name"].as_str().unwrap();
        assert_eq!(
            e["expected"]["parse"]["accepted"],
            json!(true),
            "{name}: every launcher record was accepted by the earlier reader"
        );
        failures.extend(compare(
            name,
            e["record_json"].as_str().unwrap(),
            &e["expected"],
            &[],
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_probe_reads_as_the_earlier_reader_read_it_or_is_a_listed_deviation() {
    let probes = testdata("reader_probes.json");
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for p in entries(&probes) {
        let name = p["name"].as_str().unwrap();
        let Some(record_json) = p.get("record_json").and_then(Value::as_str) else {
            continue; // an etcd event sequence: tested by the gateway's discovery
        };
        let expected = Value::Object(p.clone());
        match deviation(name) {
            None => failures.extend(compare(name, record_json, &expected, &[])),
            Some(Deviation::Refused) => {
                seen.push(name);
                assert_eq!(
                    p["parse"]["accepted"],
                    json!(true),
                    "{name}: listed as refused here though the earlier reader refused it too"
                );
                if let Ok(r) = WorkerRecord::from_json(record_json.as_bytes()) {
                    failures.push(format!("{name}: listed as refused, but accepted: {r:?}"));
                }
            }
            Some(Deviation::NoCrash(parts)) => {
                seen.push(name);
                for part in *parts {
                    assert!(
                        p[*part].get("error").is_some(),
                        "{name}: the earlier {part} did not crash; drop the deviation"
                    );
                }
                failures.extend(compare(name, record_json, &expected, parts));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for (name, _, why) in DEVIATIONS {
        assert!(
            seen.contains(name),
            "deviation {name} ({why}) names no probe"
        );
    }
}

#[test]
fn the_earlier_launchers_mixed_and_atom_records_route() {
    // The two records of the issue: a mixed worker's "disagg_meta": {} and ATOM's
    // "dp_size": null.
    let corpus = testdata("corpus.json");
    for name in ["vllm-mixed", "atom-mixed", "sglang-mixed"] {
        let e = entries(&corpus)
            .into_iter()
            .find(|e| e["name"] == json!(name))
            .unwrap();
        let bytes = e["record_json"].as_str().unwrap();
        assert!(bytes.contains(r#""disagg_meta": {}"#), "{name}: {bytes}");
        assert!(bytes.contains(r#""dp_size": null"#), "{name}: {bytes}");
        let r = WorkerRecord::from_json(bytes.as_bytes()).unwrap();
        assert_eq!((r.protocol(), r.dp_ranks()), (None, 1), "{name}");
        assert_eq!(r.route_targets().len(), 1, "{name}");
    }
}

#[test]
fn every_entry_names_the_commit_it_came_from() {
    let is_source = |sha: &Value| {
        sha.as_str().is_some_and(|s| {
            s.len() == 40
                && s.starts_with(SOURCE_COMMIT_PREFIX)
                && s.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
    };
    let corpus = testdata("corpus.json");
    let first = entries(&corpus)[0]["source_commit"].clone();
    assert!(is_source(&first), "{first}");
    for e in entries(&corpus) {
        assert_eq!(e["source_commit"], first, "{}", e["name"]);
    }
    for file in ["reader_probes.json", "server_views.json"] {
        assert_eq!(testdata(file)["source_commit"], first, "{file}");
    }
}

#[test]
fn the_corpus_covers_every_engine_role_rank_shape_and_kv_block() {
    let corpus = testdata("corpus.json");
    let records: Vec<WorkerRecord> = entries(&corpus)
        .iter()
        .map(|e| WorkerRecord::from_json(e["record_json"].as_str().unwrap().as_bytes()).unwrap())
        .collect();
    for engine in ["sglang", "vllm", "atom"] {
        for mode in ["mixed", "prefill", "decode"] {
            assert!(
                records
                    .iter()
                    .any(|r| r.engine.as_str() == engine && r.disagg_mode.as_str() == mode),
                "no {engine} {mode} record"
            );
        }
    }
    assert!(records.iter().any(WorkerRecord::is_rank_multiplexed));
    assert!(records.iter().any(|r| r.dp_rank.is_some()));
    assert!(records.iter().any(|r| r.kv.is_some()));
    assert!(
        records
            .iter()
            .any(|r| r.kv.is_none() && r.engine.as_str() != "atom")
    );
    let k8s = entries(&corpus)
        .iter()
        .filter(|e| e["registration"]["transport"] == json!("kubernetes"))
        .count();
    assert!(k8s > 0, "no Pod-annotation record");
}
