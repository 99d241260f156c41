//! Which workers served a request, as the response names them: the worker (the decode
//! of a prefill/decode pair), the prefill, and the revision of the engine spec they run.
//! Clients and tests read them to see where a request went (during a rollout: that both
//! legs ran one revision). They name workers by their `host:port`.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The worker that answered (mixed, or the decode of a pair).
pub(crate) const WORKER_HEADER: &str = "x-infera-worker";
/// The prefill worker of a prefill/decode pair.
pub(crate) const PREFILL_HEADER: &str = "x-infera-prefill-worker";
/// The decode worker of a prefill/decode pair.
pub(crate) const DECODE_HEADER: &str = "x-infera-decode-worker";
/// The revision of the engine spec the workers run (absent when they name none).
pub(crate) const REVISION_HEADER: &str = "x-infera-revision";

/// The workers a request was sent to first (a generation moved mid-stream keeps the
/// headers it was answered with).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServedBy {
    /// The mixed or decode worker.
    pub worker: String,
    /// The prefill worker of a pair.
    pub prefill: Option<String>,
    /// Their revision.
    pub revision: Option<String>,
}

impl ServedBy {
    /// Adds the headers to `headers` (nothing before a worker was picked).
    pub(crate) fn write(&self, headers: &mut HeaderMap) {
        if self.worker.is_empty() {
            return;
        }
        let mut put = |name: &'static str, value: &str| {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(HeaderName::from_static(name), v);
            }
        };
        put(WORKER_HEADER, &self.worker);
        if let Some(prefill) = &self.prefill {
            put(PREFILL_HEADER, prefill);
            put(DECODE_HEADER, &self.worker);
        }
        if let Some(revision) = &self.revision {
            put(REVISION_HEADER, revision);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(served: &ServedBy) -> Vec<(String, String)> {
        let mut headers = HeaderMap::new();
        served.write(&mut headers);
        let mut all: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        all.sort();
        all
    }

    #[test]
    fn a_pair_names_both_legs_and_their_revision() {
        let served = ServedBy {
            worker: "10.0.0.2:8000".into(),
            prefill: Some("10.0.0.1:8000".into()),
            revision: Some("5f1c2a9e0b7d4c31".into()),
        };
        assert_eq!(
            written(&served),
            [
                ("x-infera-decode-worker", "10.0.0.2:8000"),
                ("x-infera-prefill-worker", "10.0.0.1:8000"),
                ("x-infera-revision", "5f1c2a9e0b7d4c31"),
                ("x-infera-worker", "10.0.0.2:8000"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn a_mixed_worker_without_a_revision_is_named_alone() {
        let served = ServedBy {
            worker: "[fd00::1]:8000".into(),
            ..ServedBy::default()
        };
        assert_eq!(
            written(&served),
            [("x-infera-worker".to_owned(), "[fd00::1]:8000".to_owned())]
        );
        assert!(written(&ServedBy::default()).is_empty());
    }
}
