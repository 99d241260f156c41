//! The exchange's replies in each body mode, as Envoy 1.40 sends its messages.

use super::*;
use crate::epp::reply::DESTINATION_HEADER;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, HttpTrailers, ProtocolConfiguration, body_mutation::Mutation,
};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

fn headers(path: &str, end: bool) -> Request {
    let kv = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    Request::RequestHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![
                kv(":path", path),
                kv(":method", "POST"),
                kv("X-Request-Id", "r1"),
            ],
        }),
        end_of_stream: end,
        ..Default::default()
    })
}

fn body(bytes: &[u8], end: bool) -> Request {
    Request::RequestBody(HttpBody {
        body: bytes.to_vec(),
        end_of_stream: end,
        ..Default::default()
    })
}

fn first(request: Request, mode: BodySendMode) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: mode as i32,
            response_body_mode: mode as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn next(request: Request) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        ..Default::default()
    }
}

fn pick() -> Pick {
    Pick {
        endpoints: vec!["10.0.0.5:8000".into(), "10.0.0.6:8000".into()],
        worker: "w5".into(),
        prefill: None,
    }
}

fn sent(step: Step) -> Vec<ProcessingResponse> {
    match step {
        Step::Send(r) => r,
        other => panic!("expected replies, got {other:?}"),
    }
}

