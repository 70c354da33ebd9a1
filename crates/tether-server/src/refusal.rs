//! The catalogue of every error tether answers on its own: a refusal of a request (an HTTP
//! status with a JSON-RPC error body), or an error answered in a response (a request that could
//! not end as its handler would have it). Each is named once, with its status, JSON-RPC code and
//! `error.data.reason`; nothing else in the server makes an error with a reason. (What a handler
//! answers is the handler's.)

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use serde_json::Value;
use tether_core::input_required::InputError;
use tether_core::jsonrpc::{ErrorObject, Message, RequestId, code};
use tether_core::lineage::InvalidReason;
use tether_store::StoreError;

/// Every refusal of the transport and every error it answers a request with on its own, named
/// once: its HTTP status, JSON-RPC code and `data.reason` are fixed here, and the table of
/// errors in docs/PROTOCOL.md is tested against this list. (What a handler answers is the
/// handler's.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The body is not JSON.
    ParseError,
    /// The body is not a valid JSON-RPC message.
    InvalidMessage,
    /// A batch outside a 2025-03-26 session.
    BatchNotAllowed,
    /// `initialize` inside a batch.
    InitializeInBatch,
    /// A request of a session without `Mcp-Session-Id`.
    MissingSessionId,
    /// The session cannot be used, and why (404).
    SessionInvalid(InvalidReason),
    /// A `Last-Event-ID` that is not an event id of this server.
    MalformedCursor,
    /// An `MCP-Protocol-Version` this server does not speak.
    UnsupportedProtocolVersion,
    /// `Accept` lacks a type the response needs.
    NotAcceptable,
    /// `Content-Type` is not JSON.
    UnsupportedMediaType,
    /// The body is over the configured size.
    BodyTooLarge,
    /// The body took longer than the body timeout to arrive.
    BodyTimeout,
    /// The client broke the body off.
    BodyUnreadable,
    /// An `Origin` the server does not allow.
    OriginNotAllowed,
    /// A `Host` other than loopback while the server is bound to loopback.
    HostNotAllowed,
    /// Missing or wrong credentials.
    Unauthorized,
    /// A token without a scope the tool it calls requires.
    InsufficientScope,
    /// The authorization server's keys, needed to verify a token, could not be fetched.
    KeysUnavailable,
    /// As many sessions as allowed are live.
    TooManySessions,
    /// As many connections as allowed are open.
    TooManyConnections,
    /// A session has as many open streams and running requests as allowed.
    TooManyStreams,
    /// As many tasks as allowed run already, in all or of the principal.
    TooManyTasks,
    /// A second plain GET while the standalone stream is attached.
    GetStreamAttached,
    /// The store failed (logged).
    StoreUnavailable,
    /// The handler is not ready yet: a gateway still reaching its upstream.
    NotReady,
    /// The server is draining before it stops: it starts no new session or 2026-07-28 request.
    Draining,
    /// A response sent in 2026-07-28, which has no server requests.
    ResponseNotAllowed,
    /// 2026-07-28: a request without a required `_meta` field.
    MissingMeta,
    /// 2026-07-28: a header that disagrees with the body.
    HeaderMismatch,
    /// 2026-07-28: a method the server does not serve.
    MethodNotFound,
    /// 2026-07-28: `inputResponses` that are not an object of objects (SEP-2322).
    InvalidInputResponses,
    /// 2026-07-28: a `requestState` this server did not issue for this request (SEP-2322).
    InvalidRequestState,
    /// Answered in the response (status 200), not by refusing it.
    RequestIdReused,
    /// Answered in the response.
    RequestHistoryExpired,
    /// Answered in the response in sessions; 400 in 2026-07-28.
    InvalidIdempotencyKey,
    /// Answered in the response.
    IdempotencyKeyReused,
    /// Answered in the response.
    RequestAborted,
    /// Answered in the response.
    RequestCancelled,
    /// Answered in the response: the idempotency records no longer hold the key's claim they
    /// acknowledged; nothing runs.
    RecordsRegressed,
    /// A method the endpoint does not serve (405 with `Allow`).
    MethodNotAllowed,
    /// The OS random source failed while minting an id (500).
    RandomFailed,
    /// A request could not be started (500).
    StartFailed,
    /// The store failed in a way that is not the backend's (500).
    StoreError,
    /// The resume decision and the session's record disagree (500).
    DecisionInconsistent,
    /// Answered in the response: the handler panicked.
    HandlerPanicked,
    /// Answered in the response: the store failed while the request's outcome was read or
    /// written.
    StoreFailed,
    /// Answered in the response: an operation of the request's context failed.
    ContextFailed,
    /// Answered in the response: the handler's input-required result is not one (no requests,
    /// too many rounds, or a method that may not ask).
    InputRequiredInvalid,
    /// Answered in the response: asking the client for input failed.
    InputFailed,
    /// Answered in the response: the record of an idempotency key was forgotten while its
    /// request ran.
    IdempotencyRecordLost,
    /// Answered in the response: `logging/setLevel` without a log level.
    InvalidLogLevel,
    /// Answered in the response: `tools/call` of a tool the [`ToolSet`](crate::tools::ToolSet)
    /// lacks.
    UnknownTool,
    /// Answered in the response: a tool's arguments do not match its schema.
    InvalidArguments,
    /// Answered in the response: malformed params of a task method.
    InvalidTaskParams,
    /// Answered in the response: a task id no task of the principal has.
    UnknownTask,
    /// Answered in the response: a `tasks/stream` cursor past the task's events.
    CursorAhead,
    /// Answered in the response: the upstream behind a gateway could not be started or reached.
    UpstreamUnavailable,
    /// Answered to the upstream: a request it sent before it was initialized.
    UpstreamNotInitialized,
    /// Answered to the upstream: its request to the client failed.
    ClientRequestFailed,
    /// Answered to the upstream: a request to the client outside any request, which no stream
    /// could carry.
    NoStream,
}

