//! `POST /kvd/prefetch` on the status port: a prefetch hint for the kvd beside this
//! engine, left there as one `prefetch_hint` frame over a short connection to its socket
//! (`--kvd-socket`). Gateways forward their `POST /v1/cache/prewarm` here, since kvd's
//! socket is reachable only from inside the Pod. Callers are authorised as for `/drain`:
//! the Pod's own loopback, or whoever presents the drain token.

use crate::status::{DRAIN_TOKEN_HEADER, drain_allowed};
use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use infera_kvd::client::{PrefetchHint, send_prefetch_hint};
use infera_kvd::wire::Key;
use infera_proto::sidecar::{KVD_PREFETCH_PATH, PrefetchHintRequest};
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The client id kvd sees in the hello (its logs name it).
const CLIENT_ID: &str = "infera-sidecar-prefetch";

/// How long one hint may take: the connect, the handshake and the write.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Prefetch {
    kvd_socket: Option<PathBuf>,
    drain_token: Option<String>,
}

/// The prefetch route: hints go to `kvd_socket` (none: 503), callers outside the
/// loopback present `drain_token`.
pub fn build_prefetch_router(kvd_socket: Option<PathBuf>, drain_token: Option<String>) -> Router {
    Router::new()
        .route(KVD_PREFETCH_PATH, post(prefetch))
        .with_state(Arc::new(Prefetch {
            kvd_socket,
            drain_token,
        }))
}

fn refusal(status: StatusCode, kind: &str, code: &str, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": code}});
    (status, axum::Json(body)).into_response()
}

/// The request's keys as kvd's: hex each, and only 8-byte ones (kvd's keys are 8 bytes,
/// so others can match nothing; the earlier server sent them all). Returns the keys and
/// the count given.
pub fn decode_keys(hex_keys: &[String]) -> Result<Vec<Key>, String> {
    let mut keys = Vec::with_capacity(hex_keys.len());
    for (i, h) in hex_keys.iter().enumerate() {
        let bytes = hex::decode(h).map_err(|e| format!("keys[{i}] is not hex: {e}"))?;
        if let Ok(key) = Key::try_from(bytes.as_slice()) {
            keys.push(key);
        }
    }
    Ok(keys)
}

async fn prefetch(
    State(p): State<Arc<Prefetch>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !drain_allowed(peer.ip(), &headers, p.drain_token.as_deref()) {
        tracing::warn!(
            "refused {KVD_PREFETCH_PATH} from {peer}: not loopback and no valid {DRAIN_TOKEN_HEADER}"
        );
        return refusal(
            StatusCode::FORBIDDEN,
            "permission_error",
            "forbidden",
            format!(
                "{KVD_PREFETCH_PATH} is authorised as /drain: callers outside the Pod send {DRAIN_TOKEN_HEADER}"
            ),
        );
    }
    let request: PrefetchHintRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_body",
                format!("not a prefetch hint: {e}"),
            );
        }
    };
    let keys = match decode_keys(&request.keys) {
        Ok(k) => k,
        Err(message) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_body",
                message,
            );
        }
    };
    let Some(socket) = &p.kvd_socket else {
        return refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "no_kvd",
            "no kvd beside this engine (the sidecar runs without --kvd-socket)".into(),
        );
    };
    let n_keys = keys.len();
    if n_keys > 0 {
        let hint = PrefetchHint {
            keys,
            model: request.model,
            compat_key: request.compat_key,
            deadline_ms: request.deadline_ms,
        };
        if let Err(e) = send_prefetch_hint(socket, CLIENT_ID, &hint, SEND_TIMEOUT).await {
            return refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "kvd_unreachable",
                format!("kvd unreachable: {e}"),
            );
        }
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"accepted": true, "n_keys": n_keys})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::connect_info::MockConnectInfo;
    use axum::http::Request;
    use infera_kvd::client::request_map;
    use infera_kvd::wire::encode_frame;
    use rmpv::Value;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    async fn read_frame(s: &mut tokio::net::UnixStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).await.unwrap();
        [len.to_vec(), body].concat()
    }

    /// A stand-in kvd: answers the hello and hands over the next frame's bytes.
    fn fake_kvd(path: &std::path::Path) -> tokio::sync::oneshot::Receiver<Vec<u8>> {
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_frame(&mut s).await;
            let ack = request_map(
                "hello_ack",
                vec![
                    ("server_id", Value::from("fixture-kvd")),
                    ("protocol_version", Value::from(1)),
                    ("shared_arena", Value::Nil),
                ],
            );
            s.write_all(&encode_frame(&ack)).await.unwrap();
            let _ = tx.send(read_frame(&mut s).await);
        });
        rx
    }

    async fn post(router: &Router, peer: &str, token: Option<&str>, body: &str) -> (u16, String) {
        let mut request =
            Request::post(KVD_PREFETCH_PATH).header("content-type", "application/json");
        if let Some(t) = token {
            request = request.header(DRAIN_TOKEN_HEADER, t);
        }
        let response = router
            .clone()
            .layer(MockConnectInfo(peer.parse::<SocketAddr>().unwrap()))
            .oneshot(request.body(Body::from(body.to_owned())).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn a_hint_reaches_kvd_as_its_frame_and_callers_are_authorised_as_for_drain() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kvd.sock");
        let frame = fake_kvd(&socket);
        let router = build_prefetch_router(Some(socket), Some("fixture-token".into()));
        let hint = r#"{"keys": ["0001020304050607", "08090a0b0c0d0e0f", "0a0b"],
            "model": "llama-3-8b", "compat_key": "fp16-tp1", "deadline_ms": 250}"#;
        assert_eq!(
            post(&router, "10.0.0.9:4000", None, hint).await.0,
            403,
            "from outside the Pod without the token"
        );
        assert_eq!(
            post(&router, "10.0.0.9:4000", Some("fixture-token"), hint).await,
            (202, r#"{"accepted":true,"n_keys":2}"#.to_owned())
        );
        // kvd/testdata/frames.json, "prefetch_hint", byte for byte.
        assert_eq!(
            hex::encode(frame.await.unwrap()),
            "0000005f85a26f70ad70726566657463685f68696e74a46b65797392c4080001020304050607c40808090a0b0c0d0e0fa56d6f64656caa6c6c616d612d332d3862aa636f6d7061745f6b6579a8667031362d747031ab646561646c696e655f6d73ccfa"
        );
        let (status, body) = post(&router, "127.0.0.1:4000", None, hint).await;
        assert_eq!(status, 503, "kvd went away: {body}");
        assert!(
            body.contains("kvd unreachable: could not connect to kvd at"),
            "{body}"
        );
        let none = build_prefetch_router(None, None);
        let (status, body) = post(&none, "127.0.0.1:4000", None, hint).await;
        assert_eq!(status, 503);
        assert!(body.contains("without --kvd-socket"), "{body}");
        assert_eq!(post(&none, "127.0.0.1:4000", None, "[1]").await.0, 400);
    }

    #[test]
    fn keys_are_hex_and_only_kvds_length_is_sent() {
        let keys = decode_keys(&["00112233aabbccdd".into(), "0011".into()]).unwrap();
        assert_eq!(keys, vec![[0x00, 0x11, 0x22, 0x33, 0xaa, 0xbb, 0xcc, 0xdd]]);
        assert!(decode_keys(&["zz".into()]).unwrap_err().contains("keys[0]"));
    }
}
