//! tether's client as a link that carries JSON-RPC messages, for whatever speaks MCP as a
//! stream of messages to a server: an rmcp client (`tether_client::rmcp`), a stdio client
//! bridged by `tether connect`, a gateway's upstream. It gains divergence detection, exact
//! resumption and, where the server offers them, idempotency keys, without changing what it
//! sends.
//!
//! The application's `initialize` connects a tether [`Client`] with the application's name,
//! protocol version and capabilities, and is answered with the server's own answer; a
//! 2026-07-28 application, which has no handshake, connects it with its first `server/discover`
//! or, when it skips discovery, its first request (what their `_meta` declares). A request
//! without that envelope sent before any handshake is answered at once with reason
//! `not_initialized`; a handshake that fails leaves the link unconnected, to be tried again.
//!
//! The application and the server need not speak the same era ([`tether_core::translate`]):
//! a 2026-07-28 application's requests to a server of the handshake era go in a session without
//! their envelope, its discovery is answered from the session's `initialize` result, and its
//! results are marked complete; a handshake-era application is answered in the revision it
//! asked for by a server of 2026-07-28 only, whose input rounds reach it as the server's
//! requests. A 2026-07-28 application runs its own input rounds. From then
//! on its requests are tether requests (so a `tools/call` carries an idempotency key and is
//! re-issued until its real outcome arrives, when the server offers it); notifications from
//! every stream reach the application once each, in order, after validation; the server's
//! requests go to the application under ids of the link's own, and its answers back to the
//! server. What tether itself observes (resumes, divergences, re-initializations, re-issues)
//! arrives on a receiver of its own. A request whose outcome is lost ends in an error with
//! reason `outcome_unknown`, never in silence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, Message, Notification, Request, RequestId, Response, code};
use tether_core::mcp::{self, Era, ProtocolVersion, method};
use tether_core::translate;
use tokio::sync::{OnceCell, mpsc, oneshot};

use crate::client::Input;
use crate::{Client, ClientConfig, ClientEvent, HookFuture, RequestError, ServerRequests};

/// The server's requests waiting for the application's answer, by the id the application saw.
type Answers = Arc<Mutex<HashMap<i64, oneshot::Sender<Result<Value, ErrorObject>>>>>;

/// The application's requests in flight by the id of each of their attempts, so that what the
/// server sends on an attempt's stream reaches the application as that request's.
type Origins = Arc<Mutex<HashMap<RequestId, RequestId>>>;

/// A message the server sent the application.
#[derive(Debug)]
pub struct FromServer {
    /// The message.
    pub message: Message,
    /// The application's request whose stream carried it, if one did (a request's progress,
    /// logs and questions travel on its stream).
    pub origin: Option<RequestId>,
}

/// A message link over a tether [`Client`]: what the application sends goes in through
/// [`MessageLink::send`]; what the server sends it comes out of the receiver
/// [`MessageLink::new`] returns.
pub struct MessageLink {
    /// Until the application's handshake connects the client; put back if it fails, so the
    /// application may try again.
    unconnected: Arc<Mutex<Option<Unconnected>>>,
    requests: Requests,
    events: mpsc::UnboundedSender<ClientEvent>,
    answers: Answers,
}

/// What connecting the client takes.
struct Unconnected {
    config: ClientConfig,
    /// The pump's end of the requests' queue: the pump starts once the client is connected.
    pump_rx: mpsc::UnboundedReceiver<Message>,
}

/// What runs the application's requests once the client is connected.
#[derive(Clone)]
struct Requests {
    client: Arc<OnceCell<Client>>,
    /// The revision the application speaks, from its handshake on.
    app: Arc<OnceLock<ProtocolVersion>>,
    to_app: mpsc::UnboundedSender<FromServer>,
    /// Responses to the application's requests and the server's requests, handed over by the
    /// pump behind the notifications that preceded them on their streams.
    to_pump: mpsc::UnboundedSender<Message>,
    origins: Origins,
    /// The application's requests in flight, so it can cancel them.
    running: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
}

impl std::fmt::Debug for MessageLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageLink").finish_non_exhaustive()
    }
}

