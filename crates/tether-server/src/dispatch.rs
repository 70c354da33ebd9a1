//! Running a request: record it, run the handler on its own task, and send its outcome to
//! the request's output. A request runs to completion even if the client's connection drops;
//! only cancellation (or, in 2026-07-28, a closed response stream) stops it.

use std::sync::Arc;

use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, Request, RequestId, code};
use tether_core::lineage::{Digest, StreamName};
use tether_core::mcp;
use tether_store::BeginRequest;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::context::{Context, FirstOutput, Output, RequestMeta};
use crate::http::reject::{Rejection, rpc_error};
use crate::ids;
use crate::session::{LogLevel, SessionRuntime};

/// How a legacy request started.
pub(crate) enum Started {
    /// It runs; the receiver tells whether its first output was the result (JSON) or not (SSE).
    Running { stream: StreamName, first: oneshot::Receiver<FirstOutput> },
    /// Its id was used before in this incarnation with the same params: attach to that stream.
    Attach { stream: StreamName },
    /// Its id was used before with other params.
    Conflict(ErrorObject),
}

/// The key a request id is recorded under: the type matters (`1` and `"1"` differ).
fn request_key(id: &RequestId) -> String {
    match id {
        RequestId::Number(n) => format!("n:{n}"),
        RequestId::String(s) => format!("s:{s}"),
    }
}

/// The request id a key was made from.
pub(crate) fn request_id_of_key(key: &str) -> Option<RequestId> {
    match key.split_once(':')? {
        ("n", n) => n.parse().ok().map(RequestId::Number),
        ("s", s) => Some(RequestId::String(s.to_owned())),
        _ => None,
    }
}

/// The request's `_meta.progressToken`, if any.
fn progress_token(params: &Value) -> Option<Value> {
    params.get("_meta")?.get("progressToken").filter(|t| t.is_string() || t.is_number()).cloned()
}

/// Methods whose 2026-07-28 results carry cache hints.
const CACHEABLE: [&str; 5] =
    ["tools/list", "prompts/list", "resources/list", "resources/read", "resources/templates/list"];

/// Adds what every 2026-07-28 result carries: `resultType`, the server's identity and, for
/// list and read results, cache hints (tether does not promise any caching).
pub(crate) fn decorate_modern(method: &str, result: &mut Value, server_info: &Value) {
    let Value::Object(map) = result else { return };
    map.entry("resultType").or_insert_with(|| json!("complete"));
    if CACHEABLE.contains(&method) || method == tether_core::mcp::method::SERVER_DISCOVER {
        map.entry("ttlMs").or_insert_with(|| json!(0));
        map.entry("cacheScope").or_insert_with(|| json!("private"));
    }
    let meta = map.entry("_meta").or_insert_with(|| json!({}));
    if let Value::Object(meta) = meta {
        meta.entry("io.modelcontextprotocol/serverInfo").or_insert_with(|| server_info.clone());
    }
}

/// Starts a request of a legacy session: recorded in the store with its own stream, so it is
/// executed once however often its id is sent, and its output survives the connection.
pub(crate) async fn start_legacy(
    shared: &Arc<Shared>,
    runtime: &Arc<SessionRuntime>,
    request: Request,
) -> Result<Started, Rejection> {
    let key = request_key(&request.id);
    let params = request.params.unwrap_or_else(|| json!({}));
    let digest = Digest::of(&key, params.to_string().as_bytes()).to_string();
    let stream = ids::stream_name('r').map_err(|e| Rejection::internal("random_failed", e.to_string()))?;
    let begun = shared
        .store
        .begin_request(&runtime.id, &runtime.epoch, &key, &digest, &stream)
        .await
        .map_err(|e| crate::store_rejection(&e))?;
    match begun {
        BeginRequest::Existing { stream, same_params: true } => return Ok(Started::Attach { stream }),
        BeginRequest::Existing { same_params: false, .. } => {
            return Ok(Started::Conflict(rpc_error(
                code::INVALID_REQUEST,
                "request_id_reused",
                format!("request id {} was already used in this session with other params", request.id),
            )));
        }
        BeginRequest::Started => {}
    }
    let cancel = CancellationToken::new();
    if !runtime.start_request(&key, cancel.clone()) {
        return Err(Rejection::session_invalid(tether_core::lineage::InvalidReason::Terminated));
    }
    let output =
        Output::Stored { store: Arc::clone(&shared.store), runtime: Arc::clone(runtime), stream: stream.clone() };
    let meta = RequestMeta {
        progress_token: progress_token(&params),
        client_capabilities: runtime.client_capabilities.clone(),
        log_level: None,
        client_request_timeout: shared.config.client_request_timeout,
    };
    let (ctx, first) = Context::new(output, meta, cancel.clone(), Arc::clone(shared));
    let runtime = Arc::clone(runtime);
    let handler = Arc::clone(&shared.handler);
    tokio::spawn(async move {
        run(handler, ctx, request.id, request.method, params, cancel, None).await;
        runtime.finish_request(&key);
    });
    Ok(Started::Running { stream, first })
}

