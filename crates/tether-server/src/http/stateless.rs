//! POST in the 2026-07-28 era: stateless requests with per-request metadata. No session, no
//! event ids, no resumption; closing the response stream cancels the request.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderName};
use serde_json::{Value, json};
use tether_core::jsonrpc::{self, ErrorObject, Message, Request, RequestId};
use tether_core::mcp::{ProtocolVersion, meta, method};
use tether_core::methods::{self, ServedBy};
use tether_core::param_headers;
use tether_core::subscriptions;
use tether_core::tasks;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{accepted, guard, json_response, names, read_body, sse};
use crate::auth::Identity;
use crate::excerpt::quoted;
use crate::refusal::{self, Refusal, Rejection};
use crate::request::dispatch;
use crate::request::output::{Answer, FirstOutput, Output};
use crate::{Handler, SUPPORTED_VERSIONS, ServerState};
use tether_core::translate;

/// Messages buffered between a 2026-07-28 handler and its connection.
const DIRECT_BUFFER: usize = 64;

/// Serves a POST whose `MCP-Protocol-Version` is a revision of the stateless era (`Ok`), or a
/// version this server does not support (`Err`, as sent): that one is refused the 2026-07-28
/// way, with the request's id.
pub(crate) async fn post(
    shared: &Arc<ServerState>,
    headers: &HeaderMap,
    body: Body,
    caller: Option<Identity>,
    version: Result<ProtocolVersion, &str>,
) -> Result<Response, Rejection> {
    let unsupported = version.err();
    guard::post_media(headers)?;
    let bytes = read_body(body, &shared.config).await?;
    let message = jsonrpc::parse_message(&bytes).map_err(|e| refusal::unparsable(&e))?;
    let request = match message {
        Message::Request(request) => request,
        _ if unsupported.is_some() => return Err(guard::unsupported_version(unsupported.unwrap_or_default())),
        Message::Notification(_) => return Ok(accepted([])),
        Message::Response(_) => {
            return Err(Refusal::ResponseNotAllowed.with("clients send no responses in 2026-07-28"));
        }
    };
    let id = request.id.clone();
    guard::authorize(shared.auth.as_deref(), caller.as_ref(), &request)?;
    let principal = caller.map(|caller| caller.principal);
    // New work waits for another replica, or this one back; what concerns tasks already
    // running is still answered.
    if !matches!(methods::served_by(&request.method), ServedBy::Tasks) {
        shared.drain.admit().map_err(|r| r.with_id(Some(id.clone())))?;
    }
    if let Ok(version) = version
        && !methods::exists_in(&request.method, version.era())
    {
        // Before any other check: whatever else the request says, the method is gone.
        return Err(method_not_found(&request.method).with_id(Some(id)));
    }
    validate(headers, &request, version, shared.handler.as_ref()).map_err(|r| r.with_id(Some(id.clone())))?;
    match methods::served_by(&request.method) {
        // `server/discover`: the one method of this era the protocol has the transport answer.
        ServedBy::Protocol => {
            let info = shared.handler.info();
            let mut result = json!({
                "supportedVersions": SUPPORTED_VERSIONS.map(ProtocolVersion::as_str),
                "capabilities": stateless_capabilities(info.capabilities),
            });
            crate::request::idempotency::advertise(shared, &mut result["capabilities"])
                .await
                .map_err(|e| Rejection::from(e).with_id(Some(id.clone())))?;
            if let Some(instructions) = info.instructions {
                result["instructions"] = json!(instructions);
            }
            translate::stateless_result(method::SERVER_DISCOVER, &mut result, &shared.server_info);
            return Ok(answered(id, Ok(result)));
        }
        ServedBy::Subscriptions => {
            let params = request.params.as_ref().unwrap_or(&Value::Null);
            let capabilities = stateless_capabilities(shared.handler.info().capabilities);
            let filter = subscriptions::Filter::requested(params).honoured(&capabilities);
            let closed = CancellationToken::new();
            let rx = shared.listeners.open(&id, filter, closed.clone());
            return Ok(sse::response(sse::direct_body(rx, closed.drop_guard(), shared.config.keep_alive), []));
        }
        ServedBy::Tasks if request.method == tasks::method::STREAM => {
            let closed = CancellationToken::new();
            return Ok(match crate::tasks::stream(shared, principal.as_deref(), &request, closed.clone()).await {
                Ok(rx) => sse::response(sse::direct_body(rx, closed.drop_guard(), shared.config.keep_alive), []),
                Err(error) => answered(id, Err(error)),
            });
        }
        ServedBy::Tasks => {
            let mut outcome = crate::tasks::serve(shared, principal.as_deref(), &request).await;
            if let Ok(result) = &mut outcome {
                translate::stateless_result(&request.method, result, &shared.server_info);
            }
            return Ok(answered(id, outcome));
        }
        ServedBy::Handler => {}
    }
    let mut request = request;
    crate::trace::adopt_header(headers, &mut request);
    let (tx, rx) = mpsc::channel(DIRECT_BUFFER);
    let answer = tx.clone();
    let cancel = CancellationToken::new();
    let direct =
        dispatch::start_stateless(shared, principal.as_deref(), request, bytes, Output::Direct { tx }, cancel.clone())
            .await
            .map_err(|err| Rejection::from(err).with_id(Some(id)))?;
    // Until the response is handed over, dropping this future (the client went away) cancels
    // the request; afterwards the response body holds the guard. A keyed request runs on.
    let guard = if direct.cancel_on_close { cancel.drop_guard() } else { CancellationToken::new().drop_guard() };
    // A keyed request is answered at once, as a stream that carries its claim; a result that
    // comes first goes on the stream too.
    if let Some(claimed) = &direct.claimed {
        let first = direct.first;
        tokio::spawn(async move {
            if let Ok(FirstOutput::Final(Answer { bytes, .. })) = first.await {
                let _ = answer.send((bytes, true)).await;
            }
        });
        let body = sse::direct_body(rx, guard, shared.config.keep_alive);
        return Ok(sse::response(body, [sse::claim_header(claimed)]));
    }
    drop(answer);
    match direct.first.await {
        Ok(FirstOutput::Final(Answer { bytes, status })) => Ok(json_response(status, bytes, [])),
        Ok(FirstOutput::Event) | Err(_) => Ok(sse::response(sse::direct_body(rx, guard, shared.config.keep_alive), [])),
    }
}

