//! POST in the 2026-07-28 era: stateless requests with per-request metadata. No session, no
//! event ids, no resumption; closing the response stream cancels the request.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tether_core::jsonrpc::{self, Message, Request, code};
use tether_core::mcp::{self, ProtocolVersion, header, meta, method};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::reject::Rejection;
use super::{accepted, guard, json_response, read_body, sse};
use crate::context::{FirstOutput, Output};
use crate::{SUPPORTED_VERSIONS, Shared, dispatch};

/// Messages buffered between a 2026-07-28 handler and its connection.
const DIRECT_BUFFER: usize = 64;

pub(crate) async fn post(shared: &Arc<Shared>, headers: &HeaderMap, body: Body) -> Result<Response, Rejection> {
    guard::post_media(headers)?;
    let bytes = read_body(body, shared.config.max_body_bytes).await?;
    let message = jsonrpc::parse_message(&bytes).map_err(|e| {
        let reason = if e.code() == code::PARSE_ERROR { "parse_error" } else { "invalid_message" };
        Rejection::new(StatusCode::BAD_REQUEST, e.code(), reason, e.to_string())
    })?;
    let request = match message {
        Message::Request(request) => request,
        Message::Notification(_) => return Ok(accepted([])),
        Message::Response(_) => {
            return Err(Rejection::bad_request("response_not_allowed", "clients send no responses in 2026-07-28"));
        }
    };
    let id = request.id.clone();
    validate(headers, &request).map_err(|r| r.with_id(Some(id.clone())))?;
    match request.method.as_str() {
        method::SERVER_DISCOVER => {
            let body = Message::Response(jsonrpc::Response::result(id, discover(shared))).to_vec();
            return Ok(json_response(StatusCode::OK, body, []));
        }
        // The handshake and ping do not exist in this revision.
        method::INITIALIZE | method::PING | "logging/setLevel" => return Err(method_not_found(&request.method, id)),
        _ => {}
    }
    let (tx, rx) = mpsc::channel(DIRECT_BUFFER);
    let cancel = CancellationToken::new();
    let first = dispatch::start_direct(shared, request, Output::Direct { tx }, cancel.clone());
    // Until the response is handed to the client, dropping this future (the client went away)
    // cancels the request; afterwards the response body holds the guard.
    let guard = cancel.drop_guard();
    match first.await {
        Ok(FirstOutput::Final(bytes)) => {
            let not_found =
                jsonrpc::parse_message(&bytes).is_ok_and(|m| matches!(&m, Message::Response(r) if matches!(&r.outcome, Err(e) if e.code == code::METHOD_NOT_FOUND)));
            let status = if not_found { StatusCode::NOT_FOUND } else { StatusCode::OK };
            Ok(json_response(status, bytes, []))
        }
        Ok(FirstOutput::Event) | Err(_) => Ok(sse::response(sse::direct_body(rx, guard, shared.config.keep_alive), [])),
    }
}

fn method_not_found(name: &str, id: jsonrpc::RequestId) -> Rejection {
    Rejection::new(
        StatusCode::NOT_FOUND,
        code::METHOD_NOT_FOUND,
        "method_not_found",
        format!("method {name:?} not found"),
    )
    .with_id(Some(id))
}

fn header_mismatch(message: String) -> Rejection {
    Rejection::new(StatusCode::BAD_REQUEST, mcp::code::HEADER_MISMATCH, "header_mismatch", message)
}

/// The request-metadata rules: `Mcp-Method`, `Mcp-Name` and `_meta` must agree with the body.
fn validate(headers: &HeaderMap, request: &Request) -> Result<(), Rejection> {
    let header_value = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or(""));
    match header_value(header::METHOD) {
        Some(m) if m == request.method => {}
        Some(m) => {
            return Err(header_mismatch(format!(
                "Mcp-Method {m:?} does not match the body's method {:?}",
                request.method
            )));
        }
        None => return Err(header_mismatch("Mcp-Method header is required".into())),
    }
    let named = match request.method.as_str() {
        method::TOOLS_CALL | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    if let Some(field) = named {
        let body_name = request.params.as_ref().and_then(|p| p.get(field)).and_then(Value::as_str);
        if header_value(header::NAME) != body_name {
            return Err(header_mismatch(format!("Mcp-Name must equal params.{field}")));
        }
    }
    let meta = request.params.as_ref().and_then(|p| p.get("_meta"));
    let missing = |key: &str| {
        Rejection::new(
            StatusCode::BAD_REQUEST,
            code::INVALID_PARAMS,
            "missing_meta",
            format!("params._meta[{key:?}] is required"),
        )
    };
    let version = meta.and_then(|m| m.get(meta::PROTOCOL_VERSION)).and_then(Value::as_str);
    match version {
        None => return Err(missing(meta::PROTOCOL_VERSION)),
        Some(v) if v != ProtocolVersion::V2026_07_28.as_str() => {
            return Err(header_mismatch(format!("MCP-Protocol-Version does not match _meta protocol version {v:?}")));
        }
        Some(_) => {}
    }
    if meta.and_then(|m| m.get(meta::CLIENT_CAPABILITIES)).is_none() {
        return Err(missing(meta::CLIENT_CAPABILITIES));
    }
    Ok(())
}

/// The `server/discover` result: versions, capabilities and who the server is.
fn discover(shared: &Shared) -> Value {
    let info = shared.handler.info();
    let mut result = json!({
        "supportedVersions": SUPPORTED_VERSIONS.map(ProtocolVersion::as_str),
        "capabilities": info.capabilities,
        "serverInfo": {"name": info.name, "version": info.version},
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": info.name, "version": info.version}},
        "resultType": "complete",
    });
    if let Some(instructions) = info.instructions {
        result["instructions"] = json!(instructions);
    }
    result
}
