//! An rmcp server written the usual rmcp way (`#[tool_router]`, `#[tool]`, `ServerHandler`),
//! which `rmcp_server.rs` serves through tether and the rmcp test resumes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ServerCapabilities, ServerConfig};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, tool, tool_handler, tool_router};

/// What every instance of [`Counter`] shares: how often a tool ran, how many instances live.
#[derive(Debug, Default)]
pub struct Stats {
    /// Runs of `count`, over every session.
    pub runs: AtomicU64,
    /// Instances alive: one per session this process serves.
    pub live: AtomicUsize,
    /// `notifications/roots/list_changed` received, over every session.
    pub roots_changed: AtomicU64,
    /// Steps `count` took, over every call.
    pub steps: AtomicU64,
}

/// Counts an instance as alive until its last clone is dropped.
#[derive(Debug)]
struct Alive(Arc<Stats>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `count`'s arguments.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct CountArgs {
    /// How many progress notifications to send.
    pub to: u32,
    /// Milliseconds between them.
    pub interval_ms: Option<u64>,
}

/// Two tools: `count` (progress notifications `1..=to`, then "counted to {to}") and `roots`
/// (the client's roots, asked for mid-call).
#[derive(Debug, Clone)]
pub struct Counter {
    stats: Arc<Stats>,
    _alive: Arc<Alive>,
}

impl Counter {
    /// A new instance sharing `stats`.
    pub fn new(stats: Arc<Stats>) -> Counter {
        stats.live.fetch_add(1, Ordering::SeqCst);
        Counter { _alive: Arc::new(Alive(Arc::clone(&stats))), stats }
    }
}

#[tool_router]
impl Counter {
    /// Counts to `to`, reporting each step as progress.
    #[tool(description = "Sends progress 1..=to, interval_ms apart, then a text result")]
    async fn count(
        &self,
        Parameters(args): Parameters<CountArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.stats.runs.fetch_add(1, Ordering::SeqCst);
        for i in 1..=args.to {
            // rmcp cancels cooperatively: the request's token, not its future.
            if context.ct.is_cancelled() {
                return Err(ErrorData::internal_error("cancelled", None));
            }
            self.stats.steps.fetch_add(1, Ordering::SeqCst);
            if let Some(token) = context.meta.get_progress_token() {
                let param = ProgressNotificationParam::new(token, f64::from(i)).with_total(f64::from(args.to));
                let sent = context.peer.notify_progress(param).await;
                sent.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            }
            tokio::time::sleep(Duration::from_millis(args.interval_ms.unwrap_or(0))).await;
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("counted to {}", args.to))]))
    }

    /// Asks the client for its roots (a request from server to client, in the middle of a call).
    /// Roots are deprecated only for 2026-07-28 (SEP-2577); the legacy revisions have them.
    #[allow(deprecated)]
    #[tool(description = "Returns the URIs of the client's roots")]
    async fn roots(&self, peer: Peer<RoleServer>) -> Result<CallToolResult, ErrorData> {
        let roots = peer.list_roots().await.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let uris: Vec<String> = roots.roots.into_iter().map(|root| root.uri).collect();
        Ok(CallToolResult::success(vec![ContentBlock::text(uris.join(" "))]))
    }
}

#[tool_handler]
impl ServerHandler for Counter {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn on_roots_list_changed(&self, _: NotificationContext<RoleServer>) {
        self.stats.roots_changed.fetch_add(1, Ordering::SeqCst);
    }
}
