//! The client: session handshake, requests, delivery of messages, and re-initialization after
//! a divergence.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use tether_core::jsonrpc::{self, Message, Notification, Request, RequestId, Response};
use tether_core::mcp::{IdempotencyKey, ProtocolVersion, header, meta, method};
use tokio::sync::{mpsc, oneshot};

use crate::backoff::Attempts;
use crate::checkpoint::{Checkpoint, StreamCursor};
use crate::cursors::{Cursors, stream_key};
use crate::follow::{Follower, Origin};
use crate::http::{Endpoint, Head, Reply, SessionHeaders, SseReader};
use crate::{Ack, ClientConfig, ClientError, ClientEvent, DivergenceReason, RequestError};

/// Handshakes tried before a session that keeps vanishing after `initialize` is an error.
const HANDSHAKE_ATTEMPTS: u32 = 3;

pub(crate) type Answer = Result<Value, RequestError>;

/// Which revision family the server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Era {
    Legacy,
    Modern,
}

struct Pending {
    tx: oneshot::Sender<Answer>,
    generation: u64,
}

pub(crate) struct State {
    pub era: Era,
    pub session: SessionHeaders,
    /// Bumped at every (re-)initialization; followers of an older generation stop.
    pub generation: u64,
    /// Where each stream resumes from and what the application processed of it.
    pub cursors: Cursors,
    pending: HashMap<String, Pending>,
    /// Request ids are `{id_prefix}-{n}`: random per client instance, so a client restarted on
    /// a checkpointed session never reuses an id that session has seen.
    id_prefix: String,
    next_id: u64,
    standalone: bool,
    closed: bool,
    /// The server's answer to `initialize` (for 2026-07-28, what `server/discover` said).
    server: Value,
    /// Tools the server annotated `idempotentHint: true` (learnt from `tools/list`): their calls
    /// need no key.
    idempotent_tools: HashSet<String>,
}

/// Whether a request carries an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keying {
    /// `tools/call` of a tool not known to be idempotent, if the configuration wants keys.
    Auto,
    /// Always (the application marked the request).
    Always,
}

pub(crate) struct Inner {
    pub endpoint: Endpoint,
    pub config: ClientConfig,
    events: mpsc::UnboundedSender<ClientEvent>,
    state: Mutex<State>,
    reinit: tokio::sync::Mutex<()>,
}

/// An MCP client connection. Cheap to clone; all clones share one session.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// A request's place among the pending ones, given up when its sender stops waiting.
struct Waiting<'a> {
    inner: &'a Inner,
    key: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.inner.state().pending.remove(self.key);
    }
}

