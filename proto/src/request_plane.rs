//! The NATS request plane, as the earlier system spoke it (`infera/common/nats_request.py`
//! in AMD-AGI/Infera): a request envelope published to `infera.req.<tok>` with a reply
//! inbox, reply frames told apart by the `rs-type` header, cancels on
//! `infera.cancel.<tok>`, and the optional JetStream admission stream. Pure data.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub use crate::kv_stream::{build_cancel_subject, build_request_subject, build_worker_token};

/// Header naming a reply frame's kind.
pub const HEADER_TYPE: &str = "rs-type";
/// Header of a `done` frame: the engine's HTTP status.
pub const HEADER_STATUS: &str = "rs-status";
/// Header carrying the reply inbox when requests go through JetStream (there a message's
/// reply subject is its ack subject).
pub const HEADER_INBOX: &str = "rs-inbox";

/// The error payload of a worker handing a migratable request back as it drains.
pub const DRAINING_NOTICE: &[u8] = b"infera: worker draining";

/// JetStream stream of the admission-controlled request path.
pub const REQUEST_STREAM: &str = "INFERA_REQUESTS";
/// Subjects of [`REQUEST_STREAM`].
pub const REQUEST_STREAM_SUBJECTS: &str = "infera.req.>";
/// Messages [`REQUEST_STREAM`] keeps at most (the oldest go first).
pub const REQUEST_STREAM_MAX_MESSAGES: i64 = 1_000_000;
/// Ack wait of a worker's request consumer: a long generation stays counted as pending.
pub const REQUEST_ACK_WAIT_S: u64 = 3600;
/// How long the gateway trusts a consumer backlog it read.
pub const PENDING_CACHE_S: f64 = 0.2;

/// Default idle timeout (seconds to the next reply frame).
pub const DEFAULT_IDLE_TIMEOUT_S: f64 = 900.0;
/// Cancels sent per abandoned request, and the gap between them.
pub const CANCEL_RESENDS: u32 = 3;
/// Seconds between cancel resends.
pub const CANCEL_RESEND_GAP_S: f64 = 1.0;

/// Environment of the earlier system: idle timeout (s; 0 off).
pub const ENV_IDLE_TIMEOUT: &str = "INFERA_NATS_REQ_IDLE_TIMEOUT";
/// Environment of the earlier system: total duration cap (s; 0 off).
pub const ENV_MAX_DURATION: &str = "INFERA_NATS_REQ_MAX_DURATION";
/// Environment of the earlier system: admission backlog limit (0 off).
pub const ENV_MAX_PENDING: &str = "INFERA_NATS_REQ_MAX_PENDING";

/// The durable consumer of a worker's requests: its subject token.
pub fn build_request_durable(worker_id: &str) -> String {
    build_worker_token(worker_id)
}

/// One request to a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Engine path, e.g. `/v1/chat/completions`.
    #[serde(default = "default_path")]
    pub path: String,
    /// Whether the engine streams its answer.
    #[serde(default)]
    pub stream: bool,
    /// Headers for the engine request (the earlier router sent its data-parallel rank
    /// header here, or `null`).
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
    /// The engine request body.
    #[serde(default)]
    pub body: Map<String, Value>,
    /// The router can continue this generation elsewhere (the earlier router left it out
    /// of unary requests: missing is `false`).
    #[serde(default)]
    pub migratable: bool,
}

fn default_path() -> String {
    "/v1/chat/completions".into()
}

/// A reply frame's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameType {
    /// Response bytes: an SSE chunk, or the whole JSON body.
    Data,
    /// The end, with the engine's status.
    Done,
    /// A failure, its text in the payload.
    Error,
}

impl FrameType {
    /// The `rs-type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Done => "done",
            Self::Error => "error",
        }
    }

    /// The kind of a frame from its `rs-type` header: anything but `done` and `error`
    /// (missing included) is data, as the earlier router read it.
    pub fn parse(header: Option<&str>) -> Self {
        match header {
            Some("done") => Self::Done,
            Some("error") => Self::Error,
            _ => Self::Data,
        }
    }
}

/// The status of a `done` frame: its `rs-status`, 200 when missing or empty (as the
/// earlier router read it); `None` for a value that is not a status.
pub fn parse_status(header: Option<&str>) -> Option<u16> {
    match header.map(str::trim) {
        None | Some("") => Some(200),
        Some(s) => s.parse().ok().filter(|c| (100..600).contains(c)),
    }
}

/// A reply frame on its way out: headers and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Kind.
    pub kind: FrameType,
    /// `rs-status` of a `done` frame.
    pub status: Option<u16>,
    /// Payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// Response bytes.
    pub fn data(payload: impl Into<Vec<u8>>) -> Self {
        Self {
            kind: FrameType::Data,
            status: None,
            payload: payload.into(),
        }
    }

    /// The end of a response with `status`.
    pub fn done(status: u16) -> Self {
        Self {
            kind: FrameType::Done,
            status: Some(status),
            payload: Vec::new(),
        }
    }

    /// A failure.
    pub fn error(text: impl Into<Vec<u8>>) -> Self {
        Self {
            kind: FrameType::Error,
            status: None,
            payload: text.into(),
        }
    }

    /// The frame's NATS headers, in the order the earlier worker set them.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![(HEADER_TYPE, self.kind.as_str().to_owned())];
        if let Some(s) = self.status {
            h.push((HEADER_STATUS, s.to_string()));
        }
        h
    }
}

/// Whether an error frame's payload is a drain hand-back.
pub fn is_draining_notice(payload: &[u8]) -> bool {
    payload.starts_with(DRAINING_NOTICE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_tokens_and_frames() {
        assert_eq!(
            build_request_subject("10.0.0.1:8000"),
            "infera.req.MTAuMC4wLjE6ODAwMA"
        );
        assert_eq!(
            build_cancel_subject("10.0.0.1:8000"),
            "infera.cancel.MTAuMC4wLjE6ODAwMA"
        );
        assert_eq!(build_request_durable("10.0.0.1:8000"), "MTAuMC4wLjE6ODAwMA");
        assert_eq!(FrameType::parse(None), FrameType::Data);
        assert_eq!(FrameType::parse(Some("data")), FrameType::Data);
        assert_eq!(FrameType::parse(Some("weird")), FrameType::Data);
        assert_eq!(FrameType::parse(Some("done")), FrameType::Done);
        assert_eq!(FrameType::parse(Some("error")), FrameType::Error);
        assert_eq!(parse_status(None), Some(200));
        assert_eq!(parse_status(Some("")), Some(200));
        assert_eq!(parse_status(Some("429")), Some(429));
        assert_eq!(parse_status(Some("x")), None);
        assert_eq!(parse_status(Some("99")), None);
        assert_eq!(
            Frame::done(200).headers(),
            vec![
                ("rs-type", "done".to_owned()),
                ("rs-status", "200".to_owned())
            ]
        );
        assert_eq!(
            Frame::data("x").headers(),
            vec![("rs-type", "data".to_owned())]
        );
        assert!(is_draining_notice(b"infera: worker draining"));
        assert!(!is_draining_notice(b"request cancelled"));
    }

    #[test]
    fn envelope_defaults_follow_the_earlier_reader() {
        let e: Envelope = serde_json::from_str(r#"{"body": {"model": "m"}}"#).unwrap();
        assert_eq!(e.path, "/v1/chat/completions");
        assert!(!e.stream && !e.migratable && e.headers.is_none());
    }
}
