//! POST in the sessionful era: `initialize`, requests, notifications and answers to the server's
//! requests, within a session.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tether_core::jsonrpc::{self, Message, Notification, Request, RequestId};
use tether_core::mcp::{ProtocolVersion, meta, method};
use tether_core::methods::{self, ServedBy};
use tether_store::{RelayedAnswer, RequestRecord, SessionRecord};
use tokio::sync::oneshot;

use super::sse::Connection;
use super::{accepted, check_load, guard, json_response, live_session, read_body, session_headers, sse};
use crate::auth::Identity;
use crate::refusal::{self, Refusal, Rejection};
use crate::request::context::SessionHandle;
use crate::request::dispatch::{self, Running, StartedSessionful};
use crate::request::output::FirstOutput;
use crate::session::{LogLevel, SessionRuntime, service};
use crate::{ServerState, ids, now_ms};
use tether_store::RequestKey;

pub(crate) async fn post(
    shared: &Arc<ServerState>,
    headers: &HeaderMap,
    body: Body,
    caller: Option<Identity>,
) -> Result<Response, Rejection> {
    guard::post_media(headers)?;
    let bytes = read_body(body, &shared.config).await?;
    let parsed = jsonrpc::parse_body(&bytes).map_err(|e| refusal::unparsable(&e))?;
    let requests = match &parsed {
        jsonrpc::Body::Single(message) => std::slice::from_ref(message),
        jsonrpc::Body::Batch(messages) => messages.as_slice(),
    };
    // Before anything of the body is acted on: a batch is refused whole.
    for message in requests {
        if let Message::Request(request) = message {
            guard::authorize(shared.auth.as_deref(), caller.as_ref(), request)?;
        }
    }
    let principal = caller.map(|caller| caller.principal);
    let (messages, batch) = match parsed {
        jsonrpc::Body::Single(Message::Request(request)) if request.method == method::INITIALIZE => {
            shared.drain.admit()?;
            return initialize(shared, request, principal).await;
        }
        jsonrpc::Body::Single(message) => (vec![message], false),
        jsonrpc::Body::Batch(messages) => {
            if messages.iter().any(|m| m.method() == Some(method::INITIALIZE)) {
                return Err(Refusal::InitializeInBatch.with("initialize must not be part of a batch"));
            }
            (messages, true)
        }
    };
    let record = live_session(shared, headers, principal.as_deref()).await?;
    let runtime = service::serve(shared, &record).await?;
    if batch && !runtime.version.allows_batches() {
        return Err(Refusal::BatchNotAllowed.with(format!(
            "JSON-RPC batches are only accepted in 2025-03-26 sessions; this one is {}",
            runtime.version
        )));
    }
    let mut requests = Vec::new();
    for message in messages {
        match message {
            Message::Request(mut request) => {
                crate::trace::adopt_header(headers, &mut request);
                requests.push(request);
            }
            Message::Notification(notification) => notify(shared, &runtime, notification),
            Message::Response(response) => answer(shared, &runtime, response).await,
        }
    }
    if batch && !requests.is_empty() {
        return respond_batch(shared, &runtime, principal.as_deref(), requests).await;
    }
    match requests.pop() {
        // Not a batch: its one message.
        Some(request) => respond(shared, &runtime, principal.as_deref(), request).await,
        None => Ok(accepted(session_headers(&runtime.id, &runtime.epoch))),
    }
}