/// The link is closed, or was never connected.
#[derive(Debug, thiserror::Error)]
#[error("the tether client is not connected")]
pub struct NotConnected;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Maps of handles only: still consistent after a panic elsewhere.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MessageLink {
    /// A link that connects with `config` when the application initializes (its hooks, name
    /// and protocol version give way to the application's). Returns it with the receiver of
    /// what the server sends the application and the receiver of what tether observes about the
    /// connection: every [`ClientEvent`] except messages, which go to the application.
    pub fn new(
        config: ClientConfig,
    ) -> (MessageLink, mpsc::UnboundedReceiver<FromServer>, mpsc::UnboundedReceiver<ClientEvent>) {
        let (to_app, from_server) = mpsc::unbounded_channel();
        let (events, events_rx) = mpsc::unbounded_channel();
        let (to_pump, pump_rx) = mpsc::unbounded_channel();
        let requests = Requests {
            client: Arc::default(),
            app: Arc::default(),
            to_app,
            to_pump,
            origins: Origins::default(),
            running: Arc::default(),
        };
        let link = MessageLink {
            unconnected: Arc::new(Mutex::new(Some(Unconnected { config, pump_rx }))),
            requests,
            events,
            answers: Answers::default(),
        };
        (link, from_server, events_rx)
    }

    /// The tether client, once the application has initialized.
    pub fn client(&self) -> Option<Client> {
        self.requests.client.get().cloned()
    }

    /// Whether the application's handshake has yet to connect the client.
    fn connecting(&self) -> bool {
        lock(&self.unconnected).is_some()
    }
}

/// What a message the application sends still has to wait for.
enum Waits {
    Nothing,
    /// The client connecting for the application's handshake, then what follows it.
    Connect(BoxedWait),
    Notify(Option<Client>, Notification),
}

type BoxedWait = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Hands `message` to the application; a dropped receiver means it has stopped, and nothing is
/// waiting.
fn deliver(app: &mpsc::UnboundedSender<FromServer>, message: Message, origin: Option<RequestId>) {
    let _ = app.send(FromServer { message, origin });
}

/// How a tether request's failure reaches the application.
fn request_error(error: RequestError) -> ErrorObject {
    let (reason, message) = match error {
        RequestError::Rpc(error) | RequestError::Aborted(error) => return error,
        RequestError::OutcomeUnknown(why) => ("outcome_unknown", format!("outcome unknown: {why}")),
        RequestError::NotExecuted(why) => ("not_executed", format!("not executed: {why}")),
        RequestError::Cancelled => ("cancelled", "the response stream broke; the request was cancelled".into()),
        RequestError::CancelledByCaller => ("cancelled", "cancelled by the client".into()),
        RequestError::Client(error) => ("client_error", error.to_string()),
    };
    ErrorObject::with_reason(-32000, message, reason)
}

/// Answers the server's requests through the application.
struct AppHooks {
    capabilities: Value,
    to_pump: mpsc::UnboundedSender<Message>,
    answers: Answers,
    next_id: std::sync::atomic::AtomicI64,
}

impl ServerRequests for AppHooks {
    fn capabilities(&self) -> Value {
        self.capabilities.clone()
    }

    fn answer(&self, method: &str, params: Value) -> HookFuture {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.answers).insert(id, tx);
        let request =
            Message::Request(Request { id: RequestId::Number(id), method: method.to_owned(), params: Some(params) });
        // The pump is gone only when the client is; the answer then never comes.
        let _ = self.to_pump.send(request);
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(ErrorObject::with_reason(code::INTERNAL_ERROR, "the application stopped", "client_stopped"))
            })
        })
    }
}