/// The JSON answer to request `id` that the transport answers itself, with the status its
/// outcome has in this era.
fn answered(id: RequestId, outcome: Result<Value, ErrorObject>) -> Response {
    let status = Refusal::stateless_status(&outcome);
    json_response(status, Message::Response(jsonrpc::Response { id: Some(id), outcome }).to_vec(), [])
}

/// The capabilities this era honours: the handler's (list changes and resource updates are
/// delivered on `subscriptions/listen`), exactly-once execution if it is on, and tasks.
fn stateless_capabilities(mut capabilities: Value) -> Value {
    if let Value::Object(map) = &mut capabilities
        && let Value::Object(extensions) = map.entry("extensions").or_insert_with(|| json!({}))
    {
        extensions.insert(tasks::EXTENSION.into(), json!({}));
        extensions.insert(tasks::STREAMS_EXTENSION.into(), json!({"maxEventsPerTask": tasks::MAX_EVENTS}));
    }
    capabilities
}

fn method_not_found(name: &str) -> Rejection {
    Refusal::MethodNotFound.with(format!("method {} not found", quoted(name)))
}

fn header_mismatch(message: String) -> Rejection {
    Refusal::HeaderMismatch.with(message)
}

/// The request-metadata rules, in the order clients can rely on: required `_meta` fields
/// (-32602), then the version header against `_meta` (-32020), then whether the version is
/// supported (-32022), then `Mcp-Method`, `Mcp-Name` and a tool's `Mcp-Param-*` against the
/// body (-32020).
fn validate(
    headers: &HeaderMap,
    request: &Request,
    version: Result<ProtocolVersion, &str>,
    handler: &dyn Handler,
) -> Result<(), Rejection> {
    let unsupported = version.err();
    let request_meta = request.params.as_ref().and_then(|p| p.get("_meta"));
    let missing = |key: &str| Refusal::MissingMeta.with(format!("params._meta[{key:?}] is required"));
    let header_version = match version {
        Ok(version) => version.as_str(),
        Err(text) => text,
    };
    let Some(version) = request_meta.and_then(|m| m.get(meta::PROTOCOL_VERSION)) else {
        // No per-request metadata at all: a sessionful client with a version this server lacks.
        return Err(match unsupported {
            Some(requested) if request_meta.is_none() => guard::unsupported_version(requested),
            _ => missing(meta::PROTOCOL_VERSION),
        });
    };
    if request_meta.and_then(|m| m.get(meta::CLIENT_CAPABILITIES)).is_none() {
        return Err(missing(meta::CLIENT_CAPABILITIES));
    }
    if version.as_str() != Some(header_version) {
        return Err(header_mismatch(format!(
            "MCP-Protocol-Version {header_version:?} does not match _meta protocol version {version}"
        )));
    }
    if let Some(requested) = unsupported {
        return Err(guard::unsupported_version(requested));
    }
    let header_value = |name: &HeaderName, values| {
        guard::single(headers, name, values).map(|value| value.map(|v| v.to_str().unwrap_or("").trim()))
    };
    match header_value(&names::METHOD, guard::Values::One)? {
        Some(m) if m == request.method => {}
        Some(m) => {
            return Err(header_mismatch(format!(
                "Mcp-Method {} does not match the body's method {}",
                quoted(m),
                quoted(&request.method)
            )));
        }
        None => return Err(header_mismatch("Mcp-Method header is required".into())),
    }
    if let Some(field) = methods::mcp_name(&request.method) {
        let body_name = request.params.as_ref().and_then(|p| p.get(field)).and_then(Value::as_str);
        let named = header_value(&names::NAME, guard::Values::Any)?.and_then(|v| param_headers::decode_value(v).ok());
        if named.as_deref() != body_name {
            return Err(header_mismatch(format!("Mcp-Name must equal params.{field}")));
        }
    }
    // Every mirrored argument at most once, declared or not.
    for name in headers.keys().filter(|name| name.as_str().starts_with(param_headers::PREFIX)) {
        guard::single(headers, name, guard::Values::Any)?;
    }
    if request.method == method::TOOLS_CALL {
        let params = request.params.as_ref();
        let tool = params.and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default();
        let arguments = params.and_then(|p| p.get("arguments")).unwrap_or(&Value::Null);
        param_headers::check(handler.param_headers(tool), arguments, |name| headers.get(name).map(|v| v.as_bytes()))
            .map_err(|mismatch| header_mismatch(mismatch.to_string()))?;
    }
    Ok(())
}
