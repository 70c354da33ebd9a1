//! Refusals: an HTTP status with a JSON-RPC error body whose `error.data.reason` says why.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, Message, RequestId, code};
use tether_core::lineage::InvalidReason;

/// A request the server will not serve, and how to say so.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub status: StatusCode,
    pub error: ErrorObject,
    pub id: Option<RequestId>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Rejection {
    pub fn new(status: StatusCode, code: i64, reason: &str, message: impl Into<String>) -> Rejection {
        Rejection { status, error: ErrorObject::with_reason(code, message, reason), id: None, headers: Vec::new() }
    }

    /// 400 with -32600 (invalid request).
    pub fn bad_request(reason: &str, message: impl Into<String>) -> Rejection {
        Rejection::new(StatusCode::BAD_REQUEST, code::INVALID_REQUEST, reason, message)
    }

    /// 404: the session cannot be used, with the reason.
    pub fn session_invalid(reason: InvalidReason) -> Rejection {
        let message = match reason {
            InvalidReason::UnknownSession => "session not found",
            InvalidReason::Terminated => "session was terminated",
            InvalidReason::Expired => "session expired",
            InvalidReason::IncarnationMismatch => "the cursor belongs to another incarnation of this session",
        };
        Rejection::new(StatusCode::NOT_FOUND, -32001, reason.as_str(), message)
    }

    /// 500: something on the server's side failed; nothing the client sent was wrong.
    pub fn internal(reason: &str, message: impl Into<String>) -> Rejection {
        Rejection::new(StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL_ERROR, reason, message)
    }

    /// 405 with the allowed methods.
    pub fn method_not_allowed(allow: &'static str) -> Rejection {
        Rejection::new(
            StatusCode::METHOD_NOT_ALLOWED,
            code::INVALID_REQUEST,
            "method_not_allowed",
            "method not allowed",
        )
        .with_header(http::header::ALLOW, HeaderValue::from_static(allow))
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Rejection {
        self.headers.push((name, value));
        self
    }

    pub fn with_id(mut self, id: Option<RequestId>) -> Rejection {
        self.id = id;
        self
    }

    pub fn with_data(mut self, key: &str, value: Value) -> Rejection {
        if let Some(Value::Object(data)) = &mut self.error.data {
            data.insert(key.to_owned(), value);
        }
        self
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let body = Message::Response(tether_core::jsonrpc::Response::error(self.id, self.error)).to_vec();
        let mut response =
            (self.status, [(CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response();
        response.headers_mut().extend(self.headers);
        response
    }
}

/// A JSON-RPC error for a request that was well formed but cannot be served.
pub(crate) fn rpc_error(code: i64, reason: &str, message: impl Into<String>) -> ErrorObject {
    ErrorObject { code, message: message.into(), data: Some(json!({ "reason": reason })) }
}