/// `initialize`: a new session with a fresh incarnation, whatever session header came with it.
async fn initialize(
    shared: &Arc<ServerState>,
    request: Request,
    principal: Option<String>,
) -> Result<Response, Rejection> {
    let params = request.params.unwrap_or_else(|| json!({}));
    let requested =
        params.get("protocolVersion").and_then(Value::as_str).and_then(|v| v.parse::<ProtocolVersion>().ok());
    let version = match requested {
        Some(v @ (ProtocolVersion::V2025_03_26 | ProtocolVersion::V2025_06_18 | ProtocolVersion::V2025_11_25)) => v,
        _ => ProtocolVersion::LATEST_SESSIONFUL,
    };
    let random = |e: crate::ids::RandomError| Refusal::RandomFailed.with(e.to_string());
    let now = now_ms();
    let ttl = u64::try_from(shared.config.session_idle_ttl.as_millis()).unwrap_or(u64::MAX);
    let record = SessionRecord {
        id: ids::session_id().map_err(random)?,
        epoch: ids::epoch().map_err(random)?,
        principal,
        protocol_version: version,
        client: Arc::new(params),
        idle_ttl_ms: ttl,
        expires_at_ms: now.saturating_add(ttl),
    };
    let runtime = service::begin(shared, &record).await.map_err(Rejection::from)?;
    let info = shared.handler.info();
    let mut capabilities = info.capabilities;
    let lineage = json!({"version": 1, "epoch": record.epoch.as_str()});
    tether_core::mcp::set_experimental(&mut capabilities, meta::LINEAGE_CAPABILITY, lineage);
    capabilities["logging"] = json!({});
    crate::request::idempotency::advertise(shared, &mut capabilities).await.map_err(Rejection::from)?;
    let mut result = json!({
        "protocolVersion": version.as_str(),
        "capabilities": capabilities,
        "serverInfo": shared.server_info,
    });
    if let Some(instructions) = info.instructions {
        result["instructions"] = json!(instructions);
    }
    let body = Message::Response(jsonrpc::Response::result(request.id, result)).to_vec();
    tracing::debug!(session = %record.id, %version, "session created");
    Ok(json_response(StatusCode::OK, body, session_headers(&runtime.id, &runtime.epoch)))
}

/// A client notification: tether acts on cancellations and the end of the handshake; the
/// handler hears the rest.
fn notify(shared: &Arc<ServerState>, runtime: &Arc<SessionRuntime>, notification: Notification) {
    match notification.method.as_str() {
        method::CANCELLED => {
            // Invalid cancellations are ignored, as the spec asks.
            let key = notification.params.as_ref().and_then(|p| p.get("requestId")).and_then(RequestKey::cancelled);
            if let Some(key) = key {
                runtime.cancel_request(&key);
            }
        }
        method::INITIALIZED => {}
        other => {
            let session = SessionHandle::new(Arc::clone(shared), Arc::clone(runtime));
            shared.handler.notified(session, other, notification.params.unwrap_or(Value::Null));
        }
    }
}

/// Hands the client's answer to the handler waiting for it: here, or on another replica.
async fn answer(shared: &ServerState, runtime: &SessionRuntime, response: jsonrpc::Response) {
    let Some(RequestId::String(id)) = response.id.clone() else { return };
    let Err(outcome) = runtime.answer_client_request(&id, response.outcome) else { return };
    let response = Message::Response(jsonrpc::Response { id: Some(RequestId::String(id.clone())), outcome }).to_vec();
    let relayed = RelayedAnswer { session: runtime.id.clone(), request_id: id.clone(), response: response.into() };
    match shared.store.relay_answer(relayed).await {
        Ok(true) => {}
        Ok(false) => tracing::debug!(%id, "answer to an unknown or finished server request"),
        Err(err) => tracing::warn!(%err, session = %runtime.id, %id, "could not relay an answer to another replica"),
    }
}

