//! The client's session: its state under one lock (era, headers, generation, cursors, pending
//! requests), changed only through the methods here, and the work that changes it as a whole:
//! the handshake, delivery of messages, divergence and re-initialization. [`crate::Client`] is
//! the facade over it; followers of its streams report to it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use tether_core::idempotency::IdempotencyKey;
use tether_core::jsonrpc::{self, Message, Notification, Request, RequestId, Response};
use tether_core::lineage::Checkpoint;
use tether_core::mcp::{Era, ProtocolVersion, code, header, meta, method};
use tether_core::param_headers::{self, ParamHeader};
use tether_core::tasks;
use tokio::sync::{mpsc, oneshot};

use crate::backoff::Attempts;
use crate::checkpoint::{CheckpointFile, StreamCursor, TaskCursor};
use crate::cursors::{Cursors, stream_key};
use crate::follow::{Follower, Origin};
use crate::http::{Endpoint, Head, Reply, SessionHeaders, SseReader};
use crate::oauth::Authorizer;
use crate::{Ack, ClientConfig, ClientError, ClientEvent, DivergenceReason, RequestError};

/// Handshakes tried before a session that keeps vanishing after `initialize` is an error.
const HANDSHAKE_ATTEMPTS: u32 = 3;

pub(crate) type Answer = Result<Value, RequestError>;

struct Pending {
    tx: oneshot::Sender<Answer>,
    generation: u64,
}

struct State {
    era: Era,
    session: SessionHeaders,
    /// Bumped at every (re-)initialization; followers of an older generation stop.
    generation: u64,
    /// Where each stream resumes from and what the application processed of it.
    cursors: Cursors,
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
    /// Each tool's parameters mirrored in headers (SEP-2243), learnt from `tools/list`.
    param_headers: HashMap<String, Vec<ParamHeader>>,
    /// Tools whose header declarations are invalid (SEP-2243): not called.
    invalid_tools: HashMap<String, String>,
}

/// Whether a request carries an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keying {
    /// `tools/call` of a tool not known to be idempotent, if the configuration wants keys.
    Auto,
    /// Always (the application marked the request).
    Always,
}

pub(crate) struct Session {
    pub endpoint: Endpoint,
    pub config: ClientConfig,
    events: mpsc::UnboundedSender<ClientEvent>,
    state: Mutex<State>,
    /// Held while the session is replaced, and by whoever must not see it half replaced.
    reinit: tokio::sync::Mutex<()>,
}

/// A request's place among the pending ones, given up when its sender stops waiting.
pub(crate) struct Waiting<'a> {
    inner: &'a Session,
    key: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.inner.state().pending.remove(self.key);
    }
}

