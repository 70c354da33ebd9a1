//! The MCP endpoint: one path for POST, GET and DELETE, routed by method and protocol era.

mod delete;
pub(crate) mod endpoint;
mod get;
mod guard;
pub(crate) mod names;
mod post;
mod sse;
mod stateless;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use tether_core::lineage::{Epoch, InvalidReason, SessionId, check_session};
use tether_store::{SessionRecord, SessionStatus};
use tracing::Instrument as _;

use crate::ServerState;
use crate::refusal::{Refusal, Rejection};
use crate::session::{SessionRuntime, service};
use guard::HeaderVersion;

/// The MCP endpoint at `path` in an axum router, beside the authorization metadata.
pub(crate) fn router(path: &str, shared: Arc<ServerState>) -> Router {
    let route = |State(shared): State<Arc<ServerState>>, request| endpoint(shared, request);
    let routes = Router::new().route(path, axum::routing::any(route)).with_state(Arc::clone(&shared));
    routes.merge(metadata(&shared))
}

/// The protected resource's metadata document at its path (RFC 9728), if requests authenticate
/// with OAuth; else a router with no routes.
pub(crate) fn metadata(shared: &ServerState) -> Router {
    let Some(resource) = shared.auth.as_deref().and_then(|auth| auth.protected_resource()) else {
        return Router::new();
    };
    // RFC 9728 §3: the metadata is public, so any origin may read it.
    let document = Bytes::from(resource.document().to_string());
    let metadata = move || {
        let cors = (http::header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
        std::future::ready(json_response(StatusCode::OK, document.clone(), [cors]))
    };
    Router::new().route(resource.metadata_path(), axum::routing::get(metadata))
}

/// Answers one request of the MCP endpoint, whatever its method.
async fn endpoint(shared: Arc<ServerState>, request: axum::extract::Request) -> Response {
    let method = request.method().clone();
    // At debug: a span costs a few microseconds a call (its fields formatted into each log
    // line's context), and a request's own span (`mcp`, at info) names its session already.
    let span = tracing::debug_span!("http", %method, session = tracing::field::Empty);
    if !span.is_disabled()
        && let Some(session) = request.headers().get(names::SESSION_ID).and_then(|v| v.to_str().ok())
    {
        span.record("session", session);
    }
    let response = match handle(shared, request).instrument(span.clone()).await {
        Ok(response) => response,
        Err(rejection) => rejection.into_response(),
    };
    span.in_scope(|| tracing::debug!(status = %response.status(), "answered"));
    response
}

async fn handle(shared: Arc<ServerState>, request: axum::extract::Request) -> Result<Response, Rejection> {
    let (parts, body) = request.into_parts();
    guard::origin_and_host(&parts.uri, &parts.headers, &shared.config)?;
    let caller = guard::authenticate(&parts.headers, shared.auth.as_deref()).await?;
    let version = guard::protocol_version(&parts.headers)?;
    let sessionful = matches!(version, HeaderVersion::Absent | HeaderVersion::Sessionful(_));
    match (parts.method.clone(), version) {
        // An unsupported version is answered the 2026-07-28 way, which needs the body.
        (Method::POST, HeaderVersion::Stateless(v)) => {
            stateless::post(&shared, &parts.headers, body, caller, Ok(v)).await
        }
        (Method::POST, HeaderVersion::Unsupported(v)) => {
            stateless::post(&shared, &parts.headers, body, caller, Err(&v)).await
        }
        (Method::POST, _) => post::post(&shared, &parts.headers, body, caller).await,
        (Method::GET | Method::DELETE, HeaderVersion::Unsupported(v)) => Err(guard::unsupported_version(&v)),
        // 2026-07-28 has no GET stream and no sessions to delete.
        (Method::GET | Method::DELETE, _) if !sessionful => Err(Rejection::method_not_allowed("POST")),
        (Method::GET, _) => get::get(&shared, &parts.headers, caller.map(|caller| caller.principal)).await,
        (Method::DELETE, _) => delete::delete(&shared, &parts.headers, caller.map(|caller| caller.principal)).await,
        _ => Err(Rejection::method_not_allowed("GET, POST, DELETE")),
    }
}

/// The headers that tie a response to its session: the id echo and the replay epoch.
pub(crate) fn session_headers(id: &SessionId, epoch: &Epoch) -> [(HeaderName, HeaderValue); 2] {
    // Session ids and epochs are base64url tokens the server minted: always valid header values.
    let value = |s: &str| HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""));
    [(names::SESSION_ID, value(id.as_str())), (names::REPLAY_EPOCH, value(epoch.as_str()))]
}

