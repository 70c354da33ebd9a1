//! tether's endpoint inside an axum application with routes of its own: the MCP endpoint is a
//! `Router` like any other, merged beside a health check and a page.
//! `cargo run -p tether-examples --example axum_routes`.

use axum::routing::get;
use tether_builtin::BuiltinHandler;
use tether_server::{Builder, ServerConfig};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mcp = Builder::new(BuiltinHandler::in_memory()).config(ServerConfig::default()).build();
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/", get(|| async { "an application that also speaks MCP at /mcp" }))
        .merge(mcp.router("/mcp"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8809").await?;
    println!("listening on http://127.0.0.1:8809 (MCP at /mcp)");
    // `tether_server::serve` sets TCP_NODELAY on every accepted socket, which SSE needs.
    tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await
}
