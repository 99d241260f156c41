//! A worker's answer as the relay sees it, whichever transport carried it: a status, a
//! content type and a body that arrives in chunks. HTTP responses and NATS reply
//! frames both become one.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use std::pin::Pin;

/// A body arriving chunk by chunk; an error is a broken stream.
pub(crate) type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// A worker's answer, headers received, body not yet read.
pub(crate) struct WorkerResponse {
    /// The worker's status.
    pub status: StatusCode,
    /// Its content type, if it named one.
    pub content_type: Option<HeaderValue>,
    /// The body.
    pub body: BodyStream,
}

impl std::fmt::Debug for WorkerResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerResponse")
            .field("status", &self.status)
            .field("content_type", &self.content_type)
            .finish_non_exhaustive()
    }
}

impl WorkerResponse {
    /// An HTTP response, its body read as it arrives.
    pub(crate) fn from_http(response: reqwest::Response) -> Self {
        let status = response.status();
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        Self {
            status,
            content_type,
            body: Box::pin(
                response
                    .bytes_stream()
                    .map(|r| r.map_err(std::io::Error::other)),
            ),
        }
    }

    /// Whether the body is an SSE stream.
    pub(crate) fn is_sse(&self) -> bool {
        self.content_type
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"))
    }

    /// The whole body.
    pub(crate) async fn bytes(mut self) -> Result<Bytes, std::io::Error> {
        let mut all = bytes::BytesMut::new();
        while let Some(chunk) = self.body.next().await {
            all.extend_from_slice(&chunk?);
        }
        Ok(all.freeze())
    }
}
