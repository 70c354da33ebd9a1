//! An rmcp 3.11 Streamable HTTP server with rmcp's defaults, for interop, audit and bench runs.
//!
//! Tools: `count {to, interval_ms}` sends `to` notifications `interval_ms` apart (progress for
//! the request's progress token, else log messages, which rmcp puts on the standalone stream),
//! then a text result; `notify_all {seq}` sends one `notifications/message` to every initialized
//! session (their standalone GET streams) and returns how many it reached.
//!
//! Usage: rmcp-interop-server PORT [--json] [--nodelay] (binds 127.0.0.1 only); prints
//! `listening on http://127.0.0.1:PORT/mcp` once it accepts. `--json` is rmcp's JSON-response
//! mode, which rmcp offers only without sessions; `--nodelay` sets TCP_NODELAY on accepted
//! sockets, which `axum::serve` (rmcp's documented setup) does not.

// Logging is deprecated only for 2026-07-28 (SEP-2577); the legacy revisions this server
// speaks still use notifications/message.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam,
    RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::service::NotificationContext;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, tool, tool_handler, tool_router};

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct CountArgs {
    to: u32,
    interval_ms: Option<u64>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct NotifyArgs {
    seq: Option<u64>,
}

/// The peers of every initialized session, for `notify_all`.
type Peers = Arc<Mutex<Vec<Peer<RoleServer>>>>;

#[derive(Debug, Clone)]
struct Server {
    peers: Peers,
}

#[tool_router]
impl Server {
    #[tool(description = "Sends `to` notifications `interval_ms` apart (progress with a progress token, else log messages), then a result")]
    async fn count(
        &self,
        Parameters(args): Parameters<CountArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let token = meta.get_progress_token();
        let interval = args.interval_ms.unwrap_or(0);
        for i in 1..=args.to {
            let _ = match &token {
                Some(token) => {
                    let param = ProgressNotificationParam::new(token.clone(), f64::from(i)).with_total(f64::from(args.to));
                    peer.notify_progress(param).await
                }
                None => {
                    let data = serde_json::json!({ "count": i });
                    peer.notify_logging_message(LoggingMessageNotificationParam::new(LoggingLevel::Info, data)).await
                }
            };
            if interval > 0 {
                tokio::time::sleep(Duration::from_millis(interval)).await;
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("counted to {}", args.to))]))
    }

    #[tool(description = "Sends one notifications/message to every initialized session; returns how many")]
    async fn notify_all(&self, Parameters(args): Parameters<NotifyArgs>) -> Result<CallToolResult, ErrorData> {
        let peers: Vec<_> = self.peers.lock().map(|p| p.clone()).unwrap_or_default();
        let data = serde_json::json!({ "seq": args.seq.unwrap_or(0) });
        let mut sent = 0;
        for peer in peers {
            let param = LoggingMessageNotificationParam::new(LoggingLevel::Info, data.clone());
            if peer.notify_logging_message(param).await.is_ok() {
                sent += 1;
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("sent to {sent} sessions"))]))
    }
}

#[tool_handler]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_logging().build())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Ok(mut peers) = self.peers.lock() {
            peers.retain(|p| !p.is_transport_closed());
            peers.push(context.peer);
        }
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    let flag = |name: &str| args.iter().any(|a| a == name);
    let mut config = StreamableHttpServerConfig::default();
    if flag("--json") {
        config.legacy_session_mode = false;
        config.json_response = true;
    }
    let peers = Peers::default();
    let service =
        StreamableHttpService::new(move || Ok(Server { peers: Arc::clone(&peers) }), LocalSessionManager::default().into(), config);
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    if flag("--nodelay") {
        use axum::serve::ListenerExt;
        axum::serve(listener.tap_io(|tcp| drop(tcp.set_nodelay(true))), app).await
    } else {
        axum::serve(listener, app).await
    }
}
