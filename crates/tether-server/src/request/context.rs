//! What a handler gets for one request: a way to send notifications, progress and
//! server-to-client requests on the request's stream, and to notice cancellation.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tether_core::jsonrpc::{Message, Notification, Request, RequestId, Response};
use tether_core::lifecycle;
use tether_core::lineage::StreamName;
use tether_core::mcp::method;
use tether_core::tasks::TaskId;
use tether_core::trace_context::TraceContext;

use tether_store::{SessionEnd, Store, StoreError};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::refusal::Refusal;
use crate::session::{LogLevel, SessionRuntime};
use crate::tasks::TaskSlot;

use super::output::{First, FirstOutput, Output, Part, Sink};

/// Why a context operation did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// The request was cancelled, or its session ended.
    #[error("the request was cancelled")]
    Cancelled,
    /// The client is gone: its stream or session no longer exists.
    #[error("the request's stream is gone: {0}")]
    StreamGone(String),
    /// Server-to-client requests need a session (2026-07-28 has none).
    #[error("server-to-client requests need a session")]
    NoSession,
    /// The OS random source failed while the server minted an id.
    #[error("no id could be minted: {0}")]
    Random(String),
    /// The client did not answer a server-to-client request in time.
    #[error("the client did not answer in time")]
    TimedOut,
    /// The client answered with an error.
    #[error("the client answered with error {code}: {message}")]
    Client {
        /// The error code.
        code: i64,
        /// The error message.
        message: String,
    },
    /// The request could not become a task: as many run already as the server allows, in all or
    /// (`principal`) of the client's principal. Answer the request with
    /// [`ContextError::to_error`], or do the work without a task.
    #[error("as many tasks run as the server allows{}", if *principal { " for this client" } else { "" })]
    TooManyTasks {
        /// The principal's cap was reached, not the server's.
        principal: bool,
    },
}

impl ContextError {
    /// The JSON-RPC error that answers a request which failed with this error: `too_many_tasks`
    /// (HTTP 429 in 2026-07-28) for [`ContextError::TooManyTasks`], else an internal error.
    pub fn to_error(&self) -> tether_core::jsonrpc::ErrorObject {
        match self {
            ContextError::TooManyTasks { .. } => Refusal::TooManyTasks.error(self.to_string()),
            other => Refusal::ContextFailed.error(other.to_string()),
        }
    }
}

impl From<StoreError> for ContextError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::TooManyTasks { principal } => ContextError::TooManyTasks { principal },
            err => ContextError::StreamGone(err.to_string()),
        }
    }
}

/// What a request says about itself and its client.
#[derive(Debug, Clone)]
pub(crate) struct RequestMeta {
    /// `_meta.progressToken`.
    pub progress_token: Option<Value>,
    /// The client's declared capabilities (from `initialize`, or per request in 2026-07-28).
    pub client_capabilities: Value,
    /// 2026-07-28: the log level the request asked for; without one, no logs are sent.
    pub log_level: Option<LogLevel>,
    /// How long a server-to-client request waits for the client's answer.
    pub client_request_timeout: std::time::Duration,
    /// The store's name of the request's idempotency key, if it carries one.
    pub idempotency_key: Option<String>,
    /// Who the request authenticated as, if the server authenticates.
    pub principal: Option<String>,
}

/// What a 2026-07-28 request brings back from its earlier rounds (SEP-2322): the client's
/// answers to the input the handler asked for, and the handler's state, opened and checked.
#[derive(Debug, Clone, Default)]
pub(crate) struct Input {
    pub responses: serde_json::Map<String, Value>,
    pub state: Option<Value>,
}

/// A notification's bytes; `Value::Null` params are left out (a notification without params).
pub(crate) fn notification(method: &str, params: Value) -> Bytes {
    let params = (!params.is_null()).then_some(params);
    Bytes::from(Message::Notification(Notification { method: method.to_owned(), params }).to_vec())
}

/// `notifications/progress`, serialized straight from its fields: a streaming tool sends one
/// per step, and building its params as a `Value` first cost a map and its keys each time.
fn progress_notification(token: &Value, progress: f64, total: Option<f64>, message: Option<&str>) -> Bytes {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Params<'a> {
        progress_token: &'a Value,
        progress: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        total: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<&'a str>,
    }
    #[derive(serde::Serialize)]
    struct Envelope<'a> {
        jsonrpc: &'static str,
        method: &'static str,
        params: Params<'a>,
    }
    let params = Params { progress_token: token, progress: number(progress), total: total.map(number), message };
    let envelope = Envelope { jsonrpc: "2.0", method: method::PROGRESS, params };
    Bytes::from(
        serde_json::to_vec(&envelope)
            .expect("a notification serializes: every key is a string, every value a `Value` or a primitive"),
    )
}

