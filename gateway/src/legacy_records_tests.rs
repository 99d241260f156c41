//! The earlier launchers' records (`proto/testdata/legacy_records/`) through every
//! reader of the gateway: etcd discovery ([`apply_etcd_change`]), Pod-annotation
//! discovery ([`PodIndex::apply`]), the registry's pools and routing targets, the ZMQ
//! subscriptions of kv-aware routing, the prefill/decode protocol of each pair, and
//! `/v1/workers`, `/health` and the worker series of `/metrics` as the earlier server
//! answered them. `infera-proto`'s `tests/legacy_records.rs` pins the parse itself
//! against the earlier reader; these tests pin that every reader here uses it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::http::admin::build_worker_entry;
use crate::metrics::Metrics;
use crate::route::kv_events::specs_for;
use crate::route::kv_state::{KvRouter, block_size_of};
use crate::send::pd::connectors::resolve_protocol;
use crate::workers::discovery::etcd::{EtcdChange, apply_etcd_change, build_synced_records};
use crate::workers::discovery::kubernetes::{PodIndex, apply_update};
use crate::workers::registry::{Registry, Target};
use infera_prompt::PromptCodec;
use infera_proto::discovery::{DEFAULT_ETCD_PREFIX, WORKER_INFO_ANNOTATION};
use infera_proto::worker::{DisaggMode, RequestTransport, WorkerRecord};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

fn testdata(name: &str) -> Value {
    infera_testkit::legacy_records::load(name).unwrap()
}

fn corpus() -> Vec<Map<String, Value>> {
    infera_testkit::legacy_records::corpus().unwrap()
}

fn entry(name: &str) -> Map<String, Value> {
    infera_testkit::legacy_records::entry(name).unwrap()
}

fn record_json(e: &Map<String, Value>) -> &str {
    e["record_json"].as_str().unwrap()
}

/// The etcd key an entry was registered under (its record's worker id).
fn etcd_key(record_json: &str) -> String {
    let id = serde_json::from_str::<Value>(record_json)
        .ok()
        .and_then(|v| v.get("worker_id")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "10.0.2.1:8000".into());
    format!("{DEFAULT_ETCD_PREFIX}{id}")
}

fn put(registry: &Registry, metrics: &Metrics, key: &str, value: &str) {
    apply_etcd_change(
        EtcdChange::Put {
            key,
            value: value.as_bytes(),
        },
        DEFAULT_ETCD_PREFIX,
        registry,
        metrics,
    );
}

/// A registry fed by etcd discovery with `records`.
fn via_etcd(records: &[&str]) -> Arc<Registry> {
    let (registry, metrics) = (Registry::new(), Metrics::default());
    for r in records {
        put(&registry, &metrics, &etcd_key(r), r);
    }
    registry
}

fn mk_pod(name: &str, annotation: &str, deleting: bool) -> Pod {
    let mut metadata = json!({"name": name, "namespace": "fixture-ns", "annotations": {WORKER_INFO_ANNOTATION: annotation}});
    if deleting {
        metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    serde_json::from_value(json!({
        "metadata": metadata,
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap()
}

/// A registry fed by Kubernetes discovery with one Running, Ready Pod per record.
fn via_pods(pods: &[(&str, &str)]) -> (Arc<Registry>, PodIndex) {
    let (registry, metrics) = (Registry::new(), Metrics::default());
    let mut index = PodIndex::default();
    apply_update(index.apply(Event::Init), &registry, &metrics, "fixture-ns");
    for (name, record) in pods {
        let update = index.apply(Event::InitApply(mk_pod(name, record, false)));
        apply_update(update, &registry, &metrics, "fixture-ns");
    }
    apply_update(
        index.apply(Event::InitDone),
        &registry,
        &metrics,
        "fixture-ns",
    );
    (registry, index)
}

fn pool<'s>(
    snap: &'s crate::workers::registry::Snapshot,
    model: &str,
    mode: DisaggMode,
) -> &'s [Target] {
    snap.models.get(model).map_or(&[][..], |p| match mode {
        DisaggMode::Mixed => &p.mixed,
        DisaggMode::Prefill => &p.prefill,
        DisaggMode::Decode => &p.decode,
    })
}

/// Numbers compare by value (`16` equals `16.0`), everything else exactly.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same(v, w))
        }
        _ => a == b,
    }
}