impl Refusal {
    /// Every refusal.
    pub const ALL: [Refusal; 65] = [
        Refusal::ParseError,
        Refusal::InvalidMessage,
        Refusal::BatchNotAllowed,
        Refusal::InitializeInBatch,
        Refusal::MissingSessionId,
        Refusal::SessionInvalid(InvalidReason::UnknownSession),
        Refusal::SessionInvalid(InvalidReason::Terminated),
        Refusal::SessionInvalid(InvalidReason::Expired),
        Refusal::SessionInvalid(InvalidReason::UpstreamLost),
        Refusal::SessionInvalid(InvalidReason::IncarnationMismatch),
        Refusal::SessionInvalid(InvalidReason::HistoryRewritten),
        Refusal::MalformedCursor,
        Refusal::UnsupportedProtocolVersion,
        Refusal::NotAcceptable,
        Refusal::UnsupportedMediaType,
        Refusal::BodyTooLarge,
        Refusal::BodyTimeout,
        Refusal::BodyUnreadable,
        Refusal::OriginNotAllowed,
        Refusal::HostNotAllowed,
        Refusal::Unauthorized,
        Refusal::InsufficientScope,
        Refusal::KeysUnavailable,
        Refusal::TooManySessions,
        Refusal::TooManyConnections,
        Refusal::TooManyStreams,
        Refusal::TooManyTasks,
        Refusal::GetStreamAttached,
        Refusal::StoreUnavailable,
        Refusal::NotReady,
        Refusal::Draining,
        Refusal::ResponseNotAllowed,
        Refusal::MissingMeta,
        Refusal::HeaderMismatch,
        Refusal::MethodNotFound,
        Refusal::InvalidInputResponses,
        Refusal::InvalidRequestState,
        Refusal::RequestIdReused,
        Refusal::RequestHistoryExpired,
        Refusal::InvalidIdempotencyKey,
        Refusal::IdempotencyKeyReused,
        Refusal::RequestAborted,
        Refusal::RequestCancelled,
        Refusal::RecordsRegressed,
        Refusal::MethodNotAllowed,
        Refusal::RandomFailed,
        Refusal::StartFailed,
        Refusal::StoreError,
        Refusal::DecisionInconsistent,
        Refusal::HandlerPanicked,
        Refusal::StoreFailed,
        Refusal::ContextFailed,
        Refusal::InputRequiredInvalid,
        Refusal::InputFailed,
        Refusal::IdempotencyRecordLost,
        Refusal::InvalidLogLevel,
        Refusal::UnknownTool,
        Refusal::InvalidArguments,
        Refusal::InvalidTaskParams,
        Refusal::UnknownTask,
        Refusal::CursorAhead,
        Refusal::UpstreamUnavailable,
        Refusal::UpstreamNotInitialized,
        Refusal::ClientRequestFailed,
        Refusal::NoStream,
    ];