impl MessageLink {
    /// Connects the client as the application's handshake (`params`) declares it, starting the
    /// pump; resolves to the server's answer in the application's revision. A handshake that
    /// fails leaves the link as it was, for the application to try again.
    fn connect(&mut self, params: &Value) -> impl Future<Output = Result<Value, ErrorObject>> + Send + 'static {
        let hello = Hello::of(params);
        let unconnected = lock(&self.unconnected).take().map(|Unconnected { mut config, pump_rx }| {
            if let Some(name) = &hello.name {
                config.name = name.clone();
            }
            if let Some(version) = hello.version {
                config.protocol_version = version;
            }
            config.hooks = Arc::new(AppHooks {
                capabilities: hello.capabilities.clone(),
                to_pump: self.requests.to_pump.clone(),
                answers: Arc::clone(&self.answers),
                next_id: std::sync::atomic::AtomicI64::new(1),
            });
            Unconnected { config, pump_rx }
        });
        let (requests, events) = (self.requests.clone(), self.events.clone());
        // Put back unless connected: a failed handshake, or one whose wait was dropped.
        let mut pending = Pending { slot: Arc::clone(&self.unconnected), unconnected };
        async move {
            let Some(config) = pending.unconnected.as_ref().map(|u| u.config.clone()) else {
                return Err(ErrorObject::with_reason(code::INVALID_REQUEST, "already initialized", "initialized"));
            };
            let (client, client_events) = Client::connect(config)
                .await
                .map_err(|err| ErrorObject::with_reason(code::INTERNAL_ERROR, err.to_string(), "connect_failed"))?;
            if let Some(Unconnected { pump_rx, .. }) = pending.unconnected.take() {
                let to_app = requests.to_app.clone();
                tokio::spawn(pump(client_events, pump_rx, to_app, events, Arc::clone(&requests.origins)));
            }
            client.follow_standalone().await;
            let server = client.server();
            let _ = requests.app.set(hello.speaks);
            let answer = match (hello.speaks.era(), client.is_stateless()) {
                (Era::Stateless, false) => translate::discover_result(&server),
                (Era::Sessionful, true) => translate::initialize_result(&server, hello.speaks),
                _ => server,
            };
            let _ = requests.client.set(client);
            Ok(answer)
        }
    }
}

/// What connecting takes, while a handshake connects: given back to the link when dropped
/// unconnected.
struct Pending {
    slot: Arc<Mutex<Option<Unconnected>>>,
    unconnected: Option<Unconnected>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(unconnected) = self.unconnected.take() {
            *lock(&self.slot) = Some(unconnected);
        }
    }
}

/// What an application's handshake says of it: an `initialize`'s params, or the `_meta` of a
/// 2026-07-28 request (its `server/discover`, or its first request when it skips discovery).
struct Hello {
    name: Option<String>,
    /// The revision the client is to speak, if the application named one tether speaks.
    version: Option<ProtocolVersion>,
    /// The revision the application speaks: what it named, else the newest of its era.
    speaks: ProtocolVersion,
    capabilities: Value,
}