/// The fields of the earlier `/v1/workers` entry that `ours` must carry with the same
/// values.
fn check_v1_entry(name: &str, earlier: &Value, ours: &Value) {
    for (key, value) in earlier.as_object().unwrap() {
        assert!(
            same(value, &ours[key]),
            "{name}: /v1/workers {key}: earlier {value}, here {}",
            ours[key]
        );
    }
}

/// What one reader made of a corpus entry, checked against the earlier reading.
fn check_reading(reader: &str, e: &Map<String, Value>, registry: &Registry) {
    let name = format!("{} via {reader}", e["name"].as_str().unwrap());
    let expected = &e["expected"];
    let parsed = WorkerRecord::from_json(record_json(e).as_bytes()).unwrap();
    let snap = registry.snapshot();
    let record = snap
        .workers
        .get(&parsed.worker_id)
        .unwrap_or_else(|| panic!("{name}: not registered"));
    assert_eq!(**record, parsed, "{name}: the same parse");
    // Pools and routing targets, with the rank each sends as X-Data-Parallel-Rank.
    let pools: Vec<&str> = [DisaggMode::Mixed, DisaggMode::Prefill, DisaggMode::Decode]
        .into_iter()
        .filter(|m| !pool(&snap, &record.model_name, *m).is_empty())
        .map(DisaggMode::as_str)
        .collect();
    assert_eq!(json!(pools), expected["active_pools"], "{name}: pools");
    let targets: Vec<Value> = pool(&snap, &record.model_name, record.disagg_mode)
        .iter()
        .map(|t| {
            json!({
                "route_key": t.key,
                "dp_rank": t.dp_rank,
                "headers": t.dp_rank.map_or_else(|| json!({}), |r| json!({"X-Data-Parallel-Rank": r.to_string()})),
            })
        })
        .collect();
    assert_eq!(json!(targets), expected["targets"], "{name}: targets");
    // What kv-aware routing hashes at, and where it subscribes.
    let zmq = &expected["kv_events"]["zmq"];
    let specs = specs_for(record);
    if zmq["subscribed"] == json!(true) {
        let endpoints: Vec<Value> = record
            .route_targets()
            .iter()
            .zip(&specs)
            .map(|(t, s)| json!([t.dp_rank.unwrap_or(0), s.endpoint]))
            .collect();
        assert_eq!(json!(endpoints), zmq["endpoints"], "{name}: ZMQ endpoints");
        assert!(
            specs
                .iter()
                .all(|s| json!(s.block_size) == zmq["block_size"]),
            "{name}: block size"
        );
    } else {
        assert!(specs.is_empty(), "{name}: subscribed to {specs:?}");
    }
    assert_eq!(
        block_size_of(record).is_none(),
        expected["kv_aware"]["load_only"] == json!(true),
        "{name}: load-only"
    );
    // The connector and the transport.
    assert_eq!(
        json!(record.protocol()),
        expected["disagg"]["protocol"],
        "{name}: protocol"
    );
    assert_eq!(
        json!(record.disagg_params()),
        expected["disagg"]["params"],
        "{name}: params"
    );
    assert_eq!(
        record.request_transport == RequestTransport::Nats,
        expected["request_transport"]["over_nats_when_router_has_nats"] == json!(true),
        "{name}: transport"
    );
    let entry = build_worker_entry(
        record,
        snap.status(&record.worker_id).unwrap_or_default(),
        ("closed", 0),
        "passing",
        0,
    );
    check_v1_entry(&name, &expected["v1_workers_entry"], &entry);
}

#[test]
fn every_launcher_record_routes_through_etcd_and_pod_discovery_as_it_did() {
    let entries = corpus();
    assert!(entries.len() >= 71);
    for e in &entries {
        check_reading("etcd", e, &via_etcd(&[record_json(e)]));
        let (registry, _) = via_pods(&[("worker-0", record_json(e))]);
        check_reading("pod annotation", e, &registry);
    }
}

