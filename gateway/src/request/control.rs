//! The control endpoints' requests as the earlier server read them (pure): a prewarm
//! hint (`POST /v1/cache/prewarm`), a cache view's rank (`?dp_rank=`), the selectors of
//! a profile fan-out (`/v1/admin/profile/{start,stop}`) and a scale request
//! (`POST /v1/admin/scale`). Checks run in the earlier order and refuse with its words
//! (`infera/server/app.py`, `profiling.py`, `scaling.py`), so the answer to a bad request
//! is the one a script saw before; where the earlier server failed with a 500 (a body
//! that is not a JSON object, text that is not UTF-8), this answers 400.

use crate::request::python;
use infera_proto::worker::DisaggMode;
use serde_json::{Map, Value};

/// A body as the earlier handlers' `await request.json()` read it, or Python's
/// `JSONDecodeError` text.
pub(crate) fn read_json(body: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8: {e}"))?;
    serde_json::from_str(text)
        .map_err(|e| python::json_error(text).unwrap_or_else(|| e.to_string()))
}

/// A `dp_rank` query value as FastAPI's `int | None` parameter read it (pydantic's lax
/// integer): surrounding whitespace, a sign, digits with single underscores, and a
/// fraction of zeros. Returns the integer written back as JSON, or `None` (a 422).
pub(crate) fn parse_dp_rank(raw: &str) -> Option<String> {
    let t = raw.trim();
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'-') => ("-", &t[1..]),
        Some(b'+') => ("", &t[1..]),
        _ => ("", t),
    };
    let digits = match rest.split_once('.') {
        Some((int, zeros)) if !zeros.is_empty() && zeros.chars().all(|c| c == '0') => int,
        Some(_) => return None,
        None => rest,
    };
    let plain = !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.chars().all(|c| c.is_ascii_digit() || c == '_');
    if !plain {
        return None;
    }
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    let trimmed = digits.trim_start_matches('0');
    Some(match (trimmed.is_empty(), sign) {
        (true, _) => "0".into(),
        (false, sign) => format!("{sign}{trimmed}"),
    })
}

/// FastAPI's 422 for a `dp_rank` that is not an integer, as pydantic v2 worded it.
pub(crate) fn dp_rank_error(raw: &str) -> Value {
    serde_json::json!({"detail": [{
        "type": "int_parsing",
        "loc": ["query", "dp_rank"],
        "msg": "Input should be a valid integer, unable to parse string as an integer",
        "input": raw,
    }]})
}

/// A prewarm hint, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Prewarm {
    /// The model.
    pub model: String,
    /// The block keys (any length; kvd's are 8 bytes).
    pub keys: Vec<Vec<u8>>,
    /// The compatibility key ("" = none).
    pub compat_key: String,
    /// Milliseconds the warmed entries are worth keeping (positive).
    pub deadline_ms: u64,
}

/// A prewarm request refused, with the earlier server's words (its `detail`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum PrewarmError {
    /// Not JSON.
    #[error("bad json: {0}")]
    BadJson(String),
    /// JSON, not an object (a 500 from the earlier server).
    #[error("the body must be a JSON object")]
    NotAnObject,
    /// No model.
    #[error("`model` is required")]
    NoModel,
    /// No list of strings.
    #[error("`block_hashes` must be a list of hex strings")]
    NotHashes,
    /// A hash that is not hex.
    #[error("bad hex in block_hashes: {0}")]
    BadHex(String),
    /// A compatibility key that is not a string.
    #[error("`compat_key` must be a string")]
    CompatKey,
    /// A deadline `int()` refuses.
    #[error("`deadline_ms`: {0}")]
    Deadline(String),
    /// A deadline of zero or less.
    #[error("`deadline_ms` must be positive")]
    DeadlineNotPositive,
}

/// Reads a prewarm body (`app.py:318-392`): `Ok(None)` for an empty list of hashes,
/// accepted before any other check.
pub(crate) fn parse_prewarm(body: &[u8]) -> Result<Option<Prewarm>, PrewarmError> {
    let value = read_json(body).map_err(PrewarmError::BadJson)?;
    let Value::Object(body) = value else {
        return Err(PrewarmError::NotAnObject);
    };
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(PrewarmError::NoModel),
    };
    let hashes: Vec<&str> = match body.get("block_hashes") {
        Some(Value::Array(items)) => items
            .iter()
            .map(Value::as_str)
            .collect::<Option<_>>()
            .ok_or(PrewarmError::NotHashes)?,
        _ => return Err(PrewarmError::NotHashes),
    };
    if hashes.is_empty() {
        return Ok(None);
    }
    let keys = hashes
        .iter()
        .map(|h| python::fromhex(h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(PrewarmError::BadHex)?;
    let compat_key = match body.get("compat_key") {
        None => String::new(),
        Some(Value::String(k)) => k.clone(),
        Some(_) => return Err(PrewarmError::CompatKey),
    };
    let deadline = match body.get("deadline_ms") {
        None => 1000,
        Some(v) => python::int_of(v).map_err(PrewarmError::Deadline)?,
    };
    if deadline <= 0 {
        return Err(PrewarmError::DeadlineNotPositive);
    }
    Ok(Some(Prewarm {
        model,
        keys,
        compat_key,
        deadline_ms: u64::try_from(deadline).unwrap_or(u64::MAX),
    }))
}

/// The body of an accepted prewarm, written as the earlier handler wrote it: Python's
/// `json.dumps` with its default separators.
pub(crate) fn prewarm_accepted_body(n_keys: usize) -> String {
    format!("{{\"accepted\": true, \"n_keys\": {n_keys}}}")
}

/// A profile request: which active workers, and the body their engines get.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProfileRequest {
    /// Exact worker id (`None`: any).
    pub worker_id: Option<Value>,
    /// Exact model name (`None`: any).
    pub model: Option<Value>,
    /// Role (`None`: any).
    pub role: Option<DisaggMode>,
    /// What is forwarded to each engine.
    pub forward: Map<String, Value>,
}

