//! What an application implements: a handler for MCP requests.

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;
use tether_core::jsonrpc::ErrorObject;
use tether_core::param_headers::ParamHeader;
use tether_core::tasks::TaskSupport;

use crate::request::context::{Context, SessionHandle};

/// The future a handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Value, ErrorObject>> + Send + 'static>>;

/// The future of [`Handler::adopts`].
pub type AdoptFuture = Pin<Box<dyn Future<Output = bool> + Send + 'static>>;

/// Who the server is, as `initialize` and `server/discover` report it.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `serverInfo.name`.
    pub name: String,
    /// `serverInfo.version`.
    pub version: String,
    /// Optional instructions for the model.
    pub instructions: Option<String>,
    /// The server capabilities (`tools`, `resources`, `prompts`, ...). tether adds `logging`
    /// and its own experimental capabilities.
    pub capabilities: Value,
}

/// Answers MCP requests. tether handles the protocol itself (`initialize`, `ping`,
/// `logging/setLevel`, `server/discover`, sessions, streams, resumption); everything else —
/// `tools/*`, `resources/*`, `prompts/*`, `completion/complete` — reaches [`Handler::call`].
pub trait Handler: Send + Sync + 'static {
    /// Who the server is and what it offers. Its name and version are read once, when the
    /// server is built; its capabilities and instructions each time a client is told them.
    fn info(&self) -> ServerInfo;

    /// Handles one request. Notifications, progress and server-to-client requests go through
    /// `ctx`; the returned value is the result. Unknown methods should return
    /// `-32601` (method not found).
    fn call(&self, ctx: Context, method: String, params: Value) -> HandlerFuture;

    /// Whether running this request again, with the same idempotency key, applies none of its
    /// effects twice, because it records them under [`Context::idempotency_key`]. Then a keyed
    /// request whose server died mid-run is run again when re-sent, instead of being answered
    /// `request_aborted`. By default nothing is.
    fn resumable(&self, _method: &str, _params: &Value) -> bool {
        false
    }

    /// Whether this request has no effects, so running it twice changes nothing. Its record
    /// need not be durable before it runs (on the embedded store that saves a call a wait for
    /// the disk): a crash in that window loses the record, and the same request sent again runs
    /// again. Its output is still durable before any client sees it, and a request with an
    /// idempotency key is recorded first regardless. By default nothing is; the built-in tools
    /// say yes for `tools/call` of a tool annotated `readOnlyHint: true`. A gateway says no for
    /// everything: an upstream's annotations are hints it cannot vouch for.
    fn read_only(&self, _method: &str, _params: &Value) -> bool {
        false
    }

    /// The parameters of tool `tool` its input schema mirrors in `Mcp-Param-*` headers (SEP-2243,
    /// `x-mcp-header`): a 2026-07-28 call whose headers do not say what its arguments say is
    /// refused (400, -32020) before it reaches [`Handler::call`]. By default none.
    fn param_headers(&self, _tool: &str) -> &[ParamHeader] {
        &[]
    }

    /// How tool `tool` runs as a task (SEP-2663). A 2026-07-28 call of a tool that supports
    /// tasks, from a client that declares them, may become one: its handler decides when, with
    /// [`Context::escalate`]. A tool that requires tasks is refused (-32021) to other clients
    /// before its handler runs. By default no tool runs as a task.
    fn task_support(&self, _tool: &str) -> TaskSupport {
        TaskSupport::Never
    }

    /// A session was just initialized by this process (its `initialize` is answered
    /// next). State that lives where a session began starts here: a gateway starts the
    /// session's upstream instance, and knows that a session it did not see start (begun before
    /// a restart, or at another replica) has no instance it could talk to. By default nothing.
    fn session_started(&self, _session: SessionHandle) {}

    /// Whether this process can serve a live session it did not start (one begun before
    /// a restart, or at another replica), asked on the session's first request here. A handler
    /// whose per-session state lives only in the process that began the session (a gateway's
    /// upstream instance) says no unless that process is alive to serve it: the session then
    /// ends as `upstream_lost` and the request gets that 404, so the client starts a new session
    /// instead of being answered from reset state under the old id. By default yes: the store
    /// holds everything a session is.
    fn adopts(&self, _session: &SessionHandle) -> AdoptFuture {
        Box::pin(std::future::ready(true))
    }

    /// A notification from the client of a session, other than those tether acts on
    /// itself (`notifications/initialized`, `notifications/cancelled`): for example
    /// `notifications/roots/list_changed`. By default ignored.
    fn notified(&self, _session: SessionHandle, _method: &str, _params: Value) {}
}
