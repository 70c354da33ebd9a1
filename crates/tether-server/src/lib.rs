//! tether's MCP Streamable HTTP server.
//!
//! One endpoint serves both protocol eras: the legacy revisions (2025-03-26, 2025-06-18,
//! 2025-11-25) with sessions and resumable streams, and 2026-07-28 statelessly. Every event of a
//! session carries a lineage id `{epoch}:{stream}:{seq}` and goes to the store before any client
//! sees it, so a resume is answered exactly, with a 404 that says why the session is gone, or
//! with one explicit `resync` event; never with a silent empty stream.
//!
//! ```no_run
//! # async fn run(handler: impl tether_server::Handler) -> std::io::Result<()> {
//! let server = tether_server::Builder::new(handler).build();
//! let app = server.router("/mcp");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8808").await?;
//! tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await
//! # }
//! ```

mod auth;
pub mod builtin;
mod config;
mod connection;
mod context;
mod dispatch;
mod handler;
mod http;
mod idempotency;
mod ids;
mod reader;
mod request_key;
#[cfg(feature = "rmcp")]
pub mod rmcp;
mod session;
mod telemetry;
pub mod tools;

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tether_core::mcp::ProtocolVersion;
use tether_store::{MemoryStore, Store, StoreError};

pub use auth::{Authenticator, BearerToken};
pub use config::{ServerConfig, parse_duration};
pub use connection::{ConnectionLimits, serve, serve_connection};
pub use context::{Context, ContextError, SessionHandle};
pub use handler::{Handler, HandlerFuture, ServerInfo};
pub use session::LogLevel;

use crate::session::Sessions;

/// The protocol versions this server speaks.
pub(crate) const SUPPORTED_VERSIONS: [ProtocolVersion; 4] = [
    ProtocolVersion::V2025_03_26,
    ProtocolVersion::V2025_06_18,
    ProtocolVersion::V2025_11_25,
    ProtocolVersion::V2026_07_28,
];

/// State shared by every request of one server.
pub(crate) struct Shared {
    pub config: ServerConfig,
    pub handler: Arc<dyn Handler>,
    pub store: Arc<dyn Store>,
    pub sessions: Sessions,
    pub auth: Option<Arc<dyn Authenticator>>,
    /// Distinguishes this process's server-to-client request ids from other replicas'.
    pub process_token: String,
}

/// Milliseconds since the Unix epoch: the clock every expiry is measured on.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Assembles a server from a handler, a store and a config.
pub struct Builder {
    handler: Arc<dyn Handler>,
    store: Option<Arc<dyn Store>>,
    config: ServerConfig,
    auth: Option<Arc<dyn Authenticator>>,
}

impl Builder {
    /// A server for `handler` with the default config and an in-memory store.
    pub fn new(handler: impl Handler) -> Builder {
        Builder { handler: Arc::new(handler), store: None, config: ServerConfig::default(), auth: None }
    }

    /// Uses `store` for sessions, events and request records.
    pub fn store(mut self, store: Arc<dyn Store>) -> Builder {
        self.store = Some(store);
        self
    }

    /// Uses `config`.
    pub fn config(mut self, config: ServerConfig) -> Builder {
        self.config = config;
        self
    }

    /// Requires every request to authenticate; a session belongs to the principal that created it.
    pub fn authenticator(mut self, auth: impl Authenticator) -> Builder {
        self.auth = Some(Arc::new(auth));
        self
    }

    /// The server.
    pub fn build(self) -> Server {
        let store = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new(self.config.retention)));
        // Uniqueness across replicas only needs to be probable; a time-based fallback is enough
        // if the OS random source fails at start-up.
        let process_token = ids::token().unwrap_or_else(|_| format!("p{}", now_ms()));
        let shared = Shared {
            config: self.config,
            handler: self.handler,
            store,
            sessions: Sessions::default(),
            auth: self.auth,
            process_token,
        };
        Server { shared: Arc::new(shared) }
    }
}

/// A built server: mount its router anywhere.
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// An axum router serving the MCP endpoint at `path`. Also starts the background sweep that
    /// expires idle sessions and drops old history; it stops when the router is dropped.
    pub fn router(&self, path: &str) -> axum::Router {
        tokio::spawn(sweep(Arc::downgrade(&self.shared)));
        if let Some(answers) = self.shared.store.relayed_answers() {
            tokio::spawn(deliver_relayed(Arc::downgrade(&self.shared), answers));
        }
        http::router(path, Arc::clone(&self.shared))
    }
}

/// Delivers answers other replicas received for this process's waiting handlers.
async fn deliver_relayed(
    shared: Weak<Shared>,
    mut answers: tokio::sync::broadcast::Receiver<tether_store::RelayedAnswer>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let answer = match answers.recv().await {
            Ok(answer) => answer,
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "relayed answers were dropped");
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        let Some(shared) = shared.upgrade() else { return };
        let Some(runtime) = shared.sessions.get(&answer.session) else { continue };
        if let Ok(tether_core::jsonrpc::Message::Response(response)) =
            tether_core::jsonrpc::parse_message(&answer.response)
        {
            // Another replica's handler, or nobody's: either way not ours to report.
            let _ = runtime.answer_client_request(&answer.request_id, response.outcome);
        }
    }
}

/// Keeps active sessions alive, expires idle ones and applies retention, until the server is gone.
async fn sweep(shared: Weak<Shared>) {
    let interval = match shared.upgrade() {
        Some(shared) => shared.config.sweep_interval.max(Duration::from_millis(10)),
        None => return,
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        let now = now_ms();
        // Open streams and running requests are activity: renew those sessions first. Only a
        // session the store says is gone ends here; a store hiccup is retried next sweep.
        for runtime in shared.sessions.active() {
            match shared.store.touch_session(&runtime.id, &runtime.epoch, now).await {
                Ok(()) => {}
                Err(StoreError::SessionGone) => shared.sessions.remove(&runtime.id),
                Err(err) => tracing::warn!(%err, session = %runtime.id, "could not renew an active session"),
            }
        }
        // Idle runtimes of sessions that ended elsewhere (another replica expired or deleted
        // them) are dropped, so they neither leak nor count against the session limit.
        for runtime in shared.sessions.idle() {
            let status = shared.store.session(&runtime.id, now).await;
            let live = matches!(&status, Ok(tether_store::SessionStatus::Live(r)) if r.epoch == runtime.epoch);
            if !live && status.is_ok() {
                shared.sessions.remove(&runtime.id);
            }
        }
        match shared.store.sweep(now).await {
            Ok(expired) => {
                for id in &expired {
                    tracing::debug!(session = %id, "session expired");
                    shared.sessions.remove(id);
                }
                telemetry::sessions_expired(expired.len());
            }
            Err(err) => tracing::warn!(%err, "store sweep failed"),
        }
        if let Ok(Some(bytes)) = shared.store.retained_bytes().await {
            telemetry::bytes_retained(bytes);
        }
    }
}
