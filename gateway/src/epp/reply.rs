//! The picker's replies to Envoy (pure): the pick as a header mutation and `envoy.lb`
//! dynamic metadata (GAIE's endpoint-picker protocol), the earlier picker's worker-id
//! headers for frontends in direct mode, the body handed back in streamed chunks, and
//! the immediate refusals (503 no endpoint, 429 all full) with OpenAI error JSON.

use crate::route::plan::{PREFILL_PIN_HEADER, WORKER_PIN_HEADER};
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse, body_mutation::Mutation,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use infera_proto::error_class::{ApiError, ErrorClass};

/// The metadata namespace of the pick and of the served endpoint.
pub(crate) const LB_NAMESPACE: &str = "envoy.lb";

/// The header (and `envoy.lb` key) naming the picked endpoints, first choice first.
pub(crate) const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// The largest streamed body chunk handed back to Envoy (GAIE's limit, under Envoy's
/// recommended 64 KiB).
pub(crate) const CHUNK_BYTES: usize = 62_000;

/// A pick: where Envoy sends the request.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Pick {
    /// `ip:port` endpoints, the chosen one first, then fallbacks in order.
    pub endpoints: Vec<String>,
    /// The worker chosen (the decode worker of a pair).
    pub worker: String,
    /// The prefill worker of a pair.
    pub prefill: Option<String>,
}

/// A request refused before it reaches a worker.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error JSON.
    pub body: Vec<u8>,
}

impl Refusal {
    /// The refusal of `error` (its status and OpenAI error JSON).
    pub(crate) fn of(error: &ApiError) -> Self {
        Self {
            status: error.class.status(),
            body: error.to_openai_json().to_string().into_bytes(),
        }
    }

    /// A body over the limit.
    pub(crate) fn too_large(limit: usize) -> Self {
        Self::of(&ApiError::new(
            ErrorClass::PayloadTooLarge,
            format!("request body over the endpoint picker's limit of {limit} bytes"),
        ))
    }
}

fn set(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// The pick's request-header mutation: the destination, and the worker ids a direct-mode
/// frontend dispatches on (a client's own values are overwritten).
fn pick_mutation(pick: &Pick) -> HeaderMutation {
    let mut set_headers = vec![
        set(DESTINATION_HEADER, &pick.endpoints.join(",")),
        set(WORKER_PIN_HEADER, &pick.worker),
    ];
    let mut remove_headers = Vec::new();
    match &pick.prefill {
        Some(p) => set_headers.push(set(PREFILL_PIN_HEADER, p)),
        None => remove_headers.push(PREFILL_PIN_HEADER.to_owned()),
    }
    HeaderMutation {
        set_headers,
        remove_headers,
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": "<ip:port>,..."}}`.
pub(crate) fn pick_metadata(pick: &Pick) -> Struct {
    let string = |s: String| Value {
        kind: Some(Kind::StringValue(s)),
    };
    let inner = Struct {
        fields: [(
            DESTINATION_HEADER.to_owned(),
            string(pick.endpoints.join(",")),
        )]
        .into(),
    };
    Struct {
        fields: [(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    }
}

fn routed(pick: &Pick) -> CommonResponse {
    CommonResponse {
        header_mutation: Some(pick_mutation(pick)),
        clear_route_cache: true,
        ..Default::default()
    }
}

/// The request-headers reply carrying the pick.
pub(crate) fn routed_headers(pick: &Pick) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(routed(pick)),
        })),
        dynamic_metadata: Some(pick_metadata(pick)),
        ..Default::default()
    }
}

/// The reply to a buffered body carrying the pick (Envoy still holds the headers).
pub(crate) fn routed_body(pick: &Pick) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse {
            response: Some(routed(pick)),
        })),
        dynamic_metadata: Some(pick_metadata(pick)),
        ..Default::default()
    }
}

/// Lets the request headers through unchanged.
pub(crate) fn headers_continue() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse::default())),
        ..Default::default()
    }
}

/// Lets a request body chunk through unchanged.
pub(crate) fn body_continue() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse::default())),
        ..Default::default()
    }
}

/// Lets the response headers through unchanged.
pub(crate) fn response_headers_continue() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse::default())),
        ..Default::default()
    }
}

/// Lets a response body chunk through unchanged.
pub(crate) fn response_body_continue() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseBody(BodyResponse::default())),
        ..Default::default()
    }
}

/// Lets trailers through (of the response when `response`).
pub(crate) fn trailers_continue(response: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if response {
            Response::ResponseTrailers(t)
        } else {
            Response::RequestTrailers(t)
        }),
        ..Default::default()
    }
}

/// A body chunk handed back in full-duplex mode (of the response when `response`).
pub(crate) fn streamed_chunk(response: bool, body: Vec<u8>, end: bool) -> ProcessingResponse {
    let reply = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream: end,
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
    };
    ProcessingResponse {
        response: Some(if response {
            Response::ResponseBody(reply)
        } else {
            Response::RequestBody(reply)
        }),
        ..Default::default()
    }
}

/// The request body handed back in chunks of at most [`CHUNK_BYTES`]; the last one ends
/// the stream when `end` (an empty body is one empty chunk).
pub(crate) fn chunks(body: &[u8], end: bool) -> Vec<ProcessingResponse> {
    if body.is_empty() {
        return vec![streamed_chunk(false, Vec::new(), end)];
    }
    let n = body.len().div_ceil(CHUNK_BYTES);
    body.chunks(CHUNK_BYTES)
        .enumerate()
        .map(|(i, c)| streamed_chunk(false, c.to_vec(), end && i + 1 == n))
        .collect()
}

/// Answers the client at once, without a worker.
pub(crate) fn immediate(refusal: &Refusal) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(refusal.status),
            }),
            headers: Some(HeaderMutation {
                set_headers: vec![set("content-type", "application/json")],
                remove_headers: Vec::new(),
            }),
            body: refusal.body.clone(),
            details: "infera_endpoint_picker_refused".into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}
