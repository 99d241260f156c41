use super::*;
use serde_json::Value as Json;

/// `kvd/testdata/frames.json`, written by `make_frames.py` with Python's msgpack from the
/// contract's field table.
fn golden() -> Vec<Json> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/frames.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn frame(name: &str) -> (Json, Vec<u8>) {
    let f = golden()
        .into_iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no golden frame {name}"));
    let bytes = hex(f["frame_hex"].as_str().unwrap());
    (f["map"].clone(), bytes)
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn body(frame: &[u8]) -> &[u8] {
    let n = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
    assert_eq!(n, frame.len() - 4, "length prefix");
    &frame[4..]
}

fn bin(j: &Json) -> Vec<u8> {
    hex(j["bin"].as_str().unwrap())
}

fn key(j: &Json) -> Key {
    bin(j).try_into().unwrap()
}

fn retention(j: &Json) -> Option<Retention> {
    j.as_str().map(|s| parse_retention(s).unwrap())
}

#[test]
fn every_golden_request_parses_to_its_fields() {
    let scope = |m: &Json| Scope {
        model: m["model"].as_str().unwrap_or("").into(),
        compat_key: m["compat_key"].as_str().unwrap_or("").into(),
    };
    for f in golden().iter().filter(|f| f["direction"] == "request") {
        let name = f["name"].as_str().unwrap();
        let (m, bytes) = frame(name);
        let req = parse_request(body(&bytes), 1 << 20).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected = match m["op"].as_str().unwrap() {
            "hello" => Request::Hello {
                client_id: m["client_id"].as_str().unwrap().into(),
                protocol_version: m["protocol_version"].as_i64().unwrap_or(1),
                prefers_shared_arena: m["prefers_shared_arena"].as_bool().unwrap_or(false),
            },
            "get" => Request::Get {
                key: key(&m["key"]),
                scope: scope(&m),
            },
            "batch_get" => Request::BatchGet {
                keys: m["keys"].as_array().unwrap().iter().map(key).collect(),
                scope: scope(&m),
            },
            "set" => Request::Set {
                item: SetItem {
                    key: key(&m["key"]),
                    value: bin(&m["value"]),
                    retention: retention(&m["retention"]).unwrap_or(Retention::Short),
                    ttl_seconds: m["ttl_seconds"].as_i64(),
                },
                scope: scope(&m),
            },
            "batch_set" => Request::BatchSet {
                items: (0..m["keys"].as_array().unwrap().len())
                    .map(|i| SetItem {
                        key: key(&m["keys"][i]),
                        value: bin(&m["values"][i]),
                        retention: retention(&m["retentions"][i]).unwrap_or(Retention::Short),
                        ttl_seconds: m["ttls_seconds"][i].as_i64(),
                    })
                    .collect(),
                scope: scope(&m),
            },
            "set_reserve" => Request::SetReserve {
                size: m["size"].as_u64().unwrap(),
            },
            "set_commit" => Request::SetCommit {
                lease_token: m["lease_token"].as_u64().unwrap(),
                key: key(&m["key"]),
                length: m["length"].as_u64().unwrap(),
                scope: scope(&m),
                retention: retention(&m["retention"]).unwrap_or(Retention::Short),
                ttl_seconds: m["ttl_seconds"].as_i64().unwrap_or(0),
            },
            "set_cancel" => Request::SetCancel {
                lease_token: m["lease_token"].as_u64().unwrap(),
            },
            "prefetch_hint" => Request::PrefetchHint {
                keys: m["keys"].as_array().unwrap().iter().map(key).collect(),
                scope: scope(&m),
                deadline_ms: m["deadline_ms"].as_u64().unwrap_or(1000),
            },
            "exists" => Request::Exists {
                keys: m["keys"].as_array().unwrap().iter().map(key).collect(),
                scope: scope(&m),
            },
            "batch_lookup_tier" => Request::BatchLookupTier {
                keys: m["keys"].as_array().unwrap().iter().map(key).collect(),
                scope: scope(&m),
            },
            "clear" => Request::Clear { scope: scope(&m) },
            "stats" => Request::Stats,
            other => panic!("golden op {other}"),
        };
        assert_eq!(req, expected, "{name}");
    }
}

fn opt_bin(j: &Json) -> Option<Vec<u8>> {
    (!j.is_null()).then(|| bin(j))
}

fn u(j: &Json) -> u64 {
    j.as_u64().unwrap()
}

/// The reply our code builds for each golden reply's fields, encoded: byte for byte the
/// golden frame.
#[test]
fn every_reply_encodes_to_the_golden_bytes() {
    let mut checked = 0;
    for f in golden().iter().filter(|f| f["direction"] == "reply") {
        let name = f["name"].as_str().unwrap();
        let (m, bytes) = frame(name);
        let reply = match m["op"].as_str().unwrap() {
            "hello_ack" => Reply::HelloAck {
                server_id: m["server_id"].as_str().unwrap().into(),
                arena: m["shared_arena"]
                    .as_array()
                    .map(|a| (u(&a[0]), u(&a[1]), u(&a[2]) as u32)),
            },
            "get_response" => Reply::GetResponse {
                value: opt_bin(&m["value"]),
                retention: retention(&m["retention"]),
            },
            "get_shared_response" => Reply::GetSharedResponse {
                slot_offset: u(&m["slot_offset"]),
                length: u(&m["length"]),
                version: u(&m["version"]) as u32,
                retention: retention(&m["retention"]).unwrap(),
                slot_size: u(&m["slot_size"]),
            },
            "batch_get_response" => Reply::BatchGetResponse {
                values: m["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(opt_bin)
                    .collect(),
                retentions: m["retentions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(retention)
                    .collect(),
            },
            "batch_get_shared_response" => Reply::BatchGetSharedResponse {
                offsets: m["offsets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_i64().unwrap())
                    .collect(),
                lengths: m["lengths"].as_array().unwrap().iter().map(u).collect(),
                versions: m["versions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| u(v) as u32)
                    .collect(),
                retentions: m["retentions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(retention)
                    .collect(),
                slot_size: u(&m["slot_size"]),
            },
            "set_ack" => Reply::SetAck {
                accepted: m["accepted"].as_bool().unwrap(),
                reason: m["reason"].as_str().map(Into::into),
            },
            "batch_set_ack" => Reply::BatchSetAck {
                accepted: m["accepted"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_bool().unwrap())
                    .collect(),
                reasons: m["reasons"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().map(Into::into))
                    .collect(),
            },
            "set_reserve_response" => Reply::SetReserveResponse {
                lease_token: u(&m["lease_token"]),
                slot_id: m["slot_id"].as_i64().unwrap(),
                payload_offset: m["payload_offset"].as_i64().unwrap(),
                payload_max_size: u(&m["payload_max_size"]),
                reason: m["reason"].as_str().unwrap().into(),
            },
            "set_commit_response" => Reply::SetCommitResponse {
                accepted: m["accepted"].as_bool().unwrap(),
                reason: m["reason"].as_str().map(Into::into),
            },
            "set_cancel_response" => Reply::SetCancelResponse,
            "exists_response" => Reply::ExistsResponse {
                present: m["present"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_bool().unwrap())
                    .collect(),
            },
            "batch_lookup_tier_response" => Reply::BatchLookupTierResponse {
                tiers: m["tiers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| Location::parse(t.as_str().unwrap()).unwrap())
                    .collect(),
            },
            "clear_ack" => Reply::ClearAck {
                cleared_entries: u(&m["cleared_entries"]),
            },
            "stats_response" => Reply::StatsResponse(Stats {
                entries: u(&m["entries"]),
                host_bytes: u(&m["host_bytes"]),
                spillover_bytes: u(&m["spillover_bytes"]),
                long_bytes: u(&m["long_bytes"]),
                gets_total: u(&m["gets_total"]),
                sets_total: u(&m["sets_total"]),
                hits_total: u(&m["hits_total"]),
                misses_total: u(&m["misses_total"]),
                evictions_total: u(&m["evictions_total"]),
            }),
            "error" => Reply::Error {
                code: m["code"].as_str().unwrap().into(),
                message: m["message"].as_str().unwrap().into(),
            },
            other => panic!("golden reply op {other}"),
        };
        assert_eq!(encode_frame(&reply.to_value()), bytes, "{name}");
        checked += 1;
    }
    assert!(checked >= 14, "every reply op has a golden frame");
}

#[test]
fn bad_requests_get_the_right_error_code() {
    let enc = |v: Value| encode_frame(&v)[4..].to_vec();
    let map = |pairs: Vec<(&str, Value)>| {
        Value::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Value::from(k), v))
                .collect(),
        )
    };
    let code = |b: &[u8]| parse_request(b, 16).unwrap_err().code;
    assert_eq!(code(b"\xc1garbage"), "malformed_frame");
    assert_eq!(code(&enc(Value::from(3))), "malformed_frame");
    assert_eq!(
        code(&enc(map(vec![("key", Value::from(1))]))),
        "malformed_frame"
    );
    assert_eq!(
        code(&enc(map(vec![("op", Value::from("frobnicate"))]))),
        "unknown_op"
    );
    let e = parse_request(
        &enc(map(vec![
            ("op", Value::from("get")),
            ("key", Value::from("abc")),
        ])),
        16,
    )
    .unwrap_err();
    assert_eq!(e.code, "bad_field");
    assert!(e.message.contains("\"key\""), "{e}");
    let short_key = map(vec![
        ("op", Value::from("get")),
        ("key", Value::Binary(vec![1, 2, 3])),
    ]);
    assert_eq!(code(&enc(short_key)), "bad_field");
    let set = |retention: &str, value: Vec<u8>| {
        enc(map(vec![
            ("op", Value::from("set")),
            ("key", Value::Binary(vec![0; 8])),
            ("value", Value::Binary(value)),
            ("retention", Value::from(retention)),
        ]))
    };
    assert_eq!(code(&set("forever", vec![1])), "bad_retention");
    assert_eq!(code(&set("long", vec![0; 17])), "value_too_large");
    assert!(
        parse_request(&set("long", vec![0; 16]), 16).is_ok(),
        "exactly the limit is fine"
    );
}