impl Session {
    /// A session of `config`, resuming what `file` holds (nothing if it holds no session); its
    /// events go to `events`. Not yet initialized.
    pub fn new(
        config: ClientConfig,
        file: CheckpointFile,
        events: mpsc::UnboundedSender<ClientEvent>,
    ) -> Result<Session, ClientError> {
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in &config.headers {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| ClientError::Transport(format!("header name {name:?}: {e}")))?;
            let value = reqwest::header::HeaderValue::from_str(value)
                .map_err(|e| ClientError::Transport(format!("header {name} value: {e}")))?;
            headers.append(name, value);
        }
        let http = config
            .trust
            .http_client()
            .default_headers(headers)
            .tcp_nodelay(true)
            .tcp_keepalive(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| ClientError::Transport(crate::tls::describe(&e)))?;
        let mut prefix = [0u8; 6];
        getrandom::fill(&mut prefix)
            .map_err(|e| ClientError::Transport(format!("no randomness for request ids: {e}")))?;
        let authorizer = match &config.oauth {
            Some(oauth) => Some(Arc::new(
                Authorizer::new(oauth.clone(), &config.url, &config.trust)
                    .map_err(|err| ClientError::Unauthorized(err.to_string()))?,
            )),
            None => None,
        };
        let cursors = Cursors::from_file(file);
        let session = SessionHeaders {
            session_id: cursors.session_id().map(str::to_owned),
            protocol_version: cursors.protocol_version().map(str::to_owned),
        };
        let state = State {
            era: Era::Sessionful,
            session,
            generation: 0,
            cursors,
            pending: HashMap::new(),
            id_prefix: tether_core::lineage::base64url(&prefix),
            next_id: 0,
            standalone: false,
            closed: false,
            server: Value::Null,
            idempotent_tools: HashSet::new(),
            param_headers: HashMap::new(),
            invalid_tools: HashMap::new(),
        };
        Ok(Session {
            endpoint: Endpoint { http, url: config.url.clone(), unsent_timeout: config.unsent_timeout, authorizer },
            config,
            events,
            state: Mutex::new(state),
            reinit: tokio::sync::Mutex::new(()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
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

    /// Whether the client holds a session (from its checkpoint file, or initialized).
    pub fn has_session(&self) -> bool {
        self.state().cursors.session_id().is_some()
    }

    /// Waits for a re-initialization under way, and holds off the next one while the guard
    /// lives: a request registered meanwhile belongs to the session it goes out on.
    pub async fn settled(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reinit.lock().await
    }

    /// Marks the standalone stream as followed; the generation to follow it in, or `None` if it
    /// is followed already or the server has none (2026-07-28).
    pub fn start_standalone(&self) -> Option<u64> {
        let mut state = self.state();
        if state.standalone || state.era == Era::Stateless {
            return None;
        }
        state.standalone = true;
        Some(state.generation)
    }

    /// Registers request `id` (its stream `key`) as pending, its answer going to `tx`: the era,
    /// session and generation it goes out in. Fails once the client is closed.
    pub fn register(
        &self,
        id: &RequestId,
        key: &str,
        method: &str,
        tx: oneshot::Sender<Answer>,
    ) -> Result<(Era, SessionHeaders, u64), ClientError> {
        let mut state = self.state();
        if state.closed {
            return Err(ClientError::Closed);
        }
        let generation = state.generation;
        state.pending.insert(key.to_owned(), Pending { tx, generation });
        state.cursors.sent(id, method);
        Ok((state.era, state.session.clone(), generation))
    }

    /// The place of pending request `key`, given up when dropped.
    pub fn waiting<'a>(&'a self, key: &'a str) -> Waiting<'a> {
        Waiting { inner: self, key }
    }

    /// An event arrived on stream `key`: a reconnect resumes after it.
    pub fn arrived(&self, key: &str, cursor: StreamCursor) {
        self.state().cursors.arrived(key, cursor);
    }

    /// The id stream `key` resumes after.
    pub fn last_id(&self, key: &str) -> Option<String> {
        self.state().cursors.last_id(key)
    }

    /// What a resume of stream `key` is judged against.
    pub fn lineage(&self, key: &str) -> Option<Checkpoint> {
        self.state().cursors.lineage(key)
    }

    /// The server's answer to the session's `initialize` (or `server/discover`).
    pub fn server(&self) -> Value {
        self.state().server.clone()
    }

    /// The name of the records the server claims idempotency keys in, if it offers the
    /// extension.
    pub fn idempotency_records(&self) -> Option<String> {
        self.state().idempotency_records()
    }

    /// Closes the client: what is pending ends as [`ClientError::Closed`]. Returns the session
    /// to end at the server.
    pub fn close(&self) -> SessionHeaders {
        let mut state = self.state();
        state.closed = true;
        for (_, pending) in state.pending.drain() {
            let _ = pending.tx.send(Err(RequestError::Client(ClientError::Closed)));
        }
        state.session.clone()
    }

    /// Writes the checkpoint file, if one is configured: the session and the committed cursors.
    pub fn persist(&self) {
        let Some(path) = &self.config.checkpoint_file else { return };
        let checkpoint = self.state().cursors.file();
        if let Err(err) = checkpoint.save(path) {
            tracing::warn!(%err, "could not write the checkpoint");
        }
    }

    /// Where task `id`'s event stream resumes, if it is being followed.
    pub fn task_cursor(&self, id: &str) -> Option<TaskCursor> {
        self.state().cursors.task(id)
    }

    /// Records where task `id`'s stream resumes (`None`: the task finished) and writes the file.
    pub fn task_moved(&self, id: &str, cursor: Option<TaskCursor>) {
        {
            let mut state = self.state();
            match cursor {
                Some(cursor) => state.cursors.task_arrived(id, cursor),
                None => state.cursors.task_finished(id),
            }
        }
        self.persist();
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
    pub fn deliver(self: &Arc<Self>, id: Option<String>, origin: Option<&RequestId>, message: Message, ack: Ack) {
        match message {
            Message::Response(response) => {
                let Some(request) = &response.id else { return };
                self.finish(request, response.outcome.map_err(RequestError::Rpc));
            }
            Message::Request(request) => {
                let origin = origin.cloned();
                self.emit(ClientEvent::Message { id, origin, message: Message::Request(request.clone()), ack });
                let inner = Arc::clone(self);
                tokio::spawn(async move { inner.answer_server_request(request).await });
            }
            notification @ Message::Notification(_) => {
                self.emit(ClientEvent::Message { id, origin: origin.cloned(), message: notification, ack })
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

    /// The sessionful handshake; falls back to 2026-07-28 when the server refuses it the way a
    /// stateless-only server does. Returns the session id (empty for 2026-07-28).
    ///
    /// A session can be gone before `notifications/initialized` reaches it (a balancer sent it
    /// to a replica that never had the session, or it expired): then the handshake starts over,
    /// at most `HANDSHAKE_ATTEMPTS` times.
    /// A server that cannot be reached, or answers that it cannot serve now (429, 502, 503, 504:
    /// its store fails over, it drains, a proxy has no upstream), is tried again within the
    /// reconnect backoff: a restart must not end the client. One whose certificate is not
    /// trusted is not tried again.
    pub async fn initialize(self: &Arc<Self>) -> Result<String, ClientError> {
        let mut attempt = 1;
        let mut unreachable = Attempts::new(self.config.backoff);
        let timeout = self.config.connect_timeout;
        let give_up = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        loop {
            let outcome = match give_up {
                Some(at) => tokio::time::timeout_at(at, self.handshake()).await.unwrap_or_else(|_| {
                    Err(ClientError::Transport(format!("the server did not answer the handshake within {timeout:?}")))
                }),
                None => self.handshake().await,
            };
            match outcome {
                Err(ClientError::Refused { status: 404, .. }) if attempt < HANDSHAKE_ATTEMPTS => attempt += 1,
                Err(err) if not_now(&err) => {
                    let delay = unreachable.next_delay(None, None);
                    // A wait that would end past the timeout is no attempt: the cause is now.
                    match delay.filter(|delay| give_up.is_none_or(|at| tokio::time::Instant::now() + *delay < at)) {
                        Some(delay) => {
                            tracing::debug!(%err, ?delay, "server unavailable; trying the handshake again");
                            tokio::time::sleep(delay).await;
                        }
                        None => return Err(err),
                    }
                }
                outcome => return outcome,
            }
        }
    }

    async fn handshake(self: &Arc<Self>) -> Result<String, ClientError> {
        let mut version = self.config.protocol_version;
        if version.era() == Era::Stateless {
            match self.stateless_server().await? {
                Some(server) => {
                    self.become_stateless(server);
                    return Ok(String::new());
                }
                // Tasks exist only in 2026-07-28: a session would run the call as a plain one.
                None if self.config.tasks => {
                    return Err(ClientError::Protocol(
                        "the server does not answer server/discover the 2026-07-28 way, and only that revision has tasks"
                            .into(),
                    ));
                }
                // A server of the handshake era only: spoken to in its newest revision.
                None => version = ProtocolVersion::LATEST_SESSIONFUL,
            }
        }
        let id = self.next_id();
        let params = json!({
            "protocolVersion": version.as_str(),
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
                let Some(server) = self.stateless_server().await? else { return Err(refused(&head, &body)) };
                tracing::debug!(status = head.status, body = %String::from_utf8_lossy(&body), "sessionful initialize refused");
                self.become_stateless(server);
                return Ok(String::new());
            }
            Reply::Refused(body) => return Err(refused(&head, &body)),
            Reply::Accepted => return Err(ClientError::Protocol("initialize was answered without a body".into())),
        };
        let result =
            response.outcome.map_err(|e| ClientError::Protocol(format!("initialize failed: {}", e.message)))?;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| ClientError::Protocol("the initialize result names no protocolVersion".into()))?
            .to_owned();
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
            state.era = Era::Sessionful;
            state.server = result;
            state.session = session.clone();
            state.cursors.initialized(session.session_id.clone(), epoch, version);
        }
        self.persist();
        Ok(session.session_id.unwrap_or_default())
    }

    /// Speaks 2026-07-28 from now on, to the server `server/discover` described.
    fn become_stateless(&self, mut server: serde_json::Map<String, Value>) {
        server.insert("protocolVersion".into(), json!(ProtocolVersion::V2026_07_28.as_str()));
        let mut state = self.state();
        state.era = Era::Stateless;
        state.server = Value::Object(server);
        state.session =
            SessionHeaders { session_id: None, protocol_version: Some(ProtocolVersion::V2026_07_28.as_str().into()) };
    }

    /// Why tool `name` is not called, if its `tools/list` entry declared its headers wrongly.
    pub fn excluded_tool(&self, name: &str) -> Option<String> {
        self.state().invalid_tools.get(name).cloned()
    }

    /// Whether the client speaks 2026-07-28 to its server.
    pub fn is_stateless(&self) -> bool {
        self.state().era == Era::Stateless
    }

    /// The server's `server/discover` result, if it answers the 2026-07-28 way.
    /// A refusal naming 2026-07-28 among the versions the server supports (-32022, as SEP-2575
    /// has servers answer a version they do not take) is tried once more: the server said it
    /// speaks it.
    async fn stateless_server(&self) -> Result<Option<serde_json::Map<String, Value>>, ClientError> {
        let session =
            SessionHeaders { session_id: None, protocol_version: Some(ProtocolVersion::V2026_07_28.as_str().into()) };
        for _ in 0..2 {
            let id = self.next_id();
            let request = Request { id, method: method::SERVER_DISCOVER.into(), params: Some(json!({})) };
            let (body, headers) = self.stateless_request(request);
            let response = match self.endpoint.post(&session, body, headers).await {
                // A success whose JSON does not parse was cut on its way: the network's fault.
                Ok((_, Reply::Json(bytes))) => parse_response(&bytes).map_err(|err| {
                    ClientError::Transport(format!("the server/discover answer was cut or unreadable: {err}"))
                })?,
                Ok((_, Reply::Refused(bytes))) => match parse_response(&bytes) {
                    Ok(response) => response,
                    Err(_) => return Ok(None),
                },
                Err(err @ (ClientError::Transport(_) | ClientError::NotSent(_) | ClientError::Untrusted(_))) => {
                    return Err(err);
                }
                _ => return Ok(None),
            };
            match response.outcome {
                Ok(Value::Object(result)) => return Ok(Some(result)),
                Err(error) if error.code == code::UNSUPPORTED_PROTOCOL_VERSION && offers_stateless(&error) => continue,
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// The idempotency key a request gets, if any, with the records it is claimed in; says so
    /// when one is wanted but the server does not offer the extension.
    pub fn key_for(&self, method: &str, params: &Value, keying: Keying) -> Option<(IdempotencyKey, String)> {
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

    /// Remembers what a `tools/list` result says of each tool: whether it is annotated
    /// idempotent, and which parameters its calls mirror in headers. A tool declaring them
    /// wrongly is excluded, as SEP-2243 requires: it is not called.
    pub fn learn_tools(&self, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else { return };
        let mut state = self.state();
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else { continue };
            if tool.pointer("/annotations/idempotentHint") == Some(&Value::Bool(true)) {
                state.idempotent_tools.insert(name.to_owned());
            } else {
                state.idempotent_tools.remove(name);
            }
            state.invalid_tools.remove(name);
            match param_headers::declared(tool.get("inputSchema").unwrap_or(&Value::Null)) {
                Ok(headers) if !headers.is_empty() => state.param_headers.insert(name.to_owned(), headers),
                Ok(_) => state.param_headers.remove(name),
                Err(err) => {
                    state.invalid_tools.insert(name.to_owned(), err.to_string());
                    state.param_headers.remove(name)
                }
            };
        }
    }

    pub fn next_id(&self) -> RequestId {
        let mut state = self.state();
        state.next_id += 1;
        RequestId::String(format!("{}-{}", state.id_prefix, state.next_id))
    }

    /// The body and headers of a 2026-07-28 request: metadata in `_meta` and mirrored headers.
    pub fn stateless_request(&self, mut request: Request) -> (Vec<u8>, HeaderMap) {
        let mut params = request.params.take().unwrap_or_else(|| json!({}));
        if !params.is_object() {
            params = json!({});
        }
        params["_meta"][meta::PROTOCOL_VERSION] = json!(ProtocolVersion::V2026_07_28.as_str());
        let mut capabilities = self.config.hooks.capabilities();
        if self.config.tasks && capabilities.is_object() {
            capabilities["extensions"][tasks::EXTENSION] = json!({});
        }
        params["_meta"][meta::CLIENT_CAPABILITIES] = capabilities;
        params["_meta"][meta::CLIENT_INFO] = json!({"name": self.config.name, "version": env!("CARGO_PKG_VERSION")});
        let mut headers = HeaderMap::new();
        let mut put = |name: &str, value: &str| {
            // Encoded values are visible ASCII, and names come from validated declarations.
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::from_str(value)) {
                headers.insert(name, value);
            }
        };
        put(header::METHOD, &request.method);
        if let Some(name) =
            tether_core::methods::mcp_name(&request.method).and_then(|f| params.get(f)).and_then(Value::as_str)
        {
            put(header::NAME, &param_headers::encode_value(name));
        }
        if request.method == method::TOOLS_CALL
            && let Some(tool) = params.get("name").and_then(Value::as_str)
        {
            let arguments = params.get("arguments");
            for param in self.state().param_headers.get(tool).into_iter().flatten() {
                let value = match arguments.and_then(|a| a.get(&param.property)) {
                    Some(Value::String(text)) => param_headers::encode_value(text),
                    Some(Value::Number(n)) => n.to_string(),
                    Some(Value::Bool(b)) => b.to_string(),
                    _ => continue,
                };
                put(&param.header_name(), &value);
            }
        }
        request.params = Some(params);
        (Message::Request(request).to_vec(), headers)
    }
}

/// Whether a version refusal lists 2026-07-28 among the versions the server supports.
fn offers_stateless(error: &jsonrpc::ErrorObject) -> bool {
    let supported = error.data.as_ref().and_then(|d| d.get("supported")).and_then(Value::as_array);
    supported.is_some_and(|versions| versions.iter().any(|v| v.as_str() == Some(ProtocolVersion::V2026_07_28.as_str())))
}

pub(crate) fn parse_response(bytes: &[u8]) -> Result<Response, ClientError> {
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

/// Whether `err` says the server cannot be reached or cannot serve now, rather than anything
/// about the request: a handshake failing so is tried again.
fn not_now(err: &ClientError) -> bool {
    match err {
        ClientError::Transport(_) | ClientError::NotSent(_) => true,
        ClientError::Refused { status, .. } => tether_core::lineage::is_unavailable(*status),
        _ => false,
    }
}

pub(crate) fn refused(head: &Head, body: &Bytes) -> ClientError {
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

#[cfg(test)]
mod tests {
    use tether_core::lineage::{Digest, ObservedId};

    use super::*;
    use crate::cursors::STANDALONE;

    fn session(file: CheckpointFile, checkpoint_file: Option<std::path::PathBuf>) -> Session {
        let mut config = ClientConfig::new("http://127.0.0.1:9/mcp");
        config.checkpoint_file = checkpoint_file;
        let (events, _) = mpsc::unbounded_channel();
        Session::new(config, file, events).expect("a session")
    }

    fn cursor(id: &str) -> StreamCursor {
        StreamCursor { last_id: ObservedId::parse(id), digest: Digest::of(id, b"x") }
    }

    #[test]
    fn closing_ends_what_is_pending_and_takes_no_more_requests() {
        let session = session(CheckpointFile::default(), None);
        let (tx, mut rx) = oneshot::channel();
        let id = RequestId::Number(1);
        session.register(&id, &stream_key(&id), method::TOOLS_CALL, tx).expect("registered");
        session.close();
        assert!(matches!(rx.try_recv(), Ok(Err(RequestError::Client(ClientError::Closed)))));
        let (tx, _rx) = oneshot::channel();
        let refused = session.register(&RequestId::Number(2), "request:2", method::TOOLS_CALL, tx);
        assert!(matches!(refused, Err(ClientError::Closed)));
    }

    #[test]
    fn a_wait_given_up_leaves_nothing_pending() {
        let session = session(CheckpointFile::default(), None);
        let (tx, mut rx) = oneshot::channel();
        let id = RequestId::Number(1);
        let key = stream_key(&id);
        session.register(&id, &key, method::TOOLS_CALL, tx).expect("registered");
        drop(session.waiting(&key));
        assert!(matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Closed)), "the sender is dropped");
    }

    #[test]
    fn a_2026_07_28_call_mirrors_the_parameters_its_tool_declares() {
        let session = session(CheckpointFile::default(), None);
        session.learn_tools(&json!({"tools": [{"name": "t", "inputSchema": {"properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry"}}}}]}));
        let call = |name: &str, arguments: Value| {
            let params = json!({"name": name, "arguments": arguments});
            let (_, headers) = session.stateless_request(Request {
                id: RequestId::Number(1),
                method: method::TOOLS_CALL.into(),
                params: Some(params),
            });
            let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            (text("mcp-name"), text("mcp-param-region"), text("mcp-param-n"), text("mcp-param-dry"))
        };
        let (name, region, n, dry) = call("t", json!({"region": " élan", "n": 7}));
        assert_eq!(name.as_deref(), Some("t"));
        assert_eq!(region, Some(param_headers::encode_value(" élan")));
        assert_eq!(param_headers::decode_value(&region.expect("region")).as_deref(), Ok(" élan"));
        assert_eq!((n.as_deref(), dry), (Some("7"), None), "an absent argument has no header");
        let (name, region, ..) = call("été", json!({"region": "x"}));
        assert_eq!(name.as_deref(), Some("=?base64?w6l0w6k=?="), "a name that is not ASCII is encoded");
        assert_eq!(region, None, "an unknown tool mirrors nothing");
    }

    #[test]
    fn a_tool_declaring_its_headers_wrongly_is_excluded() {
        let session = session(CheckpointFile::default(), None);
        let tools = |kind: &str| {
            json!({"tools": [{"name": "t", "inputSchema": {"properties": {
            "p": {"type": kind, "x-mcp-header": "P"}}}}]})
        };
        session.learn_tools(&tools("number"));
        assert!(session.excluded_tool("t").is_some_and(|why| why.contains("only string, integer and boolean")));
        session.learn_tools(&tools("string"));
        assert_eq!(session.excluded_tool("t"), None, "a corrected listing takes it back");
    }

    #[test]
    fn the_standalone_stream_is_followed_once() {
        let session = session(CheckpointFile::default(), None);
        assert_eq!(session.start_standalone(), Some(0));
        assert_eq!(session.start_standalone(), None);
    }

    #[test]
    fn a_commit_from_a_replaced_generation_never_reaches_the_file() {
        let dir = std::env::temp_dir().join(format!("tether-session-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("cp.json");
        let file = CheckpointFile { session_id: Some("s".into()), ..CheckpointFile::default() };
        let session = session(file, Some(path.clone()));
        session.arrived(STANDALONE, cursor("e:g:1"));
        session.commit(1, STANDALONE, cursor("e:g:1"));
        assert!(!path.exists(), "a follower of another generation committed");
        session.commit(0, STANDALONE, cursor("e:g:1"));
        let saved = CheckpointFile::load(&path).expect("saved");
        assert_eq!(saved.streams.get(STANDALONE), Some(&cursor("e:g:1")));
        assert_eq!(session.last_id(STANDALONE).as_deref(), Some("e:g:1"));
        assert_eq!(session.lineage(STANDALONE).map(|c| c.last_digest), Some(Digest::of("e:g:1", b"x")));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
