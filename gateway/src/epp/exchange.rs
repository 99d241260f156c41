//! One ext_proc stream, which is one HTTP exchange, as a state machine with no I/O:
//! Envoy's messages go in, the replies to send and the moment to pick come out.
//!
//! How the request is answered depends on the body mode Envoy announces in its first
//! message (`protocol_config`):
//!
//! - `FULL_DUPLEX_STREAMED` (what GAIE gateways configure): the headers reply is held
//!   until the body's end, then sent with the pick (header and `envoy.lb` metadata),
//!   followed by the body handed back as streamed chunks of at most 62000 bytes;
//! - `BUFFERED`: the headers are let through at once and the pick rides on the reply to
//!   the one body message (Envoy still holds the headers then);
//! - `STREAMED` or no body mode: the body cannot wait, so the pick is made on the
//!   headers alone (no prefix affinity) and each body chunk is let through;
//! - a request whose headers end the stream (a GET) is picked on its headers.
//!
//! Response messages are let through (echoed as streamed chunks in full-duplex mode);
//! the endpoint Envoy reports as the one that served (`envoy.lb`
//! `x-gateway-destination-endpoint-served`) and the response status are handed out.

use crate::epp::reply::{
    LB_NAMESPACE, Pick, Refusal, body_continue, chunks, headers_continue, immediate,
    response_body_continue, response_headers_continue, routed_body, routed_headers, streamed_chunk,
    trailers_continue,
};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use envoy_types::pb::google::protobuf::value::Kind;

/// GAIE's namespace of the subset hint.
pub(crate) const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The subset hint's key: the endpoints the pick must come from.
pub(crate) const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The endpoint that served, as Envoy's `override_host` reports it.
pub(crate) const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";

/// How Envoy sends the request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyMode {
    /// Not sent, or sent in chunks that cannot wait (`NONE`, `STREAMED`, `GRPC`).
    Passing,
    /// One message with the whole body (`BUFFERED`, `BUFFERED_PARTIAL`).
    Buffered,
    /// Chunks the picker holds and hands back (`FULL_DUPLEX_STREAMED`).
    FullDuplex,
}

impl BodyMode {
    fn from_envoy(mode: i32) -> Self {
        match BodySendMode::try_from(mode) {
            Ok(BodySendMode::Buffered | BodySendMode::BufferedPartial) => Self::Buffered,
            Ok(BodySendMode::FullDuplexStreamed) => Self::FullDuplex,
            _ => Self::Passing,
        }
    }
}

/// What the request looked like when the pick is due.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PickInput {
    /// `:path`, without its query.
    pub path: String,
    /// The request body (empty for a GET).
    pub body: Vec<u8>,
    /// The subset hint: endpoints (`ip:port`, or a bare `ip` for every port of it) the
    /// pick must come from; `None` when Envoy sent none.
    pub subset: Option<Vec<String>>,
    /// Request headers (lower-case names).
    pub headers: Vec<(String, String)>,
}

/// What to do after a message.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Send these replies (none: wait for the next message).
    Send(Vec<ProcessingResponse>),
    /// Pick now, then call [`Exchange::answer`] with the result.
    Pick(PickInput),
    /// The response started: these replies, and what Envoy said of it.
    Responded {
        /// Replies to send.
        replies: Vec<ProcessingResponse>,
        /// The endpoint that served, when Envoy reports it.
        served: Option<String>,
        /// The response's `:status`.
        status: Option<u16>,
    },
}

/// Why an exchange cannot go on.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum ExchangeError {
    /// A message that has no place here.
    #[error("ext_proc message out of order: {0}")]
    OutOfOrder(&'static str),
}

/// Where a pick is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// On the request headers (no body, or a body that cannot wait).
    Headers,
    /// On the body's last chunk (full duplex: headers held).
    FullDuplexBody,
    /// On the one buffered body message.
    BufferedBody,
    /// On request trailers that ended a full-duplex body.
    Trailers,
}

/// The state of one exchange.
#[derive(Debug)]
pub(crate) struct Exchange {
    mode: BodyMode,
    response_mode: BodyMode,
    max_body: usize,
    input: PickInput,
    due: Option<Due>,
    picked: bool,
}

impl Exchange {
    /// A new exchange; bodies over `max_body` bytes are refused with 413.
    pub(crate) fn new(max_body: usize) -> Self {
        Self {
            mode: BodyMode::Passing,
            response_mode: BodyMode::Passing,
            max_body,
            input: PickInput::default(),
            due: None,
            picked: false,
        }
    }