    /// The HTTP status it is answered with (200 for the errors answered in the response).
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::ParseError
            | Refusal::InvalidMessage
            | Refusal::BatchNotAllowed
            | Refusal::InitializeInBatch
            | Refusal::MissingSessionId
            | Refusal::MalformedCursor
            | Refusal::UnsupportedProtocolVersion
            | Refusal::BodyUnreadable
            | Refusal::ResponseNotAllowed
            | Refusal::MissingMeta
            | Refusal::InvalidInputResponses
            | Refusal::InvalidRequestState
            | Refusal::HeaderMismatch => StatusCode::BAD_REQUEST,
            Refusal::MethodNotFound => StatusCode::NOT_FOUND,
            Refusal::SessionInvalid(_) => StatusCode::NOT_FOUND,
            Refusal::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            Refusal::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Refusal::OriginNotAllowed | Refusal::HostNotAllowed | Refusal::InsufficientScope => StatusCode::FORBIDDEN,
            Refusal::Unauthorized => StatusCode::UNAUTHORIZED,
            Refusal::TooManySessions
            | Refusal::TooManyConnections
            | Refusal::StoreUnavailable
            | Refusal::KeysUnavailable
            | Refusal::NotReady
            | Refusal::Draining => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::TooManyStreams | Refusal::TooManyTasks => StatusCode::TOO_MANY_REQUESTS,
            Refusal::GetStreamAttached => StatusCode::CONFLICT,
            Refusal::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::RandomFailed | Refusal::StartFailed | Refusal::StoreError | Refusal::DecisionInconsistent => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Refusal::RequestIdReused
            | Refusal::RequestHistoryExpired
            | Refusal::InvalidIdempotencyKey
            | Refusal::IdempotencyKeyReused
            | Refusal::RequestAborted
            | Refusal::RequestCancelled
            | Refusal::RecordsRegressed
            | Refusal::HandlerPanicked
            | Refusal::StoreFailed
            | Refusal::ContextFailed
            | Refusal::InputRequiredInvalid
            | Refusal::InputFailed
            | Refusal::IdempotencyRecordLost
            | Refusal::InvalidLogLevel
            | Refusal::UnknownTool
            | Refusal::InvalidArguments
            | Refusal::InvalidTaskParams
            | Refusal::UnknownTask
            | Refusal::CursorAhead
            | Refusal::UpstreamUnavailable
            | Refusal::UpstreamNotInitialized
            | Refusal::ClientRequestFailed
            | Refusal::NoStream => StatusCode::OK,
        }
    }

    /// The JSON-RPC error code.
    pub fn code(self) -> i64 {
        match self {
            Refusal::ParseError => code::PARSE_ERROR,
            Refusal::InvalidMessage
            | Refusal::BatchNotAllowed
            | Refusal::InitializeInBatch
            | Refusal::MissingSessionId
            | Refusal::MalformedCursor
            | Refusal::BodyUnreadable
            | Refusal::ResponseNotAllowed
            | Refusal::RequestIdReused
            | Refusal::RequestHistoryExpired
            | Refusal::MethodNotAllowed => code::INVALID_REQUEST,
            Refusal::RandomFailed
            | Refusal::StartFailed
            | Refusal::StoreError
            | Refusal::DecisionInconsistent
            | Refusal::HandlerPanicked
            | Refusal::StoreFailed
            | Refusal::ContextFailed
            | Refusal::InputRequiredInvalid
            | Refusal::InputFailed
            | Refusal::IdempotencyRecordLost
            | Refusal::UpstreamUnavailable
            | Refusal::UpstreamNotInitialized
            | Refusal::ClientRequestFailed
            | Refusal::NoStream => code::INTERNAL_ERROR,
            Refusal::InvalidLogLevel
            | Refusal::UnknownTool
            | Refusal::InvalidArguments
            | Refusal::InvalidTaskParams
            | Refusal::UnknownTask
            | Refusal::CursorAhead => code::INVALID_PARAMS,
            Refusal::SessionInvalid(_) => SESSION_INVALID,
            Refusal::UnsupportedProtocolVersion => tether_core::mcp::code::UNSUPPORTED_PROTOCOL_VERSION,
            Refusal::InvalidIdempotencyKey
            | Refusal::IdempotencyKeyReused
            | Refusal::MissingMeta
            | Refusal::InvalidInputResponses
            | Refusal::InvalidRequestState => code::INVALID_PARAMS,
            Refusal::HeaderMismatch => tether_core::mcp::code::HEADER_MISMATCH,
            Refusal::MethodNotFound => code::METHOD_NOT_FOUND,
            Refusal::NotAcceptable
            | Refusal::UnsupportedMediaType
            | Refusal::BodyTooLarge
            | Refusal::BodyTimeout
            | Refusal::OriginNotAllowed
            | Refusal::HostNotAllowed
            | Refusal::Unauthorized
            | Refusal::InsufficientScope
            | Refusal::KeysUnavailable
            | Refusal::TooManySessions
            | Refusal::TooManyConnections
            | Refusal::TooManyStreams
            | Refusal::TooManyTasks
            | Refusal::GetStreamAttached
            | Refusal::StoreUnavailable
            | Refusal::NotReady
            | Refusal::Draining
            | Refusal::RequestAborted
            | Refusal::RequestCancelled
            | Refusal::RecordsRegressed => SERVER_ERROR,
        }
    }

    /// The HTTP status of a 2026-07-28 response whose outcome is `outcome`: 200 for a result;
    /// for an error, 404 for an unknown method, 400 for a missing capability, a catalogue
    /// error's own status, and 200 for any other (a handler's).
    pub(crate) fn stateless_status(outcome: &Result<Value, ErrorObject>) -> StatusCode {
        let Err(error) = outcome else { return StatusCode::OK };
        match error.code {
            code::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
            tether_core::mcp::code::MISSING_REQUIRED_CLIENT_CAPABILITY => StatusCode::BAD_REQUEST,
            _ => error.reason().and_then(Refusal::from_reason).map_or(StatusCode::OK, Refusal::status),
        }
    }

    /// How a failure of the store that is not about a session is answered: a failing backend
    /// (a Redis failing over, a full disk) is `store_unavailable`, which says "not now": a keyed
    /// request is sent again, and its key decides whether it runs. Anything else is
    /// `store_error`. Handlers answer their own store failures with it.
    pub fn of_store_failure(err: &StoreError) -> Refusal {
        match err {
            StoreError::Backend(_) => Refusal::StoreUnavailable,
            _ => Refusal::StoreError,
        }
    }

    /// The refusal whose `data.reason` is `reason`, if one is.
    pub fn from_reason(reason: &str) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|refusal| refusal.reason() == reason)
    }

    /// The `data.reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::ParseError => "parse_error",
            Refusal::InvalidMessage => "invalid_message",
            Refusal::BatchNotAllowed => "batch_not_allowed",
            Refusal::InitializeInBatch => "initialize_in_batch",
            Refusal::MissingSessionId => "missing_session_id",
            Refusal::SessionInvalid(reason) => reason.as_str(),
            Refusal::MalformedCursor => "malformed_cursor",
            Refusal::UnsupportedProtocolVersion => "unsupported_protocol_version",
            Refusal::NotAcceptable => "not_acceptable",
            Refusal::UnsupportedMediaType => "unsupported_media_type",
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::BodyUnreadable => "body_unreadable",
            Refusal::OriginNotAllowed => "origin_not_allowed",
            Refusal::HostNotAllowed => "host_not_allowed",
            Refusal::Unauthorized => "unauthorized",
            Refusal::InsufficientScope => "insufficient_scope",
            Refusal::KeysUnavailable => "keys_unavailable",
            Refusal::TooManySessions => "too_many_sessions",
            Refusal::TooManyConnections => "too_many_connections",
            Refusal::TooManyStreams => "too_many_streams",
            Refusal::TooManyTasks => "too_many_tasks",
            Refusal::GetStreamAttached => "get_stream_attached",
            Refusal::StoreUnavailable => "store_unavailable",
            Refusal::NotReady => "not_ready",
            Refusal::Draining => "draining",
            Refusal::ResponseNotAllowed => "response_not_allowed",
            Refusal::MissingMeta => "missing_meta",
            Refusal::HeaderMismatch => "header_mismatch",
            Refusal::MethodNotFound => "method_not_found",
            Refusal::InvalidInputResponses => "invalid_input_responses",
            Refusal::InvalidRequestState => "invalid_request_state",
            Refusal::RequestIdReused => "request_id_reused",
            Refusal::RequestHistoryExpired => "request_history_expired",
            Refusal::InvalidIdempotencyKey => "invalid_idempotency_key",
            Refusal::IdempotencyKeyReused => "idempotency_key_reused",
            Refusal::RequestAborted => "request_aborted",
            Refusal::RequestCancelled => "request_cancelled",
            Refusal::RecordsRegressed => "records_regressed",
            Refusal::MethodNotAllowed => "method_not_allowed",
            Refusal::RandomFailed => "random_failed",
            Refusal::StartFailed => "start_failed",
            Refusal::StoreError => "store_error",
            Refusal::DecisionInconsistent => "decision_inconsistent",
            Refusal::HandlerPanicked => "handler_panicked",
            Refusal::StoreFailed => "store_failed",
            Refusal::ContextFailed => "context_failed",
            Refusal::InputRequiredInvalid => "input_required_invalid",
            Refusal::InputFailed => "input_failed",
            Refusal::IdempotencyRecordLost => "idempotency_record_lost",
            Refusal::InvalidLogLevel => "invalid_log_level",
            Refusal::UnknownTool => "unknown_tool",
            Refusal::InvalidArguments => "invalid_arguments",
            Refusal::InvalidTaskParams => "invalid_params",
            Refusal::UnknownTask => "unknown_task",
            Refusal::CursorAhead => tether_core::tasks::CURSOR_AHEAD,
            Refusal::UpstreamUnavailable => "upstream_unavailable",
            Refusal::UpstreamNotInitialized => "not_initialized",
            Refusal::ClientRequestFailed => "client_request_failed",
            Refusal::NoStream => "no_stream",
        }
    }

    /// The refusal, saying `message`.
    pub(crate) fn with(self, message: impl Into<String>) -> Rejection {
        Rejection::new(self, message)
    }

    /// The JSON-RPC error it answers a request with, saying `message`.
    #[allow(clippy::disallowed_methods, reason = "the one place an error gets its reason")]
    pub fn error(self, message: impl Into<String>) -> ErrorObject {
        ErrorObject::with_reason(self.code(), message, self.reason())
    }
}

