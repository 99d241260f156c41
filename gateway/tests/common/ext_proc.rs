//! A Rust ext_proc client driving the endpoint picker as Envoy would: one full-duplex
//! exchange, and the headers its replies set.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{Struct, Value as PbValue, value::Kind};
use serde_json::Value;

pub fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        raw_value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub fn set_header(reply: &ProcessingResponse, key: &str) -> Option<String> {
    let Some(Reply::RequestHeaders(h)) = &reply.response else {
        return None;
    };
    h.response
        .as_ref()?
        .header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .find_map(|o| {
            let hv = o.header.as_ref()?;
            (hv.key == key).then(|| String::from_utf8_lossy(&hv.raw_value).into_owned())
        })
}

/// One full-duplex exchange through the picker's gRPC service, as Envoy would run it,
/// with `subset` as the subset hint: the first reply.
pub async fn exchange(port: u16, body: &Value, subset: Option<Vec<&str>>) -> ProcessingResponse {
    let mut client = ExternalProcessorClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    let metadata = subset.map(|s| {
        let list = s
            .iter()
            .map(|e| PbValue {
                kind: Some(Kind::StringValue((*e).into())),
            })
            .collect();
        let inner = Struct {
            fields: [(
                "x-gateway-destination-endpoint-subset".to_owned(),
                PbValue {
                    kind: Some(Kind::ListValue(
                        envoy_types::pb::google::protobuf::ListValue { values: list },
                    )),
                },
            )]
            .into(),
        };
        Metadata {
            filter_metadata: [("envoy.lb.subset_hint".to_owned(), inner)].into(),
            ..Default::default()
        }
    });
    let messages = vec![
        ProcessingRequest {
            request: Some(Message::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![
                        header(":path", "/v1/chat/completions"),
                        header(":method", "POST"),
                    ],
                }),
                end_of_stream: false,
                ..Default::default()
            })),
            metadata_context: metadata,
            protocol_config: Some(ProtocolConfiguration {
                request_body_mode: BodySendMode::FullDuplexStreamed as i32,
                response_body_mode: BodySendMode::FullDuplexStreamed as i32,
                ..Default::default()
            }),
            ..Default::default()
        },
        ProcessingRequest {
            request: Some(Message::RequestBody(HttpBody {
                body: body.to_string().into_bytes(),
                end_of_stream: true,
                ..Default::default()
            })),
            ..Default::default()
        },
    ];
    let mut replies = client
        .process(futures::stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    replies.message().await.unwrap().expect("a reply")
}
