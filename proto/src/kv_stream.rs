//! How KV-event batches travel: ZMQ multipart framing from engines, and the NATS
//! JetStream subjects the sidecar relays them on.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::time::Duration;
use thiserror::Error;

/// ZMQ topic engines publish KV events on.
pub const ZMQ_TOPIC: &str = "kv-events";

/// Sequence number the replay socket sends to mark the end of a replay.
pub const REPLAY_END_SEQUENCE: i64 = -1;

/// JetStream stream holding relayed batches.
pub const NATS_STREAM: &str = "INFERA_KV_EVENTS";

/// Subject prefix of relayed batches.
pub const NATS_SUBJECT_PREFIX: &str = "infera.kv.events";

/// Wildcard routers subscribe to.
pub const NATS_SUBJECT_ALL: &str = "infera.kv.events.>";

/// Stream size limit: 256 MiB.
pub const NATS_STREAM_MAX_BYTES: i64 = 256 * 1024 * 1024;

/// Stream message limit.
pub const NATS_STREAM_MAX_MESSAGES: i64 = 1_000_000;

/// Idle timeout of the NATS request plane.
pub const NATS_REQUEST_IDLE_TIMEOUT: Duration = Duration::from_secs(900);

/// A ZMQ message that is not `(topic, sequence, payload)`.
#[derive(Debug, Error, PartialEq)]
pub enum ParseZmqFrameError {
    /// Wrong number of frames.
    #[error("KV event message has {0} frames, expected 3 (topic, sequence, payload)")]
    FrameCount(usize),
    /// The sequence frame is not 8 bytes.
    #[error("KV event sequence frame has {0} bytes, expected 8")]
    SequenceLength(usize),
}

/// A parsed ZMQ KV-event message.
#[derive(Debug, PartialEq)]
pub struct ZmqKvMessage<'a> {
    /// Topic frame.
    pub topic: &'a [u8],
    /// Sequence number (big-endian on the wire; -1 ends a replay).
    pub sequence: i64,
    /// msgpack batch.
    pub payload: &'a [u8],
}

/// Parses `(topic, 8-byte big-endian sequence, payload)` frames. The payload is the
/// last frame.
pub fn parse_zmq_frames<'a>(frames: &[&'a [u8]]) -> Result<ZmqKvMessage<'a>, ParseZmqFrameError> {
    let [topic, seq, payload] = frames else {
        return Err(ParseZmqFrameError::FrameCount(frames.len()));
    };
    let seq: [u8; 8] = (*seq)
        .try_into()
        .map_err(|_| ParseZmqFrameError::SequenceLength(seq.len()))?;
    Ok(ZmqKvMessage {
        topic,
        sequence: i64::from_be_bytes(seq),
        payload,
    })
}

/// Encodes a sequence number as its 8-byte big-endian frame.
pub fn encode_sequence(sequence: i64) -> [u8; 8] {
    sequence.to_be_bytes()
}

/// The ZMQ endpoint data-parallel rank `rank` publishes on: the worker's
/// `kv_events_endpoint` with its port raised by `rank` (SGLang's `offset_endpoint_port`
/// under `--dp-size`; rank 0 is the endpoint itself). `None` when the endpoint has no
/// numeric port to offset.
pub fn build_rank_endpoint(endpoint: &str, rank: u32) -> Option<String> {
    if rank == 0 {
        return Some(endpoint.to_owned());
    }
    let (head, port) = endpoint.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    Some(format!("{head}:{}", port.checked_add(rank)?))
}

/// The subject token of a worker: base64url of its id, no padding.
pub fn build_worker_token(worker_id: &str) -> String {
    URL_SAFE_NO_PAD.encode(worker_id.as_bytes())
}

/// The subject a worker's rank publishes relayed batches on:
/// `infera.kv.events.<tok>.<rank>`.
pub fn build_kv_event_subject(worker_id: &str, dp_rank: u32) -> String {
    format!(
        "{NATS_SUBJECT_PREFIX}.{}.{dp_rank}",
        build_worker_token(worker_id)
    )
}

/// The worker id and rank of a relayed-event subject, or `None` if it is not one.
pub fn parse_kv_event_subject(subject: &str) -> Option<(String, u32)> {
    let rest = subject
        .strip_prefix(NATS_SUBJECT_PREFIX)?
        .strip_prefix('.')?;
    let (tok, rank) = rest.split_once('.')?;
    let id = URL_SAFE_NO_PAD.decode(tok).ok()?;
    Some((String::from_utf8(id).ok()?, rank.parse().ok()?))
}

/// Subject of a worker's NATS request plane: `infera.req.<tok>`.
pub fn build_request_subject(worker_id: &str) -> String {
    format!("infera.req.{}", build_worker_token(worker_id))
}

/// Subject that cancels a worker's in-flight NATS request: `infera.cancel.<tok>`.
pub fn build_cancel_subject(worker_id: &str) -> String {
    format!("infera.cancel.{}", build_worker_token(worker_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_frames() {
        let seq = encode_sequence(258);
        assert_eq!(seq, [0, 0, 0, 0, 0, 0, 1, 2]);
        let msg = parse_zmq_frames(&[b"kv-events", &seq, b"\x90"]).unwrap();
        assert_eq!(msg.sequence, 258);
        assert_eq!(msg.payload, b"\x90");
        let end = parse_zmq_frames(&[b"", &[0xff; 8], b""]).unwrap();
        assert_eq!(end.sequence, REPLAY_END_SEQUENCE);
        assert_eq!(
            parse_zmq_frames(&[b"a"]),
            Err(ParseZmqFrameError::FrameCount(1))
        );
        assert_eq!(
            parse_zmq_frames(&[b"a", b"\x01", b"p"]),
            Err(ParseZmqFrameError::SequenceLength(1))
        );
    }

    #[test]
    fn rank_endpoints_offset_the_port() {
        assert_eq!(
            build_rank_endpoint("tcp://10.0.1.3:40001", 0).as_deref(),
            Some("tcp://10.0.1.3:40001")
        );
        assert_eq!(
            build_rank_endpoint("tcp://10.0.1.3:40001", 3).as_deref(),
            Some("tcp://10.0.1.3:40004")
        );
        assert_eq!(
            build_rank_endpoint("tcp://[fd00::1]:5557", 1).as_deref(),
            Some("tcp://[fd00::1]:5558")
        );
        assert_eq!(build_rank_endpoint("tcp://h", 1), None);
        assert_eq!(build_rank_endpoint("", 1), None);
    }

    #[test]
    fn subjects() {
        // base64url("10.0.0.5:8000") without padding.
        assert_eq!(build_worker_token("10.0.0.5:8000"), "MTAuMC4wLjU6ODAwMA");
        assert_eq!(
            build_kv_event_subject("10.0.0.5:8000", 3),
            "infera.kv.events.MTAuMC4wLjU6ODAwMA.3"
        );
        assert_eq!(
            parse_kv_event_subject("infera.kv.events.MTAuMC4wLjU6ODAwMA.3"),
            Some(("10.0.0.5:8000".to_owned(), 3))
        );
        assert_eq!(parse_kv_event_subject("infera.kv.other.x.1"), None);
        // '>' and '?' bytes make base64's '+' and '/' alphabet show: url-safe uses - and _.
        assert_eq!(build_worker_token("h>?:1"), "aD4_OjE");
        assert_eq!(build_request_subject("h:1"), "infera.req.aDox");
        assert_eq!(build_cancel_subject("h:1"), "infera.cancel.aDox");
    }
}