/// Appends `message` to the session's standalone stream, wherever and whenever it was opened
/// (the store knows it); `false` if the client never opened one.
async fn append_standalone(store: &dyn Store, runtime: &SessionRuntime, message: Bytes) -> Result<bool, StoreError> {
    let Some(stream) = store.standalone_stream(&runtime.id).await? else { return Ok(false) };
    store.append(&runtime.id, &runtime.epoch, &stream, message, false).await?;
    crate::telemetry::events_appended(1);
    Ok(true)
}

/// The client that opened a session: what [`SessionHandle::client`] answers.
#[derive(Debug, Clone)]
pub struct SessionClient {
    /// Its `initialize` params (`protocolVersion`, `capabilities`, `clientInfo`).
    pub params: Value,
    /// Who it authenticated as, if the server authenticates.
    pub principal: Option<String>,
}

/// A session as this process serves it, for state a handler keeps per session (the rmcp
/// adapter runs one rmcp service per session): who the client is, a way to reach its standalone
/// stream outside any request, and the moment the process stops serving it.
#[derive(Clone)]
pub struct SessionHandle {
    server: Arc<crate::ServerState>,
    runtime: Arc<SessionRuntime>,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle").field("id", &self.runtime.id).finish_non_exhaustive()
    }
}

impl SessionHandle {
    pub(crate) fn new(server: Arc<crate::ServerState>, runtime: Arc<SessionRuntime>) -> SessionHandle {
        SessionHandle { server, runtime }
    }

    /// Whether both handles are of the same incarnation as this process serves it.
    pub fn same(&self, other: &SessionHandle) -> bool {
        Arc::ptr_eq(&self.runtime, &other.runtime)
    }

    /// The session id.
    pub fn id(&self) -> &str {
        self.runtime.id.as_str()
    }

    /// The session's incarnation: another incarnation under the same id is another session.
    pub fn epoch(&self) -> &tether_core::lineage::Epoch {
        &self.runtime.epoch
    }

    /// What this process keeps of the session.
    pub(crate) fn runtime(&self) -> &Arc<SessionRuntime> {
        &self.runtime
    }

    /// The server serving the session.
    pub(crate) fn server(&self) -> &Arc<crate::ServerState> {
        &self.server
    }

    /// The negotiated protocol version.
    pub fn protocol_version(&self) -> tether_core::mcp::ProtocolVersion {
        self.runtime.version
    }

    /// The client that opened the session, as the store keeps it (the process does not, to stay
    /// small per session): one read of the session's record.
    pub async fn client(&self) -> Result<SessionClient, ContextError> {
        match self.server.store.session(&self.runtime.id, crate::now_ms()).await? {
            tether_store::SessionStatus::Live(record) if record.epoch == self.runtime.epoch => {
                Ok(SessionClient { params: Arc::unwrap_or_clone(record.client), principal: record.principal })
            }
            _ => Err(ContextError::StreamGone("the session ended".into())),
        }
    }

    /// Appends a notification to the session's standalone (GET) stream. Returns `false` if the
    /// client never opened one, so there is nowhere to deliver it.
    pub async fn broadcast(&self, method: &str, params: Value) -> Result<bool, ContextError> {
        Ok(append_standalone(self.server.store.as_ref(), &self.runtime, notification(method, params)).await?)
    }

    /// Resolves once this process stops serving the session: it was deleted, it expired, or
    /// another incarnation replaced it. Per-session state should be dropped then.
    pub async fn ended(&self) {
        self.runtime.ended().await;
    }

    /// Ends the session on the server's side, as `why`: later requests naming it (on any
    /// replica) get 404 with `why`'s reason, so its client knows to start a new one. Requests
    /// still running get up to `grace` to finish first, so the outcome each one returns (an
    /// error saying why, typically) is recorded and delivered rather than cut off; whatever still
    /// runs after it is cancelled with the session. Ending a session that already ended, or was
    /// replaced by another incarnation, does nothing.
    pub async fn end(&self, why: SessionEnd, grace: Duration) {
        crate::session::service::end(&self.server, &self.runtime, why, grace).await;
    }
}