/// Answers one request: inline for protocol methods, else JSON if its result came first, SSE
/// if anything came before it.
async fn respond(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    request: Request,
) -> Result<Response, Rejection> {
    let headers = session_headers(&runtime.id, &runtime.epoch);
    if let Some(outcome) = protocol_method(runtime, &request) {
        let body = Message::Response(jsonrpc::Response { id: Some(request.id), outcome }).to_vec();
        return Ok(json_response(StatusCode::OK, body, headers));
    }
    check_load(shared, runtime, 1)?;
    // Counted from here, not only once it runs: a drain that found nothing running while the
    // request was being recorded would let the process exit under its start.
    let _starting = shared.drain.start();
    let id = request.id.clone();
    let (stream, claimed) = match dispatch::start_sessionful(shared, runtime, principal, request).await? {
        // A keyed request is answered at once, as a stream: the client holds its claim before
        // the tool runs long, and can show it should it have to send the request again.
        StartedSessionful::Running(Running { stream, claimed: Some(claimed), .. }) => (stream, Some(claimed)),
        StartedSessionful::Running(Running { stream, first, claimed: None, .. }) => match first.await {
            Ok(FirstOutput::Final(answer)) => return Ok(json_response(StatusCode::OK, answer.bytes, headers)),
            Ok(FirstOutput::Event) | Err(_) => (stream, None),
        },
        // From its start, by the one rule: what is retained, the result included, and what is
        // gone said once (an ended request none of whose events is retained gets its error).
        StartedSessionful::Attach { stream } => (stream, None),
        StartedSessionful::Conflict(error) => {
            let body = Message::Response(jsonrpc::Response::error(Some(id), error)).to_vec();
            return Ok(json_response(StatusCode::OK, body, headers));
        }
    };
    let attachment = runtime.attach(&stream);
    let connection = Connection::fresh(shared, Arc::clone(runtime), stream, attachment);
    Ok(sse::response(connection.into_body(), headers.into_iter().chain(claimed.as_ref().map(sse::claim_header))))
}

/// Ends a batch's stream once every request of it that started has its outcome there: when
/// dropped, whether the batch's POST finished or its connection went away while it started them.
struct BatchEnd {
    store: Arc<dyn tether_store::Store>,
    runtime: Arc<SessionRuntime>,
    stream: tether_core::lineage::StreamName,
    tasks: Vec<crate::request::eager::Started<()>>,
}

impl Drop for BatchEnd {
    fn drop(&mut self) {
        let (store, runtime, stream) = (Arc::clone(&self.store), Arc::clone(&self.runtime), self.stream.clone());
        let tasks = std::mem::take(&mut self.tasks);
        tokio::spawn(async move {
            for task in tasks {
                let _ = task.join().await;
            }
            let ended = crate::persist::until_stored("the end of a batch's stream", || {
                store.end_stream(&runtime.id, &runtime.epoch, &stream)
            })
            .await;
            if let Err(err) = ended {
                tracing::debug!(%err, "ending a batch's stream");
            }
        });
    }
}

/// How a batch's request started: the receiver of its first output's kind, the error that
/// answers it instead, or why it could not start.
type MemberStart = Result<Result<oneshot::Receiver<FirstOutput>, jsonrpc::ErrorObject>, dispatch::DispatchError>;

/// Starts a request of a batch on the batch's `stream` in a task of its own, which lasts until
/// the request's outcome is stored, whatever happens to the POST meanwhile. Returns that task,
/// for the batch to wait for before it ends the stream, and how the request started.
fn start_member(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    request: Request,
    stream: &tether_core::lineage::StreamName,
) -> (crate::request::eager::Started<()>, oneshot::Receiver<MemberStart>) {
    let (tx, rx) = oneshot::channel();
    let (shared, runtime, principal, stream) =
        (Arc::clone(shared), Arc::clone(runtime), principal.map(str::to_owned), stream.clone());
    let member = tokio::spawn(async move {
        match dispatch::start_in_batch(&shared, &runtime, principal.as_deref(), request, &stream).await {
            Ok(Ok(Running { first, task, .. })) => {
                let _ = tx.send(Ok(Ok(first)));
                let _ = task.join().await;
            }
            Ok(Err(error)) => drop(tx.send(Ok(Err(error)))),
            Err(err) => drop(tx.send(Err(err))),
        }
    });
    (crate::request::eager::Started::Spawned(member), rx)
}

