//! A gateway as a client sees it from this machine (through its Service's NodePort on
//! 127.0.0.1), and what its `/metrics` says about where requests went.

use crate::E2eError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The workers a response names (`x-infera-worker`, `x-infera-prefill-worker`,
/// `x-infera-decode-worker`, `x-infera-revision`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServedBy {
    /// The mixed or decode worker.
    pub worker: Option<String>,
    /// The prefill worker of a pair.
    pub prefill: Option<String>,
    /// The decode worker of a pair.
    pub decode: Option<String>,
    /// Their revision.
    pub revision: Option<String>,
}

impl ServedBy {
    fn from_headers(headers: &reqwest::header::HeaderMap) -> Self {
        let get = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        Self {
            worker: get("x-infera-worker"),
            prefill: get("x-infera-prefill-worker"),
            decode: get("x-infera-decode-worker"),
            revision: get("x-infera-revision"),
        }
    }
}

/// A gateway's base URL and an HTTP client with a bound on every request.
#[derive(Clone)]
pub struct Gateway {
    base: String,
    http: reqwest::Client,
}

/// One answer: status, body, and the worker(s) the gateway picked for it.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The JSON body (or, for a stream, the `data:` events' JSON in order).
    pub body: Value,
    /// Workers whose pick count rose while the request ran (`role/worker_id`).
    pub picked: Vec<String>,
}

impl Answer {
    /// `usage.prompt_tokens_details.cached_tokens` (0 when absent).
    pub fn cached_tokens(&self) -> u64 {
        self.body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
    }
}

impl Gateway {
    /// A gateway at `base` (`http://127.0.0.1:<nodePort>`).
    pub fn new(base: String) -> Result<Self, E2eError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| E2eError::Http(e.to_string()))?;
        Ok(Self { base, http })
    }

    /// A gateway at `base` reached with `http` (a client with its own root certificates
    /// or default headers, such as an API key).
    pub fn with_client(base: String, http: reqwest::Client) -> Self {
        Self { base, http }
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET path`: status and body text.
    pub async fn get(&self, path: &str) -> Result<(u16, String), E2eError> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| E2eError::Http(format!("GET {}{path}: {e}", self.base)))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| E2eError::Http(e.to_string()))?;
        Ok((status, text))
    }

    /// The ids of the workers `/v1/workers` lists as active (routed).
    pub async fn active_workers(&self) -> Result<Vec<String>, E2eError> {
        let (status, text) = self.get("/v1/workers").await?;
        let body: Value = serde_json::from_str(&text)
            .map_err(|_| E2eError::Http(format!("/v1/workers answered {status}: {text}")))?;
        Ok(body["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| w["state"] == "active")
            .filter_map(|w| w["worker_id"].as_str().map(str::to_owned))
            .collect())
    }

    /// Pick counts per `role/worker_id` from `/metrics`.
    pub async fn picks(&self) -> Result<BTreeMap<String, u64>, E2eError> {
        let (_, text) = self.get("/metrics").await?;
        Ok(parse_picks(&text))
    }

    /// The value of one sample of `/metrics` (`name{labels}` exactly as written), 0 when
    /// absent.
    pub async fn metric(&self, sample: &str) -> Result<f64, E2eError> {
        let (_, text) = self.get("/metrics").await?;
        Ok(sample_value(&text, sample))
    }

    /// `POST path` with `body`: status and body text, nothing else read.
    pub async fn send(&self, path: &str, body: &Value) -> Result<(u16, String), E2eError> {
        self.send_timed(path, body)
            .await
            .map(|(status, text, _)| (status, text))
    }

    /// As [`Gateway::send`], with the time from sending until the first byte of the body
    /// (for a stream, its first token).
    pub async fn send_timed(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(u16, String, Duration), E2eError> {
        self.send_served(path, body)
            .await
            .map(|(status, text, first, _)| (status, text, first))
    }

    /// As [`Gateway::send_timed`], with the workers the response names as its servers.
    pub async fn send_served(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(u16, String, Duration, ServedBy), E2eError> {
        let started = std::time::Instant::now();
        let mut resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .map_err(|e| E2eError::Http(format!("POST {path}: {e}")))?;
        let status = resp.status().as_u16();
        let served = ServedBy::from_headers(resp.headers());
        let mut bytes = Vec::new();
        let mut first = None;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| E2eError::Http(format!("reading {path}: {e}")))?
        {
            first.get_or_insert_with(|| started.elapsed());
            bytes.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Ok((
            status,
            text,
            first.unwrap_or_else(|| started.elapsed()),
            served,
        ))
    }

    /// `POST path` with `body`, JSON or SSE (`"stream": true`), and which worker served it.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Answer, E2eError> {
        let before = self.picks().await?;
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .map_err(|e| E2eError::Http(format!("POST {}{path}: {e}", self.base)))?;
        let status = resp.status().as_u16();
        let streamed = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let text = resp
            .text()
            .await
            .map_err(|e| E2eError::Http(format!("reading {path}: {e}")))?;
        let body = if streamed {
            Value::Array(parse_sse(&text))
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        let after = self.picks().await?;
        let picked = after
            .into_iter()
            .filter(|(k, n)| before.get(k).copied().unwrap_or(0) < *n)
            .map(|(k, _)| k)
            .collect();
        Ok(Answer {
            status,
            body,
            picked,
        })
    }
}

/// `role/worker_id` -> count, from `infera_router_picks_total` samples.
pub fn parse_picks(metrics: &str) -> BTreeMap<String, u64> {
    infera_gateway::parse_picks(metrics)
        .into_iter()
        .map(|((role, worker), n)| (format!("{role}/{worker}"), n))
        .collect()
}

/// The value of the sample written exactly as `sample` (name and labels), 0 when absent.
pub fn sample_value(metrics: &str, sample: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == sample).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// The JSON of each `data:` event of an SSE body, `[DONE]` as the string "[DONE]".
pub fn parse_sse(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .map(|data| serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.into())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_picks_samples_and_sse() {
        let metrics = "# TYPE infera_router_picks_total counter\n\
            infera_router_picks_total{role=\"mixed\",worker_id=\"10.244.0.7:8000\"} 3\n\
            infera_gateway_kv_events_total{outcome=\"applied\"} 12\n";
        assert_eq!(
            parse_picks(metrics),
            BTreeMap::from([("mixed/10.244.0.7:8000".to_owned(), 3)])
        );
        assert_eq!(
            sample_value(
                metrics,
                "infera_gateway_kv_events_total{outcome=\"applied\"}"
            ),
            12.0
        );
        assert_eq!(sample_value(metrics, "absent"), 0.0);
        let events = parse_sse("data: {\"a\":1}\n\ndata: [DONE]\n\n");
        assert_eq!(
            events,
            vec![serde_json::json!({"a": 1}), Value::from("[DONE]")]
        );
    }
}
