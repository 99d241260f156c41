//! Prewarm hints (`POST /v1/cache/prewarm`): where the earlier server opened kvd's
//! socket from its own process, kvd here runs beside each engine, in its pod. So a
//! hint goes either to the kvd socket this gateway was given (`--kvd-socket-path`, a
//! gateway on the same machine as its kvd, as before), or through the engine sidecar of
//! each active worker of the hint's model (`--worker-sidecar-port`: `POST /kvd/prefetch`,
//! authorised as the sidecar's `/drain`, which leaves it with its kvd). With neither, or
//! when no kvd took it, the answer is 503 naming why.

use crate::request::control::Prewarm;
use crate::request::python;
use crate::workers::registry::Snapshot;
use infera_kvd::client::{PrefetchHint, send_prefetch_hint};
use infera_kvd::wire::Key;
use infera_proto::sidecar::{DRAIN_TOKEN_HEADER, KVD_PREFETCH_PATH, PrefetchHintRequest};
use infera_proto::worker::WorkerStatus;
use std::path::Path;
use std::time::Duration;

/// The earlier server's client id, which kvd logs.
const CLIENT_ID: &str = "infera-router-prefetch";

/// How long one hint may take, to a socket or a sidecar.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Why no kvd took a hint (503s, worded as the earlier server's where it had the case).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum PrewarmError {
    /// Neither a kvd socket nor a sidecar port.
    #[error("prefetch unavailable — kvd_socket_path not configured")]
    Unconfigured,
    /// No active worker serves the model, so no kvd holds its blocks.
    #[error(
        "prefetch unavailable — no active worker serves model {0}, so no kvd beside one can take it"
    )]
    NoWorker(String),
    /// The kvd (or every sidecar asked) refused or could not be reached.
    #[error("kvd unreachable: {0}")]
    Unreachable(String),
}

/// A worker's sidecar to forward a hint to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SidecarTarget {
    /// The worker.
    pub worker_id: String,
    /// Its sidecar's `/kvd/prefetch`.
    pub url: String,
}

/// The sidecars of the active workers of `model`, each once (the ranks of one engine,
/// registered apart, share its pod's kvd).
pub(crate) fn sidecar_targets(snapshot: &Snapshot, model: &str, port: u16) -> Vec<SidecarTarget> {
    let mut out: Vec<SidecarTarget> = Vec::new();
    for w in snapshot.workers.values() {
        if w.model_name != model || snapshot.status(&w.worker_id) != Some(WorkerStatus::Active) {
            continue;
        }
        let Some(url) = sidecar_url(&w.url, port) else {
            continue;
        };
        if !out.iter().any(|t| t.url == url) {
            out.push(SidecarTarget {
                worker_id: w.worker_id.clone(),
                url,
            });
        }
    }
    out
}

fn sidecar_url(engine_url: &str, port: u16) -> Option<String> {
    let mut url = reqwest::Url::parse(engine_url).ok()?;
    url.set_port(Some(port)).ok()?;
    url.set_scheme("http").ok()?;
    url.set_path(KVD_PREFETCH_PATH);
    url.set_query(None);
    Some(url.into())
}

/// Leaves the hint with the kvd at `socket` (its 8-byte keys: kvd's keys are 8 bytes,
/// other lengths match nothing).
pub(crate) async fn send_to_socket(socket: &Path, prewarm: &Prewarm) -> Result<(), PrewarmError> {
    let hint = PrefetchHint {
        keys: prewarm
            .keys
            .iter()
            .filter_map(|k| Key::try_from(k.as_slice()).ok())
            .collect(),
        model: prewarm.model.clone(),
        compat_key: prewarm.compat_key.clone(),
        deadline_ms: prewarm.deadline_ms,
    };
    send_prefetch_hint(socket, CLIENT_ID, &hint, TIMEOUT)
        .await
        .map_err(|e| PrewarmError::Unreachable(e.to_string()))
}

/// Forwards the hint to each of `targets` at once, presenting `drain_token`; accepted
/// when one sidecar took it.
pub(crate) async fn send_to_sidecars(
    client: &reqwest::Client,
    targets: &[SidecarTarget],
    prewarm: &Prewarm,
    drain_token: Option<&str>,
) -> Result<(), PrewarmError> {
    if targets.is_empty() {
        return Err(PrewarmError::NoWorker(python::repr_str(&prewarm.model)));
    }
    let request = PrefetchHintRequest {
        keys: prewarm.keys.iter().map(hex::encode).collect(),
        model: prewarm.model.clone(),
        compat_key: prewarm.compat_key.clone(),
        deadline_ms: prewarm.deadline_ms,
    };
    let body = serde_json::to_vec(&request).unwrap_or_default();
    let one = |target: &SidecarTarget| {
        let mut post = client
            .post(&target.url)
            .timeout(TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        if let Some(token) = drain_token {
            post = post.header(DRAIN_TOKEN_HEADER, token);
        }
        async move {
            let response = post.send().await.map_err(|e| e.to_string())?;
            let status = response.status();
            if status == reqwest::StatusCode::ACCEPTED {
                return Ok(());
            }
            let bytes = response.bytes().await.unwrap_or_default();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            Err(body["error"]["message"]
                .as_str()
                .map_or_else(|| format!("answered {status}"), str::to_owned))
        }
    };
    let answers = futures::future::join_all(targets.iter().map(one)).await;
    if answers.iter().any(Result::is_ok) {
        return Ok(());
    }
    let reasons: Vec<String> = targets
        .iter()
        .zip(answers)
        .filter_map(|(t, a)| a.err().map(|e| format!("worker {}: {e}", t.worker_id)))
        .collect();
    Err(PrewarmError::Unreachable(reasons.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::registry::Registry;
    use infera_proto::worker::WorkerRecord;
    use serde_json::json;

    fn record(id: &str, model: &str, extra: serde_json::Value) -> WorkerRecord {
        let mut v = json!({"worker_id": id, "url": format!("http://{id}"), "model_name": model,
                           "engine": "vllm"});
        if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            m.extend(e.clone());
        }
        WorkerRecord::from_json(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn each_active_worker_of_the_model_once_per_pod() {
        let registry = Registry::new();
        registry.upsert(record("10.0.0.1:8000", "m", json!({})));
        registry.upsert(record(
            "10.0.0.1:8001",
            "m",
            json!({"dp_rank": 1, "dp_size": 2}),
        ));
        registry.upsert(record("10.0.0.2:8000", "other", json!({})));
        registry.upsert(record("10.0.0.3:8000", "m", json!({"status": "draining"})));
        let targets = sidecar_targets(&registry.snapshot(), "m", 8090);
        assert_eq!(
            targets,
            vec![SidecarTarget {
                worker_id: "10.0.0.1:8000".into(),
                url: "http://10.0.0.1:8090/kvd/prefetch".into(),
            }]
        );
        assert!(sidecar_targets(&registry.snapshot(), "absent", 8090).is_empty());
    }
}