/// Requests the protocol layer answers itself (`initialize` is answered before a session exists).
fn protocol_method(runtime: &SessionRuntime, request: &Request) -> Option<Result<Value, jsonrpc::ErrorObject>> {
    if methods::served_by(&request.method) != ServedBy::Protocol {
        return None;
    }
    match request.method.as_str() {
        method::PING => Some(Ok(json!({}))),
        "logging/setLevel" => {
            let level = request.params.as_ref().and_then(|p| p.get("level")).and_then(Value::as_str);
            Some(match level.and_then(LogLevel::parse) {
                Some(level) => {
                    runtime.set_log_level(level);
                    Ok(json!({}))
                }
                None => Err(Refusal::InvalidLogLevel.error("params.level must be a log level")),
            })
        }
        _ => None,
    }
}

/// A 2025-03-26 batch: every request runs on one stream of the batch's, so one cursor resumes
/// all of it. The answer is the array of their responses if each request's first output was
/// its response; else the batch's stream as SSE, with every notification and every response.
async fn respond_batch(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    requests: Vec<Request>,
) -> Result<Response, Rejection> {
    let running = requests.iter().filter(|r| methods::served_by(&r.method) != ServedBy::Protocol).count();
    check_load(shared, runtime, running.max(1))?;
    // As a single request's: counted for the drain from here, not only once each runs.
    let _starting = shared.drain.start();
    let stream = ids::stream_name('b').map_err(|e| Refusal::RandomFailed.with(e.to_string()))?;
    let ids: Vec<RequestId> = requests.iter().map(|r| r.id.clone()).collect();
    let key = RequestKey::Batch { stream: stream.clone(), ids };
    let stored_key = key.encode();
    let store = &shared.store;
    let record = RequestRecord {
        session: &runtime.id,
        epoch: &runtime.epoch,
        key: &key,
        params_digest: &stored_key,
        stream: &stream,
    };
    store.begin_request(record).await.map_err(Rejection::from)?;
    // Each request's response, once known; its place in the batch for the ones still running.
    let mut answers: Vec<Option<Bytes>> = vec![None; requests.len()];
    let mut firsts = tokio::task::JoinSet::new();
    let mut ending =
        BatchEnd { store: Arc::clone(store), runtime: Arc::clone(runtime), stream: stream.clone(), tasks: Vec::new() };
    let mut started = Ok(());
    for (place, request) in requests.into_iter().enumerate() {
        let id = request.id.clone();
        let outcome = match protocol_method(runtime, &request) {
            Some(outcome) => outcome,
            None => {
                let (member, first) = start_member(shared, runtime, principal, request, &stream);
                // The batch's end waits for it from before it starts: a POST that goes away while
                // its request starts leaves the stream open until that request's outcome is in it.
                ending.tasks.push(member);
                match first.await {
                    Ok(Ok(Ok(first))) => {
                        firsts.spawn(async move { (place, first.await) });
                        continue;
                    }
                    Ok(Ok(Err(error))) => Err(error),
                    Ok(Err(err)) => {
                        started = Err(Rejection::from(err));
                        break;
                    }
                    Err(_) => {
                        started = Err(Refusal::StartFailed.with("a request of the batch stopped as it started"));
                        break;
                    }
                }
            }
        };
        let response = Bytes::from(Message::Response(jsonrpc::Response { id: Some(id), outcome }).to_vec());
        if let Err(err) = store.append(&runtime.id, &runtime.epoch, &stream, response.clone(), false).await {
            started = Err(Rejection::from(err));
            break;
        }
        answers[place] = Some(response);
    }
    drop(ending);
    started?;
    let mut streamed = false;
    while let Some(first) = firsts.join_next().await {
        match first {
            Ok((place, Ok(FirstOutput::Final(answer)))) => answers[place] = Some(answer.bytes),
            _ => {
                streamed = true;
                break;
            }
        }
    }
    let headers = session_headers(&runtime.id, &runtime.epoch);
    if streamed {
        let attachment = runtime.attach(&stream);
        let connection = Connection::fresh(shared, Arc::clone(runtime), stream, attachment);
        return Ok(sse::response(connection.into_body(), headers));
    }
    let mut body = b"[".to_vec();
    for (i, response) in answers.iter().flatten().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(response);
    }
    body.push(b']');
    Ok(json_response(StatusCode::OK, body, headers))
}
