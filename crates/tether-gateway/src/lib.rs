//! tether's guarantees for MCP servers written in any language: [`upstream::UpstreamHandler`]
//! serves an upstream MCP server over tether's transport, its requests relayed between replicas
//! by [`tether_server::relay`].
//!
//! - [`stdio::Command`] starts a stdio MCP server as a child process per instance: one child per
//!   downstream session (and one kept per client for 2026-07-28 requests), its stderr logged, killed when the session
//!   ends; a child that exits ends its session as `upstream_lost` and its running requests with
//!   `request_aborted`.
//! - [`http::Remote`] reaches a Streamable HTTP server through tether's client, one upstream
//!   session per instance, every reconnect proven.
//!
//! - With feature `rmcp`, `rmcp::RmcpHandler` hosts an rmcp `ServerHandler` in the same process.
//!
//! And the other way round, [`connect::bridge`] gives a stdio MCP client (a desktop
//! application) tether's client in front of a Streamable HTTP server.

pub mod connect;
pub mod http;
mod lines;
#[cfg(feature = "rmcp")]
pub mod rmcp;
pub mod stdio;
pub mod upstream;

pub use lines::MAX_LINE_BYTES;

/// Tasks that serve one upstream instance or bridge: aborted when dropped, so nothing outlives
/// what it serves.
pub(crate) struct Tasks(pub(crate) Vec<tokio::task::AbortHandle>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
