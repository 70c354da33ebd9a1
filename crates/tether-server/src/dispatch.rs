//! Running a request: record it, run the handler on its own task, and send its outcome to
//! the request's output. A request runs to completion even if the client's connection drops;
//! only cancellation (or, in 2026-07-28, a closed response stream) stops it.

use std::sync::Arc;

use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, Request, RequestId, code};
use tether_core::lineage::{Digest, StreamName};
use tether_store::BeginRequest;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::context::{Context, FirstOutput, Output};
use crate::http::reject::{Rejection, rpc_error};
use crate::ids;
use crate::session::SessionRuntime;

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

/// The request's `_meta.progressToken`, if any.
fn progress_token(params: &Value) -> Option<Value> {
    params.get("_meta")?.get("progressToken").filter(|t| t.is_string() || t.is_number()).cloned()
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
    let (ctx, first) = Context::new(output, progress_token(&params), cancel.clone(), Arc::clone(&shared.store));
    let runtime = Arc::clone(runtime);
    let handler = Arc::clone(&shared.handler);
    tokio::spawn(async move {
        run(handler, ctx, request.id, request.method, params, cancel).await;
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
    let (ctx, first) = Context::new(output, progress_token(&params), cancel.clone(), Arc::clone(&shared.store));
    let handler = Arc::clone(&shared.handler);
    tokio::spawn(run(handler, ctx, request.id, request.method, params, cancel));
    first
}

async fn run(
    handler: Arc<dyn crate::Handler>,
    ctx: Context,
    id: RequestId,
    method: String,
    params: Value,
    cancel: CancellationToken,
) {
    let task = tokio::spawn(handler.call(ctx.clone(), method, params));
    let abort = task.abort_handle();
    let outcome = tokio::select! {
        joined = task => match joined {
            Ok(outcome) => Some(outcome),
            Err(err) if err.is_panic() => {
                tracing::error!("handler panicked");
                Some(Err(rpc_error(code::INTERNAL_ERROR, "handler_panicked", "the handler failed")))
            }
            Err(_) => None,
        },
        () = cancel.cancelled() => {
            abort.abort();
            None
        }
    };
    match outcome {
        Some(outcome) => {
            if let Err(err) = ctx.respond(id, outcome).await {
                tracing::debug!(%err, "final response not delivered");
            }
        }
        None => ctx.end_without_response().await,
    }
}
