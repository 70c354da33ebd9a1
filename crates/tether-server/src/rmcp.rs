//! Hosts an rmcp [`ServerHandler`] behind tether's transport (feature `rmcp`): an rmcp server
//! becomes a tether server, with exact resumption, 404s that say why and durable stores, by
//! changing only its transport setup.
//!
//! Each legacy session drives one rmcp service of its own, started on the session's first
//! request in this process with the client's `initialize` params and stopped when the process
//! stops serving the session; a 2026-07-28 request, which has no session, gets a service of its
//! own. The service talks to tether over an in-process transport: requests go in under ids of
//! the adapter's own, client notifications as they are, and what the service sends comes out
//! routed as rmcp's own Streamable HTTP server routes it — progress by its token to its
//! request's stream, every other notification to the session's standalone stream — except
//! server requests: tether sends them on a request's stream (the one they originate from,
//! else the latest running one), so one with no running request is refused.
//!
//! ```no_run
//! # #[derive(Clone, Default)] struct MyServer;
//! # impl rmcp::ServerHandler for MyServer {}
//! # async fn run() -> std::io::Result<()> {
//! let server = tether_server::Builder::new(tether_server::rmcp::RmcpHandler::new(MyServer::default)).build();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8808").await?;
//! tether_server::serve(listener, server.router("/mcp"), tether_server::ConnectionLimits::default()).await
//! # }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ::rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use ::rmcp::service::{OriginatingRequestId, RoleServer};
use ::rmcp::transport::Transport;
use ::rmcp::{ServerHandler, serve_server};
use serde_json::{Value, json};
use tether_core::jsonrpc::{self, ErrorObject, Message, Notification, Request, RequestId, Response, code};
use tether_core::mcp::{ProtocolVersion, method};
use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::context::{Context, SessionHandle};
use crate::handler::{Handler, HandlerFuture, ServerInfo};

/// Makes one rmcp service per session.
type Factory<S> = Arc<dyn Fn() -> S + Send + Sync>;

/// The services of the sessions this process serves, each started once, with the session
/// (incarnation) it serves.
type Services = Arc<Mutex<HashMap<String, (SessionHandle, Arc<OnceCell<Arc<Service>>>)>>>;

/// A tether [`Handler`] that hands every request to an rmcp [`ServerHandler`].
pub struct RmcpHandler<S> {
    make: Factory<S>,
    info: ServerInfo,
    services: Services,
}

impl<S> std::fmt::Debug for RmcpHandler<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmcpHandler").field("server", &self.info.name).finish_non_exhaustive()
    }
}

impl<S: ServerHandler> RmcpHandler<S> {
    /// Serves the rmcp handlers `make` returns, one per session. The server's identity,
    /// capabilities and instructions are those of a handler's `get_info`.
    pub fn new(make: impl Fn() -> S + Send + Sync + 'static) -> RmcpHandler<S> {
        let info = server_info(&make());
        RmcpHandler { make: Arc::new(make), info, services: Arc::default() }
    }
}

/// tether's view of what an rmcp handler says about itself.
fn server_info(handler: &impl ServerHandler) -> ServerInfo {
    let info = serde_json::to_value(handler.get_info()).unwrap_or_default();
    let text = |pointer: &str| info.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
    ServerInfo {
        name: text("/serverInfo/name").unwrap_or_else(|| "rmcp".to_owned()),
        version: text("/serverInfo/version").unwrap_or_default(),
        instructions: text("/instructions"),
        capabilities: info.get("capabilities").cloned().unwrap_or_else(|| json!({})),
    }
}

impl<S: ServerHandler> Handler for RmcpHandler<S> {
    fn info(&self) -> ServerInfo {
        self.info.clone()
    }

    fn call(&self, ctx: Context, method: String, params: Value) -> HandlerFuture {
        let (make, services) = (Arc::clone(&self.make), Arc::clone(&self.services));
        Box::pin(async move {
            let service = match ctx.session() {
                Some(session) => session_service(&services, &make, session).await?,
                // 2026-07-28: the request is the whole exchange.
                None => {
                    let params = json!({
                        "protocolVersion": ProtocolVersion::LATEST_LEGACY.as_str(),
                        "capabilities": ctx.client_capabilities(),
                        "clientInfo": {"name": "tether", "version": env!("CARGO_PKG_VERSION")},
                    });
                    Arc::new(Service::start(make(), params, None).await?)
                }
            };
            service.call(ctx, method, params).await
        })
    }

