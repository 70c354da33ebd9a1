//! Serves an upstream MCP server behind tether's transport: any peer that exchanges JSON-RPC
//! messages (a child process on stdio, an rmcp service in this process, a server reached over
//! HTTP) becomes a tether server, with exact resumption, 404s that say why, durable stores and
//! idempotency keys, whatever the upstream itself does.
//!
//! Each legacy session gets an upstream instance of its own ([`Connect::connect`]), started when
//! the session is initialized and initialized with the client's own `initialize` params; it is
//! stopped when the process stops serving the session. A session this process did not start
//! (begun before a restart, or at another replica) has no instance here, and its instance's
//! state is out of reach: it ends as `upstream_lost` ([`Handler::adopts`]) rather than being
//! served from reset state. If the upstream stops first, its running requests end with a
//! `request_aborted` error and the session ends as [`SessionEnd::UpstreamLost`]: later requests
//! naming it get 404 `upstream_lost`, so the client starts a new session instead of talking to
//! nothing. A 2026-07-28 request, which has no session, gets an instance of its own, initialized
//! with the capabilities the request declares and stopped when it ends: an upstream written for
//! one client per connection keeps per-connection state, which no two requests may share.
//!
//! Requests go to the upstream under ids of tether's own; its answers, progress (routed by
//! token), notifications and requests to the client (sampling, elicitation, roots) come back to
//! the request they belong to. A notification that belongs to no request goes to the session's
//! standalone stream (dropped if the client opened none). A request to the client goes out on
//! the stream of the request it originates from when the upstream says which (rmcp does), else
//! of the latest running one; with none running it is refused. The upstream's `ping` is
//! answered here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, Message, Notification, Request, RequestId, Response, code};
use tether_core::mcp::{ProtocolVersion, method};
use tether_store::SessionEnd;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::context::{Context, SessionHandle};
use crate::handler::{Handler, HandlerFuture, ServerInfo};

/// How long an upstream may take to answer `initialize`.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a session's running requests get to record their outcome once its upstream stopped.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// A message from the upstream.
#[derive(Debug)]
pub struct FromUpstream {
    /// The message.
    pub message: Message,
    /// The request (by the id the upstream received it under) that this message belongs to,
    /// when the upstream says: a request to the client, or a notification.
    pub origin: Option<RequestId>,
}

impl From<Message> for FromUpstream {
    fn from(message: Message) -> FromUpstream {
        FromUpstream { message, origin: None }
    }
}

/// One connected upstream instance: messages both ways, in order.
pub struct Link {
    /// What tether sends: requests, notifications and answers to the upstream's requests.
    pub to_upstream: mpsc::UnboundedSender<Message>,
    /// What the upstream sends; closed when it stops.
    pub from_upstream: mpsc::UnboundedReceiver<FromUpstream>,
    /// Held as long as the instance is used; dropping it stops the instance (a child process is
    /// killed, an in-process service dropped).
    pub keep: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

/// Starts upstream instances.
pub trait Connect: Send + Sync + 'static {
    /// Starts (or reaches) one instance, not yet initialized. The error says why not.
    fn connect(&self) -> BoxFuture<'static, Result<Link, String>>;

    /// Names the upstream in errors and logs (a command line, a URL).
    fn describe(&self) -> String;
}

/// A tether [`Handler`] that hands every request to an upstream server.
pub struct UpstreamHandler {
    info: ServerInfo,
    upstream: Arc<Upstream>,
}

/// A session's instance: none while it starts, then started or why not.
type Starting = watch::Receiver<Option<Result<Arc<Peer>, ErrorObject>>>;

/// The upstream as this process reaches it: how to start instances, and the running ones.
struct Upstream {
    connect: Box<dyn Connect>,
    /// The instances of the sessions this process serves, each started once, with the session
    /// (incarnation) it serves.
    sessions: Mutex<HashMap<String, (SessionHandle, Starting)>>,
}

impl std::fmt::Debug for UpstreamHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamHandler").field("upstream", &self.upstream.connect.describe()).finish_non_exhaustive()
    }
}