/// What every clone of one request's [`Context`] shares: where its output goes, its metadata, its
/// cancellation and the server.
struct RequestState {
    output: Sink,
    first: First,
    meta: RequestMeta,
    /// The current round's input: replaced between rounds when the server itself asks the
    /// client (sessions).
    input: Mutex<Input>,
    cancel: CancellationToken,
    /// The request was never recorded (the store found its id sent before): nothing of it is
    /// written, and its stream, never opened, is left alone.
    void: std::sync::atomic::AtomicBool,
    server: Arc<crate::ServerState>,
    /// A 2026-07-28 `tools/call` that may become a task ([`Context::escalate`]).
    task: Option<Arc<TaskSlot>>,
    /// The trace context the handler works in, set as its run starts.
    trace: std::sync::OnceLock<TraceContext>,
}

/// A JSON number, integral when the value is (progress counts are usually whole).
fn number(value: f64) -> Value {
    if value.fract() == 0.0 && value.abs() < 9.0e15 { json!(value as i64) } else { json!(value) }
}

/// The handler's view of one request. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    shared: Arc<RequestState>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("meta", &self.shared.meta).finish_non_exhaustive()
    }
}

impl Context {
    pub(crate) fn new(
        output: Output,
        meta: RequestMeta,
        input: Input,
        cancel: CancellationToken,
        server: Arc<crate::ServerState>,
        task: Option<Arc<TaskSlot>>,
    ) -> (Context, oneshot::Receiver<FirstOutput>) {
        let (first, rx) = First::new();
        let output = Sink::open(output, &first);
        let input = Mutex::new(input);
        let void = std::sync::atomic::AtomicBool::new(false);
        let trace = std::sync::OnceLock::new();
        let shared = RequestState { output, first, meta, input, cancel, void, server, task, trace };
        (Context { shared: Arc::new(shared) }, rx)
    }

    /// The context of a request another replica received and relayed to this process, which
    /// holds state the request runs on (a gateway's upstream instance): its output goes to the
    /// request's `stream` in the store, as any request's does, and so reaches the client through
    /// whichever replica it reads from. The stream is not this process's to end: the replica
    /// that received the request answers it there.
    pub(crate) fn relayed(
        session: &SessionHandle,
        stream: StreamName,
        progress_token: Option<Value>,
        cancel: CancellationToken,
    ) -> Context {
        let (server, runtime) = (Arc::clone(&session.server), Arc::clone(&session.runtime));
        let meta = RequestMeta {
            progress_token,
            client_capabilities: runtime.client_capabilities.clone(),
            log_level: None,
            client_request_timeout: server.config.client_request_timeout,
            idempotency_key: None,
            principal: None,
        };
        let output = Output::Stored { store: Arc::clone(&server.store), runtime, stream, ends_stream: false };
        // Nobody here waits to learn how the response starts: the receiving replica decides.
        Context::new(output, meta, Input::default(), cancel, server, None).0
    }

    /// The trace context the handler works in: its own span's when the server exports traces
    /// ([`trace`](crate::trace)), else the one the request carried (in `_meta`, or its HTTP
    /// `traceparent` header). A handler calling elsewhere passes it on
    /// ([`TraceContext::inject`]), so the callee's spans join the caller's trace.
    pub fn trace_context(&self) -> Option<&TraceContext> {
        self.shared.trace.get()
    }

    pub(crate) fn set_trace_context(&self, trace: TraceContext) {
        let _ = self.shared.trace.set(trace);
    }

    /// The protocol version the request speaks: its session's, or 2026-07-28 without one.
    pub(crate) fn protocol_version(&self) -> tether_core::mcp::ProtocolVersion {
        self.shared.output.session().map_or(tether_core::mcp::ProtocolVersion::LATEST, |runtime| runtime.version)
    }

    /// Who the request authenticated as (a token's subject), if the server authenticates; a
    /// request relayed from another replica has none here.
    pub fn principal(&self) -> Option<&str> {
        self.shared.meta.principal.as_deref()
    }

    /// The session the request runs in, if it has one.
    pub(crate) fn runtime(&self) -> Option<&Arc<SessionRuntime>> {
        self.shared.output.session()
    }

    /// The session id, in a session.
    pub fn session_id(&self) -> Option<&str> {
        self.shared.output.session().map(|runtime| runtime.id.as_str())
    }

    /// The session stream the request's output goes to, in a session.
    pub(crate) fn stream(&self) -> Option<&StreamName> {
        self.shared.output.stream()
    }