    fn notified(&self, session: SessionHandle, method: &str, params: Value) {
        let service = lock(&self.services)
            .get(session.id())
            .filter(|(serving, _)| serving.same(&session))
            .and_then(|(_, cell)| cell.get().cloned());
        // A session whose service has not started yet has nothing to tell: the service starts
        // from the client's state as it then is.
        let Some(service) = service else { return };
        let params = (!params.is_null()).then_some(params);
        let notification = Message::Notification(Notification { method: method.to_owned(), params });
        match to_rmcp(&notification) {
            Ok(notification) => drop(service.to_service.send(notification)),
            Err(err) => tracing::debug!(%err, method, "a client notification rmcp cannot read"),
        }
    }
}

/// The service of `session`, started on its first request here; forgotten when the process
/// stops serving the session, which stops it once no request of it runs any more.
async fn session_service<S: ServerHandler>(
    services: &Services,
    make: &Factory<S>,
    session: SessionHandle,
) -> Result<Arc<Service>, ErrorObject> {
    let cell = {
        let mut map = lock(services);
        match map.get(session.id()) {
            Some((serving, cell)) if serving.same(&session) => Arc::clone(cell),
            // None yet, or one of an incarnation this process no longer serves.
            _ => {
                let cell = Arc::<OnceCell<Arc<Service>>>::default();
                map.insert(session.id().to_owned(), (session.clone(), Arc::clone(&cell)));
                forget_when_ended(Arc::clone(services), &session);
                cell
            }
        }
    };
    let service = cell
        .get_or_try_init(|| async {
            let client = session.client_params().await.map_err(unavailable)?;
            Ok(Arc::new(Service::start(make(), client, Some(session)).await?))
        })
        .await?;
    Ok(Arc::clone(service))
}

/// Forgets the session's service once the process stops serving the session (unless another
/// incarnation's has replaced it), which stops the service once no request of it runs.
fn forget_when_ended(services: Services, session: &SessionHandle) {
    let session = session.clone();
    tokio::spawn(async move {
        session.ended().await;
        let mut services = lock(&services);
        if services.get(session.id()).is_some_and(|(serving, _)| serving.same(&session)) {
            services.remove(session.id());
        }
    });
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Maps of handles only: still consistent after a panic elsewhere.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A request of tether's that the service is running.
struct Call {
    ctx: Context,
    done: oneshot::Sender<Result<Value, ErrorObject>>,
}

type Calls = Arc<Mutex<HashMap<i64, Call>>>;

/// One running rmcp service and the requests it is answering. Dropping it stops the service.
struct Service {
    to_service: mpsc::UnboundedSender<ClientJsonRpcMessage>,
    calls: Calls,
    next_id: AtomicI64,
    _stop: DropGuard,
}

/// The service's side of the in-process transport.
struct InProcess {
    from_tether: mpsc::UnboundedReceiver<ClientJsonRpcMessage>,
    /// Unbounded so that `send` queues at once: rmcp may poll several sends concurrently, and
    /// the order it called them in is the order tether must see.
    to_tether: mpsc::UnboundedSender<ServerJsonRpcMessage>,
}

/// tether stopped listening to the service.
#[derive(Debug, thiserror::Error)]
#[error("tether no longer serves this rmcp service")]
pub struct Detached;

impl Transport<RoleServer> for InProcess {
    type Error = Detached;

    fn send(&mut self, item: ServerJsonRpcMessage) -> impl Future<Output = Result<(), Detached>> + Send + 'static {
        std::future::ready(self.to_tether.send(item).map_err(|_| Detached))
    }

    fn receive(&mut self) -> impl Future<Output = Option<ClientJsonRpcMessage>> + Send {
        self.from_tether.recv()
    }

    async fn close(&mut self) -> Result<(), Detached> {
        self.from_tether.close();
        Ok(())
    }
}