#[test]
fn every_range_reads_the_records_the_watch_reads() {
    let entries = corpus();
    let metrics = Metrics::default();
    let keys: Vec<(String, &str)> = entries
        .iter()
        .map(|e| (etcd_key(record_json(e)), record_json(e)))
        .collect();
    let records = build_synced_records(
        DEFAULT_ETCD_PREFIX,
        keys.iter().map(|(k, v)| (k.as_str(), v.as_bytes())),
        &metrics,
    );
    assert_eq!(records.len(), entries.len());
    for (record, e) in records.iter().zip(&entries) {
        assert_eq!(
            *record,
            WorkerRecord::from_json(record_json(e).as_bytes()).unwrap()
        );
    }
}

#[test]
fn prefill_decode_pairs_resolve_the_protocol_they_did() {
    for e in corpus() {
        let Some(partner) = e["expected"]["pd_partner"].as_str() else {
            continue;
        };
        let name = e["name"].as_str().unwrap();
        let own = WorkerRecord::from_json(record_json(&e).as_bytes()).unwrap();
        let other = WorkerRecord::from_json(record_json(&entry(partner)).as_bytes()).unwrap();
        let (prefill, decode) = match own.disagg_mode {
            DisaggMode::Prefill => (&own, &other),
            _ => (&other, &own),
        };
        let pd = &e["expected"]["pd"];
        match resolve_protocol(prefill, decode) {
            Ok(protocol) => {
                assert_eq!(pd["resolved"], json!(true), "{name}: {}", pd["error"]);
                assert_eq!(pd["protocol"], json!(protocol.as_str()), "{name}");
            }
            Err(err) => assert_eq!(pd["resolved"], json!(false), "{name}: {err:?}"),
        }
    }
}