impl UpstreamHandler {
    /// Serves the upstream `connect` reaches, presenting it as `info` says.
    pub fn new(connect: impl Connect, info: ServerInfo) -> UpstreamHandler {
        let upstream = Upstream { connect: Box::new(connect), sessions: Mutex::default() };
        UpstreamHandler { info, upstream: Arc::new(upstream) }
    }

    /// Serves the upstream `connect` reaches, presenting it as it presents itself: one instance
    /// is started and initialized to learn its `serverInfo`, capabilities and instructions, then
    /// stopped.
    pub async fn discover(connect: impl Connect) -> Result<UpstreamHandler, ErrorObject> {
        let describe = connect.describe();
        let link = connect.connect().await.map_err(|err| unavailable(&describe, err))?;
        let (_peer, initialized) = Peer::start(link, client_params(&json!({})), None, describe.clone()).await?;
        let text = |pointer: &str| initialized.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
        let info = ServerInfo {
            name: text("/serverInfo/name").unwrap_or(describe),
            version: text("/serverInfo/version").unwrap_or_default(),
            instructions: text("/instructions"),
            capabilities: initialized.get("capabilities").cloned().unwrap_or_else(|| json!({})),
        };
        Ok(UpstreamHandler::new(connect, info))
    }
}

impl Upstream {
    /// Starts and initializes one instance.
    async fn start(&self, client: Value, session: Option<SessionHandle>) -> Result<Peer, ErrorObject> {
        let describe = self.connect.describe();
        let link = self.connect.connect().await.map_err(|err| unavailable(&describe, err))?;
        Ok(Peer::start(link, client, session, describe).await?.0)
    }

    /// Starts the instance of a session this process just initialized; if it cannot start, the
    /// session ends as `upstream_lost`.
    fn start_session(self: &Arc<Self>, session: SessionHandle) {
        let (started, starting) = watch::channel(None);
        lock(&self.sessions).insert(session.id().to_owned(), (session.clone(), starting));
        self.forget_when_ended(&session);
        let upstream = Arc::clone(self);
        tokio::spawn(async move {
            let peer = async {
                let client =
                    session.client_params().await.map_err(|err| unavailable(&upstream.connect.describe(), err))?;
                let peer = Arc::new(upstream.start(client, Some(session.clone())).await?);
                end_session_when_stopped(&peer, session.clone());
                Ok::<_, ErrorObject>(peer)
            }
            .await;
            let failed = peer.as_ref().err().map(|error| error.message.clone());
            started.send_replace(Some(peer));
            if let Some(error) = failed {
                tracing::warn!(session = session.id(), %error, "the session's upstream did not start");
                session.end(SessionEnd::UpstreamLost, ABORT_GRACE).await;
            }
        });
    }

    /// The instance of `session`, once started. A session this process did not start has none
    /// (the server asked [`Handler::adopts`] first, so only a request racing that refusal gets
    /// here).
    async fn session_peer(&self, session: SessionHandle) -> Result<Arc<Peer>, ErrorObject> {
        let starting = lock(&self.sessions)
            .get(session.id())
            .filter(|(serving, _)| serving.same(&session))
            .map(|(_, starting)| starting.clone());
        let gone = || lost(&self.connect.describe());
        let mut starting = starting.ok_or_else(gone)?;
        // Started at `initialize`: wait for it to be up (or to have failed).
        let started = starting.wait_for(Option::is_some).await.map_err(|_| gone())?;
        started.clone().unwrap_or_else(|| Err(gone()))
    }

    /// Forgets the session's instance once the process stops serving the session (unless
    /// another incarnation's has replaced it), which stops the instance once no request of it
    /// runs.
    fn forget_when_ended(self: &Arc<Self>, session: &SessionHandle) {
        let (upstream, session) = (Arc::downgrade(self), session.clone());
        tokio::spawn(async move {
            session.ended().await;
            let Some(upstream) = upstream.upgrade() else { return };
            let mut sessions = lock(&upstream.sessions);
            if sessions.get(session.id()).is_some_and(|(serving, _)| serving.same(&session)) {
                sessions.remove(session.id());
            }
        });
    }
}

