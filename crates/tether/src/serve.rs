//! `tether serve`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use tether_server::{BearerToken, Builder, ServerConfig, builtin::BuiltinHandler, parse_duration};
use tether_store::MemoryStore;

/// Where sessions and events are kept.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StoreKind {
    /// In process memory: lost on restart, and a restart is visible to clients as 404.
    Memory,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8808")]
    listen: SocketAddr,
    /// Path of the MCP endpoint.
    #[arg(long, default_value = "/mcp")]
    path: String,
    /// Where sessions and events are kept.
    #[arg(long, value_enum, default_value = "memory")]
    store: StoreKind,
    /// How long a finished request's stream stays replayable (e.g. 500ms, 2s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    retention: Duration,
    /// How long a session lives without activity.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    session_idle_ttl: Duration,
    /// Most live sessions.
    #[arg(long, default_value_t = 10_000)]
    max_sessions: usize,
    /// An Origin allowed besides the loopback origins (repeatable).
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Require `Authorization: Bearer TOKEN` on every request.
    #[arg(long, env = "TETHER_AUTH_TOKEN")]
    auth_token: Option<String>,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = ServerConfig {
        session_idle_ttl: args.session_idle_ttl,
        max_sessions: args.max_sessions,
        allowed_origins: args.allowed_origins,
        require_loopback_host: args.listen.ip().is_loopback(),
        ..ServerConfig::default()
    };
    config.retention.ended_stream_ms = u64::try_from(args.retention.as_millis()).unwrap_or(u64::MAX);
    config.retention.tombstone_ms = config.retention.tombstone_ms.max(config.retention.ended_stream_ms);
    let store = match args.store {
        StoreKind::Memory => Arc::new(MemoryStore::new(config.retention)),
    };
    let mut builder = Builder::new(BuiltinHandler::new()).config(config).store(store);
    if let Some(token) = args.auth_token {
        builder = builder.authenticator(BearerToken::new(token));
    }
    let server = builder.build();
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}{}", args.path);
    let app = server.router(&args.path);
    tokio::select! {
        served = tether_server::serve(listener, app) => served.context("serving"),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