#[test]
fn every_reader_accepts_exactly_what_the_parse_accepts() {
    let probes = testdata("reader_probes.json");
    let corpus = corpus();
    let records = probes["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p.get("record_json")?.as_str())
        .chain(corpus.iter().map(record_json));
    for raw in records {
        let parsed = WorkerRecord::from_json(raw.as_bytes()).ok();
        let by_etcd = via_etcd(&[raw]).snapshot();
        let (by_pods, _) = via_pods(&[("worker-0", raw)]);
        let by_pods = by_pods.snapshot();
        for (reader, snap) in [("etcd", &by_etcd), ("pod annotation", &by_pods)] {
            let read: Vec<&WorkerRecord> = snap.workers.values().map(|w| &**w).collect();
            assert_eq!(read, parsed.iter().collect::<Vec<_>>(), "{reader}: {raw}");
        }
    }
}

/// The etcd event sequences of `reader_probes.json`, through etcd discovery.
#[test]
fn etcd_event_sequences_leave_the_pool_the_earlier_registry_left() {
    // The earlier registry keyed its pool by the record's worker_id and removed by the
    // key's suffix, so a record whose id differs from its key stayed listed after its
    // DELETE, forever. This gateway refuses such a record (counted as key_mismatch).
    let refused_key_mismatch = "sequence/worker-id-differs-from-key";
    let probes = testdata("reader_probes.json");
    let sequences = probes["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p.get("steps").is_some());
    let mut seen = 0;
    for seq in sequences {
        seen += 1;
        let name = seq["name"].as_str().unwrap();
        let (registry, metrics) = (Registry::new(), Metrics::default());
        for (i, step) in seq["steps"].as_array().unwrap().iter().enumerate() {
            for event in step["events"].as_array().unwrap() {
                let key = event["key"].as_str().unwrap();
                match event["type"].as_str().unwrap() {
                    "PUT" => put(
                        &registry,
                        &metrics,
                        key,
                        event["record_json"].as_str().unwrap(),
                    ),
                    _ => apply_etcd_change(
                        EtcdChange::Delete { key },
                        DEFAULT_ETCD_PREFIX,
                        &registry,
                        &metrics,
                    ),
                }
            }
            let pool: Vec<String> = registry.snapshot().workers.keys().cloned().collect();
            let rendered = metrics.render(
                &crate::state::worker_gauges(
                    &registry.snapshot(),
                    &crate::workers::breaker::Breakers::default(),
                ),
                None,
            );
            let canary_rejections = rendered
                .lines()
                .find_map(|l| {
                    l.strip_prefix("infera_gateway_rejected_worker_records_total{reason=\"tokenizer_canary\"} ")
                })
                .map_or(0, |n| n.parse::<u64>().unwrap());
            if name == refused_key_mismatch {
                assert!(pool.is_empty(), "{name} step {i}: {pool:?}");
                assert!(rendered.contains("reason=\"key_mismatch\"} 1"), "{name}");
                continue;
            }
            assert_eq!(json!(pool), step["pool"], "{name} step {i}");
            assert_eq!(
                json!(canary_rejections),
                step["canary_rejections"],
                "{name} step {i}"
            );
        }
    }
    assert!(seen >= 4, "{seen} sequences");
}

/// The earlier server's answers for an etcd mixed fleet and a Kubernetes PD fleet with
/// one Pod being deleted.
#[test]
fn v1_workers_health_and_worker_series_answer_as_the_earlier_server_did() {
    let views = testdata("server_views.json");
    let view = |name: &str| {
        views["views"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == json!(name))
            .unwrap()
            .clone()
    };
    let etcd_fleet = [
        "atom-mixed",
        "sglang-mixed",
        "sglang-mixed-dp4",
        "vllm-mixed",
        "vllm-mixed-dp2",
        "vllm-mixed-dp2-rank0",
        "vllm-mixed-dp2-rank1",
    ];
    let v = view("etcd-mixed-fleet");
    for name in etcd_fleet {
        assert!(v["note"].as_str().unwrap().contains(name), "{name}");
    }
    let records: Vec<Map<String, Value>> = etcd_fleet.iter().map(|n| entry(n)).collect();
    let registry = via_etcd(&records.iter().map(record_json).collect::<Vec<_>>());
    check_server_view(&v, &registry);

    let v = view("k8s-pd-fleet-one-draining");
    let pods = [
        ("sglang-prefill-0", "sglang-prefill-mooncake"),
        ("sglang-decode-0", "sglang-decode-mooncake"),
        ("sglang-decode-1", "sglang-decode-mooncake-dp2"),
    ];
    let records: Vec<(&str, Map<String, Value>)> =
        pods.iter().map(|(pod, name)| (*pod, entry(name))).collect();
    let (registry, mut index) = via_pods(
        &records
            .iter()
            .map(|(pod, e)| (*pod, record_json(e)))
            .collect::<Vec<_>>(),
    );
    let metrics = Metrics::default();
    let deleting = mk_pod("sglang-decode-1", record_json(&records[2].1), true);
    apply_update(
        index.apply(Event::Apply(deleting)),
        &registry,
        &metrics,
        "fixture-ns",
    );
    check_server_view(&v, &registry);
}

fn check_server_view(view: &Value, registry: &Registry) {
    let name = view["name"].as_str().unwrap();
    let snap = registry.snapshot();
    let earlier: BTreeMap<String, &Value> = view["GET /v1/workers"]["body"]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["worker_id"].as_str().unwrap().to_owned(), w))
        .collect();
    assert_eq!(
        earlier.keys().collect::<Vec<_>>(),
        snap.workers.keys().collect::<Vec<_>>(),
        "{name}"
    );
    for (id, w) in &snap.workers {
        let ours = build_worker_entry(
            w,
            snap.status(id).unwrap_or_default(),
            ("closed", 0),
            "passing",
            0,
        );
        check_v1_entry(name, earlier[id], &ours);
    }
    assert_eq!(
        json!(snap.active_workers()),
        view["GET /health"]["body"]["active_workers"],
        "{name}: /health"
    );
    let kv = KvRouter::new(
        Arc::new(PromptCodec::bytes()),
        1.0,
        false,
        Arc::new(Metrics::default()),
    );
    let gauges = kv.gauges(snap.workers.values().map(|w| &**w));
    let text = Metrics::default().render(
        &crate::state::worker_gauges(&snap, &crate::workers::breaker::Breakers::default()),
        Some(gauges),
    );
    let series = |text: &str, names: &[&str]| -> Vec<String> {
        let mut out: Vec<String> = text
            .lines()
            .filter(|l| names.iter().any(|n| l.starts_with(&format!("{n}{{"))))
            // The earlier exporter wrote every value as a float.
            .map(|l| l.trim_end_matches(".0").to_owned())
            .filter(|l| !l.ends_with(" 0") || !l.starts_with("infera_active_workers"))
            .collect();
        out.sort();
        out
    };
    let names = ["infera_active_workers", "infera_policy_cache_view_size"];
    let earlier_series = view["GET /metrics (worker series)"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        series(&text, &names),
        series(&earlier_series, &names),
        "{name}: /metrics"
    );
}