/// Ends `session` as `upstream_lost` once its instance stops on its own.
fn end_session_when_stopped(peer: &Peer, session: SessionHandle) {
    let gone = peer.gone.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = gone.cancelled() => {
                tracing::warn!(session = session.id(), "the upstream stopped: the session ends");
                session.end(SessionEnd::UpstreamLost, ABORT_GRACE).await;
            }
            // Stopped by tether (the session ended first): nothing to report.
            () = session.ended() => {}
        }
    });
}

/// The `initialize` params of an instance started outside any session: the newest legacy
/// revision, and `capabilities` (a 2026-07-28 request's own, or none).
fn client_params(capabilities: &Value) -> Value {
    json!({
        "protocolVersion": ProtocolVersion::LATEST_LEGACY.as_str(),
        "capabilities": capabilities,
        "clientInfo": {"name": "tether", "version": env!("CARGO_PKG_VERSION")},
    })
}

impl Handler for UpstreamHandler {
    fn info(&self) -> ServerInfo {
        self.info.clone()
    }

    fn call(&self, ctx: Context, method: String, params: Value) -> HandlerFuture {
        let upstream = Arc::clone(&self.upstream);
        Box::pin(async move {
            let peer = match ctx.session() {
                Some(session) => upstream.session_peer(session).await?,
                // 2026-07-28: the request is the whole exchange.
                None => Arc::new(upstream.start(client_params(ctx.client_capabilities()), None).await?),
            };
            peer.call(ctx, method, params).await
        })
    }

    fn session_started(&self, session: SessionHandle) {
        self.upstream.start_session(session);
    }

    /// An instance's state lives in the process that started it: a session begun elsewhere has
    /// none here to talk to.
    fn adopts(&self, _session: &SessionHandle) -> bool {
        false
    }