/// Reads a profile request (`app.py:128-168`): the body when it is a JSON object (else
/// `{}`), each selector from the query when given there non-empty (the body's key then
/// stays and is forwarded), else taken out of the body. A role that is not one is the
/// earlier 400's text.
pub(crate) fn parse_profile(
    query: &[(String, String)],
    body: &[u8],
) -> Result<ProfileRequest, String> {
    let mut forward = match read_json(body) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let mut selector = |name: &str| -> Option<Value> {
        let from_query = query
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty());
        match from_query {
            Some(v) => Some(Value::String(v.to_owned())),
            None => forward.shift_remove(name).filter(|v| !v.is_null()),
        }
    };
    let worker_id = selector("worker_id");
    let model = selector("model");
    let role = selector("role");
    let role = match role {
        None => None,
        Some(Value::String(r)) if r.is_empty() => None,
        Some(r) => Some(parse_role(&r)?),
    };
    Ok(ProfileRequest {
        worker_id,
        model,
        role,
        forward,
    })
}

fn parse_role(role: &Value) -> Result<DisaggMode, String> {
    let mode = match role.as_str().map(str::to_lowercase).as_deref() {
        Some("mixed") => Some(DisaggMode::Mixed),
        Some("prefill") => Some(DisaggMode::Prefill),
        Some("decode") => Some(DisaggMode::Decode),
        _ => None,
    };
    mode.ok_or_else(|| {
        format!(
            "invalid role {}; expected one of: mixed, prefill, decode",
            python::repr(role)
        )
    })
}

/// A scale request's body refused (`app.py:214-227`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ScaleBodyError {
    /// Not JSON.
    #[error("body must be JSON")]
    NotJson,
    /// No `services` object.
    #[error("body must be {{\"services\": {{\"<name>\": {{\"replicas\": N}}}}}}")]
    NoServices,
}

/// The counts a scale body asks for, by service, in the body's order: each value
/// `{"replicas": N}` (its `replicas`, `null` when absent) or a bare `N`.
pub(crate) fn parse_scale(body: &[u8]) -> Result<Vec<(String, Value)>, ScaleBodyError> {
    let value = read_json(body).map_err(|_| ScaleBodyError::NotJson)?;
    let services = match &value {
        Value::Object(map) => map.get("services"),
        // `(body or {}).get("services")`: a falsy body is an empty one; any other value
        // that is not an object was a 500.
        _ => None,
    };
    let Some(Value::Object(services)) = services else {
        return Err(ScaleBodyError::NoServices);
    };
    Ok(services
        .iter()
        .map(|(name, cfg)| {
            let count = match cfg {
                Value::Object(c) => c.get("replicas").cloned().unwrap_or(Value::Null),
                other => other.clone(),
            };
            (name.clone(), count)
        })
        .collect())
}