impl Inner {
    pub fn state(&self) -> MutexGuard<'_, State> {
        // Plain data behind the lock: still consistent after a panic elsewhere.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn emit(&self, event: ClientEvent) {
        // The application may have stopped listening; the client goes on regardless.
        let _ = self.events.send(event);
    }

    /// Whether followers of `generation` should keep going.
    pub fn is_current(&self, generation: u64) -> bool {
        let state = self.state();
        state.generation == generation && !state.closed
    }

    pub fn session(&self) -> SessionHeaders {
        self.state().session.clone()
    }

    /// Writes the checkpoint file, if one is configured: the session and the committed cursors.
    pub fn persist(&self) {
        let Some(path) = &self.config.checkpoint_file else { return };
        let checkpoint = self.state().cursors.file();
        if let Err(err) = checkpoint.save(path) {
            tracing::warn!(%err, "could not write the checkpoint");
        }
    }

    /// Marks `cursor` of stream `key` as processed by the application and writes the file.
    pub fn commit(&self, generation: u64, key: &str, cursor: StreamCursor) {
        {
            let mut state = self.state();
            // A stream of a session replaced since has nothing left to resume.
            if state.generation != generation || !state.cursors.commit(key, cursor) {
                return;
            }
        }
        self.persist();
    }

    /// Routes a validated message: responses to their request, server requests to the hooks,
    /// notifications to the application (with the acknowledgement that commits their cursor).
    pub fn deliver(self: &Arc<Self>, id: Option<String>, message: Message, ack: Ack) {
        match message {
            Message::Response(response) => {
                let Some(request) = &response.id else { return };
                self.finish(request, response.outcome.map_err(RequestError::Rpc));
            }
            Message::Request(request) => {
                self.emit(ClientEvent::Message { id, message: Message::Request(request.clone()), ack });
                let inner = Arc::clone(self);
                tokio::spawn(async move { inner.answer_server_request(request).await });
            }
            notification @ Message::Notification(_) => {
                self.emit(ClientEvent::Message { id, message: notification, ack })
            }
        }
    }

    /// Ends request `request` with `answer`: its stream has nothing left to resume, and whoever
    /// waits for it gets the answer.
    pub fn finish(&self, request: &RequestId, answer: Answer) {
        let pending = {
            let mut state = self.state();
            state.cursors.finished(request);
            state.pending.remove(&stream_key(request))
        };
        self.persist();
        if let Some(pending) = pending {
            let _ = pending.tx.send(answer);
        }
    }

    async fn answer_server_request(&self, request: Request) {
        let outcome = self.config.hooks.answer(&request.method, request.params.unwrap_or(Value::Null)).await;
        let body = Message::Response(Response { id: Some(request.id), outcome }).to_vec();
        let session = self.session();
        if let Err(err) = self.endpoint.post(&session, body, HeaderMap::new()).await {
            tracing::warn!(%err, "could not answer the server's request");
        }
    }

    /// Resolves a pending request that will get no answer.
    pub fn resolve(&self, key: &str, answer: Answer) {
        let pending = self.state().pending.remove(key);
        if let Some(pending) = pending {
            let _ = pending.tx.send(answer);
        }
    }

    /// Reports a divergence and replaces the session.
    pub async fn diverge(self: &Arc<Self>, generation: u64, reason: DivergenceReason) {
        if !self.is_current(generation) {
            return;
        }
        let kind = reason.kind();
        tracing::info!(kind, detail = %reason, "divergence");
        metrics::counter!("tether_client_divergences_total", "kind" => kind).increment(1);
        self.emit(ClientEvent::Divergence { reason });
        let why = format!("the session diverged ({kind})");
        if self.config.reinitialize {
            self.reinitialize(generation, &why).await;
        } else {
            self.stop(&why);
        }
    }

    /// Closes the client without a word to the server: what was pending ends as
    /// [`RequestError::OutcomeUnknown`].
    fn stop(&self, why: &str) {
        let pending: Vec<Pending> = {
            let mut state = self.state();
            state.closed = true;
            state.pending.drain().map(|(_, pending)| pending).collect()
        };
        for pending in pending {
            let _ = pending.tx.send(Err(RequestError::OutcomeUnknown(why.to_owned())));
        }
        self.emit(ClientEvent::Closed { reason: why.to_owned(), fatal: true });
    }

    /// Replaces the session of `generation` with a new one, unless that already happened.
    async fn reinitialize(self: &Arc<Self>, generation: u64, why: &str) {
        let _serial = self.reinit.lock().await;
        let orphaned = {
            let mut state = self.state();
            if state.generation != generation || state.closed {
                return;
            }
            state.generation += 1;
            state.session = SessionHeaders::default();
            state.server = Value::Null;
            state.cursors.clear();
            let keys: Vec<String> =
                state.pending.iter().filter(|(_, p)| p.generation == generation).map(|(k, _)| k.clone()).collect();
            keys.into_iter().filter_map(|k| state.pending.remove(&k)).collect::<Vec<_>>()
        };
        for pending in orphaned {
            let _ = pending.tx.send(Err(RequestError::OutcomeUnknown(why.to_owned())));
        }
        match self.initialize().await {
            Ok(session) => {
                metrics::counter!("tether_client_reinitializations_total").increment(1);
                self.emit(ClientEvent::Reinitialized { session });
                let (standalone, generation) = {
                    let state = self.state();
                    (state.standalone, state.generation)
                };
                if standalone {
                    Follower::spawn(Arc::clone(self), generation, Origin::Standalone, None, None);
                }
            }
            Err(err) => {
                self.state().closed = true;
                self.emit(ClientEvent::Closed { reason: format!("re-initialization failed: {err}"), fatal: true });
            }
        }
    }

    /// The legacy handshake; falls back to 2026-07-28 when the server refuses it the way a
    /// modern-only server does. Returns the session id (empty for 2026-07-28).
    ///
    /// A session can be gone before `notifications/initialized` reaches it (a balancer sent it
    /// to a replica that never had the session, or it expired): then the handshake starts over,
    /// at most `HANDSHAKE_ATTEMPTS` times.
    /// A server that cannot be reached is tried again within the reconnect backoff: a restart
    /// must not end the client.
    pub async fn initialize(self: &Arc<Self>) -> Result<String, ClientError> {
        let mut attempt = 1;
        let mut unreachable = Attempts::new(self.config.backoff);
        loop {
            match self.handshake().await {
                Err(ClientError::Refused { status: 404, .. }) if attempt < HANDSHAKE_ATTEMPTS => attempt += 1,
                Err(ClientError::Transport(err)) => match unreachable.next_delay(None, None) {
                    Some(delay) => {
                        tracing::debug!(%err, ?delay, "server unreachable; trying the handshake again");
                        tokio::time::sleep(delay).await;
                    }
                    None => return Err(ClientError::Transport(err)),
                },
                outcome => return outcome,
            }
        }
    }

    async fn handshake(self: &Arc<Self>) -> Result<String, ClientError> {
        let id = self.next_id();
        let params = json!({
            "protocolVersion": self.config.protocol_version.as_str(),
            "capabilities": self.config.hooks.capabilities(),
            "clientInfo": {"name": self.config.name, "version": env!("CARGO_PKG_VERSION")},
        });
        let body =
            Message::Request(Request { id: id.clone(), method: method::INITIALIZE.into(), params: Some(params) })
                .to_vec();
        let (head, reply) = self.endpoint.post(&SessionHeaders::default(), body, HeaderMap::new()).await?;
        let response = match reply {
            Reply::Json(bytes) => parse_response(&bytes)?,
            Reply::Sse(reader) => first_response(reader, &id).await?,
            Reply::Refused(body) if matches!(head.status, 400 | 404 | 405) => {
                let Some(mut server) = self.modern_server().await else { return Err(refused(&head, &body)) };
                tracing::debug!(status = head.status, body = %String::from_utf8_lossy(&body), "legacy initialize refused");
                server.insert("protocolVersion".into(), json!(ProtocolVersion::V2026_07_28.as_str()));
                let server = Value::Object(server);
                let mut state = self.state();
                state.era = Era::Modern;
                state.server = server;
                state.session = SessionHeaders {
                    session_id: None,
                    protocol_version: Some(ProtocolVersion::V2026_07_28.as_str().into()),
                };
                return Ok(String::new());
            }
            Reply::Refused(body) => return Err(refused(&head, &body)),
            Reply::Accepted => return Err(ClientError::Protocol("initialize was answered without a body".into())),
        };
        let result =
            response.outcome.map_err(|e| ClientError::Protocol(format!("initialize failed: {}", e.message)))?;
        let version = result.get("protocolVersion").and_then(Value::as_str).unwrap_or_default().to_owned();
        let epoch = head.epoch.clone().or_else(|| {
            result
                .pointer(&format!("/capabilities/experimental/{}/epoch", meta::LINEAGE_CAPABILITY.replace('/', "~1")))
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        let session = SessionHeaders { session_id: head.session_id.clone(), protocol_version: Some(version.clone()) };
        let initialized =
            Message::Notification(Notification { method: method::INITIALIZED.into(), params: None }).to_vec();
        let (head, reply) = self.endpoint.post(&session, initialized, HeaderMap::new()).await?;
        if let Reply::Refused(body) = reply {
            return Err(refused(&head, &body));
        }
        {
            let mut state = self.state();
            state.era = Era::Legacy;
            state.server = result;
            state.session = session.clone();
            state.cursors.initialized(session.session_id.clone(), epoch, version);
        }
        self.persist();
        Ok(session.session_id.unwrap_or_default())
    }

    /// The server's `server/discover` result, if it answers the 2026-07-28 way.
    async fn modern_server(&self) -> Option<serde_json::Map<String, Value>> {
        let id = self.next_id();
        let request = Request { id, method: method::SERVER_DISCOVER.into(), params: Some(json!({})) };
        let (body, headers) = self.modern_request(request);
        let session =
            SessionHeaders { session_id: None, protocol_version: Some(ProtocolVersion::V2026_07_28.as_str().into()) };
        match self.endpoint.post(&session, body, headers).await {
            Ok((_, Reply::Json(bytes))) => match parse_response(&bytes).ok()?.outcome.ok()? {
                Value::Object(result) => Some(result),
                _ => None,
            },
            _ => None,
        }
    }

    /// The idempotency key a request gets, if any, with the records it is claimed in; says so
    /// when one is wanted but the server does not offer the extension.
    fn key_for(&self, method: &str, params: &Value, keying: Keying) -> Option<(IdempotencyKey, String)> {
        let wanted = match keying {
            Keying::Always => true,
            Keying::Auto => {
                let tool = params.get("name").and_then(Value::as_str).unwrap_or_default();
                self.config.idempotency_keys
                    && method == method::TOOLS_CALL
                    && !self.state().idempotent_tools.contains(tool)
            }
        };
        if !wanted {
            return None;
        }
        let Some(records) = self.state().idempotency_records() else {
            self.emit(ClientEvent::Unkeyed {
                reason: format!("the server does not offer {}", meta::IDEMPOTENCY_CAPABILITY),
            });
            return None;
        };
        let mut random = [0u8; 16];
        match getrandom::fill(&mut random) {
            Ok(()) => Some((IdempotencyKey::from_random(random), records)),
            Err(err) => {
                self.emit(ClientEvent::Unkeyed { reason: format!("no randomness for a key: {err}") });
                None
            }
        }
    }

    /// Remembers which tools a `tools/list` result annotates as idempotent.
    fn learn_tools(&self, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else { return };
        let mut state = self.state();
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else { continue };
            if tool.pointer("/annotations/idempotentHint") == Some(&Value::Bool(true)) {
                state.idempotent_tools.insert(name.to_owned());
            } else {
                state.idempotent_tools.remove(name);
            }
        }
    }

    fn next_id(&self) -> RequestId {
        let mut state = self.state();
        state.next_id += 1;
        RequestId::String(format!("{}-{}", state.id_prefix, state.next_id))
    }

    /// The body and headers of a 2026-07-28 request: metadata in `_meta` and mirrored headers.
    fn modern_request(&self, mut request: Request) -> (Vec<u8>, HeaderMap) {
        let mut params = request.params.take().unwrap_or_else(|| json!({}));
        if !params.is_object() {
            params = json!({});
        }
        params["_meta"][meta::PROTOCOL_VERSION] = json!(ProtocolVersion::V2026_07_28.as_str());
        params["_meta"][meta::CLIENT_CAPABILITIES] = self.config.hooks.capabilities();
        params["_meta"][meta::CLIENT_INFO] = json!({"name": self.config.name, "version": env!("CARGO_PKG_VERSION")});
        let mut headers = HeaderMap::new();
        let mut put = |name: &'static str, value: &str| {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        };
        put(header::METHOD, &request.method);
        let name_field = match request.method.as_str() {
            method::TOOLS_CALL | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            _ => None,
        };
        if let Some(name) = name_field.and_then(|f| params.get(f)).and_then(Value::as_str) {
            put(header::NAME, name);
        }
        request.params = Some(params);
        (Message::Request(request).to_vec(), headers)
    }
}