    /// The server the request runs in: its handler, for the server's own dispatch.
    pub(crate) fn server(&self) -> &Arc<crate::ServerState> {
        &self.shared.server
    }

    /// The store, for the server's own bookkeeping around a handler; never handed to one: the
    /// whole store would let a tool append to any stream or end any session, around the single
    /// writer the guarantees rely on.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.shared.server.store
    }

    /// Whether the request has a progress token, so progress notifications will be sent.
    pub fn has_progress_token(&self) -> bool {
        self.shared.meta.progress_token.is_some()
    }

    /// The request's `_meta.progressToken`, if it has one.
    pub fn progress_token(&self) -> Option<&Value> {
        self.shared.meta.progress_token.as_ref()
    }

    /// The request's idempotency key, made unique per principal, if the request carries one and
    /// the server offers the extension. A handler that records its effects under this key (as
    /// [`CounterStore::counter_add`](tether_store::CounterStore::counter_add) does) applies them at most once however often the request runs;
    /// register it with [`ToolSet::add_resumable`](crate::tools::ToolSet::add_resumable).
    pub fn idempotency_key(&self) -> Option<&str> {
        self.shared.meta.idempotency_key.as_deref()
    }

    /// The capabilities the client declared (`sampling`, `elicitation`, `roots`, ...).
    pub fn client_capabilities(&self) -> &Value {
        &self.shared.meta.client_capabilities
    }

    /// The client's answer to input request `key`, if this round of the request carries it
    /// (2026-07-28, SEP-2322): the handler asked for it by returning an
    /// [`InputRequired`](crate::InputRequired) in an earlier round. Always an object.
    pub fn input_response(&self, key: &str) -> Option<Value> {
        self.input().responses.get(key).cloned()
    }

    /// The state the handler returned with its last [`InputRequired`](crate::InputRequired), as
    /// it returned it: the server sealed it, and checked that it came back unchanged and for this
    /// request. `None` in a request's first round.
    pub fn request_state(&self) -> Option<Value> {
        self.input().state.clone()
    }

    fn input(&self) -> std::sync::MutexGuard<'_, Input> {
        // Plain data: still consistent after a panic elsewhere.
        self.shared.input.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts the next round of a request whose input the server asked for itself.
    pub(crate) fn next_round(&self, input: Input) {
        *self.input() = input;
    }

    /// Turns this request into a task (SEP-2663), if it may become one: a 2026-07-28 `tools/call`
    /// of a tool that supports tasks ([`Handler::task_support`](crate::Handler::task_support)),
    /// from a client that declares the extension. The task is recorded durably, the request is
    /// answered with its `CreateTaskResult`, and the handler runs on: what it returns becomes the
    /// task's outcome, and an input-required result asks for input through the task
    /// (`tasks/update`). Until then it may ask for input the ordinary way (an input-required
    /// result answers the request). Notifications sent after it are not delivered directly (the
    /// client polls `tasks/get` or follows `tasks/stream`), except as events of the task's stream.
    ///
    /// `Ok(true)`: the request is a task (also when it already was); `Ok(false)`: it cannot be one,
    /// so the handler should finish the work and return its result.
    pub async fn escalate(&self) -> Result<bool, ContextError> {
        let Some(slot) = &self.shared.task else { return Ok(false) };
        if slot.id().is_some() {
            return Ok(true);
        }
        let server = &self.shared.server;
        let key = self.shared.meta.idempotency_key.as_deref();
        let Some(mut created) = crate::tasks::create(server, slot, key).await? else {
            // Made a task meanwhile, or cancelled before it could become one.
            return if slot.id().is_some() { Ok(true) } else { Err(ContextError::Cancelled) };
        };
        tether_core::translate::stateless_result(method::TOOLS_CALL, &mut created, &server.server_info);
        let response = Message::Response(Response::result(slot.request_id.clone(), created)).to_vec();
        self.shared.output.answer_now(Bytes::from(response), &self.shared.first).await;
        Ok(true)
    }

    /// Records a notification the tool sent after its request became task `task` as an event of
    /// the task (its stream carries it).
    async fn record_in_task(&self, task: &TaskId, bytes: &[u8]) -> Result<(), ContextError> {
        let Ok(Message::Notification(notification)) = tether_core::jsonrpc::parse_message(bytes) else {
            return Ok(());
        };
        let change = tether_core::tasks::TaskChange::Notify {
            method: notification.method,
            params: notification.params.unwrap_or(Value::Null),
        };
        let server = &self.shared.server;
        server.task_runners.update(server.store.as_ref(), task, change).await?;
        Ok(())
    }

    /// This server's tasks run here.
    pub(crate) fn task_runners(&self) -> &crate::tasks::Runners {
        &self.shared.server.task_runners
    }

    /// Whether this request may become a task.
    pub(crate) fn may_become_task(&self) -> bool {
        self.shared.task.is_some()
    }

    /// The task this request became, if it did.
    pub(crate) fn task_id(&self) -> Option<&TaskId> {
        self.shared.task.as_ref().and_then(|slot| slot.id())
    }

    /// How often a task's run looks for changes no announcement told it of.
    pub(crate) fn task_poll_interval(&self) -> std::time::Duration {
        self.shared.server.config.task_poll_interval
    }

    /// Sends `notifications/progress` if the request asked for progress; otherwise does nothing.
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) -> Result<(), ContextError> {
        let Some(token) = &self.shared.meta.progress_token else { return Ok(()) };
        self.emit(progress_notification(token, progress, total, message), Part::Event).await
    }

    /// Sends `notifications/message` at `level`, unless the client asked for less: a session's
    /// level is set by `logging/setLevel`; a 2026-07-28 request gets logs only if it asked.
    pub async fn log(&self, level: LogLevel, data: Value) -> Result<(), ContextError> {
        let threshold = self.shared.output.log_threshold(self.shared.meta.log_level);
        if threshold.is_none_or(|threshold| level < threshold) {
            return Ok(());
        }
        self.notify(method::MESSAGE, json!({"level": level.as_str(), "data": data})).await
    }

    /// Sends a notification related to this request, on its stream (`Value::Null` params: none).
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), ContextError> {
        self.emit(notification(method, params), Part::Event).await
    }

    /// Sends a request to the client on this request's stream (sampling, elicitation, roots)
    /// and waits for the answer the client POSTs back (`Value::Null` params: none).
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, ContextError> {
        let Some(runtime) = self.shared.output.session() else { return Err(ContextError::NoSession) };
        let (id, answer) = runtime.register_client_request();
        let message = Message::Request(Request {
            id: RequestId::String(id.clone()),
            method: method.to_owned(),
            params: (!params.is_null()).then_some(params),
        });
        if let Err(err) = self.emit(Bytes::from(message.to_vec()), Part::Event).await {
            runtime.forget_client_request(&id);
            return Err(err);
        }
        tokio::select! {
            answer = answer => match answer {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(error)) => Err(ContextError::Client { code: error.code, message: error.message }),
                Err(_) => Err(ContextError::Cancelled),
            },
            () = self.shared.cancel.cancelled() => {
                runtime.forget_client_request(&id);
                Err(ContextError::Cancelled)
            }
            () = tokio::time::sleep(self.shared.meta.client_request_timeout) => {
                runtime.forget_client_request(&id);
                Err(ContextError::TimedOut)
            }
        }
    }

    /// Appends a notification to the session's standalone (GET) stream. Returns `false` if the
    /// client never opened one, so there is nowhere to deliver it.
    pub async fn broadcast(&self, method: &str, params: Value) -> Result<bool, ContextError> {
        self.session().ok_or(ContextError::NoSession)?.broadcast(method, params).await
    }

    /// The session the request belongs to, as a handle that outlives the request.
    pub fn session(&self) -> Option<SessionHandle> {
        let runtime = self.shared.output.session()?;
        Some(SessionHandle::new(Arc::clone(&self.shared.server), Arc::clone(runtime)))
    }

    /// Announces a server-wide notification (`list_changed`, `resources/updated`): appended to
    /// the standalone (GET) stream of every live session this process serves, and sent on every
    /// 2026-07-28 subscription (`subscriptions/listen`) that carries it: open here, or at another
    /// replica where the store relays announcements (Redis). Returns how many sessions had a
    /// standalone stream, plus how many subscriptions were open here. Sessions served only by
    /// other replicas are not reached.
    pub async fn notify_all(&self, method: &str, params: Value) -> Result<usize, ContextError> {
        let listening = self.shared.server.listeners.announce(method, params.clone());
        let store = self.shared.server.store.as_ref();
        let message = notification(method, params);
        if let Err(err) = store.announce(message.clone()).await {
            tracing::debug!(%err, "could not announce to the other replicas");
        }
        let sends = self.shared.server.sessions.all().into_iter().map(|runtime| {
            let message = message.clone();
            // A session that ended since it was listed has nothing left to deliver to.
            async move { append_standalone(store, &runtime, message).await.unwrap_or(false) }
        });
        // Concurrently, so a durable store commits them together.
        Ok(futures_util::future::join_all(sends).await.into_iter().filter(|sent| *sent).count() + listening)
    }

    /// Closes the client's connection to this request's stream without ending the stream
    /// (SEP-1699): the client resumes with `Last-Event-ID` after the announced `retry` delay.
    pub fn close_connection(&self) {
        if self.shared.output.close_connection() {
            self.signal(|| FirstOutput::Event);
        }
    }

    /// Resolves when the request is cancelled (by `notifications/cancelled`, by the session
    /// ending, or in 2026-07-28 by the client closing the response stream).
    pub async fn cancelled(&self) {
        self.shared.cancel.cancelled().await;
    }

    /// Whether the request has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancel.is_cancelled()
    }

    /// Answers the request as an event stream whatever comes first, for output written to its
    /// stream by another process (a relayed request's), which would otherwise miss a response
    /// that began as JSON.
    pub(crate) fn stream_response(&self) {
        self.signal(|| FirstOutput::Event);
    }

    /// Waits until everything sent so far is durable.
    pub(crate) async fn flush(&self) -> Result<(), ContextError> {
        self.shared.output.flush().await
    }

    /// Sends the request's final response (a serialized JSON-RPC response), answered with
    /// `status` on a 2026-07-28 connection. On a session stream with `record`, the store records
    /// it as the outcome of that idempotency key in the same step. Called once, by the
    /// dispatcher.
    pub(crate) async fn respond(
        &self,
        response: Bytes,
        status: http::StatusCode,
        record: Option<&str>,
    ) -> Result<(), ContextError> {
        self.emit(response, Part::Response { record, status }).await
    }

    /// Ends the request's stream as aborted, for a request whose response the stream will not
    /// get (it could not be written, or the request could not run): readers end it with a
    /// `request_aborted` notice and error instead of waiting. A batch's shared stream is
    /// aborted too: it can no longer carry every response, and the batch's end must not pass
    /// it off as complete.
    pub(crate) async fn abort_stream(&self) {
        self.signal(|| FirstOutput::Event);
        if self.is_void() {
            return;
        }
        // What the handler sent before goes in first; what could not be written is lost to
        // the stream either way, and the abort that follows tells its readers so.
        if let Err(err) = self.flush().await {
            tracing::warn!(
                %err,
                session = self.session_id().unwrap_or_default(),
                stream = self.stream().map(StreamName::as_str).unwrap_or_default(),
                "a request's output before its abort could not all be written"
            );
        }
        self.shared.output.abort().await;
    }

    /// Sends `bytes`, `part` of the request's output. Once the request is cancelled only its
    /// response goes out: the one terminal event its stream must get.
    async fn emit(&self, bytes: Bytes, part: Part<'_>) -> Result<(), ContextError> {
        let cancelled = self.shared.cancel.is_cancelled();
        let last = matches!(part, Part::Response { .. });
        if lifecycle::emit(cancelled, last) == lifecycle::Emit::Refuse || self.is_void() {
            return Err(ContextError::Cancelled);
        }
        if let Some(task) = self.task_id() {
            // The request was answered with its task: what the tool sends now is the task's.
            return self.record_in_task(task, &bytes).await;
        }
        self.shared.output.send(bytes, part, &self.shared.first).await
    }

    /// Marks the request as never recorded (see `RequestState::void`); it is cancelled too.
    pub(crate) fn void(&self) {
        self.shared.void.store(true, std::sync::atomic::Ordering::Release);
        self.shared.cancel.cancel();
    }

    fn is_void(&self) -> bool {
        self.shared.void.load(std::sync::atomic::Ordering::Acquire)
    }

    fn signal(&self, first: impl FnOnce() -> FirstOutput) {
        self.shared.first.signal(first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_notification_holds_exactly_the_fields_given() {
        let parsed = |bytes: Bytes| serde_json::from_slice::<Value>(&bytes).expect("JSON");
        assert_eq!(
            parsed(progress_notification(&json!("t"), 3.0, None, None)),
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": 3}})
        );
        assert_eq!(
            parsed(progress_notification(&json!(7), 0.5, Some(10.0), Some("half"))),
            json!({
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": 7, "progress": 0.5, "total": 10, "message": "half"}
            })
        );
    }
}
