//! The gateway's closed set of error classes, each with its HTTP status, and their one
//! rendering as OpenAI error JSON (or Anthropic's shape on `/v1/messages`).
//!
//! Every failure the gateway answers is classified once into an [`ErrorClass`]; nothing
//! else renders error bodies, so clients always see the same shapes.

use serde_json::{Value, json};

/// What went wrong, from the client's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Malformed JSON, wrong types, missing or invalid parameters: 400.
    BadRequest,
    /// Missing or wrong bearer token: 401.
    Unauthorized,
    /// No worker serves the requested model: 404.
    ModelNotFound,
    /// No such path: 404.
    UnknownRoute,
    /// The path exists, the method does not: 405.
    MethodNotAllowed,
    /// The body did not arrive within the read timeout: 408.
    RequestTimeout,
    /// Body over the configured limit: 413.
    PayloadTooLarge,
    /// Admission limit reached: 429 with `Retry-After`.
    RateLimited,
    /// A bug or unexpected state in the gateway: 500.
    Internal,
    /// A prefill/decode protocol or feature the router cannot serve: 501.
    NotImplemented,
    /// The worker could not be reached or broke the protocol: 502.
    BadGateway,
    /// No worker available, or a prefill/decode pool missing: 503.
    ServiceUnavailable,
    /// The worker did not answer in time: 504.
    GatewayTimeout,
}

impl ErrorClass {
    /// Every class.
    pub const ALL: [ErrorClass; 13] = [
        Self::BadRequest,
        Self::Unauthorized,
        Self::ModelNotFound,
        Self::UnknownRoute,
        Self::MethodNotAllowed,
        Self::RequestTimeout,
        Self::PayloadTooLarge,
        Self::RateLimited,
        Self::Internal,
        Self::NotImplemented,
        Self::BadGateway,
        Self::ServiceUnavailable,
        Self::GatewayTimeout,
    ];

    /// HTTP status code.
    pub fn status(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::Unauthorized => 401,
            Self::ModelNotFound | Self::UnknownRoute => 404,
            Self::MethodNotAllowed => 405,
            Self::RequestTimeout => 408,
            Self::PayloadTooLarge => 413,
            Self::RateLimited => 429,
            Self::Internal => 500,
            Self::NotImplemented => 501,
            Self::BadGateway => 502,
            Self::ServiceUnavailable => 503,
            Self::GatewayTimeout => 504,
        }
    }

    /// OpenAI `error.type`.
    pub fn openai_type(self) -> &'static str {
        match self {
            Self::BadRequest
            | Self::ModelNotFound
            | Self::UnknownRoute
            | Self::MethodNotAllowed
            | Self::RequestTimeout
            | Self::PayloadTooLarge => "invalid_request_error",
            Self::Unauthorized => "authentication_error",
            Self::RateLimited => "rate_limit_error",
            Self::Internal
            | Self::NotImplemented
            | Self::BadGateway
            | Self::ServiceUnavailable
            | Self::GatewayTimeout => "server_error",
        }
    }

    /// OpenAI `error.code` used when the error names none of its own.
    pub fn default_code(self) -> Option<&'static str> {
        match self {
            Self::BadRequest | Self::UnknownRoute | Self::MethodNotAllowed => None,
            Self::Unauthorized => Some("invalid_api_key"),
            Self::ModelNotFound => Some("model_not_found"),
            Self::RequestTimeout => Some("request_timeout"),
            Self::PayloadTooLarge => Some("request_too_large"),
            Self::RateLimited => Some("rate_limit_exceeded"),
            Self::Internal => Some("internal_error"),
            Self::NotImplemented => Some("not_implemented"),
            Self::BadGateway => Some("worker_unreachable"),
            Self::ServiceUnavailable => Some("no_worker_available"),
            Self::GatewayTimeout => Some("worker_timeout"),
        }
    }

    /// Anthropic `error.type`.
    pub fn anthropic_type(self) -> &'static str {
        match self {
            Self::BadRequest => "invalid_request_error",
            Self::Unauthorized => "authentication_error",
            Self::ModelNotFound | Self::UnknownRoute => "not_found_error",
            Self::MethodNotAllowed | Self::RequestTimeout => "invalid_request_error",
            Self::PayloadTooLarge => "request_too_large",
            Self::RateLimited => "rate_limit_error",
            Self::ServiceUnavailable => "overloaded_error",
            Self::Internal | Self::NotImplemented | Self::BadGateway | Self::GatewayTimeout => {
                "api_error"
            }
        }
    }
}