fn parse_response(bytes: &[u8]) -> Result<Response, ClientError> {
    match jsonrpc::parse_message(bytes) {
        Ok(Message::Response(response)) => Ok(response),
        Ok(_) => Err(ClientError::Protocol("expected a JSON-RPC response".into())),
        Err(err) => Err(ClientError::Protocol(err.to_string())),
    }
}

impl State {
    /// The name of the records the server claims idempotency keys in, if it offers the
    /// extension.
    fn idempotency_records(&self) -> Option<String> {
        let offer = self.server.get("capabilities")?.get("experimental")?.get(meta::IDEMPOTENCY_CAPABILITY)?;
        offer.get("records").and_then(Value::as_str).map(str::to_owned)
    }
}

/// Reads an SSE answer until the response to `id` (an `initialize` answered with SSE).
async fn first_response(mut reader: Box<SseReader>, id: &RequestId) -> Result<Response, ClientError> {
    while let Some(event) = reader.next().await? {
        if let Ok(Message::Response(response)) = jsonrpc::parse_message(event.data.as_bytes())
            && response.id.as_ref() == Some(id)
        {
            return Ok(response);
        }
    }
    Err(ClientError::Protocol("the stream ended before the response".into()))
}

fn refused(head: &Head, body: &Bytes) -> ClientError {
    let message = jsonrpc::parse_message(body)
        .ok()
        .and_then(|m| match m {
            Message::Response(Response { outcome: Err(e), .. }) => Some(match e.reason() {
                Some(reason) => format!("{} ({reason})", e.message),
                None => e.message,
            }),
            _ => None,
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect());
    ClientError::Refused { status: head.status, message }
}

impl Client {
    /// Connects: resumes the session of the checkpoint file if it holds one, else initializes.
    /// Returns the client and the stream of events for the application.
    pub async fn connect(config: ClientConfig) -> Result<(Client, mpsc::UnboundedReceiver<ClientEvent>), ClientError> {
        let checkpoint = match &config.checkpoint_file {
            Some(path) => Checkpoint::load(path).map_err(|e| ClientError::Checkpoint(e.to_string()))?,
            None => Checkpoint::default(),
        };
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .tcp_keepalive(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        let (events, rx) = mpsc::unbounded_channel();
        let resumed = checkpoint.session_id.is_some();
        let mut prefix = [0u8; 6];
        getrandom::fill(&mut prefix)
            .map_err(|e| ClientError::Transport(format!("no randomness for request ids: {e}")))?;
        let id_prefix = tether_core::lineage::base64url(&prefix);
        let cursors = Cursors::from_file(checkpoint);
        let session = SessionHeaders {
            session_id: cursors.session_id().map(str::to_owned),
            protocol_version: cursors.protocol_version().map(str::to_owned),
        };
        let state = State {
            era: Era::Legacy,
            session,
            generation: 0,
            cursors,
            pending: HashMap::new(),
            id_prefix,
            next_id: 0,
            standalone: false,
            closed: false,
            server: Value::Null,
            idempotent_tools: HashSet::new(),
        };
        let inner = Arc::new(Inner {
            endpoint: Endpoint { http, url: config.url.clone() },
            config,
            events,
            state: Mutex::new(state),
            reinit: tokio::sync::Mutex::new(()),
        });
        if !resumed {
            inner.initialize().await?;
        }
        Ok((Client { inner }, rx))
    }

    /// The current session id, if the server uses sessions.
    pub fn session_id(&self) -> Option<String> {
        self.inner.session().session_id
    }

    /// Follows the standalone (GET) stream: resumes it from the checkpoint if there is a cursor,
    /// else opens a new one. Returns once the first connection is open (or was refused), so
    /// server messages sent after this are not missed. Its messages arrive as [`ClientEvent`]s.
    pub async fn follow_standalone(&self) {
        let generation = {
            let mut state = self.inner.state();
            if state.standalone || state.era == Era::Modern {
                return;
            }
            state.standalone = true;
            state.generation
        };
        let (ready, opened) = oneshot::channel();
        Follower::spawn(Arc::clone(&self.inner), generation, Origin::Standalone, None, Some(ready));
        // An error only means the follower stopped before connecting; it reported why.
        let _ = opened.await;
    }

    /// Sends a request and waits for its outcome. Notifications on its stream arrive as events.
    /// A `tools/call` of a tool not annotated idempotent carries an idempotency key (if the
    /// configuration and the server allow) and is re-issued until its real outcome arrives.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RequestError> {
        self.send(method, params, Keying::Auto, None).await
    }

    /// Sends a request under an idempotency key whatever its method, so it runs at most once
    /// however often it is sent, and re-issues it until its real outcome arrives. Without the
    /// server's support it goes out unkeyed (and a [`ClientEvent::Unkeyed`] says so).
    pub async fn request_keyed(&self, method: &str, params: Value) -> Result<Value, RequestError> {
        self.send(method, params, Keying::Always, None).await
    }

    /// Sends a request like [`Client::request`], until `cancelled` resolves: then the server is
    /// told (`notifications/cancelled` for the attempt in flight) and the request ends with
    /// [`RequestError::CancelledByCaller`].
    pub async fn request_cancellable(
        &self,
        method: &str,
        params: Value,
        cancelled: impl Future<Output = ()>,
    ) -> Result<Value, RequestError> {
        let in_flight = Mutex::new(None);
        {
            let sent = self.send(method, params, Keying::Auto, Some(&in_flight));
            tokio::pin!(sent);
            tokio::select! {
                outcome = &mut sent => return outcome,
                () = cancelled => {}
            }
        }
        // The attempt's wait was dropped with it; what is left is to tell the server.
        let id = in_flight.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(id) = id
            && let Err(err) = self.cancel(&id, "cancelled by the client").await
        {
            tracing::debug!(%err, "could not tell the server of a cancellation");
        }
        Err(RequestError::CancelledByCaller)
    }

    /// Sends a request with its key, if it gets one, and re-issues it while its outcome is
    /// unknown; records in `in_flight` the id of each attempt as it goes out.
    async fn send(
        &self,
        method: &str,
        mut params: Value,
        keying: Keying,
        in_flight: Option<&Mutex<Option<RequestId>>>,
    ) -> Result<Value, RequestError> {
        let mut key = self.inner.key_for(method, &params, keying);
        match (&key, &mut params) {
            (None, _) => {}
            (Some((key, _)), Value::Object(_)) => params["_meta"][meta::IDEMPOTENCY_KEY] = json!(key.as_str()),
            (Some((key, _)), Value::Null) => params = json!({"_meta": {meta::IDEMPOTENCY_KEY: key.as_str()}}),
            // Positional params have no `_meta`: MCP requests never take them.
            (Some(_), _) => key = None,
        }
        let Some((key, records)) = &key else { return self.send_once(method, params, in_flight).await };
        let mut reissues = Attempts::new(self.inner.config.backoff);
        let mut attempt = 0;
        loop {
            let outcome = self.send_once(method, params.clone(), in_flight).await;
            let reason = match &outcome {
                Err(RequestError::OutcomeUnknown(reason) | RequestError::NotExecuted(reason)) => reason.clone(),
                Err(RequestError::Cancelled) => "the response stream broke".to_owned(),
                Err(RequestError::Aborted(error)) => {
                    format!("its server stopped before it finished: {}", error.message)
                }
                _ => return outcome,
            };
            let Some(delay) = reissues.next_delay(None, None) else { return outcome };
            tokio::time::sleep(delay).await;
            // A re-initialization under way decides where the next attempt goes. The session that
            // replaced a diverged one may be served by other records (a restarted memory store, a
            // replica with its own): a re-issue there could run the request again.
            drop(self.inner.reinit.lock().await);
            if self.inner.state().idempotency_records().as_ref() != Some(records) {
                return outcome;
            }
            attempt += 1;
            metrics::counter!("tether_client_reissues_total").increment(1);
            self.inner.emit(ClientEvent::Reissued { key: key.to_string(), attempt, reason });
        }
    }

    /// Sends a request once and waits for its outcome.
    async fn send_once(
        &self,
        method: &str,
        params: Value,
        in_flight: Option<&Mutex<Option<RequestId>>>,
    ) -> Result<Value, RequestError> {
        let inner = &self.inner;
        // A re-initialization in progress has no session yet: wait for it, and hold it off until
        // this request is registered with the session it goes out on.
        let serial = inner.reinit.lock().await;
        let id = inner.next_id();
        if let Some(in_flight) = in_flight {
            *in_flight.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(id.clone());
        }
        let request = Request { id: id.clone(), method: method.to_owned(), params: Some(params) };
        let key = stream_key(&id);
        let (tx, rx) = oneshot::channel();
        let (era, session, generation) = {
            let mut state = inner.state();
            if state.closed {
                return Err(RequestError::Client(ClientError::Closed));
            }
            let generation = state.generation;
            state.pending.insert(key.clone(), Pending { tx, generation });
            state.cursors.sent(&id, method);
            (state.era, state.session.clone(), generation)
        };
        drop(serial);
        // An abandoned wait (the caller dropped this future) leaves nothing waiting behind.
        let _waiting = Waiting { inner, key: &key };
        inner.persist();
        let (body, headers) = match era {
            Era::Legacy => (Message::Request(request).to_vec(), HeaderMap::new()),
            Era::Modern => inner.modern_request(request),
        };
        match inner.endpoint.post(&session, body, headers).await {
            Err(err) => inner
                .resolve(&key, Err(RequestError::OutcomeUnknown(format!("the request may not have arrived: {err}")))),
            Ok((head, reply)) => self.handle_reply(era, generation, &key, &id, head, reply).await,
        }
        let outcome = rx.await.unwrap_or(Err(RequestError::Client(ClientError::Closed)));
        if method == method::TOOLS_LIST
            && let Ok(result) = &outcome
        {
            inner.learn_tools(result);
        }
        outcome
    }

    async fn handle_reply(&self, era: Era, generation: u64, key: &str, id: &RequestId, head: Head, reply: Reply) {
        let inner = &self.inner;
        match reply {
            Reply::Json(bytes) => match parse_response(&bytes) {
                Ok(response) => inner.deliver(None, Message::Response(response), Ack::none()),
                Err(err) => inner.resolve(key, Err(RequestError::Client(err))),
            },
            Reply::Sse(reader) if era == Era::Modern => {
                let inner = Arc::clone(inner);
                let key = key.to_owned();
                tokio::spawn(async move { crate::follow::read_modern(inner, key, reader).await });
            }
            Reply::Sse(reader) => {
                Follower::spawn(Arc::clone(inner), generation, Origin::Request(id.clone()), Some((head, reader)), None);
            }
            Reply::Accepted => inner.resolve(
                key,
                Err(RequestError::Client(ClientError::Protocol("a request was answered with 202".into()))),
            ),
            Reply::Refused(body) if head.status == 404 && era == Era::Legacy => {
                inner.resolve(key, Err(RequestError::NotExecuted("the session is gone (404)".into())));
                let reason =
                    DivergenceReason::Refused { status: head.status, detail: refused(&head, &body).to_string() };
                inner.diverge(generation, reason).await;
            }
            Reply::Refused(body) => {
                let error = match parse_response(&body) {
                    Ok(Response { outcome: Err(error), .. }) => RequestError::Rpc(error),
                    _ => RequestError::Client(refused(&head, &body)),
                };
                inner.resolve(key, Err(error));
            }
        }
    }

    /// Calls a tool.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Value, RequestError> {
        self.request(method::TOOLS_CALL, json!({"name": name, "arguments": arguments})).await
    }

    /// Cancels a request the client sent (`notifications/cancelled`).
    pub async fn cancel(&self, id: &RequestId, reason: &str) -> Result<(), ClientError> {
        self.notify(method::CANCELLED, json!({"requestId": id.to_value(), "reason": reason})).await
    }

    /// Sends a notification to the server (`notifications/roots/list_changed`, ...); `Null`
    /// params are left out.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), ClientError> {
        let params = (!params.is_null()).then_some(params);
        let body = Message::Notification(Notification { method: method.to_owned(), params }).to_vec();
        self.inner.endpoint.post(&self.inner.session(), body, HeaderMap::new()).await.map(|_| ())
    }

    /// The server's answer to the current session's `initialize` (`protocolVersion`,
    /// `capabilities`, `serverInfo`, `instructions`); for 2026-07-28, its `server/discover`
    /// result.
    pub fn server(&self) -> Value {
        self.inner.state().server.clone()
    }

    /// Ends the session (DELETE) and stops every stream.
    pub async fn close(&self) {
        let session = {
            let mut state = self.inner.state();
            state.closed = true;
            let pending: Vec<_> = state.pending.drain().collect();
            for (_, p) in pending {
                let _ = p.tx.send(Err(RequestError::Client(ClientError::Closed)));
            }
            state.session.clone()
        };
        if session.session_id.is_some() {
            self.inner.endpoint.delete(&session).await;
        }
    }
}