    fn notified(&self, session: SessionHandle, method: &str, params: Value) {
        let peer = lock(&self.upstream.sessions)
            .get(session.id())
            .filter(|(serving, _)| serving.same(&session))
            .and_then(|(_, starting)| starting.borrow().as_ref().and_then(|started| started.as_ref().ok().cloned()));
        // A session whose instance has not started yet has nothing to tell: the instance starts
        // from the client's state as it then is.
        let Some(peer) = peer else { return };
        let params = (!params.is_null()).then_some(params);
        // A stopped instance has nobody left to tell.
        let _ = peer.to_upstream.send(Message::Notification(Notification { method: method.to_owned(), params }));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Maps of handles only: still consistent after a panic elsewhere.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The upstream could not be started or reached.
fn unavailable(upstream: &str, detail: impl std::fmt::Display) -> ErrorObject {
    ErrorObject::with_reason(
        code::INTERNAL_ERROR,
        format!("the upstream server ({upstream}) is unavailable: {detail}"),
        "upstream_unavailable",
    )
}

/// The upstream stopped while the request ran: whether it took effect there is unknown.
fn aborted(upstream: &str) -> ErrorObject {
    ErrorObject::with_reason(
        SERVER_ERROR,
        format!("the upstream server ({upstream}) stopped before answering"),
        "request_aborted",
    )
}

/// The upstream had stopped before the request could be sent: it did not run.
fn lost(upstream: &str) -> ErrorObject {
    ErrorObject::with_reason(
        SERVER_ERROR,
        format!("the upstream server ({upstream}) had stopped: the request was not sent; start a new session"),
        "upstream_lost",
    )
}

/// JSON-RPC's code for errors of the server's own.
const SERVER_ERROR: i64 = -32000;

/// A request of tether's that the upstream is running.
struct Call {
    ctx: Context,
    done: oneshot::Sender<Result<Value, ErrorObject>>,
}

type Calls = Arc<Mutex<HashMap<i64, Call>>>;

/// One initialized upstream instance and the requests it is answering. Dropping it stops the
/// instance.
struct Peer {
    to_upstream: mpsc::UnboundedSender<Message>,
    calls: Calls,
    next_id: AtomicI64,
    /// Cancelled when the instance stopped on its own (not when tether stopped it).
    gone: CancellationToken,
    describe: String,
    _stop: DropGuard,
}

impl Peer {
    /// Initializes the instance behind `link` with `client` (the client's `initialize` params)
    /// and starts routing what it sends. Returns it with its `initialize` result.
    async fn start(
        link: Link,
        client: Value,
        session: Option<SessionHandle>,
        describe: String,
    ) -> Result<(Peer, Value), ErrorObject> {
        let Link { to_upstream, mut from_upstream, keep } = link;
        let initialize = Request { id: RequestId::Number(0), method: method::INITIALIZE.into(), params: Some(client) };
        to_upstream.send(Message::Request(initialize)).map_err(|_| unavailable(&describe, "it stopped"))?;
        let answer = tokio::time::timeout(INITIALIZE_TIMEOUT, async {
            loop {
                let Some(FromUpstream { message, .. }) = from_upstream.recv().await else {
                    return Err(unavailable(&describe, "it stopped before answering initialize"));
                };
                match message {
                    Message::Response(Response { id: Some(RequestId::Number(0)), outcome }) => {
                        return outcome.map_err(|error| unavailable(&describe, error.message));
                    }
                    // Nothing to route to before the session is set up.
                    Message::Request(request) => {
                        let _ = to_upstream.send(Message::Response(Response {
                            id: Some(request.id.clone()),
                            outcome: answer_locally(&request).unwrap_or_else(|| {
                                Err(ErrorObject::with_reason(
                                    code::INTERNAL_ERROR,
                                    "not before initialization",
                                    "not_initialized",
                                ))
                            }),
                        }));
                    }
                    _ => {}
                }
            }
        })
        .await
        .map_err(|_| unavailable(&describe, "no answer to initialize"))??;
        let initialized = Notification { method: method::INITIALIZED.into(), params: None };
        to_upstream.send(Message::Notification(initialized)).map_err(|_| unavailable(&describe, "it stopped"))?;

        let (stop, gone) = (CancellationToken::new(), CancellationToken::new());
        let router = Router { to_upstream: to_upstream.clone(), calls: Calls::default(), session, describe };
        crate::telemetry::upstream_instances(1.0);
        let peer = Peer {
            to_upstream,
            calls: Arc::clone(&router.calls),
            next_id: AtomicI64::new(1),
            gone: gone.clone(),
            describe: router.describe.clone(),
            _stop: stop.clone().drop_guard(),
        };
        tokio::spawn(async move {
            // The instance lives as long as its messages are routed.
            let _keep = keep;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    message = from_upstream.recv() => match message {
                        Some(message) => router.route(message).await,
                        None => {
                            gone.cancel();
                            break;
                        }
                    },
                }
            }
            router.abort_all();
        });
        Ok((peer, answer))
    }

    /// Runs one request of tether's on the instance; a cancelled request is cancelled there too.
    async fn call(&self, ctx: Context, method: String, params: Value) -> Result<Value, ErrorObject> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (done, outcome) = oneshot::channel();
        lock(&self.calls).insert(id, Call { ctx: ctx.clone(), done });
        let request = Request { id: RequestId::Number(id), method, params: Some(params) };
        if self.to_upstream.send(Message::Request(request)).is_err() {
            lock(&self.calls).remove(&id);
            // Never sent, so certainly not run: not an abort.
            return Err(lost(&self.describe));
        }
        tokio::select! {
            outcome = outcome => outcome.unwrap_or_else(|_| Err(aborted(&self.describe))),
            () = ctx.cancelled() => {
                lock(&self.calls).remove(&id);
                let cancel = Notification {
                    method: method::CANCELLED.into(),
                    params: Some(json!({"requestId": id, "reason": "cancelled by the client"})),
                };
                // A stopped instance has nothing left to cancel.
                let _ = self.to_upstream.send(Message::Notification(cancel));
                Err(ErrorObject::with_reason(code::INTERNAL_ERROR, "the request was cancelled", "cancelled"))
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        crate::telemetry::upstream_instances(-1.0);
    }
}

/// The requests from an upstream that tether answers itself.
fn answer_locally(request: &Request) -> Option<Result<Value, ErrorObject>> {
    (request.method == method::PING).then(|| Ok(json!({})))
}

/// Routes what an instance sends to where tether delivers it.
struct Router {
    to_upstream: mpsc::UnboundedSender<Message>,
    calls: Calls,
    /// The session, for messages that belong to no request; none in 2026-07-28.
    session: Option<SessionHandle>,
    describe: String,
}

impl Router {
    async fn route(&self, FromUpstream { message, origin }: FromUpstream) {
        match message {
            Message::Response(response) => self.finish(response),
            Message::Notification(notification) => self.notify(notification, origin.as_ref()).await,
            Message::Request(request) => self.ask_client(request, origin.as_ref()),
        }
    }