/// The code of a server error (`-32000`): a refusal of the transport's own.
pub(crate) const SERVER_ERROR: i64 = -32000;
/// The code of an unusable session (`-32001`).
const SESSION_INVALID: i64 = -32001;

/// A request the server will not serve, and how to say so.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub status: StatusCode,
    pub error: ErrorObject,
    pub id: Option<RequestId>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Rejection {
    /// The refusal `refusal`, saying `message`.
    fn new(refusal: Refusal, message: impl Into<String>) -> Rejection {
        Rejection { status: refusal.status(), error: refusal.error(message), id: None, headers: Vec::new() }
    }

    /// A refusal whose error is not the catalogue's (a missing capability, which tether-core
    /// names), with `status`.
    pub fn of_error(status: StatusCode, error: ErrorObject) -> Rejection {
        Rejection { status, error, id: None, headers: Vec::new() }
    }

    /// 404: the session cannot be used, with the reason.
    pub fn session_invalid(reason: InvalidReason) -> Rejection {
        let message = match reason {
            InvalidReason::UnknownSession => "session not found",
            InvalidReason::Terminated => "session was terminated",
            InvalidReason::Expired => "session expired",
            InvalidReason::UpstreamLost => "the upstream server behind this gateway stopped serving the session",
            InvalidReason::IncarnationMismatch => "the cursor belongs to another incarnation of this session",
            InvalidReason::HistoryRewritten => {
                "the server's store went back in time: it no longer holds the history this session's client saw; start a new session"
            }
        };
        Refusal::SessionInvalid(reason).with(message)
    }

    /// 405 with the allowed methods.
    pub fn method_not_allowed(allow: &'static str) -> Rejection {
        Refusal::MethodNotAllowed
            .with("method not allowed")
            .with_header(http::header::ALLOW, HeaderValue::from_static(allow))
    }

    /// The same refusal with another status (an error answered in the response in one era, by
    /// refusing the request in the other).
    pub fn with_status(mut self, status: StatusCode) -> Rejection {
        self.status = status;
        self
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
        crate::telemetry::refused(self.status, self.error.reason());
        let body = Message::Response(tether_core::jsonrpc::Response::error(self.id, self.error)).to_vec();
        let mut response =
            (self.status, [(CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response();
        response.headers_mut().extend(self.headers);
        response
    }
}

impl From<StoreError> for Rejection {
    /// How a store failure is answered: a session the store says is gone is a 404, a full
    /// store a 503 to retry, a failing backend a 503 (logged), anything else a 500.
    fn from(err: StoreError) -> Rejection {
        let refusal = Refusal::of_store_failure(&err);
        match err {
            StoreError::SessionGone => Rejection::session_invalid(InvalidReason::UnknownSession),
            StoreError::TooManySessions => Refusal::TooManySessions
                .with("as many sessions as allowed are live; try again later")
                .with_header(http::header::RETRY_AFTER, HeaderValue::from_static("1")),
            StoreError::Backend(message) => {
                tracing::error!(%message, "store backend failed");
                refusal.with("the store is unavailable")
            }
            other => refusal.with(other.to_string()),
        }
    }
}

impl From<crate::request::dispatch::DispatchError> for Rejection {
    /// How a request that could not start is refused.
    fn from(err: crate::request::dispatch::DispatchError) -> Rejection {
        use crate::request::dispatch::DispatchError;
        match err {
            DispatchError::Store(err) => Rejection::from(err),
            DispatchError::Random(err) => Refusal::RandomFailed.with(err.to_string()),
            DispatchError::SessionEnded => Rejection::session_invalid(InvalidReason::Terminated),
            DispatchError::StartFailed(message) => Refusal::StartFailed.with(message),
            DispatchError::InvalidIdempotencyKey(message) => {
                Refusal::InvalidIdempotencyKey.with(message).with_status(StatusCode::BAD_REQUEST)
            }
            DispatchError::TasksRequired(_) => {
                Rejection::of_error(StatusCode::BAD_REQUEST, tether_core::tasks::missing_capability(&err.to_string()))
            }
            DispatchError::InvalidInput(err) => match err {
                InputError::Responses(_) => Refusal::InvalidInputResponses.with(err.to_string()),
                InputError::State | InputError::Expired => Refusal::InvalidRequestState.with(err.to_string()),
            },
        }
    }
}

/// The refusal of a body that is not a JSON-RPC message.
pub(crate) fn unparsable(err: &tether_core::jsonrpc::ParseError) -> Rejection {
    let refusal = match err {
        tether_core::jsonrpc::ParseError::NotJson(_) => Refusal::ParseError,
        tether_core::jsonrpc::ParseError::Invalid(_) => Refusal::InvalidMessage,
    };
    refusal.with(err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of docs/PROTOCOL.md's table of errors: status, code and reasons of each.
    fn documented() -> Vec<(u16, i64, Vec<String>)> {
        let doc = include_str!("../../../docs/PROTOCOL.md");
        let table = doc.split("## Errors").nth(1).and_then(|s| s.split("\n## ").next()).expect("an Errors section");
        table
            .lines()
            .filter(|line| line.starts_with("| ") && !line.starts_with("| situation"))
            .map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let status = cells[2].split_whitespace().next().and_then(|s| s.parse().ok()).expect("a status");
                let code = cells[3].parse().expect("a code");
                let reasons = cells[4]
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|r| r.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                    .map(str::to_owned)
                    .collect();
                (status, code, reasons)
            })
            .collect()
    }

    #[test]
    fn the_documented_table_of_errors_is_the_catalogue() {
        let rows = documented();
        for refusal in Refusal::ALL {
            let row = rows.iter().find(|(_, _, reasons)| reasons.iter().any(|r| r == refusal.reason()));
            let Some((status, code, _)) = row else { panic!("{} is not in docs/PROTOCOL.md", refusal.reason()) };
            assert_eq!((*status, *code), (refusal.status().as_u16(), refusal.code()), "{}", refusal.reason());
        }
        for (_, _, reasons) in &rows {
            for reason in reasons {
                assert!(
                    Refusal::ALL.iter().any(|r| r.reason() == reason),
                    "docs/PROTOCOL.md names {reason}, which the catalogue lacks"
                );
            }
        }
    }
}