/// A JSON-RPC message in rmcp's types.
/// (Through a JSON value: no text is written or parsed.)
fn to_rmcp(message: &Message) -> Result<ClientJsonRpcMessage, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(message)?)
}

/// An rmcp message in tether's types.
fn from_rmcp(message: &ServerJsonRpcMessage) -> Option<Message> {
    jsonrpc::message_from_value(serde_json::to_value(message).ok()?).ok()
}

fn unavailable(detail: impl std::fmt::Display) -> ErrorObject {
    ErrorObject::with_reason(
        code::INTERNAL_ERROR,
        format!("the rmcp service is unavailable: {detail}"),
        "rmcp_unavailable",
    )
}

impl Service {
    /// Starts `handler` and initializes it with the client's `initialize` params. tether
    /// answered the client's `initialize` itself; the service's answer is not needed.
    async fn start(
        handler: impl ServerHandler,
        client: Value,
        session: Option<SessionHandle>,
    ) -> Result<Service, ErrorObject> {
        let (to_service, from_tether) = mpsc::unbounded_channel();
        let (to_tether, mut from_service) = mpsc::unbounded_channel();
        let initialize = Message::Request(Request {
            id: RequestId::Number(0),
            method: method::INITIALIZE.into(),
            params: Some(client),
        });
        let initialized = Message::Notification(Notification { method: method::INITIALIZED.into(), params: None });
        for message in [initialize, initialized] {
            let message = to_rmcp(&message).map_err(|err| unavailable(format!("bad initialize params: {err}")))?;
            to_service.send(message).map_err(unavailable)?;
        }
        let running = serve_server(handler, InProcess { from_tether, to_tether }).await.map_err(unavailable)?;
        match from_service.recv().await.as_ref().and_then(from_rmcp) {
            Some(Message::Response(Response { outcome: Ok(_), .. })) => {}
            Some(Message::Response(Response { outcome: Err(error), .. })) => return Err(unavailable(error.message)),
            _ => return Err(unavailable("no answer to initialize")),
        }
        let stop = CancellationToken::new();
        let calls = Calls::default();
        let router = Router { to_service: to_service.clone(), calls: Arc::clone(&calls), session };
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stopped.cancelled() => break,
                    message = from_service.recv() => match message {
                        Some(message) => router.route(message).await,
                        None => break,
                    },
                }
            }
            // Dropping the running service cancels it.
            drop(running);
            router.fail_all();
        });
        Ok(Service { to_service, calls, next_id: AtomicI64::new(1), _stop: stop.drop_guard() })
    }

    /// Runs one request of tether's on the service; a cancelled request is cancelled there too.
    async fn call(&self, ctx: Context, method: String, params: Value) -> Result<Value, ErrorObject> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = Message::Request(Request { id: RequestId::Number(id), method, params: Some(params) });
        let request = to_rmcp(&request)
            .map_err(|err| ErrorObject::with_reason(code::INVALID_PARAMS, err.to_string(), "invalid_params"))?;
        let (done, outcome) = oneshot::channel();
        lock(&self.calls).insert(id, Call { ctx: ctx.clone(), done });
        if self.to_service.send(request).is_err() {
            lock(&self.calls).remove(&id);
            return Err(unavailable("it stopped"));
        }
        tokio::select! {
            outcome = outcome => outcome.unwrap_or_else(|_| Err(unavailable("it stopped"))),
            () = ctx.cancelled() => {
                lock(&self.calls).remove(&id);
                let cancel = Message::Notification(Notification {
                    method: method::CANCELLED.into(),
                    params: Some(json!({"requestId": id, "reason": "cancelled by the client"})),
                });
                if let Ok(cancel) = to_rmcp(&cancel) {
                    // A stopped service has nothing left to cancel.
                    let _ = self.to_service.send(cancel);
                }
                Err(ErrorObject::with_reason(code::INTERNAL_ERROR, "the request was cancelled", "cancelled"))
            }
        }
    }
}

