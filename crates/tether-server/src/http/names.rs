//! The names of the headers tether reads and writes beyond HTTP's own, as [`HeaderName`]s made at
//! compile time: a header looked up by a `&str` has its name checked and lowered on every request.

use http::HeaderName;
use tether_core::mcp::header;

/// `Mcp-Session-Id`.
pub(crate) const SESSION_ID: HeaderName = HeaderName::from_static(header::SESSION_ID);
/// `MCP-Protocol-Version`.
pub(crate) const PROTOCOL_VERSION: HeaderName = HeaderName::from_static(header::PROTOCOL_VERSION);
/// `Last-Event-ID`.
pub(crate) const LAST_EVENT_ID: HeaderName = HeaderName::from_static(header::LAST_EVENT_ID);
/// `X-MCP-Replay-Epoch`.
pub(crate) const REPLAY_EPOCH: HeaderName = HeaderName::from_static(header::REPLAY_EPOCH);
/// `X-MCP-Idempotency-Claim`.
pub(crate) const IDEMPOTENCY_CLAIM: HeaderName = HeaderName::from_static(header::IDEMPOTENCY_CLAIM);
/// `Mcp-Method` (2026-07-28).
pub(crate) const METHOD: HeaderName = HeaderName::from_static(header::METHOD);
/// `Mcp-Name` (2026-07-28).
pub(crate) const NAME: HeaderName = HeaderName::from_static(header::NAME);
/// W3C Trace Context's `traceparent`.
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static(tether_core::trace_context::TRACEPARENT);
/// W3C Trace Context's `tracestate`.
pub(crate) const TRACESTATE: HeaderName = HeaderName::from_static(tether_core::trace_context::TRACESTATE);