/// An error as the client will see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// Its class (status and type).
    pub class: ErrorClass,
    /// What happened and, where possible, what to change.
    pub message: String,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code; the class default when `None`.
    pub code: Option<String>,
    /// Seconds a client should wait before retrying (the `Retry-After` header of a 429
    /// or 503); `None`: one second.
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    /// An error of `class` with `message`.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            param: None,
            code: None,
            retry_after_s: None,
        }
    }

    /// Sets the seconds a client should wait before retrying.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds.max(1));
        self
    }

    /// Names the request parameter at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets a specific code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// `{"error": {"message", "type", "param", "code"}}`.
    pub fn to_openai_json(&self) -> Value {
        let code = self.code.as_deref().or(self.class.default_code());
        json!({"error": {
            "message": self.message,
            "type": self.class.openai_type(),
            "param": self.param,
            "code": code,
        }})
    }

    /// `{"type": "error", "error": {"type", "message"}}`.
    pub fn to_anthropic_json(&self) -> Value {
        json!({"type": "error", "error": {
            "type": self.class.anthropic_type(),
            "message": self.message,
        }})
    }

    /// The SSE event sent when a stream fails after its first byte.
    pub fn to_sse_event(&self) -> String {
        format!("data: {}\n\n", self.to_openai_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        let got: Vec<u16> = ErrorClass::ALL.iter().map(|c| c.status()).collect();
        assert_eq!(
            got,
            vec![
                400, 401, 404, 404, 405, 408, 413, 429, 500, 501, 502, 503, 504
            ]
        );
    }

    #[test]
    fn openai_json_exact_bytes() {
        let e = ApiError::new(ErrorClass::BadRequest, "'messages' must not be empty")
            .with_param("messages");
        assert_eq!(
            e.to_openai_json().to_string(),
            r#"{"error":{"message":"'messages' must not be empty","type":"invalid_request_error","param":"messages","code":null}}"#
        );
        let e = ApiError::new(ErrorClass::ModelNotFound, "model 'x' is not served");
        assert_eq!(
            e.to_openai_json().to_string(),
            r#"{"error":{"message":"model 'x' is not served","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#
        );
        let e = ApiError::new(
            ErrorClass::ServiceUnavailable,
            "no decode worker for model m",
        )
        .with_code("missing_decode_pool");
        assert_eq!(
            e.to_openai_json().to_string(),
            r#"{"error":{"message":"no decode worker for model m","type":"server_error","param":null,"code":"missing_decode_pool"}}"#
        );
    }

    #[test]
    fn anthropic_json_exact_bytes() {
        let e = ApiError::new(ErrorClass::BadRequest, "max_tokens: field required");
        assert_eq!(
            e.to_anthropic_json().to_string(),
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: field required"}}"#
        );
        assert_eq!(
            ErrorClass::ServiceUnavailable.anthropic_type(),
            "overloaded_error"
        );
    }

    #[test]
    fn sse_error_event() {
        let e = ApiError::new(ErrorClass::BadGateway, "worker h:1 closed the stream");
        assert_eq!(
            e.to_sse_event(),
            "data: {\"error\":{\"message\":\"worker h:1 closed the stream\",\"type\":\"server_error\",\"param\":null,\"code\":\"worker_unreachable\"}}\n\n"
        );
    }
}