/// Checks requested counts against the services a deployment has (`scaling.py:257-285`):
/// none named, unknown names (sorted), then per service in sorted order a count that is
/// not an integer or is below 1. Returns the counts by service, sorted.
pub(crate) fn validate_scale(
    requested: &[(String, Value)],
    known: &[String],
) -> Result<Vec<(String, i64)>, String> {
    let mut unknown: Vec<&str> = requested
        .iter()
        .map(|(s, _)| s.as_str())
        .filter(|s| !known.iter().any(|k| k == s))
        .collect();
    unknown.sort_unstable();
    unknown.dedup();
    if !unknown.is_empty() {
        let mut known: Vec<&str> = known.iter().map(String::as_str).collect();
        known.sort_unstable();
        return Err(format!(
            "no such service(s): {}. This deployment has: {}",
            unknown.join(", "),
            known.join(", ")
        ));
    }
    let mut sorted: Vec<&(String, Value)> = requested.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (svc, count) in sorted {
        let n = match count {
            Value::Number(n) => n.as_i64(),
            _ => None,
        };
        let Some(n) = n else {
            return Err(format!(
                "{svc}: replicas must be an integer, got {}",
                python::repr(count)
            ));
        };
        if n < 1 {
            return Err(format!(
                "{svc}: refusing to scale to {n}. A pool at zero stops serving, and in a PD \
                 deployment an empty prefill or decode pool fails every request. Edit the \
                 InferaDeployment directly if that is the intent."
            ));
        }
        out.push((svc.clone(), n));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dp_ranks_as_pydantic_reads_them() {
        for (raw, rank) in [
            ("1", "1"),
            (" 1 ", "1"),
            ("+1", "1"),
            ("-1", "-1"),
            ("1_0", "10"),
            ("01", "1"),
            ("1.00", "1"),
            ("-0.0", "0"),
            ("99999999999999999999", "99999999999999999999"),
        ] {
            assert_eq!(parse_dp_rank(raw).as_deref(), Some(rank), "{raw:?}");
        }
        for raw in [
            "", " ", "abc", "1.5", "1.", "1e2", "0x10", "1__0", "_1", "1_", "- 1", "+-1",
        ] {
            assert_eq!(parse_dp_rank(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn a_prewarm_body_is_checked_in_the_earlier_order() {
        let parse = |body: &str| parse_prewarm(body.as_bytes()).map_err(|e| e.to_string());
        assert_eq!(
            parse(r#"{"model": "m", "block_hashes": [], "deadline_ms": -5}"#),
            Ok(None),
            "an empty list is accepted before anything else is looked at"
        );
        assert_eq!(parse(r#"{"model": 7}"#).unwrap_err(), "`model` is required");
        assert_eq!(parse("[1]").unwrap_err(), "the body must be a JSON object");
        let hint = parse(
            r#"{"model": "m", "block_hashes": ["00112233aabbccdd", "aa bb"], "deadline_ms": "250"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            hint.keys,
            vec![hex_of("00112233aabbccdd"), vec![0xaa, 0xbb]]
        );
        assert_eq!((hint.deadline_ms, hint.compat_key.as_str()), (250, ""));
        assert_eq!(
            parse(r#"{"model": "m", "block_hashes": ["00"], "compat_key": null}"#).unwrap_err(),
            "`compat_key` must be a string"
        );
        assert_eq!(
            prewarm_accepted_body(2),
            r#"{"accepted": true, "n_keys": 2}"#
        );
    }

    fn hex_of(s: &str) -> Vec<u8> {
        python::fromhex(s).unwrap()
    }

    #[test]
    fn profile_selectors_come_from_the_query_first() {
        let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let r = parse_profile(
            &q(&[("worker_id", "w1")]),
            br#"{"worker_id": "w1", "model": "m", "output_dir": "/tmp/x"}"#,
        )
        .unwrap();
        assert_eq!(r.worker_id, Some(json!("w1")));
        assert_eq!(r.model, Some(json!("m")));
        assert_eq!(
            Value::Object(r.forward),
            json!({"worker_id": "w1", "output_dir": "/tmp/x"}),
            "given in the query, the body's key is forwarded"
        );
        let r = parse_profile(&q(&[("role", "DECODE")]), b"not json").unwrap();
        assert_eq!(r.role, Some(DisaggMode::Decode));
        assert!(r.forward.is_empty());
        assert_eq!(
            parse_profile(&q(&[("role", "router")]), b"").unwrap_err(),
            "invalid role 'router'; expected one of: mixed, prefill, decode"
        );
        let r = parse_profile(&q(&[("model", "")]), br#"{"model": "m"}"#).unwrap();
        assert_eq!(
            r.model,
            Some(json!("m")),
            "an empty query value counts as absent"
        );
    }

    #[test]
    fn scale_requests_as_the_earlier_server_checked_them() {
        let known = vec!["mixed".to_owned()];
        let requested = parse_scale(br#"{"services": {"mixed": {"replicas": 3}}}"#).unwrap();
        assert_eq!(
            validate_scale(&requested, &known),
            Ok(vec![("mixed".into(), 3)])
        );
        for (body, error) in [
            ("{", ScaleBodyError::NotJson),
            ("null", ScaleBodyError::NoServices),
            (r#"{"services": [1]}"#, ScaleBodyError::NoServices),
            ("[1]", ScaleBodyError::NoServices),
        ] {
            assert_eq!(parse_scale(body.as_bytes()), Err(error), "{body}");
        }
        let check = |body: &str| {
            validate_scale(&parse_scale(body.as_bytes()).unwrap(), &known).unwrap_err()
        };
        assert_eq!(
            check(r#"{"services": {"worker": 2, "server": 1}}"#),
            "no such service(s): server, worker. This deployment has: mixed"
        );
        assert_eq!(
            check(r#"{"services": {"mixed": {"replicas": "4"}}}"#),
            "mixed: replicas must be an integer, got '4'"
        );
        assert_eq!(
            check(r#"{"services": {"mixed": {}}}"#),
            "mixed: replicas must be an integer, got None"
        );
        assert!(
            check(r#"{"services": {"mixed": 0}}"#).starts_with("mixed: refusing to scale to 0.")
        );
    }
}
