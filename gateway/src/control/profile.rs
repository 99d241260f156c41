//! Profile fan-out (`POST /v1/admin/profile/{start,stop}`, with `--enable-profiling`):
//! the matching active workers (pure: [`select_targets`]) each get the request's
//! remaining body on their engine's own `/start_profile` or `/stop_profile`, at once;
//! every answer, or why there was none, is one entry of the aggregate, in the order of
//! `/v1/workers` (`infera/server/profiling.py`). A worker that fails is reported, never
//! the whole call.

use crate::request::control::ProfileRequest;
use crate::workers::registry::Snapshot;
use infera_proto::worker::WorkerStatus;
use serde_json::{Map, Value, json};
use std::time::Duration;

/// The earlier fan-out's client bounds: 30 s for an answer, 10 s to connect.
const TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One worker to profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProfileTarget {
    /// Its id.
    pub worker_id: String,
    /// Its engine's URL as registered.
    pub url: String,
    /// `sglang`, `vllm` or `atom`.
    pub engine: &'static str,
}

/// The active workers a request selects: each selector, when given, by exact equality
/// (a selector that is not a string matches nothing); none given: every active worker,
/// prefill and decode ones too.
pub(crate) fn select_targets(snapshot: &Snapshot, request: &ProfileRequest) -> Vec<ProfileTarget> {
    let matches = |selector: &Option<Value>, value: &str| {
        selector.as_ref().is_none_or(|s| s.as_str() == Some(value))
    };
    snapshot
        .workers
        .values()
        .filter(|w| snapshot.status(&w.worker_id) == Some(WorkerStatus::Active))
        .filter(|w| matches(&request.worker_id, &w.worker_id))
        .filter(|w| matches(&request.model, &w.model_name))
        .filter(|w| request.role.is_none_or(|r| r == w.disagg_mode))
        .map(|w| ProfileTarget {
            worker_id: w.worker_id.clone(),
            url: w.url.clone(),
            engine: w.engine.as_str(),
        })
        .collect()
}

/// The client the fan-out uses: the earlier one's bounds.
pub(crate) fn build_profile_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
}

/// Why a request reached no answer, as the earlier server's httpx named it
/// (`ConnectError: [Errno 111] Connection refused`).
fn describe_failure(e: &reqwest::Error) -> String {
    let mut io: Option<&std::io::Error> = None;
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(found) = s.downcast_ref::<std::io::Error>() {
            io = Some(found);
        }
        source = s.source();
    }
    let kind = match (e.is_connect(), e.is_timeout()) {
        (true, true) => "ConnectTimeout",
        (true, false) => "ConnectError",
        (false, true) => "ReadTimeout",
        (false, false) => "RemoteProtocolError",
    };
    let text = match io {
        Some(io) if !e.is_timeout() => infera_kvd::client::errno_text(io),
        _ if e.is_timeout() => "timed out".to_owned(),
        _ => e.to_string(),
    };
    format!("{kind}: {text}")
}

async fn profile_one(
    client: &reqwest::Client,
    target: &ProfileTarget,
    action: &str,
    body: &Map<String, Value>,
) -> Value {
    let url = format!("{}/{action}_profile", target.url);
    let sent = client
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(body).unwrap_or_default())
        .send()
        .await;
    let (status_code, ok, detail) = match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            let detail = match response.bytes().await {
                Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())),
                Err(e) => Value::String(describe_failure(&e)),
            };
            (json!(status), status < 400, detail)
        }
        Err(e) => {
            tracing::warn!(worker = %target.worker_id, "profile {action} failed for {url}: {e}");
            (Value::Null, false, Value::String(describe_failure(&e)))
        }
    };
    json!({
        "worker_id": target.worker_id,
        "url": url,
        "engine": target.engine,
        "status_code": status_code,
        "ok": ok,
        "detail": detail,
    })
}

/// Sends `action` (`start` or `stop`) to every target at once; the aggregate answer.
pub(crate) async fn fan_out(
    client: &reqwest::Client,
    targets: &[ProfileTarget],
    action: &str,
    body: &Map<String, Value>,
) -> Value {
    let results =
        futures::future::join_all(targets.iter().map(|t| profile_one(client, t, action, body)))
            .await;
    let succeeded = results.iter().filter(|r| r["ok"] == true).count();
    json!({
        "action": action,
        "requested": results.len(),
        "succeeded": succeeded,
        "results": results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::registry::Registry;
    use infera_proto::worker::{DisaggMode, WorkerRecord};

    fn record(id: &str, model: &str, engine: &str, mode: &str) -> WorkerRecord {
        WorkerRecord::from_json(
            json!({"worker_id": id, "url": format!("http://{id}"), "model_name": model,
                   "engine": engine, "disagg_mode": mode})
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn selectors_match_exactly_and_only_active_workers() {
        let registry = Registry::new();
        registry.upsert(record("10.0.0.1:30000", "m", "sglang", "mixed"));
        registry.upsert(record("10.0.0.2:30000", "m", "vllm", "decode"));
        registry.upsert(record("10.0.0.3:30000", "other", "vllm", "mixed"));
        registry.upsert(record("10.0.0.4:30000", "m", "vllm", "mixed"));
        registry.set_draining("10.0.0.4:30000", true);
        let snapshot = registry.snapshot();
        let ids = |r: ProfileRequest| -> Vec<String> {
            select_targets(&snapshot, &r)
                .into_iter()
                .map(|t| t.worker_id)
                .collect()
        };
        let none = ProfileRequest {
            worker_id: None,
            model: None,
            role: None,
            forward: Map::new(),
        };
        assert_eq!(
            ids(none.clone()),
            ["10.0.0.1:30000", "10.0.0.2:30000", "10.0.0.3:30000"],
            "every active worker, draining ones left out"
        );
        assert_eq!(
            ids(ProfileRequest {
                model: Some(json!("m")),
                ..none.clone()
            }),
            ["10.0.0.1:30000", "10.0.0.2:30000"]
        );
        assert_eq!(
            ids(ProfileRequest {
                role: Some(DisaggMode::Decode),
                ..none.clone()
            }),
            ["10.0.0.2:30000"]
        );
        assert!(
            ids(ProfileRequest {
                worker_id: Some(json!(7)),
                ..none
            })
            .is_empty(),
            "a selector that is not a string matches nothing"
        );
    }
}
