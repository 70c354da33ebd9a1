//! Hosts an rmcp [`ServerHandler`] behind tether's transport (feature `rmcp`): an rmcp server
//! becomes a tether server, with exact resumption, 404s that say why and durable stores, by
//! changing only its transport setup.
//!
//! The rmcp service is an upstream ([`crate::upstream`]) reached in this process: each sessionful
//! session drives one service of its own, started when the session is initialized, with the
//! client's `initialize` params, and stopped when the process stops serving the session (a
//! session begun in another process has no service here and ends as `upstream_lost`);
//! 2026-07-28 requests share one. Messages cross an in-process transport as JSON values (no
//! text is written or parsed), and a request the service sends to the client carries the
//! request it originates from, so it goes out on that request's stream.
//!
//! ```no_run
//! # #[derive(Clone, Default)] struct MyServer;
//! # impl rmcp::ServerHandler for MyServer {}
//! # async fn run() -> std::io::Result<()> {
//! let server = tether_server::Builder::new(tether_gateway::rmcp::RmcpHandler::new(MyServer::default)).build();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8808").await?;
//! tether_server::serve(listener, server.router("/mcp"), tether_server::ConnectionLimits::default()).await
//! # }
//! ```

use std::sync::Arc;

use ::rmcp::model::{ClientJsonRpcMessage, GetExtensions, NumberOrString, ServerJsonRpcMessage};
use ::rmcp::service::{OriginatingRequestId, RoleServer};
use ::rmcp::transport::Transport;
use ::rmcp::{ServerHandler, serve_server};
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tether_core::jsonrpc::{self, Message, RequestId};
use tokio::sync::mpsc;

use tether_server::{AdoptFuture, Context, Handler, HandlerFuture, ServerInfo, SessionHandle};

use crate::upstream::{Connect, FromUpstream, LINK_QUEUE, Link, UpstreamHandler};

/// A tether [`Handler`] that hands every request to an rmcp [`ServerHandler`].
#[derive(Debug)]
pub struct RmcpHandler<S> {
    upstream: UpstreamHandler,
    _service: std::marker::PhantomData<fn() -> S>,
}

impl<S: ServerHandler> RmcpHandler<S> {
    /// Serves the rmcp handlers `make` returns, one per session. The server's identity,
    /// capabilities and instructions are those of a handler's `get_info`.
    pub fn new(make: impl Fn() -> S + Send + Sync + 'static) -> RmcpHandler<S> {
        let info = server_info(&make());
        let upstream = UpstreamHandler::new(Services { make: Arc::new(make) }, info);
        RmcpHandler { upstream, _service: std::marker::PhantomData }
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
        self.upstream.info()
    }

    fn call(&self, ctx: Context, method: String, params: Value) -> HandlerFuture {
        self.upstream.call(ctx, method, params)
    }

    fn session_started(&self, session: SessionHandle) {
        self.upstream.session_started(session);
    }

    fn adopts(&self, session: &SessionHandle) -> AdoptFuture {
        self.upstream.adopts(session)
    }

    fn notified(&self, session: SessionHandle, method: &str, params: Value) {
        self.upstream.notified(session, method, params);
    }
}

/// Starts rmcp services in this process.
struct Services<S> {
    make: Arc<dyn Fn() -> S + Send + Sync>,
}

impl<S: ServerHandler> Connect for Services<S> {
    fn connect(&self, _principal: Option<&str>) -> BoxFuture<'static, Result<Link, String>> {
        let handler = (self.make)();
        Box::pin(async move {
            let (to_upstream, from_tether) = mpsc::channel(LINK_QUEUE);
            let (to_tether, from_upstream) = mpsc::channel(LINK_QUEUE);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(async move {
                // rmcp's handshake reads the `initialize` tether sends once it has the link.
                match serve_server(handler, InProcess { from_tether, to_tether }).await {
                    // Dropping the running service cancels it.
                    Ok(running) => {
                        let _ = stopped.await;
                        drop(running);
                    }
                    Err(err) => tracing::warn!(%err, "the rmcp service did not start"),
                }
            });
            Ok(Link { to_upstream, from_upstream, keep: Box::new(stop) })
        })
    }

    fn describe(&self) -> String {
        "rmcp service".to_owned()
    }
}

/// The service's side of the in-process transport.
struct InProcess {
    from_tether: mpsc::Receiver<Message>,
    /// Sent to at once (`try_send`), not awaited: rmcp may poll several sends concurrently, and
    /// the order it called them in is the order tether must see. A queue full of what tether has
    /// not read means tether stopped serving the service.
    to_tether: mpsc::Sender<FromUpstream>,
}

/// tether stopped listening to the service.
#[derive(Debug, thiserror::Error)]
#[error("tether no longer serves this rmcp service")]
pub struct Detached;

impl Transport<RoleServer> for InProcess {
    type Error = Detached;

    fn send(&mut self, item: ServerJsonRpcMessage) -> impl Future<Output = Result<(), Detached>> + Send + 'static {
        let sent = match from_rmcp(&item) {
            Some(message) => self.to_tether.try_send(message).map_err(|_| Detached),
            None => {
                tracing::warn!("the rmcp service sent a message tether cannot read");
                Ok(())
            }
        };
        std::future::ready(sent)
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            let message = self.from_tether.recv().await?;
            match to_rmcp(&message) {
                Ok(message) => return Some(message),
                Err(err) => tracing::warn!(%err, "a message rmcp cannot read"),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Detached> {
        self.from_tether.close();
        Ok(())
    }
}

/// A JSON-RPC message in rmcp's types.
fn to_rmcp(message: &Message) -> Result<ClientJsonRpcMessage, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(message)?)
}

/// An rmcp message in tether's types, with the request a request to the client originates from.
fn from_rmcp(message: &ServerJsonRpcMessage) -> Option<FromUpstream> {
    let origin = match message {
        ServerJsonRpcMessage::Request(request) => {
            request.request.extensions().get::<OriginatingRequestId>().and_then(|id| match &id.0 {
                NumberOrString::Number(id) => Some(RequestId::Number(*id)),
                NumberOrString::String(_) => None,
            })
        }
        _ => None,
    };
    let message = jsonrpc::message_from_value(serde_json::to_value(message).ok()?).ok()?;
    Some(FromUpstream { message, origin })
}