/// A JSON response body with extra headers.
pub(crate) fn json_response(
    status: StatusCode,
    body: impl Into<Bytes>,
    headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
) -> Response {
    let mut response = Response::new(Body::from(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response.headers_mut().extend(headers);
    response
}

/// 202 Accepted, no body.
pub(crate) fn accepted(headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>) -> Response {
    let mut response = StatusCode::ACCEPTED.into_response();
    response.headers_mut().extend(headers);
    response
}

/// The session id header's value; 400 if it is missing. A value that is no session id (not
/// visible ASCII, or too long) names no session this server issued: 404, as for an unknown one.
pub(crate) fn session_id(headers: &HeaderMap) -> Result<SessionId, Rejection> {
    let value = headers
        .get(names::SESSION_ID)
        .ok_or_else(|| Refusal::MissingSessionId.with("Mcp-Session-Id header is required"))?;
    value
        .to_str()
        .ok()
        .and_then(|id| SessionId::parse(id).ok())
        .ok_or_else(|| Rejection::session_invalid(InvalidReason::UnknownSession))
}

/// The store's view of a session as `principal` may see it: another principal's session is
/// unknown to them.
pub(crate) async fn session_status(
    shared: &ServerState,
    id: &SessionId,
    principal: Option<&str>,
    now: u64,
) -> Result<SessionStatus, Rejection> {
    let status = shared.store.session(id, now).await.map_err(Rejection::from)?;
    Ok(match status {
        SessionStatus::Live(record) if record.principal.as_deref() != principal => SessionStatus::Unknown,
        other => other,
    })
}

/// The live session a request names, renewed; 400 or 404 otherwise.
pub(crate) async fn live_session(
    shared: &Arc<ServerState>,
    headers: &HeaderMap,
    principal: Option<&str>,
) -> Result<SessionRecord, Rejection> {
    let now = crate::now_ms();
    let id = session_id(headers)?;
    let status = session_status(shared, &id, principal, now).await?;
    check_session(status.lookup(), now).map_err(Rejection::session_invalid)?;
    let SessionStatus::Live(record) = status else {
        return Err(Rejection::session_invalid(InvalidReason::UnknownSession));
    };
    service::renew(shared, &record, now).await?;
    Ok(record)
}

/// 429 when a session has too many open streams and running requests to take on `starting`
/// more (a connection, a request, or a batch's requests).
pub(crate) fn check_load(shared: &ServerState, runtime: &SessionRuntime, starting: usize) -> Result<(), Rejection> {
    let limit = shared.config.max_streams_per_session;
    // Refused when the load plus what starts is over the limit: the load is at least this.
    if runtime.at_limit(limit.saturating_add(1).saturating_sub(starting)) {
        let starts = if starting > 1 { format!("; this batch would start {starting}") } else { String::new() };
        return Err(Refusal::TooManyStreams
            .with(format!("a session may have at most {limit} open streams and running requests{starts}")));
    }
    Ok(())
}

/// Reads a request body: 413 past the configured size, 408 if it takes longer than the body
/// timeout (a slow sender holds a connection and its buffers), 400 if the client broke it off.
pub(crate) async fn read_body(body: Body, config: &crate::ServerConfig) -> Result<Bytes, Rejection> {
    use futures_util::StreamExt as _;
    let limit = config.max_body_bytes;
    let too_large = || Refusal::BodyTooLarge.with(format!("request body over {limit} bytes"));
    let read = async {
        let mut chunks = body.into_data_stream();
        let unreadable = |_| Refusal::BodyUnreadable.with("the request body could not be read");
        // Most bodies are one chunk: it is returned as it is, without a copy.
        let Some(first) = chunks.next().await.transpose().map_err(unreadable)? else { return Ok(Bytes::new()) };
        if first.len() > limit {
            return Err(too_large());
        }
        let Some(second) = chunks.next().await.transpose().map_err(unreadable)? else { return Ok(first) };
        let mut all = bytes::BytesMut::from(first);
        let mut next = Some(second);
        while let Some(chunk) = next {
            if all.len() + chunk.len() > limit {
                return Err(too_large());
            }
            all.extend_from_slice(&chunk);
            next = chunks.next().await.transpose().map_err(unreadable)?;
        }
        Ok(all.freeze())
    };
    tokio::time::timeout(config.body_timeout, read).await.unwrap_or_else(|_| {
        Err(Refusal::BodyTimeout.with(format!("the request body took longer than {:?} to arrive", config.body_timeout)))
    })
}