/// Starts a 2026-07-28 request: no record, output straight to the connection, cancelled when
/// `cancel` fires (the response stream was closed).
pub(crate) fn start_direct(
    shared: &Arc<Shared>,
    request: Request,
    output: Output,
    cancel: CancellationToken,
) -> oneshot::Receiver<FirstOutput> {
    let params = request.params.unwrap_or_else(|| json!({}));
    let request_meta = params.get("_meta");
    let meta = RequestMeta {
        progress_token: progress_token(&params),
        client_capabilities: request_meta
            .and_then(|m| m.get(mcp::meta::CLIENT_CAPABILITIES))
            .cloned()
            .unwrap_or_else(|| json!({})),
        log_level: request_meta
            .and_then(|m| m.get(mcp::meta::LOG_LEVEL))
            .and_then(Value::as_str)
            .and_then(LogLevel::parse),
        client_request_timeout: shared.config.client_request_timeout,
    };
    let (ctx, first) = Context::new(output, meta, cancel.clone(), Arc::clone(shared));
    let handler = Arc::clone(&shared.handler);
    let info = shared.handler.info();
    let server_info = json!({"name": info.name, "version": info.version});
    tokio::spawn(run(handler, ctx, request.id, request.method, params, cancel, Some(server_info)));
    first
}

/// How long a cancelled handler may run on before it is aborted.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

async fn run(
    handler: Arc<dyn crate::Handler>,
    ctx: Context,
    id: RequestId,
    method: String,
    params: Value,
    cancel: CancellationToken,
    modern_server_info: Option<Value>,
) {
    let mut task = tokio::spawn(handler.call(ctx.clone(), method.clone(), params));
    let joined = tokio::select! {
        joined = &mut task => Some(joined),
        () = cancel.cancelled() => None,
    };
    let outcome = match joined {
        Some(Ok(outcome)) => Some(outcome),
        Some(Err(err)) if err.is_panic() => {
            tracing::error!("handler panicked");
            Some(Err(rpc_error(code::INTERNAL_ERROR, "handler_panicked", "the handler failed")))
        }
        Some(Err(_)) => None,
        None => {
            // Give the handler a moment to notice the cancellation and clean up; nothing it
            // sends from now on is delivered.
            tokio::spawn(async move {
                if tokio::time::timeout(CANCEL_GRACE, &mut task).await.is_err() {
                    task.abort();
                }
            });
            None
        }
    };
    match outcome {
        Some(mut outcome) => {
            if let (Some(info), Ok(result)) = (&modern_server_info, &mut outcome) {
                decorate_modern(&method, result, info);
            }
            if let Err(err) = ctx.respond(id, outcome).await {
                tracing::debug!(%err, "final response not delivered");
            }
        }
        None => ctx.end_without_response().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_keys_round_trip_and_keep_the_id_type() {
        for id in [RequestId::Number(-3), RequestId::String("7".into()), RequestId::String("a:b".into())] {
            assert_eq!(request_id_of_key(&request_key(&id)), Some(id));
        }
        assert_ne!(request_key(&RequestId::Number(7)), request_key(&RequestId::String("7".into())));
    }
}