impl Hello {
    fn of(params: &Value) -> Hello {
        if let Some(meta) = stateless_envelope(params) {
            let version = meta
                .get(mcp::meta::PROTOCOL_VERSION)
                .and_then(Value::as_str)
                .and_then(|v| v.parse().ok())
                .filter(|version: &ProtocolVersion| version.era() == Era::Stateless);
            return Hello {
                name: meta
                    .get(mcp::meta::CLIENT_INFO)
                    .and_then(|info| info.get("name"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                version,
                speaks: version.unwrap_or(ProtocolVersion::LATEST),
                capabilities: meta.get(mcp::meta::CLIENT_CAPABILITIES).cloned().unwrap_or_else(|| json!({})),
            };
        }
        let version = params
            .get("protocolVersion")
            .and_then(Value::as_str)
            .and_then(|v| v.parse().ok())
            .filter(|version: &ProtocolVersion| version.era() == Era::Sessionful);
        Hello {
            name: params.pointer("/clientInfo/name").and_then(Value::as_str).map(str::to_owned),
            version,
            speaks: version.unwrap_or(ProtocolVersion::LATEST_SESSIONFUL),
            capabilities: params.get("capabilities").cloned().unwrap_or_else(|| json!({})),
        }
    }
}

/// The `_meta` of a request that carries the 2026-07-28 envelope.
fn stateless_envelope(params: &Value) -> Option<&Value> {
    params.get("_meta").filter(|meta| meta.get(mcp::meta::PROTOCOL_VERSION).is_some())
}

/// Hands the application the client's notifications (acknowledging them once handed over),
/// the outcomes of its requests and the server's requests, in the order the server sent them; passes
/// everything else tether observes to the application.
async fn pump(
    mut client_events: mpsc::UnboundedReceiver<ClientEvent>,
    mut queued: mpsc::UnboundedReceiver<Message>,
    to_app: mpsc::UnboundedSender<FromServer>,
    events: mpsc::UnboundedSender<ClientEvent>,
    origins: Origins,
) {
    let handle = |event: ClientEvent| match event {
        ClientEvent::Message { message: message @ Message::Notification(_), origin, ack, .. } => {
            let origin = origin.and_then(|attempt| lock(&origins).get(&attempt).cloned());
            deliver(&to_app, message, origin);
            ack.done();
        }
        // Server requests are answered through the hooks.
        ClientEvent::Message { ack, .. } => ack.done(),
        other => drop(events.send(other)),
    };
    loop {
        tokio::select! {
            biased;
            event = client_events.recv() => match event {
                Some(event) => handle(event),
                None => return,
            },
            message = queued.recv() => {
                let Some(message) = message else { return };
                // The client emitted what preceded a response or a server request on its stream
                // before it resolved the request or asked the hooks: all of it is queued by
                // now, and goes first.
                while let Ok(event) = client_events.try_recv() {
                    handle(event);
                }
                // Everything its attempts' streams carried went first: they are forgotten.
                if let Message::Response(Response { id: Some(id), .. }) = &message {
                    lock(&origins).retain(|_, app_id| app_id != id);
                }
                deliver(&to_app, message, None);
            }
        }
    }
}

impl Requests {
    /// Sends one of the application's requests; its outcome reaches it through the pump. Its
    /// `notifications/cancelled` cancels the request on the server, and it gets no answer. A
    /// 2026-07-28 application's request to a server of the handshake era goes without its
    /// envelope, in the session, and its result comes back marked complete; its
    /// `server/discover` is answered here, from the session's `initialize` result. Every result a
    /// 2026-07-28 application gets says what that revision's results say.
    fn start(&self, request: Request) {
        let key = request.id.to_value().to_string();
        let (to_pump, running) = (self.to_pump.clone(), Arc::clone(&self.running));
        let Some(client) = self.client.get().cloned() else {
            // The pump starts with the handshake: this answer goes to the application directly.
            let why = "the link is not connected yet: send initialize (or, at 2026-07-28, server/discover) first";
            let error = ErrorObject::with_reason(code::INTERNAL_ERROR, why, "not_initialized");
            deliver(&self.to_app, Message::Response(Response { id: Some(request.id), outcome: Err(error) }), None);
            return;
        };
        let modern_app = self.app.get().is_some_and(|app| app.era() == Era::Stateless);
        let translated = modern_app && !client.is_stateless();
        // A 2026-07-28 application runs its own input rounds; one of the handshake era answers
        // the server's requests instead, which the hooks turn into rounds.
        let input = if modern_app { Input::Caller } else { Input::Hooks };
        if translated && request.method == method::SERVER_DISCOVER {
            let outcome = Ok(translate::discover_result(&client.server()));
            let _ = to_pump.send(Message::Response(Response { id: Some(request.id), outcome }));
            return;
        }
        let (cancel, cancelled) = oneshot::channel::<()>();
        lock(&self.running).insert(key.clone(), cancel);
        let origins = Arc::clone(&self.origins);
        tokio::spawn(async move {
            let mut params = request.params.unwrap_or(Value::Null);
            if translated {
                translate::strip_envelope(&mut params);
            }
            // A dropped sender (the transport closed) cancels too.
            let cancelled = async move { drop(cancelled.await) };
            let (app_id, attempts) = (request.id.clone(), Arc::clone(&origins));
            let on_attempt = Box::new(move |attempt: &RequestId| {
                tracing::debug!(request = %app_id, %attempt, "sending the application's request");
                lock(&attempts).insert(attempt.clone(), app_id.clone());
            });
            let outcome = client.request_traced(&request.method, params, cancelled, Some(on_attempt), input).await;
            lock(&running).remove(&key);
            if outcome == Err(RequestError::CancelledByCaller) {
                lock(&origins).retain(|_, app_id| *app_id != request.id);
            } else {
                let mut outcome = outcome.map_err(request_error);
                // Also a task's result, which the client put together from the task's record.
                if let (true, Ok(result)) = (modern_app, &mut outcome) {
                    translate::stateless_result(&request.method, result, &translate::server_info(&client.server()));
                }
                // The pump is gone only when the client is.
                let _ = to_pump.send(Message::Response(Response { id: Some(request.id), outcome }));
            }
        });
    }

    /// Stops waiting for the request the application cancels.
    fn cancel(&self, params: Option<&Value>) {
        let id = params.and_then(|p| p.get("requestId")).map(Value::to_string);
        if let Some(cancel) = id.and_then(|id| lock(&self.running).remove(&id)) {
            let _ = cancel.send(());
        }
    }
}

impl MessageLink {
    /// Takes one message from the application. Everything but the exchanges that wait for the
    /// server (`initialize`, notifications) takes effect here, in the order the application
    /// sends it, not when it gets round to polling the futures (rmcp polls several).
    pub fn send(&mut self, message: Message) -> impl Future<Output = Result<(), NotConnected>> + Send + 'static {
        let waits = match message {
            Message::Request(request)
                if request.method == method::INITIALIZE
                    // A 2026-07-28 application has no handshake: its first discovery connects the link.
                    || (request.method == method::SERVER_DISCOVER && self.connecting()) =>
            {
                let (to_app, id) = (self.requests.to_app.clone(), request.id);
                let connected = self.connect(request.params.as_ref().unwrap_or(&Value::Null));
                Waits::Connect(Box::pin(async move {
                    let outcome = connected.await;
                    deliver(&to_app, Message::Response(Response { id: Some(id), outcome }), None);
                }) as BoxedWait)
            }
            // Nor does one that skips discovery: its first request connects the link, then runs.
            Message::Request(request)
                if self.connecting() && request.params.as_ref().and_then(stateless_envelope).is_some() =>
            {
                let requests = self.requests.clone();
                let connected = self.connect(request.params.as_ref().unwrap_or(&Value::Null));
                Waits::Connect(Box::pin(async move {
                    match connected.await {
                        Ok(_) => requests.start(request),
                        Err(error) => {
                            let response = Response { id: Some(request.id), outcome: Err(error) };
                            deliver(&requests.to_app, Message::Response(response), None);
                        }
                    }
                }) as BoxedWait)
            }
            Message::Request(request) => {
                self.requests.start(request);
                Waits::Nothing
            }
            // tether sent its own.
            Message::Notification(n) if n.method == method::INITIALIZED => Waits::Nothing,
            Message::Notification(n) if n.method == method::CANCELLED => {
                self.requests.cancel(n.params.as_ref());
                Waits::Nothing
            }
            Message::Notification(n) => Waits::Notify(self.client(), n),
            Message::Response(Response { id: Some(RequestId::Number(id)), outcome }) => {
                if let Some(waiting) = lock(&self.answers).remove(&id) {
                    let _ = waiting.send(outcome);
                }
                Waits::Nothing
            }
            Message::Response(_) => {
                tracing::warn!("the application answered a request the server never sent");
                Waits::Nothing
            }
        };
        async move {
            match waits {
                Waits::Nothing => Ok(()),
                Waits::Connect(connect) => {
                    connect.await;
                    Ok(())
                }
                Waits::Notify(client, Notification { method, params }) => {
                    let client = client.ok_or(NotConnected)?;
                    client.notify(&method, params.unwrap_or(Value::Null)).await.map_err(|_| NotConnected)
                }
            }
        }
    }

    /// Stops every request in flight and ends the session.
    pub async fn close(&mut self) {
        for (_, cancel) in lock(&self.requests.running).drain() {
            let _ = cancel.send(());
        }
        if let Some(client) = self.requests.client.get() {
            client.close().await;
        }
    }
}