/// Routes what a service sends to where tether delivers it.
struct Router {
    to_service: mpsc::UnboundedSender<ClientJsonRpcMessage>,
    calls: Calls,
    /// The session, for messages that belong to no request; none in 2026-07-28.
    session: Option<SessionHandle>,
}

impl Router {
    async fn route(&self, message: ServerJsonRpcMessage) {
        let originating = match &message {
            ServerJsonRpcMessage::Request(request) => {
                use ::rmcp::model::GetExtensions;
                request.request.extensions().get::<OriginatingRequestId>().map(|id| id.0.clone())
            }
            _ => None,
        };
        let answered = match &message {
            ServerJsonRpcMessage::Response(response) => Some(response.id.clone()),
            ServerJsonRpcMessage::Error(error) => error.id.clone(),
            _ => None,
        };
        match from_rmcp(&message) {
            Some(Message::Response(response)) => self.finish(response),
            Some(Message::Notification(notification)) => self.notify(notification).await,
            Some(Message::Request(request)) => self.ask_client(request, originating),
            None => {
                tracing::warn!("the rmcp service sent a message tether cannot read");
                // A request whose answer cannot be read still ends, with an error.
                if let Some(::rmcp::model::NumberOrString::Number(id)) = answered {
                    let error = ErrorObject::with_reason(code::INTERNAL_ERROR, "unreadable answer", "rmcp_unreadable");
                    self.finish(Response { id: Some(RequestId::Number(id)), outcome: Err(error) });
                }
            }
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

    /// Progress goes to the stream of the request whose token it carries; everything else to
    /// the session's standalone stream, or in 2026-07-28 to the request the service serves.
    async fn notify(&self, notification: Notification) {
        let params = notification.params.unwrap_or(Value::Null);
        let token = (notification.method == method::PROGRESS).then(|| params.get("progressToken")).flatten();
        let request = {
            let calls = lock(&self.calls);
            match (token, &self.session) {
                (Some(token), _) => calls.values().find(|c| c.ctx.progress_token() == Some(token)),
                (None, Some(_)) => None,
                (None, None) => calls.values().next(),
            }
            .map(|call| call.ctx.clone())
        };
        let sent = match (request, &self.session) {
            (Some(ctx), _) => ctx.notify(&notification.method, params).await.map(|()| true),
            (None, Some(session)) => session.broadcast(&notification.method, params).await,
            (None, None) => Ok(false),
        };
        if !matches!(sent, Ok(true)) {
            tracing::debug!(method = %notification.method, "an rmcp notification had nowhere to go");
        }
    }

    /// A request to the client goes out on the stream of the request it originates from, else
    /// of the latest running one; the client's answer goes back to the service.
    fn ask_client(&self, request: Request, originating: Option<::rmcp::model::RequestId>) {
        let ctx = {
            let calls = lock(&self.calls);
            let originating = match originating {
                Some(::rmcp::model::NumberOrString::Number(id)) => calls.get(&id),
                _ => None,
            };
            originating.or_else(|| calls.iter().max_by_key(|(id, _)| **id).map(|(_, call)| call)).map(|c| c.ctx.clone())
        };
        let to_service = self.to_service.clone();
        tokio::spawn(async move {
            let outcome = match ctx {
                Some(ctx) => ctx.request(&request.method, request.params.unwrap_or(Value::Null)).await.map_err(|err| {
                    ErrorObject::with_reason(code::INTERNAL_ERROR, err.to_string(), "client_request_failed")
                }),
                None => Err(ErrorObject::with_reason(
                    code::INTERNAL_ERROR,
                    "no request is running whose stream could carry this request",
                    "no_stream",
                )),
            };
            let answer = Message::Response(Response { id: Some(request.id), outcome });
            if let Ok(answer) = to_rmcp(&answer) {
                // A stopped service no longer waits for the answer.
                let _ = to_service.send(answer);
            }
        });
    }

    /// The service stopped: its running requests get an error, not silence.
    fn fail_all(&self) {
        for (_, call) in lock(&self.calls).drain() {
            let _ = call.done.send(Err(unavailable("it stopped")));
        }
    }
}
