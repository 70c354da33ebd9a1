//! An rmcp 3.11 Streamable HTTP server with rmcp's defaults, for interop and audit runs.
//! Tool `count {to, interval_ms}` sends `to` progress notifications (for the request's
//! progress token: rmcp puts only those on the request's stream), `interval_ms` apart, then a
//! text result. Usage: rmcp-interop-server PORT (binds 127.0.0.1 only); prints
//! `listening on http://127.0.0.1:PORT/mcp` once it accepts.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, ProgressNotificationParam, RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, tool, tool_handler, tool_router};

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct CountArgs {
    to: u32,
    interval_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct Server;

#[tool_router]
impl Server {
    #[tool(description = "Sends `to` progress notifications `interval_ms` apart (needs _meta.progressToken), then a result")]
    async fn count(
        &self,
        Parameters(args): Parameters<CountArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let token = meta.get_progress_token().ok_or_else(|| ErrorData::invalid_params("_meta.progressToken is required", None))?;
        for i in 1..=args.to {
            let param = ProgressNotificationParam::new(token.clone(), f64::from(i)).with_total(f64::from(args.to));
            let _ = peer.notify_progress(param).await;
            tokio::time::sleep(Duration::from_millis(args.interval_ms.unwrap_or(0))).await;
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("counted to {}", args.to))]))
    }
}

#[tool_handler]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    let service = StreamableHttpService::new(
        || Ok(Server),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, app).await
}