    /// A request's outcome.
    fn finish(&self, response: Response) {
        let Some(RequestId::Number(id)) = response.id else { return };
        if let Some(call) = lock(&self.calls).remove(&id) {
            // The request may have been cancelled meanwhile.
            let _ = call.done.send(response.outcome);
        }
    }

    /// The running request a message belongs to: the one whose progress token it carries, else
    /// the one it says it originates from, else the latest.
    fn request_of(&self, token: Option<&Value>, origin: Option<&RequestId>) -> Option<Context> {
        let calls = lock(&self.calls);
        if let Some(token) = token {
            return calls.values().find(|call| call.ctx.progress_token() == Some(token)).map(|call| call.ctx.clone());
        }
        let origin = match origin {
            Some(RequestId::Number(id)) => calls.get(id),
            _ => None,
        };
        origin.or_else(|| calls.iter().max_by_key(|(id, _)| **id).map(|(_, call)| call)).map(|call| call.ctx.clone())
    }

    /// Progress goes to the stream of the request whose token it carries, a notification that
    /// says which request it belongs to to that request's stream, and any other to the
    /// session's standalone stream; without one it is dropped, as the spec has it ("SHOULD
    /// relate to the originating client request"): on stdio nothing ties a log line or a
    /// `list_changed` to whichever request happens to be running.
    async fn notify(&self, notification: Notification, origin: Option<&RequestId>) {
        let method = notification.method;
        let params = notification.params.unwrap_or(Value::Null);
        let token = (method == method::PROGRESS).then(|| params.get("progressToken")).flatten();
        let sent = match (token, origin, &self.session) {
            (None, None, Some(session)) => session.broadcast(&method, params).await.unwrap_or(false),
            // In 2026-07-28 the instance serves one request: the latest is the one.
            _ => match self.request_of(token, origin) {
                Some(ctx) => ctx.notify(&method, params).await.is_ok(),
                None => false,
            },
        };
        if !sent {
            tracing::debug!(%method, "an upstream notification had nowhere to go");
        }
    }

    /// A request to the client goes out on the stream of the request it originates from, else
    /// of the latest running one; the client's answer goes back to the upstream.
    fn ask_client(&self, request: Request, origin: Option<&RequestId>) {
        let ctx = match answer_locally(&request) {
            Some(outcome) => {
                let _ = self.to_upstream.send(Message::Response(Response { id: Some(request.id), outcome }));
                return;
            }
            None => self.request_of(None, origin),
        };
        let to_upstream = self.to_upstream.clone();
        tokio::spawn(async move {
            let outcome = match ctx {
                Some(ctx) => {
                    ctx.request(&request.method, request.params.unwrap_or(Value::Null)).await.map_err(|err| match err {
                        crate::ContextError::Client { code, message } => ErrorObject { code, message, data: None },
                        err => ErrorObject::with_reason(code::INTERNAL_ERROR, err.to_string(), "client_request_failed"),
                    })
                }
                None => Err(ErrorObject::with_reason(
                    code::INTERNAL_ERROR,
                    "no request is running whose stream could carry this request",
                    "no_stream",
                )),
            };
            // A stopped instance no longer waits for the answer.
            let _ = to_upstream.send(Message::Response(Response { id: Some(request.id), outcome }));
        });
    }

    /// The instance stopped: its running requests get an error, not silence.
    fn abort_all(&self) {
        for (_, call) in lock(&self.calls).drain() {
            let _ = call.done.send(Err(aborted(&self.describe)));
        }
    }
}
