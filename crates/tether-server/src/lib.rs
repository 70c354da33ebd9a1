//! tether's MCP Streamable HTTP server.
//!
//! One endpoint serves both protocol eras: the sessionful revisions (2025-03-26, 2025-06-18,
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
mod clock;
mod config;
mod connection;
mod drain;
pub mod excerpt;
mod handler;
mod http;
mod ids;
mod listen;
mod persist;
mod reader;
mod refusal;
pub mod relay;
mod request;
mod server;
mod session;
mod tasks;
mod telemetry;
mod tls;
pub mod tools;
pub mod trace;

use tether_core::mcp::ProtocolVersion;

pub use auth::{
    Authentication, Authenticator, BearerToken, FetchFuture, Grant, Identity, Jwt, JwtConfig, KeySetSource,
    MAX_KEY_SET_BYTES, ProtectedResource, ResourceError, TokensError, Unauthenticated,
};
pub use config::{ServerConfig, parse_duration};
pub use connection::{App, ConnectionLimits, serve, serve_connection, serve_tls};
pub use drain::{Drain, NotReady, Readiness, health_router};
pub use handler::{AdoptFuture, Handler, HandlerFuture, ServerInfo};
pub use http::endpoint::Endpoint;
pub use refusal::Refusal;
pub use request::context::{Context, ContextError, SessionClient, SessionHandle};
pub use request::input::InputRequired;
pub use server::{Builder, Server, until_ready};
pub use session::LogLevel;
pub use telemetry::{ACCESS as ACCESS_LOG, default_log_filter};
pub use tls::{ServerTls, TlsError};

pub(crate) use clock::now_ms;
pub(crate) use server::ServerState;

/// The protocol versions this server speaks.
pub(crate) const SUPPORTED_VERSIONS: [ProtocolVersion; 4] = [
    ProtocolVersion::V2025_03_26,
    ProtocolVersion::V2025_06_18,
    ProtocolVersion::V2025_11_25,
    ProtocolVersion::V2026_07_28,
];