fn set_headers(reply: &ProcessingResponse) -> Vec<(String, String)> {
    let common = match &reply.response {
        Some(Response::RequestHeaders(h)) => h.response.clone(),
        Some(Response::RequestBody(b)) => b.response.clone(),
        _ => None,
    };
    common
        .and_then(|c| c.header_mutation)
        .map(|m| {
            m.set_headers
                .into_iter()
                .filter_map(|o| o.header)
                .map(|h| (h.key, String::from_utf8_lossy(&h.raw_value).into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn streamed(reply: &ProcessingResponse) -> (Vec<u8>, bool) {
    let b = match &reply.response {
        Some(Response::RequestBody(b) | Response::ResponseBody(b)) => b,
        other => panic!("not a body reply: {other:?}"),
    };
    match b
        .response
        .as_ref()
        .and_then(|c| c.body_mutation.as_ref())
        .and_then(|m| m.mutation.as_ref())
    {
        Some(Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("not streamed: {other:?}"),
    }
}

#[test]
fn full_duplex_holds_the_headers_until_the_body_ends_then_routes_and_hands_the_body_back() {
    let mut x = Exchange::new(1 << 20);
    assert!(
        sent(
            x.receive(first(
                headers("/v1/chat/completions?x=1", false),
                BodySendMode::FullDuplexStreamed
            ))
            .unwrap()
        )
        .is_empty()
    );
    assert!(sent(x.receive(next(body(br#"{"model":"m","#, false))).unwrap()).is_empty());
    // Envoy 1.40 ends an HTTP/1 body with an empty chunk of its own.
    assert!(sent(x.receive(next(body(br#""prompt":"hi"}"#, false))).unwrap()).is_empty());
    let input = match x.receive(next(body(b"", true))).unwrap() {
        Step::Pick(input) => input,
        other => panic!("{other:?}"),
    };
    assert_eq!(input.path, "/v1/chat/completions");
    assert_eq!(input.body, br#"{"model":"m","prompt":"hi"}"#);
    assert_eq!(input.subset, None);
    assert!(
        input
            .headers
            .contains(&("x-request-id".into(), "r1".into()))
    );
    let replies = x.answer(Ok(&pick()));
    assert_eq!(replies.len(), 2);
    assert!(matches!(
        replies[0].response,
        Some(Response::RequestHeaders(_))
    ));
    let set = set_headers(&replies[0]);
    assert_eq!(
        set[0],
        (
            DESTINATION_HEADER.into(),
            "10.0.0.5:8000,10.0.0.6:8000".into()
        )
    );
    assert_eq!(set[1], ("x-worker-instance-id".into(), "w5".into()));
    let meta = replies[0].dynamic_metadata.as_ref().unwrap();
    let lb = match &meta.fields[LB_NAMESPACE].kind {
        Some(Kind::StructValue(s)) => s.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        lb.fields[DESTINATION_HEADER].kind,
        Some(Kind::StringValue("10.0.0.5:8000,10.0.0.6:8000".into()))
    );
    assert_eq!(
        streamed(&replies[1]),
        (br#"{"model":"m","prompt":"hi"}"#.to_vec(), true)
    );
}

#[test]
fn a_large_body_is_handed_back_in_chunks_of_62000_bytes() {
    let mut x = Exchange::new(1 << 20);
    x.receive(first(
        headers("/v1/completions", false),
        BodySendMode::FullDuplexStreamed,
    ))
    .unwrap();
    let big = vec![b'a'; 130_000];
    assert!(matches!(
        x.receive(next(body(&big, true))).unwrap(),
        Step::Pick(_)
    ));
    let replies = x.answer(Ok(&pick()));
    let parts: Vec<(usize, bool)> = replies[1..]
        .iter()
        .map(|r| {
            let (b, end) = streamed(r);
            (b.len(), end)
        })
        .collect();
    assert_eq!(parts, vec![(62_000, false), (62_000, false), (6_000, true)]);
}

#[test]
fn buffered_mode_lets_the_headers_through_and_routes_on_the_body_reply() {
    let mut x = Exchange::new(1 << 20);
    let r = sent(
        x.receive(first(
            headers("/v1/completions", false),
            BodySendMode::Buffered,
        ))
        .unwrap(),
    );
    assert_eq!(r.len(), 1);
    assert!(set_headers(&r[0]).is_empty());
    assert!(matches!(
        x.receive(next(body(b"{}", true))).unwrap(),
        Step::Pick(_)
    ));
    let replies = x.answer(Ok(&pick()));
    assert_eq!(replies.len(), 1);
    assert!(matches!(
        replies[0].response,
        Some(Response::RequestBody(_))
    ));
    assert_eq!(set_headers(&replies[0])[0].1, "10.0.0.5:8000,10.0.0.6:8000");
    assert!(replies[0].dynamic_metadata.is_some());
}

#[test]
fn a_get_and_streamed_mode_are_picked_on_the_headers() {
    let mut x = Exchange::new(1 << 20);
    assert!(matches!(
        x.receive(first(
            headers("/v1/models", true),
            BodySendMode::FullDuplexStreamed
        ))
        .unwrap(),
        Step::Pick(_)
    ));
    let replies = x.answer(Ok(&pick()));
    assert!(matches!(
        replies[0].response,
        Some(Response::RequestHeaders(_))
    ));

    let mut x = Exchange::new(1 << 20);
    assert!(matches!(
        x.receive(first(
            headers("/v1/completions", false),
            BodySendMode::Streamed
        ))
        .unwrap(),
        Step::Pick(_)
    ));
    x.answer(Ok(&pick()));
    let r = sent(x.receive(next(body(b"{}", true))).unwrap());
    assert!(matches!(&r[0].response, Some(Response::RequestBody(b)) if b.response.is_none()));
}

#[test]
fn a_refusal_is_an_immediate_response_with_the_status_and_error_json() {
    let mut x = Exchange::new(1 << 20);
    x.receive(first(
        headers("/v1/completions", false),
        BodySendMode::FullDuplexStreamed,
    ))
    .unwrap();
    x.receive(next(body(b"{}", true))).unwrap();
    let refusal = Refusal::of(&infera_proto::error_class::ApiError::new(
        infera_proto::error_class::ErrorClass::ServiceUnavailable,
        "no worker is available",
    ));
    let replies = x.answer(Err(&refusal));
    let Some(Response::ImmediateResponse(i)) = &replies[0].response else {
        panic!()
    };
    assert_eq!(i.status.as_ref().unwrap().code, 503);
    let json: serde_json::Value = serde_json::from_slice(&i.body).unwrap();
    assert_eq!(json["error"]["message"], "no worker is available");
}

#[test]
fn a_body_over_the_limit_is_refused_with_413() {
    let mut x = Exchange::new(10);
    x.receive(first(
        headers("/v1/completions", false),
        BodySendMode::FullDuplexStreamed,
    ))
    .unwrap();
    let r = sent(x.receive(next(body(&[b'a'; 11], false))).unwrap());
    let Some(Response::ImmediateResponse(i)) = &r[0].response else {
        panic!()
    };
    assert_eq!(i.status.as_ref().unwrap().code, 413);
}

#[test]
fn the_subset_hint_and_the_served_endpoint_are_read_from_metadata() {
    let s = |v: &str| Value {
        kind: Some(Kind::StringValue(v.into())),
    };
    let ns = |k: &str, v: Value| Struct {
        fields: [(k.to_owned(), v)].into(),
    };
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: vec![s("10.0.0.5:8000"), s("10.0.0.6")],
        })),
    };
    let mut message = first(
        headers("/v1/completions", true),
        BodySendMode::FullDuplexStreamed,
    );
    message.metadata_context = Some(Metadata {
        filter_metadata: [(SUBSET_NAMESPACE.to_owned(), ns(SUBSET_KEY, list))].into(),
        ..Default::default()
    });
    let mut x = Exchange::new(1 << 20);
    let Step::Pick(input) = x.receive(message).unwrap() else {
        panic!()
    };
    assert_eq!(
        input.subset,
        Some(vec!["10.0.0.5:8000".into(), "10.0.0.6".into()])
    );
    x.answer(Ok(&pick()));

    let mut response = next(Request::ResponseHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![HeaderValue {
                key: ":status".into(),
                raw_value: b"200".to_vec(),
                ..Default::default()
            }],
        }),
        ..Default::default()
    }));
    response.metadata_context = Some(Metadata {
        filter_metadata: [(LB_NAMESPACE.to_owned(), ns(SERVED_KEY, s("10.0.0.6:8000")))].into(),
        ..Default::default()
    });
    match x.receive(response).unwrap() {
        Step::Responded {
            replies,
            served,
            status,
        } => {
            assert_eq!(served.as_deref(), Some("10.0.0.6:8000"));
            assert_eq!(status, Some(200));
            assert!(matches!(
                replies[0].response,
                Some(Response::ResponseHeaders(_))
            ));
        }
        other => panic!("{other:?}"),
    }
    // Full duplex: response chunks are echoed as they come.
    let r = sent(
        x.receive(next(Request::ResponseBody(HttpBody {
            body: b"data: x\n\n".to_vec(),
            ..Default::default()
        })))
        .unwrap(),
    );
    assert_eq!(streamed(&r[0]), (b"data: x\n\n".to_vec(), false));
    let r = sent(
        x.receive(next(Request::ResponseTrailers(HttpTrailers::default())))
            .unwrap(),
    );
    assert!(matches!(r[0].response, Some(Response::ResponseTrailers(_))));
}

#[test]
fn request_trailers_end_a_full_duplex_body() {
    let mut x = Exchange::new(1 << 20);
    x.receive(first(
        headers("/v1/completions", false),
        BodySendMode::FullDuplexStreamed,
    ))
    .unwrap();
    x.receive(next(body(b"{}", false))).unwrap();
    assert!(matches!(
        x.receive(next(Request::RequestTrailers(HttpTrailers::default())))
            .unwrap(),
        Step::Pick(_)
    ));
    let replies = x.answer(Ok(&pick()));
    assert_eq!(replies.len(), 3);
    assert_eq!(streamed(&replies[1]), (b"{}".to_vec(), false));
    assert!(matches!(
        replies[2].response,
        Some(Response::RequestTrailers(_))
    ));
}

#[test]
fn headers_twice_is_out_of_order() {
    let mut x = Exchange::new(1 << 20);
    x.receive(first(
        headers("/v1/completions", false),
        BodySendMode::FullDuplexStreamed,
    ))
    .unwrap();
    x.receive(next(body(b"{}", true))).unwrap();
    x.answer(Ok(&pick()));
    assert!(x.receive(next(headers("/v1/completions", false))).is_err());
}