    /// Takes Envoy's next message.
    pub(crate) fn receive(&mut self, message: ProcessingRequest) -> Result<Step, ExchangeError> {
        if let Some(config) = &message.protocol_config {
            self.mode = BodyMode::from_envoy(config.request_body_mode);
            self.response_mode = BodyMode::from_envoy(config.response_body_mode);
        }
        let metadata = message.metadata_context.as_ref();
        match message.request {
            Some(Request::RequestHeaders(h)) => {
                if self.picked || self.due.is_some() {
                    return Err(ExchangeError::OutOfOrder("request headers twice"));
                }
                self.input.headers = header_pairs(h.headers.as_ref());
                self.input.path = self
                    .header(":path")
                    .map(|p| p.split('?').next().unwrap_or_default().to_owned())
                    .unwrap_or_default();
                self.input.subset = metadata.and_then(subset_hint);
                if h.end_of_stream || self.mode == BodyMode::Passing {
                    return Ok(self.due(Due::Headers));
                }
                if self.mode == BodyMode::Buffered {
                    return Ok(Step::Send(vec![headers_continue()]));
                }
                Ok(Step::Send(Vec::new()))
            }
            Some(Request::RequestBody(b)) => {
                if self.picked {
                    // Passing mode: the pick was made on the headers.
                    return Ok(Step::Send(vec![if self.mode == BodyMode::FullDuplex {
                        streamed_chunk(false, b.body, b.end_of_stream)
                    } else {
                        body_continue()
                    }]));
                }
                if self.input.body.len() + b.body.len() > self.max_body {
                    self.picked = true;
                    return Ok(Step::Send(vec![immediate(&Refusal::too_large(
                        self.max_body,
                    ))]));
                }
                self.input.body.extend_from_slice(&b.body);
                match (self.mode, b.end_of_stream) {
                    (BodyMode::Buffered, _) => Ok(self.due(Due::BufferedBody)),
                    (BodyMode::FullDuplex, true) => Ok(self.due(Due::FullDuplexBody)),
                    _ => Ok(Step::Send(Vec::new())),
                }
            }
            Some(Request::RequestTrailers(_)) => {
                if self.picked {
                    return Ok(Step::Send(vec![trailers_continue(false)]));
                }
                Ok(self.due(Due::Trailers))
            }
            Some(Request::ResponseHeaders(h)) => {
                let headers = header_pairs(h.headers.as_ref());
                let status = headers
                    .iter()
                    .find(|(k, _)| k == ":status")
                    .and_then(|(_, v)| v.parse().ok());
                Ok(Step::Responded {
                    replies: vec![response_headers_continue()],
                    served: metadata.and_then(served_endpoint),
                    status,
                })
            }
            Some(Request::ResponseBody(b)) => Ok(Step::Send(vec![if self.response_mode
                == BodyMode::FullDuplex
            {
                streamed_chunk(true, b.body, b.end_of_stream)
            } else {
                response_body_continue()
            }])),
            Some(Request::ResponseTrailers(_)) => Ok(Step::Send(vec![trailers_continue(true)])),
            None => Err(ExchangeError::OutOfOrder("a message with no request")),
        }
    }

    fn due(&mut self, due: Due) -> Step {
        self.due = Some(due);
        Step::Pick(PickInput {
            path: self.input.path.clone(),
            body: self.input.body.clone(),
            subset: self.input.subset.clone(),
            headers: self.input.headers.clone(),
        })
    }

    /// The replies for the pick (or the refusal) that [`Step::Pick`] asked for.
    pub(crate) fn answer(&mut self, pick: Result<&Pick, &Refusal>) -> Vec<ProcessingResponse> {
        let Some(due) = self.due.take() else {
            return Vec::new();
        };
        self.picked = true;
        let pick = match pick {
            Ok(p) => p,
            Err(refusal) => return vec![immediate(refusal)],
        };
        let body = std::mem::take(&mut self.input.body);
        match due {
            Due::Headers => vec![routed_headers(pick)],
            Due::BufferedBody => vec![routed_body(pick)],
            Due::FullDuplexBody => {
                let mut replies = vec![routed_headers(pick)];
                replies.extend(chunks(&body, true));
                replies
            }
            Due::Trailers => {
                let mut replies = vec![routed_headers(pick)];
                if !body.is_empty() {
                    replies.extend(chunks(&body, false));
                }
                replies.push(trailers_continue(false));
                replies
            }
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.input
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Header names and values (`raw_value`, else `value`), names lower-cased.
fn header_pairs(map: Option<&HeaderMap>) -> Vec<(String, String)> {
    map.map(|m| {
        m.headers
            .iter()
            .map(|h| {
                let value = if h.raw_value.is_empty() {
                    h.value.clone()
                } else {
                    String::from_utf8_lossy(&h.raw_value).into_owned()
                };
                (h.key.to_ascii_lowercase(), value)
            })
            .collect()
    })
    .unwrap_or_default()
}

/// A string, or each string of a list, of `namespace`/`key` in `metadata`, split on
/// commas and trimmed.
fn metadata_strings(metadata: &Metadata, namespace: &str, key: &str) -> Option<Vec<String>> {
    let value = metadata.filter_metadata.get(namespace)?.fields.get(key)?;
    let mut out = Vec::new();
    let mut push = |s: &str| {
        out.extend(
            s.split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned),
        );
    };
    match &value.kind {
        Some(Kind::StringValue(s)) => push(s),
        Some(Kind::ListValue(list)) => {
            for v in &list.values {
                if let Some(Kind::StringValue(s)) = &v.kind {
                    push(s);
                }
            }
        }
        _ => {}
    }
    Some(out)
}

/// The subset hint: present (possibly empty) when Envoy sent the key.
fn subset_hint(metadata: &Metadata) -> Option<Vec<String>> {
    metadata_strings(metadata, SUBSET_NAMESPACE, SUBSET_KEY)
}

/// The endpoint that served (the first, when Envoy lists several).
fn served_endpoint(metadata: &Metadata) -> Option<String> {
    metadata_strings(metadata, LB_NAMESPACE, SERVED_KEY)?
        .into_iter()
        .next()
}

#[cfg(test)]
#[path = "exchange_tests.rs"]
mod tests;
